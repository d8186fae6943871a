"""Reference Muon and Dion steps: the formulas of DESIGN.md, invariants, bad input."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ortho_ref
from tests.strategies import spectral_matrices
from verify.tolerances import U64, error_feedback_tolerance, momentum_tolerance, orthonormality_tolerance

RNG = np.random.default_rng(0)


def _arrays(m, n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, n)), rng.standard_normal((m, n)), rng.standard_normal((m, n))


@pytest.mark.parametrize("mode, m, n, expected", [
    ("original", 8, 2, 2.0), ("original", 2, 8, 1.0),
    ("match_rms_adamw", 4, 16, 0.2 * 4.0), ("spectral_norm", 2, 8, 0.5), (None, 3, 5, 1.0),
])
def test_lr_scale(mode, m, n, expected):
    assert ortho_ref.lr_scale(mode, m, n) == pytest.approx(expected, rel=4 * U64)


@pytest.mark.parametrize("style", ["ema", "classic"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_momentum_formulas(style, nesterov):
    w, g, m0 = _arrays(6, 4)
    mu, lr, wd = 0.9, 0.1, 0.05
    out = ortho_ref.muon_step(w, g, m0, lr=lr, mu=mu, nesterov=nesterov, momentum_style=style,
                              weight_decay=wd, adjust_lr="original")
    if style == "ema":
        m_new = mu * m0 + (1 - mu) * g
        u = (1 - mu) * g + mu * m_new if nesterov else m_new
    else:
        m_new = mu * m0 + g
        u = g + mu * m_new if nesterov else m_new
    tol = momentum_tolerance(np.linalg.norm(g), np.linalg.norm(m0), "float64")
    assert np.linalg.norm(out.momentum - m_new) <= tol
    assert np.linalg.norm(out.ns_input - u) <= 2 * tol
    assert np.array_equal(out.update, ortho_ref.ns_map(out.ns_input, ortho_ref.schedule("jordan")))
    step = lr * math.sqrt(6 / 4)  # "original": √max(1, m/n)
    expected_w = w * (1 - lr * wd) - step * out.update
    # two elementwise roundings per entry on each side
    assert np.linalg.norm(out.weight - expected_w) <= 4 * U64 * (np.linalg.norm(w) + step * np.linalg.norm(out.update))


def test_muon_polar_orthogonalizer_gives_orthonormal_update():
    w, g, m0 = _arrays(9, 5)
    out = ortho_ref.muon_step(w, g, m0, lr=0.1, orthogonalizer="polar")
    assert np.linalg.norm(out.update.T @ out.update - np.eye(5)) <= orthonormality_tolerance(9, 5, "float64")


def _projector(p):
    return np.eye(p.shape[0]) - p @ p.T


@settings(max_examples=40, deadline=None)
@given(spectral_matrices(max_dim=20, min_dim=2), st.floats(0.0, 0.99), st.floats(0.1, 1.0), st.integers(1, 3))
def test_dion_error_feedback_invariants(case, mu, rank_fraction, power_iters):
    g, _ = case
    m, n = g.shape
    r = ortho_ref.dion_rank(m, n, rank_fraction)
    rng = np.random.default_rng(m * 100 + n)
    m0 = 0.5 * rng.standard_normal((m, n)) * np.linalg.norm(g) / math.sqrt(g.size)
    q0 = rng.standard_normal(ortho_ref.q_shape(m, n, r))
    out = ortho_ref.dion_step(np.zeros((m, n)), g, m0, q0, lr=0.1, mu=mu, power_iters=power_iters)
    p, r_mat, b = out.P, out.R, out.B
    m_new = out.momentum.T if m < n else out.momentum
    assert out.Q.shape == q0.shape and p.shape == (b.shape[0], r)
    tol = error_feedback_tolerance(np.linalg.norm(b), np.linalg.norm(p), np.linalg.norm(r_mat), mu, b.shape[0], r, "float64")
    proj = _projector(p)
    assert np.linalg.norm(proj @ m_new - proj @ b) <= 2 * tol  # nothing outside span(P) is lost
    assert np.linalg.norm(p.T @ m_new - mu * p.T @ b) <= 2 * tol  # inside span(P) it decays by mu
    assert np.linalg.norm(p.T @ p - np.eye(r)) <= orthonormality_tolerance(b.shape[0], r, "float64")
    assert np.linalg.norm(r_mat - b.T @ p) <= tol
    col = np.linalg.norm(out.Q, axis=0)
    assert np.all(np.abs(col - 1) <= orthonormality_tolerance(b.shape[1], 1, "float64") + 1e-8 / np.linalg.norm(r_mat, axis=0))


def test_dion_orientation_depends_on_global_shape_only():
    # For m < n Dion works on the transpose: the step on (W, G, M) equals the transpose of
    # the step on (Wᵀ, Gᵀ, Mᵀ) with the same Q, up to the lr scale √(m/n) vs √(n/m).
    w, g, m0 = _arrays(5, 9, seed=3)
    q0 = np.random.default_rng(4).standard_normal((5, 3))
    wide = ortho_ref.dion_step(w, g, m0, q0, lr=0.1)
    tall = ortho_ref.dion_step(w.T, g.T, m0.T, q0, lr=0.1 * math.sqrt(5 / 9) / math.sqrt(9 / 5))
    tol = error_feedback_tolerance(np.linalg.norm(wide.B), 1.0, np.linalg.norm(wide.R), 0.95, 9, 3, "float64")
    assert np.linalg.norm(wide.weight - tall.weight.T) <= tol
    assert np.linalg.norm(wide.momentum - tall.momentum.T) <= tol
    assert np.array_equal(wide.P, tall.P)


def test_dion_sum_of_gradients_bookkeeping():
    # Σ G_t = M_T + (1 − μ) Σ P_t R_tᵀ with M_0 = 0 (DESIGN.md, error feedback).
    m, n, r, mu = 12, 7, 3, 0.9
    rng = np.random.default_rng(5)
    w, mom, q = rng.standard_normal((m, n)), np.zeros((m, n)), rng.standard_normal((n, r))
    total_g, total_pr = np.zeros((m, n)), np.zeros((m, n))
    for _ in range(5):
        g = rng.standard_normal((m, n))
        out = ortho_ref.dion_step(w, g, mom, q, lr=0.01, mu=mu)
        w, mom, q = out.weight, out.momentum, out.Q
        total_g += g
        total_pr += out.P @ out.R.T
    tol = 5 * error_feedback_tolerance(np.linalg.norm(total_g), 1.0, np.linalg.norm(total_pr), mu, m, r, "float64")
    assert np.linalg.norm(total_g - (mom + (1 - mu) * total_pr)) <= tol


def test_dion_without_error_feedback_discards_the_residual():
    w, g, m0 = _arrays(10, 6, seed=6)
    q0 = np.random.default_rng(7).standard_normal((6, 2))
    out = ortho_ref.dion_step(w, g, m0, q0, lr=0.1, mu=0.9, error_feedback=False)
    tol = error_feedback_tolerance(np.linalg.norm(out.B), 1.0, np.linalg.norm(out.R), 0.9, 10, 2, "float64")
    assert np.linalg.norm(_projector(out.P) @ out.momentum) <= tol
    assert np.linalg.norm(_projector(out.P) @ out.B) > 1.0  # so the check above can fail


def test_dion_zero_b_keeps_q_and_only_decays():
    w = RNG.standard_normal((6, 4))
    q0 = RNG.standard_normal((4, 2))
    out = ortho_ref.dion_step(w, np.zeros((6, 4)), np.zeros((6, 4)), q0, lr=0.1, weight_decay=0.5)
    assert np.array_equal(out.Q, q0) and not np.any(out.P) and not np.any(out.momentum)
    assert np.array_equal(out.weight, w * (1 - 0.1 * 0.5))


@pytest.mark.parametrize("m, n, frac, mult, expected", [
    (64, 32, 1.0, 1, 32), (64, 32, 0.25, 1, 8), (64, 32, 0.1, 8, 8), (64, 32, 0.3, 8, 16), (3, 2, 0.01, 1, 1),
    (10, 100, 1.0, 16, 10),
])
def test_dion_rank(m, n, frac, mult, expected):
    assert ortho_ref.dion_rank(m, n, frac, mult) == expected


@pytest.mark.parametrize("kwargs, match", [
    (dict(grad=np.ones((3, 2))), "grad"),
    (dict(momentum=np.ones((2, 2))), "momentum"),
    (dict(Q=np.ones((4, 1))), "Q"),
    (dict(Q=np.ones((3, 4))), "Q"),
    (dict(grad=np.full((4, 3), np.nan)), "grad"),
    (dict(lr=-1.0), "lr"),
    (dict(mu=1.5), "mu"),
    (dict(power_iters=0), "power_iters"),
    (dict(grad=np.ones((4, 3), dtype=np.int32)), "grad"),
])
def test_dion_bad_input(kwargs, match):
    args = dict(weight=np.ones((4, 3)), grad=np.ones((4, 3)), momentum=np.zeros((4, 3)), Q=np.ones((3, 2)), lr=0.1)
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        ortho_ref.dion_step(args.pop("weight"), args.pop("grad"), args.pop("momentum"), args.pop("Q"), **args)


@pytest.mark.parametrize("kwargs, match", [
    (dict(weight=np.ones(3)), "weight"), (dict(grad=np.ones((2, 2))), "grad"), (dict(momentum_style="adam"), "momentum_style"),
    (dict(adjust_lr="bogus"), "adjust_lr"), (dict(orthogonalizer="svd"), "orthogonalizer"), (dict(weight_decay=-0.1), "weight_decay"),
    (dict(grad=np.array([[np.inf, 0.0, 0.0], [0.0, 0.0, 0.0]])), "grad"),
])
def test_muon_bad_input(kwargs, match):
    args = dict(weight=np.ones((2, 3)), grad=np.ones((2, 3)), momentum=np.zeros((2, 3)), lr=0.1)
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        ortho_ref.muon_step(args.pop("weight"), args.pop("grad"), args.pop("momentum"), **args)
