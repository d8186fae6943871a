"""ortho_fast.Dion's error contract: bad hyperparameters and non-matrix parameters raise naming
the argument, a rejected group leaves the optimizer unchanged, a bad step or a bad saved group
raises before anything changes, ``load_state_dict`` copies every tensor; the public helpers
(dion_rank, initial_q, sketches, orthonormalize) reject bad input; named parameters.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

import ortho_ref
from ortho_fast import Dion
from ortho_fast.functional.dion import dion_rank, dion_right_factor, dion_update, initial_q
from ortho_fast.functional.qr import gaussian_sketch, orthonormalize, sketch_generator
from tests.ortho_fast.helpers import DION_RANDOMIZED, SHAPES, rng_for, spectral_matrix

# =======================================================================================
# Bad input: a clear error, nothing changed
# =======================================================================================


P = [torch.nn.Parameter(torch.ones(4, 3))]


@pytest.mark.parametrize("kwargs, exc, key", [
    (dict(rank_fraction=0.0), ValueError, "rank_fraction"),
    (dict(rank_fraction=1.0001), ValueError, "rank_fraction"),
    (dict(oversample=0.9), ValueError, "oversample"),
    (dict(right_factor="polar"), ValueError, "right_factor"),
    (dict(qr_method="cqr"), ValueError, "qr_method"),
    (dict(momentum_dtype=torch.int32), TypeError, "momentum_dtype"),
    (dict(q_dtype="float32"), TypeError, "q_dtype"),
    (dict(flatten=1), TypeError, "flatten"),
    (dict(error_feedback=None), TypeError, "error_feedback"),
    (dict(power_iters=True), ValueError, "power_iters"),
])
def test_bad_hyperparameters(kwargs, exc, key):
    with pytest.raises(exc, match=rf"^{key}:"):
        Dion(P, **kwargs)


@pytest.mark.parametrize("shape, flatten", [((5,), False), ((5,), True), ((2, 3, 4), False), ((0, 3), False)])
def test_non_matrix_parameters_rejected(shape, flatten):
    with pytest.raises(ValueError, match="^params:.*" + ("flatten=True" if len(shape) > 2 else "")):
        Dion([torch.nn.Parameter(torch.ones(shape))], flatten=flatten)


def test_bad_param_group_leaves_the_optimizer_unchanged():
    opt = Dion(P)
    with pytest.raises(ValueError, match="^right_factor:"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(5, 5))], "right_factor": "svd"})
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["params"] == P


def _snapshot(ps, opt):
    return [p.detach().clone() for p in ps], copy.deepcopy({id(p): dict(s) for p, s in opt.state.items()})


def _assert_snapshot(ps, opt, snap):
    params, state = snap
    assert all(torch.equal(p.detach(), b) for p, b in zip(ps, params))
    assert {id(p) for p in opt.state} == set(state)
    for p, s in opt.state.items():
        assert set(s) == set(state[id(p)])
        assert all(torch.equal(v, state[id(p)][k]) if torch.is_tensor(v) else v == state[id(p)][k]
                   for k, v in s.items())


def _regrad(p, grad):
    p.grad_dtype = None  # torch 2.13 refuses a gradient of another dtype unless told to accept any
    p.grad = grad


@pytest.mark.parametrize("corrupt, match", [
    (lambda ps, opt: ps[1].grad.__setitem__((0, 0), float("nan")), "^grad"),
    (lambda ps, opt: ps[1].grad.__setitem__((1, 2), -float("inf")), "^grad"),
    (lambda ps, opt: _regrad(ps[1], ps[1].grad.float()), "^grad: expected dtype torch.float64"),
    (lambda ps, opt: _regrad(ps[1], ps[1].grad.to(torch.complex128)), "^grad: Dion expects dense real"),
    (lambda ps, opt: opt.state[ps[1]].__setitem__("step", 3), "^step:"),
    (lambda ps, opt: opt.param_groups[1].__setitem__("lr", -1.0), "^lr:"),
    (lambda ps, opt: opt.param_groups[1].__setitem__("lr", float("nan")), "^lr:"),
    (lambda ps, opt: opt.param_groups[1].__setitem__("epsilon", "1e-8"), "^epsilon:"),
    (lambda ps, opt: opt.state[ps[1]].__setitem__("Q", torch.ones(8, 3, dtype=torch.float64)), "^Q:"),
    (lambda ps, opt: opt.state[ps[0]].__setitem__("momentum", torch.ones(2, 2, dtype=torch.float64)), "^momentum:"),
])
def test_bad_step_changes_nothing(corrupt, match):
    """Two groups, randomized QR: a bad gradient, hyperparameter (set by a scheduler) or state in
    the second group raises before the first group (or anything) changes."""
    rng = rng_for("bad")
    ps = [torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(s))) for s in ((12, 8), (8, 12))]
    opt = Dion([{"params": [ps[0]]}, {"params": [ps[1]]}], seed=1, **DION_RANDOMIZED)
    for p in ps:
        p.grad = torch.tensor(spectral_matrix(tuple(p.shape), rng))
    opt.step()
    for p in ps:
        p.grad = torch.tensor(spectral_matrix(tuple(p.shape), rng))
    corrupt(ps, opt)
    snap = _snapshot(ps, opt)
    with pytest.raises((ValueError, TypeError), match=match):
        opt.step()
    _assert_snapshot(ps, opt, snap)


def test_named_parameters_are_accepted():
    """Dion(model.named_parameters()) keeps torch's param_names and steps exactly as
    Dion(model.parameters()) (same order, same seed and indices)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8, bias=False), torch.nn.Linear(8, 4, bias=False)).double()
    twin = copy.deepcopy(model)
    named, plain = Dion(model.named_parameters(), seed=2,
                        **DION_RANDOMIZED), Dion(twin.parameters(), seed=2, **DION_RANDOMIZED)
    assert named.param_groups[0]["param_names"] == ["0.weight", "1.weight"]
    rng = rng_for("named")
    for _ in range(2):
        for p, q in zip(model.parameters(), twin.parameters()):
            p.grad = q.grad = torch.tensor(rng.standard_normal(tuple(p.shape)))
        named.step()
        plain.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))
    with pytest.raises(ValueError, match="^rank_fraction:"):
        Dion(torch.nn.Linear(3, 2, bias=False).named_parameters(), rank_fraction=2.0)


@pytest.mark.parametrize("seed", [True, 1.5, "3", None])
def test_seed_must_be_an_int(seed):
    with pytest.raises(TypeError, match="^seed:"):
        Dion(P, seed=seed)


def test_load_state_dict_copies_every_tensor():
    """o2.load_state_dict(o1.state_dict()) then o2.step(): o1's step counter (it seeds the
    randomized QR sketches), momentum and Q, and the state dict, are unchanged."""
    rng = rng_for("no-alias")
    ps = [torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(s))) for s in SHAPES]
    o1 = Dion(ps, seed=1, **DION_RANDOMIZED)
    for p in ps:
        p.grad = torch.tensor(spectral_matrix(tuple(p.shape), rng))
    o1.step()
    sd = o1.state_dict()
    before = copy.deepcopy(sd["state"])
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    o2 = Dion(qs, seed=1, **DION_RANDOMIZED)
    o2.load_state_dict(sd)
    for q in qs:
        q.grad = torch.tensor(spectral_matrix(tuple(q.shape), rng))
    o2.step()
    for i, (p, q) in enumerate(zip(ps, qs)):
        assert int(o2.state[q]["step"]) == 2
        for key in ("momentum", "Q", "step"):
            assert torch.equal(o1.state[p][key], before[i][key]) and torch.equal(sd["state"][i][key], before[i][key])


@pytest.mark.parametrize("key, value, exc", [("rank_fraction", 2.0, ValueError), ("qr_method", "svd", ValueError),
                                             ("momentum_dtype", torch.int8, TypeError)])
def test_load_state_dict_rejects_a_bad_saved_group_before_any_change(key, value, exc):
    rng = rng_for("bad-saved")
    ps = [torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(s))) for s in SHAPES]
    opt = Dion([{"params": ps[:1]}, {"params": ps[1:]}], seed=1, **DION_RANDOMIZED)
    for p in ps:
        p.grad = torch.tensor(spectral_matrix(tuple(p.shape), rng))
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    sd["param_groups"][1][key] = value
    for st_ in sd["state"].values():
        st_["step"] += 5
    groups_before = copy.deepcopy([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups])
    snap = _snapshot(ps, opt)
    with pytest.raises(exc, match=f"^{key}:"):
        opt.load_state_dict(sd)
    _assert_snapshot(ps, opt, snap)
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == groups_before


@pytest.mark.parametrize("call, exc, arg", [
    (lambda: dion_rank(8, 4, 0.0), ValueError, "rank_fraction"),
    (lambda: dion_rank(8, 4, -1.0), ValueError, "rank_fraction"),
    (lambda: dion_rank(8, 4, 2.0), ValueError, "rank_fraction"),
    (lambda: dion_rank(8, 4, float("nan")), ValueError, "rank_fraction"),
    (lambda: dion_rank(8, 4, 0.5, 0), ValueError, "rank_multiple_of"),
    (lambda: dion_rank(8, 4, 0.5, 2.0), ValueError, "rank_multiple_of"),
    (lambda: dion_rank(0, 4), ValueError, "m"),
    (lambda: dion_right_factor(torch.ones(4, 2), "bogus"), ValueError, "right_factor"),
    (lambda: initial_q((4, 0), 0, 0, torch.float32, "cpu"), ValueError, "shape"),
    (lambda: initial_q((4, 2, 1), 0, 0, torch.float32, "cpu"), ValueError, "shape"),
    (lambda: initial_q((4, 2), 0, 0, torch.int64, "cpu"), TypeError, "dtype"),
    (lambda: sketch_generator(0, 0, 0, "cpu"), ValueError, "step"),
    (lambda: gaussian_sketch(torch.Generator(), 0, 8, torch.float32, "cpu"), ValueError, "k"),
    (lambda: gaussian_sketch(None, 2, 8, torch.float32, "cpu"), TypeError, "generator"),
])
def test_public_helpers_reject_bad_input_naming_the_argument(call, exc, arg):
    with pytest.raises(exc, match=f"^{arg}:"):
        call()


def test_rank_fraction_and_multiple_match_the_oracle():
    for m, n, frac, mult in [(64, 32, 1 / 16, 1), (64, 32, 1 / 16, 8), (4096, 1024, 1 / 16, 128), (5, 3, 0.01, 1)]:
        assert dion_rank(m, n, frac, mult) == ortho_ref.dion_rank(m, n, frac, mult)
    p = torch.nn.Parameter(torch.ones(64, 48))
    opt = Dion([p], rank_fraction=1 / 16, rank_multiple_of=4)
    p.grad = torch.ones(64, 48)
    opt.step()
    assert opt.state[p]["Q"].shape == (48, 4) and math.isclose(dion_rank(64, 48, 1 / 16, 4), 4)


def test_orthonormalize_bad_input():
    with pytest.raises(ValueError, match="^y:"):
        orthonormalize(torch.ones(2, 3))
    with pytest.raises(ValueError, match="^method:"):
        orthonormalize(torch.ones(3, 2), "svd")
    with pytest.raises(TypeError, match="^generator:"):
        dion_update(torch.ones(3, 2), torch.ones(3, 2), torch.zeros(3, 2), torch.ones(2, 1), lr=0.1, mu=0.9,
                    weight_decay=0.0, epsilon=1e-8, qr_method="randomized_cholesky_qr")
