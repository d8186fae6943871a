"""Every tolerance of the verification suite, each a formula with its derivation.

Nothing here is a number tuned until a test passes: each tolerance is computed from the
oracle's own quantities (the normalized spectrum σ̂, first-order gains of the Newton–Schulz
map, condition numbers) and the unit roundoff u of the compute dtype. docs/tolerances.md
repeats the derivations; the constants below are the only free choices and each says why.

Notation: u = unit roundoff of the compute dtype (2⁻⁵³ float64, 2⁻²⁴ float32, 2⁻⁸ bfloat16,
2⁻¹¹ float16), u64 = 2⁻⁵³ (the float64 oracle), k = min(m, n), d = max(m, n).
"""

from __future__ import annotations

import math

import numpy as np

import ortho_ref

U64 = 2.0**-53

UNIT_ROUNDOFF = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "bfloat16": 2.0**-8,
    "float16": 2.0**-11,
}

#: Rounding points per Newton–Schulz step: A = XXᵀ, B = bA + cA², X ← aX + BX.
ROUNDINGS_PER_STEP = 3

#: Probabilistic constant λ of Higham & Mary (2019), "A new approach to probabilistic
#: rounding error analysis", Thm. 3.1: an inner product of length d in precision u has
#: error ≤ λ·√d·u·|x|ᵀ|y| with probability ≥ 1 − 2exp(−λ²(1−u)²/2). A Frobenius norm sums
#: k·d such independent errors, so it concentrates at its root-mean-square, ≈ √d·u per unit
#: of norm; λ = 2 allows two standard deviations above it.
C_NS = 2.0


def unit_roundoff(dtype) -> float:
    """u for a dtype given as a torch/numpy dtype or its name; ValueError if unknown."""
    name = str(dtype).replace("torch.", "").replace("numpy.", "")
    if name not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype: expected one of {sorted(UNIT_ROUNDOFF)}, got {dtype!r}")
    return UNIT_ROUNDOFF[name]


def ns_tolerance(sigma_hat: np.ndarray, coefficients, shape: tuple[int, int], dtype) -> float:
    """Frobenius tolerance for ‖newton_schulz(G) − ns_map(G)‖_F in float32/float64.

        C_NS · √k · (1 + √d) · (u + u64) · (G_0 + Σ_{t=1}^{T} G_t · S_t)

    Derivation (first order). Write the computed iterate as X̃_t = X_t + E_t where E_t is the
    rounding committed at step t (t = 0: rounding of the input and its normalization).
    Step t forms A = XXᵀ, B = bA + cA², X ← aX + BX. Its products have inner dimension
    ≤ d, and by Higham & Mary's probabilistic bound each contributes ≲ λ√d·u relative to the
    sizes of its terms; the sums add u relative to the same sizes. The terms are not the
    result: they are |a_t|x + |b_t|x³ + |c_t|x⁵ per singular value x of the step input, and
    cancel (``ortho_ref.ns_step_magnitudes`` gives their sup S_t). So per singular direction
    E_t ≲ (1 + √d)·u·S_t, and over k directions ‖E_t‖_F ≲ λ√k(1 + √d)·u·S_t. To first order
    E_t reaches the output multiplied by the Fréchet derivative of the remaining steps,
    whose norm is at most G_t (``ortho_ref.ns_step_gains``, Daleckii–Krein divided
    differences over the step-t spectrum). The u64 term covers the oracle's own
    backward-stable SVD. This refines DESIGN.md's c·u·L_f·√k: Σ_t G_t ≤ (T+1)·L_f, G_0 is
    sup|f′| over the actual spectrum rather than [0, 1], and the inner-dimension and
    cancellation factors are explicit (a 1 × 1 input exceeded the form without S_t: local
    step errors of 9–14u against ~2u modelled).
    Shapes: sigma_hat (k,) the normalized singular values; shape (m, n).
    """
    u = unit_roundoff(dtype)
    m, n = shape
    s = np.asarray(sigma_hat, dtype=np.float64)
    lo, hi = float(max(s.min(), 0.0)), float(s.max())
    if hi <= lo:
        hi = lo * (1 + 1e-12) + 1e-300
    gains = ortho_ref.ns_step_gains(coefficients, lo, hi)
    sizes = ortho_ref.ns_step_magnitudes(coefficients, lo, hi)
    weighted = float(gains[0] + np.dot(gains[1:], sizes))
    return C_NS * math.sqrt(min(m, n)) * (1 + math.sqrt(max(m, n))) * (u + U64) * weighted


def ns_singular_value_tolerance(sigma_hat: np.ndarray, coefficients, shape: tuple[int, int], dtype) -> float:
    """Tolerance for max_i |σ_i(newton_schulz(G)) − f(σ̂_i)| (sorted); the bfloat16 check.

    Derivation. In bfloat16 (and float16) the CPU and GPU matmuls accumulate in float32 and
    round each output once, so each of the ROUNDINGS_PER_STEP products perturbs the iterate
    by about u relative to its scale (≤ max x_t ≈ 1); in float32/float64 the accumulation is
    in the same precision and adds the probabilistic √d of Higham & Mary (2019). To first order a perturbation E of a simple
    singular value moves it by uᵢᵀEvᵢ (Stewart & Sun 1990, ch. V), and that displacement of
    x_t is carried to the output by |∂x_T/∂x_t| along the exact trajectory. Summing over
    the input rounding and the T steps gives ``ortho_ref.ns_diagonal_gain``; with
    rho = ROUNDINGS_PER_STEP·a·(u + u64) (a = 1 or √d, above) the tolerance is
    rho·max_i sup_{|x − σ̂ᵢ| ≤ rho} gain(x) — the sup over the rounding neighbourhood makes
    the first-order estimate a mean-value one. Sorting both sides is
    justified by Weyl's inequality for the sorted singular values.
    This is a first-order model, not a rigorous bound; it is only informative where it is
    below the width of the band (well-conditioned inputs) — the check reports it regardless.
    """
    return float(np.max(ns_singular_value_tolerances(sigma_hat, coefficients, shape, dtype)))


def ns_singular_value_tolerances(sigma_hat: np.ndarray, coefficients, shape: tuple[int, int], dtype) -> np.ndarray:
    """Per-direction tolerances τ_i = rho·sup_{|x − σ̂ᵢ| ≤ rho} gain(x) (see
    ``ns_singular_value_tolerance``, whose value is their maximum).

    Used directly for |uᵢᵀ X_fast vᵢ − f(σ̂ᵢ)| with uᵢ, vᵢ the exact singular vectors of
    the input: to first order that projection is the i-th singular value of X_fast
    (Stewart & Sun 1990, ch. V), so each direction gets its own tolerance and the
    well-resolved directions of an ill-conditioned input keep a sharp check.
    Shapes: sigma_hat (k,) -> (k,) float64.
    """
    u = unit_roundoff(dtype)
    accumulation = 1.0 if u > UNIT_ROUNDOFF["float32"] else math.sqrt(max(shape))
    rho = ROUNDINGS_PER_STEP * accumulation * (u + U64)
    # Mean-value form: the gain's sup over each σ̂ᵢ ± rho, not its value at σ̂ᵢ — the steep
    # schedules' gains oscillate within one bf16 rounding of x ≈ 1 (a point value was
    # measured to be exceeded: polar_express_paper, a 3 × 1 input at σ̂ = 0.99).
    x = np.asarray(sigma_hat, dtype=np.float64)[:, None] + rho * np.linspace(-1.0, 1.0, 33)[None, :]
    gain = ortho_ref.ns_diagonal_gain(np.clip(x, 0.0, None), coefficients)
    return rho * np.max(gain, axis=1)


def muon_tolerance(ns_tol: float, lr_scale: float, lr: float, weight_norm: float, update_norm: float, dtype) -> float:
    """Frobenius tolerance for the weight after one fast Muon step vs ``ortho_ref.muon_step``.

    W_new = W(1 − lr·wd) − lr·s·O: the orthogonalized update's error enters scaled by lr·s
    (``ns_tol`` from ``ns_tolerance`` at the momentum-mixed input U, which already counts the
    input rounding of U); the two elementwise operations on W (scale, subtract) and the
    rounding of W and O to the parameter dtype add at most 2u(‖W‖_F + lr·s‖O‖_F) each way.
    """
    u = unit_roundoff(dtype)
    return lr * lr_scale * ns_tol + 4 * (u + U64) * (weight_norm + lr * lr_scale * update_norm)


def momentum_tolerance(grad_norm: float, momentum_norm: float, dtype) -> float:
    """Frobenius tolerance for a momentum buffer after μM + cG (or lerp): each entry is two
    products and a sum of numbers bounded by |M| and |G|, so ≤ 3u(‖M‖_F + ‖G‖_F), doubled for
    the rounding of the inputs to the parameter dtype."""
    u = unit_roundoff(dtype)
    return 6 * (u + U64) * (grad_norm + momentum_norm)


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
    sv = np.linalg.svd(y, compute_uv=False) if np.any(y) else np.zeros(1)
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


def error_feedback_tolerance(b_norm: float, p_norm: float, r_norm: float, mu: float, m_rows: int, rank: int, dtype) -> float:
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


#: fast Muon with ``eps_mode="clamp"`` runs the same torch operations, in the same order and
#: dtype, as torch.optim.Muon (``addmm`` steps, bf16 norm and clamp, lerp momentum), so on one
#: backend the results are bitwise equal: tolerance 0 in max |ΔW|.
TORCH_MUON_TOLERANCE = 0.0

#: Two transcriptions of the same decimal literals must give the same float64 bits.
COEFFICIENT_REGISTRY_TOLERANCE = 0.0


#: LAPACK's convergence / deflation threshold multiplier of the bidiagonal SVD (dbdsqr:
#: TOLMUL = max(10, min(100, eps^(-1/8))), eps = 2⁻⁵³): the computed singular triplets are
#: accepted at a relative level of TOLMUL·u, ≈ 98.7u in float64.
LAPACK_SVD_TOLMUL = max(10.0, min(100.0, U64 ** -0.125))


def svd_residual_tolerance(shape: tuple[int, int], scale: float = 1.0, dtype="float64") -> float:
    """Tolerance for residuals of the SVD-based polar decomposition (LAPACK gesdd):
    ‖U_pᵀU_p − I‖_F (scale 1) or ‖U_p H − A‖_F (scale ‖A‖₂).

        (LAPACK_SVD_TOLMUL + C_NS·(3 + d)) · √k · u · scale

    Two sources per singular triplet, over k triplets in the Frobenius norm (√k): gesdd
    accepts each triplet at LAPACK's threshold TOLMUL·u·‖A‖₂ (dbdsqr), and the orthogonal
    transformations plus the fixed roundings of forming U_p = U Vᵀ, H = V Σ Vᵀ and their
    product grow as γ̃_d ≈ d·u (Higham, Accuracy and Stability, Lemma 19.3, Thm. 19.4).
    History: without the TOLMUL term a 3 × 3 residual of 29u exceeded the bound, and a sweep of
    20000 random inputs up to 32 × 32 reached 3.3 times it; with it, a sweep of 20000 inputs
    up to 64 × 64 gave a worst ratio of 0.39 (residual) and 0.14 (orthonormality).
    """
    u = unit_roundoff(dtype)
    m, n = shape
    return (LAPACK_SVD_TOLMUL + C_NS * (3 + max(m, n))) * math.sqrt(min(m, n)) * u * scale


def prescribed_spectrum_tolerance(shape: tuple[int, int], sigma_max: float = 1.0) -> float:
    """Absolute tolerance on the singular values of ``verify.spectra.matrix_with_spectrum``
    (and on ‖QᵀQ − I‖₂ of ``haar_orthogonal`` with sigma_max = 1), float64.

    The matrix is fl(Û S V̂ᵀ): (1) Û, V̂ from Householder QR are orthogonal to O(d·u)
    (Higham, Accuracy and Stability, Thm. 19.4), perturbing the singular values by
    σᵢ·O(d·u); (2) forming the product adds O(√k·u)·σ_max (independent roundings);
    (3) gesdd is backward stable with ‖E‖₂ ≤ p(m, n)·u·‖A‖₂, p a modest linear function
    (LAPACK Users' Guide, Sec. 4.9). By Weyl each is an absolute singular-value error of a
    small multiple of d·u·σ_max; the sum with the three constants taken as 10/3 each is
    10·d·u·σ_max.
    """
    return 10.0 * max(shape) * U64 * sigma_max
