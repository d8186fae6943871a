"""ortho-verify end to end: table, reports, plots, exit codes, baselines; and the docs' computed tables."""

import json
from pathlib import Path

import pytest

from ortho_verify import checks, tolerances as tol
from ortho_verify.cli import main as cli
from ortho_verify.report import tables
from tests.quick_run import share_quick_collect

ROOT = Path(__file__).resolve().parents[2]


def test_quick_synthetic_run_passes_and_writes_reports(tmp_path, capsys, monkeypatch, tmp_path_factory):
    share_quick_collect(monkeypatch, tmp_path_factory)  # the session's one --quick --no-real computation
    rc = cli.main(["--quick", "--no-real", "--all-rows", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["summary"]["failed"] == 0
    assert report["summary"]["total"] == len(report["results"]) > 100
    assert {r["check"] for r in report["results"]} >= {
        "coefficient_registry", "ns_vs_ns_map", "spread_in_band", "muon_vs_reference",
        "dion_vs_reference", "dion_error_feedback", "dion_orthonormal_P", "muon_vs_torch",
        "ef_outside_subspace", "ef_inside_subspace", "ef_bookkeeping", "ef_subspace_convergence",
        "ef_full_rank_polar", "ef_full_rank_convergence", "muon_layout_vs_reference", "dion_variant_vs_reference"}
    configs = {r["detail"].rsplit("/", 1)[0] for r in report["results"] if r["check"] == "muon_vs_reference"}
    variants = {r["detail"].split(" rank")[0] for r in report["results"] if r["check"] == "dion_variant_vs_reference"}
    assert configs == set(checks.MUON_CONFIGS) and variants == set(checks.DION_VARIANTS)
    assert all(r["error"] <= r["tolerance"] for r in report["results"])
    md = (tmp_path / "report.md").read_text()
    assert f"{report['summary']['passed']} of {report['summary']['total']} checks passed" in md
    assert "error/tol" in out and "passed, 0 failed" in out
    # plots exist, are PNGs, and report.md shows them
    pngs = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert pngs == sorted(["ratios.png"] + [f"sv_map_{s}.png" for s in __import__("ortho_fast").COEFFICIENTS])
    assert all((tmp_path / "plots" / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert all(f"(plots/{p})" in md for p in pngs)
    # error feedback on vs off: nothing lost with it, a visible fraction lost without it
    assert "## Error feedback: on vs off" in md
    books = [r for r in report["results"] if r["check"] == "ef_bookkeeping"]
    on = [r["extra"]["lost_fraction"] for r in books if r["extra"]["error_feedback"]]
    off = [r["extra"]["lost_fraction"] for r in books if not r["extra"]["error_feedback"]]
    assert on and off and max(on) < 1e-6 < 0.05 < min(off)


def _fast_jobs(cases, quick, sv_points=None):
    """A small job list for the baseline tests: Newton–Schulz on two inputs, one schedule."""
    return [(c.name, lambda c=c: checks.check_newton_schulz(c, "jordan", "float32")) for c in cases[:2]]


def test_a_failing_check_gives_exit_code_1(tmp_path, monkeypatch):
    failing = checks.CheckResult("planted", "input", "detail", 2.0, 1.0, False)
    monkeypatch.setattr(cli, "plan_jobs", lambda *a: [("planted", lambda: [failing])])
    assert cli.main(["--quick", "--no-real", "--no-plots", "--out", str(tmp_path)]) == 1
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["summary"]["failed"] == 1 and report["failures"][0]["ratio"] == pytest.approx(2.0)


def test_a_check_without_any_claim_gives_exit_code_1(tmp_path, monkeypatch, capsys):
    rows = [checks.measured("compared", "input", "detail", 0.5, 1.0),
            checks.no_claim("skipped", "input", "d", "ill-posed")]
    monkeypatch.setattr(cli, "plan_jobs", lambda *a: [("planted", lambda: rows)])
    assert cli.main(["--quick", "--no-real", "--no-plots", "--out", str(tmp_path)]) == 1
    summary = json.loads((tmp_path / "report.json").read_text())["summary"]
    assert (summary["passed"], summary["failed"], summary["no_claim"], summary["verdict"]) == (1, 0, 1, "inconclusive")
    assert "inconclusive: nothing compared — skipped" in capsys.readouterr().out


def test_baseline_round_trip_and_planted_regression(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "plan_jobs", _fast_jobs)
    base = tmp_path / "ci" / "baseline.json"
    args = ["--quick", "--no-real", "--no-plots", "--all-rows", "--out", str(tmp_path / "out"), "--baseline", str(base)]
    assert cli.main(args + ["--update-baseline"]) == 0
    stored = json.loads(base.read_text())
    assert stored["margin"] == {"growth": tol.BASELINE_GROWTH, "floor": tol.BASELINE_FLOOR}
    assert len(stored["ratios"]) == 4  # 2 inputs x (ns_vs_ns_map, spread_in_band)
    assert cli.main(args) == 0  # the same code: no regression
    rows = json.loads((tmp_path / "out" / "report.json").read_text())["results"]
    assert {r["check"] for r in rows} >= {"baseline_regression", "baseline_coverage", "baseline_golden_files"}
    # planted regression: the Frobenius tolerance shrinks 100-fold, so every ns_vs_ns_map ratio
    # grows 100-fold (from ~0.003 to ~0.3): the checks still pass, the baseline comparison fails
    real = tol.ns_tolerance
    monkeypatch.setattr(tol, "ns_tolerance", lambda *a, **k: real(*a, **k) / 100)
    assert cli.main(args) == 1
    rows = json.loads((tmp_path / "out" / "report.json").read_text())["results"]
    assert all(r["passed"] for r in rows if r["check"] == "ns_vs_ns_map")
    regression = [r for r in rows if r["check"] == "baseline_regression" and not r["passed"]]
    assert len(regression) == 1 and "ns_vs_ns_map" in regression[0]["detail"]


def test_a_baseline_without_the_newer_checks_still_compares(tmp_path, monkeypatch):
    # A baseline written before checks were added: the new checks count as "new", nothing fails.
    base = tmp_path / "baseline.json"
    args = ["--quick", "--no-real", "--no-plots", "--all-rows", "--out", str(tmp_path / "out"), "--baseline", str(base)]
    monkeypatch.setattr(cli, "plan_jobs", _fast_jobs)
    assert cli.main(args + ["--update-baseline"]) == 0
    monkeypatch.setattr(cli, "plan_jobs", lambda cases, quick, sv=None: _fast_jobs(cases, quick) + [
        ("new", lambda: checks.check_muon_layouts(cases[0], "float32") + checks.check_dion(cases[0], 0.25, "float64",
                                                                                          "orth_dion"))])
    assert cli.main(args) == 0
    rows = json.loads((tmp_path / "out" / "report.json").read_text())["results"]
    coverage = next(r for r in rows if r["check"] == "baseline_coverage")
    assert coverage["passed"] and coverage["note"].endswith("4 compared, 5 new")


def test_update_baseline_needs_a_file():
    with pytest.raises(SystemExit) as err:
        cli.main(["--update-baseline"])
    assert err.value.code == 2


def test_python_dash_m_entry_point_exists():
    assert (ROOT / "verify" / "__main__.py").is_file()


def test_docs_quote_the_computed_schedule_table():
    doc = (ROOT / "docs" / "tolerances.md").read_text()
    assert tables.schedule_table() in doc
