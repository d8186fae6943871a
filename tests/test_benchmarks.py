"""The benchmarks stay runnable: each script runs its --quick form and prints its ratio
column (the timings themselves are not asserted; speed goals live in the benchmarks)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = {"ns_vs_gemm.py": "default / GEMM", "muon_vs_torch.py": "ours / torch", "dion_vs_muon.py": "÷ Muon bf16"}


def test_every_benchmark_is_listed():
    assert {p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")} == set(SCRIPTS)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_benchmark_quick_run(script):
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--quick", "--min-run-time", "0.01", "--threads", "1"],
        capture_output=True, text=True, timeout=300, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert SCRIPTS[script] in out.stdout
