"""Each param group's options, validated and resolved once.

A param group is a dict a user or a learning-rate scheduler may edit between steps. The group
layer resolves it into a frozen options object (``MuonOptions``, ``DionOptions``, ...: validated
values, named schedules turned into coefficient tables, dtype names into torch dtypes) and an
``OptionsCache`` keeps that object until one of the group's option values changes: a step then
costs one comparison of the group's values with the cached ones, not a new validation, and the
per-parameter data derived from the options (Muon's matrix layouts) is cached beside them.
Source: the role of torch.optim's ``_default_to_fused_or_foreach`` / per-group flags, and of
optax's frozen hyperparameters; docs/design.md, "Layers and import rules".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..functional.newton_schulz import check_gram


class Uncacheable(Exception):
    """A group value that cannot be compared by value (a tensor: it may change in place)."""


def freeze_value(value: Any) -> Any:
    """A value-comparable snapshot of a group option: each scalar with its type, sequences as
    tuples, dicts as sorted item tuples; a tensor or an array raises ``Uncacheable`` (resolved
    again at every step: it may change in place)."""
    if isinstance(value, torch.Tensor):
        raise Uncacheable
    if isinstance(value, (list, tuple)):
        return tuple(freeze_value(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, freeze_value(v)) for k, v in value.items()))
    if hasattr(value, "__array__") and not isinstance(value, (str, bytes)):  # numpy tables
        raise Uncacheable
    return type(value), value  # typed: True == 1 and 1 == 1.0, but a bool option set to 1 must be re-checked


def freeze_values(values) -> tuple | None:
    """A value-comparable snapshot of option values (``freeze_value`` of each, in order), or None when one
    cannot be compared by value (a tensor or an array: it may change in place)."""
    try:
        return tuple(freeze_value(v) for v in values)
    except Uncacheable:
        return None


@dataclass
class CacheEntry:
    """What the cache keeps for one group: the group itself (so an id is never reused), the
    snapshot of its option values, the resolved options, and per-parameter derived data."""

    group: dict
    snapshot: tuple
    options: Any
    per_param: dict = field(default_factory=dict)


class OptionsCache:
    """Resolved options per param group, resolved again only when an option value changed.

    ``get(group, keys, resolve)`` returns ``resolve(group)`` (which validates and raises, naming
    the key) the first time and whenever one of ``group[k] for k in keys`` differs by value from
    the last resolution; groups holding a tensor option are resolved at every call. Not part of
    an optimizer's ``state_dict``; ``clear()`` after ``load_state_dict``.
    """

    def __init__(self) -> None:
        self._entries: dict[int, CacheEntry] = {}

    def entry(self, group: dict, keys: Sequence[str], resolve: Callable[[dict], Any]) -> CacheEntry:
        """The cache entry of ``group`` (resolved now if needed). Raises what ``resolve`` raises;
        a group that fails resolution leaves no entry.

        Under ``torch.compile`` the group is resolved afresh and nothing is cached: the resolution
        is Python on the group's values, run once per trace and gone from the graph, and a value
        dynamo made symbolic (an lr a scheduler changes, the options of a second optimizer
        compiled in the process) then needs no comparison with a cached one (``id()`` of a dict
        and ``hasattr`` on a symbolic float stop dynamo's trace)."""
        if torch.compiler.is_compiling():
            return CacheEntry(group, (), resolve(group))
        try:
            snapshot = tuple(freeze_value(group.get(k)) for k in keys)
        except Uncacheable:
            self._entries.pop(id(group), None)
            return CacheEntry(group, (), resolve(group))
        cached = self._entries.get(id(group))
        if cached is not None and cached.group is group and cached.snapshot == snapshot:
            return cached
        self._entries.pop(id(group), None)
        fresh = CacheEntry(group, snapshot, resolve(group))
        self._entries[id(group)] = fresh
        return fresh

    def get(self, group: dict, keys: Sequence[str], resolve: Callable[[dict], Any]) -> Any:
        """The resolved options of ``group`` (see the class docstring)."""
        return self.entry(group, keys, resolve).options

    def clear(self) -> None:
        self._entries.clear()

    def __getstate__(self) -> dict:  # a copied optimizer resolves its own groups again
        return {"_entries": {}}


def check_device_hyper(value, key: str, capturable: bool):
    """A hyperparameter given as a tensor: with ``capturable`` a 0-dim real floating tensor, returned as it
    is (its value is never read on the host: the range ``check_hyper`` checks for a float is not checked);
    without it refused (the step would read it with a device sync, which a captured graph cannot hold).
    A non-tensor is returned as it is, for ``check_hyper``. Raises: ValueError / TypeError naming ``key``."""
    if not isinstance(value, torch.Tensor):
        return value
    if not capturable:
        raise ValueError(f"{key}: a tensor {key} needs capturable=True (it is then read on the device, by the "
                         f"kernels); with capturable=False pass a Python float")
    if value.dim() != 0 or not value.is_floating_point() or value.is_complex():
        raise TypeError(f"{key}: expected a 0-dim real floating tensor, got shape {tuple(value.shape)} "
                        f"dtype {value.dtype}")
    return value


class DeviceHypers:
    """The 0-dim device tensors of the hyperparameters ``keys`` of ``capturable`` groups (torch's option),
    kept per group between steps. ``options(group, options)`` returns ``options`` with each of ``keys``
    as a 0-dim tensor on the parameters' device: a tensor in the group is used as it is (a scheduler
    writes it with ``fill_``, outside a captured graph); a float is copied with ``fill_`` into the tensor
    kept here (a device op, no host read; a captured graph replays the value it captured: give a tensor
    to follow a scheduler there). Of dtype float64 when the group has a float64 parameter, else float32.
    Raises: ValueError naming the key for a tensor on another device than the parameters'."""

    def __init__(self, keys: Sequence[str]) -> None:
        self.keys = tuple(keys)
        self._held: dict[int, tuple[dict, dict[str, torch.Tensor]]] = {}

    def options(self, group: dict, options: Any) -> Any:
        params = [p for p in group["params"] if p.grad is not None] or group["params"]
        if not params:
            return options
        device = params[0].device
        dtype = torch.float64 if any(p.dtype == torch.float64 for p in params) else torch.float32
        held = self._held.get(id(group))
        if held is None or held[0] is not group:
            held = self._held[id(group)] = (group, {})
        values = {}
        for key in self.keys:
            value = getattr(options, key)
            if isinstance(value, torch.Tensor):
                if value.device != device:
                    raise ValueError(f"{key}: a tensor {key} must be on the parameters' device ({device}), "
                                     f"got {value.device}")
                values[key] = value
                continue
            t = held[1].get(key)
            if t is None or t.device != device or t.dtype != dtype:
                t = held[1][key] = torch.empty((), dtype=dtype, device=device)
            values[key] = t.fill_(value)
        return dataclasses.replace(options, **values)

    def clear(self) -> None:
        self._held.clear()

    def __getstate__(self) -> dict:  # a copied optimizer keeps its own tensors
        return {"keys": self.keys, "_held": {}}


@dataclass(frozen=True)
class MuonOptions:
    """A Muon group's options, validated and resolved (``ortho_fast.groups.muon.resolve_muon_options``).

    ``table``: the per-step (a, b, c) rows of ``coefficients`` / ``ns_steps``; ``compute_dtype`` /
    ``precision``: the Newton–Schulz dtype setting resolved (None: the input's dtype); ``safety``,
    ``eps``, ``eps_mode``: the normalization after the schedule's defaults; ``expert_keys``,
    ``split_sizes``, ``num_heads`` as tuples; ``banks`` True only when the group sets it
    (``banks_setting`` keeps None / True / False); the pipeline stages (``resolve_stage_options``:
    ``equilibration`` the MuonEq side or None, ``renormalize``, ``normuon_*``). Scalars are Python floats.
    """

    lr: float
    weight_decay: float
    momentum: float
    nesterov: bool
    momentum_style: str
    table: tuple[tuple[float, float, float], ...]
    safety: float
    eps: float
    eps_mode: str
    compute_dtype: torch.dtype | None
    precision: str | None
    adjust_lr: str | None
    extra_scale_factor: float
    cautious_weight_decay: bool
    #: ``ortho_fast.functional.muon.WEIGHT_DECAY_STYLES``: "decoupled", "adjusted_lr", "independent".
    weight_decay_style: str
    banks: bool
    expert_keys: tuple[str, ...]
    split_sizes: tuple[int, ...] | None
    split_groups: int
    num_heads: int | tuple[int, ...] | None
    flatten: bool | None
    #: torch.optim.Muon's bits: matrix by matrix with its 2-D calls (no automatic batching).
    bitwise_torch: bool = False
    #: ``banks`` as the group gives it (None: batched unless ``bitwise_torch``).
    banks_setting: bool | None = None
    #: Gram Newton–Schulz (``ortho_fast.functional.newton_schulz.use_gram``): None automatic, False
    #: with ``bitwise_torch``.
    gram: bool | None = None
    # the pipeline stages (ortho_fast.groups.muon_stages; every stage off by default)
    equilibration: str | None = None
    renormalize: bool = False
    normuon_beta2: float | None = None
    normuon_eps: float = 1e-8
    normuon_eps_mode: str = "add"
    normuon_dim: str = "row"
    #: torch's ``capturable``: lr, weight_decay, momentum reach the kernels as 0-dim device tensors
    #: (``DeviceHypers.options`` in ``MuonGroups.step``); with it they may be tensors here.
    capturable: bool = False

    def post_orthogonalize_kwargs(self) -> dict:
        """Keyword arguments of ``ortho_fast.functional.muon_stages.post_orthogonalize``."""
        return dict(renormalize_norm=self.renormalize, beta2=self.normuon_beta2, eps=self.normuon_eps,
                    eps_mode=self.normuon_eps_mode, dim=self.normuon_dim)

    @property
    def batched(self) -> bool:
        """Whether one process stacks same-shape matrices into one batched Newton–Schulz call:
        ``banks`` when set; else the fast default: a bfloat16 / float16 compute dtype and not
        ``bitwise_torch``. Measured on CPU (torch 2.13, one quintic step's three products on 4
        stacked matrices, 128–512 × 128–2048): batched bf16 costs 0.33–0.97x the 2-D calls
        (the oneDNN batched kernels), float32 0.74–1.03x at 1 thread and 0.52–0.95x at 2. float32 /
        float64 stay matrix by matrix by default anyway: there a step's bits then do not depend
        on which matrices share a group (a distributed layout, a sharding check compare them
        bitwise with one process); ``banks=True`` opts in (docs/performance.md, "(b)")."""
        if self.banks_setting is not None:
            return self.banks_setting
        return not self.bitwise_torch and self.compute_dtype in (torch.bfloat16, torch.float16)

    def orthogonalize_kwargs(self) -> dict:
        """Keyword arguments of ``ortho_fast.functional.muon.orthogonalize`` as the distributed step
        uses them (``banks`` only when the group sets it: matrix by matrix otherwise, the bits of
        the one-process step with ``bitwise_torch=True``)."""
        return dict(safety=self.safety, eps=self.eps, eps_mode=self.eps_mode, compute_dtype=self.compute_dtype,
                    precision=self.precision, banks=self.banks, gram=self.gram)

    def update_kwargs(self) -> dict:
        """Keyword arguments of ``ortho_fast.functional.muon.muon_update``."""
        return dict(lr=self.lr, weight_decay=self.weight_decay, adjust_lr=self.adjust_lr,
                    extra_scale_factor=self.extra_scale_factor, cautious_weight_decay=self.cautious_weight_decay,
                    weight_decay_style=self.weight_decay_style)


@dataclass(frozen=True)
class DionOptions:
    """A Dion group's options, validated (``ortho_fast.groups.dion.resolve_dion_options``);
    ``qr_method`` with microsoft/dion's aliases resolved. Scalars are Python floats / ints."""

    lr: float
    mu: float
    weight_decay: float
    rank_fraction: float
    rank_multiple_of: int
    epsilon: float
    power_iters: int
    error_feedback: bool
    qr_method: str
    oversample: float
    right_factor: str
    momentum_dtype: torch.dtype | None
    q_dtype: torch.dtype | None
    flatten: bool

    def __getitem__(self, key: str):
        """``options[key]``: read like the group dict it was resolved from."""
        return getattr(self, key)

    def step_kwargs(self) -> dict:
        """Keyword arguments of ``ortho_fast.functional.dion.dion_apply`` taken from the options."""
        return dict(lr=self.lr, mu=self.mu, weight_decay=self.weight_decay, epsilon=self.epsilon,
                    power_iters=self.power_iters, error_feedback=self.error_feedback, qr_method=self.qr_method,
                    oversample=self.oversample, right_factor=self.right_factor)


@dataclass(frozen=True)
class AdamWOptions:
    """An AdamW group's options as floats (``ortho_fast.groups.scalar``)."""

    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float


@dataclass(frozen=True)
class LionOptions:
    """A Lion group's options as floats (``ortho_fast.groups.scalar``)."""

    lr: float
    betas: tuple[float, float]
    weight_decay: float


def check_gram_option(gram, compute_dtype: torch.dtype | None, precision: str | None) -> None:
    """A group's ``gram`` for its resolved compute dtype, as Muon and Dion2 check it: ``check_gram`` (None /
    True / False; True only in float16 / float32 / float64, not "high"), and True not with
    ``dtype=None`` (each gradient's dtype, bfloat16 included).
    Raises: TypeError / ValueError starting with "gram: "."""
    check_gram(gram, compute_dtype, precision)
    if gram and compute_dtype is None:
        raise ValueError("gram: gram=True needs dtype=torch.float16, torch.float32 or torch.float64 (dtype=None "
                         "follows each gradient's dtype, and Gram Newton–Schulz runs in float16 / float32 / float64 "
                         "only)")
