"""The benchmarks stay runnable: each script runs its --quick form and prints its ratio
column (the timings themselves are not asserted; speed goals live in the benchmarks).

All scripts run one after the other in one subprocess (one torch import, not five), each as
``python benchmarks/<script>`` would run it (``runpy`` as ``__main__``, its own ``sys.argv``),
from a plain checkout (the repository on PYTHONPATH, one intra-op thread); each script's output
and traceback are kept apart, so a failure names its script.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.load_file import load_file

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = {"ns_vs_gemm.py": "default / GEMM", "muon_vs_torch.py": "ours / torch", "dion_vs_muon.py": "÷ Muon bf16",
           "proxies.py": "compute ops", "identify.py": "seconds", "host_time.py": "÷ torch"}
#: Scripts for another machine, run here in their CPU smoke form (their own flag), not ``--quick``.
DEVICE_SCRIPTS = {"gpu.py": ["--dry-run", "--compare", "torch.optim:SGD"]}
QUICK = ["--quick", "--min-run-time", "0.01", "--threads", "1"]

DRIVER = r"""
import contextlib, io, json, runpy, sys, traceback
folder, runs = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, folder)
results = {}
for script, argv in runs:
    out = io.StringIO()
    sys.argv = [f"{folder}/{script}", *argv]
    error = None
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(f"{folder}/{script}", run_name="__main__")
    except SystemExit as exit_:
        error = None if exit_.code in (None, 0) else f"SystemExit({exit_.code!r})"
    except BaseException:
        error = traceback.format_exc()
    results[script] = {"stdout": out.getvalue(), "error": error}
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def outputs() -> dict:
    runs = [(s, QUICK) for s in sorted(SCRIPTS)] + [(s, a) for s, a in DEVICE_SCRIPTS.items()]
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(BENCHMARKS), json.dumps(runs)], capture_output=True, text=True, timeout=600,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(BENCHMARKS.parent), "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_every_benchmark_is_listed():
    assert {p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")} == set(SCRIPTS) | set(DEVICE_SCRIPTS)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_benchmark_quick_run(script, outputs):
    result = outputs[script]
    assert result["error"] is None, result["error"]
    assert SCRIPTS[script] in result["stdout"]


def test_gpu_benchmark_dry_run(outputs):
    """benchmarks/gpu.py on the CPU at tiny sizes, as a plain checkout runs it (the repository on
    PYTHONPATH, nothing else): every section prints its table."""
    result = outputs["gpu.py"]
    assert result["error"] is None, result["error"]
    for title in ("GEMM peak", "### Step, d = 16", "| Dion |", "| torch.optim:SGD |", "newton_schulz against the dense",
                  "Gram against standard", "CUDA graph capture"):
        assert title in result["stdout"], title


def test_host_time_by_the_threads_cpu_time(capsys, monkeypatch):
    """``host_time.py --thread-time`` times by ``time.thread_time`` (a stand-in clock that advances 1 s
    per call makes every optimizer's time 1 s / steps) and says so in its table's title."""
    import time

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    host_time = load_file(BENCHMARKS / "host_time.py", "host_time_thread")
    ticks = iter(range(10**6))
    monkeypatch.setattr(time, "thread_time", lambda: float(next(ticks)))
    host_time.main(["--quick", "--thread-time", "--steps", "4", "--threads", "1"])
    out = capsys.readouterr().out
    assert "thread CPU time" in out and out.count("250.000") == len(host_time.variants())
