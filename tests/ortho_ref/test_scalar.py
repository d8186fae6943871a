"""Reference AdamW and Lion (ortho_ref.scalar): closed forms, exact invariances, bad input."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import ortho_ref
from ortho_verify.tolerances import U64, adamw_tolerances, lion_tolerances

SHAPES = [(), (7,), (5, 3), (2, 3, 4)]


def _arrays(shape, seed, n=4):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for _ in range(n)]


# no underflow: the rounding model fl(a ∘ b) = (a ∘ b)(1 + δ) needs g² to be a normal number
finite = st.floats(-1e3, 1e3).map(lambda x: 0.0 if abs(x) < 1e-100 else x)
vectors = hnp.arrays(np.float64, st.integers(1, 16), elements=finite)
betas = st.tuples(st.floats(0.5, 0.99), st.floats(0.9, 0.9999))


@settings(deadline=None)
@given(g=vectors, b=betas, eps=st.sampled_from([1e-8, 1e-6, 1e-3]))
def test_adamw_first_step_is_g_over_abs_g_plus_eps(g, b, eps):
    """From zero state, m̂ = g and √v̂ = |g|: the update is g / (|g| + eps), |update| < 1, so a
    first step (weight_decay 0) moves each weight by at most lr."""
    zeros = np.zeros_like(g)
    lr = 1.0  # W' = −update exactly rounded once: compare through the weight tolerance
    out = ortho_ref.adamw_step(zeros, g, zeros, zeros, 0, lr=lr, betas=b, eps=eps, weight_decay=0.0)
    assert out.step == 1
    tol = adamw_tolerances(out, zeros, g, zeros, lr=lr, betas=b, eps=eps, dtype="float64")
    assert np.all(np.abs(out.weight - (-g / (np.abs(g) + eps))) <= tol["weight"])
    assert np.all(np.abs(out.update) <= 1.0 + tol["weight"])
    assert np.array_equal(out.exp_avg, (1.0 - b[0]) * g)
    assert np.array_equal(out.exp_avg_sq, (1.0 - b[1]) * g * g)


@settings(deadline=None)
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(-30, 30), step=st.integers(0, 50), b=betas,
       shape=st.sampled_from(SHAPES))
def test_adamw_scale_invariance_is_exact(seed, k, step, b, shape):
    """With eps = 0, scaling g and m by 2ᵏ and v by 4ᵏ leaves the update bitwise unchanged
    (every operation commutes with an exact power-of-two scaling)."""
    w, g, m, v = _arrays(shape, seed)
    v = v * v
    kw = dict(lr=0.01, betas=b, eps=0.0, weight_decay=0.1)
    a = ortho_ref.adamw_step(w, g, m, v, step, **kw)
    s = 2.0**k
    c = ortho_ref.adamw_step(w, s * g, s * m, s * s * v, step, **kw)
    assert np.array_equal(a.update, c.update) and np.array_equal(a.weight, c.weight)
    assert np.array_equal(c.exp_avg, s * a.exp_avg) and np.array_equal(c.exp_avg_sq, s * s * a.exp_avg_sq)


def test_adamw_formula_and_bias_correction():
    """t = step + 1 in the bias corrections; decoupled decay with lr·weight_decay."""
    w, g, m, v = _arrays((4, 3), 1)
    v = v * v
    lr, (b1, b2), eps, wd, step = 0.003, (0.8, 0.95), 1e-6, 0.2, 4
    out = ortho_ref.adamw_step(w, g, m, v, step, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    m1, v1 = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    x = (m1 / (1 - b1**5)) / (np.sqrt(v1 / (1 - b2**5)) + eps)
    tol = adamw_tolerances(out, w, g, m, lr=lr, betas=(b1, b2), eps=eps, dtype="float64")
    assert out.step == 5
    assert np.all(np.abs(out.weight - (w * (1 - lr * wd) - lr * x)) <= tol["weight"])
    # the tolerance resolves an off-by-one step in the bias correction (the check can fail)
    x_wrong = (m1 / (1 - b1**4)) / (np.sqrt(v1 / (1 - b2**4)) + eps)
    assert np.any(np.abs(out.weight - (w * (1 - lr * wd) - lr * x_wrong)) > tol["weight"])


def test_adamw_eps_zero_zero_coordinate_gives_zero_update():
    w = np.array([1.0, 2.0])
    out = ortho_ref.adamw_step(w, np.array([0.0, 1.0]), np.zeros(2), np.zeros(2), 0, lr=0.1, eps=0.0,
                               weight_decay=0.0)
    assert out.update[0] == 0.0 and out.weight[0] == 1.0
    assert np.all(np.isfinite(out.update))


@settings(deadline=None)
@given(seed=st.integers(0, 2**32 - 1), shape=st.sampled_from(SHAPES), b=st.tuples(st.floats(0, 1), st.floats(0, 1)),
       lr=st.floats(1e-6, 1.0), k=st.integers(-30, 30))
def test_lion_update_is_sign_and_scale_free(seed, shape, b, lr, k):
    """update = sign(c) ∈ {−1, 0, 1}; from W = 0 without decay the weight moves by exactly
    ±lr per coordinate; scaling g and m by 2ᵏ changes neither the update nor the weight."""
    _, g, m = _arrays(shape, seed, 3)
    zero = np.zeros(shape)
    out = ortho_ref.lion_step(zero, g, m, lr=lr, betas=b, weight_decay=0.0)
    assert set(np.unique(out.update)) <= {-1.0, 0.0, 1.0}
    assert np.array_equal(out.update, np.sign(out.interpolated))
    assert np.array_equal(out.weight, -lr * out.update)
    assert np.array_equal(np.abs(out.weight)[out.update != 0], np.full(np.count_nonzero(out.update), lr))
    scaled = ortho_ref.lion_step(zero, 2.0**k * g, 2.0**k * m, lr=lr, betas=b, weight_decay=0.0)
    assert np.array_equal(scaled.update, out.update) and np.array_equal(scaled.weight, out.weight)


def test_lion_formula_with_weight_decay():
    w, g, m = _arrays((6,), 2, 3)
    lr, (b1, b2), wd = 1e-3, (0.95, 0.98), 0.1
    out = ortho_ref.lion_step(w, g, m, lr=lr, betas=(b1, b2), weight_decay=wd)
    c = b1 * m + (1 - b1) * g
    tol = lion_tolerances(out, w, g, m, lr=lr, dtype="float64")
    assert np.all(np.abs(out.interpolated - c) <= tol["sign_margin"])
    assert np.all(np.abs(out.weight - (w * (1 - lr * wd) - lr * np.sign(c))) <= tol["weight"])
    assert np.all(np.abs(out.exp_avg - (b2 * m + (1 - b2) * g)) <= tol["exp_avg"])
    assert np.array_equal(out.update, np.sign(c))  # no |c| near 0 here: exact agreement


def test_inputs_are_not_mutated_and_results_are_new_arrays():
    w, g, m, v = _arrays((3, 2), 3)
    v = v * v
    before = [a.copy() for a in (w, g, m, v)]
    a = ortho_ref.adamw_step(w, g, m, v, 2, lr=0.1)
    b = ortho_ref.lion_step(w, g, m, lr=0.1, weight_decay=0.5)
    for x, y in zip((w, g, m, v), before):
        assert np.array_equal(x, y)
    for out in (a.weight, a.exp_avg, a.exp_avg_sq, b.weight, b.exp_avg):
        assert not any(np.shares_memory(out, x) for x in (w, g, m, v))


def test_float32_inputs_are_computed_in_float64():
    w, g, m, v = (x.astype(np.float32) for x in _arrays((4,), 4))
    out = ortho_ref.adamw_step(w, g, m, v * v, 0, lr=0.1)
    assert all(x.dtype == np.float64 for x in (out.weight, out.exp_avg, out.exp_avg_sq, out.update))
    assert ortho_ref.lion_step(w, g, m, lr=0.1).weight.dtype == np.float64


W, G, M = np.ones(3), np.ones(3), np.zeros(3)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(weight=np.ones(3, dtype=int)), TypeError, "weight"),
    (dict(grad=np.ones(4)), ValueError, "grad: expected shape"),
    (dict(grad=np.array([1.0, np.nan, 0.0])), ValueError, "grad: contains NaN"),
    (dict(exp_avg=np.array([np.inf, 0.0, 0.0])), ValueError, "exp_avg"),
    (dict(exp_avg_sq=-np.ones(3)), ValueError, "exp_avg_sq: expected non-negative"),
    (dict(step=-1), ValueError, "step"),
    (dict(step=1.5), ValueError, "step"),
    (dict(step=True), ValueError, "step"),
    (dict(lr=-0.1), ValueError, "lr"),
    (dict(eps=float("nan")), ValueError, "eps"),
    (dict(weight_decay=-1.0), ValueError, "weight_decay"),
    (dict(betas=(0.9, 1.0)), ValueError, "betas"),
    (dict(betas=(0.9,)), ValueError, "betas"),
    (dict(betas=(1.5, 0.9)), ValueError, r"betas\[0\]"),
])
def test_adamw_bad_input(kwargs, error, match):
    args = dict(weight=W, grad=G, exp_avg=M, exp_avg_sq=M, step=0, lr=0.1)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        ortho_ref.adamw_step(args.pop("weight"), args.pop("grad"), args.pop("exp_avg"), args.pop("exp_avg_sq"),
                             args.pop("step"), **args)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(weight=np.ones(3, dtype=np.complex128)), TypeError, "weight"),
    (dict(grad=np.ones((3, 1))), ValueError, "grad: expected shape"),
    (dict(exp_avg=np.array([0.0, np.nan, 0.0])), ValueError, "exp_avg: contains NaN"),
    (dict(lr=float("inf")), ValueError, "lr"),
    (dict(betas=(0.9, -0.1)), ValueError, r"betas\[1\]"),
    (dict(betas="ab"), ValueError, r"betas\[0\]"),
    (dict(weight_decay=None), ValueError, "weight_decay"),
])
def test_lion_bad_input(kwargs, error, match):
    args = dict(weight=W, grad=G, exp_avg=M, lr=0.1)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        ortho_ref.lion_step(args.pop("weight"), args.pop("grad"), args.pop("exp_avg"), **args)


def test_tolerances_scale_with_the_unit_roundoff():
    """The formulas use u + u64: the momentum tolerance is 4(u + u64)(|m₀| + |g|)."""
    w, g, m, v = _arrays((5,), 5)
    out = ortho_ref.adamw_step(w, g, m, v * v, 3, lr=0.01)
    t64 = adamw_tolerances(out, w, g, m, lr=0.01, betas=(0.9, 0.999), eps=1e-8, dtype="float64")
    t32 = adamw_tolerances(out, w, g, m, lr=0.01, betas=(0.9, 0.999), eps=1e-8, dtype="float32")
    assert np.array_equal(t32["exp_avg"], 4 * (2.0**-24 + U64) * (np.abs(m) + np.abs(g)))
    assert np.array_equal(t64["exp_avg"], 4 * (2 * U64) * (np.abs(m) + np.abs(g)))
    assert np.all(t32["weight"] > t64["weight"])
