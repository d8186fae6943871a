"""Muon param groups: defaults, validation resolved once, the checks and the step of a group.

The contract every optimizer owning Muon groups drives (``Muon``, ``HybridOptimizer``, the
distributed step): ``MUON_DEFAULTS``, ``resolve_muon_options`` (validate a group into a frozen
``MuonOptions``), ``normalize_muon_group`` (at construction / ``add_param_group`` /
``load_state_dict``), ``check_muon_step`` (before any change) and ``muon_group_step``; ``MuonGroups``
runs them with the options and layouts cached (``ortho_fast.groups.options``). The math is in
``ortho_fast.functional.muon``.
"""

from __future__ import annotations  # noqa: I001  (sorted as isort; its one-name-a-line wrapping: over 500 lines)

import dataclasses
import math
import operator
from dataclasses import dataclass, field
from typing import Mapping

import torch

from ..coefficients import CoefficientsLike, resolve_coefficients, schedule_of
from ..functional import layout as layout_math, stacked as stacked_math
from ..functional.layout import MuonLayout, is_expert_name
from ..functional.muon import ADJUST_LR_MODES, MOMENTUM_STYLES, WEIGHT_DECAY_STYLES, muon_momentum
from ..functional.newton_schulz import EPS_MODES, resolve_compute_dtype
from ..functional.stacked import MAX_STACK_ELEMENTS, Workspace
from ..validation import (FiniteCheck, check_bool_option, check_choice, check_count, check_filled, check_grad,
                          check_hyper, check_param_shaped_state, int_tuple_option)
from .driver import GroupRunner
from .muon_budget import cached_plan, stage_nbytes, step_plan, writes_compute_dtype
from .muon_plan import MuonPlan
from .muon_step import run_plan, run_steps
from .muon_stages import (STAGE_DEFAULTS, check_stage_state, resolve_stage_options,
                          variance_shape)
from .options import DeviceHypers, MuonOptions, Uncacheable, check_device_hyper, check_gram_option, freeze_value

#: Every Muon param-group key with its default (torch.optim.Muon's defaults where torch has the option).
MUON_DEFAULTS: dict[str, object] = {
    "lr": 1e-3,
    "weight_decay": 0.1,
    "momentum": 0.95,
    "nesterov": True,
    "momentum_style": "ema",
    "coefficients": "jordan",
    "ns_steps": None,  # None: the schedule's default (5 for jordan)
    "safety": None,  # None: the named schedule's (1.0 jordan, 1.02 polar_express), else 1.0
    "eps": None,  # None: the named schedule's (1e-7 jordan, 1e-6 polar_express), else 1e-7
    "eps_mode": None,  # None: "clamp" for the named schedule "jordan" (torch.optim.Muon), else "add"
    "adjust_lr": "original",
    "extra_scale_factor": 1.0,
    "cautious_weight_decay": False,
    "weight_decay_style": "decoupled",  # "adjusted_lr": W(1 − lr·s·wd) (nanochat); "independent": W(1 − wd)
    "dtype": torch.bfloat16,
    "banks": None,  # None: batched in bf16 / fp16 unless bitwise_torch (MuonOptions.batched); True / False
    "bitwise_torch": False,  # True: torch.optim.Muon's bits (matrix by matrix, its 2-D calls)
    "gram": None,  # None: Gram Newton–Schulz in float32 / float64 from aspect ratio 2 (not bitwise_torch); True / False
    "expert_keys": (),
    "split_sizes": None,
    "split_groups": 1,
    "num_heads": None,
    "flatten": None,  # None: >= 4-D flattened, 3-D rejected unless expert; True / False: microsoft/dion's flatten
    **STAGE_DEFAULTS,  # MuonEq, Muon+, NorMuon (ortho_fast.groups.muon_stages), off
    "capturable": False,  # True: lr, weight_decay, momentum as 0-dim tensors on the device (torch's option)
}

#: The hyperparameters a ``capturable`` group keeps as 0-dim tensors on the parameters' device.
DEVICE_HYPERS = ("lr", "weight_decay", "momentum")


def default_eps_mode(coefficients: CoefficientsLike) -> str:
    """The normalization a Muon group uses when ``eps_mode`` is None.

    "clamp", X₀ = U / max(s‖U‖_F, eps), for the named schedule "jordan": torch.optim.Muon's
    ``_zeropower_via_newtonschulz`` divides by ``norm().clamp(min=eps)``, so the defaults give
    torch's bits. "add", X₀ = U / (s‖U‖_F + eps), for every other schedule and for user tables
    (even Keller Jordan's row given as numbers): Keller Jordan's original
    ``zeropower_via_newtonschulz5`` (X / (‖X‖ + 1e-7)), Moonlight, microsoft/dion and nanochat
    (X / (1.02‖X‖ + 1e-6) with Polar Express). The two differ only where ‖U‖_F is near eps.
    Raises: UnknownScheduleError (KeyError, ValueError) for an unknown schedule name.
    """
    named = schedule_of(coefficients)
    return "clamp" if named is not None and named.name == "jordan" else "add"


def resolve_muon_options(group: dict) -> MuonOptions:
    """Validate every option of a Muon group filled with ``MUON_DEFAULTS``, changing nothing, and
    return them resolved (``MuonOptions``): ``safety`` / ``eps`` None -> the named schedule's (else
    1.0 / 1e-7), ``eps_mode`` None -> ``default_eps_mode``, the coefficient table of
    ``coefficients`` / ``ns_steps``, the compute dtype, ``expert_keys`` / ``split_sizes`` /
    ``num_heads`` as tuples.

    Raises: ValueError / TypeError whose message starts with the offending key;
    UnknownScheduleError (KeyError, ValueError) for an unknown schedule name.
    """
    check_filled(group, MUON_DEFAULTS, "Muon")
    if not isinstance(group["capturable"], bool):
        raise TypeError(f"capturable: expected a bool, got {group['capturable']!r}")
    hypers = {key: check_device_hyper(group[key], key, group["capturable"]) for key in DEVICE_HYPERS}
    for key, kw in (("lr", {}), ("weight_decay", {}), ("momentum", {"high": 1.0}),
                    ("extra_scale_factor", {"low_open": True})):
        if key not in DEVICE_HYPERS or not isinstance(group[key], torch.Tensor):
            hypers[key] = check_hyper(group[key], key, **kw)
    for key in ("nesterov", "cautious_weight_decay", "bitwise_torch"):
        check_bool_option(group, key)
    if group["banks"] is not None:
        check_bool_option(group, "banks")
    if not any(group["flatten"] is v for v in (None, True, False)):
        raise TypeError(f"flatten: expected None, True or False, got {group['flatten']!r}")
    check_choice(group["momentum_style"], "momentum_style", MOMENTUM_STYLES)
    check_choice(group["adjust_lr"], "adjust_lr", ADJUST_LR_MODES)
    if group["weight_decay_style"] == "l2":
        raise ValueError("weight_decay_style: 'l2' (wd·W added to the gradient, the oracle's coupled L2) is not a "
                         f"Muon option here; expected one of {WEIGHT_DECAY_STYLES}")
    check_choice(group["weight_decay_style"], "weight_decay_style", WEIGHT_DECAY_STYLES)
    compute_dtype, precision = resolve_compute_dtype(group["dtype"])
    check_gram_option(group["gram"], compute_dtype, precision)
    if group["gram"] and group["bitwise_torch"]:
        raise ValueError("gram: bitwise_torch=True runs torch.optim.Muon's plain steps; gram=True cannot be combined "
                         "with it")
    if group["ns_steps"] is not None:
        check_count(group["ns_steps"], "ns_steps")
    coefficients: CoefficientsLike = group["coefficients"]
    table = tuple(resolve_coefficients(coefficients, group["ns_steps"]))  # bad table -> ValueError / TypeError
    named = schedule_of(coefficients)
    out = {
        "safety": group["safety"] if group["safety"] is not None else named.safety if named else 1.0,
        "eps": group["eps"] if group["eps"] is not None else named.eps if named else 1e-7,
        "eps_mode": group["eps_mode"] if group["eps_mode"] is not None else default_eps_mode(coefficients),
    }
    check_hyper(out["safety"], "safety", low_open=True)
    check_hyper(out["eps"], "eps")
    check_choice(out["eps_mode"], "eps_mode", EPS_MODES)
    keys = group["expert_keys"]
    keys = (keys,) if isinstance(keys, str) else tuple(keys) if isinstance(keys, (tuple, list)) else None
    if keys is None or not all(isinstance(k, str) and k for k in keys):
        raise TypeError(f"expert_keys: expected a non-empty string or a sequence of them, got {group['expert_keys']!r}")
    return MuonOptions(
        lr=hypers["lr"], weight_decay=hypers["weight_decay"], momentum=hypers["momentum"],
        capturable=group["capturable"],
        nesterov=group["nesterov"], momentum_style=group["momentum_style"], table=table, safety=float(out["safety"]),
        eps=float(out["eps"]), eps_mode=out["eps_mode"], compute_dtype=compute_dtype, precision=precision,
        adjust_lr=group["adjust_lr"], extra_scale_factor=float(group["extra_scale_factor"]),
        cautious_weight_decay=group["cautious_weight_decay"], weight_decay_style=group["weight_decay_style"],
        banks=group["banks"] is True, expert_keys=keys,
        split_sizes=int_tuple_option(group["split_sizes"], "split_sizes", allow_int=False),
        split_groups=group["split_groups"], num_heads=int_tuple_option(group["num_heads"], "num_heads", allow_int=True),
        flatten=group["flatten"], bitwise_torch=group["bitwise_torch"], banks_setting=group["banks"],
        gram=False if group["bitwise_torch"] else group["gram"], **resolve_stage_options(group))


#: The group keys a ``MuonOptions`` is resolved from (a change of any of them resolves it again).
MUON_OPTION_KEYS = tuple(MUON_DEFAULTS)


def param_name(group: dict, index: int, p: torch.Tensor) -> str:
    """How errors name parameter ``index`` of ``group``: its name when the group has
    ``param_names``, else its index and shape."""
    names = group.get("param_names")
    return repr(names[index]) if names else f"parameter {index} (shape {tuple(p.shape)})"


def param_layout(group: dict, options: MuonOptions, index: int, p: torch.Tensor) -> MuonLayout:
    """``muon_layout`` of parameter ``index`` of ``group`` with the group's (resolved) split,
    expert and flatten options. Raises: ValueError naming the option (see ``muon_layout``)."""
    names = group.get("param_names")
    expert = bool(options.expert_keys and names) and is_expert_name(names[index], options.expert_keys)
    return layout_math.muon_layout(p.shape, expert=expert, split_sizes=options.split_sizes,
                                   split_groups=options.split_groups,
                                   num_heads=options.num_heads, flatten=options.flatten,
                                   name=param_name(group, index, p))


def normalize_muon_group(group: dict) -> None:
    """Validate one Muon param group (already filled with ``MUON_DEFAULTS``) and store its
    resolved options in place (``safety`` / ``eps`` / ``eps_mode`` None -> from the schedule,
    ``expert_keys`` / ``split_sizes`` / ``num_heads`` to tuples).

    Checks every option, then every parameter (floating dtype, ≥ 2 dims, a 3-D non-expert
    only with ``flatten`` set, experts ≥ 3 dims, split sizes and heads that fit, names
    present when ``expert_keys`` is set).
    Called at construction and by ``add_param_group`` / ``load_state_dict``.
    Raises: ValueError / TypeError whose message starts with the offending key;
    UnknownScheduleError (KeyError and ValueError) for an unknown coefficient schedule name.
    A bad option changes nothing; a bad parameter leaves the options in their resolved form.
    """
    options = resolve_muon_options(group)
    group.update(safety=options.safety if group["safety"] is None else group["safety"],
                 eps=options.eps if group["eps"] is None else group["eps"], eps_mode=options.eps_mode,
                 expert_keys=options.expert_keys, split_sizes=options.split_sizes, num_heads=options.num_heads)
    if group["expert_keys"] and group["params"] and not group.get("param_names"):
        raise ValueError("expert_keys: matching needs parameter names; pass model.named_parameters() (or "
                         "(name, parameter) pairs) to the optimizer")
    for i, p in enumerate(group["params"]):
        if not p.is_floating_point():
            raise TypeError(f"params: Muon expects floating-point parameters, got dtype {p.dtype} for "
                            f"{param_name(group, i, p)}")
        param_layout(group, options, i, p)


def cached_layout(group: dict, options: MuonOptions, cache: dict | None, index: int, p: torch.Tensor) -> MuonLayout:
    """``param_layout``, kept in ``cache`` ({index: (parameter, shape, layout)}: an
    ``OptionsCache`` entry's ``per_param``, dropped whenever the options change) while the group
    holds the same parameter of the same shape at ``index``; None: computed every time."""
    if cache is None:
        return param_layout(group, options, index, p)
    hit = cache.get(index)
    if hit is not None and hit[0] is p and hit[1] == p.shape:
        return hit[2]
    lay = param_layout(group, options, index, p)
    cache[index] = (p, p.shape, lay)
    return lay


def _layouts(group: dict, options: MuonOptions, cache: dict | None):
    """i, p -> the layout of parameter i of ``group`` (``cached_layout``)."""
    return lambda i, p: cached_layout(group, options, cache, i, p)


def check_muon_step(group: dict, state: Mapping[torch.Tensor, dict], options: MuonOptions | None = None,
                    layouts: dict | None = None, finite: FiniteCheck | None | bool = True) -> None:
    """Check everything one ``muon_group_step`` will read; change nothing.

    Every option of the group (a scheduler or a user may have edited it after construction:
    lr, coefficients, ns_steps, ...), as ``normalize_muon_group`` checks it (skipped when the
    caller passes the group's current ``options``, resolved by ``resolve_muon_options``). Per
    parameter with a gradient: the gradient is dense, real, of the parameter's shape, dtype and
    device, and finite (``finite``: True checks here, one host sync per gradient; a
    ``FiniteCheck`` collects the gradients for the caller to decide at once; False skips); an
    existing ``momentum_buffer`` is a tensor of the parameter's shape and dtype; the group's
    split / expert / flatten settings still fit the parameter (``layouts``: an optional cache).
    Raises: ValueError / TypeError starting with the option key, or with "grad" /
    "momentum_buffer" naming the parameter; UnknownScheduleError for an unknown schedule name.
    """
    options = resolve_muon_options(group) if options is None else options
    layout = _layouts(group, options, layouts)
    for i, p in enumerate(group["params"]):
        if p.grad is None:
            continue
        name = param_name(group, i, p)
        check_grad(p, name, "Muon", finite)
        check_param_shaped_state(state, p, "momentum_buffer", name)
        check_stage_state(state[p] if p in state else {}, p, layout(i, p), options, name)


def momentum_of(p: torch.Tensor, state, options: MuonOptions, grad: torch.Tensor | None = None,
                buf_of=lambda t: t) -> torch.Tensor:
    """The momentum step of one parameter (creating ``momentum_buffer`` as zeros): returns U, the
    matrix to orthogonalize, param-shaped. ``grad`` / ``buf_of``: the distributed step passes
    the local shard of the gradient and a function giving the local shard of the buffer."""
    st = state[p]
    if "momentum_buffer" not in st:
        st["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
    return muon_momentum(p.grad if grad is None else grad, buf_of(st["momentum_buffer"]), mu=options.momentum,
                         nesterov=options.nesterov, style=options.momentum_style)


@torch.no_grad()
def muon_group_step(group: dict, state, options: MuonOptions | None = None, layouts: dict | None = None,
                    workspace: Workspace | None = None) -> None:
    """One Muon step for every parameter of ``group`` that has a gradient (``check_muon_step``
    must have passed): momentum, Newton–Schulz per matrix of ``muon_layout`` (same-shape
    matrices batched, ``MuonOptions.batched``), W ← W·(1 − lr·wd) − lr·s·O with s =
    adjusted_lr_scale(block shape)·extra_scale_factor and the decoupled (or cautious) weight
    decay on the unscaled lr.

    The momentum and the decay run as ``_foreach`` ops over the group (the same bits as per
    tensor); with ``bitwise_torch`` (and ``banks`` not set) every matrix takes its own 2-D
    Newton–Schulz, torch.optim.Muon's bits; by default, with bfloat16 / float16 Newton–Schulz,
    same-shape matrices are stacked (the rule: ``MuonOptions.batched``): parameters that are one
    matrix (or one batch of them: experts, conv weights) of a shape shared with another take the
    stacked step (``stacked_chunk_step``: a fixed number of operations per chunk of
    ``ortho_fast.functional.stacked.MAX_STACK_ELEMENTS`` entries, in ``workspace``'s buffers);
    the others (split projections, heads, a lone shape, cautious weight decay) go through
    ``orthogonalize`` with ``banks`` (``newton_schulz_stacked``). Both are within the
    Newton–Schulz tolerance of the oracle.
    ``options`` / ``layouts`` / ``workspace``: the group's resolved options, a layout cache and
    the reused buffers (all optional; resolved / allocated here when absent).
    The pipeline stages the options switch on run per matrix (per stack on the stacked step), in
    nanochat's order: MuonEq before Newton–Schulz (``functional.muon_stages.pre_orthogonalize``),
    Muon+ and NorMuon after it (``post_orthogonalize``; on a stack their per-neuron factors,
    ``post_factors``, applied inside the update), one call each (docs/math.md, "Muon pipeline
    stages").
    State: ``state[p]["momentum_buffer"]`` of the parameter's shape and dtype (created as
    zeros), the key of torch.optim.Muon; with NorMuon ``state[p]["variance_neuron"]``
    (``ortho_fast.groups.muon_stages.variance_shape``).
    Source: Jordan et al. 2024 (Muon); torch.optim.Muon (``_multi_tensor`` momentum); microsoft/dion
    Muon; Chen et al. 2025 (arXiv 2510.12402, cautious weight decay); modded-nanogpt / nanochat
    parameter banks.
    """
    options = resolve_muon_options(group) if options is None else options
    layout = _layouts(group, options, layouts)
    live = [(i, p) for i, p in enumerate(group["params"]) if p.grad is not None]
    for _, p in live:
        if "momentum_buffer" not in state[p]:
            state[p]["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
    plan = cached_plan(layouts, live, lambda: step_plan(live, layout, options, plan_stacks),
                       None if layouts is None else dataclasses.replace(options, lr=0.0, weight_decay=0.0,
                                                                         momentum=0.0))
    run_steps(plan, state, options, layout, live, [state[p]["momentum_buffer"] for p in plan[2]],
               Workspace() if workspace is None else workspace)


@dataclass
class StackChunk:
    """Parameters whose matrices share one (m, n), dtype and device, stacked together:
    ``members`` (parameter, its layout, its index in the group), ``count`` matrices in all."""

    m: int
    n: int
    members: list = field(default_factory=list)
    count: int = 0
    nbytes: int = 0  # its workspace (``stacked.chunk_nbytes``)
    key: tuple = ()  # (m, n, dtype, device): the shape group it was cut from
    views: dict = field(default_factory=dict)  # ``cached_views`` of its workspace stacks


def _whole(lay: MuonLayout) -> bool:
    """Whether a layout is the parameter itself read as (*batch, m, n): one block of all rows, one head."""
    return lay.groups == 1 and len(lay.blocks) == 1 and lay.blocks[0] == (0, lay.m, lay.m)


def plan_stacks(live, layout, options: MuonOptions, budget_from: tuple[int, int, int] | None = None
                ) -> tuple[list[StackChunk], list]:
    """Split a group's live (index, parameter) pairs into chunks for ``stacked_chunk_step`` and
    the rest: with ``options.batched`` and no cautious weight decay, contiguous parameters whose
    layout is ``_whole`` are grouped by (m, n, dtype, device) and cut, in order, into chunks of
    whole parameters of about equal size, each within ``MAX_STACK_ELEMENTS`` entries and a
    workspace (``stacked.chunk_nbytes``) within ``stacked.workspace_budget(*budget_from)``
    (``state_bytes``; None: no budget) with the stages' temporaries (``stage_nbytes``);
    a parameter larger than that is a chunk of its own. A shape group of one matrix goes to the
    rest (its 2-D call, the bits of ``banks=False``); a chunk of one matrix cut by the budget stays
    a stack (the rest's step batches all its same-shape matrices at once, and allocates as much)."""
    if not options.batched or options.cautious_weight_decay:
        return [], list(live)
    groups: dict[tuple, list] = {}
    rest = []
    for i, p in live:
        lay = layout(i, p)
        if not (_whole(lay) and p.is_contiguous()):
            rest.append((i, p))
            continue
        groups.setdefault((lay.m, lay.n, p.dtype, p.device), []).append((p, lay, i, math.prod(lay.batch)))
    budget = None if budget_from is None else stacked_math.workspace_budget(*budget_from)
    chunks = []
    for (m, n, dtype, _), members in groups.items():
        compute = options.compute_dtype or dtype  # U's stack: the first compute stack, or one before them
        in_place = writes_compute_dtype(options, dtype) or (compute == dtype and options.equilibration is None)
        momentum = None if in_place else dtype
        def size(k, m=m, n=n, u=momentum, c=compute):
            return stacked_math.chunk_nbytes(k, m, n, u, c)
        transient = stage_nbytes(options, dtype, m, n)  # per matrix, beside the workspace
        total = sum(member[3] for member in members)
        most = max(1, MAX_STACK_ELEMENTS // (m * n))
        if budget is not None and size(most) + most * transient > budget:  # the largest k that fits (or 1)
            low, high = 1, most
            while low < high:
                mid = (low + high + 1) // 2
                low, high = (mid, high) if size(mid) + mid * transient <= budget else (low, mid - 1)
            most = low
        cap = -(-total // -(-total // most))  # equal chunks: ceil(total / number of chunks)
        chunk = None
        for p, lay, i, count in members:
            if chunk is None or (chunk.count and chunk.count + count > cap):
                chunk = StackChunk(m, n, key=(m, n, dtype, p.device))
                chunks.append(chunk)
            chunk.members.append((p, lay, i))
            chunk.count += count
            chunk.nbytes = size(chunk.count)
    lone = {id(c) for c in chunks if c.count < 2 and sum(c.count for d in chunks if d.key == c.key) < 2}
    rest += [(i, p) for c in chunks if id(c) in lone for p, _, i in c.members]
    rest.sort(key=lambda item: item[0])
    return [c for c in chunks if id(c) not in lone], rest


def _new_plan(group: dict, options: MuonOptions, values: tuple, frozen: dict) -> MuonPlan:
    """A ``MuonPlan`` of ``group`` with its parameters' names and layouts (``param_name``, ``param_layout``)."""
    return MuonPlan(group, options, values, frozen, [param_name(group, i, p) for i, p in enumerate(group["params"])],
                    lambda i, p: param_layout(group, options, i, p))


class MuonPlans:
    """The ``MuonPlan`` of each Muon group a runner steps (``step_plans``, per group; cleared by
    ``GroupRunner.reset``): ``MuonGroups`` and the distributed ``MuonSharding``."""

    step_plans: dict

    def __getstate__(self) -> dict:  # a copied optimizer plans its own groups again
        return {**self.__dict__, "step_plans": {}}

    def plan(self, group: dict) -> MuonPlan:
        """The group's plan: the kept one while the group holds the same parameters and option values
        (compared by identity; lists and dicts by value); new lr / weight decay / momentum values only
        replace those scalars; any other change resolves the group again (raising as
        ``resolve_muon_options``). Under ``torch.compile`` resolved afresh (a traced lr stays symbolic)."""
        if torch.compiler.is_compiling():
            return _new_plan(group, resolve_muon_options(group), (), {})
        values = tuple(map(group.get, MUON_OPTION_KEYS))
        plan = self.step_plans.get(id(group))
        params = group["params"]
        if (plan is None or plan.group is not group or plan.frozen or not all(map(operator.is_, values, plan.values))
                or len(params) != len(plan.params) or not all(map(operator.is_, params, plan.params))):
            plan = self._replan(group, plan, values)
        return plan

    def _replan(self, group: dict, plan: MuonPlan | None, values: tuple) -> MuonPlan:
        same = (plan is not None and plan.group is group and len(group["params"]) == len(plan.params)
                and all(map(operator.is_, group["params"], plan.params)))
        try:
            frozen = {k: freeze_value(v) for k, v in zip(MUON_OPTION_KEYS, values) if isinstance(v, (list, dict))}
        except Uncacheable:
            frozen = None
        changed = [k for k, v, old in zip(MUON_OPTION_KEYS, values, plan.values) if v is not old] if same else None
        if same and frozen is not None and frozen == plan.frozen and set(changed) <= set(DEVICE_HYPERS):
            scalars = {k: group[k] for k in changed}
            for key in changed:
                check_device_hyper(group[key], key, plan.options.capturable)
                if not isinstance(group[key], torch.Tensor):
                    scalars[key] = check_hyper(group[key], key, **({"high": 1.0} if key == "momentum" else {}))
            return plan.with_scalars(dataclasses.replace(plan.options, **scalars), values)
        self.step_plans.pop(id(group), None)
        fresh = _new_plan(group, resolve_muon_options(group), values, frozen or {})
        if frozen is not None:  # an array option (compared by nothing): resolved at every step
            self.step_plans[id(group)] = fresh
        return fresh

class MuonGroups(MuonPlans, GroupRunner):
    """Runs the Muon groups of one optimizer in one process, each by its ``MuonPlan``
    (``ortho_fast.groups.muon_plan``: options, layouts, checks and stack plan resolved when the group
    changes): ``check`` / ``step`` as ``check_muon_step`` / ``muon_group_step``."""

    def __init__(self) -> None:
        self.step_plans: dict[int, MuonPlan] = {}  # per group (cleared by ``reset``)
        self.workspace = Workspace()
        self.scalars = DeviceHypers(DEVICE_HYPERS)  # capturable groups' device scalars (cleared by ``reset``)

    def check(self, groups, state, finite: FiniteCheck | None = None) -> None:
        for group in groups:
            self.plan(group).check(state, finite if finite is not None else False)

    def step(self, group: dict, state, first_index: int) -> None:
        plan = self.plan(group)
        options = plan.options
        # compiled: lr a graph input (dynamo marks groups capturable)
        if options.capturable and not torch.compiler.is_compiling():
            options = self.scalars.options(group, options)
        run_plan(plan, state, options, self.workspace, plan_stacks)


def normuon_variance_state_shape(p: torch.Tensor, group: dict) -> tuple[int, ...]:
    """Expected shape of ``state[p]["variance_neuron"]`` for parameter ``p`` of a normalized Muon
    group (``variance_shape`` of its layout), as ``load_state_dict`` checks it."""
    options = resolve_muon_options(group)
    index = next(i for i, q in enumerate(group["params"]) if q is p)
    return variance_shape(param_layout(group, options, index, p), options.normuon_dim)


def muon_state_algorithm(group: dict) -> str:
    """The ``ortho_fast.groups.state.STATE_SPECS`` key of a Muon group's state ("normuon", registered by
    ``ortho_fast.muon``, with NorMuon on; else "muon")."""
    return "muon" if group.get("normuon_beta2") is None else "normuon"
