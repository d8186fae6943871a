"""``weight_decay_style`` of ortho_fast's Muon against the oracle (``ortho_ref.muon_step(weight_decay_style=...)``)
and the judge (``check_optimizer`` with ``MuonConventions(weight_decay_style=...)``): "decoupled" W(1 − lr·wd),
"adjusted_lr" W(1 − lr·s·wd) with the matrix's lr multiplier s (nanochat), "independent" W(1 − wd), on the
stacked step, the per-parameter step, blocks of different s (split projections) and cautious decay.

Tolerances: ``tests.ortho_fast.helpers.muon_reference`` (``ortho_verify.tolerances``: ``ns_tolerance``,
``muon_tolerance``, ``cautious_weight_decay_tolerance``) and the judge's own.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_fast
from ortho_fast import Muon
from ortho_fast.functional.muon import WEIGHT_DECAY_STYLES
from ortho_verify.checks.optimizer_checks import check_optimizer
from ortho_verify.conventions import ORTHO_MUON
from tests.ortho_fast.helpers import BASE, ROWS, check_against_muon_reference, rng_for, run_one_muon_step

SHAPES = [(24, 16), (16, 24), (20, 20), (24, 16), (16, 24)]  # tall, wide, square; two of a shape stack


@pytest.mark.parametrize("style", WEIGHT_DECAY_STYLES)
@pytest.mark.parametrize("cautious", [False, True])
@pytest.mark.parametrize("banks", [None, True])
def test_styles_match_the_oracle(style, cautious, banks):
    """Each style, per-parameter (``banks=None`` in float64) and stacked (``banks=True``), plain and cautious."""
    opts = {**BASE, "weight_decay": 0.5, "weight_decay_style": style, "cautious_weight_decay": cautious}
    for out in run_one_muon_step(SHAPES, opts, rng_for("wd style", style, cautious, banks), banks=banks):
        check_against_muon_reference(*out, [ROWS], opts)


@pytest.mark.parametrize("style", WEIGHT_DECAY_STYLES)
@pytest.mark.parametrize("cautious", [False, True])
def test_split_blocks_decay_with_their_own_scale(style, cautious):
    """A fused (18, 6) projection split into (12, 6) and (6, 6) blocks: s = √2 and 1, so "adjusted_lr"
    decays each block with its own lr·s·wd (the oracle is per matrix)."""
    opts = {**BASE, "weight_decay": 0.5, "weight_decay_style": style, "cautious_weight_decay": cautious}
    (out,) = run_one_muon_step([(18, 6)], opts, rng_for("wd split", style, cautious), split_sizes=(12, 6))
    check_against_muon_reference(*out, [(slice(0, 12),), (slice(12, 18),)], opts)


def test_a_wrong_style_is_caught_by_the_oracle():
    """The comparison can fail: the product's "decoupled" step held to "adjusted_lr" on a tall matrix."""
    opts = {**BASE, "weight_decay": 0.5}
    (out,) = run_one_muon_step([(24, 16)], opts, rng_for("wd planted"))
    with pytest.raises(AssertionError, match="weight error"):
        check_against_muon_reference(*out, [ROWS], {**opts, "weight_decay_style": "adjusted_lr"})


@settings(deadline=None, max_examples=30)
@given(m=st.integers(1, 20), n=st.integers(1, 20), style=st.sampled_from(WEIGHT_DECAY_STYLES),
       adjust_lr=st.sampled_from(["original", "match_rms_adamw", "spectral_norm", None]),
       extra=st.floats(0.1, 3.0), wd=st.sampled_from([0.0, 0.1, 2.0]), cautious=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_styles_property_against_the_oracle(m, n, style, adjust_lr, extra, wd, cautious, seed):
    opts = {**BASE, "weight_decay": wd, "weight_decay_style": style, "adjust_lr": adjust_lr,
            "extra_scale_factor": extra, "cautious_weight_decay": cautious}
    (out,) = run_one_muon_step([(m, n)], opts, np.random.default_rng(seed))
    check_against_muon_reference(*out, [ROWS], opts)


@pytest.mark.parametrize("declared, used, passes", [("adjusted_lr", "adjusted_lr", True),
                                                    ("decoupled", "adjusted_lr", False),
                                                    ("adjusted_lr", "decoupled", False)])
def test_the_judge_holds_the_product_to_the_declared_style(declared, used, passes):
    """``check_optimizer`` with ``MuonConventions(weight_decay_style=...)`` passes the product's step
    with that style and fails it with the other (float64 throughout, where every row makes a claim)."""
    conv = dataclasses.replace(ORTHO_MUON, weight_decay_style=declared, ns_dtype=torch.float64)
    make = functools.partial(Muon, weight_decay_style=used, dtype=None)
    report = check_optimizer(make, conv, param_dtype=torch.float64, weight_decay=0.5)
    assert all(r.passed for r in report.results) is passes, [r.check for r in report.results if not r.passed]


def test_nanochat_preset_decays_with_the_adjusted_lr():
    opt = ortho_fast.optimizer_preset("nanochat", [torch.nn.Parameter(torch.zeros(4, 2))])
    assert opt.param_groups[0]["weight_decay_style"] == "adjusted_lr"


@pytest.mark.parametrize("value, error", [("l2", ValueError), ("coupled", ValueError), (None, ValueError)])
def test_bad_style_names_the_option_and_changes_nothing(value, error):
    p = torch.nn.Parameter(torch.ones(3, 2))
    with pytest.raises(error, match="weight_decay_style"):
        Muon([p], weight_decay_style=value)
    opt = Muon([p])
    opt.param_groups[0]["weight_decay_style"] = value
    p.grad = torch.ones(3, 2)
    with pytest.raises(error, match="weight_decay_style"):
        opt.step()
    assert torch.equal(p.detach(), torch.ones(3, 2)) and not opt.state


def test_only_decoupled_groups_export_torch_keys():
    """torch.optim.Muon decays with the unscaled lr: a group of another style has no torch keys."""
    p = torch.nn.Parameter(torch.ones(3, 2))
    assert "ns_coefficients" in Muon([p]).state_dict()["param_groups"][0]
    assert "ns_coefficients" not in Muon([p], weight_decay_style="adjusted_lr").state_dict()["param_groups"][0]


def _tall_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 24, bias=False), torch.nn.Linear(24, 24, bias=False))


def _stepped(make) -> list[torch.Tensor]:
    model = _tall_model()
    opt = make(model)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("build", ["HybridOptimizer", "param_groups", "MuonConfig", "NorMuon"])
def test_every_muon_front_takes_the_style(build):
    """HybridOptimizer's Muon groups, ``param_groups(matrix_options=...)``, ``MuonConfig`` and ``NorMuon``
    run the one-process Muon step with the style: their weights equal ``Muon``'s with it bit for bit, and
    differ from the "decoupled" step (the (24, 8) matrix is tall: s = √3)."""
    style = dict(weight_decay_style="adjusted_lr")
    fronts = {
        "HybridOptimizer": lambda m, **kw: ortho_fast.HybridOptimizer(
            [{"params": list(m.parameters()), "algorithm": "muon", **kw}]),
        "param_groups": lambda m, **kw: ortho_fast.HybridOptimizer(
            ortho_fast.param_groups(m, algorithm="muon", matrix_options=kw)),
        "MuonConfig": lambda m, **kw: ortho_fast.MuonConfig(muon_options=kw).build(m),
        "NorMuon": lambda m, **kw: ortho_fast.NorMuon(m.parameters(), **kw),
    }
    muon_kw = dict(normuon_beta2=0.95, momentum_style="classic", nesterov=False, coefficients="polar_express",
                   adjust_lr="spectral_norm", weight_decay=0.01, lr=0.01, eps=1e-8, flatten=False) \
        if build == "NorMuon" else {}
    ref = _stepped(lambda m: Muon(m.parameters(), **muon_kw, **style))
    got = _stepped(lambda m: fronts[build](m, **style))
    plain = _stepped(lambda m: fronts[build](m))
    assert all(torch.equal(a, b) for a, b in zip(got, ref))
    assert not torch.equal(got[0], plain[0])
