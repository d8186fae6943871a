"""Reference Dion variants: QR methods, right factors, power iterations, the ideal (truncated
SVD) step and the compressed data-parallel sync, against exact identities and the tolerances of
ortho_verify.tolerances."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
from hypothesis import given, settings, strategies as st

import ortho_ref
from ortho_ref.dion import CQR2_GRAM_DEVIATION
from ortho_verify import tolerances as tol
from ortho_verify.inputs.spectra import matrix_with_spectrum
from tests.strategies import spectral_matrices

METHODS = ortho_ref.QR_METHODS


def _tall(rows, r, cond, seed):
    return matrix_with_spectrum(np.geomspace(1.0, 1.0 / cond, r), rows, r, np.random.default_rng(seed))


def _sketch_kappa(y, seed, oversample=1.25):
    """κ₂(Y R_s⁻¹) of the sketch ``orthonormalize`` draws from default_rng(seed) (None: no sketch)."""
    rows, r = y.shape
    k = ortho_ref.sketch_rows(r, oversample)
    return tol.sketch_condition(y,
                                ortho_ref.gaussian_sketch(np.random.default_rng(seed), k, rows)) if k < rows else None


# =======================================================================================
# QR methods
# =======================================================================================


@settings(deadline=None)
@given(spectral_matrices(max_dim=40, min_dim=1, max_cond=1e7, rank_deficient=False), st.sampled_from(METHODS),
       st.integers(0, 2**32 - 1))
def test_qr_methods_agree_after_sign_fix(case, method, seed):
    """All three QR methods give the unique thin QR factor with diag(R) > 0, within their own
    forward-error tolerances; each is orthonormal within its orthogonality tolerance."""
    a, s = case
    y = a if a.shape[0] >= a.shape[1] else a.T
    rows, r = y.shape
    kappa = float(s[0] / s[-1])
    p = ortho_ref.orthonormalize(y, method, rng=np.random.default_rng(seed))
    p_ref = ortho_ref.orthonormalize(y)
    ks = _sketch_kappa(y, seed) if method == "randomized_cholesky_qr" else None
    omega = tol.qr_orthogonality_tolerance(rows, r, method, sketch_condition=ks)
    assert np.linalg.norm(p.T @ p - np.eye(r)) <= omega
    bound = (tol.qr_factor_tolerance(kappa, rows, r, method, sketch_condition=ks)
             + tol.qr_factor_tolerance(kappa, rows, r, "householder"))
    if bound < tol.FIRST_ORDER_LIMIT:
        assert np.linalg.norm(p - p_ref) <= bound
        assert np.all(np.diag(p.T @ y) > 0)  # the sign fix: diag(R) = diag(PᵀY) > 0


def test_single_cholesky_pass_loses_orthogonality_and_cqr2_restores_it():
    """κ(Y) = 1e6 ≈ u^(-1/3): one CholeskyQR pass is orthonormal only to ≈ u·κ² (far beyond
    the tolerance), the second pass brings it back below the CholeskyQR2 tolerance."""
    y = _tall(60, 12, 1e6, 0)
    omega = tol.qr_orthogonality_tolerance(60, 12, "cholesky_qr")
    one_pass = scipy.linalg.solve_triangular(scipy.linalg.cholesky(y.T @ y), y.T, trans="T").T
    assert np.linalg.norm(one_pass.T @ one_pass - np.eye(12)) > 100 * omega
    p = ortho_ref.orthonormalize(y, "cholesky_qr")
    assert np.linalg.norm(p.T @ p - np.eye(12)) <= omega
    assert not np.array_equal(p, ortho_ref.orthonormalize(y))  # it really ran CholeskyQR2


@pytest.mark.parametrize("cond", [1e9, 1e14])
def test_cholesky_qr2_falls_back_to_householder_past_u_to_the_minus_half(cond):
    """κ(Y) ≥ u^(-1/2) ≈ 9.5e7: the first pass fails or leaves ‖Y₁ᵀY₁ − I‖ > 1/2, and the result
    is the Householder factor, bit for bit."""
    y = _tall(50, 10, cond, 1)
    p1 = ortho_ref.dion.cholesky_qr_pass(y, y.T @ y)
    assert p1 is None or np.linalg.norm(p1.T @ p1 - np.eye(10)) > CQR2_GRAM_DEVIATION
    assert np.array_equal(ortho_ref.orthonormalize(y, "cholesky_qr"), ortho_ref.orthonormalize(y))


def test_randomized_cholesky_qr_preconditions_ill_conditioned_input():
    """κ(Y) = 1e12 (far past CholeskyQR2's reach): the sketch preconditions Y to κ_s = O(1), and
    one CholeskyQR pass is then orthonormal within its tolerance (no fallback)."""
    y = _tall(80, 8, 1e12, 2)
    ks = _sketch_kappa(y, 3)
    assert ks < 100
    p = ortho_ref.orthonormalize(y, "randomized_cholesky_qr", rng=np.random.default_rng(3))
    assert np.linalg.norm(p.T @ p - np.eye(8)) <= tol.qr_orthogonality_tolerance(80, 8, "randomized_cholesky_qr",
                                                                                 sketch_condition=ks)
    assert not np.array_equal(p, ortho_ref.orthonormalize(y))


def test_randomized_qr_without_compression_is_householder_and_draws_nothing():
    y = _tall(10, 8, 10.0, 4)  # k = ceil(1.25·8) = 10 >= 10 rows
    rng = np.random.default_rng(5)
    before = rng.bit_generator.state
    assert np.array_equal(ortho_ref.orthonormalize(y, "randomized_cholesky_qr", rng=rng), ortho_ref.orthonormalize(y))
    assert rng.bit_generator.state == before


def test_randomized_qr_sketch_comes_from_the_explicit_generator():
    y = _tall(64, 6, 1e3, 6)
    a = ortho_ref.orthonormalize(y, "randomized_cholesky_qr", rng=np.random.default_rng(7))
    b = ortho_ref.orthonormalize(y, "randomized_cholesky_qr", rng=np.random.default_rng(7))
    c = ortho_ref.orthonormalize(y, "randomized_cholesky_qr", rng=np.random.default_rng(8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert ortho_ref.sketch_rows(6) == 8 and ortho_ref.sketch_rows(6, 2.0) == 12


# =======================================================================================
# Right factors and power iterations
# =======================================================================================


def _projector(p):
    return np.eye(p.shape[0]) - p @ p.T


def _arrays(m, n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, n)), rng.standard_normal((m, n)), rng.standard_normal((m, n))


def _lr_mu(kw):
    return {"lr": kw["lr"], "mu": kw["mu"]}


def _state(m, n, r, seed, cond=1e2):
    rng = np.random.default_rng(seed)
    g = matrix_with_spectrum(np.geomspace(1.0, 1.0 / cond, min(m, n)), m, n, rng)
    m0 = 0.5 * matrix_with_spectrum(np.geomspace(1.0, 1.0 / cond, min(m, n)), m, n, rng)
    return 0.02 * rng.standard_normal((m, n)), g, m0, rng.standard_normal((min(m, n), r))


@pytest.mark.parametrize("shape", [(24, 16), (16, 24)])
def test_orth_dion_right_factor(shape):
    """right_factor="qr": Q orthonormal, so P Qᵀ has r singular values equal to 1; the step's P, R
    and M are those of column normalization bit for bit (Q only enters the next step), and at the
    next step P agrees within tolerance (exact arithmetic: the two Q differ by an upper-triangular
    factor with positive diagonal, which orth(BQ) absorbs)."""
    m, n = shape
    w, g, m0, q0 = _state(m, n, 6, 11)
    kw = dict(lr=0.1, mu=0.9, weight_decay=0.01)
    col = ortho_ref.dion_step(w, g, m0, q0, **kw)
    orth = ortho_ref.dion_step(w, g, m0, q0, right_factor="qr", **kw)
    for key in ("P", "R", "momentum", "B"):
        assert np.array_equal(getattr(col, key), getattr(orth, key))
    omega = tol.qr_orthogonality_tolerance(min(m, n), 6)
    assert np.linalg.norm(orth.Q.T @ orth.Q - np.eye(6)) <= omega
    sv = np.linalg.svd(orth.P @ orth.Q.T, compute_uv=False)
    assert np.max(np.abs(sv[:6] - 1)) <= 2 * omega and np.max(sv[6:], initial=0.0) <= 2 * omega
    assert not np.allclose(np.linalg.svd(col.P @ col.Q.T, compute_uv=False)[:6], 1.0, atol=1e-3)  # it can differ
    g2 = g + 0.3 * matrix_with_spectrum(np.ones(min(m, n)), m, n, np.random.default_rng(12))
    first = [tol.dion_variant_tolerances(s1, q0, weight=w, dtype="float64", right_factor=rf, **_lr_mu(kw))
             for s1, rf in zip((col, orth), ortho_ref.RIGHT_FACTORS)]
    nxt = [ortho_ref.dion_step(s1.weight, g2, s1.momentum, s1.Q, **kw) for s1 in (col, orth)]
    # each next P is within its tolerance (which carries the first step's error of Q) of the same exact P
    bound = sum(tol.dion_variant_tolerances(s2, s1.Q, weight=s1.weight, dtype="float64", q_error=b1["Q"],
                                            **_lr_mu(kw))["P"]
                for s1, s2, b1 in zip((col, orth), nxt, first))
    assert np.linalg.norm(nxt[0].P - nxt[1].P) <= bound


def _tan_angle(basis, target):
    """tan of the largest principal angle between span(basis) and span(target) (orthonormal)."""
    c = np.linalg.svd(target.T @ basis, compute_uv=False).min()
    return math.sqrt(max(1.0 - c * c, 0.0)) / c


@pytest.mark.parametrize("right_factor", ortho_ref.RIGHT_FACTORS)
def test_power_iterations_converge_to_the_dominant_subspace(right_factor):
    """Subspace iteration (Golub & Van Loan, Matrix Computations, Thm. 8.2.2): with B fixed,
    tan∠(P_k, U_r) ≤ (σ_{r+1}/σ_r)^(2k−1)·tan∠(Q₀, V_r) for k power iterations."""
    m, n, r = 30, 20, 4
    s = np.concatenate([np.geomspace(4.0, 2.0, r), np.geomspace(1.0, 0.1, n - r)])
    rng = np.random.default_rng(13)
    b = matrix_with_spectrum(s, m, n, rng)
    u, _, vt = ortho_ref.svd(b)
    q0 = rng.standard_normal((n, r))
    tan0 = _tan_angle(ortho_ref.orthonormalize(q0), vt[:r].T)
    tans = []
    for k in (1, 2, 3):
        out = ortho_ref.dion_step(np.zeros((m, n)), b, np.zeros((m, n)), q0, lr=0.0, power_iters=k,
                                  right_factor=right_factor)
        d_p = tol.dion_variant_tolerances(out, q0, lr=0.0, mu=0.95, weight=np.zeros((m, n)), dtype="float64",
                                          power_iters=k, right_factor=right_factor)["P"]
        tans.append(_tan_angle(out.P, u[:, :r]))
        assert tans[-1] < 1.0  # below 45°, where d tan θ / d sin θ = 1/cos³θ < 3: the rounding slack is 3δ_P
        assert tans[-1] <= (s[r] / s[r - 1]) ** (2 * k - 1) * tan0 + 3 * d_p
    assert tans[0] > tans[1] > tans[2]


def test_ideal_step_is_dion_started_at_the_right_singular_vectors():
    """With Q₀ = V_r (top right singular vectors of B) one Dion step equals the ideal step:
    P = U_r, R = V_rΣ_r. Tolerance: the Dion step's own (Q₀ carrying the SVD's error) plus the
    ideal step's (``dion_ideal_step_tolerances``)."""
    m, n, r = 24, 16, 5
    w, g, m0, _ = _state(m, n, r, 14, cond=10.0)
    kw = dict(lr=0.1, mu=0.9, weight_decay=0.01)
    ideal = ortho_ref.dion_ideal_step(w, g, m0, rank=r, **kw)
    u, _, vt = ortho_ref.svd(m0 + g)
    q0 = vt[:r].T
    dion = ortho_ref.dion_step(w, g, m0, q0, **kw)
    ideal_tol = tol.dion_ideal_step_tolerances(ideal, lr=0.1, mu=0.9)
    bounds = tol.dion_variant_tolerances(dion, q0, weight=w, dtype="float64", q_error=ideal_tol["V"], **_lr_mu(kw))
    assert bounds["well_posed"]
    for key in ("momentum", "weight"):  # sign-invariant (P's and Q's signs follow different conventions)
        assert np.linalg.norm(getattr(dion, key) - getattr(ideal, key)) <= bounds[key] + ideal_tol[key], key
    # P = U_r with each column's largest entry positive; the momentum keeps B − (1 − μ)·B_r
    assert np.array_equal(np.abs(ideal.P), np.abs(u[:, :r]))
    assert np.all(ideal.P[np.argmax(np.abs(ideal.P), axis=0), np.arange(r)] > 0)
    # far from V_r the one-step Dion is not the ideal step (the comparison can fail)
    other = ortho_ref.dion_step(w, g, m0, np.random.default_rng(15).standard_normal((n, r)), **kw)
    assert np.linalg.norm(other.weight - ideal.weight) > 100 * (bounds["weight"] + ideal_tol["weight"])


def test_ideal_step_zero_b_and_bad_rank():
    out = ortho_ref.dion_ideal_step(np.ones((4, 3)), np.zeros((4, 3)), np.zeros((4, 3)), rank=2, lr=0.1,
                                    weight_decay=0.5)
    assert not np.any(out.P) and not np.any(out.Q) and np.array_equal(out.weight, np.ones((4, 3)) * 0.95)
    with pytest.raises(ValueError, match="^rank:"):
        ortho_ref.dion_ideal_step(np.ones((4, 3)), np.ones((4, 3)), np.zeros((4, 3)), rank=4, lr=0.1)


# =======================================================================================
# Error feedback with every variant
# =======================================================================================


@settings(deadline=None)
@given(spectral_matrices(max_dim=24, min_dim=2, max_cond=1e5), st.floats(0.0, 0.99),
       st.sampled_from([1.0, 0.5, 1 / 16]),
       st.integers(1, 3), st.sampled_from(METHODS), st.sampled_from(ortho_ref.RIGHT_FACTORS), st.integers(0, 2**32 - 1))
def test_error_feedback_identities_for_every_variant(case, mu, rank_fraction, power_iters, method, right_factor, seed):
    """(I − PPᵀ)M_new = (I − PPᵀ)B and PᵀM_new = μPᵀB whatever the QR method, right factor and
    number of power iterations (they use only PᵀP = I and R = BᵀP)."""
    g, _ = case
    m, n = g.shape
    r = ortho_ref.dion_rank(m, n, rank_fraction)
    rng = np.random.default_rng(seed)
    m0 = rng.standard_normal((m, n)) * np.linalg.norm(g) / math.sqrt(g.size)
    q0 = rng.standard_normal((min(m, n), r))
    out = ortho_ref.dion_step(np.zeros((m, n)), g, m0, q0, lr=0.1, mu=mu, power_iters=power_iters, qr_method=method,
                              rng=np.random.default_rng(seed), right_factor=right_factor)
    p, r_mat, b = out.P, out.R, out.B
    m_new = out.momentum.T if m < n else out.momentum
    rows = b.shape[0]
    omega = float(np.linalg.norm(p.T @ p - np.eye(r)))  # P's measured defect (bounded in the QR tests)
    ef = tol.error_feedback_tolerance(np.linalg.norm(b), np.linalg.norm(p), np.linalg.norm(r_mat), mu, rows, r,
                                      "float64")
    bound = tol.error_feedback_projection_tolerance(
        ef, rows=rows, b_norm=np.linalg.norm(b), m_norm=np.linalg.norm(m_new), r_norm=np.linalg.norm(r_mat),
        p_norm=np.linalg.norm(p), mu=mu, orthogonality=omega, dtype="float64")
    proj = _projector(p)
    assert np.linalg.norm(proj @ m_new - proj @ b) <= bound  # nothing outside span(P) is lost
    assert np.linalg.norm(p.T @ m_new - mu * p.T @ b) <= bound  # inside span(P) it decays by mu
    assert out.Q.shape == q0.shape and p.shape == (rows, r)
    if right_factor == "column_norm":  # unit columns up to ε/‖R_j‖
        col = np.linalg.norm(out.Q, axis=0)
        assert np.all(np.abs(col - 1) <= tol.orthonormality_tolerance(b.shape[1], 1, "float64")
                      + 1e-8 / np.linalg.norm(r_mat, axis=0))


# =======================================================================================
# The basic step: orientation, bookkeeping, no error feedback, zero B, rank
# =======================================================================================


def test_dion_orientation_depends_on_global_shape_only():
    # For m < n Dion works on the transpose: the step on (W, G, M) equals the transpose of
    # the step on (Wᵀ, Gᵀ, Mᵀ) with the same Q, up to the lr scale √(m/n) vs √(n/m).
    w, g, m0 = _arrays(5, 9, seed=3)
    q0 = np.random.default_rng(4).standard_normal((5, 3))
    wide = ortho_ref.dion_step(w, g, m0, q0, lr=0.1)
    tall = ortho_ref.dion_step(w.T, g.T, m0.T, q0, lr=0.1 * math.sqrt(5 / 9) / math.sqrt(9 / 5))
    bound = tol.error_feedback_tolerance(np.linalg.norm(wide.B), 1.0, np.linalg.norm(wide.R), 0.95, 9, 3, "float64")
    assert np.linalg.norm(wide.weight - tall.weight.T) <= bound
    assert np.linalg.norm(wide.momentum - tall.momentum.T) <= bound
    assert np.array_equal(wide.P, tall.P)


def test_dion_sum_of_gradients_bookkeeping():
    # Σ G_t = M_T + (1 − μ) Σ P_t R_tᵀ with M_0 = 0 (docs/design.md, "Dion": error feedback).
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
    bound = 5 * tol.error_feedback_tolerance(np.linalg.norm(total_g), 1.0, np.linalg.norm(total_pr), mu, m, r,
                                             "float64")
    assert np.linalg.norm(total_g - (mom + (1 - mu) * total_pr)) <= bound


def test_dion_without_error_feedback_discards_the_residual():
    w, g, m0 = _arrays(10, 6, seed=6)
    q0 = np.random.default_rng(7).standard_normal((6, 2))
    out = ortho_ref.dion_step(w, g, m0, q0, lr=0.1, mu=0.9, error_feedback=False)
    bound = tol.error_feedback_tolerance(np.linalg.norm(out.B), 1.0, np.linalg.norm(out.R), 0.9, 10, 2, "float64")
    assert np.linalg.norm(_projector(out.P) @ out.momentum) <= bound
    assert np.linalg.norm(_projector(out.P) @ out.B) > 1.0  # so the check above can fail


def test_dion_zero_b_keeps_q_and_only_decays():
    rng = np.random.default_rng(0)
    w, q0 = rng.standard_normal((6, 4)), rng.standard_normal((4, 2))
    out = ortho_ref.dion_step(w, np.zeros((6, 4)), np.zeros((6, 4)), q0, lr=0.1, weight_decay=0.5)
    assert np.array_equal(out.Q, q0) and not np.any(out.P) and not np.any(out.momentum)
    assert np.array_equal(out.weight, w * (1 - 0.1 * 0.5))


@pytest.mark.parametrize("m, n, frac, mult, expected", [
    (64, 32, 1.0, 1, 32), (64, 32, 0.25, 1, 8), (64, 32, 0.1, 8, 8), (64, 32, 0.3, 8, 16), (3, 2, 0.01, 1, 1),
    (10, 100, 1.0, 16, 10), (64, 32, 1 / 16, 1, 2), (4096, 1024, 1 / 16, 128, 128),
])
def test_dion_rank(m, n, frac, mult, expected):
    assert ortho_ref.dion_rank(m, n, frac, mult) == expected


# =======================================================================================
# Compressed data-parallel sync
# =======================================================================================


def _replicas(n_rep, m, n, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return [scale * matrix_with_spectrum(np.geomspace(1.0, 1e-2, min(m, n)), m, n, rng) for _ in range(n_rep)]


def _check_sync(rep, single, w_in, q_in, grads, momenta, kw, **opts):
    """mean_i M_i = M of one process fed the mean gradient, Q and the weights agree, within
    ``dion_variant_tolerances(..., replicas=N)``; every replica's weight is the same, bitwise."""
    n_rep = len(grads)
    replica_norm = float(np.mean([np.linalg.norm(mo) + np.linalg.norm(g) for mo, g in zip(momenta, grads)]))
    bounds = tol.dion_variant_tolerances(single, q_in, weight=w_in, dtype="float64", replicas=n_rep,
                                         replica_norm=replica_norm, **_lr_mu(kw), **opts)
    assert bounds["well_posed"]
    assert all(np.array_equal(w, rep.weights[0]) for w in rep.weights)
    assert np.linalg.norm(np.mean(rep.momenta, axis=0) - single.momentum) <= bounds["momentum"]
    assert np.linalg.norm(rep.Q - single.Q) <= bounds["Q"]
    assert np.linalg.norm(rep.weights[0] - single.weight) <= bounds["weight"]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("right_factor", ortho_ref.RIGHT_FACTORS)
@pytest.mark.parametrize("shape", [(24, 16), (16, 24)])
def test_replicated_sync_follows_the_mean_gradient_over_steps(shape, right_factor, method):
    """Four steps of N = 3 replicas with their own gradients: at every step the mean of the
    replicas' momenta equals one step of a single process from the mean state fed the mean
    gradient (by induction, the single process of the invariant in docs/design.md, "Dion"), Q and the weights agree,
    and the weights are bitwise identical on all replicas."""
    m, n = shape
    r, n_rep = 6, 3
    kw = dict(lr=0.05, mu=0.9, weight_decay=0.01)
    opts = dict(qr_method=method, right_factor=right_factor, power_iters=2)
    w = [0.02 * np.random.default_rng(20).standard_normal(shape)] * n_rep
    momenta = [np.zeros(shape)] * n_rep
    q = np.random.default_rng(21).standard_normal((min(m, n), r))
    for step in range(4):
        grads = _replicas(n_rep, m, n, 100 + step)
        rep = ortho_ref.dion_step_replicated(w, grads, momenta, q, rng=np.random.default_rng(step), **kw, **opts)
        single = ortho_ref.dion_step(w[0], np.mean(grads, axis=0), np.mean(momenta, axis=0), q,
                                     rng=np.random.default_rng(step), **kw, **opts)
        sketches = None
        if method == "randomized_cholesky_qr":
            k = ortho_ref.sketch_rows(r)
            rng = np.random.default_rng(step)
            sketches = [ortho_ref.gaussian_sketch(rng, k, max(m, n)) for _ in range(2)]
        _check_sync(rep, single, w[0], q, grads, momenta, kw, sketches=sketches, **opts)
        w, momenta, q = list(rep.weights), list(rep.momenta), rep.Q
    assert not np.allclose(momenta[0], momenta[1])  # the replicas' momenta really differ


def test_replicated_with_one_replica_is_dion_step_bitwise():
    w, g, m0, q0 = _state(20, 12, 5, 30)
    a = ortho_ref.dion_step_replicated([w], [g], [m0], q0, lr=0.1, power_iters=2)
    b = ortho_ref.dion_step(w, g, m0, q0, lr=0.1, power_iters=2)
    assert np.array_equal(a.weights[0], b.weight) and np.array_equal(a.momenta[0], b.momentum)
    assert np.array_equal(a.Q, b.Q) and np.array_equal(a.P, b.P)


def test_replicated_zero_everywhere_only_decays():
    z = [np.zeros((5, 3))] * 2
    q0 = np.ones((3, 2))
    out = ortho_ref.dion_step_replicated([np.ones((5, 3))] * 2, z, z, q0, lr=0.1, weight_decay=0.5)
    assert np.array_equal(out.Q, q0) and all(np.array_equal(w, np.full((5, 3), 0.95)) for w in out.weights)


# =======================================================================================
# Bad input
# =======================================================================================


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
    (dict(qr_method="gram_schmidt"), "^qr_method:"),
    (dict(right_factor="polar"), "^right_factor:"),
    (dict(qr_method="randomized_cholesky_qr"), "^rng:"),
    (dict(qr_method="randomized_cholesky_qr", rng=np.random.default_rng(0), oversample=0.5), "^oversample:"),
    (dict(epsilon=-1.0), "^epsilon:"),
    (dict(power_iters=1.5), "^power_iters:"),
])
def test_dion_bad_input(kwargs, match):
    args = dict(weight=np.ones((4, 3)), grad=np.ones((4, 3)), momentum=np.zeros((4, 3)), Q=np.ones((3, 2)), lr=0.1)
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        ortho_ref.dion_step(args.pop("weight"), args.pop("grad"), args.pop("momentum"), args.pop("Q"), **args)


@pytest.mark.parametrize("lists, match", [
    (([np.ones((4, 3))] * 2, [np.ones((4, 3))], [np.zeros((4, 3))] * 2), "^weights, grads, momenta:"),
    (([np.ones((4, 3))] * 2, [np.ones((4, 3)), np.ones((3, 4))], [np.zeros((4, 3))] * 2), r"^grads\[1\]:"),
    (([np.ones((4, 3))] * 2, [np.ones((4, 3))] * 2, [np.zeros((4, 3)), np.full((4, 3), np.nan)]), r"^momenta\[1\]:"),
    (([], [], []), "^weights, grads, momenta:"),
])
def test_replicated_bad_input(lists, match):
    with pytest.raises(ValueError, match=match):
        ortho_ref.dion_step_replicated(*lists, np.ones((3, 2)), lr=0.1)


def test_orthonormalize_bad_input():
    with pytest.raises(ValueError, match="^y:"):
        ortho_ref.orthonormalize(np.ones((2, 3)))
    with pytest.raises(ValueError, match="^method:"):
        ortho_ref.orthonormalize(np.ones((3, 2)), "svd")
    with pytest.raises(TypeError, match="^rng:"):
        ortho_ref.orthonormalize(np.ones((3, 2)), "randomized_cholesky_qr", rng=np.random.RandomState(0))


def test_column_normalize_shapes_values_and_errors():
    r = np.array([[3.0, 0.0], [4.0, 2.0]])
    eps = 1e-8
    q = ortho_ref.column_normalize(r, eps)
    assert q.shape == r.shape and q.dtype == np.float64
    # ‖(3, 4)‖ = 5 and ‖(0, 2)‖ = 2 are exact in float64: each entry is r / (norm + eps) rounded once
    assert np.array_equal(q, r / (np.array([[5.0, 2.0]]) + eps))
    assert np.array_equal(ortho_ref.column_normalize(np.zeros((3, 2)), eps), np.zeros((3, 2)))
    for bad, match, exc in [(-1.0, "^epsilon:", ValueError), (np.nan, "^epsilon:", ValueError),
                            ("x", "^epsilon:", ValueError)]:
        with pytest.raises(exc, match=match):
            ortho_ref.column_normalize(r, bad)
    with pytest.raises(ValueError, match="^epsilon: 0 with a zero column"):
        ortho_ref.column_normalize(np.array([[1.0, 0.0], [1.0, 0.0]]), 0.0)
    with pytest.raises(ValueError, match="^r:"):
        ortho_ref.column_normalize(np.ones(3), eps)
    with pytest.raises(TypeError, match="^r:"):
        ortho_ref.column_normalize(np.ones((3, 2), dtype=int), eps)
