"""Dion param groups: defaults, validation, the checks, the state and the step of a group.

The contract every optimizer owning Dion groups drives (``Dion``, ``HybridOptimizer``, the sharded
step of ``ortho_fast.distributed.dion``): ``DION_DEFAULTS``, ``resolve_dion_options``,
``normalize_dion_group``, ``check_dion_step``, ``init_dion_state``, ``dion_group_step``, and
``step_block`` (one parameter's step on its block, the same code in one process and sharded);
``DionGroups`` runs them from a plan per group (``DionPlan``, ``cached_dion_plan``: options, live
parameters, shapes, step keyword arguments), made again only when the group changes. The math is in
``ortho_fast.functional.dion``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping

import torch

from ..functional import dion as dion_math
from ..functional.dion import RIGHT_FACTORS, dion_rank, initial_q
from ..functional.qr import QR_METHOD_ALIASES, QR_METHODS, RCQR_OVERSAMPLE, sketch_generator
from ..validation import FiniteCheck, check_choice, check_count, check_filled, check_grad, check_hyper, is_dtensor
from .driver import GroupRunner
from .options import DionOptions, freeze_values

#: Every key of a Dion param group with its default (microsoft/dion ``Dion`` defaults, except
#: ``qr_method``: the reference Householder QR here, microsoft/dion's default is "rcqr").
#: ``momentum_dtype`` / ``q_dtype`` None mean the parameter's dtype (microsoft/dion
#: ``DionMixedPrecisionConfig``); ``oversample`` is microsoft/dion's ``rcqr_oversample``.
DION_DEFAULTS: dict[str, object] = dict(
    lr=0.01, mu=0.95, weight_decay=0.01, rank_fraction=1.0, rank_multiple_of=1, epsilon=1e-8, power_iters=1,
    error_feedback=True, qr_method="householder", oversample=RCQR_OVERSAMPLE, right_factor="column_norm",
    momentum_dtype=None, q_dtype=None, flatten=False,
)


def matrix_shape(p: torch.Tensor) -> tuple[int, int]:
    """(m, n) Dion works on: the shape, or (shape[0], prod(shape[1:])) for a flattened ndim > 2."""
    return (p.shape[0], p.numel() // p.shape[0]) if p.ndim > 2 else tuple(p.shape)


def param_rank(p: torch.Tensor, group) -> int:
    """Dion's rank r of parameter ``p`` with the ``rank_fraction`` / ``rank_multiple_of`` of ``group``
    (a group dict or its ``DionOptions``)."""
    m, n = matrix_shape(p)
    return dion_rank(m, n, group["rank_fraction"], group["rank_multiple_of"])


#: Why a Dion group refuses ``capturable=True`` (torch's option; ``resolve_dion_options``).
DION_NOT_CAPTURABLE = ("capturable: Dion cannot be captured in a CUDA graph (its step reads its step counter on "
                       "the host, int(state['step']), to seed the randomized-QR sketch generator, and draws Q0 on "
                       "the CPU); pass capturable=False")


def resolve_dion_options(group: dict) -> DionOptions:
    """Every hyperparameter of a filled Dion group validated (``qr_method`` aliases resolved),
    as a ``DionOptions``; raises naming the key, changes nothing. ``capturable`` (torch's option, a
    key of a HybridOptimizer group) True raises ValueError: Dion cannot be captured (``DION_NOT_CAPTURABLE``)."""
    # dynamo marks every traced group capturable (torch/_dynamo/variables/optimizer.py): compiled, not refused
    if group.get("capturable") and not torch.compiler.is_compiling():
        raise ValueError(DION_NOT_CAPTURABLE)
    check_filled(group, DION_DEFAULTS, "Dion")
    check_hyper(group["lr"], "lr")
    check_hyper(group["mu"], "mu", high=1.0)
    check_hyper(group["weight_decay"], "weight_decay")
    check_hyper(group["rank_fraction"], "rank_fraction", high=1.0, low_open=True)
    check_hyper(group["epsilon"], "epsilon")
    check_hyper(group["oversample"], "oversample", low=1.0)
    for key in ("rank_multiple_of", "power_iters"):
        check_count(group[key], key)
    for key in ("error_feedback", "flatten"):
        if not isinstance(group[key], bool):
            raise TypeError(f"{key}: expected a bool, got {group[key]!r}")
    for key, choices in (("qr_method", QR_METHODS), ("right_factor", RIGHT_FACTORS)):
        check_choice(QR_METHOD_ALIASES.get(group[key], group[key]) if key == "qr_method" else group[key], key, choices)
    for key in ("momentum_dtype", "q_dtype"):
        dt = group[key]
        if dt is not None and not (isinstance(dt, torch.dtype) and dt.is_floating_point):
            raise TypeError(f"{key}: expected None or a floating torch.dtype, got {dt!r}")
    return DionOptions(
        lr=float(group["lr"]), mu=float(group["mu"]), weight_decay=float(group["weight_decay"]),
        rank_fraction=float(group["rank_fraction"]), rank_multiple_of=group["rank_multiple_of"],
        epsilon=float(group["epsilon"]), power_iters=group["power_iters"], error_feedback=group["error_feedback"],
        qr_method=QR_METHOD_ALIASES.get(group["qr_method"], group["qr_method"]), oversample=float(group["oversample"]),
        right_factor=group["right_factor"],
        momentum_dtype=group["momentum_dtype"], q_dtype=group["q_dtype"], flatten=group["flatten"])


def normalize_dion_group(group: dict) -> None:
    """Validate one Dion param group already filled with ``DION_DEFAULTS`` (hyperparameters and
    its params' ndim and dtype), resolving microsoft/dion's ``qr_method`` aliases ("qr",
    "rcqr") in place. Called at construction and by ``add_param_group``.
    Raises: ValueError / TypeError naming the key ("lr: ...", "params: ...")."""
    group["qr_method"] = QR_METHOD_ALIASES.get(group["qr_method"], group["qr_method"])
    resolve_dion_options(group)
    for p in group["params"]:
        if not isinstance(p, torch.Tensor) or not p.is_floating_point():
            raise TypeError(f"params: Dion expects floating-point tensors, got {getattr(p, 'dtype', type(p).__name__)}")
        if p.ndim < 2 or (p.ndim > 2 and not group["flatten"]) or p.numel() == 0:
            hint = ("pass flatten=True to treat it as (shape[0], prod(shape[1:])) (conv weights, as "
                    "microsoft/dion's Muon); a stack of expert matrices (E, m, n) needs Muon with expert_keys"
                    if p.ndim > 2 else "give vectors, scalars and embeddings to AdamW/Lion")
            raise ValueError(f"params: Dion expects non-empty 2-D (m, n) parameters; got shape {tuple(p.shape)}: "
                             f"{hint}")


def check_dion_step(group: dict, state: Mapping[torch.Tensor, dict], *, finite: bool | FiniteCheck = True,
                    options: DionOptions | None = None) -> None:
    """Check one group before any change: its hyperparameters (a scheduler may have set them),
    and for each param with a grad, the grad (``check_grad``: dense, real, the param's shape, dtype and
    device, finite) and any
    existing state (``momentum`` of the param's shape, ``Q`` of shape (min(m, n), r)).
    ``finite=False`` leaves the finiteness test to the caller (the sharded step tests each
    rank's block and decides on every rank together); a ``FiniteCheck`` collects the gradients
    for the caller to decide at once (one host sync per step). Changes nothing.
    ``options``: the group's current resolved options (skips their validation).
    Raises: ValueError / TypeError naming the key ("grad ...", "Q: ...")."""
    plan = plan_dion_group(group, resolve_dion_options(group) if options is None else options)
    check_planned(plan, state, finite)


def check_planned(plan: DionPlan, state: Mapping[torch.Tensor, dict], finite: bool | FiniteCheck) -> None:
    """``check_dion_step``'s checks of the gradients and state of a planned group."""
    for (_, p), want_q in zip(plan.live, plan.q_shapes):
        name = f"parameter with shape {tuple(p.shape)}"
        check_grad(p, name, "Dion", finite)
        st = state.get(p)
        if not st:
            continue
        for key, want in (("momentum", p.shape), ("Q", want_q)):
            t = st.get(key)
            if t is not None and (t.shape != want or not t.is_floating_point()):
                raise ValueError(f"{key}: expected a floating tensor of shape {tuple(want)} for parameter of shape "
                                 f"{tuple(p.shape)}, got {tuple(t.shape)} {t.dtype}")
        if "step" in st and not (torch.is_tensor(st["step"]) and st["step"].numel() == 1):
            raise ValueError(f"step: expected a one-element tensor, got {st['step']!r}")


#: The hyperparameters a scheduler may change at every step: validated again when they change, the plan kept.
DION_SCALARS = ("lr", "mu", "weight_decay")


@dataclass
class DionPlan:
    """What a Dion group's step reads, resolved once per change of the group (``plan_dion_group``):
    its options, the (index, parameter) pairs with a gradient (``live``) with their (shape, dtype,
    device) (``layouts``), matrix shapes and Q shapes, whether the group's elementwise start is
    batched (``dion_prepare``), and ``kwargs`` (``DionOptions.step_kwargs``; the options and kwargs
    follow lr, mu and weight_decay, validated when they change: ``scalar_values`` as the group held them).
    ``snapshot``: the frozen values of the other options."""

    group: dict
    options: DionOptions
    live: list
    layouts: list
    shapes: list
    q_shapes: list
    batched: bool
    kwargs: dict
    snapshot: tuple | None = None
    scalar_values: tuple = ()

    def holds(self, group: dict, live: list) -> bool:
        """Whether this plan is ``group``'s for the (index, parameter) pairs ``live`` (lr, mu and
        weight_decay validated here when they changed). Raises: ValueError naming a bad one."""
        if self.group is not group or len(live) != len(self.live) or any(
                i != j or p is not q for (i, p), (j, q) in zip(live, self.live)):
            return False
        if [(p.shape, p.dtype, p.device) for _, p in live] != self.layouts:
            return False
        snapshot = freeze_values(group[k] for k in _PLAN_KEYS)  # None: a tensor option, planned at every step
        if snapshot is None or snapshot != self.snapshot:
            return False
        values = tuple(group[k] for k in DION_SCALARS)
        if any(a is not b for a, b in zip(values, self.scalar_values)):
            scalars = {k: check_hyper(group[k], k, high=1.0 if k == "mu" else None) for k in DION_SCALARS}
            self.options = dataclasses.replace(self.options, **scalars)
            self.kwargs, self.scalar_values = self.options.step_kwargs(), values
        return True


def plan_dion_group(group: dict, options: DionOptions, live: list | None = None) -> DionPlan:
    """The ``DionPlan`` of ``group`` with its resolved ``options`` for its (index, parameter) pairs
    with a gradient (``live``; None: read from the group)."""
    live = [(i, p) for i, p in enumerate(group["params"]) if p.grad is not None] if live is None else live
    shapes = [matrix_shape(p) for _, p in live]
    snapshot = freeze_values(group[k] for k in _PLAN_KEYS)
    return DionPlan(group=group, options=options, live=live, layouts=[(p.shape, p.dtype, p.device) for _, p in live],
                    shapes=shapes, q_shapes=[torch.Size((min(m, n), param_rank(p, options)))
                                             for (m, n), (_, p) in zip(shapes, live)],
                    batched=len(live) > 1 and not any(is_dtensor(p) or p.numel() == 0 for _, p in live),
                    kwargs=options.step_kwargs(), snapshot=snapshot,
                    scalar_values=tuple(group[k] for k in DION_SCALARS))


def matrix_view(t: torch.Tensor, shape: tuple[int, int]) -> tuple[torch.Tensor, bool]:
    """(view of t as shape, False), or (a reshaped copy, True) when no view exists."""
    try:
        return t.view(shape), False
    except RuntimeError:
        return t.reshape(shape), True


def dion_state_dtype(group: dict, key: str, p: torch.Tensor) -> torch.dtype | None:
    """The dtype of Dion state ``key`` of parameter ``p``: ``momentum_dtype`` / ``q_dtype``
    (None: the parameter's dtype) for "momentum" / "Q", None for other keys."""
    if key not in ("momentum", "Q"):
        return None
    dt = group["momentum_dtype" if key == "momentum" else "q_dtype"]
    return p.dtype if dt is None else dt


def init_dion_state(p: torch.Tensor, st: dict, group: dict, *, seed: int, index: int) -> None:
    """Create the missing state of one-process parameter ``p`` (global index ``index``):
    ``momentum`` zeros, ``Q`` = ``initial_q`` of (min(m, n), r), ``step`` 0. No parameter changes."""
    m, n = matrix_shape(p)
    if "momentum" not in st:
        st["momentum"] = torch.zeros(p.shape, dtype=dion_state_dtype(group, "momentum", p), device=p.device)
    if "Q" not in st:
        st["Q"] = initial_q((min(m, n), param_rank(p, group)), seed, index, dion_state_dtype(group, "Q", p), p.device)
    if "step" not in st:
        st["step"] = torch.zeros((), dtype=torch.int64)


@torch.no_grad()
def step_block(x_t: torch.Tensor, g_t: torch.Tensor, m_t: torch.Tensor, q: torch.Tensor, st: dict,
               options: DionOptions, *, seed: int, index: int, shape: tuple[int, int], local_shape: tuple[int, int],
               kwargs: dict | None = None, **sharding) -> None:
    """One step of parameter ``index`` on its block: x_t, g_t, m_t (any shape of ``local_shape``'s
    size) viewed as the (|I|, |J|) block of the (m, n) = ``shape`` matrix with the group's
    ``options``; ``sharding`` passed to ``ortho_fast.functional.dion.dion_apply`` (``rows``,
    ``cols``, ``replica_mean``, ``nonzero``; nothing: one process); ``kwargs``: ``options.step_kwargs()``
    already formed (a plan's, ``DionPlan.kwargs``)."""
    st["step"] += 1
    gen = None
    if options.qr_method == "randomized_cholesky_qr":
        gen = sketch_generator(seed, index, int(st["step"]), m_t.device)
    x, x_copied = matrix_view(x_t, local_shape)
    mom, m_copied = matrix_view(m_t, local_shape)
    dion_math.dion_apply(x, g_t.reshape(local_shape), mom, q, shape=shape, generator=gen,
                         **(options.step_kwargs() if kwargs is None else kwargs), **sharding)
    for target, copy, copied in ((x_t, x, x_copied), (m_t, mom, m_copied)):
        if copied:
            target.copy_(copy.view(target.shape))


def dion_group_step(group: dict, state, *, seed: int, first_index: int, options: DionOptions | None = None) -> None:
    """Apply one Dion step to every param of ``group`` with a grad (``check_dion_step`` passed).

    Param i of the group has global index ``first_index + i``: its Q0 is
    ``initial_q(..., seed, first_index + i)`` and its sketches come from
    ``sketch_generator(seed, first_index + i, step)``. State per param (created on first use):
    ``momentum`` (param's shape, ``momentum_dtype``), ``Q`` ((min(m, n), r), ``q_dtype``) and
    ``step`` (int64 CPU scalar tensor: steps taken, which keys the sketch so a resumed run draws
    the same sketches). ``state`` is the optimizer's defaultdict(dict); ``options`` the group's
    resolved options (resolved here when absent).
    """
    plan = plan_dion_group(group, resolve_dion_options(group) if options is None else options)
    run_dion_plan(plan, state, seed=seed, first_index=first_index)


def run_dion_plan(plan: DionPlan, state, *, seed: int, first_index: int) -> None:
    """``dion_group_step`` of a planned group."""
    live, options = plan.live, plan.options
    for i, p in live:
        st = state[p]
        if "step" not in st or "Q" not in st or "momentum" not in st:
            init_dion_state(p, st, plan.group, seed=seed, index=first_index + i)
    kwargs = plan.kwargs
    batched = {}  # M ← M + G, the decay and B ≠ 0 for the whole group: a few launches, not three per matrix
    if plan.batched:
        flags = dion_math.dion_prepare([p for _, p in live], [p.grad for _, p in live],
                                       [state[p]["momentum"] for _, p in live], lr=kwargs["lr"],
                                       weight_decay=kwargs["weight_decay"])
        batched = {i: dict(prepared=True, nonzero=flag) for (i, _), flag in zip(live, flags)}
    for (i, p), shape in zip(live, plan.shapes):
        st = state[p]
        step_block(p, p.grad, st["momentum"], st["Q"], st, options, seed=seed, index=first_index + i, shape=shape,
                   local_shape=shape, kwargs=kwargs, **batched.get(i, {}))


#: The group keys a ``DionOptions`` is resolved from.
DION_OPTION_KEYS = tuple(DION_DEFAULTS)
#: The option keys a plan depends on (all but the hyperparameters a scheduler changes).
_PLAN_KEYS = tuple(k for k in DION_OPTION_KEYS if k not in DION_SCALARS)


def cached_dion_plan(store: dict, group: dict) -> DionPlan:
    """The plan of ``group`` kept in ``store`` (id(group) -> plan), planned again when the group changed
    (``DionPlan.holds``; options resolved and validated then). Under ``torch.compile`` planned at every
    trace (``id()`` of a dict is not traced; the plan is Python, gone from the graph)."""
    if torch.compiler.is_compiling():
        return plan_dion_group(group, resolve_dion_options(group))
    live = [(i, p) for i, p in enumerate(group["params"]) if p.grad is not None]
    plan = store.get(id(group))
    if plan is None or not plan.holds(group, live):
        plan = store[id(group)] = plan_dion_group(group, resolve_dion_options(group), live)
    return plan


class DionGroups(GroupRunner):
    """Runs the Dion groups of one optimizer in one process, each from its plan (``DionPlan``, kept in
    ``step_plans`` while the group's parameters and options but lr / mu / weight_decay stay; cleared
    by ``reset``): ``check`` / ``step`` as ``check_dion_step`` / ``dion_group_step`` (``seed`` the
    optimizer's)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.step_plans: dict[int, DionPlan] = {}  # id(group) -> its plan
        self.checked: dict[int, DionPlan] = {}  # the plans ``check`` found valid, for the step that follows

    def options(self, group: dict) -> DionOptions:
        return self.plan(group).options

    def plan(self, group: dict) -> DionPlan:
        """The group's plan (``cached_dion_plan``)."""
        return cached_dion_plan(self.step_plans, group)

    def check(self, groups, state, finite: FiniteCheck | None = None) -> None:
        for group in groups:
            plan = self.plan(group)
            check_planned(plan, state, finite if finite is not None else False)
            if not torch.compiler.is_compiling():
                self.checked[id(group)] = plan

    def step(self, group: dict, state, first_index: int) -> None:
        plan = None if torch.compiler.is_compiling() else self.checked.pop(id(group), None)
        if plan is None or plan.group is not group:
            plan = self.plan(group)
        run_dion_plan(plan, state, seed=self.seed, first_index=first_index)

    def reset(self) -> None:
        super().reset()
        self.step_plans.clear()
        self.checked.clear()
