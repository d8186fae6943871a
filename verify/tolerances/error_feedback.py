"""Tolerances of Dion's error-feedback checks (``ortho_verify.checks.error_feedback``): the invariants on the
fast side's own factors, subspace iteration, the full-rank polar limit and the invariants of an
observed step (``check_optimizer``).
"""

from __future__ import annotations

import math

import numpy as np

from .dion import FIRST_ORDER_LIMIT, error_feedback_tolerance, orthonormality_tolerance, qr_orthogonality_tolerance
from .roundoff import C_NS, U64, matmul_roundoff, unit_roundoff

__all__ = [
    "dion_observed_step_tolerances", "ef_bookkeeping_tolerance", "ef_subspace_tolerances", "full_rank_polar_bounds",
    "polar_fixed_point_tolerance", "subspace_iteration_bounds", "subspace_perturbation",
]


# --- verify product: error feedback and user checks ---
#
# Dion's error-feedback invariants (ortho_verify.checks.error_feedback) measured on the fast side's own
# P, R, B and M in the working orientation (m' × n', m' ≥ n', rank r); the checks evaluate
# the identities in float64 from the fast values, so only the fast side's roundings and the
# u64 of the evaluation count. δ_o = ``orthonormality_tolerance(m', r)`` bounds ‖I − PᵀP‖_F
# (the check ``dion_orthonormal_P`` asserts it), hence ‖P‖₂ ≤ √(1 + δ_o).


def ef_subspace_tolerances(b_norm: float, p_norm: float, r_norm: float, mu: float, rows: int, rank: int, dtype,
                           error_feedback: bool = True) -> tuple[float, float]:
    """(outside, inside) Frobenius tolerances for Dion's subspace split of the momentum.

    With error feedback: ‖(I − PPᵀ)(M_new − B)‖_F and ‖PᵀM_new − μPᵀB‖_F; without it (M_new = μPRᵀ):
    ‖(I − PPᵀ)M_new‖_F and the same inside form. Exact when PᵀP = I and R = BᵀP.
    Derivation (c = 1 − μ with error feedback, μ without). M_new = B − cPRᵀ + E (or cPRᵀ + E) with
    ‖E‖_F ≤ e = ``error_feedback_tolerance`` (forming PRᵀ, scaling, subtracting).
    Outside: (I − PPᵀ)P = P(I − PᵀP), so the exact term is c‖P(I − PᵀP)Rᵀ‖ ≤ c√(1+δ_o)·δ_o·‖R‖_F,
    and (I − PPᵀ)E ≤ (1 + δ_o)e. Inside: PᵀM_new − μPᵀB = c(PᵀB − Rᵀ) + c(I − PᵀP)Rᵀ + PᵀE; the fast
    R = fl(BᵀP) has ‖R − BᵀP‖_F ≤ ``matmul_roundoff``(m')·‖B‖_F‖P‖_F (Higham & Mary 2019), so
    c(ε_mm‖B‖_F p + δ_o‖R‖_F) + √(1+δ_o)e. Both add the float64 evaluation, 2C_NS√m'·u64·(‖B‖_F + c·p‖R‖_F).
    Arguments: Frobenius norms of the fast B, P, R; rows = m', rank = r.
    """
    d_o = orthonormality_tolerance(rows, rank, dtype)
    c = (1.0 - mu) if error_feedback else mu
    e = error_feedback_tolerance(b_norm if error_feedback else 0.0, p_norm, r_norm,
                                 mu if error_feedback else 1.0 - mu, rows, rank, dtype)
    evaluation = 2 * C_NS * math.sqrt(rows) * U64 * (b_norm + c * p_norm * r_norm)
    outside = c * math.sqrt(1 + d_o) * d_o * r_norm + (1 + d_o) * e + evaluation
    inside = c * (matmul_roundoff(dtype, rows) * b_norm * p_norm + d_o * r_norm) + math.sqrt(1 + d_o) * e + evaluation
    return outside, inside


def ef_bookkeeping_tolerance(step_tolerances, b_norms, dtype) -> float:
    """Frobenius tolerance for ‖Σ G_t − M_T − (1 − μ) Σ P_t R_tᵀ‖_F after T steps from M_0 = 0.

        Σ_t (e_t + 2(u + u64)‖B_t‖_F)

    Derivation: telescoping B_t = M_{t−1} + G_t + F_t (F_t the rounding of that sum, ≤ u‖B_t‖_F)
    and M_t = B_t − (1−μ)P_tR_tᵀ + E_t (‖E_t‖ ≤ e_t = ``error_feedback_tolerance`` of step t)
    gives Σ G_t − M_T − (1−μ)Σ P_tR_tᵀ = −Σ(F_t + E_t); the float64 sums on the checking side add
    at most u64·‖B_t‖_F per step. Without error feedback the lost part L_t = B_t − P_tR_tᵀ is
    added to the identity and the same bound holds with e_t of M_t = μP_tR_tᵀ.
    Arguments: sequences of e_t and ‖B_t‖_F (floats, same length).
    """
    u = unit_roundoff(dtype) + U64
    return float(sum(step_tolerances) + 2 * u * sum(b_norms))


def subspace_perturbation(shape: tuple[int, int], rank: int, dtype) -> float:
    """ε: relative size ‖ΔB‖₂/‖B‖₂ of the backward perturbation one Dion power-iteration step
    commits, in the working orientation (m', n') at rank r.

        ε = C_NS·(1 + √n' + √m' + √(m'r))·√r·(u + u64)

    Derivation: Y = fl(BQ) (inner dim n'), the Householder QR of Y (backward error √(m'r)·u·‖Y‖,
    Higham, Accuracy and Stability, Thm. 19.4), R = fl(BᵀP) (inner dim m') and the column scaling
    (u per entry) each equal an exact step with B perturbed by that relative amount (probabilistic
    factors of Higham & Mary 2019); over r columns in the spectral norm ≤ Frobenius: √r.
    """
    m, n = shape
    u = unit_roundoff(dtype) + U64
    return C_NS * (1 + math.sqrt(n) + math.sqrt(m) + math.sqrt(m * rank)) * math.sqrt(rank) * u


def subspace_iteration_bounds(sigma: np.ndarray, rank: int, tan0: float, steps: int, shape: tuple[int, int],
                              dtype, q_conditions=None) -> np.ndarray:
    """Bounds τ_t on tan θ_max(span P_t, U_r), t = 1..steps, for Dion steps with a fixed B.

    σ: singular values of B (descending); U_r its top-r left singular subspace; tan0 = tan θ_max
    between span Q_0 and the top-r right singular subspace V_r. Exact arithmetic: span P_t =
    span((BBᵀ)^{t−1} B Q_0) (column scaling and QR keep spans), so with q = σ_{r+1}/σ_r
    tan θ_t ≤ q^{2t−1} tan θ_0 (subspace iteration on BBᵀ; Golub & Van Loan, Matrix
    Computations, Thm. 8.2.2; Saad, Numerical Methods for Large Eigenvalue Problems, Thm. 5.2).
    Rounding: the products and the QR of step t are exact for Y = (B + ΔB)Q_{t−1} with
    ‖ΔB‖₂ ≤ ε‖B‖₂·κ₂(Q_{t−1}) (``subspace_perturbation``; the errors are relative to ‖B‖‖Q‖ and
    map back to B through Q⁺), and R = BᵀP (P orthonormal) with ε‖B‖₂. Writing the basis as
    X = U_r C₁ + U_⊥ C₂ (‖C₁⁻¹‖₂ = sec θ = √(1 + τ²)), one step with the operator A + Δ gives
        τ' ≤ (a_{r+1} τ + ‖Δ‖√(1 + τ²)) / (a_r − ‖Δ‖√(1 + τ²)),
    with (a, ‖Δ‖) = (σ, εκ_1σ₁) for the first step (B) and (σ², ε(1 + κ_t)σ₁²) after (BBᵀ); a
    non-positive denominator gives inf (no claim). ``q_conditions``: κ₂ of the right factor each
    step starts from (t = 1..steps; default 1). With κ = 1 instead, an 11 × 6 full-rank input from a
    Gaussian Q_0 (κ₂ = 5.6e4) measures tan θ_1 = 6.6e-12 against a bound of 7.9e-14 (2026-11-21).
    The oracle's U_r is exact for a perturbation of relative size C_NS·√d·u64, adding
    C_NS·√d·u64·σ₁/(σ_r − σ_{r+1}) (Wedin 1972) to each τ_t.
    Shapes: sigma (k,), k ≥ rank. Returns (steps,) float64.
    """
    s = np.asarray(sigma, dtype=np.float64)
    hi, lo = float(s[rank - 1]), (float(s[rank]) if rank < len(s) else 0.0)
    eps = subspace_perturbation(shape, rank, dtype)
    gap = hi - lo
    oracle = C_NS * math.sqrt(max(shape)) * U64 * float(s[0]) / gap if gap > 0 else math.inf
    kappas = np.ones(steps) if q_conditions is None else np.asarray(q_conditions, dtype=np.float64)
    out, tau = [], float(tan0)
    for t in range(steps):
        a_hi, a_lo, delta = (hi, lo, eps * kappas[0] * s[0]) if t == 0 else \
            (hi**2, lo**2, eps * (1 + kappas[t]) * s[0] ** 2)
        sec = math.sqrt(1 + tau * tau) if math.isfinite(tau) else math.inf
        denom = a_hi - delta * sec
        tau = (a_lo * tau + delta * sec) / denom if denom > 0 and math.isfinite(tau) else math.inf
        out.append(tau + oracle)
    return np.array(out)


def full_rank_polar_bounds(sigma: np.ndarray, prefix_tan0: np.ndarray, steps: int, epsilon: float,
                           shape: tuple[int, int], dtype, q_conditions=None) -> np.ndarray:
    """Bounds on ‖P_t Q_tᵀ − U Vᵀ‖_F, t = 1..steps, for full-rank Dion (r = n') with a fixed B.

    σ (n',) descending, all > 0; prefix_tan0[j−1] = tan θ_max(span Q_0[:, :j], V_j), j = 1..n'−1.
    Derivation. QR and column scaling keep prefix spans, so span P_t[:, :j] is subspace iteration
    on the first j columns and s_j = min(1, ``subspace_iteration_bounds`` at rank j) bounds its
    sin θ_j (s_0 = s_{n'} = 0; ``q_conditions`` as there: a column prefix of Q is no worse
    conditioned than Q). Column p_j is ⊥ span P[:, :j−1] and inside span P[:, :j], so
    p_j = c u_j + a + b with a ∈ span U_{j−1}, ‖a‖ ≤ s_{j−1}, b ⊥ U_j, ‖b‖ ≤ s_j, and
    ‖p_j ∓ u_j‖ ≤ 2(s_{j−1} + s_j). Then Bᵀp_j = cσ_j v_j + Bᵀa + Bᵀb with ‖Bᵀa‖ ≤ σ₁s_{j−1},
    ‖Bᵀb‖ ≤ σ_{j+1}s_j, and normalizing (‖x/‖x‖ − y/‖y‖‖ ≤ 2‖x − y‖/‖y‖) moves q_j from ±v_j by
    at most 2(σ₁s_{j−1} + σ_{j+1}s_j)/(|c|σ_j) + ε/σ_j, |c| ≥ √(1 − s_{j−1}² − s_j²). Summing
    ‖p_j q_jᵀ − u_j v_jᵀ‖ ≤ ‖p_j ∓ u_j‖ + ‖q_j ∓ v_j‖ over j gives the bound (signs cancel in
    p_j q_jᵀ). The rounding of the last step adds ``polar_fixed_point_tolerance``. (The ε terms
    make the limit ‖ε/(σ + ε)‖ rather than 0, as at the fixed point.) The σ₁/σ_j factor makes
    the bound loose for ill-conditioned B (≈ 1e3× for condition 4e3); it is a valid bound.
    Returns (steps,) float64 (inf where |c| = 0).
    """
    s = np.asarray(sigma, dtype=np.float64)
    k = len(s)
    sines = np.zeros((k + 1, steps))  # sines[j] bounds sin θ_j, j = 0..k
    for j in range(1, k):
        sines[j] = np.minimum(1.0, subspace_iteration_bounds(s, j, float(prefix_tan0[j - 1]), steps, shape, dtype,
                                                             q_conditions))
    nxt = np.append(s[1:], 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = np.sqrt(np.clip(1.0 - sines[:-1] ** 2 - sines[1:] ** 2, 0.0, None))
        terms = 2 * (sines[:-1] + sines[1:]) + (2 * (s[0] * sines[:-1] + nxt[:, None] * sines[1:]) / cos
                                                 + epsilon) / s[:, None]
    return np.sum(terms, axis=0) + polar_fixed_point_tolerance(s, epsilon, shape, dtype)


def polar_fixed_point_tolerance(sigma: np.ndarray, epsilon: float, shape: tuple[int, int], dtype) -> float:
    """Tolerance for ‖PQᵀ − U diag(σ/(σ + ε)) Vᵀ‖_F after one full-rank Dion step from Q_0 = V.

    Exact arithmetic: BV = UΣ has orthogonal columns, so its QR with diag(R) > 0 is P = U,
    R = BᵀP = VΣ, Q = R/(‖R_j‖ + ε) = V diag(σ_j/(σ_j + ε)), and PQᵀ = U diag(σ/(σ + ε)) Vᵀ: the
    polar factor UVᵀ up to ‖ε/(σ + ε)‖₂ (``epsilon`` enters the expected value, not this bound).
    Rounding. Y = fl(BV) (inner dimension n': column j off by ≤ C_NS√n'·u·‖B‖_F) and its
    Householder QR (backward error C_NS√(m'r)·u·‖y_j‖ per column; Higham & Mary 2019, Higham
    Thm. 19.4), over r columns: ‖ΔY‖_F ≤ η = C_NS(√(n'r) + √(m'r))·(u + u64)·‖B‖_F.
    First-order QR perturbation at Y = UΣ: dP = (I − UUᵀ)dY Σ⁻¹ + U S with S skew, S_ij = u_iᵀdy_j/σ_j
    (i > j). So ‖dP‖_F ≤ η/σ_min =: δ_P, while BᵀdP = V Σ S has entries u_iᵀdy_j·σ_i/σ_j (i > j) and
    −u_jᵀdy_i (i < j), all ≤ |dY| entries: ‖BᵀdP‖_F ≤ η with no condition number. R = fl(BᵀP) adds
    C_NS√m'·u·‖B‖_F, and the column normalization is 2/σ_j-Lipschitz: δ_Q = 2(η + C_NS√m'u‖B‖_F)/σ_min.
    ‖PQᵀ − P̂Q̂ᵀ‖ ≤ δ_P + δ_Q. The oracle's V is exact for a perturbation of relative size
    C_NS·√d·u64 and moves by at most that times σ₁/(min gap) per column (Wedin 1972), √r columns.
    Shapes: sigma (r,) descending (r = n'). Returns inf when a σ is 0 or repeated, or when
    δ_P ≥ FIRST_ORDER_LIMIT (the first-order model does not hold: no claim).
    """
    s = np.asarray(sigma, dtype=np.float64)
    m, n = shape
    r = len(s)
    u = unit_roundoff(dtype) + U64
    gaps = -np.diff(s)
    if s[-1] <= 0 or (len(gaps) and gaps.min() <= 0):
        return math.inf
    eta = C_NS * (math.sqrt(n * r) + math.sqrt(m * r)) * u * float(np.linalg.norm(s))
    d_p = eta / float(s[-1])
    if d_p >= FIRST_ORDER_LIMIT:
        return math.inf
    d_q = 2 * (eta + C_NS * math.sqrt(m) * u * float(np.linalg.norm(s))) / float(s[-1])
    min_gap = float(gaps.min()) if len(gaps) else float(s[0])
    oracle = C_NS * math.sqrt(max(m, n)) * U64 * float(s[0]) / min_gap * math.sqrt(r)
    return d_p + d_q + oracle


def dion_observed_step_tolerances(*, weight_norms: tuple[float, float], decay: float, step: float, q: np.ndarray,
                                  b_norm: float, sigma_r: float, mu: float, rows: int, dtype,
                                  error_feedback: bool = True) -> dict:
    """Tolerances for the invariants of one Dion step seen only through what it leaves behind
    (``ortho_verify.checks.error_feedback.observed_step_rows``): no P, and none of P's conditioning.

    Working orientation (m', n'), rank r; O = (decay·W − W_new)/step (step = lr·s, decay = 1 − lr·wd)
    is P Qᵀ with Q (n', r) the stored right factor; B = M + G from the stored momentum and the gradient.
    ``dtype``: the coarsest of the parameter, momentum and Q dtypes (every rounding is counted with
    its u). ``weight_norms`` = (‖W‖_F, ‖W_new‖_F); ``sigma_r`` = σ_r(O).
    Derivation. δ_o = ``qr_orthogonality_tolerance``(m', r) ≥ ‖PᵀP − I‖_F (P factored in float32 for
    bfloat16 / float16, then rounded), so ‖P‖₂ ≤ p₂ = √(1 + δ_o), ‖P‖_F ≤ p_F = √(r + √r·δ_o).
    - The update D = fl(P·fl(Q)ᵀ): ‖D − PQᵀ‖_F ≤ e_D = (u·p₂ + ε_mm(r)·p_F)·‖Q‖_F (``matmul_roundoff``),
      and W_new = fl(fl(decay·W) − step·fl(D)) adds u(decay‖W‖_F + ‖W_new‖_F + 2·step·‖D‖_F); so
      ‖O − PQᵀ‖_F ≤ e_O = e_D + u(decay‖W‖_F + ‖W_new‖_F + 2·step·(p₂‖Q‖_F + e_D))/step.
    - "update": OᵀO − QQᵀ = Q(PᵀP − I)Qᵀ + (PQᵀ)ᵀE + Eᵀ(PQᵀ) + EᵀE, E = O − PQᵀ:
      ‖·‖_F ≤ ‖Q‖₂²δ_o + 2p₂‖Q‖₂e_O + e_O², plus the float64 products 2ε_mm,64(m')·(p_F‖Q‖_F + e_O)².
    - "momentum": M_new = B̃ − c·fl(P·fl(B̃ᵀP)ᵀ) (c = 1 − μ; without error feedback M_new = c·fl(PRᵀ),
      c = μ), B̃ = fl(M + G) = B + F, ‖F‖_F ≤ u‖B‖_F; and PRᵀ = PPᵀB̃ up to the roundings of R
      (p₂·ε_mm(m')·p_F‖B‖_F) and of forming M (ε_mm(r)·p_F·p₂‖B‖_F + 2u(‖B‖_F + c·p₂²‖B‖_F)). The check
      uses Π̂, the projector on the top-r left singular vectors of O: ‖PPᵀ − Π_P‖₂ ≤ δ_o, and by
      Wedin's theorem (1972; PQᵀ has rank r and range span P when Q has full column rank)
      ‖Π_P − Π̂‖₂ = sin θ ≤ min(1, e_O/σ_r(O)). Total: (k + c)u‖B‖_F + c(1 + u)(δ_o + sin θ)‖B‖_F +
      c·p₂·ε_mm(m')·p_F‖B‖_F + c·ε_mm(r)·p_F·p₂‖B‖_F + 2u(k + c·p₂²)‖B‖_F (k = 1 with error feedback,
      else 0), plus 2ε_mm,64(m')·√r·‖B‖_F for Π̂B in float64.
    Returns {"update": ..., "momentum": ..., "update_error": e_O, "sin_theta": ..., "orthogonality": δ_o}.
    """
    u = unit_roundoff(dtype) + U64
    r = q.shape[1]
    d_o = qr_orthogonality_tolerance(rows, r, "householder", dtype)
    p2, pf = math.sqrt(1 + d_o), math.sqrt(r + math.sqrt(r) * d_o)
    qf, q2 = float(np.linalg.norm(q)), float(np.linalg.norm(q, 2))
    e_d = (u * p2 + matmul_roundoff(dtype, r) * pf) * qf
    w_prev, w_new = weight_norms
    e_o = e_d + u * (decay * w_prev + w_new + 2 * step * (p2 * qf + e_d)) / step
    eval64 = 2 * matmul_roundoff("float64", rows)
    update = q2 * q2 * d_o + 2 * p2 * q2 * e_o + e_o * e_o + eval64 * (pf * qf + e_o) ** 2
    c, kept = (1 - mu, 1.0) if error_feedback else (mu, 0.0)
    sin_theta = min(1.0, e_o / sigma_r) if sigma_r > 0 else 1.0
    momentum = b_norm * ((kept + c) * u + c * (1 + u) * (d_o + sin_theta) + c * p2 * pf * (
        matmul_roundoff(dtype, rows) + matmul_roundoff(dtype, r)) + 2 * u * (kept + c * p2 * p2)
        + eval64 * math.sqrt(r))
    return {"update": update, "momentum": momentum, "update_error": e_o, "sin_theta": sin_theta, "orthogonality": d_o}
