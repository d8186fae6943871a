"""Reference Dion2 step (float64, one matrix, no batching, no communication).

Dion2 (microsoft/dion ``dion/dion2.py``, class ``Dion2``): momentum without μ, a top-k
selection of rows (or columns) by L1 norm, error-feedback decay on the selected slices only,
and an orthogonalized update of the selected submatrix only. docs/math.md, "Dion2";
docs/math.md, "Dion2".
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np

from ._validate import as_coefficients, as_like, as_matrix, check_scalar
from .coefficients import schedule
from .mp import to_float64
from .muon import lr_scale
from .ns_map import ns_map
from .polar import polar

__all__ = ["DION2_ADJUST_LR_MODES", "DION2_ORTHOGONALIZERS", "SELECTION_SCOPES", "Dion2Step", "dion2_num_selected",
           "dion2_local_select", "dion2_select", "dion2_select_rows", "dion2_slice_norms", "dion2_step",
           "dion2_shard_chunks"]

#: "global": one top-k over the whole matrix (layout invariant); "local": one top-k per shard of
#: the selected dimension (microsoft/dion's default on its row-sharded path; layout dependent).
SELECTION_SCOPES = ("global", "local")
#: microsoft/dion Dion2's ``adjust_lr`` values ("rms_norm" is 0.2·√max(m, n), Moonlight's rule).
DION2_ADJUST_LR_MODES = ("spectral_norm", "rms_norm", None)
#: How the oracle orthogonalizes the selected submatrix: the exact result of the Newton–Schulz
#: schedule (``ns_map``) or the exact polar factor.
DION2_ORTHOGONALIZERS = ("newton_schulz", "polar")


def dion2_select_rows(m: int, n: int) -> bool:
    """Whether Dion2 selects rows (True) or columns (False) of an (m, n) matrix: rows when
    m <= n (the shorter dimension; ties to rows), as microsoft/dion's ``dion2_update_megabatch_async``
    does for an unsharded matrix. Here it is a function of the **global shape only**, on every
    layout (microsoft/dion lets a row-sharded FSDP parameter force rows; we do not, so "global"
    selection is layout invariant). Raises: ValueError for m or n < 1."""
    if m < 1 or n < 1:
        raise ValueError(f"shape: expected m, n >= 1, got ({m}, {n})")
    return m <= n


def dion2_num_selected(fraction: float, size: int) -> int:
    """k = min(size, max(1, ⌈fraction·size⌉)): how many of ``size`` slices Dion2 selects.

    The product is rounded in float64 before the ceiling, exactly as microsoft/dion's
    ``int(math.ceil(fraction * num_select))`` (so 0.07·100 = 7.000000000000001 gives 8: the
    reference's count, kept for compatibility). Raises: ValueError for fraction outside (0, 1]
    or size < 1.
    """
    fraction = check_scalar(fraction, "fraction", low=0.0, high=1.0, low_open=True)
    if int(size) != size or size < 1:
        raise ValueError(f"size: expected a positive integer, got {size!r}")
    return min(int(size), max(1, int(math.ceil(fraction * size))))


def dion2_slice_norms(b: np.ndarray, rows: bool) -> np.ndarray:
    """L1 norms of the slices Dion2 ranks: Σ_j |B_ij| per row (``rows``) or Σ_i |B_ij| per column.
    Shapes: b (m, n) float64 -> (m,) or (n,) float64."""
    return np.abs(np.asarray(b, dtype=np.float64)).sum(axis=1 if rows else 0)


def dion2_select(norms, k: int) -> np.ndarray:
    """Indices of the k largest ``norms``, ascending. Tie-break (documented choice of the
    oracle): among equal norms the lower index wins. Other tie-breaks are as correct
    (microsoft/dion's ``torch.topk(sorted=False)`` leaves it unspecified); the judge treats
    near-ties as a gauge (``ortho_verify.checks.dion2``). Shapes: norms (N,) -> (k,) int64.
    Raises: ValueError for k outside [1, N]."""
    norms = np.asarray(norms, dtype=np.float64)
    if not 1 <= k <= norms.size:
        raise ValueError(f"k: expected 1 <= k <= {norms.size}, got {k}")
    order = np.argsort(-norms, kind="stable")
    return np.sort(order[:k])


def dion2_shard_chunks(size: int, shards: int) -> list[np.ndarray]:
    """torch.chunk's split of ``size`` indices into ``shards`` contiguous pieces (FSDP2's
    ``Shard`` placement): pieces of ⌈size/shards⌉, the last ones shorter or empty.
    Shapes: -> ``shards`` int64 index arrays. Raises: ValueError for size < 1 or shards < 1."""
    if size < 1 or shards < 1:
        raise ValueError(f"size, shards: expected >= 1, got {size}, {shards}")
    chunk = -(-size // shards)
    return [np.arange(min(i * chunk, size), min((i + 1) * chunk, size)) for i in range(shards)]


class Dion2Step(NamedTuple):
    """Result of ``dion2_step``: new weight (m, n), new momentum (m, n), the update O (m, n)
    before lr (zero outside the selected slices), the lr multiplier, the selected indices
    (rows if ``rows`` else columns, ascending), ``rows``, the slice L1 norms of B = M + G,
    and B itself."""

    weight: np.ndarray
    momentum: np.ndarray
    update: np.ndarray
    lr_scale: float
    selected: np.ndarray
    rows: bool
    norms: np.ndarray
    accumulated: np.ndarray


def dion2_local_select(norms, fraction: float, shards: Sequence) -> np.ndarray:
    """Dion2's "local" selection, ascending int64 indices. Per-shard top-k: k = max(1, ⌈fraction·(largest shard)⌉) per
    shard (microsoft/dion's ``k = ceil(fraction * ceil(global / world_size))``), at most the shard's size; ties as
    ``dion2_select``. Shapes: norms (N,); shards: index sets partitioning range(N).
    Raises: ValueError naming ``shards`` when they are not a partition of range(N)."""
    norms = np.asarray(norms, dtype=np.float64)
    pieces = [np.asarray(s, dtype=np.int64) for s in shards]
    flat = np.sort(np.concatenate(pieces)) if pieces else np.array([], dtype=np.int64)
    if flat.size != norms.size or np.any(flat != np.arange(norms.size)):
        raise ValueError(f"shards: expected a partition of range({norms.size}) into index sets")
    k = max(1, int(math.ceil(fraction * max(p.size for p in pieces))))
    chosen = [p[dion2_select(norms[p], min(k, p.size))] for p in pieces if p.size]
    return np.sort(np.concatenate(chosen))


def dion2_step(
    weight,
    grad,
    momentum,
    *,
    lr: float = 0.01,
    fraction: float = 0.25,
    ef_decay: float = 0.95,
    weight_decay: float = 0.01,
    adjust_lr: str | None = "spectral_norm",
    coefficients=None,
    safety: float = 1.02,
    eps: float = 1e-8,
    orthogonalizer: str = "newton_schulz",
    selection_scope: str = "global",
    shards: Sequence | None = None,
    selected=None,
    digits: int | None = None,
) -> Dion2Step:
    """One reference Dion2 step on an (m, n) weight.

        B = M + G
        rows if m <= n else columns; ℓ_i = ‖B_i‖₁ over each slice i (row or column)
        S = the k slices of largest ℓ, k = min(N, max(1, ⌈fraction·N⌉)), N slices
        O_S = orth(B_S) (the (k, n) or (m, k) submatrix), O = 0 off S
        M_new = B with M_new[S] = ef_decay·B[S]
        W_new = W·(1 − lr·wd) − lr·s·O,  s = lr_scale(adjust_lr, m, n)

    ``orth`` is ``ns_map(B_S, coefficients, safety, eps)`` (the exact result of the
    Newton–Schulz schedule; default microsoft/dion's Polar Express rows with its 1.02 safety and
    ``epsilon`` 1e-8) or the exact polar factor (``orthogonalizer="polar"``). ``adjust_lr``:
    "spectral_norm" √(m/n), "rms_norm" 0.2·√max(m, n), None 1 (microsoft/dion's
    ``adjust_lr_spectral_norm`` / ``adjust_lr_rms_norm``, from the full matrix shape).
    ``selection_scope="local"`` with ``shards`` (a partition of the slice indices, e.g.
    ``dion2_shard_chunks(N, world)``): each shard selects its own top
    max(1, ⌈fraction·(largest shard)⌉) slices (at most its size) and the union is orthogonalized
    as one submatrix — microsoft/dion's row-sharded "local" path. ``shards`` None means one
    shard (then "local" equals "global"). ``selected``: use these slice indices instead of the
    top-k (the judge conditions on a fast implementation's choice among near-ties).
    Ties: the lower index wins (``dion2_select``). ``digits``: orthogonalize the submatrix in the
    mpmath tier (``ns_map`` / ``polar`` with ``digits=``, k and the other side <= 64), rounded to
    float64 (the selection, momentum and update arithmetic stay float64).

    Shapes: weight, grad, momentum (m, n) float -> Dion2Step of float64 arrays.
    Source: microsoft/dion ``dion/dion2.py`` (``dion2_pre_orthogonalize``,
    ``dion2_post_orthogonalize``, ``_make_select_and_orthogonalize``); Polar Express rows of
    Amsel et al. arXiv 2505.16932 as microsoft/dion ``polar_express``.
    Raises: TypeError / ValueError for non-float, non-2-D, empty or non-finite arrays, shape
    mismatches, lr < 0, fraction outside (0, 1], ef_decay outside [0, 1] (the share of B_S kept in M:
    past 1 M grows without bound; microsoft/dion's and the product's range), weight_decay < 0, unknown option
    strings, a ``shards`` that is not a partition, ``selected`` indices out of range or repeated.
    """
    w = as_matrix(weight, "weight")
    g = as_like(grad, "grad", w.shape)
    m_old = as_like(momentum, "momentum", w.shape)
    lr = check_scalar(lr, "lr", low=0.0)
    fraction = check_scalar(fraction, "fraction", low=0.0, high=1.0, low_open=True)
    ef_decay = check_scalar(ef_decay, "ef_decay", low=0.0, high=1.0)
    weight_decay = check_scalar(weight_decay, "weight_decay", low=0.0)
    if adjust_lr not in DION2_ADJUST_LR_MODES:
        raise ValueError(f"adjust_lr: expected one of {DION2_ADJUST_LR_MODES}, got {adjust_lr!r}")
    if orthogonalizer not in DION2_ORTHOGONALIZERS:
        raise ValueError(f"orthogonalizer: expected one of {DION2_ORTHOGONALIZERS}, got {orthogonalizer!r}")
    if selection_scope not in SELECTION_SCOPES:
        raise ValueError(f"selection_scope: expected one of {SELECTION_SCOPES}, got {selection_scope!r}")
    table = schedule("polar_express") if coefficients is None else as_coefficients(coefficients)
    m, n = w.shape
    scale = 0.2 * math.sqrt(max(m, n)) if adjust_lr == "rms_norm" else lr_scale(adjust_lr, m, n)

    b = m_old + g
    rows = dion2_select_rows(m, n)
    norms = dion2_slice_norms(b, rows)
    size = norms.size
    if selected is not None:
        sel = np.asarray(selected, dtype=np.int64).ravel()
        if sel.size < 1 or np.any(sel < 0) or np.any(sel >= size) or np.unique(sel).size != sel.size:
            raise ValueError(f"selected: expected distinct slice indices in [0, {size}), got {sel.tolist()}")
        sel = np.sort(sel)
    elif selection_scope == "local" and shards is not None:
        sel = dion2_local_select(norms, fraction, shards)
    else:
        sel = dion2_select(norms, dion2_num_selected(fraction, size))

    sub = b[sel, :] if rows else b[:, sel]
    if not np.any(sub):
        o_sub = np.zeros_like(sub)
    elif orthogonalizer == "polar":
        o_sub = polar(sub, digits=digits)
    else:
        o_sub = ns_map(sub, table, safety=safety, eps=eps, digits=digits)
    if digits is not None:
        o_sub = to_float64(o_sub)
    update = np.zeros_like(b)
    m_new = b.copy()
    if rows:
        update[sel, :] = o_sub
        m_new[sel, :] *= ef_decay
    else:
        update[:, sel] = o_sub
        m_new[:, sel] *= ef_decay
    w_new = w * (1.0 - lr * weight_decay) - (lr * scale) * update
    return Dion2Step(w_new, m_new, update, scale, sel, rows, norms, b)
