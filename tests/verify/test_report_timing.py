"""Seconds per check and per phase in ortho-verify's reports, and the worst ratio of exact checks
(tolerance 0): 0 and "exact" when they hold, never inf on a pass."""

from __future__ import annotations

import json
import math

from hypothesis import given, strategies as st

from ortho_verify.cli import main as cli
from ortho_verify.report.results import format_worst_ratio, measured, report_body, summary, write_reports


def test_an_exact_check_that_holds_has_ratio_0_and_shows_exact():
    held = measured("dion2_selection", "a", "d", -0.0042, 0.0)  # a margin: the selection is right
    exact = measured("dion2_selection", "b", "d", 0.0, 0.0)
    assert held.passed and held.ratio == 0.0 and exact.ratio == 0.0
    entry = summary([held, exact])["by_check"]["dion2_selection"]
    assert entry["exact"] and entry["worst_ratio"] == 0.0 and format_worst_ratio(entry) == "exact"
    broken = measured("dion2_selection", "c", "d", 0.001, 0.0)
    assert not broken.passed and broken.ratio == math.inf
    entry = summary([held, broken])["by_check"]["dion2_selection"]
    assert entry["worst_ratio"] == math.inf and format_worst_ratio(entry) == "inf"


def test_a_check_with_a_positive_tolerance_is_not_exact():
    rows = [measured("ns", "a", "d", 0.0, 0.0), measured("ns", "b", "d", 0.5, 1.0)]
    entry = summary(rows)["by_check"]["ns"]
    assert not entry["exact"] and format_worst_ratio(entry) == "0.500"


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 5), st.floats(0.0, 10.0)), min_size=1, max_size=20))
def test_job_seconds_are_shared_among_checks_by_rows_and_add_up(jobs):
    seconds: dict = {}
    for checks, rows, elapsed in jobs:
        cli.attribute_seconds(seconds, [measured(c, "i", "d", 0.0, 1.0) for c in checks for _ in range(rows)], elapsed)
    assert math.isclose(sum(seconds.values()), sum(e for _, _, e in jobs), rel_tol=1e-9, abs_tol=1e-9)
    assert set(seconds) == {c for checks, _, _ in jobs for c in checks}


def test_reports_carry_seconds_per_check(tmp_path):
    rows = [measured("ns", "a", "d", 0.5, 1.0), measured("exact", "a", "d", 0.0, 0.0)]
    body = report_body(rows, {}, seconds={"ns": 1.25, "exact": 0.5})
    assert body["summary"]["by_check"]["ns"]["seconds"] == 1.25
    assert body["summary"]["by_check"]["exact"]["seconds"] == 0.5
    assert report_body(rows, {})["summary"]["by_check"]["ns"]["seconds"] is None
    write_reports(rows, tmp_path, {}, seconds={"ns": 1.25, "exact": 0.5})
    md = (tmp_path / "report.md").read_text()
    assert "| seconds |" in md and "| exact | a (d) | 0.5 |" in md


def test_the_cli_measures_each_check_and_phase(tmp_path, monkeypatch):
    rows = [measured("ns", "a", "d", 0.5, 1.0), measured("sel", "a", "d", -1.0, 0.0)]
    monkeypatch.setattr(cli, "plan_jobs", lambda *a: [("job", lambda: list(rows))])
    assert cli.main(["--quick", "--no-real", "--no-plots", "--out", str(tmp_path)]) == 0
    body = json.loads((tmp_path / "report.json").read_text())
    by_check = body["summary"]["by_check"]
    assert by_check["ns"]["seconds"] >= 0 and by_check["sel"]["exact"] and by_check["sel"]["worst_ratio"] == 0.0
    assert {"synthetic inputs", "checks", "plots"} <= set(body["meta"]["phases_s"])
