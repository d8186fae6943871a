"""What ortho_fast.Muon and ortho_fast.Dion share: state_dict round trips (bitwise the
uninterrupted run) and the error contract (non-matrix parameters, non-finite gradients, a wrong
momentum or Q shape and bad hyperparameters raise naming the argument, checked before any state
changes). Muon's parity with torch.optim.Muon: test_muon_parity.py; Dion against the oracle:
test_dion_invariants.py.
"""

from __future__ import annotations

import copy

import pytest
import torch

import ortho_fast
from ortho_fast import Dion, Muon
from tests.ortho_fast.helpers import SHAPES, gradient_matrix, rng_for
from tests.round_trip import assert_bitwise_same, round_trip


def _state_clone(opt) -> dict:
    return {id(p): {k: v.clone() for k, v in st_.items()} for p, st_ in opt.state.items()}


def _assert_state_equal(opt, saved: dict) -> None:
    assert {id(p) for p in opt.state} == set(saved)
    for p, st_ in opt.state.items():
        assert set(st_) == set(saved[id(p)])
        for k, v in st_.items():
            assert torch.equal(v, saved[id(p)][k]), k


def _assert_unchanged(ps, params_before, opt, state_before) -> None:
    """Every parameter and every state tensor is bitwise what it was before the failed step."""
    for p, before in zip(ps, params_before):
        assert torch.equal(p.detach(), before)
    _assert_state_equal(opt, state_before)


# =======================================================================================
# state_dict round trip
# =======================================================================================


def _round_trip(make_opt, shapes, dtype, grads):
    w0 = [torch.tensor(0.02 * rng_for("rt", s).standard_normal(s), dtype=dtype) for s in shapes]
    assert_bitwise_same(*round_trip(make_opt, w0, grads, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_muon_state_dict_round_trip(dtype):
    rng = rng_for("rt-muon")
    grads = [[gradient_matrix(s, rng) for s in SHAPES] for _ in range(4)]
    _round_trip(lambda ps: Muon(ps, lr=0.02, momentum_style="classic", nesterov=False), SHAPES, dtype, grads)
    _round_trip(lambda ps: Muon(ps, lr=0.02), SHAPES, dtype, grads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dion_state_dict_round_trip(dtype):
    rng = rng_for("rt-dion")
    grads = [[gradient_matrix(s, rng) for s in SHAPES] for _ in range(4)]
    _round_trip(lambda ps: Dion(ps, rank_fraction=0.5, power_iters=2, seed=11), SHAPES, dtype, grads)


# =======================================================================================
# Bad input
# =======================================================================================

OPTIMIZERS = {
    "Muon": lambda ps: Muon(ps, lr=0.02),
    "Dion": lambda ps: Dion(ps, rank_fraction=0.5),
}


# Muon flattens 3-D non-expert weights (conv1d) to (shape[0], prod(rest)): tests/ortho_fast/test_muon_layout.py.
@pytest.mark.parametrize("name, bad_shape",
                         [(n, s) for n in sorted(OPTIMIZERS) for s in ((5,), ())] + [("Dion", (2, 3, 4))])
def test_non_matrix_parameter_rejected(name, bad_shape):
    with pytest.raises(ValueError, match=r"^params:"):
        OPTIMIZERS[name]([torch.nn.Parameter(torch.ones(4, 3)), torch.nn.Parameter(torch.ones(bad_shape))])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("with_state", [False, True])
def test_nonfinite_grad_changes_nothing(name, bad, with_state):
    rng = rng_for("nonfinite", name)
    ps = [torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(s))) for s in ((12, 8), (8, 12))]
    opt = OPTIMIZERS[name](ps)
    if with_state:
        for p in ps:
            p.grad = torch.tensor(gradient_matrix(tuple(p.shape), rng))
        opt.step()
    for bad_index in (0, 1):  # the bad gradient on the first, then on the second parameter
        for p in ps:
            p.grad = torch.tensor(gradient_matrix(tuple(p.shape), rng))
        ps[bad_index].grad[1, 2] = bad
        params_before = [p.detach().clone() for p in ps]
        state_before = _state_clone(opt)
        with pytest.raises(ValueError, match=r"^grad"):
            opt.step()
        _assert_unchanged(ps, params_before, opt, state_before)


def test_dion_wrong_q_shape_changes_nothing():
    rng = rng_for("wrong-q")
    shapes = [(12, 8), (8, 12)]
    ps = [torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(s))) for s in shapes]
    opt = Dion(ps, rank_fraction=0.5)
    for p in ps:
        p.grad = torch.tensor(gradient_matrix(tuple(p.shape), rng))
    opt.step()
    for bad_q_shape in ((8, 5), (12, 4), (4, 8)):  # right shape is (8, 4) for both
        sd = copy.deepcopy(opt.state_dict())
        sd["state"][1]["Q"] = torch.ones(bad_q_shape, dtype=torch.float64)
        with pytest.raises(ValueError, match="^Q:"):  # a checkpoint with it is rejected at load
            opt.load_state_dict(sd)
        opt.state[ps[1]]["Q"] = torch.ones(bad_q_shape, dtype=torch.float64)  # planted: the step rejects it too
        for p in ps:
            p.grad = torch.tensor(gradient_matrix(tuple(p.shape), rng))
        params_before = [p.detach().clone() for p in ps]
        state_before = _state_clone(opt)
        with pytest.raises(ValueError, match=r"^Q:"):
            opt.step()
        _assert_unchanged(ps, params_before, opt, state_before)  # also the first parameter, whose Q is fine


def test_muon_wrong_momentum_shape_changes_nothing():
    rng = rng_for("wrong-buf")
    ps = [torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(s))) for s in ((12, 8), (8, 12))]
    opt = Muon(ps, lr=0.02)
    for p in ps:
        p.grad = torch.tensor(gradient_matrix(tuple(p.shape), rng))
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    sd["state"][1]["momentum_buffer"] = torch.zeros(4, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="^momentum_buffer:"):  # a checkpoint with it is rejected at load
        opt.load_state_dict(sd)
    opt.state[ps[1]]["momentum_buffer"] = torch.zeros(4, 4, dtype=torch.float64)  # planted: the step rejects it too
    params_before = [p.detach().clone() for p in ps]
    state_before = _state_clone(opt)
    with pytest.raises(ValueError, match=r"momentum_buffer"):
        opt.step()
    _assert_unchanged(ps, params_before, opt, state_before)


P = [torch.nn.Parameter(torch.ones(4, 3))]


@pytest.mark.parametrize(
    "make, arg",
    [
        (lambda: Muon(P, lr=-1e-3), "lr"),
        (lambda: Muon(P, lr=float("nan")), "lr"),
        (lambda: Muon(P, momentum=1.5), "momentum"),
        (lambda: Muon(P, momentum=-0.1), "momentum"),
        (lambda: Muon(P, weight_decay=-0.1), "weight_decay"),
        (lambda: Muon(P, momentum_style="adam"), "momentum_style"),
        (lambda: Muon(P, adjust_lr="sqrt"), "adjust_lr"),
        (lambda: Muon(P, eps_mode="foo"), "eps_mode"),
        (lambda: Muon(P, ns_steps=0), "ns_steps"),
        (lambda: Muon(P, safety=0.0), "safety"),
        (lambda: Muon(P, eps=-1.0), "eps"),
        (lambda: Muon(P, coefficients=[[1.0, 2.0]]), "coefficients"),
        (lambda: Muon(P, coefficients="no_such_schedule"), "coefficients"),
        (lambda: Muon(P, lr="0.1"), "lr"),
        (lambda: Dion(P, lr=-0.01), "lr"),
        (lambda: Dion(P, mu=1.5), "mu"),
        (lambda: Dion(P, mu=-0.5), "mu"),
        (lambda: Dion(P, weight_decay=-1.0), "weight_decay"),
        (lambda: Dion(P, rank_fraction=0.0), "rank_fraction"),
        (lambda: Dion(P, rank_fraction=1.5), "rank_fraction"),
        (lambda: Dion(P, rank_multiple_of=0), "rank_multiple_of"),
        (lambda: Dion(P, power_iters=0), "power_iters"),
        (lambda: Dion(P, epsilon=-1e-8), "epsilon"),
        (lambda: Dion(P, qr_method="gram_schmidt"), "qr_method"),
    ],
)
def test_bad_hyperparameters_raise_value_error(make, arg):
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        make()


def test_unknown_schedule_error_is_a_key_error_and_a_value_error_listing_the_names():
    """UnknownScheduleError: a ValueError naming the argument (house rule) that is still the
    a bare KeyError; its message lists every registry name, unquoted."""
    with pytest.raises(ortho_fast.UnknownScheduleError) as info:
        Muon(P, coefficients="no_such_schedule")
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert str(info.value).startswith("coefficients: unknown schedule 'no_such_schedule'")
    assert all(repr(name) in str(info.value) for name in ortho_fast.COEFFICIENTS)
