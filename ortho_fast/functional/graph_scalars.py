"""In-place updates scaled by a Python float (an lr, a decay factor) in the form each mode wants.

Eager: the fused forms (``add_(src, alpha=s)``, ``addmm_(a, b, alpha=s)``, ``_foreach_mul_(ts, s)``,
``_foreach_add_(ts, srcs, alpha=s)``): one kernel, torch.optim's bits. Under ``torch.compile``
a float given as ``alpha=`` or as a ``_foreach`` scalar stays a constant of the graph (AOT's
tensorify pass specializes it: measured on torch 2.13, 5 graphs for 5 values), so an lr that a
scheduler changes at every step recompiled the step at every step until dynamo's recompile limit;
a float that multiplies a tensor becomes a graph input after the second compile. So under
compile these write the same update as a product then a sum (inductor fuses them; within
``ortho_verify.tolerances.compiled_tolerance`` of eager). Source: torch 2.13
``torch/fx/passes/_tensorify_python_scalars.py``; docs/performance.md, "(d)".

A 0-dim tensor in place of the float (``capturable=True``: an lr on the parameters' device, which a
scheduler or a captured CUDA graph's caller writes) takes the same product form in eager too: the
tensor is an operand of the kernels, never read on the host (``is_device_scalar``).
"""

from __future__ import annotations

import math
import operator
from typing import Sequence

import torch


def is_device_scalar(value) -> bool:
    """Whether a hyperparameter is a tensor (a 0-dim one on the parameters' device, ``capturable=True``):
    then it is an operand of the kernels and is never read on the host."""
    return isinstance(value, torch.Tensor)


def as_operand(value):
    """A float hyperparameter as a float; a tensor one (``capturable``) as it is: never read on the host."""
    return value if is_device_scalar(value) else float(value)


def lerp_weight(weight: float | torch.Tensor, n: int):
    """The ``weight`` argument of a ``_foreach_lerp_`` / ``_foreach_lerp`` over ``n`` tensors: a float as it
    is; a 0-dim tensor as a list of it (the ``List`` overload: read on the device, where the tensor
    overload reads the weight on the host; lerp's formula, eager's bits for a weight in the tensors'
    dtype; on CUDA broadcast weights take torch's per-tensor path, which a captured graph replays cheaply)."""
    return [weight] * n if is_device_scalar(weight) else weight


def add_scaled_(dst: torch.Tensor, src: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """dst ← dst + alpha·src in place (src cast to dst's dtype under compile or for a tensor
    ``alpha``); returns dst."""
    if torch.compiler.is_compiling() or is_device_scalar(alpha):
        return dst.add_(src.to(dst.dtype) * alpha)
    return dst.add_(src, alpha=alpha)


def addmm_scaled_(dst: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float | torch.Tensor
                   ) -> torch.Tensor:
    """dst ← dst + alpha·(a @ b) in place; returns dst."""
    if torch.compiler.is_compiling() or is_device_scalar(alpha):
        return dst.add_((a @ b) * alpha)
    return dst.addmm_(a, b, alpha=alpha)


def foreach_add_scaled_(dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor], alpha: float,
                        buffers: Sequence[torch.Tensor] | None = None) -> None:
    """dsts[i] ← dsts[i] + alpha·srcs[i] in place, for every i (one ``_foreach_add_`` in eager).

    ``buffers``: one tensor of the dsts' dtype per src with its number of entries (free
    workspace), or None. Given, the srcs are first copied into them with one ``_foreach_copy_``
    (a cast copy: one CUDA launch, where a ``_foreach_add_`` whose lists differ in dtype takes
    torch's slow path, one launch per tensor), then added with one same-dtype ``_foreach_add_``.
    The bits are those without them: the cast to a wider float is exact and the sum is computed in
    the dsts' dtype either way. Changes ``buffers``. A tensor ``alpha`` (0-dim): the srcs (in
    ``buffers`` when given, else in new tensors of the dsts' dtypes) times alpha with one
    ``_foreach_mul``, then one ``_foreach_add_``: the product rounded to the dsts' dtype first."""
    if torch.compiler.is_compiling():
        for d, s in zip(dsts, srcs):
            d.add_(s.to(d.dtype) * alpha)
        return
    srcs, dsts = list(srcs), list(dsts)
    if buffers is not None:
        views = [b.view(s.shape) for b, s in zip(buffers, srcs)]
        torch._foreach_copy_(views, srcs)
        srcs = views
    if is_device_scalar(alpha):
        if buffers is not None:
            torch._foreach_mul_(srcs, alpha)
        else:
            srcs = torch._foreach_mul([s if s.dtype == d.dtype else s.to(d.dtype) for d, s in zip(dsts, srcs)], alpha)
        torch._foreach_add_(dsts, srcs)
        return
    torch._foreach_add_(dsts, srcs, alpha=alpha)


#: Dtypes whose CPU ``_foreach_mul_`` by a Python float rounds the factor to the tensor's dtype
#: first (torch 2.13: 48 / 50 of 50 random bfloat16 / float16 cases differ from ``mul_``, which
#: multiplies in float32); CUDA's foreach kernels take the factor in float32, as ``mul_`` does.
CPU_ROUNDED_FACTOR_DTYPES = (torch.bfloat16, torch.float16)


def split_rounded(ts: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``ts`` as (own, rest): the bfloat16 / float16 tensors on the CPU (``CPU_ROUNDED_FACTOR_DTYPES``),
    which ``foreach_scale_`` scales one by one, and the others, scaled by one ``_foreach_mul_``."""
    ts = list(ts)
    own = [t for t in ts if t.device.type == "cpu" and t.dtype in CPU_ROUNDED_FACTOR_DTYPES]
    return own, ([t for t in ts if not (t.device.type == "cpu" and t.dtype in CPU_ROUNDED_FACTOR_DTYPES)]
                 if own else ts)


def foreach_scale_(ts: Sequence[torch.Tensor], factor: float | torch.Tensor, split=None) -> None:
    """ts[i] ← factor·ts[i] in place, for every i, with the bits of ``ts[i].mul_(factor)``: one
    ``_foreach_mul_`` in eager, except for bfloat16 / float16 tensors on the CPU, which take their
    own ``mul_`` (``CPU_ROUNDED_FACTOR_DTYPES``; on the CPU a launch costs nothing), and a float
    factor of float32 / float64 CPU tensors is passed as a 0-dim tensor (``cpu_factor``). ``split``:
    ``split_rounded(ts)`` made ahead (a plan keeps it)."""
    if torch.compiler.is_compiling():
        for t in ts:
            t.mul_(factor)
        return
    own, rest = split_rounded(ts) if split is None else split
    for t in own:
        t.mul_(factor)
    if rest:
        if type(factor) is float:
            factor = cpu_factor(factor, rest)
        torch._foreach_mul_(rest, factor)


#: The dtypes ``cpu_factor`` gives a tensor factor (the others: ``CPU_ROUNDED_FACTOR_DTYPES``, mul_ each).
CPU_TENSOR_FACTOR_DTYPES = (torch.float32, torch.float64)
#: The 0-dim CPU tensors ``cpu_factor`` made last, by (value, dtype): a decay factor and a momentum.
_CPU_FACTORS: dict[tuple, torch.Tensor] = {}
_IS_CPU, _DTYPE = operator.attrgetter("is_cpu"), operator.attrgetter("dtype")


def cpu_factor(factor: float, ts: Sequence[torch.Tensor]) -> float | torch.Tensor:
    """The factor of ``_foreach_mul_(ts, factor)``: for CPU tensors all of one dtype in
    ``CPU_TENSOR_FACTOR_DTYPES``, ``factor`` as a 0-dim CPU tensor of that dtype, else the float
    itself. On the CPU torch's ``_foreach_mul_`` by a float wraps it into a tensor for every entry
    of the list, where it reads a 0-dim tensor once (torch 2.13; docs/performance.md, "(d)", measures
    the step with it); the factor is rounded to the tensors' dtype either way (the
    same bits, tests/ortho_fast/test_foreach_scale.py), and a 0-dim tensor of the lists' dtype
    keeps CUDA's fast route (where the float form is one launch already and is kept). The tensors
    are kept for the next call with the same value (at most eight; never written: operands only)."""
    dtype = ts[0].dtype
    if dtype not in CPU_TENSOR_FACTOR_DTYPES or not all(map(_IS_CPU, ts)) or len(set(map(_DTYPE, ts))) != 1:
        return factor
    key = (factor, math.copysign(1.0, factor), dtype)  # (−0.0 and 0.0 are equal keys, not equal factors)
    hit = _CPU_FACTORS.get(key)
    if hit is None:
        hit = torch.tensor(factor, dtype=dtype, device="cpu")
        if type(hit) is torch.Tensor:  # (nothing a fake or other tensor mode made is kept)
            if len(_CPU_FACTORS) >= 8:
                _CPU_FACTORS.clear()
            _CPU_FACTORS[key] = hit
    return hit
