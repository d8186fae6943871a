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
    backward-stable SVD. This refines DESIGN.md's c·u·L_f·√k: G_0 is the sup over the actual
    spectrum's hull, at most ``ortho_ref.ns_lipschitz(table, 0, σ̂_max)`` ≤ L_f (mean value
    theorem; checked on every call, see ``_gains_and_sizes``), the later steps' roundings are
    weighted by their own gains G_t, and the inner-dimension and
    cancellation factors are explicit (a 1 × 1 input exceeded the form without S_t: local
    step errors of 9–14u against ~2u modelled).
    Shapes: sigma_hat (k,) the normalized singular values; shape (m, n).
    """
    u = unit_roundoff(dtype)
    m, n = shape
    gains, sizes = _gains_and_sizes(sigma_hat, coefficients)
    weighted = float(gains[0] + np.dot(gains[1:], sizes))
    return C_NS * math.sqrt(min(m, n)) * (1 + math.sqrt(max(m, n))) * (u + U64) * weighted


def _gains_and_sizes(sigma_hat: np.ndarray, coefficients) -> tuple[np.ndarray, np.ndarray]:
    """``ns_step_gains`` (G_0..G_T) and ``ns_step_magnitudes`` (S_1..S_T) over the hull [lo, hi]
    of σ̂ (widened by a relative 1e-12 when all σ̂ are equal).

    Checked against ``ortho_ref.ns_lipschitz`` on every call: G_0 = sup over [lo, hi] of
    max(|f′(x)|, |f(x)/x|), and |f(x)/x| = |f′(ξ)| for some ξ ∈ (0, x) (mean value theorem,
    f(0) = 0), so ns_lipschitz(lo, hi) <= G_0 <= ns_lipschitz(0, hi), and the latter is at most
    DESIGN.md's L_f = sup_[0,1] |f′| when hi <= 1. The lower inequality is exact in floating
    point (G_0 maximizes over a superset of ns_lipschitz's points); the upper one is allowed a
    relative √u64 ≈ 1.5e-8, far above the float64 rounding of f′ and f(x)/x (≲ 10³·u64 with the
    registry's cancellation) and far below the 1e-2 by which a sampled sup missed it.
    Raises: RuntimeError if either fails (the oracle's sup missed a critical point).
    """
    s = np.asarray(sigma_hat, dtype=np.float64)
    lo, hi = float(max(s.min(), 0.0)), float(s.max())
    if hi <= lo:
        hi = lo * (1 + 1e-12) + 1e-300
    gains = ortho_ref.ns_step_gains(coefficients, lo, hi)
    inner, outer = ortho_ref.ns_lipschitz(coefficients, lo, hi), ortho_ref.ns_lipschitz(coefficients, 0.0, hi)
    if not inner <= gains[0] <= outer * (1 + math.sqrt(U64)):
        raise RuntimeError(f"ns_step_gains: G_0 = {gains[0]!r} outside [ns_lipschitz(lo, hi), ns_lipschitz(0, hi)] = "
                           f"[{inner!r}, {outer!r}] on σ̂ ∈ [{lo!r}, {hi!r}]")
    return gains, ortho_ref.ns_step_magnitudes(coefficients, lo, hi)


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
    """Absolute tolerance on the singular values of ``ortho_verify.spectra.matrix_with_spectrum``
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


#: First-order validity of the polar-factor bound (DESIGN.md): σ_k/‖A‖₂ ≥ POLAR_VALIDITY·√k·u,
#: so that the backward error (a few √k·u·‖A‖₂ in practice) is at most ~1 % of σ_k and the
#: second-order term (relative size ‖ΔA‖₂/σ_k) is negligible against the first.
POLAR_VALIDITY = 100.0

#: Roundings in one scalar step p(y) = y·(a + y²·(b + c·y²)) as ``ortho_ref.ns_polynomial`` evaluates it.
SCALAR_STEP_ROUNDINGS = 6


def polar_tolerance(a, dtype="float64") -> float | None:
    """Frobenius tolerance for a polar factor computed in ``dtype`` by a backward-stable SVD
    (``ortho_ref.polar``, LAPACK gesdd) against the exact polar factor of ``a``:

        β·(2 + 3·‖A‖₂·κ_U(A)),   β = svd_residual_tolerance(shape, 1, dtype),
        κ_U = ``ortho_ref.polar_condition`` (2/(σ_n + σ_{n−1}) square, 1/σ_k rectangular)

    or None when the first-order bound does not apply: σ_k/‖A‖₂ < POLAR_VALIDITY·√k·u (DESIGN.md),
    where only property checks are meaningful (UᵀU = I, UH = A, H symmetric PSD).
    Derivation. The computed factors Ũ, Ṽ have ‖ŨᵀŨ − I‖_F ≤ β (likewise Ṽ) and residual
    ‖ŨΣ̃Ṽᵀ − A‖_F ≤ β‖A‖₂ (``svd_residual_tolerance``). Their nearest orthonormal U′, V′
    satisfy ‖Ũ − U′‖_F ≤ β, so U′Σ̃V′ᵀ = A + ΔA with ‖ΔA‖_F ≤ 3β‖A‖₂, and U′V′ᵀ = U_p(A + ΔA)
    is within κ_U·‖ΔA‖_F of U_p(A) to first order (Higham, Functions of Matrices, Thm. 8.9);
    replacing U′V′ᵀ by ŨṼᵀ adds 2β (the rounding of the product is inside β). With
    κ_U ≤ 1/σ_k this is DESIGN.md's c·u·(k + √k·‖A‖₂/σ_min) with c·√k·u = β, i.e. c from
    LAPACK's acceptance threshold and the d·u growth of the orthogonal transformations.
    Two computations compared with each other: add their two tolerances.
    Shapes: a (m, n) float. Raises: as ``ortho_ref.polar``; ValueError for an unknown dtype.
    """
    s = ortho_ref.singular_values(a)
    u = unit_roundoff(dtype)
    shape = np.shape(a)
    k = min(shape)
    if s[-1] < POLAR_VALIDITY * math.sqrt(k) * u * s[0] or s[0] == 0.0:
        return None
    beta = svd_residual_tolerance(shape, 1.0, dtype)
    return beta * (2.0 + 3.0 * float(s[0]) * ortho_ref.polar_condition(a))


def polar_hermitian_tolerance(shape: tuple[int, int], norm2: float, dtype="float64") -> float:
    """Frobenius tolerance for the Hermitian polar factor H = (AᵀA)^{1/2} computed in ``dtype``
    by a backward-stable SVD (``ortho_ref.polar_decomposition``) against the exact one:

        (3 + 3√2)·β·‖A‖₂,   β = svd_residual_tolerance(shape, 1, dtype), norm2 = ‖A‖₂

    Derivation. As in ``polar_tolerance``, V′Σ̃V′ᵀ = H(A + ΔA) with ‖ΔA‖_F ≤ 3β‖A‖₂; H is
    globally √2-Lipschitz in the Frobenius norm (Araki & Yamagami 1981,
    ‖|A| − |B|‖_F ≤ √2‖A − B‖_F; Higham, Functions of Matrices, Thm. 8.9), so no first-order
    condition is needed; replacing V′ by Ṽ (‖Ṽ − V′‖_F ≤ β) adds 2β‖A‖₂ and forming ṼΣ̃Ṽᵀ adds β‖A‖₂.
    Used for the property check U·H = A where ``polar_tolerance`` is None.
    """
    return (3.0 + 3.0 * math.sqrt(2.0)) * svd_residual_tolerance(shape, 1.0, dtype) * norm2


def polar_condition_tolerance(a, dtype="float64") -> float:
    """Absolute tolerance for ``ortho_ref.polar_condition(a)`` computed from float singular
    values against its exact value κ: κ·(κ·β·‖A‖₂ + 2u), β = svd_residual_tolerance(shape, 1, dtype).

    Derivation (first order): each computed singular value is within the SVD's backward error
    β‖A‖₂ of the exact one (Weyl). κ = 2/(σ_n + σ_{n−1}) moves by κ²/2·|Δ(σ_n + σ_{n−1})| ≤ κ²β‖A‖₂,
    κ = 1/σ_k by κ²β‖A‖₂; the sum and the division round twice (2u·κ). inf for inf κ.
    """
    kappa = ortho_ref.polar_condition(a)
    s0 = float(ortho_ref.singular_values(a)[0])
    return kappa * (kappa * svd_residual_tolerance(np.shape(a), 1.0, dtype) * s0 + 2 * unit_roundoff(dtype))


def ns_map_tolerance(a, coefficients, dtype="float64", *, safety: float = 1.0, eps: float = 1e-7,
                     eps_mode: str = "add") -> float:
    """Frobenius tolerance for ``ortho_ref.ns_map`` computed in ``dtype`` (SVD, then f on σ̂)
    against the exact U f(Σ̂) Vᵀ:

        G_0·(3β + (3 + C_NS·√(mn))·u)/s + SCALAR_STEP_ROUNDINGS·√k·u·Σ_{t=1}^{T} G_t·S_t
          + (2β + (1 + C_NS·√k)·k·u)·F

    with β = svd_residual_tolerance(shape, 1, dtype), s = safety, G_t, S_t the step gains and
    term sizes over the hull of σ̂ (as in ``ns_tolerance``), F = max_i |f(σ̂_i)|.
    Derivation (first order), three sources:
    (1) SVD: as in ``polar_tolerance``, Ũ Σ̃ Ṽᵀ is the exact SVD of A + ΔA, ‖ΔA‖_F ≤ 3β‖A‖₂, up
    to factors within β of orthonormal ones. The normalizer is ≥ s‖A‖_F ≥ s‖A‖₂, so the
    normalized input moves by ≤ 3β/s; the normalizer's own relative error (‖A‖_F as a sum of
    mn squares: C_NS·√(mn)·u, Higham & Mary 2019; then ·s, +eps, ÷: 3u) scales it by 1 + δ,
    a move of ≤ δ/s. The Fréchet derivative of X ↦ U f(Σ) Vᵀ is bounded by G_0 (Daleckii–Krein,
    ``ortho_ref.ns_step_gains``).
    (2) f evaluated per singular value: each step rounds SCALAR_STEP_ROUNDINGS times relative
    to its term sizes ≤ S_t, carried to the output by ≤ G_t; k independent values: √k.
    (3) Forming (U·f) Vᵀ: one scaling and inner products of length k, ≤ (1 + C_NS√k)·u per unit
    of ‖|U||F||Vᵀ|‖_F ≤ k·F; non-orthonormal Ũ, Ṽ: 2β·F.
    Shapes: a (m, n) float; coefficients (T, 3). Raises: as ``ortho_ref.ns_map``.
    """
    u = unit_roundoff(dtype)
    m, n = np.shape(a)
    k = min(m, n)
    sigma_hat = ortho_ref.normalized_singular_values(a, safety=safety, eps=eps, eps_mode=eps_mode)
    gains, sizes = _gains_and_sizes(sigma_hat, coefficients)
    f_max = float(np.max(np.abs(ortho_ref.ns_polynomial(sigma_hat, coefficients))))
    beta = svd_residual_tolerance((m, n), 1.0, dtype)
    svd_part = gains[0] * (3 * beta + (3 + C_NS * math.sqrt(m * n)) * u) / safety
    scalar_part = SCALAR_STEP_ROUNDINGS * math.sqrt(k) * u * float(np.dot(gains[1:], sizes))
    forming = (2 * beta + (1 + C_NS * math.sqrt(k)) * k * u) * f_max
    return float(svd_part + scalar_part + forming)


def mp_accuracy(shape: tuple[int, int], digits: int, scale: float = 1.0) -> float:
    """Frobenius distance allowed between an mpmath result (or its stored float64 hi + lo pair)
    and the exact value: √(mn)·scale·(10^-digits + 2⁻¹⁰⁶).

    Derivation: ``ortho_ref.mp`` returns every entry within 10^-digits·scale of the exact
    value (scale 1 for the polar factor, max(1, max|f|) for ns_map, max |entry| in general),
    and ``ortho_ref.to_hi_lo`` represents x as hi + lo to 2⁻¹⁰⁶|x| ≤ 2⁻¹⁰⁶·scale; over mn
    entries in the Frobenius norm: √(mn).
    """
    m, n = shape
    return math.sqrt(m * n) * scale * (10.0 ** -digits + 2.0 ** -106)


def mp_agreement_tolerance(a, function: str, coefficients=None, *, safety: float = 1.0, eps: float = 1e-7,
                           eps_mode: str = "add", digits: int = 50) -> float | None:
    """Tolerance for ‖float64 oracle − mpmath oracle‖_F (DESIGN.md: "float64 reference vs
    mpmath (≥ 50 digits): the float64 tolerance with u = 2⁻⁵³").

        function="polar":  polar_tolerance(a, "float64") + mp_accuracy(shape, digits)
                           (None where the polar bound is not first-order valid)
        function="ns_map": ns_map_tolerance(a, coefficients, "float64", ...) +
                           mp_accuracy(shape, digits, max(1, max|f(σ̂)|))

    The float64 part bounds the float64 oracle's distance to the exact value; the mpmath
    part bounds the mpmath result's (``mp_accuracy``); the triangle inequality adds them.
    Shapes: a (m, n) float. Raises: ValueError for an unknown ``function``.
    """
    shape = np.shape(a)
    if function == "polar":
        tol = polar_tolerance(a, "float64")
        return None if tol is None else tol + mp_accuracy(shape, digits)
    if function == "ns_map":
        sigma_hat = ortho_ref.normalized_singular_values(a, safety=safety, eps=eps, eps_mode=eps_mode)
        scale = max(1.0, float(np.max(np.abs(ortho_ref.ns_polynomial(sigma_hat, coefficients)))))
        return ns_map_tolerance(a, coefficients, "float64", safety=safety, eps=eps, eps_mode=eps_mode) + \
            mp_accuracy(shape, digits, scale)
    raise ValueError(f"function: expected 'polar' or 'ns_map', got {function!r}")


# --- AdamW and Lion ---
#
# Element-wise optimizers: per-entry absolute tolerances (arrays of the parameter's shape),
# first order in the unit roundoff. In torch the bias corrections, lr/(1 − β1ᵗ), 1 − lr·wd
# and 1 − β are Python floats (float64 whatever the parameter dtype), so their rounding is
# u64; the tensor operations round at the parameter dtype's u, and so does each such scalar
# when an operation converts it to the dtype (float32 "opmath" for bfloat16). ``u`` below is
# u + u64 (both sides of the comparison commit the same kinds of roundings; the oracle's
# formulas use no more operations than the fast side's).


def adamw_tolerances(ref: "ortho_ref.AdamWStep", weight, grad, exp_avg, *, lr: float, betas, eps: float,
                     dtype) -> dict:
    """Per-entry tolerances for (weight, exp_avg, exp_avg_sq) after one fast AdamW step vs
    ``ortho_ref.adamw_step`` (``ref``; weight, grad, exp_avg are the step's inputs).

    Derivation (t = ref.step, κᵢ = βᵢᵗ / (1 − βᵢᵗ), x = ref.update, d = √v/√(1 − β2ᵗ) + eps):
    - m = lerp(m₀, g, 1 − β1) or β1m₀ + (1 − β1)g: three roundings of terms bounded by
      |m₀| + |g| (cancellation possible) and the conversion of the weight: δm = 4u(|m₀| + |g|).
    - v = β2v₀ + (1 − β2)g²: on the (1 − β2)g² path its conversion, two products and the
      sum; all terms ≥ 0, so relative: δv = 4u·v.
    - 1 − βᵢᵗ: rounding of βᵢᵗ is amplified by the cancellation, relative (1 + κᵢ)·u64.
    - d: √v relative 2u (half of v's) + u; dividing by √(1 − β2ᵗ) (relative (1.5 + κ2/2)u64,
      then converted) + 2u; adding eps ≥ 0 (converted) + 2u: relative 7u + (1.5 + κ2/2)u64.
    - x·lr = (lr/(1 − β1ᵗ))·m/d: + u64 for lr/(1 − β1ᵗ), + 3u (convert, divide, multiply):
      δx = δm/((1 − β1ᵗ)·d) + |x|·(10u + (3.5 + κ1 + κ2/2)·2u64) (the scalars on both sides).
    - W' = W·(1 − lr·wd) − lr·x: the factor 2u64 per side and its conversion, multiply and
      subtract: δW = u(3|W| + lr|x|) + 4u64|W| + lr·δx.
    History: without the conversions of the scalars (first version: 3u, 5u, 7u, 2|W|) a sweep
    of 2000 random float32 steps exceeded the weight bound by 1.16×.
    First order: informative while (κ1 + κ2)·u64 and 10u are ≪ 1 (t = 1, β2 = 0.999: κ2 = 999);
    no underflow (g² and v normal numbers: the model above is relative).
    Source of the operation counts: torch ``_single_tensor_adam``; Higham, Accuracy and
    Stability, ch. 3 (model fl(a ∘ b) = (a ∘ b)(1 + δ), |δ| ≤ u).
    """
    u = unit_roundoff(dtype) + U64
    b1, b2 = (float(b) for b in betas)
    t = ref.step
    k1, k2 = b1**t / (1 - b1**t), b2**t / (1 - b2**t)
    bc1 = 1 - b1**t
    w0, g, m0 = (np.abs(np.asarray(a, dtype=np.float64)) for a in (weight, grad, exp_avg))
    x = np.abs(ref.update)
    d = np.sqrt(ref.exp_avg_sq) / math.sqrt(1 - b2**t) + eps
    d_m = 4 * u * (m0 + g)
    d_x = np.divide(d_m, bc1 * d, out=np.zeros_like(d_m), where=d > 0) + x * (10 * u + (3.5 + k1 + k2 / 2) * 2 * U64)
    d_w = u * (3 * w0 + lr * x) + 4 * U64 * w0 + lr * d_x
    return {"weight": d_w, "exp_avg": d_m, "exp_avg_sq": 4 * u * ref.exp_avg_sq}


def lion_tolerances(ref: "ortho_ref.LionStep", weight, grad, exp_avg, *, lr: float, dtype) -> dict:
    """Per-entry tolerances for (weight, exp_avg) after one fast Lion step vs
    ``ortho_ref.lion_step`` (``ref``; weight, grad, exp_avg are the step's inputs), and the
    ``sign_margin`` beyond which the two signs must agree.

    Derivation. c = lerp(m₀, g, 1 − β1) (fast) or β1m₀ + (1 − β1)g (oracle): three
    roundings each of terms bounded by |m₀| + |g| and the conversion of the weight, so
    |c_fast − c_ref| ≤ 4u(|m₀| + |g|) =: sign_margin; where |c_ref| > sign_margin,
    sign(c_fast) = sign(c_ref) exactly. The new momentum is the same interpolation with β2:
    δm = sign_margin. Where the signs agree, W' = W·(1 − lr·wd) − lr·s differs only by the
    factor (2u64 per side, then converted), the conversion of lr, the multiply and the
    subtraction: δW = u(3|W| + 2lr) + 4u64|W|. Where |c_ref| ≤ sign_margin the signs may
    differ (s ∈ {−1, 0, 1}), so δW gains 2·lr there: sign is discontinuous, no first-order
    bound exists.
    """
    u = unit_roundoff(dtype) + U64
    w0, g, m0 = (np.abs(np.asarray(a, dtype=np.float64)) for a in (weight, grad, exp_avg))
    margin = 4 * u * (m0 + g)
    d_w = u * (3 * w0 + 2 * lr) + 4 * U64 * w0 + np.where(np.abs(ref.interpolated) > margin, 0.0, 2 * lr)
    return {"weight": d_w, "exp_avg": margin, "sign_margin": margin}


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


def _factor_roundoff(dtype) -> float:
    """u_f + u64: QR and Cholesky run in float32 for bfloat16 / float16, else in the dtype."""
    return min(unit_roundoff(dtype), UNIT_ROUNDOFF["float32"]) + U64


def _matmul_roundoff(dtype, inner: int) -> float:
    """ε with ‖fl(AB) − AB‖_F ≤ ε·‖A‖_F‖B‖_F for an inner dimension ``inner``.

    One rounding of each output (u) plus the accumulation, in float32 for bfloat16 / float16
    matmuls (CPU and GPU) or in the dtype itself, with Higham & Mary's probabilistic factor
    C_NS·√inner; entrywise |fl(AB) − AB| ≤ ε|A||B| and ‖|A||B|‖_F ≤ ‖A‖_F‖B‖_F.
    """
    return unit_roundoff(dtype) + C_NS * math.sqrt(inner) * min(unit_roundoff(dtype), UNIT_ROUNDOFF["float32"]) + U64


def _qr_model(rows: int, rank: int, method: str, dtype, sketch_condition: float | None,
              oversample: float) -> tuple[float, float]:
    """(ρ, ω): relative backward residual ‖PR − Y‖_F/‖Y‖₂ and orthogonality ‖PᵀP − I‖_F of P
    computed by ``method`` (see ``qr_factor_tolerance``); Cholesky methods take the max with
    Householder's, which is their fallback."""
    u = _factor_roundoff(dtype)
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
    R (n', r) and M_new: ‖(I − PPᵀ)(M_new − B)‖_F and ‖PᵀM_new − μPᵀB‖_F (DESIGN "What error
    feedback guarantees").

    ``ef_tol``: ``error_feedback_tolerance`` for M_new = B − (1−μ)PRᵀ itself, mapped by I − PPᵀ or
    Pᵀ (2-norms ≤ 1 + ω, ω = ``orthogonality`` ≥ ‖PᵀP − I‖_F). The identities then fail only by
    P's orthogonality defect — (I − PPᵀ)PRᵀ = P(I − PᵀP)Rᵀ and PᵀPRᵀ − Rᵀ = (PᵀP − I)Rᵀ, so
    (1−μ)·(1 + ω)·ω·‖R‖_F — and, in the second, by the rounding of R = fl(BᵀP) in ``dtype``:
    (1−μ)·ε_mm(rows)·‖B‖_F·‖P‖_F (``_matmul_roundoff``). Forming the projections in float64 (two
    products of inner dimension ≤ rows, ‖P‖_F = ``p_norm``) adds 2·ε_mm(rows)·p_norm·(1 + ω)·(‖M_new‖_F + ‖B‖_F).
    """
    w = 1 + orthogonality
    return (w * ef_tol + (1 - mu) * (w * orthogonality * r_norm + _matmul_roundoff(dtype, rows) * b_norm * p_norm)
            + 2 * _matmul_roundoff("float64", rows) * p_norm * w * (m_norm + b_norm))


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
    return _cond(np.linalg.solve(r_s.T, y.T).T)


def _cond(a: np.ndarray) -> float:
    sv = np.linalg.svd(a, compute_uv=False)
    return float(sv[0] / sv[-1]) if sv[-1] > 0 else math.inf


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
    - Y = BQ: ‖ΔY‖_F ≤ e_B‖Q‖₂ + ‖B‖₂δ_Q + ε_mm(n')·‖|B||Q|‖_F (``_matmul_roundoff``; with N
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
    u_f = _factor_roundoff(dtype)
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
        kappa = _cond(y)
        y2 = float(np.linalg.norm(y, 2))
        d_y = e_b * np.linalg.norm(q, 2) + b2 * d_q + _matmul_roundoff(dtype, npr) * widen * np.linalg.norm(abs_b @ np.abs(q))
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
        d_r = b2 * d_p + e_b + _matmul_roundoff(dtype, mp) * widen * np.linalg.norm(abs_b.T @ np.abs(p)) + reduce
        q = ortho_ref.dion_right_factor(r_mat, right_factor, epsilon)
        if right_factor == "column_norm":
            rn = float(np.linalg.norm(r_mat, axis=0).min())
            d_q = 2 * d_r / rn + 3 * u_f * math.sqrt(r) if rn > 0 else math.inf
        else:
            r2 = float(np.linalg.norm(r_mat, 2))
            d_q = qr_factor_tolerance(_cond(r_mat), npr, r, "householder", dtype,
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
        d_p * r2 + d_r + _matmul_roundoff(dtype, r) * np.linalg.norm(np.abs(p) @ np.abs(r_mat).T))
    if replicas > 1:
        d_m += replicas * U64 * (replica_norm + coef * rf)
    s = lr * ref.lr_scale
    qf, q2 = float(np.linalg.norm(q)), float(np.linalg.norm(q, 2))
    df = float(np.linalg.norm(p @ q.T))
    d_d = d_p * q2 + d_q + _matmul_roundoff(dtype, r) * np.linalg.norm(np.abs(p) @ np.abs(q).T) + u_c * (qf + df)
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


# --- verify product: error feedback and user checks ---
#
# Dion's error-feedback invariants (ortho_verify.error_feedback) measured on the fast side's own
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
    R = fl(BᵀP) has ‖R − BᵀP‖_F ≤ ``_matmul_roundoff``(m')·‖B‖_F‖P‖_F (Higham & Mary 2019), so
    c(ε_mm‖B‖_F p + δ_o‖R‖_F) + √(1+δ_o)e. Both add the float64 evaluation, 2C_NS√m'·u64·(‖B‖_F + c·p‖R‖_F).
    Arguments: Frobenius norms of the fast B, P, R; rows = m', rank = r.
    """
    d_o = orthonormality_tolerance(rows, rank, dtype)
    c = (1.0 - mu) if error_feedback else mu
    e = error_feedback_tolerance(b_norm if error_feedback else 0.0, p_norm, r_norm,
                                 mu if error_feedback else 1.0 - mu, rows, rank, dtype)
    evaluation = 2 * C_NS * math.sqrt(rows) * U64 * (b_norm + c * p_norm * r_norm)
    outside = c * math.sqrt(1 + d_o) * d_o * r_norm + (1 + d_o) * e + evaluation
    inside = c * (_matmul_roundoff(dtype, rows) * b_norm * p_norm + d_o * r_norm) + math.sqrt(1 + d_o) * e + evaluation
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
    step starts from (t = 1..steps; default 1). History: with κ = 1 a 11 × 6 full-rank input from a
    Gaussian Q_0 (κ₂ = 5.6e4) measured tan θ_1 = 6.6e-12 against a bound of 7.9e-14. The oracle's U_r is exact for a perturbation
    of relative size C_NS·√d·u64, adding C_NS·√d·u64·σ₁/(σ_r − σ_{r+1}) (Wedin 1972) to each τ_t.
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
    (``ortho_verify.error_feedback.observed_step_rows``): no P, and none of P's conditioning.

    Working orientation (m', n'), rank r; O = (decay·W − W_new)/step (step = lr·s, decay = 1 − lr·wd)
    is P Qᵀ with Q (n', r) the stored right factor; B = M + G from the stored momentum and the gradient.
    ``dtype``: the coarsest of the parameter, momentum and Q dtypes (every rounding is counted with
    its u). ``weight_norms`` = (‖W‖_F, ‖W_new‖_F); ``sigma_r`` = σ_r(O).
    Derivation. δ_o = ``qr_orthogonality_tolerance``(m', r) ≥ ‖PᵀP − I‖_F (P factored in float32 for
    bfloat16 / float16, then rounded), so ‖P‖₂ ≤ p₂ = √(1 + δ_o), ‖P‖_F ≤ p_F = √(r + √r·δ_o).
    - The update D = fl(P·fl(Q)ᵀ): ‖D − PQᵀ‖_F ≤ e_D = (u·p₂ + ε_mm(r)·p_F)·‖Q‖_F (``_matmul_roundoff``),
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
    e_d = (u * p2 + _matmul_roundoff(dtype, r) * pf) * qf
    w_prev, w_new = weight_norms
    e_o = e_d + u * (decay * w_prev + w_new + 2 * step * (p2 * qf + e_d)) / step
    eval64 = 2 * _matmul_roundoff("float64", rows)
    update = q2 * q2 * d_o + 2 * p2 * q2 * e_o + e_o * e_o + eval64 * (pf * qf + e_o) ** 2
    c, kept = (1 - mu, 1.0) if error_feedback else (mu, 0.0)
    sin_theta = min(1.0, e_o / sigma_r) if sigma_r > 0 else 1.0
    momentum = b_norm * ((kept + c) * u + c * (1 + u) * (d_o + sin_theta) + c * p2 * pf * (
        _matmul_roundoff(dtype, rows) + _matmul_roundoff(dtype, r)) + 2 * u * (kept + c * p2 * p2)
        + eval64 * math.sqrt(r))
    return {"update": update, "momentum": momentum, "update_error": e_o, "sin_theta": sin_theta, "orthogonality": d_o}


#: Baseline regression margin of ``ortho-verify --baseline``: a check regresses when its
#: error/tolerance ratio r_new > max(BASELINE_GROWTH·r_old, BASELINE_FLOOR).
#: Why 2: a seeded run is reproducible on one machine (any change of r is a code change), but
#: another machine or BLAS build rounds differently. Measured with ``ortho-verify --quick`` at 1
#: vs 2 torch threads (same inputs, different reduction orders): 337 of 1130 ratios changed;
#: those above 0.01 by at most 1.37×, smaller ones by up to 123×. Why 0.1: a check using a
#: tenth of its tolerance has an order of magnitude of headroom, and below that the ratio of a
#: few roundings moves by large factors without meaning anything. With (2, 0.1) no check of
#: that experiment was flagged.
BASELINE_GROWTH = 2.0
BASELINE_FLOOR = 0.1


# --- Muon options ---


def cautious_weight_decay_tolerance(weight: np.ndarray, update_ref: np.ndarray, ns_tol: float, lr: float,
                                    weight_decay: float) -> float:
    """Extra Frobenius tolerance for the weight of a Muon step with cautious weight decay,
    added to ``muon_tolerance`` (float32 / float64 compute).

        lr · weight_decay · ‖W ⊙ 1{|O_ref| ≤ ns_tol}‖_F

    Derivation. Cautious weight decay (Chen et al. 2025, arXiv 2510.12402) decays entry (i, j)
    only where sign(O_ij)·sign(W_ij) ≥ 0; both sides use the same W (the weight before the
    step) and exact sign tests, so the masks can differ only where the fast update O_fast and
    the reference O_ref have different signs (rounding O to the parameter dtype keeps the sign
    or gives 0, which decays like the ≥). That needs |O_ref,ij| ≤ |O_fast,ij − O_ref,ij| ≤
    ‖O_fast − O_ref‖_F ≤ ns_tol (``ns_tolerance`` at the momentum-mixed input). On such an
    entry the two weights differ by the decay lr·wd·|W_ij| in addition to the rounding that
    ``muon_tolerance`` bounds; elsewhere the masks agree and ``muon_tolerance`` applies as for
    decoupled decay. The set is usually empty (the term is then 0 and the check is as sharp as
    for decoupled decay).
    Shapes: weight, update_ref (m, n) float64 -> float.
    """
    w = np.asarray(weight, dtype=np.float64)
    ambiguous = np.abs(np.asarray(update_ref, dtype=np.float64)) <= ns_tol
    return lr * weight_decay * float(np.linalg.norm(np.where(ambiguous, w, 0.0)))


# --- sharding equivalence ---

#: DESIGN.md's layout contract: relative Frobenius difference between a sharded step and the
#: one-process step on the full tensors.
SHARDED_RTOL = {"float64": 1e-12, "float32": 1e-5}


def sharded_tolerance(dtype) -> float:
    """Relative Frobenius bound ‖X_sharded − X_one‖_F / ‖X_one‖_F for a distributed Muon or Dion
    step (weights, momenta, Q; the largest over matrices and steps) against the same optimizer in
    one process on the full tensors (``ortho_verify.sharding``, ``ortho-verify sharding``).

    DESIGN.md's layout contract, float64 1e-12 (≈ 9000·u) and float32 1e-5 (≈ 168·u): a
    requirement, not a fitted number. Derivation of when it holds. A sharded step performs the
    one-process arithmetic except that every sum over a sharded dimension is split into local
    partial sums plus an all-reduce (the same terms in another order), and Dion orthonormalizes
    sharded rows of P by the same algorithm on gathered rows (Householder) or an all-reduced
    Gram matrix (CholeskyQR). So X_sharded and X_one are two computed values of one exact step X,
    and ‖X_sharded − X_one‖ ≤ ‖X_sharded − X‖ + ‖X_one − X‖: two forward errors of the same
    algorithm in the same precision, each bounded as for one process.

    Dion, one step: Y = BQ and R = BᵀP carry relative errors ≲ √d·u (Higham & Mary 2019,
    probabilistic; d ≤ max(m, n) the summed length); the Q factor of Y amplifies a perturbation
    of Y by κ(Y) (Higham, *Accuracy and Stability*, Thm 19.4 and the QR perturbation bound
    ‖ΔP‖ ≲ κ(Y)‖ΔY‖/‖Y‖; CholeskyQR2 the same order while κ(Y) ≪ u^(-1/2)); the column
    normalization Q_j = R_j/‖R_j‖ amplifies column j's error by ‖B‖₂/‖R_j‖. So the relative
    difference is ≲ 2c·√d·u·κ(BQ)·‖B‖₂/min_j‖R_j‖ (c a small constant): within 1e-12 in float64
    while √d·κ·‖B‖/‖R_j‖ ≲ 4·10³ (e.g. d = 10⁴ with κ·‖B‖/‖R_j‖ ≤ 40), within 1e-5 in float32
    only while it is ≲ 80 — the checked inputs (d ≤ 24, κ(BQ) ≤ 5.3, ‖B‖₂/min‖R_j‖ ≤ 2.5 at
    the first step) are in that regime; a large or ill-conditioned float32 problem is not
    covered by this argument, the float64 one has 50× more room.

    Muon: FSDP, DDP, TP "duplicated" and "blockwise" orthogonalize the very matrices one process
    does with the same calls, and the rest is elementwise: equal bitwise (``ortho_verify.sharding``
    requires it). TP "distributed" all-reduces the Gram matrix of every Newton–Schulz step; a
    relative √d·u perturbation at step t is amplified by the remaining steps' first-order gain
    G_t (``ortho_ref.ns_step_gains``), and the all-reduced ‖X‖_F² perturbs the normalization
    (gain G_0): ≲ C_NS·√d·u·Σ_t G_t. Over the whole band σ̂ ∈ [1e-3, 1] (jordan×5: 470.5 +
    192.8) that is 2·√24·6e-8·663 ≈ 3.9e-4 in float32, above the contract; at the spectra of the
    checked first-step gradients (σ̂ ∈ [0.055, 0.71]: G_0 ≤ 33, Σ_{t≥1} G_t ≤ 27) ≈ 3.5e-5, still a
    worst case. The float32 contract for this mode is therefore a measured fact, not implied.

    Measured (``ortho-verify sharding --world-size 1 2 4 8``: every layout, matrices 16×24,
    13×7, 5×11, 3 steps): float64 ≤ 1.4e-15 (12·u), float32 ≤ 7.8e-7 (13·u), both in Dion's Q;
    the one-process float32 forward error of the same Dion steps (against float64) is 4.3e-7 in
    Q, so the sharded difference is the size of two forward errors, as derived. Muon
    "distributed": 1.2e-16 / 6.7e-8, 150× inside the float32 contract (500× below the bound at
    the inputs' spectra). docs/tolerances.md repeats this; docs/layouts.md has every layout.
    Raises: ValueError for a dtype other than float64 / float32.
    """
    name = str(dtype).removeprefix("torch.")
    if name not in SHARDED_RTOL:
        raise ValueError(f"dtype: the sharding contract covers float64 and float32, got {dtype!r}")
    return SHARDED_RTOL[name]
