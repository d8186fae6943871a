"""Every verdict of ``ortho-verify reproduce`` carries its power: equal methods plus noise are inconclusive
through the command line's own path, a separation beyond the run's resolution is decided, the rules'
error rates and power are what ``ortho_verify.reproduce.statistics`` derives, and measurement runs
decide nothing."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, strategies as st
from scipy import stats

from ortho_verify import reproduce as rp
from ortho_verify.reproduce import pool

ROOT = Path(__file__).resolve().parents[2]
SEEDS = (1, 2, 3)
#: Per-seed noise the seeds share (same batches): it cancels in every paired difference.
SHARED = (0.03, -0.02, -0.01)
#: Planted noise patterns (one value per seed): A has |mean| > spread (decided by a mean ± one-spread rule)
#: but |mean| < h = t_α·spread/√3; B has |mean| + spread < 2.5 % of the loss but a resolution above it.
A = (0.01, 0.02, 0.045)
B = (-0.02, 0.0, 0.025)
ZERO = (0.0, 0.0, 0.0)


@pytest.fixture(autouse=True)
def _run_cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTHO_CACHE_DIR", str(tmp_path / "ortho-cache"))


def _planted(gaps: dict, noise: dict):
    """A stand-in for ``train_run`` (patched where the pool calls it): test loss of a method on a seed
    = 2 + its true gap + SHARED[seed] + its planted noise; curves ending there; no gradients."""

    def train_run(config, method_key, lr, seed, *, scalar_lr=None, split="test", curve=True, capture=False,
                  device="cpu"):
        i = SEEDS.index(seed) if seed in SEEDS else 0
        loss = 2.0 + gaps.get(method_key, 0.0) + SHARED[i] + noise.get(method_key, ZERO)[i] + 0.01 * abs(
            math.log(lr / 0.01))
        steps = list(config.curve_steps()) if curve else [config.steps]
        return dict(method=method_key, lr=lr, scalar_lr=lr if scalar_lr is None else scalar_lr, seed=seed,
                    split=split, loss=loss, curve_steps=steps, curve=[5.5] * (len(steps) - 1) + [loss],
                    train_curve=[loss] * (len(steps) - 1), diverged=False, seconds=0.01, step_seconds=1e-3,
                    **({"gradients": []} if capture else {}))

    return train_run


#: Every method's true loss equal: AdamW − Muon and Muon (PE) − NorMuon and no EF − EF carry noise A; every
#: "close to Muon" pair noise B.
EQUAL_NOISE = {"adamw": A, "dion-1-ef": B, "dion-1/4-ef": B, "dion-1/16-ef": B,
               "dion-1-noef": tuple(a + b for a, b in zip(A, B)), "dion-1/4-noef": tuple(a + b for a, b in zip(A, B)),
               "dion-1/16-noef": tuple(a + b for a, b in zip(A, B)), "muon-polar_express": A,
               "dion2-1/4": tuple(a + b for a, b in zip(A, B))}


def _cli_run(tmp_path, monkeypatch, capsys, gaps, noise):
    monkeypatch.setattr(pool, "train_run", _planted(gaps, noise))
    out = tmp_path / "out"
    assert rp.main(["--single-size", "--jobs", "1", "--out", str(out)]) == 0
    results = json.loads((out / "reproduction" / "results.json").read_text())
    report = (out / "reproduction.md").read_text()
    return results, {c["key"]: c for c in results["claims"]}, capsys.readouterr().out, report


def test_equal_methods_plus_noise_are_inconclusive_through_the_command_line(tmp_path, monkeypatch, capsys):
    """The CLI's own path (sweep, evaluation, claims, report, terminal) on planted losses: equal methods with
    noise that the 3 seeds cannot separate from δ (or from 0) decide nothing, and say why."""
    results, claims, printed, report = _cli_run(tmp_path, monkeypatch, capsys, {}, EQUAL_NOISE)
    assert results["mode"] == "study"
    assert {k: c["verdict"] for k, c in claims.items()} == dict.fromkeys(rp.CLAIM_RULES, "inconclusive")
    assert "the sign is not resolved" in claims["muon_vs_adamw"]["reason"]
    assert "the sign is not resolved" in claims["normuon_vs_muon"]["reason"]
    assert "the run cannot resolve δ" in claims["dion_quarter_rank"]["reason"]
    assert "the run cannot resolve δ" in claims["dion2_quarter"]["reason"]
    assert "not run in this study" in claims["polar_express"]["reason"]
    assert "reproduced" not in printed and printed.count("inconclusive") == len(rp.CLAIM_RULES)
    assert "the run cannot resolve δ" in printed and "**reproduced**" not in report
    # the power is printed per claim: the resolution of 3 seeds against δ
    diff = claims["dion_quarter_rank"]["numbers"]["difference"]
    expected = rp.resolution(diff["spread"], 3, "within")
    assert claims["dion_quarter_rank"]["numbers"]["decision"]["resolution"] == pytest.approx(expected)
    assert expected > claims["dion_quarter_rank"]["numbers"]["margin"] > abs(diff["mean"]) + diff["spread"]


def test_a_separation_beyond_the_resolution_is_decided_through_the_command_line(tmp_path, monkeypatch, capsys):
    """Real gaps beyond the run's resolution under the same noise: decided both ways; an equivalence with
    small noise is decided too."""
    small = {k: tuple(v / 20 for v in pattern) for k, pattern in EQUAL_NOISE.items()}
    gaps = {"adamw": 0.2, "muon-polar_express": 0.2, "dion-1/4-ef": 0.3, "dion-1/4-noef": 0.4, "dion-1/16-ef": 0.3,
            "dion-1/16-noef": 0.4, "dion2-1/4": 0.5}
    results, claims, printed, _ = _cli_run(tmp_path, monkeypatch, capsys, gaps, small)
    verdicts = {k: c["verdict"] for k, c in claims.items()}
    assert verdicts == {"muon_vs_adamw": "reproduced", "dion_full_rank": "reproduced",
                        "dion_quarter_rank": "not reproduced", "error_feedback": "reproduced",
                        "normuon_vs_muon": "reproduced", "dion2_quarter": "not reproduced",
                        "polar_express": "inconclusive"}
    assert all(c["reason"] == "" for k, c in claims.items() if k != "polar_express")
    printed_verdicts = [line.split(":")[0].strip() for line in printed.splitlines() if line.startswith("  ")]
    assert printed_verdicts.count("reproduced") == 4 and printed_verdicts.count("not reproduced") == 2


def test_measurement_runs_decide_nothing():
    """``mode`` "measurement": the same numbers, the verdict ``MEASURED``, no verdict word in the terminal."""
    noise = {k: tuple(v / 20 for v in p) for k, p in EQUAL_NOISE.items()}
    evaluation = {k: {"seeds": list(SEEDS), "test_loss": [2.0 + g + s + n for s, n in zip(SHARED, noise.get(k, ZERO))]}
                  for k, g in {"adamw": 0.2, "muon-jordan": 0.0, "dion-1-ef": 0.0, "normuon": 0.0,
                               "muon-polar_express": 0.2}.items()}
    results = {"evaluation": evaluation, "spectral": None, "config": {"ns_dtype": "bfloat16"}}
    study = rp.evaluate_claims(results)
    assert study[0].verdict == "reproduced"
    measured = rp.evaluate_claims({**results, "mode": "measurement"})
    assert all(c.verdict == rp.MEASURED for c in measured)
    assert [c.numbers for c in measured] == [c.numbers for c in study]
    from dataclasses import asdict
    lines = rp.verdict_lines({"mode": "measurement", "mode_reason": "--quick", "claims": [asdict(c) for c in measured]})
    assert "no claim is decided" in lines[0] and not any("reproduced" in line or "inconclusive" in line
                                                         for line in lines)


# ---------------------------------------------------------------------------------------
# The rules' error rates and power (the derivation in the statistics module)
# ---------------------------------------------------------------------------------------


def _differences(rng, delta, sigma, n, trials):
    d = rng.normal(delta, sigma, size=(trials, n))
    return [{"mean": float(r.mean()), "spread": float(r.std(ddof=1)), "n": n, "finite": True} for r in d]


@pytest.mark.parametrize("n", [2, 3, 5])
def test_equal_methods_are_decided_in_at_most_alpha_of_runs(n):
    """Δ = 0: each wrong verdict of the lower rule at most α (binomial 4-sigma slack). The one-spread rule
    (mean − s > 0, a t threshold of √n) decides 20 % (n = 2) and 11 % (n = 3) of them each way."""
    trials = 4000
    rows = _differences(np.random.default_rng(n), 0.0, 1.0, n, trials)
    verdicts = [rp.decide_lower(d)["verdict"] for d in rows]
    slack = 4 * math.sqrt(rp.ALPHA * (1 - rp.ALPHA) / trials)
    for verdict in ("reproduced", "not reproduced"):
        assert verdicts.count(verdict) / trials <= rp.ALPHA + slack, verdict
    one_spread = sum(d["mean"] - d["spread"] > 0 for d in rows) / trials
    assert (one_spread > rp.ALPHA + slack) == (n <= 3)  # the rule this one replaces: beyond α at 2 and 3 seeds


@pytest.mark.parametrize("n", [3, 5])
def test_the_resolution_is_decided_with_the_stated_power(n):
    """A true difference equal to the resolution at the true σ is decided with probability ≈ POWER
    (noncentral t; the Monte Carlo rate within 4 sigma of it), and half of it far less often."""
    ta, tb = rp.statistics.t_quantile(1 - rp.ALPHA, n), rp.statistics.t_quantile(rp.POWER, n)
    exact = 1 - stats.nct.cdf(ta, n - 1, ta + tb)
    assert exact == pytest.approx(rp.POWER, abs=0.01)
    trials = 4000
    delta = rp.resolution(1.0, n, "lower")
    rate = np.mean([rp.decide_lower(d)["verdict"] == "reproduced"
                    for d in _differences(np.random.default_rng(10 + n), delta, 1.0, n, trials)])
    assert abs(rate - exact) < 4 * math.sqrt(exact * (1 - exact) / trials)
    half = np.mean([rp.decide_lower(d)["verdict"] == "reproduced"
                    for d in _differences(np.random.default_rng(20 + n), delta / 2, 1.0, n, trials)])
    assert half < rp.POWER - 0.2


def test_equivalence_at_the_margin_is_claimed_in_at_most_alpha_of_runs():
    """|Δ| = δ (the boundary): TOST says "reproduced" in at most α of runs, whatever the resolution gate."""
    trials, n = 4000, 5
    rows = _differences(np.random.default_rng(7), 1.0, 0.2, n, trials)
    rate = np.mean([rp.decide_within(d, 1.0)["verdict"] == "reproduced" for d in rows])
    assert rate <= rp.ALPHA + 4 * math.sqrt(rp.ALPHA * (1 - rp.ALPHA) / trials)


finite = st.floats(-1.0, 1.0, allow_nan=False)


@given(st.lists(finite, min_size=2, max_size=6), st.floats(1e-3, 1.0))
def test_within_is_never_decided_when_the_run_cannot_resolve_the_margin(d, margin):
    diff = rp.paired_difference(dict(enumerate(d)), dict.fromkeys(range(len(d)), 0.0))
    decision = rp.decide_within(diff, margin)
    if decision["resolution"] > margin:  # never an equivalence; a difference separated from δ outright stands
        outside = abs(diff["mean"]) - diff["half_width"] > margin
        assert decision["verdict"] == ("not reproduced" if outside else "inconclusive")
        assert outside or "cannot resolve δ" in decision["reason"]
    else:
        assert decision["resolution"] == pytest.approx(rp.resolution(diff["spread"], len(d), "within"))


@given(st.lists(finite, min_size=2, max_size=6))
def test_the_half_width_is_the_t_bound(d):
    diff = rp.paired_difference(dict(enumerate(d)), dict.fromkeys(range(len(d)), 0.0))
    n = len(d)
    assert diff["half_width"] == pytest.approx(stats.t.ppf(1 - rp.ALPHA, n - 1) * np.std(d, ddof=1) / math.sqrt(n),
                                               abs=1e-12)


def test_resolution_and_margin_arguments_are_checked():
    with pytest.raises(ValueError, match="rule"):
        rp.resolution(1.0, 3, "sometimes")
    with pytest.raises(ValueError, match="n, p"):
        rp.resolution(1.0, 1, "lower")
    with pytest.raises(ValueError, match="margin"):
        rp.decide_within({"mean": 0.0, "spread": 0.0, "n": 3, "finite": True}, math.nan)
    assert "not run" in rp.decide_lower({"mean": None, "spread": None, "n": 0, "finite": False})["reason"]
    assert "diverged" in rp.decide_lower({"mean": None, "spread": None, "n": 3, "finite": False})["reason"]
    assert "one seed" in rp.decide_lower({"mean": 0.1, "spread": None, "n": 1, "finite": True})["reason"]


def test_every_claim_names_its_published_evidence():
    claims = rp.evaluate_claims({"evaluation": {}, "spectral": None, "config": {}})
    assert [c.published for c in claims] == [rp.PUBLISHED[c.key] for c in claims]
    assert set(rp.PUBLISHED) == set(rp.CLAIM_RULES)
    for key, scale in (("muon_vs_adamw", "124 M"), ("dion_quarter_rank", "3 B"), ("normuon_vs_muon", "1.1 B"),
                       ("dion2_quarter", "1 B")):
        assert scale in rp.PUBLISHED[key], key


def test_rejudge_applies_the_current_rules_to_a_stored_run(tmp_path, monkeypatch, capsys):
    """A stored run whose claims were decided by another rule: ``--rejudge`` judges them again from its
    losses, keeps its plots, and says so in the report."""
    results, _, _, _ = _cli_run(tmp_path, monkeypatch, capsys, {}, EQUAL_NOISE)
    folder = tmp_path / "out" / "reproduction"
    stored = json.loads((folder / "results.json").read_text())
    for claim in stored["claims"]:
        claim["verdict"] = "reproduced"  # as a mean ± one-spread rule decided claims 1, 3, 5 and 6
    (folder / "results.json").write_text(json.dumps(stored))
    before = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.png")}
    assert before and rp.main(["--rejudge", str(folder / "results.json"), "--out", str(tmp_path / "out")]) == 0
    again = json.loads((folder / "results.json").read_text())
    assert [c["verdict"] for c in again["claims"]] == ["inconclusive"] * len(rp.CLAIM_RULES)
    assert {p.name: p.stat().st_mtime_ns for p in folder.glob("*.png")} == before
    report = (tmp_path / "out" / "reproduction.md").read_text()
    assert "re-judged by `ortho-verify reproduce --rejudge" in report and "(reproduction/loss_curves.png)" in report
    with pytest.raises(SystemExit) as exit_:
        rp.main(["--rejudge", str(tmp_path / "missing.json")])
    assert exit_.value.code == 2 and "--rejudge" in capsys.readouterr().err


def test_the_committed_report_is_judged_with_the_current_rules():
    """docs/reproduction.md's verdicts and resolutions are what the current rules make of its stored run."""
    stored = rp.load_results(ROOT / "docs" / "reproduction" / "results.json")
    again = rp.rejudge(stored)
    for old, new in zip([stored, *stored.get("sizes", [])], [again, *again.get("sizes", [])]):
        pairs = [[(c["verdict"], c["power"]) for c in r["claims"]] for r in (old, new)]
        assert pairs[0] == pairs[1]
    assert [t["verdict"] for t in stored["trends"]] == [t["verdict"] for t in again["trends"]]
    report = (ROOT / "docs" / "reproduction.md").read_text()
    assert all(c["power"] in report and c["published"] in report for c in again["claims"])
    assert "## Running at scale on one GPU" in report and "Student's t" in report


@pytest.mark.parametrize("claim, method, reference", [
    (rp.claim_dion_full_rank_matches_muon, "dion-1-ef", "muon-jordan"),
    (rp.claim_dion_quarter_rank_close, "dion-1/4-ef", "muon-jordan"),
    (rp.claim_dion2_quarter_close, "dion2-1/4", "muon-polar_express"),
])
def test_equivalence_needs_a_run_that_separates_adamw(claim, method, reference):
    """A run too short to separate anything: every method near its start, small noise, so the pair looks
    equivalent well within δ. Without AdamW separated from the reference by more than δ (assay
    sensitivity) that is inconclusive; with it, reproduced."""
    def results(adamw_gap):
        base = {reference: ZERO, method: tuple(v / 50 for v in B), "adamw": tuple(adamw_gap + v / 50 for v in A)}
        return {"evaluation": {k: {"seeds": list(SEEDS), "test_loss": [5.5 + s + n for s, n in zip(SHARED, v)]}
                               for k, v in base.items()}, "spectral": None, "config": {}}
    flat = claim(results(0.0))
    assert flat.verdict == "inconclusive" and "no assay sensitivity" in flat.reason
    assert flat.numbers["decision"]["resolution"] < flat.numbers["margin"]  # the pair alone would be decided
    delta = flat.numbers["margin"]
    assert claim(results(0.9 * delta)).verdict == "inconclusive"  # separated, but not beyond δ
    separated = claim(results(2 * delta))
    assert separated.verdict == "reproduced" and separated.numbers["sensitive"] and separated.reason == ""
    far = {"evaluation": {**results(0.0)["evaluation"], method: {"seeds": list(SEEDS), "test_loss": [
        5.5 + 3 * delta + s for s in SHARED]}}, "spectral": None, "config": {}}
    assert claim(far).verdict == "not reproduced"  # a gap beyond δ needs no control


def test_a_gap_separated_from_the_margin_stands_at_any_resolution():
    """|d̄| − h > δ is decided "not reproduced" even when the spread is too wide for an equivalence; the same
    spread with a smaller gap is inconclusive, not an equivalence."""
    d = [0.30, 0.35, 0.40]  # mean 0.35, spread 0.05: h 0.084, resolution 0.139
    diff = rp.paired_difference(dict(enumerate(d)), dict.fromkeys(range(3), 0.0))
    assert diff["mean"] - diff["half_width"] > 0.1 and rp.resolution(diff["spread"], 3, "within") > 0.1
    assert rp.decide_within(diff, 0.1)["verdict"] == "not reproduced"
    near = rp.paired_difference(dict(enumerate([x - 0.3 for x in d])), dict.fromkeys(range(3), 0.0))
    decision = rp.decide_within(near, 0.1)
    assert decision["verdict"] == "inconclusive" and "cannot resolve δ" in decision["reason"]
