"""Dion2's per-tensor math: momentum accumulation, top-k slice selection by L1 norm, error
feedback on the selected slices, orthogonalization of the selected submatrix, the update.

Functions of tensors and keyword hyperparameters, batched over leading dims ``(..., m, n)``
(every matrix of a batch selects its own slices). ``ortho_fast.groups.dion2`` drives them for a
param group, ``ortho_fast.distributed.dion2`` for sharded parameters.

Patch point (a documented seam for tests that plant bugs): ``orthogonalize_selected`` is looked
up in this module at every call by the group layer and the distributed step, so
``monkeypatch.setattr(ortho_fast.functional.dion2, "orthogonalize_selected", ...)`` reaches
every Dion2 step. Source: microsoft/dion ``dion/dion2.py``; docs/math.md, "Dion2".
"""

from __future__ import annotations

import math

import torch

from .muon import adjusted_lr_scale
from .newton_schulz import newton_schulz_resolved, newton_schulz_stack, newton_schulz_stacked

__all__ = ["DION2_ADJUST_LR_MODES", "SELECTION_SCOPES", "dion2_accumulate", "dion2_error_feedback",
           "dion2_gather", "dion2_lr_scale", "dion2_num_selected", "dion2_select", "dion2_select_rows",
           "dion2_slice_norms", "dion2_update", "orthogonalize_selected"]

#: "global": one top-k per whole matrix (layout invariant); "local": one top-k per shard of the
#: selected dimension (microsoft/dion's default; equal to "global" on one process).
SELECTION_SCOPES = ("local", "global")
#: lr adjustments of microsoft/dion's Dion2 in our spelling ("rms_norm" is "match_rms_adamw").
DION2_ADJUST_LR_MODES = ("spectral_norm", "match_rms_adamw", None)


def dion2_select_rows(m: int, n: int) -> bool:
    """Rows (True) when m <= n, else columns: the shorter dimension of the **global** (m, n),
    ties to rows (microsoft/dion's rule for an unsharded matrix; here on every layout)."""
    return m <= n


def dion2_num_selected(fraction: float, size: int) -> int:
    """k = min(size, max(1, ⌈fraction·size⌉)), the product rounded in float64 first (as
    microsoft/dion's ``int(math.ceil(fraction * num_select))``). No checks (validated options)."""
    return min(size, max(1, int(math.ceil(fraction * size))))


def dion2_lr_scale(adjust_lr: str | None, m: int, n: int) -> float:
    """lr multiplier of the update: "spectral_norm" √(m/n), "match_rms_adamw" (microsoft/dion's
    "rms_norm") 0.2·√max(m, n), None 1; from the full matrix shape (``adjusted_lr_scale``)."""
    return adjusted_lr_scale(adjust_lr, m, n)


def dion2_accumulate(grad: torch.Tensor, momentum: torch.Tensor) -> torch.Tensor:
    """B = M + G in place in the momentum buffer (no μ: Dion2's decay is ``ef_decay`` on the
    selected slices); ``grad`` cast to the buffer's dtype first. Returns the buffer."""
    return momentum.add_(grad.to(momentum.dtype))


def dion2_slice_norms(b: torch.Tensor, rows: bool) -> torch.Tensor:
    """L1 norms of the rows (``rows``) or columns of each matrix: (..., m, n) -> (..., m) or
    (..., n), in B's dtype (``torch.linalg.vector_norm`` with ord 1)."""
    return torch.linalg.vector_norm(b, ord=1, dim=-1 if rows else -2)


def dion2_select(norms: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (..., k) of the k largest norms of each matrix, ascending (``torch.topk`` then a
    sort, so the gather and scatter below are in slice order). Ties: whatever ``torch.topk``
    picks (unspecified; the judge treats near-ties as a gauge)."""
    return torch.topk(norms, k, dim=-1, sorted=False).indices.sort(dim=-1).values


def _expand(indices: torch.Tensor, like: torch.Tensor, rows: bool) -> torch.Tensor:
    if rows:
        return indices.unsqueeze(-1).expand(*indices.shape, like.shape[-1])
    return indices.unsqueeze(-2).expand(*indices.shape[:-1], like.shape[-2], indices.shape[-1])


expand_indices = _expand  # the index tensor of a gather / scatter along the selected dimension


def dion2_gather(b: torch.Tensor, indices: torch.Tensor, rows: bool) -> torch.Tensor:
    """The selected submatrix: (..., k, n) rows or (..., m, k) columns of B (a copy)."""
    return torch.gather(b, -2 if rows else -1, _expand(indices, b, rows))


def dion2_error_feedback(momentum: torch.Tensor, indices: torch.Tensor, selected: torch.Tensor, rows: bool,
                         ef_decay: float) -> None:
    """M[S] ← ef_decay·B[S] in place (``selected`` = B[S] from ``dion2_gather``); the other slices
    keep B: what the update did not use stays in the momentum (microsoft/dion
    ``dion2_pre_orthogonalize``)."""
    momentum.scatter_(-2 if rows else -1, _expand(indices, momentum, rows), selected * ef_decay)


def orthogonalize_selected(sub: torch.Tensor, table, *, safety: float, eps: float, compute_dtype: torch.dtype | None,
                           precision: str | None = None, gram: bool | None = None, workspace=None) -> torch.Tensor:
    """Newton–Schulz on the selected submatrices (..., k, n) or (..., m, k), X₀ = X / (safety·‖X‖_F
    + eps), computed and returned in ``compute_dtype`` (None: the submatrix's dtype; microsoft/dion
    casts the submatrix to bfloat16 and runs Polar Express on it). ``gram``: Gram Newton–Schulz on
    the k × k side (``newton_schulz``'s ``gram``, validated by the caller with ``check_gram``): None
    for float32 / float64 compute from aspect ratio 2 (Dion2's default fraction 0.25 selects about
    a quarter of the short side: aspect ratio about 4 or more), True always (float16 is Dao AI
    Lab's gram-newton-schulz kernel, restarting before steps ``gram_restarts(T)``), False never.
    ``workspace``: an ``ortho_fast.functional.stacked.Workspace`` holding a 3-D batch's iterates
    (``newton_schulz_stacked``'s; the result is then a view of it, valid until its next use; None:
    allocated here). A patch point (module docstring; a planted replacement takes ``workspace``).
    Shapes: sub (..., k, n) or (..., m, k) -> the same shape, ``compute_dtype``."""
    dtype = sub.dtype if compute_dtype is None else compute_dtype
    if workspace is not None and sub.ndim == 3 and sub.is_contiguous():  # newton_schulz_stacked on one stack
        return newton_schulz_stack(sub, table, safety=safety, eps=eps, eps_mode="add", compute_dtype=dtype,
                                   precision=precision, gram=gram, workspace=workspace)
    if workspace is not None and sub.ndim == 3:  # the same calls as newton_schulz_resolved's batch path
        return newton_schulz_stacked([sub], table, safety=safety, eps=eps, eps_mode="add", compute_dtype=dtype,
                                     precision=precision, gram=gram, workspace=workspace)[0]
    return newton_schulz_resolved(sub, table, safety=safety, eps=eps, eps_mode="add", compute_dtype=dtype,
                                  precision=precision, out_dtype=dtype, gram=gram)


def dion2_update(weight: torch.Tensor, ortho: torch.Tensor, indices: torch.Tensor, rows: bool, *, lr: float,
                 weight_decay: float, lr_scale: float) -> None:
    """W ← W·(1 − lr·wd); W[S] ← W[S] − lr·s·O_S, in place in W's dtype (decoupled decay with the
    unscaled lr on every entry; microsoft/dion ``dion2_post_orthogonalize``).
    Shapes: weight (..., m, n); ortho (..., k, n) or (..., m, k); indices (..., k)."""
    weight.mul_(1 - lr * weight_decay)
    weight.scatter_add_(-2 if rows else -1, _expand(indices, weight, rows), ortho.to(weight.dtype) * (-lr * lr_scale))
