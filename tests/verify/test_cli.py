"""ortho-verify end to end: table, reports, exit codes; and the docs' computed tables."""

import json
from pathlib import Path

import pytest

from verify import checks, cli, tables

ROOT = Path(__file__).resolve().parents[2]


def test_quick_synthetic_run_passes_and_writes_reports(tmp_path, capsys):
    rc = cli.main(["--quick", "--no-real", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["summary"]["failed"] == 0
    assert report["summary"]["total"] == len(report["results"]) > 100
    assert {r["check"] for r in report["results"]} >= {
        "coefficient_registry", "ns_vs_ns_map", "spread_in_band", "muon_vs_reference",
        "dion_vs_reference", "dion_error_feedback", "dion_orthonormal_P", "muon_vs_torch"}
    assert all(r["error"] <= r["tolerance"] for r in report["results"])
    md = (tmp_path / "report.md").read_text()
    assert f"{report['summary']['passed']} of {report['summary']['total']} checks passed" in md
    assert "error/tol" in out and "passed, 0 failed" in out


def test_a_failing_check_gives_exit_code_1(tmp_path, monkeypatch):
    failing = checks.CheckResult("planted", "input", "detail", 2.0, 1.0, False)
    monkeypatch.setattr(cli, "plan_jobs", lambda cases, quick: [("planted", lambda: [failing])])
    assert cli.main(["--quick", "--no-real", "--out", str(tmp_path)]) == 1
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["summary"]["failed"] == 1 and report["results"][0]["ratio"] == pytest.approx(2.0)


def test_python_dash_m_entry_point_exists():
    assert (ROOT / "verify" / "__main__.py").is_file()


def test_docs_quote_the_computed_schedule_table():
    doc = (ROOT / "docs" / "tolerances.md").read_text()
    assert tables.schedule_table() in doc
