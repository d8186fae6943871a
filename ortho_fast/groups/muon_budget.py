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
