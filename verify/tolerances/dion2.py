"""Dion2 tolerances: the slice norms that decide the selection, and the weight and momentum after
one fast step vs ``ortho_ref.dion2.dion2_step`` (docs/tolerances.md, "Dion2").
"""

from __future__ import annotations

import numpy as np

from .muon import momentum_tolerance, muon_tolerance
from .newton_schulz import ns_tolerance
from .roundoff import U64, unit_roundoff

__all__ = ["FIRST_ORDER_FRACTION", "dion2_norm_tolerances", "dion2_selection_violation", "dion2_step_tolerances"]

#: The first-order Newton–Schulz bound is used only while it is at most this fraction of ‖O_S‖_F
#: (beyond, the linearization that derives it is not valid and the weight row makes no claim).
FIRST_ORDER_FRACTION = 0.5


def dion2_norm_tolerances(grad: np.ndarray, momentum: np.ndarray, rows: bool, dtype) -> np.ndarray:
    """Per slice, a bound τ_i on |ℓ_fast − ℓ_ref| for the L1 norms ℓ_i = Σ_j |B_ij|, B = M + G,
    that rank the slices:

        τ_i = (N_sum + 3)·(u + u64)·Σ_j (|M_ij| + |G_ij|),   N_sum = the terms of one norm

    Derivation. Each fast entry of B carries the rounding of M and G to the parameter dtype
    (u|M_ij| + u|G_ij|) and of their sum (u|B_ij| ≤ u(|M_ij| + |G_ij|)): |ΔB_ij| ≤ 3u(|M_ij| +
    |G_ij|), and | |B̃_ij| − |B_ij| | ≤ |ΔB_ij|. Summing N_sum non-negative terms errs by at most
    (N_sum − 1)·u times their sum (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed.,
    Eq. (4.4); pairwise summation is tighter), and that sum is ≤ Σ_j (|M_ij| + |G_ij|)(1 + 3u); the
    oracle's float64 sum adds the same with u64. Together ≤ (N_sum + 3)(u + u64)·Σ_j(|M_ij| + |G_ij|)
    to first order in u.
    Shapes: grad, momentum (m, n) float64 (before the step); returns (m,) or (n,) float64.
    """
    size = np.abs(np.asarray(grad, dtype=np.float64)) + np.abs(np.asarray(momentum, dtype=np.float64))
    terms = size.shape[1] if rows else size.shape[0]
    return (terms + 3) * (unit_roundoff(dtype) + U64) * size.sum(axis=1 if rows else 0)


def dion2_selection_violation(norms: np.ndarray, norm_tols: np.ndarray, selected) -> float:
    """How far a selection S is from a valid top-k of the exact ``norms`` given their tolerances τ:

        max_{j ∉ S} (ℓ_j − τ_j) − min_{i ∈ S} (ℓ_i + τ_i)

    A fast implementation picks i over j only if its computed ℓ̃_i ≥ ℓ̃_j, so ℓ_i + τ_i ≥ ℓ_j − τ_j
    for every i ∈ S, j ∉ S: the violation is ≤ 0 for every correct implementation, whatever its
    tie-break (ties and near-ties within τ are a gauge, as Dion's QR signs). −inf when S holds every
    slice or none. A planted L2 norm, a selection along the wrong dimension or the wrong count
    gives a positive violation on inputs without near-ties.
    Shapes: norms, norm_tols (N,); selected: indices.
    """
    norms = np.asarray(norms, dtype=np.float64)
    tols = np.asarray(norm_tols, dtype=np.float64)
    mask = np.zeros(norms.size, dtype=bool)
    mask[np.asarray(selected, dtype=np.int64)] = True
    if mask.all() or not mask.any():
        return -np.inf
    return float((norms[~mask] - tols[~mask]).max() - (norms[mask] + tols[mask]).min())


def dion2_step_tolerances(weight: np.ndarray, update: np.ndarray, accumulated: np.ndarray, selected, rows: bool,
                          grad: np.ndarray, momentum: np.ndarray, *, lr: float, lr_scale: float, coefficients,
                          safety: float, eps: float, dtype) -> tuple[float, float]:
    """(weight, momentum) Frobenius tolerances for one fast Dion2 step vs the oracle with the same
    selection S (the oracle's own, or the fast one when that is a valid top-k within
    ``dion2_norm_tolerances``).

    Weight: W_new = W(1 − lr·wd) − lr·s·O with O zero off S and O_S = Newton–Schulz(B_S): the
    Muon derivation (``muon_tolerance``) with the Newton–Schulz tolerance of the submatrix,
    ``ns_tolerance`` at σ̂(B_S) for the (k, n) / (m, k) shape — the rounding of B_S (one addition)
    is an input rounding that ``ns_tolerance``'s G_0 term covers; the gather and the scatter are
    exact copies. inf (no claim) when that first-order bound exceeds ``FIRST_ORDER_FRACTION``·‖O_S‖_F.
    Momentum: M + G then ×ef_decay on S: one addition and at most one product per entry, within
    ``momentum_tolerance``'s 3u per entry.
    Shapes: weight, update, accumulated, grad, momentum (m, n) float64 (the weight before the
    step, the oracle's O and B, the gradient and momentum before the step).
    """
    from ortho_ref import normalized_singular_values  # the oracle is a dependency of the judge

    sel = np.asarray(selected, dtype=np.int64)
    sub = accumulated[sel, :] if rows else accumulated[:, sel]
    o_sub = update[sel, :] if rows else update[:, sel]
    if np.any(sub):
        sigma_hat = normalized_singular_values(sub, safety=safety, eps=eps)
        ns_tol = ns_tolerance(sigma_hat, coefficients, sub.shape, dtype)
    else:
        ns_tol = 0.0
    o_norm = float(np.linalg.norm(o_sub))
    if ns_tol > FIRST_ORDER_FRACTION * o_norm and o_norm > 0:
        w_tol = np.inf
    else:
        w_tol = muon_tolerance(ns_tol, lr_scale, lr, float(np.linalg.norm(weight)), o_norm, dtype)
    m_tol = momentum_tolerance(float(np.linalg.norm(grad)), float(np.linalg.norm(momentum)), dtype)
    return float(w_tol), float(m_tol)
