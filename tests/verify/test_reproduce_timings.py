"""The time of ``ortho-verify reproduce --quick`` in the README is written by ``scripts/timings.py`` from
a measurement (``--only reproduce_quick`` measures it alone and keeps every other number)."""

import copy
from pathlib import Path

import pytest

from ortho_verify.cli import measured
from tests.load_file import load_file

ROOT = Path(__file__).resolve().parents[2]
timings = load_file(ROOT / "scripts" / "timings.py", "timings_script")


def test_the_readme_states_the_measured_quick_time():
    text = (ROOT / "README.md").read_text()
    region = timings.regions_of(text)["reproduce-quick"]
    run = measured.TIMINGS["commands"]["reproduce_quick"]
    assert region == timings.render(measured.TIMINGS)["reproduce-quick"]
    assert region.startswith(timings._seconds(run["wall_s"]) + " wall") and run["date"] in region
    assert "smoke run of seconds" not in text


def test_only_measures_the_quick_run_and_keeps_the_rest(monkeypatch):
    previous = copy.deepcopy(measured.TIMINGS)
    fake = {"reproduce_quick": {"argv": "x", "wall_s": 123.0, "cpu_s": 99.0, "rc": 0, "label": "x",
                                "date": "2000-01-01", "cores": 2, "load_at_start": [0.5, 0.5, 0.5]}}
    monkeypatch.setattr(timings, "measure_reproduce", lambda work: fake)
    t = timings.measure_only(["reproduce_quick"], previous)
    assert t["commands"]["reproduce_quick"]["wall_s"] == 123.0
    assert {k: v for k, v in t["commands"].items() if k != "reproduce_quick"} == {
        k: v for k, v in previous["commands"].items() if k != "reproduce_quick"}
    assert timings.render(t)["reproduce-quick"].startswith("123 s wall, 99 s CPU")
    with pytest.raises(ValueError, match="--only"):
        timings.measure_only(["default"], previous)
    del t["commands"]["reproduce_quick"]
    assert timings.render(t)["reproduce-quick"] == "(not measured)"
