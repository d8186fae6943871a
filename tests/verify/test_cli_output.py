"""ortho-verify's outputs: the terminal summary (counts, failing rows, length), JUnit XML parsed
back, GitHub Actions annotations, and report.json's schema."""

import json
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, strategies as st

from ortho_verify.cli import main as cli
from ortho_verify.report import annotations, junit, terminal as report
from ortho_verify.report.results import REPORT_SCHEMA_VERSION, CheckResult, measured, no_claim, summary
from tests.quick_run import share_quick_collect

# Rows of three checks over two inputs: one failure, one check with a no-claim row beside a claim.
ROWS = [
    measured("ns", "a", "jordan/float32", 0.2, 1.0), measured("ns", "a", "jordan/float64", 0.5, 1.0),
    measured("ns", "b", "jordan/float32", 3.0, 1.0, note="planted"),
    measured("dion", "a", "r=1", 0.1, 1.0), no_claim("dion", "b", "r=1", "ill-posed"),
    no_claim("skipped", "a", "d", "not compared"),
]
SYNTHETIC = ["--quick", "--no-real", "--no-plots"]


def _planted(monkeypatch, rows):
    monkeypatch.setattr(cli, "plan_jobs", lambda *a: [("planted", lambda: list(rows))])


def test_summary_counts_passed_failed_and_no_claim_apart():
    by_check = summary(ROWS)["by_check"]
    assert {k: (v["passed"], v["failed"], v["no_claim"], v["total"]) for k, v in by_check.items()} == {
        "ns": (2, 1, 0, 3), "dion": (1, 0, 1, 2), "skipped": (0, 0, 1, 1)}
    assert by_check["ns"]["worst"] == {"input": "b", "detail": "jordan/float32", "ratio": 3.0}
    assert by_check["skipped"]["worst"] is None and by_check["skipped"]["worst_ratio"] == 0.0


@given(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from("xy"), st.floats(0, 3), st.booleans()), max_size=30))
def test_summary_counts_add_up(spec):
    rows = [measured(c, i, "d", e, 1.0) if claim else no_claim(c, i, "d", "why") for c, i, e, claim in spec]
    s = summary(rows)
    assert s["passed"] + s["failed"] + s["no_claim"] == s["total"] == len(rows)
    assert sum(v["total"] for v in s["by_check"].values()) == len(rows)
    for name, v in s["by_check"].items():
        claimed = [r.ratio for r in rows if r.check == name and r.claimed]
        assert v["worst_ratio"] == max(claimed, default=0.0)


def test_terminal_shows_one_row_per_check_then_the_failures(tmp_path, monkeypatch, capsys):
    _planted(monkeypatch, ROWS)
    monkeypatch.setenv("COLUMNS", "100")
    assert cli.main([*SYNTHETIC, "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    # the width of COLUMNS; the line of report paths is not wrapped (copy-paste)
    assert max(len(line) for line in out.splitlines() if not line.startswith("Full report")) <= 100
    table = out.split("failed: 1 (check, input) pairs")
    assert len(table) == 2
    rows = {line.split()[0]: line.split()[1:5] for line in table[0].splitlines() if line.strip().split(" ")[0] in
            ("ns", "dion", "skipped")}
    assert rows == {"ns": ["2", "1", "0", "3.000"], "dion": ["1", "0", "1", "0.100"],
                    "skipped": ["0", "0", "1", "0.000"]}
    failing = [line for line in table[1].splitlines() if line.strip().startswith("ns")]
    assert len(failing) == 1 and " b " in failing[0] and "planted" in failing[0]
    assert "FAILED: 3 passed, 1 failed" in out and str(tmp_path / "report.md") in out


def test_verbose_prints_every_check_and_input(tmp_path, monkeypatch, capsys):
    _planted(monkeypatch, ROWS)
    cli.main([*SYNTHETIC, "--out", str(tmp_path), "--verbose"])
    out = capsys.readouterr().out
    assert "worst case per check and input" in out and "FAIL 1 of 1" in out and "pass 2 of 2" in out


def test_many_failures_are_capped_on_the_terminal(tmp_path, monkeypatch, capsys):
    rows = [measured("ns", f"input{i}", "d", 2.0, 1.0) for i in range(report.FAILURES_SHOWN + 5)]
    _planted(monkeypatch, rows)
    assert cli.main([*SYNTHETIC, "--out", str(tmp_path)]) == 1
    assert "... and 5 more failed pairs" in capsys.readouterr().out
    body = json.loads((tmp_path / "report.json").read_text())
    assert len(body["failures"]) == len(rows)  # every failure in full in the report


def test_quick_synthetic_run_prints_under_60_lines(tmp_path, monkeypatch, capsys, tmp_path_factory):
    monkeypatch.setenv("COLUMNS", "100")
    share_quick_collect(monkeypatch, tmp_path_factory)  # the session's one --quick --no-real computation
    assert cli.main([*SYNTHETIC, "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) < 60, "\n".join(lines)


def test_junit_xml_parses_back_with_one_case_per_check_and_input(tmp_path, monkeypatch):
    _planted(monkeypatch, ROWS)
    path = tmp_path / "ci" / "junit.xml"
    assert cli.main([*SYNTHETIC, "--out", str(tmp_path / "out"), "--junit-xml", str(path)]) == 1
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    [suite] = root.findall("testsuite")
    cases = {(c.get("classname"), c.get("name")): c for c in suite.findall("testcase")}
    assert set(cases) == {("ns", "a"), ("ns", "b"), ("dion", "a"), ("dion", "b"), ("skipped", "a")}
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"),
            suite.get("skipped")) == ("5", "1", "0", "2")
    failure = cases[("ns", "b")].find("failure")
    assert failure is not None and "planted" in failure.get("message") and "1 of 1 rows failed" in failure.text
    assert cases[("dion", "b")].find("skipped").get("message").endswith("ill-posed")
    assert cases[("ns", "a")].find("failure") is None and cases[("ns", "a")].find("skipped") is None


def test_junit_of_a_passing_run_has_no_failure():
    tree = junit.junit_tree([measured("ns", "a", "d", 0.1, 1.0)], elapsed_s=1.5)
    suite = tree.getroot().find("testsuite")
    assert suite.get("failures") == "0" and suite.get("time") == "1.500" and suite.find("testcase/failure") is None


def test_github_annotations_only_when_running_there(tmp_path, monkeypatch, capsys):
    _planted(monkeypatch, ROWS)
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    cli.main([*SYNTHETIC, "--out", str(tmp_path)])
    assert "::error" not in capsys.readouterr().out
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    cli.main([*SYNTHETIC, "--out", str(tmp_path)])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("::")]
    assert lines == [f"::error file={annotations.escape_property(str(tmp_path / 'report.md'))},"
                     "title=ortho-verify ns::b [jordan/float32]: error 3.00e+00 > tolerance 1.00e+00 (error/tol 3) — "
                     "planted"]


def test_annotation_format_escapes_and_warns_when_inconclusive():
    row = measured("a,b", "x:y", "50%\nnew line", 2.0, 1.0)
    [line] = annotations.github_annotations([row], "out/report.md")
    assert line.startswith("::error file=out/report.md,title=ortho-verify a%2Cb::x:y [50%25%0Anew line]")
    assert "\n" not in line
    warn = annotations.github_annotations([no_claim("c", "i", "d", "why")], "r.md")
    assert warn == ["::warning file=r.md,title=ortho-verify inconclusive::c: no claim on any of its 1 rows (why)"]
    many = annotations.github_annotations([measured("c", f"i{k}", "d", 2, 1) for k in range(15)], "r.md", limit=10)
    assert len(many) == 11 and many[-1].endswith("5 more failed checks: see r.md")
    assert annotations.in_github_actions({"GITHUB_ACTIONS": "true"}) and not annotations.in_github_actions({})


def test_report_json_schema_and_size(tmp_path, monkeypatch):
    _planted(monkeypatch, ROWS + [measured("bulk", f"i{k}", "d", 0.1, 1.0) for k in range(300)])
    cli.main([*SYNTHETIC, "--out", str(tmp_path)])
    body = json.loads((tmp_path / "report.json").read_text())
    assert body["schema"] == "ortho-verify-report" and body["schema_version"] == REPORT_SCHEMA_VERSION == 2
    assert set(body) == {"schema", "schema_version", "meta", "summary", "groups", "failures", "no_claim"}
    assert len(body["groups"]) == 5 + 300 and len(body["failures"]) == 1
    assert body["failures"][0]["note"] == "planted" and body["no_claim"] == {
        "dion": {"rows": 1, "notes": ["ill-posed"]}, "skipped": {"rows": 1, "notes": ["not compared"]}}
    assert {"corpus", "command", "elapsed_s"} <= set(body["meta"]) and body["meta"]["corpus"] is None
    md = (tmp_path / "report.md").read_text()
    assert "## Failures (1)" in md and "## Every check" not in md
    cli.main([*SYNTHETIC, "--out", str(tmp_path / "all"), "--all-rows"])
    full = json.loads((tmp_path / "all" / "report.json").read_text())
    assert len(full["results"]) == len(ROWS) + 300 and "## Every check" in (tmp_path / "all" / "report.md").read_text()


@pytest.mark.parametrize("rows, verdict", [([measured("c", "i", "d", 0.1, 1.0)], "passed"),
                                           ([CheckResult("c", "i", "d", 2.0, 1.0, False)], "failed")])
def test_exit_code_follows_the_verdict(tmp_path, monkeypatch, rows, verdict):
    _planted(monkeypatch, rows)
    assert cli.main([*SYNTHETIC, "--out", str(tmp_path)]) == (0 if verdict == "passed" else 1)
    assert json.loads((tmp_path / "report.json").read_text())["summary"]["verdict"] == verdict
