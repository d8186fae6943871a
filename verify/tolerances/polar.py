"""Tolerances of the oracle itself: SVD residuals, prescribed spectra, the polar factor, the
matrix map ``ns_map`` and the agreement of the float64 oracle with the mpmath one (docs/tolerances.md).
"""

from __future__ import annotations

import math

import numpy as np

import ortho_ref

from .newton_schulz import gains_and_sizes
from .roundoff import C_NS, U64, unit_roundoff

__all__ = [
    "LAPACK_SVD_TOLMUL", "POLAR_VALIDITY", "SCALAR_STEP_ROUNDINGS", "mp_accuracy", "mp_agreement_tolerance",
    "ns_map_tolerance", "polar_condition_tolerance", "polar_hermitian_tolerance", "polar_tolerance",
    "prescribed_spectrum_tolerance", "svd_residual_tolerance",
]


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
    Measured (2026-11-21, the project's 2-core CPU machine, seeded sweeps of random inputs): without the
    TOLMUL term a 3 × 3 residual of 29u exceeds the bound, and 20000 inputs up to 32 × 32 reach 3.3 times
    it; with it, 20000 inputs up to 64 × 64 give a worst ratio of 0.39 (residual) and 0.14 (orthonormality).
    """
    u = unit_roundoff(dtype)
    m, n = shape
    return (LAPACK_SVD_TOLMUL + C_NS * (3 + max(m, n))) * math.sqrt(min(m, n)) * u * scale


def prescribed_spectrum_tolerance(shape: tuple[int, int], sigma_max: float = 1.0) -> float:
    """Absolute tolerance on the singular values of ``ortho_verify.inputs.spectra.matrix_with_spectrum``
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


#: First-order validity of the polar-factor bound (docs/design.md, "Tolerances"): σ_k/‖A‖₂ ≥ POLAR_VALIDITY·√k·u,
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

    or None when the first-order bound does not apply: σ_k/‖A‖₂ < POLAR_VALIDITY·√k·u (docs/design.md, "Tolerances"),
    where only property checks are meaningful (UᵀU = I, UH = A, H symmetric PSD).
    Derivation. The computed factors Ũ, Ṽ have ‖ŨᵀŨ − I‖_F ≤ β (likewise Ṽ) and residual
    ‖ŨΣ̃Ṽᵀ − A‖_F ≤ β‖A‖₂ (``svd_residual_tolerance``). Their nearest orthonormal U′, V′
    satisfy ‖Ũ − U′‖_F ≤ β, so U′Σ̃V′ᵀ = A + ΔA with ‖ΔA‖_F ≤ 3β‖A‖₂, and U′V′ᵀ = U_p(A + ΔA)
    is within κ_U·‖ΔA‖_F of U_p(A) to first order (Higham, Functions of Matrices, Thm. 8.9);
    replacing U′V′ᵀ by ŨṼᵀ adds 2β (the rounding of the product is inside β). With
    κ_U ≤ 1/σ_k this is the c·u·(k + √k·‖A‖₂/σ_min) of docs/design.md ("Tolerances") with c·√k·u = β, i.e. c from
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
    gains, sizes = gains_and_sizes(sigma_hat, coefficients)
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
    """Tolerance for ‖float64 oracle − mpmath oracle‖_F (docs/design.md, "Tolerances": "float64 reference vs
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
