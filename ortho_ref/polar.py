"""Polar decomposition by SVD, float64 (the oracle's reference for the polar factor)."""

from __future__ import annotations

import numpy as np
import scipy.linalg

from ._validate import as_matrix


def svd(a) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Thin SVD A = U diag(s) Vᵀ by LAPACK gesdd (gesvd if gesdd does not converge).

    Shapes: a (m, n) float -> U (m, k), s (k,) descending, Vt (k, n), float64, k = min(m, n).
    Raises: as ``polar``.
    """
    return _svd(as_matrix(a, "a"))


def _svd(a: np.ndarray):
    """Thin SVD with LAPACK gesdd, falling back to gesvd if gesdd does not converge."""
    try:
        return scipy.linalg.svd(a, full_matrices=False, lapack_driver="gesdd", check_finite=False)
    except np.linalg.LinAlgError:  # pragma: no cover - gesdd failure is rare
        return scipy.linalg.svd(a, full_matrices=False, lapack_driver="gesvd", check_finite=False)


def polar(a) -> np.ndarray:
    """Polar factor U_p = U Vᵀ of A = U Σ Vᵀ (thin SVD).

    Shapes: a (m, n) float -> (m, n) float64. For m >= n the columns of the result are
    orthonormal (U_pᵀ U_p = I_n); for m < n its rows are (U_p U_pᵀ = I_m). When A is rank
    deficient the polar factor is not unique; this returns the one built from the SVD.
    Source: Higham, Functions of Matrices (2008), Thm. 8.1; scipy.linalg.polar.
    Raises: TypeError for non-float dtypes; ValueError if ``a`` is not 2-D, empty, or not finite.
    Contract: exact up to the float64 SVD (backward stable, LAPACK gesdd).
    """
    u, _, vt = svd(a)
    return u @ vt


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
