"""Dion2's planned step: the chunks of a group (``Dion2Chunk``), their workspace sizes, and the step of a
plan over them (``run_dion2_plan``).

``ortho_fast.groups.dion2`` plans a group once per change of the group (its parameters with a
gradient, their shapes, its options other than lr / weight_decay / ef_decay) and hands the plan
here at every step: the kernels of a step read only the plan, the state and the three scalars.
Source: microsoft/dion ``dion2_update_megabatch_async`` (unsharded path); docs/performance.md,
"Dion2's workspace".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..functional import dion2 as dion2_math, stacked as stacked_math
from ..functional.graph_scalars import foreach_scale_
from ..validation import local_tensor
from .muon_plan import chunk_run

__all__ = ["Dion2Chunk", "dion2_budget", "dion2_chunk_nbytes", "dion2_small_nbytes", "matrices", "matrices_per",
           "run_dion2_plan", "write_back"]


def matrices(t: torch.Tensor, flatten: bool) -> torch.Tensor:
    """A view of a parameter-shaped tensor as (..., m, n) matrices (``dion2_matrix_shape``); a
    non-contiguous ≥ 3-D tensor with ``flatten`` gives a copy (``write_back`` stores it)."""
    return t.reshape(t.shape[0], -1) if flatten and t.ndim > 2 else t


def write_back(t: torch.Tensor, mats: torch.Tensor) -> None:
    """Store ``mats`` (from ``matrices(t, ...)``) into ``t`` when it was a copy, not a view."""
    if mats is not t and mats.data_ptr() != t.data_ptr():
        t.copy_(mats.reshape(t.shape))


def dion2_chunk_nbytes(c: int, m: int, n: int, k: int, rows: bool, dtype: torch.dtype,
                       compute_dtype: torch.dtype) -> int:
    """Workspace bytes of one chunk of c (m, n) matrices of ``dtype`` whose k rows (``rows``) or
    columns are selected: the momentum stack (``dtype``), the selected submatrix (``dtype``) and
    ``stacked.chunk_nbytes``'s Newton–Schulz buffers on the (c, k, n) / (c, m, k) submatrix (two
    ``compute_dtype`` stacks and the polynomial), each buffer aligned as ``stacked.Workspace``
    places it."""
    sub_m, sub_n = (k, n) if rows else (m, k)

    def align(nbytes):
        return -(-nbytes // stacked_math.ALIGN) * stacked_math.ALIGN
    return (align(c * m * n * dtype.itemsize) + align(c * sub_m * sub_n * dtype.itemsize)
            + stacked_math.chunk_nbytes(c, sub_m, sub_n, None, compute_dtype))


def dion2_small_nbytes(c: int, m: int, n: int, k: int, rows: bool, dtype: torch.dtype) -> int:
    """Bytes a chunk of c (m, n) matrices allocates beside the workspace at once: the L1 norms
    of its m rows or n columns (``dtype``), and the top-k values (``dtype``) and int64 indices with
    their sorted copies (``dion2_select``)."""
    return c * ((m if rows else n) * dtype.itemsize + k * (dtype.itemsize + 3 * 8))


def matrices_per(shape, flatten: bool) -> int:
    """How many (m, n) matrices one parameter of ``shape`` holds (its leading dims; 1 flattened)."""
    return 1 if flatten or len(shape) == 2 else int(torch.Size(shape[:-2]).numel())


def dion2_budget(params: list[torch.Tensor], options) -> int:
    """The workspace budget of a Dion2 group (``stacked.workspace_budget``, Muon's): from its
    momentum (torch.optim.Muon's state for the same parameters) and torch.optim.Muon's
    temporaries for its largest matrix (``options``: the group's ``Dion2Options``; its ``flatten``)."""
    flatten = options.flatten
    state = sum(p.numel() * p.element_size() for p in params)
    temporaries = 0  # (no max(..., default=): torch.compile does not take it)
    for p in params:
        m, n = (p.shape[0], int(torch.Size(p.shape[1:]).numel())) if flatten and p.ndim > 2 else p.shape[-2:]
        temporaries = max(temporaries, stacked_math.torch_temporaries_nbytes(m, n, p.dtype))
    return stacked_math.workspace_budget(state, temporaries)


@dataclass
class Dion2Chunk:
    """Parameters of one shape, dtype and device stepped as one stack, with what their step reads
    resolved: the (m, n) of their matrices, ``rows`` (the selected dimension), ``k`` (slices
    selected per matrix), ``scale`` (the lr multiplier), ``flatten``, ``local`` (a DTensor among
    them: stepped on its local copy), the stack's and the submatrix's shapes (``stack_shape``
    (0,) for a chunk of one: the buffer itself), ``batched_update`` (``batched_update_pays``),
    ``nbytes`` (its workspace), ``slots`` (the parameters' positions among the group's
    live parameters) and ``views`` (views of its workspace stack, kept while the
    workspace hands out the same bytes)."""

    params: list
    m: int
    n: int
    rows: bool
    k: int
    scale: float
    flatten: bool
    local: bool
    stack_shape: tuple
    sub_shape: tuple
    dtype: torch.dtype
    device: torch.device
    nbytes: int
    batched_update: bool
    slots: list = field(default_factory=list)  # the parameters' positions in the plan's live list
    views: dict = field(default_factory=dict)


def _unbound(chunk: Dion2Chunk, b: torch.Tensor, kept: dict | None = None) -> list[torch.Tensor]:
    """``b.unbind(0)`` (the stack's matrices), kept in ``kept`` (the chunk's ``Replay.cache``: b is then the
    same buffer at every step) or else in ``chunk.views`` while the workspace gives the chunk the same bytes
    (the views hold the pool alive, so the address is not reused meanwhile)."""
    if torch.compiler.is_compiling():
        return list(b.unbind(0))
    if kept is not None:
        hit = kept.get("unbind")
        if hit is None or hit[0] is not b:
            hit = kept["unbind"] = (b, list(b.unbind(0)))
        return hit[1]
    key = (b.data_ptr(), b.shape, b.dtype, b.device)
    hit = chunk.views.get("unbind")
    if hit is None or hit[0] != key:
        hit = chunk.views["unbind"] = (key, list(b.unbind(0)))
    return hit[1]


def _stack_and_sub(chunk: Dion2Chunk, workspace, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk's (c, m, n) stack and (c, k, n) / (c, m, k) submatrix buffers, both of its dtype: one
    request to ``workspace`` (a ``stacked.Workspace`` or the chunk's ``Replay`` of it) holding the two at
    ``stacked.ALIGN``-aligned offsets (the bytes two requests would give), the views kept in the
    ``Replay``'s cache, or else in ``chunk.views`` while the workspace gives the same bytes."""
    dtype, size = chunk.dtype, chunk.dtype.itemsize
    kept = getattr(workspace, "cache", None)
    if kept is not None and getattr(workspace, "recorded", False) and "buffers" in kept:
        return kept["buffers"]
    if torch.compiler.is_compiling():
        return (workspace.get("dion2_stack", chunk.stack_shape, dtype, device),
                workspace.get("dion2_sub", chunk.sub_shape, dtype, device))
    stack_bytes = math.prod(chunk.stack_shape) * size
    start = -(-stack_bytes // stacked_math.ALIGN) * stacked_math.ALIGN
    end = start + math.prod(chunk.sub_shape) * size
    region = workspace.get("dion2", (end,), torch.uint8, device)
    key = (region.data_ptr(), region.device)
    hit = chunk.views.get("buffers")
    if hit is None or hit[0] != key:
        hit = chunk.views["buffers"] = (key, (region[:stack_bytes].view(dtype).view(chunk.stack_shape),
                                              region[start:end].view(dtype).view(chunk.sub_shape)))
    if kept is not None:
        kept["buffers"] = hit[1]
    return hit[1]


@torch.no_grad()
def run_dion2_plan(plan, state, lr, weight_decay, ef_decay, workspace: stacked_math.Workspace) -> None:
    """One Dion2 step of a planned group (``ortho_fast.groups.dion2.Dion2Plan``): the momentum of
    every parameter of ``plan.live`` created where missing, B = M + G and the decay W ← W·(1 − lr·wd)
    of each of ``plan.families`` (positions in ``live`` of one dtype and device: one ``_foreach`` op
    each), the workspace reserved (``plan.reserve``: bytes per device), then ``chunk_step`` per
    chunk. The same bits as the step per chunk (each entry's decay and accumulation are
    elementwise, before any read of it)."""
    live, local = plan.live, plan.local
    moms = []
    for p in live:
        st = state[p]
        m = st.get("momentum")
        if m is None:
            m = st["momentum"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        moms.append(local_tensor(m) if local else m)
    decay = 1 - lr * weight_decay
    for slots, own in plan.families:  # own: bfloat16 / float16 on the CPU (``foreach_scale_``'s own ``mul_``)
        if local:
            ps, gs = [local_tensor(live[i]) for i in slots], [local_tensor(live[i].grad) for i in slots]
        else:
            ps, gs = [live[i] for i in slots], [live[i].grad for i in slots]
        torch._foreach_add_([moms[i] for i in slots], gs)  # dion2_accumulate (checked: one dtype)
        foreach_scale_(ps, decay, split=(ps, []) if own else ([], ps))  # dion2_update's decay
    if not torch.compiler.is_compiling():  # under torch.compile every request is a fresh buffer
        for device, nbytes in plan.reserve.items():
            workspace.reserve(nbytes, device)
    options = plan.options
    for chunk in plan.chunks:
        chunk_step(chunk, [moms[i] for i in chunk.slots], lr, ef_decay, options, workspace)


def chunk_step(chunk: Dion2Chunk, moms: list, lr, ef_decay, options, workspace) -> None:
    """Dion2 on one chunk whose momentum ``moms`` (local tensors) holds B and whose weights are
    decayed (``run_dion2_plan``): the (c, m, n) stack of B, the top-k slices by L1 norm, B_S
    gathered, M[S] ← ef_decay·B[S], O_S = Newton–Schulz(B_S) and W[S] −= lr·s·O_S (three batched
    launches where ``chunk.batched_update``, else one ``scatter_add_`` per matrix: the same bits).
    ``options``: the group's ``Dion2Options`` (its Newton–Schulz settings)."""
    params, rows, flatten = chunk.params, chunk.rows, chunk.flatten
    buffers = [matrices(m, flatten) for m in moms] if flatten else moms
    dim = -2 if rows else -1
    # the chunk's frame of the workspace starts here, stacked or not (``Workspace.get``); its views are
    # recorded at the chunk's first step and replayed while the workspace keeps its pools (``chunk_run``)
    run = chunk_run(chunk, workspace)
    kept = getattr(run, "cache", None)
    b, sub = _stack_and_sub(chunk, run, buffers[0].device)
    stacked = len(buffers) > 1
    if stacked:
        torch.stack(buffers, out=b)
    else:
        b = buffers[0].unsqueeze(0)
    indices = dion2_math.dion2_select(dion2_math.dion2_slice_norms(b, rows), chunk.k)
    index = dion2_math.expand_indices(indices, b, rows)
    torch.gather(b, dim, index, out=sub)  # dion2_gather
    ortho = dion2_math.orthogonalize_selected(sub, options.table, safety=options.safety, eps=options.epsilon,
                                              compute_dtype=options.compute_dtype, precision=options.precision,
                                              gram=options.gram, workspace=run if sub.ndim == 3 else None)
    if kept is not None:
        run.done()
    # the error feedback on the stack (dion2_error_feedback, with ef_decay·B[S] formed in sub's
    # bytes: the same multiply), written back into every buffer with one copy
    b.scatter_(dim, index, sub.mul_(ef_decay))
    if stacked:
        torch._foreach_copy_(buffers, _unbound(chunk, b, kept))
    if chunk.local or flatten:
        for m, buf in zip(moms, buffers):
            write_back(m, buf)
        weights = [matrices(local_tensor(p), flatten) for p in params]
    else:
        weights = params
    # delta = ortho.to(W's dtype) · (−lr·s), formed in sub's bytes where it has W's dtype
    factor = -lr * chunk.scale
    if sub.dtype == weights[0].dtype:
        delta = sub.copy_(ortho).mul_(factor) if ortho.dtype != sub.dtype else torch.mul(ortho, factor, out=sub)
    else:
        delta = ortho.to(weights[0].dtype) * factor
    if chunk.batched_update and b.dtype == delta.dtype:
        # W[S] -= lr·s·O_S for the batch: three launches, not one per matrix
        b.fill_(-0.0)  # the stack is copied back already; w + (-0.0) is w, bit for bit
        b.scatter_(dim, index, delta)
        torch._foreach_add_(weights, _unbound(chunk, b, kept))
    else:  # one matrix, a stack of another dtype than the update, or a chunk whose bytes outweigh its
        # launches (``batched_update_pays``): one scatter_add_ per matrix, the same bits
        for j, w in enumerate(weights):
            w.scatter_add_(dim, dion2_math.expand_indices(indices[j], w, rows), delta[j])
    if chunk.local or flatten:
        for p, w in zip(params, weights):
            write_back(local_tensor(p), w)
