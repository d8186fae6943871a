"""Checkpoints across optimizers: a torch.optim.Muon state dict loads into ortho_fast.Muon with
its settings mapped, ortho_fast.Muon's loads into torch.optim.Muon where torch can express it —
in both directions the next steps are bitwise the other optimizer's — and foreign checkpoints
(Muon loading Dion's, Dion loading AdamW's) are rejected naming the key.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings, strategies as st

from ortho_fast import Dion, HybridOptimizer, Muon
from tests.ortho_fast.helpers import gradient_matrix, rng_for
from tests.round_trip import run_steps

SHAPES = ((12, 8), (8, 12))


def _problem(key, steps: int = 4):
    rng = rng_for("ckpt", key)
    w0 = [torch.tensor(0.02 * rng.standard_normal(s), dtype=torch.float32) for s in SHAPES]
    grads = [[torch.tensor(gradient_matrix(s, rng), dtype=torch.float32) for s in SHAPES] for _ in range(steps)]
    return w0, grads


def _params(w0):
    return [torch.nn.Parameter(w.clone()) for w in w0]


TORCH_SETTINGS = st.fixed_dictionaries({}, optional={
    "ns_coefficients": st.sampled_from([(3.4445, -4.7750, 2.0315), (3.0, -3.2, 1.2)]),
    "ns_steps": st.integers(2, 6),
    "eps": st.sampled_from([1e-7, 1e-2]),
    "adjust_lr_fn": st.sampled_from([None, "original", "match_rms_adamw"]),
    "nesterov": st.booleans(),
    "momentum": st.sampled_from([0.9, 0.95]),
})


def _resume(make_source, make_target, w0, grads, split=2):
    """Source runs `split` steps and saves; target (built with other settings) loads and runs the rest."""
    ps = _params(w0)
    source = make_source(ps)
    run_steps(ps, source, grads[:split])
    pt = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    target = make_target(pt)
    target.load_state_dict(copy.deepcopy(source.state_dict()))
    run_steps(pt, target, grads[split:])
    return pt


@settings(max_examples=10, deadline=None)
@given(kwargs=TORCH_SETTINGS)
def test_torch_checkpoint_into_ours_steps_as_torch(kwargs):
    """The settings of a torch.optim.Muon checkpoint replace ours (built here with other ones:
    polar_express, classic momentum, no lr adjustment) and the resumed run is torch's."""
    w0, grads = _problem("torch-to-ours")
    uninterrupted = _params(w0)
    run_steps(uninterrupted, torch.optim.Muon(uninterrupted, lr=0.02, **kwargs), grads)
    resumed = _resume(lambda ps: torch.optim.Muon(ps, lr=0.02, **kwargs),
                      lambda ps: Muon(ps, lr=0.5, coefficients="polar_express", momentum_style="classic",
                                      adjust_lr=None, dtype=torch.float32), w0, grads)
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted, resumed))


@settings(max_examples=10, deadline=None)
@given(kwargs=TORCH_SETTINGS)
def test_our_checkpoint_into_torch_steps_as_ours(kwargs):
    w0, grads = _problem("ours-to-torch")
    uninterrupted = _params(w0)
    run_steps(uninterrupted, Muon(uninterrupted, lr=0.02, **kwargs), grads)
    resumed = _resume(lambda ps: Muon(ps, lr=0.02, **kwargs), lambda ps: torch.optim.Muon(ps, lr=0.5), w0, grads)
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted, resumed))


def test_round_trip_through_torch_keeps_our_settings_and_detects_edits():
    """ours -> torch -> ours: the torch keys written beside ours agree and are dropped; a torch
    key edited on the way disagrees with ours and is named."""
    w0, grads = _problem("through-torch")
    ps = _params(w0)
    ours = Muon(ps, lr=0.02, ns_coefficients=(3.0, -3.2, 1.2), ns_steps=4, adjust_lr_fn="match_rms_adamw")
    run_steps(ps, ours, grads[:1])
    theirs = torch.optim.Muon(_params(w0))
    theirs.load_state_dict(ours.state_dict())
    back = Muon(_params(w0))
    back.load_state_dict(theirs.state_dict())
    group = back.param_groups[0]
    assert (tuple(group["coefficients"]), group["ns_steps"], group["adjust_lr"], group["eps_mode"]) == (
        (3.0, -3.2, 1.2), 4, "match_rms_adamw", "clamp")
    assert "ns_coefficients" not in group and "adjust_lr_fn" not in group
    edited = theirs.state_dict()
    edited["param_groups"][0]["adjust_lr_fn"] = "original"
    before = copy.deepcopy(back.state_dict())
    with pytest.raises(ValueError, match="^adjust_lr_fn: 'original' disagrees with this group's adjust_lr"):
        back.load_state_dict(edited)
    assert back.state_dict()["param_groups"] == before["param_groups"]


def test_groups_torch_cannot_express_carry_no_torch_keys():
    p = torch.nn.Parameter(torch.zeros(4, 6))
    for kw in (dict(coefficients="polar_express"), dict(momentum_style="classic"), dict(dtype=torch.float32),
               dict(adjust_lr="spectral_norm"), dict(cautious_weight_decay=True)):
        assert "ns_coefficients" not in Muon([p], **kw).state_dict()["param_groups"][0], kw
    assert Muon([p]).state_dict()["param_groups"][0]["ns_coefficients"] == (3.4445, -4.7750, 2.0315)


def test_foreign_checkpoints_are_rejected_naming_the_key():
    w0, grads = _problem("foreign")
    pd = _params(w0)
    dion = Dion(pd)
    run_steps(pd, dion, grads[:1])
    pa = _params(w0)
    adamw = torch.optim.AdamW(pa)
    run_steps(pa, adamw, grads[:1])
    muon = Muon(_params(w0))
    with pytest.raises(ValueError, match=r"^rank_fraction: an option of dion, not of muon"):
        muon.load_state_dict(dion.state_dict())
    sd = dion.state_dict()
    sd["param_groups"] = muon.state_dict()["param_groups"]  # Dion's state under Muon's groups
    with pytest.raises(ValueError, match=r"^momentum: not a Muon state key \(a state key of Dion"):
        muon.load_state_dict(sd)
    target = Dion(_params(w0))
    with pytest.raises(ValueError, match=r"^betas: an option of adamw/lion, not of dion"):
        target.load_state_dict(adamw.state_dict())
    sd = adamw.state_dict()
    sd["param_groups"] = target.state_dict()["param_groups"]
    with pytest.raises(ValueError, match=r"^exp_avg: not a Dion state key \(a state key of AdamW/Lion"):
        target.load_state_dict(sd)
    hybrid = HybridOptimizer([{"params": _params(w0), "algorithm": "muon"}])
    with pytest.raises(ValueError, match=r"^param group 0 \(muon\): momentum: not a Muon state key"
                                         r"|^momentum: not a Muon state key"):
        sd = dion.state_dict()
        sd["param_groups"] = hybrid.state_dict()["param_groups"]
        hybrid.load_state_dict(sd)
