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
    """Polar factor U_p = W Vᵀ of A = W Σ Vᵀ (thin SVD), in float64 or to a given number of digits.

    For m >= n the columns of U_p are orthonormal (U_pᵀ U_p = I_n), for m < n its rows are
    (U_p U_pᵀ = I_m). U_p is the orthogonal factor of the right polar decomposition A = U_p H and the
    nearest matrix with orthonormal columns (rows) to A in every unitarily invariant norm. When A is
    rank deficient the polar factor is not unique; this returns the one built from the SVD.

    Parameters
    ----------
    a : (m, n) array_like of float16, float32 or float64
        The matrix; m, n >= 1, finite.
    digits : int, optional
        Default None: float64 by the LAPACK SVD. An int in [16, 1000] (and m, n <= 64): computed by
        mpmath (``ortho_ref.mp.polar``) at the float64 value of `a`, exact to `digits` decimal digits
        in every entry; singular values below σ₁·10^-(digits + 10) count as zero there.

    Returns
    -------
    (m, n) float64 ndarray or (m, n) object ndarray of mpmath.mpf
        The polar factor, dimensionless; exact up to the backward-stable float64 SVD (LAPACK gesdd),
        or within 10^-digits of the exact value in every entry with `digits`.

    Raises
    ------
    TypeError
        If `a` has a non-float dtype, or `digits` is not an integer.
    ValueError
        If `a` is not 2-D, is empty or holds NaN or Inf; with `digits`, if it is outside [16, 1000]
        or m or n exceeds 64.

    References
    ----------
    N. J. Higham, Functions of Matrices: Theory and Computation, SIAM, 2008, Thm. 8.1 and
    Sec. 8.1; ``scipy.linalg.polar``.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import polar
    >>> a = np.array([[2.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    >>> u = polar(a)
    >>> bool(np.allclose(u.T @ u, np.eye(2)))
    True
    >>> bool(np.allclose(polar(np.diag([2.0, 5.0])), np.eye(2)))
    True
    """
    if digits is not None:
        return mp.polar(a, digits)
    u, _, vt = svd(a)
    return u @ vt


def polar_condition(a) -> float:
    """Absolute condition number of the polar factor in the Frobenius norm, for real perturbations.

    With σ_1 >= ... >= σ_k the singular values of A, k = min(m, n)::

        m = n:   2 / (σ_n + σ_{n-1})     (0 for a nonzero 1 × 1 matrix: sign(a) is locally constant)
        m ≠ n:   1 / σ_k
        inf      when σ_k = 0 (the polar factor is not unique, hence not continuous).

    To first order ‖U_p(A + E) − U_p(A)‖_F <= polar_condition(A)·‖E‖_F, with equality for some E
    (the derivation is in docs/math.md, §1.1).

    Parameters
    ----------
    a : (m, n) array_like of float16, float32 or float64
        The matrix; m, n >= 1, finite.

    Returns
    -------
    float
        The condition number, in 1 / (units of `a`); ``math.inf`` for a rank-deficient `a`.

    Raises
    ------
    TypeError
        If `a` has a non-float dtype.
    ValueError
        If `a` is not 2-D, is empty or holds NaN or Inf.

    References
    ----------
    N. J. Higham, Functions of Matrices: Theory and Computation, SIAM, 2008, Thm. 8.9; C. Kenney,
    A. J. Laub, "Polar decomposition and matrix sign function condition estimates", SIAM J. Sci.
    Stat. Comput. 12(3), 1991.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import polar_condition
    >>> polar_condition(np.diag([4.0, 2.0, 1.0]))
    0.6666666666666666
    >>> polar_condition(np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]))
    inf
    """
    s = singular_values(a)
    m, n = np.shape(a)
    if s[-1] == 0.0:
        return math.inf
    if m != n:
        return float(1.0 / s[-1])
    return 0.0 if n == 1 else float(2.0 / (s[-1] + s[-2]))


def polar_decomposition(a) -> tuple[np.ndarray, np.ndarray]:
    """Right polar decomposition A = U_p H, with H = V Σ Vᵀ = (AᵀA)^(1/2).

    The same convention as ``scipy.linalg.polar(a, side="right")``; U_p is ``polar(a)``.

    Parameters
    ----------
    a : (m, n) array_like of float16, float32 or float64
        The matrix; m, n >= 1, finite.

    Returns
    -------
    u : (m, n) float64 ndarray
        The polar factor, dimensionless.
    h : (n, n) float64 ndarray
        Symmetric positive semidefinite, in the units of `a` (symmetrized exactly).

    Raises
    ------
    TypeError
        If `a` has a non-float dtype.
    ValueError
        If `a` is not 2-D, is empty or holds NaN or Inf.

    References
    ----------
    N. J. Higham, Functions of Matrices: Theory and Computation, SIAM, 2008, Thm. 8.1;
    ``scipy.linalg.polar``.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import polar_decomposition
    >>> a = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    >>> u, h = polar_decomposition(a)
    >>> u.shape, h.shape
    ((3, 2), (2, 2))
    >>> bool(np.allclose(u @ h, a)), bool(np.all(np.linalg.eigvalsh(h) > 0))
    (True, True)
    """
    u, s, vt = svd(a)
    h = (vt.T * s) @ vt
    return u @ vt, 0.5 * (h + h.T)


def singular_values(a) -> np.ndarray:
    """Singular values of a matrix in descending order, in float64.

    Computed by LAPACK ``gesdd`` without the singular vectors.

    Parameters
    ----------
    a : (m, n) array_like of float16, float32 or float64
        The matrix; m, n >= 1, finite.

    Returns
    -------
    (min(m, n),) float64 ndarray
        σ_1 >= ... >= σ_k >= 0, in the units of `a`.

    Raises
    ------
    TypeError
        If `a` has a non-float dtype.
    ValueError
        If `a` is not 2-D, is empty or holds NaN or Inf.

    References
    ----------
    E. Anderson et al., LAPACK Users' Guide, 3rd ed., SIAM, 1999 (``dgesdd``), through
    ``scipy.linalg.svd``.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import singular_values
    >>> singular_values(np.array([[0.0, 2.0], [1.0, 0.0]])).tolist()
    [2.0, 1.0]
    """
    return scipy.linalg.svd(as_matrix(a, "a"), compute_uv=False, lapack_driver="gesdd", check_finite=False)
