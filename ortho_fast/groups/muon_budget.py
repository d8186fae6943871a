"""The memory budget of the stacked Muon step: what ``ortho_fast.groups.muon.plan_stacks`` cuts a
shape group's chunks by (``ortho_fast.functional.stacked.workspace_budget``): the group's state,
torch.optim.Muon's temporaries for its largest matrix, the stages' temporaries per stacked entry,
and whether U is written straight into the bfloat16 stack (no float32 stack).
Source: docs/performance.md, "The stacked step".
"""

from __future__ import annotations

import math

import torch

from ..functional import muon_stages as stage_math, stacked as stacked_math
from .muon_stages import variance_shape
from .options import MuonOptions


def stage_nbytes(options: MuonOptions, dtype: torch.dtype, m: int, n: int) -> int:
    """Peak bytes per (m, n) matrix of ``dtype`` parameters that the pipeline stages allocate beside
    the workspace in the stacked step (``ortho_fast.functional.muon_stages``), an upper bound of
    what ``benchmarks/_op_count.CountOps`` measures (tests/ortho_fast/test_normuon_stack.py).

    MuonEq: its ``stage_dtype`` copy of U and its scaled result (2 entries per matrix entry).
    Muon+ / NorMuon (``post_factors``: factors, no O-sized temporary): four per-matrix scalars
    (‖O‖_F, ‖Ô‖_F, Muon+'s factor) and, with NorMuon, per neuron (m rows or n columns,
    ``normuon_side``): the second moments concatenated (in the parameters' dtype), the neurons'
    norms and their mean squares or inverse divisors (in ``stage_dtype`` of the result), and the
    EMA's copies where the second moment is stored in another dtype than it is computed in
    (12 bytes per neuron for float32 parameters, 18 for bfloat16).
    Source: docs/performance.md, "The budget".
    """
    size = stage_math.stage_dtype(options.compute_dtype or dtype).itemsize
    total = 2 * stage_math.stage_dtype(dtype).itemsize * m * n if options.equilibration is not None else 0
    if options.renormalize or options.normuon_beta2 is not None:
        total += 4 * size
    if options.normuon_beta2 is not None:
        stored, ema = dtype.itemsize, stage_math.stage_dtype(dtype).itemsize
        per_neuron = stored + 2 * size + (ema + size if ema != size else 0) + (2 * ema if ema != stored else 0)
        total += per_neuron * (m if stage_math.normuon_side(m, n, options.normuon_dim) == "row" else n)
    return total


def writes_compute_dtype(options: MuonOptions, dtype: torch.dtype) -> bool:
    """Whether the stacked step writes U of ``dtype`` parameters straight into the bfloat16 stack
    (rounded once, as the cast of the float32 stack did; no float32 stack): bfloat16 Newton–Schulz
    of float32 / bfloat16 parameters (bfloat16 has float32's exponent range: the power-of-two
    scale then runs on the bfloat16 stack, exact) without MuonEq (which runs on U before the cast).
    float16 keeps the float32 stack: U above 65504 overflows the cast before it is scaled."""
    return (options.compute_dtype == torch.bfloat16 and dtype in (torch.float32, torch.bfloat16)
            and options.equilibration is None)


def state_bytes(live, layout, options: MuonOptions) -> tuple[int, int, int]:
    """What the workspace budget (``stacked.workspace_budget``) is derived from, over a group's
    live (index, parameter) pairs: the bytes of their momentum buffers (torch.optim.Muon's state),
    torch.optim.Muon's temporaries for the largest of their matrices
    (``stacked.torch_temporaries_nbytes``), and the bytes of NorMuon's second moments."""
    momentum = temporaries = extra = 0
    for i, p in live:
        momentum += p.numel() * p.element_size()
        lay = layout(i, p)
        temporaries = max(temporaries, stacked_math.torch_temporaries_nbytes(lay.m, lay.n, p.dtype))
        if options.normuon_beta2 is not None:
            extra += math.prod(variance_shape(lay, options.normuon_dim)) * p.element_size()
    return momentum, temporaries, extra


def rest_nbytes(p: torch.Tensor, lay, options: MuonOptions) -> int:
    """An upper bound on the bytes the step of the parameters left out of the stacks
    (``ortho_fast.groups.muon._rest_step``) allocates for parameter ``p`` of layout ``lay`` at
    once: its U (``p``'s dtype), and per matrix (m, n) of its layout the Newton–Schulz iterate,
    its successor and U's cast (three (m, n) of the compute dtype) with the (s, s) Gram matrix and
    polynomial, s = min(m, n), the stages' temporaries (``stage_nbytes``) and, with Muon+ or
    NorMuon, their result Ô (``post_orthogonalize``: one (m, n) in ``stage_dtype``)."""
    compute = (options.compute_dtype or p.dtype).itemsize
    post = stage_math.stage_dtype(p.dtype).itemsize if options.renormalize or options.normuon_beta2 is not None else 0
    total = p.numel() * p.element_size()
    for shape in lay.matrix_shapes():
        *batch, m, n = shape
        s = min(m, n)
        total += math.prod(batch) * ((3 * compute + post) * m * n + 2 * s * s * compute
                                     + stage_nbytes(options, p.dtype, m, n))
    return total


def cautious_nbytes(live, layout, options: MuonOptions) -> int:
    """Peak bytes of cautious weight decay's mask for the largest matrix of the group's live
    (index, parameter) pairs (``functional.muon.cautious_decay_factor``: four boolean comparisons,
    then the mask and the factor, one matrix at a time: at most 8 bytes per entry); 0 without
    cautious weight decay. The rest step's batches leave room for it (``rest_batches``' budget)."""
    if not options.cautious_weight_decay:
        return 0
    sizes = [math.prod(shape[-2:]) for i, p in live for shape in layout(i, p).matrix_shapes()]
    return 8 * max(sizes) if sizes else 0  # (no max(..., default=): torch.compile does not take it)


def rest_batches(rest, layout, options: MuonOptions, budget: int) -> list[list]:
    """The parameters left out of the stacks (``rest``: (index, parameter) pairs in order) cut, in
    order, into batches whose ``rest_nbytes`` sum to at most ``budget`` bytes (a parameter larger
    than that is a batch of its own): the rest step runs batch after batch, so its temporaries stay
    within the stacked step's workspace budget (``stacked.workspace_budget``) as the chunks do.
    Without ``options.batched`` every parameter is its own batch (one parameter's temporaries at
    a time, as torch.optim.Muon)."""
    batches: list[list] = []
    used = 0
    for i, p in rest:
        cost = rest_nbytes(p, layout(i, p), options)
        if not options.batched or not batches or used + cost > budget:
            batches.append([])
            used = 0
        batches[-1].append((i, p))
        used += cost
    return batches


def cached_plan(cache: dict | None, live, compute, key=()):
    """``compute()`` (a step's plan: chunks, batches, workspace sizes), kept in ``cache`` (the group's
    layout cache, ``MuonGroups.per_group``: dropped when an option other than lr / weight_decay /
    momentum changes) while the group's live parameters are the same tensors with the same index,
    shape, dtype, device and contiguity and ``key`` is equal (the options it was planned with, but for
    the scalars a scheduler sets: a chunk keeps what it derived from them); None or under
    ``torch.compile``: computed every time.
    The plan holds the parameters, so their ``id`` stays theirs while it is cached."""
    if cache is None or torch.compiler.is_compiling():
        return compute()
    signature = (key, tuple((i, id(p), p.shape, p.dtype, p.device, p.is_contiguous()) for i, p in live))
    hit = cache.get("plan")
    if hit is not None and hit[0] == signature:
        return hit[1]
    plan = compute()
    cache["plan"] = (signature, plan, [p for _, p in live])
    return plan


def step_plan(live, layout, options: MuonOptions, plan_stacks):
    """A step's plan (``cached_plan``): the chunks (``plan_stacks``, ``ortho_fast.groups.muon``'s), the
    rest's batches within the stacks' workspace budget (``rest_batches``), the stacked parameters in
    order and the workspace each device reserves (its largest chunk)."""
    budget_from = state_bytes(live, layout, options)
    chunks, rest = plan_stacks(live, layout, options, budget_from)
    rest_budget = stacked_math.workspace_budget(*budget_from) - cautious_nbytes(rest, layout, options)
    sizes: dict = {}
    for c in chunks:
        device = c.members[0][0].device
        sizes[device] = max(sizes.get(device, 0), c.nbytes)
    return (chunks, list(rest_batches(rest, layout, options, rest_budget)),
            [p for chunk in chunks for p, _, _ in chunk.members], sizes)


def cached_views(cache: dict, name: str, x: torch.Tensor, make, pools) -> list:
    """``make()`` (views of the workspace tensor ``x``: a chunk's matrices), kept in ``cache`` under
    ``name`` while ``x`` has the same address, shape, strides and dtype (a workspace hands the same
    bytes to a chunk at every step; the views cached keep their storage alive, so an address is not
    reused by another while they are held). Only views of a workspace pool (``pools``: the
    addresses of ``stacked.Workspace.data_ptrs``) are kept: nothing else is held between steps.
    Under ``torch.compile`` made every time."""
    if torch.compiler.is_compiling() or x.untyped_storage().data_ptr() not in pools:
        return make()
    key = (x.data_ptr(), x.shape, x.stride(), x.dtype, x.device)
    hit = cache.get(name)
    if hit is not None and hit[0] == key:
        return hit[1]
    out = make()
    cache[name] = (key, out)
    return out
