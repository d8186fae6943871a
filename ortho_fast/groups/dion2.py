"""Dion2 param groups: defaults, options resolved once, the checks and the step of a group.

The contract every optimizer owning Dion2 groups drives (``Dion2``, ``HybridOptimizer``):
``DION2_DEFAULTS``, ``resolve_dion2_options`` (a frozen ``Dion2Options``),
``normalize_dion2_group``, ``check_dion2_step`` (before any change) and ``dion2_group_step``;
``Dion2Groups`` runs them with the options cached (``OptionsCache``). The math is in
``ortho_fast.functional.dion2``. Source: microsoft/dion ``dion/dion2.py``; docs/math.md, "Dion2".
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping

import torch

from ..coefficients import resolve_coefficients, schedule_of
from ..functional import dion2 as dion2_math, stacked as stacked_math
from ..functional.dion2 import DION2_ADJUST_LR_MODES, SELECTION_SCOPES
from ..functional.graph_scalars import foreach_scale_
from ..functional.newton_schulz import resolve_compute_dtype
from ..validation import (
    FiniteCheck,
    check_choice,
    check_count,
    check_filled,
    check_grad,
    check_hyper,
    check_param_shaped_state,
    local_tensor,
)
from .driver import GroupRunner
from .options import DeviceHypers, OptionsCache, check_device_hyper, check_gram_option

__all__ = ["DION2_DEFAULTS", "DION2_OPTION_KEYS", "Dion2Groups", "Dion2Options", "check_dion2_step",
           "LAUNCH_BYTES", "batched_update_pays", "dion2_budget", "dion2_chunk_nbytes", "dion2_chunks",
           "dion2_small_nbytes", "dion2_group_step",
           "dion2_matrix_shape", "matrices", "normalize_dion2_group",
           "resolve_dion2_options", "write_back"]

#: Every key of a Dion2 param group with its default: microsoft/dion ``Dion2``'s defaults
#: (lr 0.01, fraction 0.25, ef_decay 0.95, weight_decay 0.01, epsilon 1e-8, adjust_lr
#: "spectral_norm", flatten False, Polar Express with safety 1.02 in bfloat16, selection_scope
#: "local"). ``coefficients`` / ``ns_steps`` / ``safety`` (None: the schedule's) / ``dtype`` (the
#: Newton–Schulz compute dtype) / ``gram`` are ours; microsoft/dion's ``use_polar_express=False`` is
#: ``coefficients="cesista5"``. ``gram`` is Muon's option (``MUON_DEFAULTS["gram"]``) on the selected
#: submatrix: None takes Gram Newton–Schulz for float32 / float64 compute (not "high") from aspect
#: ratio 2 (``use_gram``; the bfloat16 default never), True always (float16 / float32 / float64
#: ``dtype``: float16 is Dao AI Lab's gram-newton-schulz kernel, microsoft/dion's
#: ``use_gram_newton_schulz``, restarting every second step), False never.
DION2_DEFAULTS: dict[str, object] = dict(
    lr=0.01, fraction=0.25, ef_decay=0.95, weight_decay=0.01, epsilon=1e-8, adjust_lr="spectral_norm",
    flatten=False, coefficients="polar_express", ns_steps=None, safety=None, dtype=torch.bfloat16,
    selection_scope="local", gram=None, capturable=False,
)
#: The hyperparameters a ``capturable`` Dion2 group keeps as 0-dim tensors on the parameters' device.
DION2_DEVICE_HYPERS = ("lr", "weight_decay", "ef_decay")
#: The group keys a ``Dion2Options`` is resolved from.
DION2_OPTION_KEYS = tuple(DION2_DEFAULTS)


@dataclass(frozen=True)
class Dion2Options:
    """A Dion2 group's options, validated (``resolve_dion2_options``): floats, the coefficient
    table, the resolved safety and compute dtype, ``gram`` (None / True / False, ``check_gram``)."""

    lr: float
    fraction: float
    ef_decay: float
    weight_decay: float
    epsilon: float
    adjust_lr: str | None
    flatten: bool
    table: tuple
    safety: float
    compute_dtype: torch.dtype
    precision: str | None
    selection_scope: str
    gram: bool | None = None
    #: torch's ``capturable``: lr, weight_decay, ef_decay reach the kernels as 0-dim device tensors
    capturable: bool = False


def resolve_dion2_options(group: dict) -> Dion2Options:
    """Validate every option of a Dion2 group filled with ``DION2_DEFAULTS``, changing nothing.
    Raises: ValueError / TypeError whose message starts with the key; UnknownScheduleError for an
    unknown schedule name."""
    check_filled(group, DION2_DEFAULTS, "Dion2")
    if not isinstance(group["capturable"], bool):
        raise TypeError(f"capturable: expected a bool, got {group['capturable']!r}")
    hypers = {key: check_device_hyper(group[key], key, group["capturable"]) for key in DION2_DEVICE_HYPERS}
    for key, kw in (("lr", {}), ("fraction", {"high": 1.0, "low_open": True}), ("ef_decay", {"high": 1.0}),
                    ("weight_decay", {}), ("epsilon", {})):
        if key not in DION2_DEVICE_HYPERS or not isinstance(group[key], torch.Tensor):
            hypers[key] = check_hyper(group[key], key, **kw)
    if not isinstance(group["flatten"], bool):
        raise TypeError(f"flatten: expected a bool, got {group['flatten']!r}")
    check_choice(group["adjust_lr"], "adjust_lr", DION2_ADJUST_LR_MODES)
    check_choice(group["selection_scope"], "selection_scope", SELECTION_SCOPES)
    if group["ns_steps"] is not None:
        check_count(group["ns_steps"], "ns_steps")
    table = tuple(resolve_coefficients(group["coefficients"], group["ns_steps"]))
    named = schedule_of(group["coefficients"])
    safety = group["safety"] if group["safety"] is not None else named.safety if named else 1.0
    check_hyper(safety, "safety", low_open=True)
    compute_dtype, precision = resolve_compute_dtype(group["dtype"])
    check_gram_option(group["gram"], compute_dtype, precision)
    return Dion2Options(lr=hypers["lr"], fraction=hypers["fraction"], ef_decay=hypers["ef_decay"],
                        weight_decay=hypers["weight_decay"], epsilon=hypers["epsilon"], capturable=group["capturable"],
                        adjust_lr=group["adjust_lr"], flatten=group["flatten"], table=table, safety=float(safety),
                        compute_dtype=compute_dtype, precision=precision, selection_scope=group["selection_scope"],
                        gram=group["gram"])


def dion2_matrix_shape(shape, flatten: bool) -> tuple[int, int]:
    """(m, n) of each matrix Dion2 works on: the last two dims, or (shape[0], prod(shape[1:]))
    for a ≥ 3-D parameter with ``flatten`` (microsoft/dion's ``flatten``)."""
    if flatten and len(shape) > 2:
        return shape[0], int(torch.Size(shape[1:]).numel())
    return shape[-2], shape[-1]


def _name(group: dict, index: int, p: torch.Tensor) -> str:
    names = group.get("param_names")
    return repr(names[index]) if names else f"parameter {index} (shape {tuple(p.shape)})"


def normalize_dion2_group(group: dict) -> None:
    """Validate one Dion2 param group filled with ``DION2_DEFAULTS``: every option, then every
    parameter (floating, ≥ 2 dims, non-empty). Raises: ValueError / TypeError naming the key
    ("params: ..." for a parameter). Changes nothing."""
    resolve_dion2_options(group)
    for i, p in enumerate(group["params"]):
        if not p.is_floating_point() or p.is_complex():
            raise TypeError(f"params: Dion2 expects real floating-point parameters, got {p.dtype} "
                            f"({_name(group, i, p)})")
        if p.ndim < 2 or p.numel() == 0:
            raise ValueError(f"params: Dion2 expects non-empty matrix parameters (ndim >= 2), got shape "
                             f"{tuple(p.shape)} ({_name(group, i, p)})")


def check_dion2_step(group: dict, state: Mapping[torch.Tensor, dict], options: Dion2Options | None = None,
                     finite: FiniteCheck | None | bool = True) -> None:
    """Check everything one ``dion2_group_step`` reads; change nothing: the options (unless the
    caller passes them resolved), each gradient (dense, real, the parameter's shape, dtype and
    device, finite: True here, a ``FiniteCheck`` collects, False skips) and an existing
    ``momentum`` (a tensor of the parameter's shape and dtype).
    Raises: ValueError / TypeError starting with the key, or "grad" / "momentum" naming the parameter."""
    options = resolve_dion2_options(group) if options is None else options
    for i, p in enumerate(group["params"]):
        if p.grad is None:
            continue
        name = _name(group, i, p)
        check_grad(p, name, "Dion2", finite)
        check_param_shaped_state(state, p, "momentum", name)


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


def dion2_chunks(params: list[torch.Tensor], options: Dion2Options, budget: int | None) -> list[list[torch.Tensor]]:
    """``params`` (one shape, dtype and device) cut, in order, into chunks whose workspace
    (``dion2_chunk_nbytes``) and other temporaries (``dion2_small_nbytes``) sum to at most
    ``budget`` bytes (at least one matrix each; None: one chunk)."""
    if budget is None or not params:
        return [params] if params else []
    m, n = dion2_matrix_shape(params[0].shape, options.flatten)
    rows = dion2_math.dion2_select_rows(m, n)
    k = dion2_math.dion2_num_selected(options.fraction, m if rows else n)
    per = matrices_per(params[0].shape, options.flatten)
    dtype = params[0].dtype
    def cost(c):
        return (dion2_chunk_nbytes(c * per, m, n, k, rows, dtype, options.compute_dtype or dtype)
                          + dion2_small_nbytes(c * per, m, n, k, rows, dtype))
    c = 1
    while c < len(params) and cost(c + 1) <= budget:
        c += 1
    return [params[i:i + c] for i in range(0, len(params), c)]


def matrices_per(shape, flatten: bool) -> int:
    """How many (m, n) matrices one parameter of ``shape`` holds (its leading dims; 1 flattened)."""
    return 1 if flatten or len(shape) == 2 else int(torch.Size(shape[:-2]).numel())


def dion2_budget(params: list[torch.Tensor], options: Dion2Options) -> int:
    """The workspace budget of a Dion2 group (``stacked.workspace_budget``, Muon's): from its
    momentum (torch.optim.Muon's state for the same parameters) and torch.optim.Muon's
    temporaries for its largest matrix."""
    state = sum(p.numel() * p.element_size() for p in params)
    temporaries = 0  # (no max(..., default=): torch.compile does not take it)
    for p in params:
        temporaries = max(temporaries, stacked_math.torch_temporaries_nbytes(
            *dion2_matrix_shape(p.shape, options.flatten), p.dtype))
    return stacked_math.workspace_budget(state, temporaries)


@torch.no_grad()
def dion2_group_step(group: dict, state, options: Dion2Options | None = None, workspace=None) -> None:
    """One Dion2 step for every parameter of ``group`` with a gradient (``check_dion2_step`` must
    have passed), batched over parameters of the same shape and dtype (microsoft/dion's
    "megabatch"): B = M + G; per matrix the k = ⌈fraction·N⌉ rows (m <= n) or columns of largest
    L1 norm; M[S] ← ef_decay·B[S]; O_S = Newton–Schulz(B_S) (Gram Newton–Schulz per ``gram``); W ←
    W·(1 − lr·wd), W[S] −= lr·s·O_S.
    A batch is cut into chunks (``dion2_chunks``) whose stacks and Newton–Schulz buffers fit
    Muon's workspace budget (``dion2_budget``; ``stacked.workspace_budget``) and live in
    ``workspace`` (an ``ortho_fast.functional.stacked.Workspace`` kept between steps; None: one
    allocated for this step): no temporary the size of all the parameters. Every matrix's
    arithmetic is the same whatever the chunk (the same bits).
    On one process "local" and "global" selection coincide. A DTensor replicated on every mesh dim
    is stepped on its local copy (the distributed runner sends only those here).
    State: ``state[p]["momentum"]`` (the parameter's shape and dtype; zeros when created), the
    key of microsoft/dion's Dion2.
    Source: microsoft/dion ``dion2_update_megabatch_async`` (unsharded path)."""
    options = resolve_dion2_options(group) if options is None else options
    workspace = stacked_math.Workspace() if workspace is None else workspace
    batches: dict[tuple, list[torch.Tensor]] = defaultdict(list)
    for p in group["params"]:
        if p.grad is None:
            continue
        st = state[p]
        if "momentum" not in st:
            st["momentum"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        batches[(tuple(p.shape), p.dtype, p.device)].append(p)
    budget = dion2_budget([p for ps in batches.values() for p in ps], options) if batches else None
    plans = [(shape, dion2_chunks(params, options, budget)) for (shape, _, _), params in batches.items()]
    largest: dict[torch.device, int] = {}
    for shape, chunks in plans:  # the pool sized once for the largest chunk: no growth mid-step, no second pool
        m, n = dion2_matrix_shape(shape, options.flatten)
        rows = dion2_math.dion2_select_rows(m, n)
        k = dion2_math.dion2_num_selected(options.fraction, m if rows else n)
        p = chunks[0][0]
        device = local_tensor(p).device
        largest[device] = max(largest.get(device, 0), dion2_chunk_nbytes(
            len(chunks[0]) * matrices_per(shape, options.flatten), m, n, k, rows, p.dtype,
            options.compute_dtype or p.dtype))
    if not torch.compiler.is_compiling():  # under torch.compile every request is a fresh buffer
        for device, nbytes in largest.items():
            workspace.reserve(nbytes, device)
    for shape, chunks in plans:
        for chunk in chunks:
            _chunk_step(chunk, shape, state, options, workspace)


#: The device-memory bytes one kernel launch weighs in the cost model of docs/performance.md
#: ("Bytes and the cost model"): τ·W with τ = 4.5 µs of host time per eager launch and W = 3.35 TB/s
#: (H100 SXM HBM3), about 15 MB: a batched form that saves one launch pays where it moves fewer
#: extra bytes than that.
LAUNCH_BYTES = 15 << 20


def batched_update_pays(stack: torch.Tensor, sub: torch.Tensor) -> bool:
    """Whether the batched sparse update of a chunk (``fill_`` of the (c, m, n) stack, one
    ``scatter_`` of the selected slices, one ``_foreach_add_`` of the stack: 3 launches) costs less
    than one ``scatter_add_`` per matrix (c launches) by ``LAUNCH_BYTES``: the batched form reads and
    writes the whole stack (the fill writes it, the add reads it and the weights and writes the
    weights: 4 passes), the per-matrix form only the selected slices (one more read of them)."""
    launches_saved = stack.shape[0] - 3
    extra_bytes = (4 * stack.numel() - sub.numel()) * stack.element_size()
    return launches_saved * LAUNCH_BYTES >= extra_bytes


def _chunk_step(params: list[torch.Tensor], shape, state, options: Dion2Options, workspace) -> None:
    """``dion2_group_step`` on one chunk of parameters of one shape, dtype and device."""
    m, n = dion2_matrix_shape(shape, options.flatten)
    rows = dion2_math.dion2_select_rows(m, n)
    k = dion2_math.dion2_num_selected(options.fraction, m if rows else n)
    buffers = [matrices(local_tensor(state[p]["momentum"]), options.flatten) for p in params]
    grads = [matrices(local_tensor(p.grad), options.flatten) for p in params]
    torch._foreach_add_(buffers, [g.to(b.dtype) for g, b in zip(grads, buffers)])  # dion2_accumulate, batched
    # the chunk's frame of the workspace starts here, stacked or not (``Workspace.get``)
    b = workspace.get("dion2_stack", (len(buffers), *buffers[0].shape) if len(buffers) > 1 else (0,),
                      buffers[0].dtype, buffers[0].device)
    if len(buffers) > 1:
        torch.stack(buffers, out=b)
    else:
        b = buffers[0].unsqueeze(0)
    indices = dion2_math.dion2_select(dion2_math.dion2_slice_norms(b, rows), k)
    sub = workspace.get("dion2_sub", (*b.shape[:-2], k, n) if rows else (*b.shape[:-1], k), b.dtype, b.device)
    torch.gather(b, -2 if rows else -1, dion2_math.expand_indices(indices, b, rows), out=sub)  # dion2_gather
    ortho = dion2_math.orthogonalize_selected(sub, options.table, safety=options.safety, eps=options.epsilon,
                                              compute_dtype=options.compute_dtype, precision=options.precision,
                                              gram=options.gram, workspace=workspace if sub.ndim == 3 else None)
    scale = dion2_math.dion2_lr_scale(options.adjust_lr, m, n)
    # the error feedback on the stack (dion2_error_feedback, with ef_decay·B[S] formed in sub's
    # bytes: the same multiply), written back into every buffer with one copy
    b.scatter_(-2 if rows else -1, dion2_math.expand_indices(indices, b, rows), sub.mul_(options.ef_decay))
    if len(buffers) > 1:
        torch._foreach_copy_(buffers, list(b.unbind(0)))
    for p, buf in zip(params, buffers):
        write_back(local_tensor(state[p]["momentum"]), buf)
    weights = [matrices(local_tensor(p), options.flatten) for p in params]
    decay = 1 - options.lr * options.weight_decay
    foreach_scale_(weights, decay)  # dion2_update's decay, batched (the same bits)
    # delta = ortho.to(W's dtype) · (−lr·s), formed in sub's bytes where it has W's dtype
    if sub.dtype == weights[0].dtype:
        delta = sub.copy_(ortho).mul_(-options.lr * scale) if ortho.dtype != sub.dtype else \
            torch.mul(ortho, -options.lr * scale, out=sub)
    else:
        delta = ortho.to(weights[0].dtype) * (-options.lr * scale)
    if len(weights) > 1 and b.dtype == delta.dtype and batched_update_pays(b, sub):
        # W[S] -= lr·s·O_S for the batch: three launches, not one per matrix
        b.fill_(-0.0)  # the stack is copied back already; w + (-0.0) is w, bit for bit
        b.scatter_(-2 if rows else -1, dion2_math.expand_indices(indices, b, rows), delta)
        torch._foreach_add_(weights, list(b.unbind(0)))
    else:  # one matrix, a stack of another dtype than the update, or a chunk whose bytes outweigh its
        # launches (``batched_update_pays``): one scatter_add_ per matrix, the same bits
        for j, w in enumerate(weights):
            w.scatter_add_(-2 if rows else -1, dion2_math.expand_indices(indices[j], w, rows), delta[j])
    for p, w in zip(params, weights):
        write_back(local_tensor(p), w)


class Dion2Groups(GroupRunner):
    """Runs the Dion2 groups of one optimizer in one process with their options cached:
    ``check`` / ``step`` as ``check_dion2_step`` / ``dion2_group_step``."""

    def __init__(self) -> None:
        self.cache = OptionsCache()
        self.workspace = stacked_math.Workspace()
        self.scalars = DeviceHypers(DION2_DEVICE_HYPERS)  # capturable groups' device scalars (cleared by ``reset``)

    def options(self, group: dict) -> Dion2Options:
        return self.cache.get(group, DION2_OPTION_KEYS, resolve_dion2_options)

    def check(self, groups, state, finite: FiniteCheck | None = None) -> None:
        for group in groups:
            check_dion2_step(group, state, self.options(group), finite if finite is not None else False)

    def step(self, group: dict, state, first_index: int) -> None:
        options = self.options(group)
        # compiled: lr a graph input (dynamo marks groups capturable)
        if options.capturable and not torch.compiler.is_compiling():
            options = self.scalars.options(group, options)
        dion2_group_step(group, state, options, self.workspace)

    @property
    def workspace_nbytes(self) -> int:
        """Bytes of the workspace kept between steps (the chunks' stacks and iterates)."""
        return self.workspace.nbytes
