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

    microsoft/dion rounds k up to a multiple of 128 (a GPU tile); here k is the plain
    oversampled rank, as in Balabanov (2022) / Fan, Guo, Lin (2021).
    Raises: ValueError for oversample < 1 (the sketch needs k >= r rows) or rank < 1.
    """
    oversample = check_scalar(oversample, "oversample", low=1.0)
    if int(rank) != rank or rank < 1:
        raise ValueError(f"rank: expected an integer >= 1, got {rank!r}")
    return math.ceil(oversample * int(rank))


def gaussian_sketch(rng: np.random.Generator, k: int, rows: int) -> np.ndarray:
    """S (k, rows) with i.i.d. N(0, 1/k) entries drawn from ``rng`` (scaled as microsoft/dion,
    so that ‖Sx‖ ≈ ‖x‖). Raises: TypeError if ``rng`` is not a numpy Generator."""
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
    """Q factor P of the thin QR Y = P R with diag(R) > 0, by one of ``QR_METHODS``.

    ``householder``: LAPACK geqrf/orgqr, then the signs of P's columns fixed (sign(0) := +1).
    ``cholesky_qr``: CholeskyQR2 — R₁ = chol(YᵀY), Y₁ = Y R₁⁻¹, and once more on Y₁.
    ``randomized_cholesky_qr``: R_s from the QR of the sketch S Y (S Gaussian,
    k = ``sketch_rows(r, oversample)`` rows, from ``rng``), Y₁ = Y R_s⁻¹, then one CholeskyQR
    pass on Y₁ (microsoft/dion ``orthogonalize``, qr_method="rcqr").
    All three give the same P in exact arithmetic (the thin QR with diag(R) > 0 is unique for a
    full-rank Y; Cholesky factors have positive diagonals and R_s is sign-fixed).

    Numerics. One CholeskyQR pass is orthonormal only to ≈ u·κ(Y)² (it squares the condition
    number); CholeskyQR2 is orthonormal to O((m r + r²)·u) when κ(Y) ≲ u^(-1/2) (Yamamoto,
    Nakatsukasa, Yanagisawa, Fukaya, ETNA 44, 2015); the sketch preconditions Y to κ(Y R_s⁻¹)
    = O(1) with high probability for κ(Y) ≲ u⁻¹ (Balabanov 2022; Fan, Guo, Lin 2021). Past
    these regimes the method falls back to Householder — like a numerics library, rather than
    returning a non-orthonormal P: CholeskyQR2 when a Cholesky factorization fails, the result
    is not finite, or the first pass left ‖Y₁ᵀY₁ − I‖_F > ``CQR2_GRAM_DEVIATION``; the randomized
    method when a Cholesky factorization or triangular solve fails. It also factors Y directly
    when k >= rows (the sketch would not compress). microsoft/dion has no such fallback for
    "rcqr" (its "cqr" falls back to "rcqr"); it keeps diag(R) of arbitrary sign.

    Shapes: y (rows, r) with rows >= r -> P (rows, r) float64.
    Raises: TypeError / ValueError for a non-float, non-2-D, empty or non-finite y, rows < r,
    an unknown method, or a randomized method without a numpy Generator ``rng``.
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
    """R[:, j] / (‖R[:, j]‖₂ + epsilon) for each column j (Dion's Q update).

    Shapes: r (n', r) float -> (n', r) float64; epsilon a scalar >= 0 (Dion's ε, default 1e-8
    in ``dion_step``), in the units of R's column norms.
    Source: Ahn et al., arXiv 2504.05295, Algorithm 1 (Q ← ColNorm(R)); microsoft/dion
    ``dion_simple.py`` (``R / (R.norm(dim=0) + epsilon)``).
    Raises: TypeError for a non-float ``r``; ValueError if ``r`` is not 2-D, empty or not
    finite, if ``epsilon`` is not a finite number >= 0, or if epsilon = 0 and a column of R is
    zero (0/0).
    """
    r = as_matrix(r, "r")
    epsilon = check_scalar(epsilon, "epsilon", low=0.0)
    norms = np.linalg.norm(r, axis=0, keepdims=True)
    if epsilon == 0.0 and not np.all(norms > 0):
        raise ValueError(f"epsilon: 0 with a zero column of r (columns {np.flatnonzero(norms == 0).tolist()}) gives "
                         "0/0; expected epsilon > 0")
    return r / (norms + epsilon)


def dion_right_factor(r: np.ndarray, right_factor: str = "column_norm", epsilon: float = 1e-8) -> np.ndarray:
    """Dion's new right factor from R = BᵀP (n', r).

    ``column_norm``: Q = R / (‖R[:, j]‖₂ + ε) (Ahn et al. 2504.05295, Algorithm 1).
    ``qr``: Q = orth(R), the Householder Q factor with diag > 0 (Orth-Dion, arXiv 2605.16341).
    That the paper's "right factor by QR" is this sign-fixed Householder Q of R is our reading,
    to be confirmed against the paper (it was not in our sources). Then P Qᵀ has all its
    r nonzero singular values equal to 1. P is unchanged in exact arithmetic: Q = R T⁻¹ and
    R D⁻¹ differ by an upper-triangular factor with positive diagonal, which orth(B Q) absorbs.
    Shapes: r (n', r) -> (n', r) float64. Raises: ValueError for an unknown ``right_factor``.
    """
    check_choice(right_factor, "right_factor", RIGHT_FACTORS)
    return column_normalize(r, epsilon) if right_factor == "column_norm" else _householder(r)
