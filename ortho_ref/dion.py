"""Reference Dion step (Ahn et al., arXiv 2504.05295, Algorithm 1), float64, one matrix."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ._validate import as_like, as_matrix, check_scalar


def dion_rank(m: int, n: int, rank_fraction: float = 1.0, rank_multiple_of: int = 1) -> int:
    """r = min(ceil_to_multiple(rank_multiple_of, rank_fraction·min(m, n)), m, n), at least 1.

    Source: microsoft/dion ``Dion`` (rank_fraction, rank_multiple_of); OLMo-core DionConfig.
    Raises: ValueError for rank_fraction outside (0, 1], rank_multiple_of < 1, or m, n < 1.
    """
    if m < 1 or n < 1:
        raise ValueError(f"m, n: expected positive dimensions, got ({m}, {n})")
    rank_fraction = check_scalar(rank_fraction, "rank_fraction", low=0.0, high=1.0, low_open=True)
    if int(rank_multiple_of) != rank_multiple_of or rank_multiple_of < 1:
        raise ValueError(f"rank_multiple_of: expected an integer >= 1, got {rank_multiple_of!r}")
    k = int(rank_multiple_of)
    r = k * math.ceil(rank_fraction * min(m, n) / k)
    return max(1, min(r, m, n))


def dion_transposed(m: int, n: int) -> bool:
    """Dion works on the transpose when m < n. A function of the global shape only."""
    return m < n


def q_shape(m: int, n: int, r: int) -> tuple[int, int]:
    """Shape of Dion's right factor Q for an (m, n) weight at rank r: (min(m, n), r)."""
    return (min(m, n), r)


def orthonormalize(y: np.ndarray) -> np.ndarray:
    """Thin QR (Householder, LAPACK geqrf/orgqr) with signs fixed so that diag(R) > 0.

    Shapes: y (m, r), m >= r -> P (m, r) float64 with PᵀP = I. A zero diagonal entry of R
    (rank-deficient y) keeps its column's sign (sign(0) := +1).
    """
    q, r = np.linalg.qr(y, mode="reduced")
    signs = np.where(np.diag(r) < 0, -1.0, 1.0)
    return q * signs


def column_normalize(r: np.ndarray, epsilon: float) -> np.ndarray:
    """R[:, j] / (‖R[:, j]‖₂ + epsilon) for each column j (Dion's Q update)."""
    return r / (np.linalg.norm(r, axis=0, keepdims=True) + epsilon)


class DionStep(NamedTuple):
    """Result of ``dion_step``. In the working orientation (the transpose when m < n):
    B (m', n') = M + G, P (m', r), R (n', r); ``weight``, ``momentum`` are (m, n),
    ``Q`` (n', r) = (min(m, n), r)."""

    weight: np.ndarray
    momentum: np.ndarray
    Q: np.ndarray
    P: np.ndarray
    R: np.ndarray
    B: np.ndarray
    lr_scale: float


def dion_step(
    weight,
    grad,
    momentum,
    Q,
    *,
    lr: float,
    mu: float = 0.95,
    weight_decay: float = 0.0,
    epsilon: float = 1e-8,
    power_iters: int = 1,
    error_feedback: bool = True,
) -> DionStep:
    """One reference Dion step with the rank r taken from Q's shape.

    With B = M + G in the working orientation (Bᵀ when m < n; the choice depends on the
    global shape only), Q (n', r):
        P = orth(B Q)               thin QR, diag(R) > 0; power_iters > 1 repeats Q ← colnorm(BᵀP)
        R = Bᵀ P
        M = B − (1 − μ) P Rᵀ        error feedback (``error_feedback=False``: M = μ P Rᵀ,
                                    the rank-r residual is discarded)
        Q = R / (‖R[:, j]‖₂ + ε)    column normalization
        X = (1 − lr·wd) X − lr·√(m/n)·P Qᵀ   with (m, n) the weight's own shape
    If B = 0: P = 0, R = 0, Q kept, M = B, and only the weight decay applies.

    Shapes: weight, grad, momentum (m, n); Q (min(m, n), r) with 1 <= r <= min(m, n).
    Source: Ahn et al., arXiv 2504.05295, Algorithm 1; microsoft/dion ``dion_simple.py``.
    Raises: TypeError / ValueError for non-float, non-2-D, empty or non-finite arrays, a Q of
    the wrong shape, lr < 0, mu outside [0, 1], weight_decay < 0, epsilon < 0, power_iters < 1.
    """
    w = as_matrix(weight, "weight")
    g = as_like(grad, "grad", w.shape)
    m_old = as_like(momentum, "momentum", w.shape)
    m, n = w.shape
    q = np.asarray(Q)
    if q.ndim != 2 or q.shape[0] != min(m, n) or not 1 <= q.shape[1] <= min(m, n):
        raise ValueError(f"Q: expected shape (min(m, n), r) = ({min(m, n)}, r) with 1 <= r <= {min(m, n)}, got {q.shape}")
    q = as_like(q, "Q", q.shape)
    lr = check_scalar(lr, "lr", low=0.0)
    mu = check_scalar(mu, "mu", low=0.0, high=1.0)
    weight_decay = check_scalar(weight_decay, "weight_decay", low=0.0)
    epsilon = check_scalar(epsilon, "epsilon", low=0.0)
    if int(power_iters) != power_iters or power_iters < 1:
        raise ValueError(f"power_iters: expected an integer >= 1, got {power_iters!r}")

    transposed = dion_transposed(m, n)
    b_full = m_old + g
    b = b_full.T if transposed else b_full
    scale = math.sqrt(m / n)
    decayed = w * (1.0 - lr * weight_decay)
    if not np.any(b):
        r = q.shape[1]
        zero_p = np.zeros((b.shape[0], r))
        return DionStep(decayed, b_full, q, zero_p, np.zeros((b.shape[1], r)), b, scale)

    for it in range(int(power_iters)):
        p = orthonormalize(b @ q)
        r_mat = b.T @ p
        if it + 1 < power_iters:
            q = column_normalize(r_mat, epsilon)
    if error_feedback:
        m_new = b - (1.0 - mu) * (p @ r_mat.T)
    else:
        m_new = mu * (p @ r_mat.T)
    q_new = column_normalize(r_mat, epsilon)
    delta = p @ q_new.T
    if transposed:
        m_new, delta = m_new.T, delta.T
    return DionStep(decayed - (lr * scale) * delta, m_new, q_new, p, r_mat, b, scale)
