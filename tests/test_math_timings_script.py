"""scripts/math_timings.py (the measured numbers of docs/math.md) on tiny sizes: each part runs and
prints the line docs/math.md quotes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.load_file import load_file

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "math_timings.py"


@pytest.fixture(scope="module")
def script():
    return load_file(SCRIPT, "math_timings")


def test_polar_is_timed_in_a_fresh_process(script):
    assert 0.0 < script._polar_seconds(4, 16, gmpy=False) < 60.0


def test_bank_bits_counts_differing_shapes_per_dtype(script, capsys):
    script.bank_bits()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[1].split(":")[0].strip() for line in lines] == ["torch.bfloat16", "torch.float32",
                                                                               "torch.float64"]
    assert all(f"of {len(script.BIT_SHAPES)} shapes" in line for line in lines)


def test_bank_speed_reports_both_settings(script, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(script, "SPEED_CASES", ((2, 8, 8),))
    threads = torch.get_num_threads()
    try:
        script.bank_speed(repeats=1)
    finally:
        torch.set_num_threads(threads)  # the script pins one thread; the rest of this process keeps its own
    out = capsys.readouterr().out
    assert "banks=False" in out and "banks=True" in out and " ms" in out
