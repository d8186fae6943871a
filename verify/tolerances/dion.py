"""Dion tolerances: one fast step vs ``ortho_ref.dion_step`` with the default options
(``dion_tolerances``) or any QR method, right factor, power iteration count and mixed precision
(``dion_variant_tolerances``), the QR factor models and the error-feedback identity.
"""

from __future__ import annotations

import math

import numpy as np

import ortho_ref

from .polar import svd_residual_tolerance
from .roundoff import C_NS, U64, UNIT_ROUNDOFF, condition_number, factor_roundoff, matmul_roundoff, unit_roundoff

__all__ = [
    "FIRST_ORDER_LIMIT", "dion_ideal_step_tolerances", "dion_tolerances", "dion_variant_tolerances",
    "error_feedback_projection_tolerance", "error_feedback_tolerance", "orthonormality_tolerance",
    "qr_factor_tolerance", "qr_orthogonality_tolerance", "sketch_condition",
]


def dion_tolerances(ref: "ortho_ref.DionStep", q_in: np.ndarray, *, lr: float, mu: float, weight: np.ndarray, dtype,
                    error_feedback: bool = True) -> dict:
    """Frobenius tolerances for (P, Q, momentum, weight) of one fast Dion step vs the oracle.

    ``q_in`` is the right factor Q (n', r) the step started from.
    Derivation. Y = BQ (m', r). Householder QR is backward stable: the computed P is the
    exact Q factor of Y + ΔY with ‖ΔY‖_F ≲ √(m'r)·u·‖Y‖₂ (probabilistic, Higham & Mary 2019;
    the product BQ itself adds the same order). The Q factor's first-order sensitivity is
    ‖ΔP‖_F ≤ κ₂(Y)·‖ΔY‖_F/‖Y‖₂ (Stewart 1977; Sun 1991), so
        δ_P = √(m'r)·κ₂(Y)·(u + u64).
    R = BᵀP: δ_R = ‖B‖₂·δ_P + √m'·(u + u64)·‖B‖_F.
    Column normalization Q_j = R_j/(‖R_j‖ + ε) is (2/‖R_j‖)-Lipschitz: δ_Q = 2δ_R / min_j ‖R_j‖.
    M = B − (1−μ)PRᵀ: δ_M = (1−μ)(δ_P·‖R‖₂ + δ_R) + 2(u + u64)‖B‖_F; without error feedback
    M = μPRᵀ: the same with μ in place of (1−μ).
    X = (1−lr·wd)X − lr·s·PQᵀ: δ_X = lr·s·(δ_P·‖Q‖₂ + δ_Q) + 2(u + u64)(‖X‖_F + lr·s·√r).
    The first-order model holds while δ_P ≪ 1; ``well_posed`` is False when δ_P ≥ 0.1 (a
    near rank-deficient BQ: P is then not determined by B to working precision).
    """
    u = unit_roundoff(dtype) + U64
    b, p, r_mat, q = ref.B, ref.P, ref.R, ref.Q
    mp, r = p.shape
    y = b @ q_in
    sv = ortho_ref.singular_values(y) if np.any(y) else np.zeros(1)
    kappa = float(sv[0] / sv[-1]) if sv[-1] > 0 else math.inf
    b2 = float(np.linalg.norm(b, 2))
    bf = float(np.linalg.norm(b))
    d_p = math.sqrt(mp * r) * kappa * u
    d_r = b2 * d_p + math.sqrt(mp) * u * bf
    rn = np.linalg.norm(r_mat, axis=0)
    d_q = 2 * d_r / float(rn.min()) if rn.min() > 0 else math.inf
    coef = (1 - mu) if error_feedback else mu
    d_m = coef * (d_p * float(np.linalg.norm(r_mat, 2)) + d_r) + 2 * u * bf
    d_x = lr * ref.lr_scale * (d_p * float(np.linalg.norm(q, 2)) + d_q) + 2 * u * (
        float(np.linalg.norm(weight)) + lr * ref.lr_scale * math.sqrt(r)
    )
    return {"P": d_p, "Q": d_q, "momentum": d_m, "weight": d_x, "kappa": kappa, "well_posed": d_p < 0.1}


def error_feedback_tolerance(b_norm: float, p_norm: float, r_norm: float, mu: float, m_rows: int, rank: int,
                             dtype) -> float:
    """Tolerance for ‖M_new − (B − (1−μ)PRᵀ)‖_F recomputed from the fast side's own P, R.

    The identity is exact by construction, so only the rounding of forming PRᵀ (inner
    dimension r: √r·u·‖P‖_F‖R‖_F, Higham & Mary 2019), its scaling and the subtraction
    (2u(‖B‖_F + (1−μ)‖P‖_F‖R‖_F)) remain, each made on both sides of the comparison.
    """
    u = unit_roundoff(dtype)
    pr = p_norm * r_norm
    return 2 * u * (math.sqrt(rank) * (1 - mu) * pr + 2 * (b_norm + (1 - mu) * pr))


def orthonormality_tolerance(rows: int, rank: int, dtype) -> float:
    """Tolerance for ‖PᵀP − I‖_F of a Householder QR factor P (rows × rank).

    The accumulated reflectors are orthonormal to γ̃_rows ≈ rows·u per column (Higham,
    Accuracy and Stability, Thm. 19.4 and Lemma 19.3), plus the fixed roundings of forming
    PᵀP; over r columns in the Frobenius norm: C_NS·√r·(3 + rows)·u — the same form as
    ``svd_residual_tolerance``.
    """
    u = unit_roundoff(dtype)
    return C_NS * math.sqrt(rank) * (3 + rows) * u


# --- Dion QR methods and variants ---
#
# One step of ``ortho_fast.Dion`` with any option (QR method, right factor, power iterations,
# mixed precision, compressed data-parallel sync) against ``ortho_ref.dion_step`` with the same
# options. First order in the unit roundoffs; every quantity is the oracle's own (κ₂(BQ), ‖B‖,
# ‖R_j‖, the sketch actually drawn). u_c is the unit roundoff of the compute dtype (the momentum
# dtype), u_f that of the factorizations (float32 for bfloat16 / float16 data, as microsoft/dion),
# m' × n' the working orientation, r the rank; each u below includes the oracle's u64.

#: Validity limit of the first-order models: a computed factor farther than this (Frobenius)
#: from the exact one is "not determined to working precision" (as ``dion_tolerances``).
FIRST_ORDER_LIMIT = 0.1


def _qr_model(rows: int, rank: int, method: str, dtype, sketch_condition: float | None,
              oversample: float) -> tuple[float, float]:
    """(ρ, ω): relative backward residual ‖PR − Y‖_F/‖Y‖₂ and orthogonality ‖PᵀP − I‖_F of P
    computed by ``method`` (see ``qr_factor_tolerance``); Cholesky methods take the max with
    Householder's, which is their fallback."""
    u = factor_roundoff(dtype)
    r = rank
    householder = (C_NS * math.sqrt(rows * r) * u, C_NS * math.sqrt(r) * (3 + rows) * u)
    if method == "randomized_cholesky_qr" and math.ceil(oversample * r) >= rows:
        method = "householder"
    gram = C_NS * r * (math.sqrt(rows) + math.sqrt(r + 1)) * u  # ‖fl(YᵀY) − RᵀR‖_F / ‖Y‖_F², per pass
    solve = C_NS * r**1.5 * u  # ‖Y − fl(Y R⁻¹)·R‖_F / (‖Y R⁻¹‖₂‖R‖₂), per triangular solve
    if method == "householder":
        return householder
    if method == "cholesky_qr":
        model = (2 * math.sqrt(1.5) * solve, 3 * gram + 2 * math.sqrt(3) * solve)
    elif method == "randomized_cholesky_qr":
        if sketch_condition is None:
            raise ValueError("sketch_condition: randomized_cholesky_qr needs κ₂(Y R_s⁻¹) of the sketch used")
        ks = float(sketch_condition)
        model = (2 * solve * ks, ks**2 * gram + 2 * ks * solve)
    else:
        raise ValueError(f"method: expected one of {ortho_ref.QR_METHODS}, got {method!r}")
    return max(model[0], householder[0]), max(model[1], householder[1])


def qr_orthogonality_tolerance(rows: int, rank: int, method: str = "householder", dtype="float64", *,
                               sketch_condition: float | None = None, oversample: float = 1.25) -> float:
    """Tolerance for ‖PᵀP − I‖_F of P = orth(Y) (rows × rank) computed by ``method`` and returned in
    ``dtype``: ω of ``qr_factor_tolerance`` (one CholeskyQR pass alone would reach ≈ u·κ(Y)²), plus,
    for bfloat16 / float16 (factored in float32), the rounding of P to the dtype: P + E with
    |E| ≤ u|P| gives ‖(P + E)ᵀ(P + E) − PᵀP‖_F ≤ 2u√r·‖P‖₂ + u²r."""
    omega = _qr_model(rows, rank, method, dtype, sketch_condition, oversample)[1]
    u = unit_roundoff(dtype)
    return omega + ((2 * u * math.sqrt(rank) + u * u * rank) * (1 + omega) if u > UNIT_ROUNDOFF["float32"] else 0.0)


def error_feedback_projection_tolerance(ef_tol: float, *, rows: int, b_norm: float, m_norm: float, r_norm: float,
                                        p_norm: float, mu: float, orthogonality: float, dtype) -> float:
    """Tolerance for the two identities of error feedback evaluated in float64 on a computed P,
    R (n', r) and M_new: ‖(I − PPᵀ)(M_new − B)‖_F and ‖PᵀM_new − μPᵀB‖_F (docs/design.md, "Dion": what error
    feedback guarantees).

    ``ef_tol``: ``error_feedback_tolerance`` for M_new = B − (1−μ)PRᵀ itself, mapped by I − PPᵀ or
    Pᵀ (2-norms ≤ 1 + ω, ω = ``orthogonality`` ≥ ‖PᵀP − I‖_F). The identities then fail only by
    P's orthogonality defect — (I − PPᵀ)PRᵀ = P(I − PᵀP)Rᵀ and PᵀPRᵀ − Rᵀ = (PᵀP − I)Rᵀ, so
    (1−μ)·(1 + ω)·ω·‖R‖_F — and, in the second, by the rounding of R = fl(BᵀP) in ``dtype``:
    (1−μ)·ε_mm(rows)·‖B‖_F·‖P‖_F (``matmul_roundoff``). Forming the projections in float64 (two
    products of inner dimension ≤ rows, ‖P‖_F = ``p_norm``) adds 2·ε_mm(rows)·p_norm·(1 + ω)·(‖M_new‖_F + ‖B‖_F).
    """
    w = 1 + orthogonality
    return (w * ef_tol + (1 - mu) * (w * orthogonality * r_norm + matmul_roundoff(dtype, rows) * b_norm * p_norm)
            + 2 * matmul_roundoff("float64", rows) * p_norm * w * (m_norm + b_norm))


def qr_factor_tolerance(kappa: float, rows: int, rank: int, method: str = "householder", dtype="float64", *,
                        input_error: float = 0.0, sketch_condition: float | None = None,
                        oversample: float = 1.25) -> float:
    """Frobenius tolerance for ‖P − P(Y)‖ of the Q factor (diag R > 0) of Y (rows × rank)
    computed by ``method`` (``ortho_ref.QR_METHODS``), κ = κ₂(Y).

    Derivation. Write the computed P = P_o T (P_o orthonormal, T upper triangular with positive
    diagonal: the QR of P itself); TᵀT = PᵀP, so ‖T − I‖_F ≤ ‖PᵀP − I‖_F =: ω. P_o is the exact Q
    factor of P R = Y + ΔY (T·R is upper triangular, positive diagonal), with the residual
    ‖ΔY‖_F ≤ (ρ + input_error)·‖Y‖₂ (``input_error``: the relative error of forming Y). First-order
    QR sensitivity: ΔQ = (I − QQᵀ)F + Q·X with F = ΔY R⁻¹ and ‖X‖_F ≤ √2‖QᵀF‖_F, so
    ‖ΔQ‖_F ≤ √2·κ·‖ΔY‖_F/‖Y‖₂ (Sun, BIT 31, 1991). Hence δ_P = √2·κ·(ρ + input_error) + ω.
    (ρ, ω) per method, with u = u_f + u64 and the probabilistic inner-product model of
    Higham & Mary (2019) used throughout this file (λ = C_NS, √d·u per inner product of length d):
    - householder: ρ = C_NS·√(rows·r)·u (backward stable: Higham, Accuracy and Stability,
      Thm. 19.4), ω = C_NS·√r·(3 + rows)·u as ``orthonormality_tolerance``.
    - One CholeskyQR pass Y = Y₁R: the Gram matrix and the Cholesky factorization perturb
      YᵀY by g·‖Y‖_F² with g = C_NS·(√rows + √(r+1))·u (Higham Thm. 10.3), so
      ‖Y₁ᵀY₁ − I‖ ≤ ‖R⁻¹‖₂²·g·‖Y‖_F² ≤ κ(Y)²·r·g — the known ≈ u·κ² loss; the triangular solve
      (rows of Y₁ backward stable, Higham Thm. 8.5) leaves a residual s·‖Y₁‖₂‖R‖₂ with
      s = C_NS·r^{3/2}·u (‖Y₁‖_F‖R‖_F ≤ r‖Y₁‖₂‖R‖₂), and adds ≤ 2s‖R⁻¹‖₂‖R‖₂ to the orthogonality.
    - cholesky_qr (CholeskyQR2): accepted only when the first pass left ‖Y₁ᵀY₁ − I‖_F ≤ 1/2
      (``ortho_ref.dion.CQR2_GRAM_DEVIATION``; else Householder), so σ(Y₁)² ∈ [1/2, 3/2]: the
      second pass has ω = 3r·g + 2√3·s, and the two solves leave ρ = 2√1.5·s (first pass residual
      mapped by ‖Y₁‖₂ ≤ √1.5, second by ‖R₁‖₂ = ‖Y‖₂·(1 + O(u))). Same structure as Yamamoto,
      Nakatsukasa, Yanagisawa, Fukaya (ETNA 44, 2015), whose worst-case constants are
      ρ = 5r²√r·u and ω = 6(rows·r + r(r+1))·u.
    - randomized_cholesky_qr with κ_s = κ₂(Y R_s⁻¹) (``sketch_condition``, of the actual sketch):
      Y = Y₁R_s gives ‖Y₁‖₂‖R_s‖₂ ≤ κ_s‖Y‖₂, so the solve by R_s and the CholeskyQR pass on Y₁
      leave ρ = 2s·κ_s, and that pass has ω = κ_s²·r·g + 2κ_s·s (Balabanov 2022; Fan, Guo, Lin
      2021). When ceil(oversample·r) >= rows no sketch is drawn and Y is factored by Householder.
    The Cholesky methods fall back to Householder, so each (ρ, ω) is at least Householder's.
    """
    rho, omega = _qr_model(rows, rank, method, dtype, sketch_condition, oversample)
    return math.sqrt(2) * kappa * (rho + input_error) + omega


def sketch_condition(y: np.ndarray, sketch: np.ndarray) -> float:
    """κ₂(Y R_s⁻¹) with R_s the R factor of S·Y: how well the sketch S preconditions Y, float64."""
    r_s = np.linalg.qr(sketch @ y, mode="r")
    return condition_number(np.linalg.solve(r_s.T, y.T).T)


def dion_variant_tolerances(ref: "ortho_ref.DionStep", q_in: np.ndarray, *, lr: float, mu: float, weight: np.ndarray,
                            dtype, error_feedback: bool = True, qr_method: str = "householder",
                            right_factor: str = "column_norm", power_iters: int = 1, epsilon: float = 1e-8,
                            oversample: float = 1.25, sketches=None, param_dtype=None, q_dtype=None,
                            grad_norm: float | None = None, replicas: int = 1,
                            replica_norm: float | None = None, q_error: float = 0.0) -> dict:
    """Frobenius tolerances for (P, R, Q, momentum, weight) of one fast Dion step with the given
    options vs the oracle's step ``ref`` with the same options; ``q_in`` (n', r) is the Q the step
    started from, ``weight`` the weight before it.

    ``dtype``: the compute (momentum) dtype; ``param_dtype`` / ``q_dtype`` default to it.
    ``sketches``: for randomized_cholesky_qr, the sketch S (float64 copy) of each power iteration
    that drew one. ``grad_norm``: ‖G‖_F (default ‖B‖_F; pass it when M and G cancel).
    ``replicas`` N > 1 with ``replica_norm`` = mean_i(‖M_i‖_F + ‖G_i‖_F): the comparison of
    ``ortho_ref.dion_step_replicated`` (the mean of the replicas' momenta, formed in float64) with
    ``ref`` = the single process fed the mean gradient. ``q_error``: a Frobenius error of
    ``q_in`` itself (one side started from a Q computed differently).

    Derivation (first order; per power iteration t the exact Y_t = B Q_t, P_t, R_t are
    recomputed in float64; Q₀ = q_in is rounded to the compute dtype, δ_Q = u_c‖Q₀‖_F + q_error):
    - B = fl(M + fl(G)): e_B = u_c(‖G‖_F + ‖B‖_F); with N replicas the means of N terms add
      N·u_c·replica_norm (Higham Eq. 4.4: the sum, then the division).
    - Y = BQ: ‖ΔY‖_F ≤ e_B‖Q‖₂ + ‖B‖₂δ_Q + ε_mm(n')·‖|B||Q|‖_F (``matmul_roundoff``; with N
      replicas ‖B‖_F‖Q‖_F·replica_norm/‖B‖_F bounds the replicas' products).
    - P: ``qr_factor_tolerance`` with input_error = ‖ΔY‖_F/‖Y‖₂ (randomized: κ_s of the drawn
      sketch, widened by (1 + η)/(1 − η), η = √2·κ(Y)·C_NS√(k r)·u_f the relative error of the
      fast R_s), plus u_c√r (P rounded to the compute dtype).
    - R = BᵀP: δ_R = ‖B‖₂δ_P + e_B + ε_mm(m')·‖|B|ᵀ|P|‖_F (+ the replicas' mean).
    - Right factor: column_norm R_j/(‖R_j‖ + ε) is 2/‖R_j‖-Lipschitz: 2δ_R/min_j‖R_j‖ + 3u_f√r;
      qr: ``qr_factor_tolerance`` (Householder) of R with input_error δ_R/‖R‖₂. The stored Q adds
      its rounding to q_dtype, u_q·‖Q‖_F; an intermediate Q its rounding to the compute dtype.
    - M = B − c·PRᵀ (c = 1 − μ; no error feedback: M = μPRᵀ, c = μ, no B term):
      δ_M = e_B + c(δ_P‖R‖₂ + δ_R + ε_mm(r)‖|P||R|ᵀ‖_F) + 2u_c(‖B‖_F + c‖R‖_F) (+ N·u64·(replica_norm
      + c‖R‖_F) for the mean of the replicas' momenta).
    - X = (1 − lr·wd)X − lr·s·PQᵀ, D = PQᵀ: δ_D = δ_P‖Q‖₂ + δ_Q + ε_mm(r)‖|P||Q|ᵀ‖_F + u_c(‖Q‖_F + ‖D‖_F)
      (Q cast to the compute dtype, D rounded); δ_X = lr·s·δ_D + 2u_x(‖X‖_F + lr·s‖D‖_F).
    ``well_posed`` is False where a column of R vanishes, the sketch does not precondition
    (η ≥ 1/2), or a δ_P (or Orth-Dion's δ_Q) reaches ``FIRST_ORDER_LIMIT``: then P is not
    determined to working precision and only invariants are checked.
    """
    u_c = unit_roundoff(dtype) + U64
    u_f = factor_roundoff(dtype)
    u_x = unit_roundoff(param_dtype or dtype) + U64
    u_q = unit_roundoff(q_dtype or dtype) + U64
    b = ref.B
    mp, npr = b.shape
    r = q_in.shape[1]
    b2, bf = float(np.linalg.norm(b, 2)), float(np.linalg.norm(b))
    e_b = u_c * ((bf if grad_norm is None else grad_norm) + bf)
    widen, reduce = 1.0, 0.0  # replicas: products bounded with replica_norm, and the means' rounding
    if replicas > 1:
        widen, reduce = max(1.0, replica_norm / bf), replicas * u_c * replica_norm
        e_b += reduce
    abs_b = np.abs(b)
    q, d_q = np.asarray(q_in, dtype=np.float64), u_c * float(np.linalg.norm(q_in)) + q_error
    valid, kappa, sketches = True, math.inf, list(sketches or [])
    for t in range(power_iters):
        y = b @ q
        kappa = condition_number(y)
        y2 = float(np.linalg.norm(y, 2))
        d_y = (e_b * np.linalg.norm(q, 2) + b2 * d_q
               + matmul_roundoff(dtype, npr) * widen * np.linalg.norm(abs_b @ np.abs(q)))
        ks = None
        k = math.ceil(oversample * r)
        if qr_method == "randomized_cholesky_qr" and k < mp:
            if not sketches:
                raise ValueError("sketches: one sketch per power iteration is needed for randomized_cholesky_qr")
            eta = math.sqrt(2) * kappa * C_NS * math.sqrt(k * r) * u_f
            ks = sketch_condition(y, sketches.pop(0)) * (1 + eta) / (1 - eta) if eta < 0.5 else math.inf
        d_p = qr_factor_tolerance(kappa, mp, r, qr_method, dtype, input_error=d_y / y2 if y2 > 0 else math.inf,
                                  sketch_condition=ks, oversample=oversample) + u_c * math.sqrt(r)
        valid = valid and d_p < FIRST_ORDER_LIMIT
        p = ortho_ref.orthonormalize(y) if y2 > 0 else np.zeros_like(y)
        r_mat = b.T @ p
        d_r = b2 * d_p + e_b + matmul_roundoff(dtype, mp) * widen * np.linalg.norm(abs_b.T @ np.abs(p)) + reduce
        q = ortho_ref.dion_right_factor(r_mat, right_factor, epsilon)
        if right_factor == "column_norm":
            rn = float(np.linalg.norm(r_mat, axis=0).min())
            d_q = 2 * d_r / rn + 3 * u_f * math.sqrt(r) if rn > 0 else math.inf
        else:
            r2 = float(np.linalg.norm(r_mat, 2))
            d_q = qr_factor_tolerance(condition_number(r_mat), npr, r, "householder", dtype,
                                      input_error=d_r / r2 if r2 > 0 else math.inf)
            valid = valid and d_q < FIRST_ORDER_LIMIT
        valid = valid and math.isfinite(d_q)
        if t + 1 < power_iters:
            d_q += u_c * float(np.linalg.norm(q))
    d_q += u_q * float(np.linalg.norm(q))
    coef = (1 - mu) if error_feedback else mu
    rf, r2 = float(np.linalg.norm(r_mat)), float(np.linalg.norm(r_mat, 2))
    kept = bf if error_feedback else 0.0
    d_m = (e_b if error_feedback else 0.0) + 2 * u_c * (kept + coef * rf) + coef * (
        d_p * r2 + d_r + matmul_roundoff(dtype, r) * np.linalg.norm(np.abs(p) @ np.abs(r_mat).T))
    if replicas > 1:
        d_m += replicas * U64 * (replica_norm + coef * rf)
    s = lr * ref.lr_scale
    qf, q2 = float(np.linalg.norm(q)), float(np.linalg.norm(q, 2))
    df = float(np.linalg.norm(p @ q.T))
    d_d = d_p * q2 + d_q + matmul_roundoff(dtype, r) * np.linalg.norm(np.abs(p) @ np.abs(q).T) + u_c * (qf + df)
    d_x = s * d_d + 2 * u_x * (float(np.linalg.norm(weight)) + s * df)
    return {"P": d_p, "R": d_r, "Q": d_q, "momentum": d_m, "weight": d_x, "kappa": kappa, "well_posed": bool(valid)}


def dion_ideal_step_tolerances(ideal: "ortho_ref.DionStep", *, lr: float, mu: float,
                               error_feedback: bool = True) -> dict:
    """Frobenius bounds on the rounding of ``ortho_ref.dion_ideal_step`` itself (its P from the
    float64 SVD), for comparisons of Dion with the ideal step.

    Derivation. gesdd's triplets have residual ≤ ``svd_residual_tolerance``(B.shape, ‖B‖₂) =: ρ;
    by Wedin's theorem (1972) each computed left singular vector is within sin θ ≤ ρ/gap of the
    exact one, gap = min(σ_r − σ_{r+1}, min_{j<r}(σ_j − σ_{j+1})) (single vectors, not just the
    subspace, so the gaps inside the first r count), and ‖Δu‖ ≤ √2·sin θ once the sign is fixed:
    δ_P = √(2r)·ρ/gap. Then R = BᵀP: δ_R = ‖B‖₂δ_P; Q = R_j/(‖R_j‖ + ε): δ_Q = 2δ_R/min_j‖R_j‖;
    M: δ_M = c(δ_P‖R‖₂ + δ_R) (c = 1 − μ, or μ without error feedback); X: δ_X = lr·s(δ_P‖Q‖₂ + δ_Q).
    Also returns ``V`` = √(2r)·ρ/gap for the right singular vectors (a Q₀ built from them).
    """
    b = ideal.B
    s = np.linalg.svd(b, compute_uv=False)
    r = ideal.P.shape[1]
    gaps = np.diff(-s[: r + 1]) if r < len(s) else np.diff(-s[:r])
    gap = float(gaps.min()) if gaps.size else float(s[0])
    d_u = math.sqrt(2 * r) * svd_residual_tolerance(b.shape, float(s[0])) / gap if gap > 0 else math.inf
    b2 = float(s[0])
    d_r = b2 * d_u
    rn = float(np.linalg.norm(ideal.R, axis=0).min())
    d_q = 2 * d_r / rn if rn > 0 else math.inf
    coef = (1 - mu) if error_feedback else mu
    d_m = coef * (d_u * float(np.linalg.norm(ideal.R, 2)) + d_r)
    d_x = lr * ideal.lr_scale * (d_u * float(np.linalg.norm(ideal.Q, 2)) + d_q)
    return {"P": d_u, "V": d_u, "R": d_r, "Q": d_q, "momentum": d_m, "weight": d_x}
