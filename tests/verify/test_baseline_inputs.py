"""Baselines across environments: the corpus identity recorded and compared (same inputs -> compared;
another corpus -> a clear "inconclusive" row, exit 1, never a regression), and the baseline of a user's
own report through the API and the pytest fixture."""

import json

import numpy as np
import pytest

from ortho_verify import checks, tolerances as tol
from ortho_verify.cli import main as cli
from ortho_verify.inputs.spectra import MatrixCase
from ortho_verify.report import baseline
from ortho_verify.report.results import VerificationReport, measured

CORPUS_A = {"name": "ortho-pseudo-python-v1", "bytes": 10, "sha256": "a" * 64}
CORPUS_B = {"name": "ortho-pseudo-python-v2", "bytes": 10, "sha256": "b" * 64}


def _real_cases():
    rng = np.random.default_rng(0)
    return [MatrixCase(f"gpt/step300/w{k}", rng.standard_normal((12, 8)), "real", "planted real input")
            for k in range(2)]


@pytest.fixture
def run(tmp_path, monkeypatch):
    """``run(corpus, *args)``: the CLI on two planted real inputs trained on ``corpus`` plus the
    synthetic ones, Newton–Schulz only; returns (exit code, report.json)."""
    def jobs(cases, quick, sv_points=None):
        return [(c.name, lambda c=c: checks.check_newton_schulz(c, "jordan", "float32"))
                for c in (cases[:2] + cases[-1:])]

    monkeypatch.setattr(cli, "plan_jobs", jobs)
    monkeypatch.setattr(cli.data, "real_gradients", lambda **kw: _real_cases())

    def go(corpus, *args):
        monkeypatch.setattr(cli.data, "last_run_info", lambda: {"corpus": corpus})
        code = cli.main(["--quick", "--no-plots", "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "c"),
                         "--baseline", str(tmp_path / "baseline.json"), *args])
        return code, json.loads((tmp_path / "out" / "report.json").read_text())

    return go


def test_same_corpus_compares_every_input(run, tmp_path):
    assert run(CORPUS_A, "--update-baseline")[0] == 0
    stored = json.loads((tmp_path / "baseline.json").read_text())
    assert stored["format"] == baseline.FORMAT == 3 and stored["inputs"]["corpus"] == CORPUS_A
    assert stored["inputs"]["real_inputs"] == ["gpt/step300/w0", "gpt/step300/w1"]
    code, body = run(CORPUS_A)
    assert code == 0 and body["meta"]["corpus"] == CORPUS_A
    assert "baseline_inputs" not in body["summary"]["by_check"]
    coverage = body["summary"]["by_check"]["baseline_coverage"]
    assert coverage["passed"] == 1


def test_another_corpus_is_inconclusive_with_a_clear_message(run, capsys):
    assert run(CORPUS_A, "--update-baseline")[0] == 0
    capsys.readouterr()
    code, body = run(CORPUS_B)
    out = " ".join(capsys.readouterr().out.split())  # the terminal wraps long lines
    assert code == 1 and body["summary"]["verdict"] == "inconclusive" and body["summary"]["failed"] == 0
    assert "different real-gradient inputs" in out and "--update-baseline" in out and "v2" in out
    note = body["no_claim"]["baseline_inputs"]["notes"][0]
    assert "ortho-pseudo-python-v1 (aaaaaaaaaaaa…)" in note and "4 real-input rows not compared" in note
    # the synthetic input is still compared, and the real ones are not counted missing
    assert body["summary"]["by_check"]["baseline_regression"]["worst"]["input"].startswith("synthetic/")
    assert body["summary"]["by_check"]["baseline_coverage"]["failed"] == 0


def test_a_regression_on_the_same_corpus_still_fails(run, monkeypatch):
    assert run(CORPUS_A, "--update-baseline")[0] == 0
    real = tol.ns_tolerance  # planted: tolerances 100x tighter, so every ratio grows 100-fold
    monkeypatch.setattr(tol, "ns_tolerance", lambda *a, **k: real(*a, **k) / 100)
    code, body = run(CORPUS_A)
    assert code == 1 and body["summary"]["verdict"] == "failed"
    assert body["summary"]["by_check"]["baseline_regression"]["failed"] >= 1


def _report(ratio):
    return VerificationReport("my_kernel", [measured("ns_vs_ns_map", "x", "d", ratio, 1.0),
                                            measured("spread_in_band", "x", "d", 0.05, 1.0)], {})


def test_api_baseline_of_a_users_report(tmp_path):
    path = baseline.save_baseline(_report(0.2), tmp_path / "b.json")
    assert json.loads(path.read_text())["mode"] == {"subject": "my_kernel"}
    same = baseline.compare_with_baseline(_report(0.3), path)
    assert same.passed and {r.check for r in same.results} == {"ns_vs_ns_map", "spread_in_band",
                                                               "baseline_regression", "baseline_coverage"}
    worse = baseline.compare_with_baseline(_report(0.2 * 2 * 1.01), path)
    assert not worse.passed and "baseline_regression" in worse.summary()
    missing = baseline.compare_with_baseline(VerificationReport("my_kernel", _report(0.2).results[:1], {}), path)
    assert not missing.passed
    with pytest.raises(ValueError, match="failed"):
        baseline.save_baseline(_report(2.0), tmp_path / "c.json")


FIXTURE_TEST = '''
from ortho_verify.report.results import VerificationReport, measured
import os

def test_kernel(ortho_baseline):
    ratio = float(os.environ["RATIO"])
    report = VerificationReport("k", [measured("ns_vs_ns_map", "x", "d", ratio, 1.0)], {})
    ortho_baseline(report)
'''


def test_pytest_fixture_writes_then_compares(tmp_path):
    from tests.verify.test_docs_example import _pytest

    (tmp_path / "test_fixture.py").write_text(FIXTURE_TEST)
    missing = _pytest(tmp_path, env={"RATIO": "0.2"})
    assert missing.returncode == 1 and "--ortho-update-baseline" in missing.stdout
    assert _pytest(tmp_path, "--ortho-update-baseline", env={"RATIO": "0.2"}).returncode == 0
    assert (tmp_path / "ortho-baselines" / "test_fixture" / "test_kernel.json").is_file()
    assert _pytest(tmp_path, env={"RATIO": "0.3"}).returncode == 0
    worse = _pytest(tmp_path, env={"RATIO": "0.5"})
    assert worse.returncode == 1 and "baseline_regression" in worse.stdout


def test_docs_ci_example_of_a_users_baseline(tmp_path):
    import re

    from tests.verify.test_docs_example import ROOT, _pytest

    doc = (ROOT / "docs" / "verification.md").read_text()
    [code] = re.findall(r"```python\n# tests/test_kernel_baseline.py\n(.*?)```", doc, re.S)
    (tmp_path / "test_kernel_baseline.py").write_text(code)
    first = _pytest(tmp_path, "--ortho-update-baseline", env={})
    assert first.returncode == 0, first.stdout + first.stderr
    stored = json.loads((tmp_path / "ortho-baselines" / "test_kernel_baseline" / "test_kernel_has_not_drifted.json")
                        .read_text())
    assert stored["mode"] == {"subject": "my_newton_schulz (jordan, float32)"} and len(stored["ratios"]) > 20
    again = _pytest(tmp_path, env={})
    assert again.returncode == 0 and "1 passed" in again.stdout, again.stdout
