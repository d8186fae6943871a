"""The memory budget of the stacked Muon step: what ``ortho_fast.groups.muon.plan_stacks`` cuts a
shape group's chunks by (``ortho_fast.functional.stacked.workspace_budget``): the group's state,
torch.optim.Muon's temporaries for its largest matrix, the stages' temporaries per stacked entry,
and whether U is written straight into the bfloat16 stack (no float32 stack).
Source: docs/performance.md, "The stacked step".
"""

from __future__ import annotations

import math

import torch

from ..functional import muon_stages as stage_math
from ..functional import stacked as stacked_math
from .muon_stages import variance_shape
from .options import MuonOptions


def stage_nbytes_per_entry(options: MuonOptions, dtype: torch.dtype) -> int:
    """Peak bytes per stacked entry the pipeline stages allocate beside the workspace (their
    ``stage_dtype`` copies, ``ortho_fast.functional.muon_stages``): MuonEq's copy of U and its
    scaled result; Muon+'s copy and its scaled result; NorMuon's copy (scaled in place) and its
    squares (8 bytes per entry each in float32; Muon+ then NorMuon 12)."""
    size = stage_math.stage_dtype(dtype).itemsize
    after = (2 if options.renormalize else 0) + (2 if options.normuon_beta2 is not None else 0)
    return size * (2 * (options.equilibration is not None) + min(after, 3))


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
    once: its U (``p``'s dtype), the stages' temporaries (``stage_nbytes_per_entry``), and per
    matrix (m, n) of its layout the Newton–Schulz iterate, its successor and U's cast (three (m, n)
    of the compute dtype) with the (s, s) Gram matrix and polynomial, s = min(m, n)."""
    compute = (options.compute_dtype or p.dtype).itemsize
    total = p.numel() * (p.element_size() + stage_nbytes_per_entry(options, p.dtype))
    for shape in lay.matrix_shapes():
        *batch, m, n = shape
        s = min(m, n)
        total += math.prod(batch) * (3 * m * n + 2 * s * s) * compute
    return total


def cautious_nbytes(live, layout, options: MuonOptions) -> int:
    """Peak bytes of cautious weight decay's mask for the largest matrix of the group's live
    (index, parameter) pairs (``functional.muon.cautious_decay_factor``: four boolean comparisons,
    then the mask and the factor, one matrix at a time: at most 8 bytes per entry); 0 without
    cautious weight decay. The rest step's batches leave room for it (``rest_batches``' budget)."""
    if not options.cautious_weight_decay:
        return 0
    largest = max((math.prod(shape[-2:]) for i, p in live for shape in layout(i, p).matrix_shapes()), default=0)
    return 8 * largest


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
