"""Reference Dion (Ahn et al., arXiv 2504.05295, Algorithm 1), float64, one matrix.

Every variant the fast side offers, as plain numpy/scipy: the QR methods and right factors of
``ortho_ref.dion_qr`` (re-exported here), power iterations, the ideal step with the best rank-r
approximation (truncated SVD), and the compressed data-parallel synchronization over a list of
replicas.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np

from ._validate import as_like, as_matrix, check_choice, check_scalar
from .dion_qr import (  # noqa: F401  (re-exported: Dion's factorizations)
    CQR2_GRAM_DEVIATION,
    QR_METHODS,
    RCQR_OVERSAMPLE,
    RIGHT_FACTORS,
    cholesky_qr_pass,
    column_normalize,
    dion_right_factor,
    gaussian_sketch,
    orthonormalize,
    sketch_rows,
)
from .linalg import svd


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


class DionReplicatedStep(NamedTuple):
    """Result of ``dion_step_replicated``: per replica ``weights`` and ``momenta`` (m, n); the
    shared ``Q`` (n', r), ``P`` (m', r), ``R`` (n', r) and the replicas' B_i (m', n') in the
    working orientation."""

    weights: tuple
    momenta: tuple
    Q: np.ndarray
    P: np.ndarray
    R: np.ndarray
    B: tuple
    lr_scale: float


def _check_hyper(lr, mu, weight_decay, epsilon, power_iters, right_factor) -> tuple[float, float, float, float]:
    if int(power_iters) != power_iters or power_iters < 1:
        raise ValueError(f"power_iters: expected an integer >= 1, got {power_iters!r}")
    check_choice(right_factor, "right_factor", RIGHT_FACTORS)
    return (check_scalar(lr, "lr", low=0.0), check_scalar(mu, "mu", low=0.0, high=1.0),
            check_scalar(weight_decay, "weight_decay", low=0.0), check_scalar(epsilon, "epsilon", low=0.0))


def _mean(xs: list) -> np.ndarray:
    """(x₁ + … + x_N)/N summed left to right (an all-reduce with op AVG); one term: x₁ exactly."""
    total = xs[0].copy()
    for x in xs[1:]:
        total += x
    return total / len(xs)


def _finish(weights, bs, p, r_mat, q_new, *, lr, mu, weight_decay, error_feedback, transposed, scale):
    """M_i = B_i − (1−μ)PRᵀ (or μPRᵀ), X_i = (1 − lr·wd)X_i − lr·s·PQᵀ, back in (m, n) layout."""
    pr = p @ r_mat.T
    momenta = [b - (1.0 - mu) * pr if error_feedback else mu * pr for b in bs]
    delta = p @ q_new.T
    if transposed:
        momenta, delta = [mom.T for mom in momenta], delta.T
    new_w = [w * (1.0 - lr * weight_decay) - (lr * scale) * delta for w in weights]
    return new_w, momenta


def dion_step_replicated(
    weights: Sequence,
    grads: Sequence,
    momenta: Sequence,
    Q,
    *,
    lr: float,
    mu: float = 0.95,
    weight_decay: float = 0.0,
    epsilon: float = 1e-8,
    power_iters: int = 1,
    error_feedback: bool = True,
    qr_method: str = "householder",
    oversample: float = RCQR_OVERSAMPLE,
    rng: np.random.Generator | None = None,
    right_factor: str = "column_norm",
) -> DionReplicatedStep:
    """One Dion step on N data-parallel replicas with compressed synchronization.

    Replica i holds its weight X_i, momentum M_i and gradient G_i; all share Q. In the working
    orientation each forms B_i = M_i + G_i, and the replicas all-reduce (mean) the small
    matrices instead of G:
        P = orth(mean_i B_i Q)       R = mean_i B_iᵀ P        (each power iteration)
        M_i ← B_i − (1 − μ) P Rᵀ     Q ← right factor of R    X_i ← (1 − lr·wd)X_i − lr·√(m/n)·P Qᵀ
    By linearity mean_i M_i equals the momentum of one process fed the mean gradient, and the
    weight update is the same on every replica (docs/design.md, "Dion": compressed data-parallel sync).
    If every B_i is zero: P = 0, R = 0, Q kept, M_i = B_i, only the weight decay applies.
    The sketch of ``randomized_cholesky_qr`` is drawn once per power iteration from ``rng``
    (one shared generator: in a real run every replica seeds it identically).

    Shapes: weights, grads, momenta: N >= 1 arrays (m, n); Q (min(m, n), r), 1 <= r <= min(m, n).
    Source: Ahn et al., arXiv 2504.05295 (the distributed algorithm's data-parallel
    compression); microsoft/dion ``dion.py`` (``compressed_all_reduce`` of P and R) and README
    ("Compressed Data-Parallel Gradient Sync").
    Raises: TypeError / ValueError for lists of different lengths or shapes, non-float, non-2-D,
    empty or non-finite arrays, a Q of the wrong shape, lr < 0, mu outside [0, 1],
    weight_decay < 0, epsilon < 0, power_iters < 1, an unknown qr_method / right_factor, or a
    randomized qr_method without ``rng``.
    """
    if not (len(weights) == len(grads) == len(momenta) >= 1):
        raise ValueError(f"weights, grads, momenta: expected lists of the same length N >= 1, "
                         f"got {len(weights)}, {len(grads)}, {len(momenta)}")
    return _replicated_step(weights, grads, momenta, Q, ("weights[{}]", "grads[{}]", "momenta[{}]"), lr=lr, mu=mu,
                            weight_decay=weight_decay, epsilon=epsilon, power_iters=power_iters,
                            error_feedback=error_feedback, qr_method=qr_method, oversample=oversample, rng=rng,
                            right_factor=right_factor)


def _replicated_step(weights, grads, momenta, Q, names, *, lr, mu, weight_decay, epsilon, power_iters,
                     error_feedback, qr_method, oversample, rng, right_factor) -> DionReplicatedStep:
    """Validation (argument names from ``names``, formatted with the replica index) and the step."""
    w_name, g_name, m_name = names
    m, n = as_matrix(weights[0], w_name.format(0)).shape
    ws = [as_like(w, w_name.format(i), (m, n)) for i, w in enumerate(weights)]
    gs = [as_like(g, g_name.format(i), (m, n)) for i, g in enumerate(grads)]
    ms = [as_like(mo, m_name.format(i), (m, n)) for i, mo in enumerate(momenta)]
    q = np.asarray(Q)
    if q.ndim != 2 or q.shape[0] != min(m, n) or not 1 <= q.shape[1] <= min(m, n):
        raise ValueError(f"Q: expected shape (min(m, n), r) = ({min(m, n)}, r) with 1 <= r <= {min(m, n)}, got "
                         f"{q.shape}")
    q = as_like(q, "Q", q.shape)
    lr, mu, weight_decay, epsilon = _check_hyper(lr, mu, weight_decay, epsilon, power_iters, right_factor)
    check_choice(qr_method, "qr_method", QR_METHODS)
    if qr_method == "randomized_cholesky_qr":
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng: randomized_cholesky_qr needs a numpy.random.Generator, got {type(rng).__name__}")
        sketch_rows(q.shape[1], oversample)  # validates oversample

    transposed = dion_transposed(m, n)
    b_full = [mo + g for mo, g in zip(ms, gs)]
    bs = [b.T for b in b_full] if transposed else b_full
    scale = math.sqrt(m / n)
    r = q.shape[1]
    if not any(np.any(b) for b in bs):
        decayed = tuple(w * (1.0 - lr * weight_decay) for w in ws)
        return DionReplicatedStep(decayed, tuple(b_full), q, np.zeros((bs[0].shape[0], r)),
                                  np.zeros((bs[0].shape[1], r)), tuple(bs), scale)
    for it in range(int(power_iters)):
        p = orthonormalize(_mean([b @ q for b in bs]), qr_method, rng=rng, oversample=oversample)
        r_mat = _mean([b.T @ p for b in bs])
        q = dion_right_factor(r_mat, right_factor, epsilon)
    new_w, new_m = _finish(ws, bs, p, r_mat, q, lr=lr, mu=mu, weight_decay=weight_decay,
                           error_feedback=error_feedback, transposed=transposed, scale=scale)
    return DionReplicatedStep(tuple(new_w), tuple(new_m), q, p, r_mat, tuple(bs), scale)


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
    qr_method: str = "householder",
    oversample: float = RCQR_OVERSAMPLE,
    rng: np.random.Generator | None = None,
    right_factor: str = "column_norm",
) -> DionStep:
    """One reference Dion step with the rank r taken from Q's shape.

    With B = M + G in the working orientation (Bᵀ when m < n; the choice depends on the
    global shape only), Q (n', r):
        P = orth(B Q)               thin QR, diag(R) > 0, by ``qr_method`` (``orthonormalize``);
                                    power_iters > 1 repeats Q ← right factor of BᵀP
        R = Bᵀ P
        M = B − (1 − μ) P Rᵀ        error feedback (``error_feedback=False``: M = μ P Rᵀ,
                                    the rank-r residual is discarded)
        Q = R / (‖R[:, j]‖₂ + ε)    column normalization (``right_factor="qr"``: Q = orth(R))
        X = (1 − lr·wd) X − lr·√(m/n)·P Qᵀ   with (m, n) the weight's own shape
    If B = 0: P = 0, R = 0, Q kept, M = B, and only the weight decay applies.
    This is ``dion_step_replicated`` with one replica (bit for bit).

    Shapes: weight, grad, momentum (m, n); Q (min(m, n), r) with 1 <= r <= min(m, n).
    Source: Ahn et al., arXiv 2504.05295, Algorithm 1; microsoft/dion ``dion_simple.py``.
    Raises: as ``dion_step_replicated``.
    """
    out = _replicated_step([weight], [grad], [momentum], Q, ("weight", "grad", "momentum"), lr=lr, mu=mu,
                           weight_decay=weight_decay, epsilon=epsilon, power_iters=power_iters,
                           error_feedback=error_feedback, qr_method=qr_method, oversample=oversample, rng=rng,
                           right_factor=right_factor)
    return DionStep(out.weights[0], out.momenta[0], out.Q, out.P, out.R, out.B[0], out.lr_scale)


def dion_ideal_step(
    weight,
    grad,
    momentum,
    *,
    rank: int,
    lr: float,
    mu: float = 0.95,
    weight_decay: float = 0.0,
    epsilon: float = 1e-8,
    error_feedback: bool = True,
    right_factor: str = "column_norm",
) -> DionStep:
    """Dion's step with P, R from the best rank-r approximation of B (Eckart–Young), for comparisons.

    In the working orientation B = U Σ Vᵀ (thin SVD): P = U[:, :r] (each column's entry of
    largest magnitude made positive), R = BᵀP (= V_r Σ_r); then M, Q and X exactly as in
    ``dion_step``. This is the fixed point Dion's power iteration approaches when B is held
    fixed (subspace iteration on BBᵀ), so ‖P_dion P_dionᵀ − P Pᵀ‖ measures how far one step is
    from it. If B = 0: P = 0, R = 0, Q = 0 (there is no previous Q), M = B, only weight decay.

    Shapes: weight, grad, momentum (m, n); rank 1 <= r <= min(m, n) -> ``DionStep`` with
    Q (min(m, n), r).
    Source: Ahn et al., arXiv 2504.05295, Sec. 2 (Dion as a low-rank approximation of the
    orthonormalized update); Eckart & Young (1936).
    Raises: TypeError / ValueError as ``dion_step``, and for a rank outside [1, min(m, n)].
    """
    w = as_matrix(weight, "weight")
    m, n = w.shape
    g = as_like(grad, "grad", (m, n))
    m_old = as_like(momentum, "momentum", (m, n))
    if int(rank) != rank or not 1 <= rank <= min(m, n):
        raise ValueError(f"rank: expected an integer in [1, {min(m, n)}], got {rank!r}")
    lr, mu, weight_decay, epsilon = _check_hyper(lr, mu, weight_decay, epsilon, 1, right_factor)
    transposed = dion_transposed(m, n)
    b_full = m_old + g
    b = b_full.T if transposed else b_full
    r = int(rank)
    scale = math.sqrt(m / n)
    if not np.any(b):
        zeros_p, zeros_r = np.zeros((b.shape[0], r)), np.zeros((b.shape[1], r))
        return DionStep(w * (1.0 - lr * weight_decay), b_full, zeros_r, zeros_p, zeros_r, b, scale)
    u = svd(b)[0][:, :r]
    p = u * np.where(u[np.argmax(np.abs(u), axis=0), np.arange(r)] < 0, -1.0, 1.0)
    r_mat = b.T @ p
    q = dion_right_factor(r_mat, right_factor, epsilon)
    new_w, new_m = _finish([w], [b], p, r_mat, q, lr=lr, mu=mu, weight_decay=weight_decay,
                           error_feedback=error_feedback, transposed=transposed, scale=scale)
    return DionStep(new_w[0], new_m[0], q, p, r_mat, b, scale)
