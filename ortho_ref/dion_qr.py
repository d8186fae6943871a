"""Dion's factorizations: the thin QR with diag(R) > 0 by three methods, and the right factor.

The three QR methods of microsoft/dion (Householder, CholeskyQR2, randomized CholeskyQR), the
Gaussian sketch of the randomized one, and the two right factors (column normalization of the
paper, or an orthonormal Q by QR). ``ortho_ref.dion`` builds the step on them (docs/math.md, §5.3).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.linalg

from ._validate import as_matrix, check_choice, check_scalar

__all__ = [
    "CQR2_GRAM_DEVIATION", "QR_METHODS", "RCQR_OVERSAMPLE", "RIGHT_FACTORS", "cholesky_qr_pass", "column_normalize",
    "dion_right_factor", "gaussian_sketch", "orthonormalize", "sketch_rows",
]

QR_METHODS = ("householder", "cholesky_qr", "randomized_cholesky_qr")
RIGHT_FACTORS = ("column_norm", "qr")

#: Sketch rows per column of Y for the randomized CholeskyQR (microsoft/dion ``rcqr_oversample``).
RCQR_OVERSAMPLE = 1.25

#: CholeskyQR2 is accepted only when the Gram matrix of its first pass, G = Y₁ᵀY₁, has
#: ‖G − I‖_F ≤ this; then κ(Y₁) ≤ √3 and the second pass is orthonormal to O(u)
#: (Yamamoto et al., ETNA 44, 2015). Past it — κ(Y) beyond about u^(-1/2) — the first pass
#: has lost orthogonality (‖Y₁ᵀY₁ − I‖ ≈ u·κ(Y)²) and the factorization falls back to Householder.
CQR2_GRAM_DEVIATION = 0.5


def sketch_rows(rank: int, oversample: float = RCQR_OVERSAMPLE) -> int:
    """Rows k = ceil(oversample·r) of the Gaussian sketch of the randomized CholeskyQR.

    microsoft/dion rounds k up to a multiple of 128 (a GPU tile); here k is the plain oversampled
    rank.

    Parameters
    ----------
    rank : int
        r, the columns of the matrix to factor, >= 1.
    oversample : float, default 1.25
        Sketch rows per column, >= 1 (``RCQR_OVERSAMPLE``, microsoft/dion ``rcqr_oversample``).

    Returns
    -------
    int
        k >= r.

    Raises
    ------
    ValueError
        If `oversample` < 1 (the sketch needs k >= r rows) or `rank` is not an integer >= 1.

    References
    ----------
    O. Balabanov, "Randomized Cholesky QR factorizations", arXiv 2210.09953, 2022; Y. Fan, Y. Guo,
    T. Lin, "A novel randomized XR-based preconditioned CholeskyQR algorithm", 2021; microsoft/dion.

    Examples
    --------
    >>> from ortho_ref import sketch_rows
    >>> sketch_rows(10), sketch_rows(3, oversample=2.0)
    (13, 6)
    """
    oversample = check_scalar(oversample, "oversample", low=1.0)
    if int(rank) != rank or rank < 1:
        raise ValueError(f"rank: expected an integer >= 1, got {rank!r}")
    return math.ceil(oversample * int(rank))


def gaussian_sketch(rng: np.random.Generator, k: int, rows: int) -> np.ndarray:
    """Gaussian sketch S with i.i.d. N(0, 1/k) entries, scaled so that E‖Sx‖² = ‖x‖².

    The scaling of microsoft/dion's sketch for the randomized CholeskyQR.

    Parameters
    ----------
    rng : numpy.random.Generator
        The source of the draws (``rng.standard_normal``).
    k : int
        Rows of the sketch (``sketch_rows``).
    rows : int
        Columns of the sketch: the rows of the matrix it multiplies.

    Returns
    -------
    (k, rows) float64 ndarray
        S, dimensionless.

    Raises
    ------
    TypeError
        If `rng` is not a ``numpy.random.Generator``.

    References
    ----------
    O. Balabanov, "Randomized Cholesky QR factorizations", arXiv 2210.09953, 2022; microsoft/dion.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import gaussian_sketch
    >>> s = gaussian_sketch(np.random.default_rng(0), 4000, 3)
    >>> s.shape, bool(abs(np.linalg.norm(s @ np.ones(3)) ** 2 / 3 - 1) < 0.1)
    ((4000, 3), True)
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    return rng.standard_normal((k, rows)) / math.sqrt(k)


def _householder(y: np.ndarray) -> np.ndarray:
    q, r = np.linalg.qr(y, mode="reduced")
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)


def cholesky_qr_pass(y: np.ndarray, gram: np.ndarray) -> np.ndarray | None:
    """One CholeskyQR pass: Y R⁻¹ with R the upper Cholesky factor of ``gram`` (= YᵀY for a plain pass).

    Shapes: y (rows, r) float64, gram (r, r) float64 symmetric -> (rows, r) float64, or None if the
    Cholesky factorization fails or the result is not finite (the callers then fall back to Householder).
    Source: Yamamoto et al., ETNA 44 (2015), CholeskyQR; microsoft/dion ``orthogonalize``.
    """
    try:
        r = scipy.linalg.cholesky(gram, lower=False, check_finite=False)
        p = scipy.linalg.solve_triangular(r, y.T, trans="T", lower=False, check_finite=False).T
    except (np.linalg.LinAlgError, ValueError):
        return None
    return p if np.all(np.isfinite(p)) else None


def _cholesky_qr2(y: np.ndarray) -> np.ndarray | None:
    p1 = cholesky_qr_pass(y, y.T @ y)
    if p1 is None:
        return None
    gram = p1.T @ p1
    if np.linalg.norm(gram - np.eye(gram.shape[0])) > CQR2_GRAM_DEVIATION:
        return None
    return cholesky_qr_pass(p1, gram)


def _randomized_cholesky_qr(y: np.ndarray, rng: np.random.Generator, oversample: float) -> np.ndarray | None:
    rows, r = y.shape
    k = sketch_rows(r, oversample)
    if k >= rows:  # the sketch would not compress: factor Y itself
        return None
    r_s = np.linalg.qr(gaussian_sketch(rng, k, rows) @ y, mode="r")
    r_s = r_s * np.where(np.diag(r_s) < 0, -1.0, 1.0)[:, None]  # diag(R_s) > 0, so diag(R) > 0 at the end
    try:
        y1 = scipy.linalg.solve_triangular(r_s, y.T, trans="T", lower=False, check_finite=False).T
    except (np.linalg.LinAlgError, ValueError):
        return None
    return cholesky_qr_pass(y1, y1.T @ y1) if np.all(np.isfinite(y1)) else None


def orthonormalize(y, method: str = "householder", *, rng: np.random.Generator | None = None,
                   oversample: float = RCQR_OVERSAMPLE) -> np.ndarray:
    """Q factor P of the thin QR factorization Y = P R with diag(R) > 0, by one of ``QR_METHODS``.

    "householder": LAPACK geqrf/orgqr, then the signs of P's columns fixed (sign(0) := +1).
    "cholesky_qr": CholeskyQR2, R₁ = chol(YᵀY), Y₁ = Y R₁⁻¹, and once more on Y₁.
    "randomized_cholesky_qr": R_s from the QR of the sketch S Y (k = ``sketch_rows(r, oversample)``
    rows), Y₁ = Y R_s⁻¹, then one CholeskyQR pass on Y₁ (microsoft/dion qr_method="rcqr").
    For a full-rank Y all three give the same P in exact arithmetic. Past each method's regime
    (CholeskyQR2: κ(Y) beyond about u^(-1/2), detected by ‖Y₁ᵀY₁ − I‖_F > ``CQR2_GRAM_DEVIATION``;
    a failed Cholesky factorization or solve) the result is Householder's, as is the randomized
    one when k >= rows (docs/math.md, §5.3). microsoft/dion has no such fallback for "rcqr" and
    keeps diag(R) of arbitrary sign.

    Parameters
    ----------
    y : (rows, r) array_like of float
        The matrix, rows >= r >= 1, finite.
    method : {"householder", "cholesky_qr", "randomized_cholesky_qr"}, default "householder"
        The factorization.
    rng : numpy.random.Generator, optional
        The sketch's generator; required by "randomized_cholesky_qr", unused otherwise.
    oversample : float, default 1.25
        Sketch rows per column for "randomized_cholesky_qr", >= 1.

    Returns
    -------
    (rows, r) float64 ndarray
        P, with orthonormal columns (to O(u) for each method in its regime).

    Raises
    ------
    TypeError
        If `y` has a non-float dtype, or `method` is "randomized_cholesky_qr" and `rng` is not a
        ``numpy.random.Generator``.
    ValueError
        If `y` is not 2-D, is empty, holds NaN or Inf, or has rows < r; if `method` is unknown.

    References
    ----------
    Y. Yamamoto, Y. Nakatsukasa, Y. Yanagisawa, T. Fukaya, "Roundoff error analysis of the
    CholeskyQR2 algorithm", ETNA 44, 2015; O. Balabanov, "Randomized Cholesky QR factorizations",
    arXiv 2210.09953, 2022; microsoft/dion ``orthogonalize``.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import orthonormalize
    >>> y = np.random.default_rng(0).standard_normal((8, 3))
    >>> p = orthonormalize(y)
    >>> bool(np.allclose(p.T @ p, np.eye(3))), bool(np.all(np.diag(p.T @ y) > 0))
    (True, True)
    >>> bool(np.allclose(orthonormalize(y, "cholesky_qr"), p))
    True
    """
    y = as_matrix(y, "y")
    if y.shape[0] < y.shape[1]:
        raise ValueError(f"y: expected shape (rows, r) with rows >= r, got {y.shape}")
    check_choice(method, "method", QR_METHODS)
    p = None
    if method == "cholesky_qr":
        p = _cholesky_qr2(y)
    elif method == "randomized_cholesky_qr":
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng: randomized_cholesky_qr needs a numpy.random.Generator, got {type(rng).__name__}")
        p = _randomized_cholesky_qr(y, rng, oversample)
    return _householder(y) if p is None else p


def column_normalize(r: np.ndarray, epsilon: float) -> np.ndarray:
    """Dion's column normalization: Q[:, j] = R[:, j] / (‖R[:, j]‖₂ + epsilon).

    Parameters
    ----------
    r : (n', r) array_like of float
        The matrix R = BᵀP of a Dion step; finite.
    epsilon : float
        Dion's ε, >= 0, in the units of R's column norms (``dion_step`` defaults to 1e-8).

    Returns
    -------
    (n', r) float64 ndarray
        Q, each column of norm ‖R[:, j]‖₂ / (‖R[:, j]‖₂ + ε) <= 1.

    Raises
    ------
    TypeError
        If `r` has a non-float dtype.
    ValueError
        If `r` is not 2-D, is empty or holds NaN or Inf; if `epsilon` is not a finite number
        >= 0; or if `epsilon` = 0 and a column of `r` is zero (0/0).

    References
    ----------
    K. Ahn, B. Xu, N. Abreu, J. Langford, "Dion: Distributed Orthonormalized Updates",
    arXiv 2504.05295, 2025, Algorithm 1 (ColNorm); microsoft/dion ``dion_simple.py``.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import column_normalize
    >>> column_normalize(np.array([[3.0, 0.0], [4.0, 2.0]]), 0.0).tolist()
    [[0.6, 0.0], [0.8, 1.0]]
    """
    r = as_matrix(r, "r")
    epsilon = check_scalar(epsilon, "epsilon", low=0.0)
    norms = np.linalg.norm(r, axis=0, keepdims=True)
    if epsilon == 0.0 and not np.all(norms > 0):
        raise ValueError(f"epsilon: 0 with a zero column of r (columns {np.flatnonzero(norms == 0).tolist()}) gives "
                         "0/0; expected epsilon > 0")
    return r / (norms + epsilon)


def dion_right_factor(r: np.ndarray, right_factor: str = "column_norm", epsilon: float = 1e-8) -> np.ndarray:
    """Dion's new right factor Q from R = BᵀP: column normalization or an orthonormal Q by QR.

    "column_norm": Q = R / (‖R[:, j]‖₂ + ε) (Dion, Algorithm 1). "qr": Q = orth(R), the Householder
    Q factor with diag > 0 (Orth-Dion; the sign convention is ours); then P Qᵀ has all its r nonzero
    singular values equal to 1. The next step's P is the same in exact arithmetic: the two Q differ
    by an upper-triangular factor with positive diagonal, which orth(B Q) absorbs.

    Parameters
    ----------
    r : (n', r) array_like of float
        R = BᵀP; finite (with rows >= columns for "qr").
    right_factor : {"column_norm", "qr"}, default "column_norm"
        The rule.
    epsilon : float, default 1e-8
        ε of "column_norm", >= 0; unused by "qr".

    Returns
    -------
    (n', r) float64 ndarray
        Q.

    Raises
    ------
    TypeError
        If `r` has a non-float dtype.
    ValueError
        If `right_factor` is unknown, or as ``column_normalize`` / ``orthonormalize`` for `r` and
        `epsilon`.

    References
    ----------
    K. Ahn, B. Xu, N. Abreu, J. Langford, "Dion: Distributed Orthonormalized Updates",
    arXiv 2504.05295, 2025, Algorithm 1; T. Nakamori et al., "Orth-Dion: Eliminating Geometric
    Mismatch in Distributed Low-Rank Spectral Optimization", arXiv 2605.16341, 2026.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import dion_right_factor
    >>> r = np.random.default_rng(0).standard_normal((5, 2))
    >>> q = dion_right_factor(r, "qr")
    >>> bool(np.allclose(q.T @ q, np.eye(2)))
    True
    >>> bool(np.allclose(np.linalg.norm(dion_right_factor(r, epsilon=0.0), axis=0), 1.0))
    True
    """
    check_choice(right_factor, "right_factor", RIGHT_FACTORS)
    return column_normalize(r, epsilon) if right_factor == "column_norm" else _householder(r)
