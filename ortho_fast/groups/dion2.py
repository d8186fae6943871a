"""Dion2 param groups: defaults, options resolved once, the checks and the step of a group.

The contract every optimizer owning Dion2 groups drives (``Dion2``, ``HybridOptimizer``):
``DION2_DEFAULTS``, ``resolve_dion2_options`` (a frozen ``Dion2Options``),
``normalize_dion2_group``, ``check_dion2_step`` (before any change) and ``dion2_group_step``;
``Dion2Groups`` runs them from a plan per group (``Dion2Plan``, ``plan_dion2_group``), made again
only when the group changes; the kernels of a planned step are in ``ortho_fast.groups.dion2_chunks``. The math is in
``ortho_fast.functional.dion2``. Source: microsoft/dion ``dion/dion2.py``; docs/math.md, "Dion2".
"""

from __future__ import annotations

import dataclasses
import weakref
from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping

import torch

from ..coefficients import resolve_coefficients, schedule_of
from ..functional import dion2 as dion2_math, stacked as stacked_math
from ..functional.dion2 import DION2_ADJUST_LR_MODES, SELECTION_SCOPES
from ..functional.graph_scalars import CPU_ROUNDED_FACTOR_DTYPES
from ..functional.newton_schulz import resolve_compute_dtype
from ..validation import (
    FiniteCheck,
    check_choice,
    check_count,
    check_filled,
    check_grad,
    check_hyper,
    check_param_shaped_state,
    is_dtensor,
    local_tensor,
)
from .dion2_chunks import (
    Dion2Chunk,
    dion2_budget,
    dion2_chunk_nbytes,
    dion2_small_nbytes,
    matrices,
    matrices_per,
    run_dion2_plan,
    write_back,
)
from .driver import GroupRunner
from .options import DeviceHypers, check_device_hyper, check_gram_option, freeze_values

__all__ = ["DION2_DEFAULTS", "DION2_OPTION_KEYS", "Dion2Groups", "Dion2Options", "check_dion2_step",
           "batched_update_pays", "dion2_budget", "dion2_chunk_nbytes", "dion2_chunks",
           "dion2_small_nbytes", "dion2_group_step",
           "dion2_matrix_shape", "matrices", "normalize_dion2_group", "plan_dion2_group", "cached_dion2_plan",
           "check_dion2_planned",
           "resolve_dion2_options", "write_back", "Dion2Plan"]

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


#: The ranges ``check_hyper`` checks for Dion2's float hyperparameters.
_HYPER_RANGES = {"lr": {}, "fraction": {"high": 1.0, "low_open": True}, "ef_decay": {"high": 1.0},
                 "weight_decay": {}, "epsilon": {}}


def _device_hypers(group: dict, capturable) -> dict:
    """lr, weight_decay and ef_decay of ``group`` validated: a 0-dim tensor with ``capturable``
    (``check_device_hyper``), else a float in its range. Raises naming the key."""
    hypers = {}
    for key in DION2_DEVICE_HYPERS:
        value = check_device_hyper(group[key], key, capturable)
        hypers[key] = value if isinstance(value, torch.Tensor) else check_hyper(value, key, **_HYPER_RANGES[key])
    return hypers


def resolve_dion2_options(group: dict) -> Dion2Options:
    """Validate every option of a Dion2 group filled with ``DION2_DEFAULTS``, changing nothing.
    Raises: ValueError / TypeError whose message starts with the key; UnknownScheduleError for an
    unknown schedule name."""
    check_filled(group, DION2_DEFAULTS, "Dion2")
    if not isinstance(group["capturable"], bool):
        raise TypeError(f"capturable: expected a bool, got {group['capturable']!r}")
    hypers = _device_hypers(group, group["capturable"])
    for key in ("fraction", "epsilon"):
        hypers[key] = check_hyper(group[key], key, **_HYPER_RANGES[key])
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
    run_dion2_plan(plan_dion2_group(group, options), state, options.lr, options.weight_decay, options.ef_decay,
                   workspace)


def batched_update_pays(stack: torch.Tensor, sub: torch.Tensor) -> bool:
    """Whether the batched sparse update of a chunk (``fill_`` of the (c, m, n) stack, one
    ``scatter_`` of the selected slices, one ``_foreach_add_`` of the stack: 3 launches) costs less
    than one ``scatter_add_`` per matrix (c launches), in the cost model of ``stacked.rounds_pay``
    (``stacked.LAUNCH_BYTES`` per launch): the batched form reads and writes the whole stack (the
    fill writes it, the add reads it and the weights and writes the weights: 4 passes), the
    per-matrix form only the selected slices (one more read of them)."""
    launches_saved = stack.shape[0] - 3
    extra_bytes = (4 * stack.numel() - sub.numel()) * stack.element_size()
    return stacked_math.rounds_pay(launches_saved, extra_bytes)


def _chunk_of(params: list[torch.Tensor], shape: tuple, options: Dion2Options) -> Dion2Chunk:
    """The ``Dion2Chunk`` of ``params`` (one shape, dtype and device, in this order)."""
    m, n = dion2_matrix_shape(shape, options.flatten)
    rows = dion2_math.dion2_select_rows(m, n)
    k = dion2_math.dion2_num_selected(options.fraction, m if rows else n)
    mats = (m, n) if options.flatten and len(shape) > 2 else shape
    stack_shape = (len(params), *mats)
    sub_shape = (*stack_shape[:-2], k, n) if rows else (*stack_shape[:-1], k)
    p = params[0]
    meta = [torch.empty(s, dtype=p.dtype, device="meta") for s in (stack_shape, sub_shape)]
    return Dion2Chunk(params=params, m=m, n=n, rows=rows, k=k, scale=dion2_math.dion2_lr_scale(options.adjust_lr, m, n),
                      flatten=options.flatten and len(shape) > 2, local=any(is_dtensor(q) for q in params),
                      stack_shape=stack_shape if len(params) > 1 else (0,), sub_shape=sub_shape, dtype=p.dtype,
                      device=local_tensor(p).device, batched_update=len(params) > 1 and batched_update_pays(*meta),
                      nbytes=dion2_chunk_nbytes(len(params) * matrices_per(shape, options.flatten), m, n, k, rows,
                                                p.dtype, options.compute_dtype or p.dtype))


@dataclass
class Dion2Plan:
    """What a Dion2 group's step reads, resolved once per change of the group (``plan_dion2_group``):
    its options, the parameters with a gradient (``live``) and their (shape, dtype, device)
    (``layouts``), their names for errors, ``local`` (a DTensor among them: stepped on its local
    copy), ``families`` (the positions in ``live`` by dtype and device, each with whether its
    decay takes ``foreach_scale_``'s own ``mul_``: the group-wide ``_foreach`` ops), the chunks
    (``Dion2Chunk``) and the workspace to reserve per device (``reserve``: the largest first chunk
    of a shape). ``snapshot``: the option values
    other than lr / weight_decay / ef_decay it was planned from; ``hypers`` those three, validated
    (``hyper_values``: as the group held them)."""

    group: dict
    options: Dion2Options
    live: list
    layouts: list
    names: list
    local: bool
    families: list
    chunks: list
    reserve: dict
    snapshot: tuple | None = None
    hyper_values: tuple = ()
    hypers: tuple = ()
    checked: list = dataclasses.field(default_factory=list)  # per live parameter: what its last check passed
    grad_names: list = dataclasses.field(default_factory=list)  # how the finiteness check names each gradient

    def check_live(self, state, finite) -> None:
        """The per-parameter checks of ``Dion2Groups.check`` (``check_grad``, the momentum's shape and
        dtype), done again only for a parameter whose gradient or momentum is another tensor, or has
        another shape, dtype, device or layout, than when it last passed (what they read); every
        gradient goes to ``finite`` (a ``FiniteCheck``; True: checked now, one sync each; False: not
        checked). Raises as ``check_grad`` / ``check_param_shaped_state``."""
        if len(self.checked) != len(self.live):
            self.checked = [None] * len(self.live)
            self.grad_names = [f"grad of {name}" for name in self.names]
        checked, add = self.checked, finite.add if isinstance(finite, FiniteCheck) else None
        for i, (p, name, grad_name) in enumerate(zip(self.live, self.names, self.grad_names)):
            g = p.grad
            st = state.get(p)
            buf = None if st is None else st.get("momentum")
            sig = (p.shape, p.dtype, p.device, g.shape, g.dtype, g.device, g.layout,
                   None if buf is None else (buf.shape, buf.dtype) if isinstance(buf, torch.Tensor) else type(buf))
            hit = checked[i]
            if finite is True or hit is None or hit[0]() is not g or hit[1] is not buf or hit[2] != sig:
                check_grad(p, name, "Dion2", finite is True)
                if buf is not None and (not isinstance(buf, torch.Tensor) or buf.shape != p.shape
                                        or buf.dtype != p.dtype):
                    check_param_shaped_state(state, p, "momentum", name)  # raises, naming it
                checked[i] = (weakref.ref(g), buf, sig)
            if add is not None:
                add(g, grad_name)

    def holds(self, group: dict, live: list) -> bool:
        """Whether this plan is ``group``'s for the parameters ``live`` (the same tensors, shapes,
        dtypes and devices, the same option values but for lr / weight_decay / ef_decay, which are
        validated here when they changed). Raises: ValueError / TypeError naming a bad lr,
        weight_decay or ef_decay (the plan unchanged)."""
        if self.group is not group or len(live) != len(self.live) or any(p is not q for p, q in zip(live, self.live)):
            return False
        if [(p.shape, p.dtype, p.device) for p in live] != self.layouts:
            return False
        snapshot = freeze_values(group[k] for k in _PLAN_KEYS)  # None: a tensor table, planned at every step
        if snapshot is None or snapshot != self.snapshot:
            return False
        values = tuple(group[k] for k in DION2_DEVICE_HYPERS)
        if any(a is not b for a, b in zip(values, self.hyper_values)):
            hypers = _device_hypers(group, self.options.capturable)
            self.options = dataclasses.replace(self.options, **hypers)
            self.hypers, self.hyper_values = tuple(hypers[k] for k in DION2_DEVICE_HYPERS), values
        return True


#: The option keys a plan depends on (all but the hyperparameters a scheduler changes).
_PLAN_KEYS = tuple(k for k in DION2_OPTION_KEYS if k not in DION2_DEVICE_HYPERS)


def plan_dion2_group(group: dict, options: Dion2Options, live: list | None = None) -> Dion2Plan:
    """The ``Dion2Plan`` of ``group`` with its resolved ``options`` for its parameters with a gradient
    (``live``; None: read from the group): batched by shape, dtype and device, each batch cut into
    chunks (``dion2_chunks``) within the group's budget (``dion2_budget``)."""
    live = [p for p in group["params"] if p.grad is not None] if live is None else live
    batches: dict[tuple, list[torch.Tensor]] = defaultdict(list)
    families: dict[tuple, list[int]] = defaultdict(list)
    for i, p in enumerate(live):
        batches[(tuple(p.shape), p.dtype, p.device)].append(p)
        families[(p.dtype, local_tensor(p).device)].append(i)
    budget = dion2_budget(live, options) if live else None
    chunks, reserve = [], {}
    for (shape, _, _), params in batches.items():
        cut = [_chunk_of(part, shape, options) for part in dion2_chunks(params, options, budget)]
        chunks += cut  # the pool sized once for the largest chunk: no growth mid-step, no second pool
        reserve[cut[0].device] = max(reserve.get(cut[0].device, 0), cut[0].nbytes)
    index = {id(p): i for i, p in enumerate(group["params"])}
    slot = {id(p): i for i, p in enumerate(live)}
    for chunk in chunks:
        chunk.slots = [slot[id(p)] for p in chunk.params]
    snapshot = freeze_values(group[k] for k in _PLAN_KEYS)
    return Dion2Plan(group=group, options=options, live=live, layouts=[(p.shape, p.dtype, p.device) for p in live],
                     names=[_name(group, index[id(p)], p) for p in live], local=any(is_dtensor(p) for p in live),
                     families=[(slots, device.type == "cpu" and dtype in CPU_ROUNDED_FACTOR_DTYPES)
                               for (dtype, device), slots in families.items()],
                     chunks=chunks, reserve=reserve, snapshot=snapshot,
                     hyper_values=tuple(group[k] for k in DION2_DEVICE_HYPERS),
                     hypers=(options.lr, options.weight_decay, options.ef_decay))


def cached_dion2_plan(store: dict, group: dict, keep=None) -> Dion2Plan:
    """The plan of ``group`` kept in ``store`` (id(group) -> plan), planned again when the group changed
    (``Dion2Plan.holds``; options resolved and validated then) for its parameters with a gradient
    (``keep``: only those for which ``keep(p)`` is true). Under ``torch.compile`` planned at every
    trace (``id()`` of a dict is not traced; the plan is Python, gone from the graph)."""
    live = [p for p in group["params"] if p.grad is not None and (keep is None or keep(p))]
    if torch.compiler.is_compiling():
        return plan_dion2_group(group, resolve_dion2_options(group), live)
    plan = store.get(id(group))
    if plan is None or not plan.holds(group, live):
        plan = store[id(group)] = plan_dion2_group(group, resolve_dion2_options(group), live)
    return plan


def check_dion2_planned(store: dict, group: dict, state, finite: FiniteCheck | None | bool, keep=None) -> Dion2Plan:
    """``check_dion2_step`` of ``group`` with the options of its plan (``cached_dion2_plan(store, group,
    keep)``, made or kept here); returns the plan. Raises what both raise."""
    plan = cached_dion2_plan(store, group, keep)
    check_dion2_step(group, state, plan.options, finite)
    return plan


class Dion2Groups(GroupRunner):
    """Runs the Dion2 groups of one optimizer in one process, each from its plan (``Dion2Plan``, kept in
    ``step_plans`` while the group's parameters and options but lr / weight_decay / ef_decay stay;
    cleared by ``reset``): ``check`` / ``step`` as ``check_dion2_step`` / ``dion2_group_step``."""

    def __init__(self) -> None:
        self.workspace = stacked_math.Workspace()
        self.scalars = DeviceHypers(DION2_DEVICE_HYPERS)  # capturable groups' device scalars (cleared by ``reset``)
        self.step_plans: dict[int, Dion2Plan] = {}  # id(group) -> its plan
        self.checked: dict[int, Dion2Plan] = {}  # the plans ``check`` found valid, for the step that follows

    def plan(self, group: dict) -> Dion2Plan:
        """The group's plan (``cached_dion2_plan``)."""
        return cached_dion2_plan(self.step_plans, group)

    def check(self, groups, state, finite: FiniteCheck | None = None) -> None:
        finite = finite if finite is not None else False
        for group in groups:
            plan = self.plan(group)
            plan.check_live(state, finite)
            if not torch.compiler.is_compiling():
                self.checked[id(group)] = plan

    def step(self, group: dict, state, first_index: int) -> None:
        plan = None if torch.compiler.is_compiling() else self.checked.pop(id(group), None)
        if plan is None or plan.group is not group:
            plan = self.plan(group)
        options = plan.options
        lr, weight_decay, ef_decay = plan.hypers
        # compiled: lr a graph input (dynamo marks groups capturable)
        if options.capturable and not torch.compiler.is_compiling():
            device = self.scalars.options(group, dataclasses.replace(options, lr=lr, weight_decay=weight_decay,
                                                                     ef_decay=ef_decay))
            lr, weight_decay, ef_decay = device.lr, device.weight_decay, device.ef_decay
        run_dion2_plan(plan, state, lr, weight_decay, ef_decay, self.workspace)

    def reset(self) -> None:
        super().reset()
        self.step_plans.clear()
        self.checked.clear()

    @property
    def workspace_nbytes(self) -> int:
        """Bytes of the workspace kept between steps (the chunks' stacks and iterates)."""
        return self.workspace.nbytes
