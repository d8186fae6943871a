"""The benchmarks stay runnable: each script runs its --quick form and prints its ratio
column (the timings themselves are not asserted; speed goals live in the benchmarks)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = {"ns_vs_gemm.py": "default / GEMM", "muon_vs_torch.py": "ours / torch", "dion_vs_muon.py": "÷ Muon bf16",
           "proxies.py": "compute ops"}
#: Scripts for another machine, run here in their CPU smoke form (their own flag), not ``--quick``.
DEVICE_SCRIPTS = {"gpu.py": ["--dry-run"]}


def test_every_benchmark_is_listed():
    assert {p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")} == set(SCRIPTS) | set(DEVICE_SCRIPTS)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_benchmark_quick_run(script):
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--quick", "--min-run-time", "0.01", "--threads", "1"],
        capture_output=True, text=True, timeout=300, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert SCRIPTS[script] in out.stdout


def test_gpu_benchmark_dry_run():
    """benchmarks/gpu.py on the CPU at tiny sizes, as a plain checkout runs it (the repository on
    PYTHONPATH, nothing else): every section prints its table."""
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu.py"), *DEVICE_SCRIPTS["gpu.py"], "--compare", "torch.optim:SGD"],
        capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(BENCHMARKS.parent), "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr
    for title in ("GEMM peak", "### Step, d = 16", "| Dion |", "| torch.optim:SGD |", "newton_schulz against the dense",
                  "Gram against standard", "CUDA graph capture"):
        assert title in out.stdout, title
