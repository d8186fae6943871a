"""Why a distributed optimizer disagrees with one process (``check_sharded_optimizer``'s summary).

Per (layout, shape) that disagrees, in this order: the ranks hold different weights; the run is
Dion in the other orientation (``dion_replay``: with ``DionConventions``, the oracle's Dion step
on the transposed working matrix, replayed from the run's own state after step 1 since Q_0 is
the optimizer's own draw, agrees with the run); every shard equals the same factory applied to
that shard alone (a local computation instead of the full matrix); the weights did not move by
the update (a result that never reached this rank). Across layouts, ``layout_pattern`` names the
mesh role whose layouts are exactly the failing ones (e.g. every layout with an inner shard
mesh: a reduction over it is missing). Source: docs/design.md, "Dion" (orientation by the
global shape) and "Distributed layouts and the layout contract".
"""

from __future__ import annotations

import math

import numpy as np
import torch

import ortho_ref

from .layouts import Layout

__all__ = ["FEATURES", "dion_replay", "layout_features", "layout_pattern", "moved_fraction"]


def dion_replay(weight, momentum, q, grads, *, transposed: bool, lr: float, mu: float, weight_decay: float,
                epsilon: float = 1e-8, error_feedback: bool = True) -> list[np.ndarray] | None:
    """Dion (Ahn et al., arXiv 2504.05295, Algorithm 1; ``ortho_ref.dion_step`` with power_iters 1
    and Householder QR) forced into one orientation: the working matrix is Bᵀ if ``transposed``
    else B = M + G, whatever the shape, and the update −lr·√(m/n)·PQᵀ uses the weight's own (m, n).

    Shapes: weight, momentum (m, n) float64 arrays (or tensors); q (k, r) with k the working
    matrix's column count (n, or m when transposed); grads: a list of (m, n). Returns the weight
    after each gradient, or None when q's row count does not fit the orientation.
    """
    x, m_, qq = (np.asarray(a, dtype=np.float64) for a in (weight, momentum, q))
    rows, cols = x.shape
    if qq.ndim != 2 or qq.shape[0] != (rows if transposed else cols):
        return None
    out = []
    for g in grads:
        b = m_ + np.asarray(g, dtype=np.float64)
        bw = b.T if transposed else b
        p = ortho_ref.orthonormalize(bw @ qq)
        r = bw.T @ p
        mw = bw - (1 - mu) * p @ r.T if error_feedback else mu * p @ r.T
        qq = ortho_ref.dion_right_factor(r, "column_norm", epsilon)
        update = p @ qq.T
        x = (1 - lr * weight_decay) * x - lr * math.sqrt(rows / cols) * (update.T if transposed else update)
        m_ = mw.T if transposed else mw
        out.append(x)
    return out


#: feature -> (its description, what a failure on exactly those layouts suggests).
FEATURES = {
    "plain": ("plain replicated tensors (DDP)",
              "work split across ranks whose results do not all arrive (a broadcast from the wrong rank?)"),
    "replicate": ("a replicate mesh", "the replicas' reduction or broadcast is wrong"),
    "outer": ("an outer shard mesh (FSDP)", "a reduction or gather over the outer shard mesh is missing or wrong"),
    "inner": ("an inner shard mesh (TP)", "a reduction or gather over the inner shard mesh is missing or wrong"),
    "dim0": ("rows sharded (Shard(0))", "a choice made from the sharded dim (e.g. Dion's orientation) or a "
                                        "missing reduction over sharded rows"),
    "outer_dim0": ("rows sharded over the outer shard mesh (FSDP Shard(0))",
                   "a choice made from the outer shard placement (e.g. Dion transposed whenever the outer shard "
                   "is dim 0) or a missing reduction over the outer shard mesh"),
    "dim1": ("columns sharded (Shard(1))", "a choice made from the sharded dim or a missing reduction over "
                                           "sharded columns"),
    "sharded": ("sharded matrices", "the update is computed from the local shard, or a reduction over the "
                                    "shards is missing"),
}


def layout_features(layout: Layout) -> set[str]:
    """The ``FEATURES`` a catalogue layout has."""
    roles = {arg for arg, _ in layout.roles}
    codes = layout.placements or ()
    out = {f for f, role in (("replicate", "replicate_mesh"), ("outer", "outer_shard_mesh"),
                             ("inner", "inner_shard_mesh")) if role in roles}
    if layout.placements is None:
        out.add("plain")
    if any(c.endswith("S0") for c in codes):
        out.add("dim0")
    if "outer_shard_mesh" in roles and layout.placements is not None:
        outer = layout.dims.index(dict(layout.roles)["outer_shard_mesh"])
        if codes[outer].endswith("S0"):
            out.add("outer_dim0")
    if "S1" in codes:
        out.add("dim1")
    if any(c != "R" for c in codes):
        out.add("sharded")
    return out


def layout_pattern(failing: list[Layout], passing: list[Layout]) -> list[str]:
    """Sentences naming each feature of ``FEATURES`` whose layouts are exactly the failing ones."""
    if not failing or not passing:
        return []
    out = []
    for feature, (what, hint) in FEATURES.items():
        if all(feature in layout_features(lay) for lay in failing) and \
                not any(feature in layout_features(lay) for lay in passing):
            out.append(f"fails exactly on the layouts with {what} ({', '.join(lay.name for lay in failing)}): {hint}")
    return out


def moved_fraction(new: torch.Tensor, old: torch.Tensor, ref_new: torch.Tensor) -> float:
    """‖new − old‖ / ‖ref_new − old‖: how far a step moved the weights, as a fraction of the
    one-process step (near 0: the update never arrived)."""
    den = torch.linalg.vector_norm(ref_new - old).item()
    return torch.linalg.vector_norm(new - old).item() / den if den else math.inf
