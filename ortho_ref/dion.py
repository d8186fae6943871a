"""Reference Dion (Ahn et al., arXiv 2504.05295, Algorithm 1), float64, one matrix.

Every variant the fast side offers, as plain numpy/scipy: the QR methods and right factors of
``ortho_ref.dion_qr`` and the shapes of ``ortho_ref.dion_shapes`` (both re-exported here), power
iterations, and the compressed data-parallel synchronization over a list of replicas. The ideal
step with the best rank-r approximation (truncated SVD) is ``ortho_ref.dion_ideal``.
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
from .dion_shapes import dion_rank, dion_transposed, q_shape  # noqa: F401  (re-exported: Dion's shapes)


class DionStep(NamedTuple):
    """Result of ``dion_step`` and ``dion_ideal_step``, float64; (m', n') is the working orientation.

    Parameters
    ----------
    weight : (m, n) float64 ndarray
        X after the step.
    momentum : (m, n) float64 ndarray
        M after the step (error feedback included).
    Q : (n', r) float64 ndarray
        The new right factor, (min(m, n), r).
    P : (m', r) float64 ndarray
        The orthonormal left factor of the step (zeros if B = 0).
    R : (n', r) float64 ndarray
        BᵀP (zeros if B = 0).
    B : (m', n') float64 ndarray
        M + G before the step, transposed when m < n.
    lr_scale : float
        √(m/n), the multiplier of lr applied to P Qᵀ.

    See Also
    --------
    dion_step : The step that returns it.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import dion_step
    >>> out = dion_step(np.zeros((4, 6)), np.ones((4, 6)), np.zeros((4, 6)), np.ones((4, 1)), lr=0.1)
    >>> out.P.shape, out.R.shape, out.B.shape
    ((6, 1), (4, 1), (6, 4))
    """

    weight: np.ndarray
    momentum: np.ndarray
    Q: np.ndarray
    P: np.ndarray
    R: np.ndarray
    B: np.ndarray
    lr_scale: float


class DionReplicatedStep(NamedTuple):
    """Result of ``dion_step_replicated``, float64; (m', n') is the working orientation.

    Parameters
    ----------
    weights : tuple of (m, n) float64 ndarray
        Each replica's X after the step (the same update on every replica).
    momenta : tuple of (m, n) float64 ndarray
        Each replica's M after the step.
    Q : (n', r) float64 ndarray
        The shared new right factor.
    P : (m', r) float64 ndarray
        The shared orthonormal left factor (zeros if every B_i = 0).
    R : (n', r) float64 ndarray
        mean_i B_iᵀP (zeros if every B_i = 0).
    B : tuple of (m', n') float64 ndarray
        Each replica's M_i + G_i before the step, transposed when m < n.
    lr_scale : float
        √(m/n).

    See Also
    --------
    dion_step_replicated : The step that returns it.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import dion_step_replicated
    >>> w, z = np.ones((3, 2)), np.zeros((3, 2))
    >>> out = dion_step_replicated([w, w], [z, z], [z, z], np.ones((2, 1)), lr=0.1, weight_decay=0.5)
    >>> len(out.weights), bool(np.all(out.P == 0)), float(out.weights[1][0, 0])  # B = 0: only the decay
    (2, True, 0.95)
    """

    weights: tuple
    momenta: tuple
    Q: np.ndarray
    P: np.ndarray
    R: np.ndarray
    B: tuple
    lr_scale: float


def check_hyper(lr, mu, weight_decay, epsilon, power_iters, right_factor) -> tuple[float, float, float, float]:
    """(lr, mu, weight_decay, epsilon) as floats, validated with ``power_iters`` and ``right_factor``.
    Raises: ValueError naming the argument (ranges as ``dion_step``'s Raises)."""
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


def finish_step(weights, bs, p, r_mat, q_new, *, lr, mu, weight_decay, error_feedback, transposed, scale):
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

    Replica i holds X_i, M_i and G_i; all share Q. In the working orientation each forms
    B_i = M_i + G_i, and the replicas average the small matrices instead of G::

        P = orth(mean_i B_i Q),   R = mean_i B_iᵀ P          (each power iteration)
        M_i ← B_i − (1 − μ) P Rᵀ,  Q ← right factor of R,  X_i ← (1 − ηλ)X_i − η·√(m/n)·P Qᵀ

    By linearity mean_i M_i is the momentum of one process fed the mean gradient, and every replica
    gets the same update (docs/math.md, §5.2). If every B_i is zero: P = R = 0, Q kept, M_i = B_i,
    only the decay applies. The inputs are not modified.

    Parameters
    ----------
    weights : sequence of (m, n) array_like of float
        X_i, N >= 1 replicas.
    grads : sequence of (m, n) array_like of float
        G_i, one per replica.
    momenta : sequence of (m, n) array_like of float
        M_i before the step, one per replica.
    Q : (min(m, n), r) array_like of float
        The shared right factor, 1 <= r <= min(m, n) (the rank is taken from it).
    lr : float
        The learning rate η, >= 0.
    mu : float, default 0.95
        Dion's μ in [0, 1]: the share of the rank-r part of B kept in the momentum.
    weight_decay : float, default 0.0
        Decoupled decay λ, >= 0: X ← (1 − ηλ)X.
    epsilon : float, default 1e-8
        ε of the column normalization, >= 0, in the units of R's column norms.
    power_iters : int, default 1
        Power iterations per step, >= 1; each after the first repeats Q ← right factor of BᵀP.
    error_feedback : bool, default True
        M ← B − (1 − μ) P Rᵀ; False: M ← μ P Rᵀ (the rank-r residual is discarded).
    qr_method : {"householder", "cholesky_qr", "randomized_cholesky_qr"}, default "householder"
        How P = orth(B Q) is computed (``orthonormalize``).
    oversample : float, default 1.25
        Sketch rows per column for "randomized_cholesky_qr", >= 1.
    rng : numpy.random.Generator, optional
        The sketch's generator (one sketch per power iteration); required by
        "randomized_cholesky_qr", unused otherwise.
    right_factor : {"column_norm", "qr"}, default "column_norm"
        The new Q from R (``dion_right_factor``).

    Returns
    -------
    DionReplicatedStep
        ``(weights, momenta, Q, P, R, B, lr_scale)``.

    Raises
    ------
    TypeError
        If an array has a non-float dtype, or "randomized_cholesky_qr" is asked without a
        ``numpy.random.Generator`` `rng`.
    ValueError
        If an array is not 2-D, is empty or holds NaN or Inf; a shape differs from the first
        weight's; `Q` is not (min(m, n), r) with 1 <= r <= min(m, n); `lr`, `weight_decay` or
        `epsilon` < 0; `mu` is outside [0, 1]; `power_iters` < 1; `oversample` < 1; or
        `qr_method` or `right_factor` is unknown; or if `weights`, `grads` and `momenta` differ in
        length or are empty.

    References
    ----------
    K. Ahn, B. Xu, N. Abreu, J. Langford, "Dion: Distributed Orthonormalized Updates",
    arXiv 2504.05295, 2025 (the distributed algorithm's data-parallel compression);
    microsoft/dion ``dion.py`` (``compressed_all_reduce`` of P and R) and README ("Compressed
    Data-Parallel Gradient Sync for Dion"); T. Vogels, S. P. Karimireddy, M. Jaggi, "PowerSGD",
    arXiv 1905.13727, 2019 (the technique's origin, per that README).

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import dion_step, dion_step_replicated
    >>> rng = np.random.default_rng(0)
    >>> w, g1, g2 = rng.standard_normal((3, 6, 4))
    >>> m, q = np.zeros((6, 4)), rng.standard_normal((4, 2))
    >>> out = dion_step_replicated([w, w], [g1, g2], [m, m], q, lr=0.1)
    >>> one = dion_step(w, (g1 + g2) / 2, m, q, lr=0.1)
    >>> bool(np.allclose(sum(out.momenta) / 2, one.momentum)), bool(np.allclose(out.weights[1], one.weight))
    (True, True)
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
    lr, mu, weight_decay, epsilon = check_hyper(lr, mu, weight_decay, epsilon, power_iters, right_factor)
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
    new_w, new_m = finish_step(ws, bs, p, r_mat, q, lr=lr, mu=mu, weight_decay=weight_decay,
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
    """One reference Dion step, with the rank r taken from Q's shape.

    In the working orientation (B = M + G, or its transpose when m < n), with Q (n', r)::

        P = orth(B Q)                  thin QR with diag(R) > 0 (power_iters > 1: Q ← right factor of BᵀP, again)
        R = Bᵀ P
        M ← B − (1 − μ) P Rᵀ           error feedback
        Q ← R / (‖R[:, j]‖₂ + ε)       column normalization
        X ← (1 − ηλ) X − η·√(m/n)·P Qᵀ   (m, n) the weight's own shape

    If B = 0: P = R = 0, Q kept, M = B, only the decay applies. This is ``dion_step_replicated``
    with one replica, bit for bit. The inputs are not modified.

    Parameters
    ----------
    weight : (m, n) array_like of float
        X before the step; finite.
    grad : (m, n) array_like of float
        The gradient G; finite.
    momentum : (m, n) array_like of float
        M before the step (zeros for fresh state), in gradient units.
    Q : (min(m, n), r) array_like of float
        The right factor, 1 <= r <= min(m, n) (fresh state: N(0, 1) entries).
    lr : float
        The learning rate η, >= 0.
    mu : float, default 0.95
        Dion's μ in [0, 1]: the share of the rank-r part of B kept in the momentum.
    weight_decay : float, default 0.0
        Decoupled decay λ, >= 0: X ← (1 − ηλ)X.
    epsilon : float, default 1e-8
        ε of the column normalization, >= 0, in the units of R's column norms.
    power_iters : int, default 1
        Power iterations per step, >= 1; each after the first repeats Q ← right factor of BᵀP.
    error_feedback : bool, default True
        M ← B − (1 − μ) P Rᵀ; False: M ← μ P Rᵀ (the rank-r residual is discarded).
    qr_method : {"householder", "cholesky_qr", "randomized_cholesky_qr"}, default "householder"
        How P = orth(B Q) is computed (``orthonormalize``).
    oversample : float, default 1.25
        Sketch rows per column for "randomized_cholesky_qr", >= 1.
    rng : numpy.random.Generator, optional
        The sketch's generator (one sketch per power iteration); required by
        "randomized_cholesky_qr", unused otherwise.
    right_factor : {"column_norm", "qr"}, default "column_norm"
        The new Q from R (``dion_right_factor``).

    Returns
    -------
    DionStep
        ``(weight, momentum, Q, P, R, B, lr_scale)``.

    Raises
    ------
    TypeError
        If an array has a non-float dtype, or "randomized_cholesky_qr" is asked without a
        ``numpy.random.Generator`` `rng`.
    ValueError
        If an array is not 2-D, is empty or holds NaN or Inf; a shape differs from the first
        weight's; `Q` is not (min(m, n), r) with 1 <= r <= min(m, n); `lr`, `weight_decay` or
        `epsilon` < 0; `mu` is outside [0, 1]; `power_iters` < 1; `oversample` < 1; or
        `qr_method` or `right_factor` is unknown.

    References
    ----------
    K. Ahn, B. Xu, N. Abreu, J. Langford, "Dion: Distributed Orthonormalized Updates",
    arXiv 2504.05295, 2025, Algorithm 1; microsoft/dion ``dion_simple.py``.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import dion_step
    >>> rng = np.random.default_rng(0)
    >>> w, g = rng.standard_normal((2, 6, 4))
    >>> out = dion_step(w, g, np.zeros((6, 4)), rng.standard_normal((4, 2)), lr=0.1, mu=0.9)
    >>> bool(np.allclose(out.P.T @ out.P, np.eye(2)))
    True
    >>> bool(np.allclose(out.P.T @ out.momentum, 0.9 * out.P.T @ g))  # error feedback keeps μ PᵀB
    True
    >>> bool(np.allclose(out.weight, w - 0.1 * np.sqrt(6 / 4) * out.P @ out.Q.T))
    True
    """
    out = _replicated_step([weight], [grad], [momentum], Q, ("weight", "grad", "momentum"), lr=lr, mu=mu,
                           weight_decay=weight_decay, epsilon=epsilon, power_iters=power_iters,
                           error_feedback=error_feedback, qr_method=qr_method, oversample=oversample, rng=rng,
                           right_factor=right_factor)
    return DionStep(out.weights[0], out.momenta[0], out.Q, out.P, out.R, out.B[0], out.lr_scale)
