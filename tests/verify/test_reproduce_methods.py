"""NorMuon and Dion2 in ``ortho-verify reproduce``: their claims on planted results (every verdict),
the optimizers the methods build, their run-cache fingerprints, the lr grids and the report's
claim numbering. No training beyond a three-step Dion2 run."""

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import ortho_fast
from ortho_fast.groups.dion2 import DION2_DEFAULTS
from ortho_fast.groups.muon import MUON_DEFAULTS
from ortho_verify import registry, reproduce as rp
from ortho_verify.inputs import data
from ortho_verify.reproduce.cache import code_files, method_fingerprint
from ortho_verify.reproduce.scaling import DEFAULT_SWEEP, QUICK_SWEEP

SEEDS = (1, 2, 3)
#: Per-seed noise shared by every method (the same batches): paired differences cancel it.
NOISE = (0.03, -0.02, 0.01)
HAS_NORMUON = "normuon_beta2" in MUON_DEFAULTS
NEEDS_NORMUON = pytest.mark.skipif(not HAS_NORMUON, reason="ortho_fast's Muon has no normuon_beta2 option yet (NorMuon "
                                   "lands from another branch): the 'normuon' method is left out of METHODS")


def _results(losses: dict) -> dict:
    """Synthetic results: method key -> per-seed test losses, or a float (that loss plus NOISE); AdamW
    3.0 plus NOISE unless given (the assay-sensitivity control, far from every reference)."""
    evaluation = {}
    for key, value in {"adamw": 3.0, **losses}.items():
        values = [value + n for n in NOISE] if isinstance(value, float) else list(value)
        evaluation[key] = {"seeds": list(SEEDS[:len(values)]), "test_loss": values}
    return {"evaluation": evaluation, "spectral": {}, "config": {"ns_dtype": "bfloat16"}}


def _verdict(claim, losses) -> str:
    result = claim(_results(losses))
    assert result.verdict in rp.VERDICTS and result.verdict.split()[-1] in result.sentence.lower()
    return result.verdict


# ---------------------------------------------------------------------------------------
# Claims: each verdict on planted results
# ---------------------------------------------------------------------------------------


def test_normuon_claim_every_way():
    claim = rp.claim_normuon_beats_muon
    assert _verdict(claim, {"muon-polar_express": 2.05, "normuon": 2.00}) == "reproduced"
    assert _verdict(claim, {"muon-polar_express": 2.00, "normuon": 2.05}) == "not reproduced"
    assert _verdict(claim, {"muon-polar_express": [2.0, 2.1, 2.0], "normuon": [2.05, 2.0, 2.05]}) == "inconclusive"
    assert _verdict(claim, {"muon-polar_express": [2.1, None, 2.1], "normuon": 2.0}) == "inconclusive"  # diverged
    assert _verdict(claim, {"muon-polar_express": 2.05}) == "inconclusive"  # NorMuon not run
    # the comparison is with Muon (Polar Express), not Keller's: a NorMuon only better than Keller's Muon fails
    assert _verdict(claim, {"muon-jordan": 2.10, "muon-polar_express": 1.95, "normuon": 2.00}) == "not reproduced"


def test_dion2_claim_every_way_against_polar_express():
    claim = rp.claim_dion2_quarter_close
    gap = 2.0 * (rp.MATCH_MARGIN + rp.CLOSE_MARGIN) / 2  # within "stays close", beyond "matches"
    assert _verdict(claim, {"muon-polar_express": 2.0, "dion2-1/4": 2.0 + gap}) == "reproduced"
    assert _verdict(claim, {"muon-polar_express": 2.0, "dion2-1/4": 2.0 - gap}) == "reproduced"  # either side
    assert _verdict(claim, {"muon-polar_express": 2.0, "dion2-1/4": 2.2}) == "not reproduced"
    assert _verdict(claim, {"muon-polar_express": 2.0, "dion2-1/4": 1.8}) == "not reproduced"  # far better: not close
    wide = [2.0 + 0.05, 2.0 + 0.0, 2.0 + 0.1]  # |mean| ≈ δ with a spread on both sides of it
    assert _verdict(claim, {"muon-polar_express": [2.0, 2.0, 2.0], "dion2-1/4": wide}) == "inconclusive"
    assert _verdict(claim, {"muon-polar_express": 2.0}) == "inconclusive"  # Dion2 not run
    assert _verdict(claim, {"dion2-1/4": 2.0}) == "inconclusive"  # its reference not run
    # the reference is Muon (Polar Express): Keller's Muon far away does not matter
    assert _verdict(claim, {"muon-jordan": 3.0, "muon-polar_express": 2.0, "dion2-1/4": 2.01}) == "reproduced"


def test_dion2_claim_fails_just_beyond_its_margin():
    """No spread (a constant shift): the verdict flips where |d| crosses δ = CLOSE_MARGIN × Muon (PE)'s mean."""
    muon = [2.0 + n for n in NOISE]
    delta = rp.CLOSE_MARGIN * sum(muon) / len(muon)
    for factor, verdict in ((0.99, "reproduced"), (1.01, "not reproduced")):
        dion2 = [v + factor * delta for v in muon]
        result = rp.claim_dion2_quarter_close(_results({"muon-polar_express": muon, "dion2-1/4": dion2}))
        assert result.verdict == verdict and result.numbers["margin"] == pytest.approx(delta)


finite = st.floats(1.0, 5.0, allow_nan=False)


@given(st.lists(finite, min_size=2, max_size=5), st.floats(-0.2, 0.2), st.lists(st.floats(-0.5, 0.5), min_size=5,
                                                                                 max_size=5))
def test_claims_see_only_the_paired_difference(muon, shift, noise):
    """A per-seed offset shared by both methods (the same batches) changes neither claim's verdict."""
    dion2 = [v + shift for v in muon]
    plain = {"muon-polar_express": muon, "dion2-1/4": dion2, "normuon": dion2}
    noisy = {k: [v + noise[i] for i, v in enumerate(values)] for k, values in plain.items()}
    normuon = rp.claim_normuon_beats_muon
    assert normuon(_results(plain)).verdict == normuon(_results(noisy)).verdict
    # within: the margin follows Muon's mean loss, so compare at a margin that the noise cannot move across
    if abs(abs(shift) - rp.CLOSE_MARGIN * sum(muon) / len(muon)) > 0.05:
        dion2_claim = rp.claim_dion2_quarter_close
        assert dion2_claim(_results(plain)).verdict == dion2_claim(_results(noisy)).verdict


def test_claim_rules_are_the_claims_rules_in_order():
    claims = rp.evaluate_claims(_results({}))
    assert [c.key for c in claims] == list(rp.CLAIM_RULES)
    for c in claims:
        kind = rp.CLAIM_RULES[c.key]
        assert ("|mean(d)| + h ≤ δ" in c.rule) == (kind == "within"), c.key
        assert ("mean(d) − h > 0" in c.rule) == (kind == "lower"), c.key
    assert "claim 7 " in rp.trend_rule_text() and list(rp.CLAIM_RULES).index("polar_express") == 6


def test_trend_series_follow_the_new_claims():
    series = {s.key: s for s in rp.TREND_SERIES}
    assert (series["normuon"].worse, series["normuon"].better) == ("muon-polar_express", "normuon")
    assert (series["dion2_quarter"].worse, series["dion2_quarter"].better) == ("dion2-1/4", "muon-polar_express")
    assert {s.claim for s in rp.TREND_SERIES} - {None} <= set(rp.CLAIM_RULES)


# ---------------------------------------------------------------------------------------
# Methods: availability, the optimizers they build
# ---------------------------------------------------------------------------------------


def test_methods_are_the_registry_methods_that_ortho_fast_can_run():
    names = [c.name.removeprefix("reproduce/") for c in registry.REPRODUCTION_METHODS]
    assert {"normuon", "dion2-1/4"} <= set(names)
    assert [m.key for m in rp.METHODS] == [k for k in names if k not in rp.UNAVAILABLE_METHODS]
    assert ("normuon" in rp.UNAVAILABLE_METHODS) == (not HAS_NORMUON)
    assert "dion2-1/4" in rp.METHODS_BY_KEY
    # an option that ortho_fast does not know would be kept in the group and ignored: such a method is left out
    unknown = registry.OptimizerConfig("reproduce/x", "muon", {"nesterov": True, "no_such_option": 1.0})
    assert rp.missing_options(unknown) == ("no_such_option",)
    assert rp.missing_options(registry.get("reproduce/adamw")) == ()
    assert rp.missing_options(registry.get("reproduce/dion2-1/4")) == ()


def test_new_methods_take_their_sources_options():
    dion2 = rp.METHODS_BY_KEY["dion2-1/4"]
    assert (dion2.family, dion2.label, dion2.fraction, dion2.coefficients) == ("dion2", "Dion2 f=1/4", 0.25,
                                                                              "polar_express")
    assert dion2.ef_decay == DION2_DEFAULTS["ef_decay"] == 0.95  # microsoft/dion's default
    options = registry.get("reproduce/normuon").kwargs()
    assert options == {"nesterov": True, "coefficients": "polar_express", "normuon_beta2": 0.95}
    assert registry.get("reproduce/normuon").label == "NorMuon (Polar Express)"
    muon_pe = registry.get("reproduce/muon-polar_express").kwargs()
    assert {k: v for k, v in options.items() if k != "normuon_beta2"} == muon_pe  # only the NorMuon stage differs


def _model(config):
    return data.build_model(rp.gpt_config(config), torch.Generator().manual_seed(0))


def _one_step(model, optimizer, config):
    batch = torch.randint(0, data.VOCAB_SIZE, (2, config.context + 1), generator=torch.Generator().manual_seed(0))
    F.cross_entropy(model(batch[:, :-1]).reshape(-1, data.VOCAB_SIZE), batch[:, 1:].reshape(-1)).backward()
    grads = {p: p.grad.clone() for p in model.parameters()}
    before = {p: p.detach().clone() for p in model.parameters()}
    optimizer.step()
    return grads, before


def test_dion2_builds_a_dion2_group_that_updates_a_quarter_of_the_slices():
    config = rp.QUICK
    model = _model(config)
    method = rp.METHODS_BY_KEY["dion2-1/4"]
    optimizer = rp.build_optimizer(method, model, 0.01, 0.004, config, seed=1)
    assert isinstance(optimizer, ortho_fast.HybridOptimizer)
    (group,) = [g for g in optimizer.param_groups if g["algorithm"] == "dion2"]
    assert {g["algorithm"] for g in optimizer.param_groups} == {"dion2", "adamw"}
    assert (group["fraction"], group["ef_decay"], group["lr"], group["weight_decay"]) == (0.25, 0.95, 0.01, 0.0)
    assert group["adjust_lr"] == "spectral_norm" and group["dtype"] == torch.bfloat16  # Dion's √(m/n), ns_dtype
    assert "mu" not in group and "momentum" not in group  # Dion2 has no μ
    assert sorted(group["param_names"]) == sorted(
        f"blocks.{i}.{n}" for i in range(config.n_layers) for n in ("attn.qkv.weight", "attn.proj.weight",
                                                                     "mlp.fc.weight", "mlp.proj.weight"))
    grads, before = _one_step(model, optimizer, config)
    for p in group["params"]:
        m, n = p.shape
        dim = 1 if m <= n else 0  # a slice is a row (m ≤ n) or a column: the shorter side is cut
        changed = (p.detach() != before[p]).any(dim=dim)
        assert int(changed.sum()) == math.ceil(0.25 * min(m, n)), (m, n)
        # momentum: B = G; the selected slices keep ef_decay·B, the others B
        momentum, g = optimizer.state[p]["momentum"], grads[p]
        mask = changed.unsqueeze(dim)
        torch.testing.assert_close(momentum, torch.where(mask, 0.95 * g, g), rtol=0, atol=0)


@NEEDS_NORMUON
def test_normuon_builds_a_muon_group_with_its_second_moment():
    config = rp.QUICK
    model = _model(config)
    optimizer = rp.build_optimizer(rp.METHODS_BY_KEY["normuon"], model, 0.01, 0.004, config, seed=1)
    (group,) = [g for g in optimizer.param_groups if g["algorithm"] == "muon"]
    assert (group["normuon_beta2"], group["coefficients"], group["nesterov"]) == (0.95, "polar_express", True)
    assert group["momentum"] == config.momentum and group["adjust_lr"] == config.muon_adjust_lr
    plain = rp.build_optimizer(rp.METHODS_BY_KEY["muon-polar_express"], _model(config), 0.01, 0.004, config, seed=1)
    (muon,) = [g for g in plain.param_groups if g["algorithm"] == "muon"]
    assert muon.get("normuon_beta2") is None
    _one_step(model, optimizer, config)  # runs


def test_dion2_runs_are_deterministic_and_capture_gradients():
    config = replace(rp.QUICK, steps=3, capture_points=2, curve_points=1, eval_windows=8)
    one = rp.train_run(config, "dion2-1/4", 0.01, 1, scalar_lr=0.004, capture=True)
    assert rp.train_run(config, "dion2-1/4", 0.01, 1, scalar_lr=0.004)["curve"] == one["curve"]
    assert not one["diverged"] and {name for name, _, _ in one["gradients"]} == {
        f"blocks.0.{n}" for n in ("attn.qkv.weight", "attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight")}


# ---------------------------------------------------------------------------------------
# Run cache, grids
# ---------------------------------------------------------------------------------------


def _relative(family):
    """The ortho_fast files of ``code_files(family)``, as paths under ortho_fast/."""
    root = Path(ortho_fast.__file__).resolve().parent
    return {p.relative_to(root).as_posix() for p in code_files(family) if root in p.parents}


def test_dion2_fingerprints_the_code_it_runs():
    dion2, dion, muon = _relative("dion2"), _relative("dion"), _relative("muon")
    assert {"functional/dion2.py", "groups/dion2.py", "functional/newton_schulz.py", "coefficients.py",
            "functional/muon.py", "hybrid_optimizer.py"} <= dion2  # Newton–Schulz and the lr scale it calls
    assert not dion2 & {"functional/dion.py", "functional/qr.py"}  # Dion's math only
    assert not any(p.startswith("distributed/") for p in dion2)
    assert dion2 != dion and dion2 != muon
    prints = rp.method_fingerprints()
    assert len(set(prints.values())) == len(prints)  # one per method
    assert method_fingerprint(rp.METHODS_BY_KEY["dion2-1/4"]) == prints["dion2-1/4"]
    with pytest.raises(ValueError, match="family"):
        code_files("dion3")


def test_dion_and_dion2_share_the_lower_dion_grid():
    grid = (0.0025, 0.005, 0.01, 0.02, 0.04)
    config = rp.ReproConfig()
    assert config.dion_lrs == grid and config.grid("dion") == config.grid("dion2") == grid
    assert config.grid("muon") == config.muon_lrs and config.grid("adamw") == config.adamw_lrs
    assert all(c.dion_lrs == grid for c in (rp.QUICK, DEFAULT_SWEEP.base, QUICK_SWEEP.base))
    with pytest.raises(ValueError, match="family"):
        config.grid("sgd")


class _FakeRunner:
    def __init__(self, loss):
        self.config, self.loss, self.rounds = rp.ReproConfig(lr_extensions=2), loss, []

    def map(self, phase, jobs):
        self.rounds.append(sorted(job["lr"] for job in jobs))
        return [{"loss": self.loss(job["lr"])} for job in jobs]


def test_dion2_sweep_extends_below_the_dion_grid():
    runner, sweep = _FakeRunner(lambda lr: lr), {}  # the smallest lr always wins
    rp.sweep_learning_rates(runner, [rp.METHODS_BY_KEY["dion2-1/4"]], 0.002, sweep)
    assert runner.rounds == [list(runner.config.dion_lrs), [0.00125], [0.000625]]
    assert rp.best_learning_rate(sweep["dion2-1/4"]) == (0.000625, True)
