"""Reference Dion2 step (float64, one matrix, no batching, no communication).

Dion2 (Ahn, Amsel, Langford, arXiv 2512.16928; microsoft/dion ``dion/dion2.py``, class ``Dion2``):
momentum without μ, a top-k selection of rows (or columns) by L1 norm, error-feedback decay on the
selected slices only, and an orthogonalized update of the selected submatrix only (docs/math.md, §5a).
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
    """Whether Dion2 selects rows (True) or columns (False) of an (m, n) matrix: rows when m <= n.

    The shorter dimension, ties to rows, as microsoft/dion's ``dion2_update_megabatch_async`` for an
    unsharded matrix. Here a function of the global shape only, on every layout (microsoft/dion lets
    a row-sharded FSDP parameter force rows; this does not, so "global" selection is layout invariant).

    Parameters
    ----------
    m : int
        Rows of the matrix, >= 1.
    n : int
        Columns of the matrix, >= 1.

    Returns
    -------
    bool
        True if m <= n.

    Raises
    ------
    ValueError
        If `m` or `n` < 1.

    References
    ----------
    microsoft/dion ``dion/dion2.py``.

    Examples
    --------
    >>> from ortho_ref import dion2_select_rows
    >>> dion2_select_rows(3, 5), dion2_select_rows(4, 4), dion2_select_rows(5, 3)
    (True, True, False)
    """
    if m < 1 or n < 1:
        raise ValueError(f"shape: expected m, n >= 1, got ({m}, {n})")
    return m <= n


def dion2_num_selected(fraction: float, size: int) -> int:
    """How many of `size` slices Dion2 selects: k = min(size, max(1, ⌈fraction·size⌉)).

    The product is rounded in float64 before the ceiling, exactly as microsoft/dion's
    ``int(math.ceil(fraction * num_select))``, so 0.07·100 = 7.000000000000001 gives 8 (the
    reference's count, kept for compatibility).

    Parameters
    ----------
    fraction : float
        The selected fraction, in (0, 1].
    size : int
        N, the number of slices, >= 1.

    Returns
    -------
    int
        k, 1 <= k <= N.

    Raises
    ------
    ValueError
        If `fraction` is outside (0, 1] or `size` is not an integer >= 1.

    References
    ----------
    microsoft/dion ``dion/dion2.py``.

    Examples
    --------
    >>> from ortho_ref import dion2_num_selected
    >>> dion2_num_selected(0.25, 10), dion2_num_selected(0.07, 100), dion2_num_selected(0.01, 5)
    (3, 8, 1)
    """
    fraction = check_scalar(fraction, "fraction", low=0.0, high=1.0, low_open=True)
    if int(size) != size or size < 1:
        raise ValueError(f"size: expected a positive integer, got {size!r}")
    return min(int(size), max(1, int(math.ceil(fraction * size))))


def dion2_slice_norms(b: np.ndarray, rows: bool) -> np.ndarray:
    """L1 norms of the slices Dion2 ranks: Σ_j |B_ij| per row, or Σ_i |B_ij| per column.

    Parameters
    ----------
    b : (m, n) array_like of float
        B = M + G; not validated (``dion2_step`` validates its inputs).
    rows : bool
        Per row (True) or per column (False), as ``dion2_select_rows``.

    Returns
    -------
    (m,) or (n,) float64 ndarray
        The norms, in the units of `b`.

    References
    ----------
    microsoft/dion ``dion/dion2.py``.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import dion2_slice_norms
    >>> dion2_slice_norms(np.array([[1.0, -2.0, 0.0], [0.5, 0.5, 0.5]]), rows=True).tolist()
    [3.0, 1.5]
    """
    return np.abs(np.asarray(b, dtype=np.float64)).sum(axis=1 if rows else 0)


def dion2_select(norms, k: int) -> np.ndarray:
    """Indices of the k largest norms, in ascending order; among equal norms the lower index wins.

    The tie-break is the oracle's documented choice; others are as correct (microsoft/dion's
    ``torch.topk(sorted=False)`` leaves it unspecified), and the judge treats near-ties as a gauge
    (``ortho_verify.checks.dion2``).

    Parameters
    ----------
    norms : (N,) array_like of float
        The slice norms (``dion2_slice_norms``).
    k : int
        How many to select, 1 <= k <= N.

    Returns
    -------
    (k,) int64 ndarray
        The selected indices, ascending.

    Raises
    ------
    ValueError
        If `k` is outside [1, N].

    References
    ----------
    microsoft/dion ``dion/dion2.py`` (top-k by L1 norm).

    Examples
    --------
    >>> from ortho_ref import dion2_select
    >>> dion2_select([3.0, 1.0, 3.0, 2.0], 2).tolist()
    [0, 2]
    """
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
    """Result of ``dion2_step``: the new state, the update and the selection, float64.

    Parameters
    ----------
    weight : (m, n) float64 ndarray
        W after the step.
    momentum : (m, n) float64 ndarray
        M after the step: B, with the selected slices multiplied by ef_decay.
    update : (m, n) float64 ndarray
        O before the learning rate, zero outside the selected slices.
    lr_scale : float
        s, the multiplier of lr applied to O.
    selected : (k,) int64 ndarray
        The selected slice indices (rows if `rows` else columns), ascending.
    rows : bool
        Whether rows (True) or columns were selected.
    norms : (N,) float64 ndarray
        The slice L1 norms of B.
    accumulated : (m, n) float64 ndarray
        B = M + G.

    See Also
    --------
    dion2_step : The step that returns it.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import dion2_step
    >>> dion2_step(np.eye(2), np.eye(2), np.zeros((2, 2)))._fields[4:]
    ('selected', 'rows', 'norms', 'accumulated')
    """

    weight: np.ndarray
    momentum: np.ndarray
    update: np.ndarray
    lr_scale: float
    selected: np.ndarray
    rows: bool
    norms: np.ndarray
    accumulated: np.ndarray


def dion2_local_select(norms, fraction: float, shards: Sequence) -> np.ndarray:
    """Dion2's "local" selection: a top-k in each shard of the slices, the union in ascending order.

    Each shard selects its own max(1, ⌈fraction·(largest shard)⌉) slices, at most its size
    (microsoft/dion's k = ceil(fraction·ceil(N / world_size))); ties as ``dion2_select``.

    Parameters
    ----------
    norms : (N,) array_like of float
        The slice norms (``dion2_slice_norms``).
    fraction : float
        The selected fraction, in (0, 1] (not validated here; ``dion2_step`` does).
    shards : sequence of array_like of int
        Index sets partitioning range(N), one per shard (e.g. ``dion2_shard_chunks(N, world)``).

    Returns
    -------
    int64 ndarray
        The selected indices, ascending.

    Raises
    ------
    ValueError
        Naming `shards`, if they are not a partition of range(N).

    References
    ----------
    microsoft/dion ``dion/dion2.py`` (its row-sharded "local" path).

    Examples
    --------
    >>> from ortho_ref import dion2_local_select
    >>> dion2_local_select([5.0, 4.0, 3.0, 2.0, 1.0, 0.5], 0.25, [[0, 1, 2], [3, 4, 5]]).tolist()
    [0, 3]
    """
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
    """One reference Dion2 step on an (m, n) weight, in float64.

    ::

        B = M + G
        rows if m <= n else columns;  ℓ_i = ‖B_i‖₁ over each slice i; N slices
        S = the k slices of largest ℓ,  k = min(N, max(1, ⌈fraction·N⌉))
        O_S = orth(B_S)  (the (k, n) or (m, k) submatrix),  O = 0 off S
        M ← B, with M_S ← ef_decay·B_S
        W ← W·(1 − ηλ) − η·s·O

    There is no μ: the momentum decays only where it was used (docs/math.md, §5a). The inputs are
    not modified.

    Parameters
    ----------
    weight : (m, n) array_like of float
        W before the step; finite.
    grad : (m, n) array_like of float
        The gradient G; finite.
    momentum : (m, n) array_like of float
        M before the step (zeros for fresh state), in gradient units.
    lr : float, default 0.01
        The learning rate η, >= 0.
    fraction : float, default 0.25
        The selected fraction of the slices, in (0, 1].
    ef_decay : float, default 0.95
        The share of B_S kept in M, in [0, 1].
    weight_decay : float, default 0.01
        Decoupled decay λ, >= 0.
    adjust_lr : {"spectral_norm", "rms_norm", None}, default "spectral_norm"
        s = √(m/n), 0.2·√max(m, n) or 1, from the full shape (microsoft/dion
        ``adjust_lr_spectral_norm`` / ``adjust_lr_rms_norm``).
    coefficients : (T, 3) array_like of float, optional
        Newton–Schulz rows. Default None: ``schedule("polar_express")``, microsoft/dion's rows.
    safety : float, default 1.02
        Newton–Schulz normalization X₀ = B_S / (safety·‖B_S‖_F + eps), as ``ns_map``; > 0.
    eps : float, default 1e-8
        As ``ns_map``, in gradient units; >= 0.
    orthogonalizer : {"newton_schulz", "polar"}, default "newton_schulz"
        orth = ``ns_map(B_S, coefficients, safety=safety, eps=eps)`` or the exact polar factor.
    selection_scope : {"global", "local"}, default "global"
        One top-k over the matrix, or one per shard of `shards` (``dion2_local_select``).
    shards : sequence of array_like of int, optional
        For "local": index sets partitioning the slices (``dion2_shard_chunks``). Default None:
        one shard ("local" then equals "global").
    selected : array_like of int, optional
        Use these distinct slice indices instead of the top-k (the judge conditions on a fast
        implementation's choice among near-ties). Default None.
    digits : int, optional
        Orthogonalize B_S in the mpmath tier (``digits=`` of ``ns_map`` / ``polar``; its sides
        <= 64), rounded to float64; the rest stays float64. Default None: float64.

    Returns
    -------
    Dion2Step
        ``(weight, momentum, update, lr_scale, selected, rows, norms, accumulated)``.

    Raises
    ------
    TypeError
        If an array has a non-float dtype, or `digits` is not an integer.
    ValueError
        If an array is not 2-D, is empty or holds NaN or Inf; a shape differs from `weight`'s;
        `lr` or `weight_decay` < 0; `fraction` is outside (0, 1]; `ef_decay` is outside [0, 1];
        `adjust_lr`, `orthogonalizer` or `selection_scope` is unknown; `shards` is not a partition;
        `selected` has indices out of range or repeated; or as ``ns_map`` / ``polar`` for the
        schedule, `safety`, `eps` and `digits`.

    References
    ----------
    K. Ahn, N. Amsel, J. Langford, "Dion2: A Simple Method to Shrink Matrix in Muon", arXiv
    2512.16928, 2025; the reference implementation this follows, microsoft/dion ``dion/dion2.py``
    (``dion2_pre_orthogonalize``, ``dion2_post_orthogonalize``, ``_make_select_and_orthogonalize``);
    N. Amsel, D. Persson, C. Musco, R. M. Gower, "The Polar Express", arXiv 2505.16932, 2025 (the
    default rows, as microsoft/dion ``polar_express``).

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import dion2_step, ns_map, schedule
    >>> w, g = np.random.default_rng(0).standard_normal((2, 4, 6))
    >>> out = dion2_step(w, g, np.zeros((4, 6)), fraction=0.5)
    >>> out.rows, out.selected.tolist()
    (True, [2, 3])
    >>> o_s = ns_map(g[[2, 3]], schedule("polar_express"), safety=1.02, eps=1e-8)
    >>> bool(np.allclose(out.update[[2, 3]], o_s)), bool(np.all(out.update[[0, 1]] == 0))
    (True, True)
    >>> bool(np.allclose(out.momentum[[2, 3]], 0.95 * g[[2, 3]]))
    True
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
