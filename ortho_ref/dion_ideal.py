"""Dion's ideal step: P and R from the best rank-r approximation of B (truncated SVD), for comparisons.

The step ``ortho_ref.dion.dion_step`` approaches when B is held fixed; its measure of how far one
power iteration is from it (docs/math.md, §5).
"""

from __future__ import annotations

import math

import numpy as np

from ._validate import as_like, as_matrix
from .dion import DionStep, check_hyper, dion_transposed, finish_step
from .dion_qr import dion_right_factor
from .linalg import svd

__all__ = ["dion_ideal_step"]


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
    """Dion's step with P and R from the best rank-r approximation of B, for comparisons.

    In the working orientation B = U Σ Vᵀ (thin SVD): P = U[:, :r] (each column's entry of largest
    magnitude made positive), R = BᵀP = V_r Σ_r, so P Rᵀ is the truncated SVD (Eckart–Young); then
    M, Q and X as in ``dion_step``. This is the fixed point Dion's power iteration approaches when
    B is held fixed (subspace iteration on BBᵀ). If B = 0: P = R = Q = 0 (there is no previous Q),
    M = B, only the decay applies.

    Parameters
    ----------
    weight : (m, n) array_like of float
        X before the step; finite.
    grad : (m, n) array_like of float
        The gradient G; finite.
    momentum : (m, n) array_like of float
        M before the step, in gradient units.
    rank : int
        r, 1 <= r <= min(m, n).
    lr : float
        The learning rate η, >= 0.
    mu : float, default 0.95
        Dion's μ in [0, 1]: the share of the rank-r part of B kept in the momentum.
    weight_decay : float, default 0.0
        Decoupled decay λ, >= 0: X ← (1 − ηλ)X.
    epsilon : float, default 1e-8
        ε of the column normalization, >= 0, in the units of R's column norms.
    error_feedback : bool, default True
        M ← B − (1 − μ) P Rᵀ; False: M ← μ P Rᵀ.
    right_factor : {"column_norm", "qr"}, default "column_norm"
        The new Q from R (``dion_right_factor``).

    Returns
    -------
    DionStep
        ``(weight, momentum, Q, P, R, B, lr_scale)`` with Q (min(m, n), r).

    Raises
    ------
    TypeError
        If an array has a non-float dtype.
    ValueError
        As ``dion_step``, and if `rank` is not an integer in [1, min(m, n)].

    References
    ----------
    K. Ahn, B. Xu, N. Abreu, J. Langford, "Dion: Distributed Orthonormalized Updates",
    arXiv 2504.05295, 2025 (Dion as a low-rank approximation of the orthonormalized update);
    C. Eckart, G. Young, "The approximation of one matrix by another of lower rank",
    Psychometrika 1, 1936.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import dion_ideal_step
    >>> g = np.random.default_rng(0).standard_normal((6, 4))
    >>> out = dion_ideal_step(np.zeros((6, 4)), g, np.zeros((6, 4)), rank=2, lr=0.1)
    >>> u, s, vt = np.linalg.svd(g, full_matrices=False)
    >>> bool(np.allclose(out.P @ out.R.T, (u[:, :2] * s[:2]) @ vt[:2]))
    True
    """
    w = as_matrix(weight, "weight")
    m, n = w.shape
    g = as_like(grad, "grad", (m, n))
    m_old = as_like(momentum, "momentum", (m, n))
    if int(rank) != rank or not 1 <= rank <= min(m, n):
        raise ValueError(f"rank: expected an integer in [1, {min(m, n)}], got {rank!r}")
    lr, mu, weight_decay, epsilon = check_hyper(lr, mu, weight_decay, epsilon, 1, right_factor)
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
    new_w, new_m = finish_step([w], [b], p, r_mat, q, lr=lr, mu=mu, weight_decay=weight_decay,
                           error_feedback=error_feedback, transposed=transposed, scale=scale)
    return DionStep(new_w[0], new_m[0], q, p, r_mat, b, scale)
