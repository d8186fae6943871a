"""ortho_fast.Muon's error contract: bad construction raises naming the key, a rejected
param group is not added, and a bad step (non-finite gradient, bad momentum buffer, an option
edited on a live group, a bad saved group in ``load_state_dict``) raises before any parameter
or state changes; ``muon_momentum`` rejects an unknown style.
"""

from __future__ import annotations

import copy

import pytest
import torch

from ortho_fast import Muon
from ortho_fast.functional.muon import muon_momentum
from tests.ortho_fast.helpers import layout_optimizer, layout_params, rng_for
from tests.round_trip import run_steps

# =======================================================================================
# Bad input: clear errors, nothing changed
# =======================================================================================

P2 = [torch.nn.Parameter(torch.ones(6, 4))]


@pytest.mark.parametrize(
    "make, exc, key",
    [
        (lambda: Muon([torch.nn.Parameter(torch.ones(5))]), ValueError, "params"),
        (lambda: Muon([torch.nn.Parameter(torch.ones(()))]), ValueError, "params"),
        (lambda: Muon([torch.nn.Parameter(torch.ones(4, 0))]), ValueError, "params"),
        (lambda: Muon(P2, split_sizes=(2, 3)), ValueError, "split_sizes"),
        (lambda: Muon(P2, split_sizes=(3, 3, 0)), ValueError, "split_sizes"),
        (lambda: Muon(P2, split_sizes=(2, 1), split_groups=3), ValueError, "split_sizes"),
        (lambda: Muon(P2, split_groups=2), ValueError, "split_groups"),
        (lambda: Muon(P2, split_sizes=(3, 3), num_heads=2), ValueError, "num_heads"),
        (lambda: Muon(P2, split_sizes=(3, 3), num_heads=(1, 1, 1)), ValueError, "num_heads"),
        (lambda: Muon(P2, split_sizes=(2, 1), split_groups=2, num_heads=(3, 1)), ValueError, "num_heads"),
        (lambda: Muon(P2, split_sizes=3), TypeError, "split_sizes"),
        (lambda: Muon(P2, expert_keys=("experts",)), ValueError, "expert_keys"),
        (lambda: Muon([("layer.experts.w", P2[0])], expert_keys=("experts",)), ValueError, "expert_keys"),
        (lambda: Muon(P2, expert_keys=(3,)), TypeError, "expert_keys"),
        (lambda: Muon(P2, coefficients="no_such_schedule"), ValueError, "coefficients"),
        (lambda: Muon(P2, ns_steps=0), ValueError, "ns_steps"),
        (lambda: Muon(P2, ns_steps=2.0), ValueError, "ns_steps"),
        (lambda: Muon(P2, eps_mode="max"), ValueError, "eps_mode"),
        (lambda: Muon(P2, expert_keys=None), TypeError, "expert_keys"),
        (lambda: Muon(P2, coefficients=[[1.0, 2.0]]), ValueError, "coefficients"),
        (lambda: Muon(P2, adjust_lr="spectral_nrom"), ValueError, "adjust_lr"),
        (lambda: Muon(P2, extra_scale_factor=0.0), ValueError, "extra_scale_factor"),
        (lambda: Muon(P2, cautious_weight_decay=1), TypeError, "cautious_weight_decay"),
        (lambda: Muon(P2, banks="yes"), TypeError, "banks"),
        (lambda: Muon(P2, dtype=torch.int32), TypeError, "dtype"),
        (lambda: Muon(P2, dtype="low"), TypeError, "dtype"),
        (lambda: Muon([torch.nn.Parameter(torch.ones(4, 3, dtype=torch.complex64))]), TypeError, "params"),
    ],
)
def test_bad_construction_raises_naming_the_key(make, exc, key):
    with pytest.raises(exc, match=rf"^['\"]?{key}:"):
        make()


def test_rejected_param_group_is_not_added():
    opt = Muon([torch.nn.Parameter(torch.ones(6, 4))])
    with pytest.raises(ValueError, match="^split_sizes:"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(6, 4))], "split_sizes": (5,)})
    assert len(opt.param_groups) == 1


def _clone(v):
    return v.clone() if isinstance(v, torch.Tensor) else v


def _same(a, b) -> bool:
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def _snapshot(ps, opt):
    return [p.detach().clone() for p in ps], {id(p): {k: _clone(v) for k, v in s.items()} for p, s in opt.state.items()}


def _assert_same(ps, opt, snap):
    params, state = snap
    assert all(torch.equal(p.detach(), q) for p, q in zip(ps, params))
    assert {id(p) for p in opt.state} == set(state)
    for p, s in opt.state.items():
        assert set(s) == set(state[id(p)]) and all(_same(v, state[id(p)][k]) for k, v in s.items())


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("where", [0, 2, 4])  # experts, a split QKV weight, a plain weight
def test_nonfinite_grad_with_layouts_changes_nothing(bad, where):
    rng = rng_for("nonfinite-layouts")
    ps = layout_params(rng)
    opt = layout_optimizer(ps)
    run_steps(ps, opt, [[torch.randn(p.shape) for p in ps]])
    for p in ps:
        p.grad = torch.randn(p.shape)
    ps[where].grad.view(-1)[3] = bad
    snap = _snapshot(ps, opt)
    with pytest.raises(ValueError, match=r"^grad of '"):
        opt.step()
    _assert_same(ps, opt, snap)


@pytest.mark.parametrize("bad_buffer", [torch.zeros(4, 8), torch.zeros(4, 8, 6, dtype=torch.float64), "buf"])
def test_bad_momentum_buffer_changes_nothing(bad_buffer):
    rng = rng_for("bad-buffer")
    ps = layout_params(rng)
    opt = layout_optimizer(ps)
    run_steps(ps, opt, [[torch.randn(p.shape) for p in ps]])
    opt.state[ps[0]]["momentum_buffer"] = bad_buffer
    for p in ps:
        p.grad = torch.randn(p.shape)
    snap = _snapshot(ps, opt)
    with pytest.raises(ValueError, match=r"^momentum_buffer:"):
        opt.step()
    _assert_same(ps, opt, snap)


@pytest.mark.parametrize("key, value, exc", [
    ("split_sizes", (6, 6, 5), ValueError), ("split_sizes", 3, TypeError), ("coefficients", "nope", ValueError),
    ("coefficients", [[1.0, 2.0]], ValueError), ("ns_steps", 0, ValueError), ("lr", float("nan"), ValueError),
    ("lr", "0.02", ValueError), ("weight_decay", -1.0, ValueError), ("momentum", float("inf"), ValueError),
    ("eps", -1.0, ValueError), ("safety", 0.0, ValueError), ("eps_mode", "max", ValueError),
    ("momentum_style", "adam", ValueError), ("adjust_lr", "sqrt", ValueError), ("dtype", torch.int32, TypeError),
    ("nesterov", 1, TypeError), ("flatten", "no", TypeError), ("extra_scale_factor", 0.0, ValueError),
])
def test_option_edited_after_construction_is_checked_before_any_change(key, value, exc):
    """An option of the second group edited on the live group (as a scheduler or a user
    might) is caught by the check pass: a clear error naming it, and every parameter and
    momentum buffer of both groups bitwise unchanged (none written with NaN)."""
    rng = rng_for("edited")
    ps = layout_params(rng)
    opt = layout_optimizer(ps)
    run_steps(ps, opt, [[torch.randn(p.shape) for p in ps]])  # momentum buffers exist
    for p in ps:
        p.grad = torch.randn(p.shape)
    opt.param_groups[1][key] = value
    snap = _snapshot(ps, opt)
    with pytest.raises(exc, match=rf"^['\"]?{key}:"):
        opt.step()
    _assert_same(ps, opt, snap)


def test_load_state_dict_rejects_a_bad_saved_group_before_any_change():
    rng = rng_for("bad-saved")
    ps = layout_params(rng)
    opt = layout_optimizer(ps)
    run_steps(ps, opt, [[torch.randn(p.shape) for p in ps]])
    sd = copy.deepcopy(opt.state_dict())
    sd["param_groups"][1]["coefficients"] = "nope"
    groups_before = copy.deepcopy([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups])
    snap = _snapshot(ps, opt)
    with pytest.raises(ValueError, match="^coefficients:"):
        opt.load_state_dict(sd)
    _assert_same(ps, opt, snap)
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == groups_before


def test_muon_momentum_rejects_an_unknown_style():
    buf = torch.zeros(3, 4)
    with pytest.raises(ValueError, match=r"^style: expected one of \('ema', 'classic'\)"):
        muon_momentum(torch.ones(3, 4), buf, mu=0.9, nesterov=True, style="bogus")
    assert not buf.any()
