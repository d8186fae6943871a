"""Bad input the product meets from checkpoints, groups and tables: a meta-device tensor in a loaded
state dict (every optimizer), another algorithm's option in a Dion2 group, a torch.optim checkpoint
given to ``HybridOptimizer``, a divergent coefficient table, an input of ``newton_schulz`` that
requires grad. Each raises ValueError naming the argument and changes nothing; the valid inputs
next to them (Keller Jordan's overshoot, microsoft/dion's ``betas``, ``torch.no_grad()``) pass.
"""

from __future__ import annotations

import contextlib
import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_fast
import ortho_ref
from ortho_fast import Dion2, Muon
from ortho_fast.coefficients import MAP_BOUND, check_bounded_table, resolve_coefficients
from tests.ortho_fast.test_bad_input import OPTIMIZERS, _everything, _params, _raises_and_keeps, _stepped


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_meta_device_state_names_the_key_and_changes_nothing(name):
    params, opt = _stepped(name)
    sd = copy.deepcopy(opt.state_dict())
    entry = next(iter(sd["state"].values()))
    key = sorted(k for k, v in entry.items() if isinstance(v, torch.Tensor))[-1]
    entry[key] = torch.empty(entry[key].shape, dtype=entry[key].dtype, device="meta")
    _raises_and_keeps(opt, params, lambda: opt.load_state_dict(sd), ValueError, f"^{key}: a meta-device tensor")


@pytest.mark.parametrize("key, value", [("rank_fraction", 0.5), ("momentum", 0.9), ("qr_method", "rcqr"),
                                        ("nesterov", True)])
def test_dion2_group_with_another_algorithms_option(key, value):
    params = _params()
    opt = Dion2(params[:2])
    _raises_and_keeps(opt, params[:2], lambda: opt.add_param_group({"params": [params[2]], key: value}), ValueError,
                      f"^{key}: an option of")


def test_dion2_group_keeps_microsoft_dions_betas():
    params = _params()
    opt = Dion2(params[:2])
    opt.add_param_group({"params": [params[2]], "betas": (0.9, 0.95), "algorithm": "dion2"})
    assert len(opt.param_groups) == 2


@pytest.mark.parametrize("make, names", [
    (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), r"'dampening'.*torch\.optim\.SGD"),
    (lambda ps: torch.optim.AdamW(ps, lr=0.1), r"'amsgrad'.*torch\.optim\.Adam / torch\.optim\.AdamW"),
    (lambda ps: Muon(ps), r"'momentum_style'.*mostly muon's"),
])
def test_hybrid_names_what_a_foreign_checkpoint_holds(make, names):
    """A checkpoint with another number of groups: the message lists its options and their optimizer."""
    params, opt = _stepped("Hybrid")
    sd = copy.deepcopy(make(params).state_dict())
    _raises_and_keeps(opt, params, lambda: opt.load_state_dict(sd), ValueError, f"^param_groups: .*{names}")


# -------------------------------------------------------------------------- tables


DIVERGENT = [(((3.4445, 4.775, 2.0315),) * 5, 2), (((3.0, 3.0, 3.0),) * 5, 2),
             (((1.5, -0.5, 0.0), (40.0, 0.0, 0.0)), 2), (((20.0, 0.0, 0.0),), 1)]


@pytest.mark.parametrize("table, step", DIVERGENT)
def test_divergent_table_names_the_table_and_the_step(table, step):
    g = torch.randn(8, 6, dtype=torch.float32)
    pattern = f"^coefficients: a divergent table: after step {step} of"
    with pytest.raises(ValueError, match=pattern):
        ortho_fast.newton_schulz(g, coefficients=table, dtype=torch.float32)
    with pytest.raises(ValueError, match=pattern):
        Muon(_params(), coefficients=table)
    params = _params()
    opt = Muon(params)
    opt.param_groups[0]["coefficients"] = table
    for p in params:
        p.grad = torch.ones_like(p)
    before = _everything(opt, params)
    with pytest.raises(ValueError, match=pattern):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before["params"], _everything(opt, params)["params"]))


def test_the_same_table_without_the_check_gives_inf_or_nan():
    """What the check prevents: the first divergent table run (bound disabled) on a finite input."""
    table = [(3.4445, 4.775, 2.0315)] * 5
    out = ortho_fast.functional.newton_schulz.newton_schulz_resolved(
        torch.randn(8, 6), table, safety=1.0, eps=1e-7, eps_mode="add", compute_dtype=torch.float32,
        precision=None, out_dtype=torch.float32, gram=False)
    assert not bool(torch.isfinite(out).all())


@pytest.mark.parametrize("name", sorted(ortho_ref.SCHEDULES))
def test_every_registered_schedule_and_keller_jordans_overshoot_pass(name):
    table = [tuple(r) for r in ortho_ref.schedule(name, 12)]
    assert check_bounded_table(table) == table
    assert len(resolve_coefficients([(3.4445, -4.775, 2.0315)], 12)) == 12  # sup 1.202 at every step


@settings(deadline=None, max_examples=60)
@given(rows=st.lists(st.tuples(st.floats(-30, 30), st.floats(-60, 60), st.floats(-60, 60)), min_size=1, max_size=4))
def test_product_and_oracle_decide_alike(rows):
    """ortho_fast's bound (its own closed form) and the oracle's (``ns_map_sups``) accept and reject
    the same tables, away from a tie with the bound (within 1e-9 relative: float64 rounding of two
    closed forms); where accepted, every sup is at least the map's maximum on a grid of [0, 1] and
    at most that plus L·h/2 (L = ``ns_lipschitz`` of the steps so far, h the grid spacing)."""
    sups = ortho_ref.ns_map_sups(rows, MAP_BOUND)
    if any(abs(v - MAP_BOUND) <= 1e-9 * MAP_BOUND for v in sups):
        return
    rejected = not sups[-1] <= MAP_BOUND
    try:
        check_bounded_table([tuple(r) for r in rows])
        fast_rejected = False
    except ValueError:
        fast_rejected = True
    assert fast_rejected == rejected
    with pytest.raises(ValueError, match="coefficients: a divergent") if rejected else contextlib.nullcontext():
        ortho_ref.ns_map(np.eye(3), rows)
    if rejected:
        return
    x = np.linspace(0.0, 1.0, 4001)
    for t, sup in enumerate(sups, 1):
        grid = float(np.max(np.abs(ortho_ref.ns_polynomial(x, rows[:t]))))
        slack = ortho_ref.ns_lipschitz(rows[:t]) * (x[1] - x[0]) / 2
        assert grid * (1 - 1e-12) <= sup <= grid + slack + 1e-12 * sup


def test_newton_schulz_input_that_requires_grad():
    g = torch.randn(6, 4, requires_grad=True)
    with pytest.raises(ValueError, match="^g: requires grad"):
        ortho_fast.newton_schulz(g)
    with torch.no_grad():
        out = ortho_fast.newton_schulz(g)
    assert torch.equal(out, ortho_fast.newton_schulz(g.detach()))
