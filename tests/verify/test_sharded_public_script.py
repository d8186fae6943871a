"""scripts/sharded_public.py without its checkouts: the truth's verdict, the agreement rule and the
table it writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.load_file import load_file

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "sharded_public.py"


@pytest.fixture(scope="module")
def script():
    return load_file(SCRIPT, "sharded_public")


def test_truth_verdicts(script):
    assert script.truth_verdict({"float32": 5e-8, "bfloat16": 0.026}) == "correct"
    assert script.truth_verdict({"float32": 2e-5, "bfloat16": 0.4}) == "wrong"  # just beyond the contract
    assert script.truth_verdict({"float32": 0.3, "bfloat16": 0.0}) == "correct"  # bitwise in its own precision
    assert script.truth_verdict({"raised": "RuntimeError: Work::getFuture not implemented."}) == "unsupported on gloo"
    assert script.truth_verdict({"raised": "invalid tensor size"}) == "raises"


@pytest.mark.parametrize("check, truth, agrees", [
    ("pass", "correct", True), ("FAIL: wrong math", "correct", False), ("pass", "wrong", False),
    ("FAIL: raises on this mix of parameters", "raises", True), ("pass", "raises", False),
    ("FAIL: unsupported on this backend", "unsupported on gloo", True), ("FAIL: hung", "unsupported on gloo", False)])
def test_agreement(script, check, truth, agrees):
    assert script._agrees({"check": check, "truth": truth}) is agrees


def test_table_marks_disagreement(script):
    rows = [{"optimizer": "x", "layout": "DDP", "shapes": "8x6", "check": "pass", "worst_ratio": "0.00",
             "compute": "float32", "truth": "wrong", "float32": 0.1, "bfloat16": 0.1, "local": None}]
    table = script.markdown(rows, {"command": "c", "date": "d", "torch": "t", "world_size": 2, "elapsed_s": 1})
    assert table.splitlines()[-1].endswith("| NO |")
