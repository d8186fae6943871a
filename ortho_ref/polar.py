"""Polar decomposition by SVD, float64 (the oracle's reference for the polar factor).

``digits=`` dispatches to the mpmath tier ``ortho_ref.mp``; ``svd`` lives in ``ortho_ref.linalg``
(re-exported here, its first home).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.linalg

from . import mp
from ._validate import as_matrix
from .linalg import svd

__all__ = ["polar", "polar_condition", "polar_decomposition", "singular_values", "svd"]


def polar(a, digits: int | None = None) -> np.ndarray:
    """Polar factor U_p = U Vᵀ of A = U Σ Vᵀ (thin SVD).

    Shapes: a (m, n) float -> (m, n) float64. For m >= n the columns of the result are
    orthonormal (U_pᵀ U_p = I_n); for m < n its rows are (U_p U_pᵀ = I_m). When A is rank
    deficient the polar factor is not unique; this returns the one built from the SVD.
    With ``digits`` (an int in [16, 1000], m, n <= 64) the result is computed by mpmath and
    returned as an (m, n) object array of ``mpmath.mpf`` exact to ``digits`` decimal digits
    (``ortho_ref.mp.polar``: singular values below σ₁·10^-(digits+10) count as zero there).
    Source: Higham, Functions of Matrices (2008), Thm. 8.1; scipy.linalg.polar.
    Raises: TypeError for non-float dtypes; ValueError if ``a`` is not 2-D, empty, or not finite;
    with ``digits``: TypeError for a non-integer, ValueError outside [16, 1000] or for m or n > 64.
    Contract: exact up to the float64 SVD (backward stable, LAPACK gesdd); with ``digits``,
    within 10^-digits of the exact value in every entry.
    """
    if digits is not None:
        return mp.polar(a, digits)
    u, _, vt = svd(a)
    return u @ vt


def polar_condition(a) -> float:
    """Absolute condition number of the polar factor in the Frobenius norm (real perturbations).

        m = n:   2 / (σ_n + σ_{n−1})        (0 for a nonzero 1 × 1 matrix: sign(a) is locally constant)
        m ≠ n:   1 / σ_k,  k = min(m, n)
        inf when rank(A) < k (σ_k = 0: the polar factor is not unique, hence not continuous).

    To first order ‖U_p(A + E) − U_p(A)‖_F ≤ polar_condition(A)·‖E‖_F, with equality for some E.
    Derivation: with A = W Σ Vᵀ and Ẽ = Wᵀ E V, the derivative is W K Vᵀ with
    K_ij = (Ẽ_ij − Ẽ_ji)/(σ_i + σ_j) for i ≠ j, K_ii = 0, plus, for m > n, the block
    (I − W Wᵀ) E V Σ⁻¹ Vᵀ (norm up to 1/σ_n); a skew pair (i, j) = (n−1, n) gives 2/(σ_{n−1} + σ_n).
    A wide A is the transpose of a tall one (U_p(Aᵀ) = U_p(A)ᵀ).
    Shapes: a (m, n) float -> float (units: 1 / units of A).
    Source: Higham, Functions of Matrices (2008), Thm. 8.9 (after Kenney & Laub 1991).
    Raises: as ``polar``.
    """
    s = singular_values(a)
    m, n = np.shape(a)
    if s[-1] == 0.0:
        return math.inf
    if m != n:
        return float(1.0 / s[-1])
    return 0.0 if n == 1 else float(2.0 / (s[-1] + s[-2]))


def polar_decomposition(a) -> tuple[np.ndarray, np.ndarray]:
    """Right polar decomposition A = U_p H with H = V Σ Vᵀ = (AᵀA)^{1/2}.

    Shapes: a (m, n) float -> (U_p (m, n) float64, H (n, n) float64, symmetric positive
    semidefinite). Same convention as ``scipy.linalg.polar(a, side="right")``.
    Source: Higham, Functions of Matrices (2008), Thm. 8.1.
    Raises: as ``polar``.
    """
    u, s, vt = svd(a)
    h = (vt.T * s) @ vt
    return u @ vt, 0.5 * (h + h.T)


def singular_values(a) -> np.ndarray:
    """Singular values of ``a`` in descending order, float64, shape (min(m, n),).

    Raises: as ``polar``.
    """
    return scipy.linalg.svd(as_matrix(a, "a"), compute_uv=False, lapack_driver="gesdd", check_finite=False)
