"""Dion (Ahn et al., arXiv 2504.05295, Algorithm 1), with the variants of microsoft/dion: the ``Dion``
optimizer class and the glue to its distributed form.

The class only owns state and grouping: the per-tensor math is in ``ortho_fast.functional.dion``
(``dion_update``, ``dion_right_factor``, ``initial_q``, ``dion_rank``) and
``ortho_fast.functional.qr`` (``orthonormalize`` and the sketches), the param-group contract in
``ortho_fast.groups.dion`` (``DION_DEFAULTS``, ``normalize_dion_group``, ``check_dion_step``,
``dion_group_step``), the sharded step in ``ortho_fast.distributed.dion``
(``Dion(..., outer_shard_mesh=...)``). Those names stay importable from here.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch.optim import Optimizer

from .compat import DION_ALIASES, aliases_used, apply_aliases, canonical_group, mixed_precision_dtypes, named_as_given
from .functional.dion import RIGHT_FACTORS, DionUpdate, dion_rank, dion_right_factor, dion_update, initial_q
from .functional.qr import (
    CQR2_GRAM_DEVIATION,
    QR_METHOD_ALIASES,
    QR_METHODS,
    RCQR_OVERSAMPLE,
    WHOLE,
    WholeDim,
    gaussian_sketch,
    orthonormalize,
    sketch_generator,
    sketch_rows,
)
from .groups.dion import (
    DION_DEFAULTS,
    DionGroups,
    check_dion_step,
    dion_group_step,
    dion_state_dtype,
    init_dion_state,
    normalize_dion_group,
    resolve_dion_options,
)
from .groups.driver import (
    GroupRunner,
    SchedulerCalls,
    check_then_step,
    init_groups_if_compiling,
    one_algorithm,
    tracks_scheduler_calls,
)
from .groups.state import (
    add_param_group_checked,
    check_group_algorithm,
    load_state_dict_checked,
    state_dict_with_dtype_names,
)
from .validation import is_dtensor

__all__ = ["CQR2_GRAM_DEVIATION", "DION_DEFAULTS", "Dion", "DionUpdate", "QR_METHODS", "QR_METHOD_ALIASES",
           "RCQR_OVERSAMPLE", "RIGHT_FACTORS", "WHOLE", "WholeDim", "check_dion_step", "dion_group_step", "dion_rank",
           "dion_right_factor", "dion_runner", "dion_state_dtype", "dion_update", "gaussian_sketch",
           "init_dion_groups", "init_dion_state", "initial_q", "normalize_dion_group", "orthonormalize",
           "plan_dion_group", "resolve_dion_options", "resolve_meshes", "sketch_generator", "sketch_rows"]


def resolve_meshes(replicate_mesh=None, outer_shard_mesh=None, inner_shard_mesh=None,
                   replicate_mesh_grad_sync: bool = True, process_group=None):
    """The ``ortho_fast.distributed.dion.DionMeshes`` of Dion's mesh arguments, or None when
    none is given (one process; torch.distributed is then not imported).
    Raises: as ``resolve_dion_meshes``; TypeError naming ``replicate_mesh_grad_sync`` unless a bool."""
    if any(a is not None for a in (replicate_mesh, outer_shard_mesh, inner_shard_mesh, process_group)):
        from .distributed.dion import resolve_dion_meshes

        return resolve_dion_meshes(replicate_mesh, outer_shard_mesh, inner_shard_mesh, replicate_mesh_grad_sync,
                                   process_group)
    if not isinstance(replicate_mesh_grad_sync, bool):
        raise TypeError(f"replicate_mesh_grad_sync: expected a bool, got {replicate_mesh_grad_sync!r}")
    return None


def plan_dion_group(group: dict, meshes, plans: dict) -> None:
    """Add the distributed plan (``ortho_fast.distributed.dion.dion_plan``) of every parameter of
    a normalized Dion group to ``plans``; nothing is added if one fails. Without meshes, a
    DTensor parameter is an error.
    Raises: LayoutError (a ValueError) as ``dion_plan``, or for DTensors without mesh arguments."""
    if meshes is None:
        from .distributed.layout import LayoutError

        if any(is_dtensor(p) for p in group["params"]):
            raise LayoutError("params: DTensor parameters need the mesh arguments (replicate_mesh, "
                              "outer_shard_mesh, inner_shard_mesh) that their placements shard over")
        return
    from .distributed.dion import dion_plan

    plans.update({p: dion_plan(p, meshes) for p in group["params"]})


def dion_runner(meshes, plans: dict, seed: int) -> GroupRunner:
    """The runner of a Dion optimizer's groups: one process (``DionGroups``) without meshes, else
    the sharded step (``ortho_fast.distributed.dion.ShardedDionGroups``, reading ``plans`` as
    groups are added)."""
    if meshes is None:
        return DionGroups(seed)
    from .distributed.dion import ShardedDionGroups

    return ShardedDionGroups(plans, meshes, seed)


def init_dion_groups(groups, state, meshes, plans: dict, *, seed: int) -> None:
    """``init_dion_state`` (or its sharded form) for every parameter of ``groups``, numbered in
    group order as the step numbers them: the state a first step would create, no communication."""
    index = 0
    for group in groups:
        for p in group["params"]:
            if meshes is None:
                init_dion_state(p, state[p], group, seed=seed, index=index)
            else:
                from .distributed.dion import init_sharded_state

                init_sharded_state(p, state[p], group, plans[p], seed=seed, index=index)
            index += 1


class Dion(SchedulerCalls, Optimizer):
    """Dion (DIstributed OrthoNormalization) for matrix parameters, in one process or over a
    DeviceMesh / DTensor / ProcessGroup.

    Args follow microsoft/dion, in its positional order ``Dion(params, replicate_mesh,
    outer_shard_mesh, inner_shard_mesh, replicate_mesh_grad_sync, rank_fraction,
    rank_multiple_of, lr, mu, betas, weight_decay, epsilon, power_iters, qr_method,
    cqr_warmup_steps, rcqr_oversample, mixed_precision_config)``: lr 0.01, mu 0.95,
    weight_decay 0.01, rank_fraction 1.0, rank_multiple_of 1, epsilon 1e-8, power_iters 1,
    ``oversample`` 1.25 (``rcqr_oversample`` is its name), ``momentum_dtype`` / ``q_dtype``
    (None = the parameter's dtype; ``mixed_precision_config``, its ``DionMixedPrecisionConfig``
    or a dict, sets them from ``momentum_dtype`` / ``Q_dtype``; a ``variance_dtype`` is
    rejected); ``betas`` (validated, unused: microsoft/dion applies them to its AdamW / Lion
    groups, which run in ``HybridOptimizer`` here) and ``cqr_warmup_steps`` (ignored, as
    microsoft/dion ignores it) are accepted so its calls work unchanged; other names: TypeError
    with the closest one (docs/compatibility.md). Also: ``qr_method`` ("householder" default, "cholesky_qr",
    "randomized_cholesky_qr"; aliases "qr", "rcqr"), ``right_factor`` ("column_norm" of the
    paper, or "qr" for Orth-Dion), ``error_feedback`` (default True), ``flatten`` (ndim > 2
    parameters as (shape[0], prod(rest)), as microsoft/dion's Muon), ``seed`` (Q0 and the
    sketches are deterministic per parameter index, in the order of ``params``).
    Every group key and default is in ``DION_DEFAULTS``; the group logic lives in
    ``normalize_dion_group`` / ``check_dion_step`` / ``dion_group_step`` so a hybrid optimizer
    can drive Dion groups.

    Distributed (microsoft/dion's arguments; each mesh a 1-D DeviceMesh such as
    ``world_mesh["dp_shard"]``, or a ProcessGroup): ``replicate_mesh`` (DDP, the replicate dim of
    HSDP), ``outer_shard_mesh`` (FSDP: FSDP2 ``fully_shard``'s Shard(0)), ``inner_shard_mesh``
    (TP: ``parallelize_module``'s colwise Shard(0) / rowwise Shard(1)); FSDP on top of colwise
    TP (``_StridedShard``), HSDP + TP and uneven or empty shards work the same way. Parameters
    are DTensors whose sharded mesh dims are among these meshes (plain tensors are whole on every
    rank). ``process_group``: DDP over plain tensors (the replicate axis; excludes the meshes).
    ``replicate_mesh_grad_sync`` (default True): the gradients differ between replicas and Dion
    synchronizes them compressed (P and R averaged over the replicate axis, (m + n)·r per matrix
    instead of m·n; each replica keeps its own momentum, whose mean is the momentum of one
    process fed the mean gradient; weights and Q stay identical). False: the gradients are
    already averaged (DDP, FSDP2's HSDP all-reduce) and there is no replicate communication.
    With FSDP2 HSDP either disable FSDP's replicate all-reduce and keep True, or keep it and
    pass False (OLMo-core's setting). The result equals one process on the full tensors to
    rounding for every layout (the orientation and Q0 depend on the global shape only; see
    ``ortho_fast.distributed.dion``). State of a DTensor parameter: ``momentum`` with its
    layout, ``Q`` a DTensor on its mesh sharded like the working columns, so
    ``torch.distributed.checkpoint`` saves and reshards both; call
    ``synchronize_for_checkpoint()`` before saving, and ``init_state()`` on a fresh optimizer
    before ``dcp.load(opt.state_dict())`` then ``opt.load_state_dict``.

    ``capturable``: torch's option, only False: Dion's step reads its step counter on the host (the
    sketch generator's seed), so it cannot be captured in a CUDA graph (ValueError naming ``capturable``).
    ``check_finite`` (default True): every gradient must be finite, decided for the whole step by
    one fused reduction on the device and one host read (a NaN / Inf raises ValueError naming the
    parameter, before any change); False checks nothing and reads nothing from the device (a NaN
    then propagates, as in torch.optim), which ``torch.compile(opt.step, fullgraph=True)`` needs;
    a compiled Dion also needs ``init_state()`` first (Q0 comes from a seeded generator) and
    ``qr_method="householder"`` (the Cholesky methods decide their Householder fallback on the
    host; randomized Cholesky QR seeds a generator per step). B = 0 is decided on the device.
    State per parameter: ``momentum``, ``Q``, ``step`` (see ``dion_group_step``); inject a known
    Q through ``load_state_dict``. ``load_state_dict`` checks every saved state before anything
    changes (``check_saved_state``: all three keys present, ``momentum`` / ``Q`` real floating,
    of the right shape and finite, ``step`` a non-negative integer count; another optimizer's
    keys are rejected naming the key) and keeps the configured state dtypes (torch would cast
    them to the parameter's dtype).
    Params: tensors, (name, tensor) pairs (``model.named_parameters()``: torch's
    ``param_names``) or group dicts.
    ``load_state_dict`` validates the saved groups first and never aliases the given tensors
    (the ``step`` counter seeds the sketches: a shared one would advance both optimizers).
    Source: Ahn et al., arXiv 2504.05295, Algorithm 1 and its distributed form (compressed
    data-parallel sync, sharded weights); microsoft/dion.
    Raises: TypeError naming ``seed`` unless an int (not a bool); ValueError / TypeError at
    construction (or ``add_param_group`` / ``load_state_dict``) for bad hyperparameters or
    parameters (1-D, ndim > 2 without flatten, non-floating); at construction, LayoutError (a
    ValueError) / TypeError naming the argument for a mesh that is not 1-D or overlaps another,
    ``process_group`` with a mesh or with DTensor parameters, a DTensor without any mesh, sharded
    on a mesh dim the optimizer was not given or by the replicate mesh, with a Partial placement
    or on a mesh this rank is not in; at ``step`` for hyperparameters edited since, non-finite
    or mis-shaped gradients or mis-shaped state, before any parameter or state changes (in a
    distributed step on every rank together: see ``sharded_dion_step``).
    """

    def __init__(
        self,
        params: Iterable,
        replicate_mesh=None,
        outer_shard_mesh=None,
        inner_shard_mesh=None,
        replicate_mesh_grad_sync: bool = True,
        rank_fraction: float = 1.0,
        rank_multiple_of: int = 1,
        lr: float = 0.01,
        mu: float = 0.95,
        betas: tuple[float, float] | None = None,
        weight_decay: float = 0.01,
        epsilon: float = 1e-8,
        power_iters: int = 1,
        qr_method: str = "householder",
        cqr_warmup_steps: int | None = None,
        rcqr_oversample: float | None = None,
        mixed_precision_config=None,
        *,
        error_feedback: bool = True,
        oversample: float = RCQR_OVERSAMPLE,
        right_factor: str = "column_norm",
        momentum_dtype: torch.dtype | None = None,
        q_dtype: torch.dtype | None = None,
        flatten: bool = False,
        seed: int = 0,
        process_group=None,
        check_finite: bool = True,
        capturable: bool = False,
        **aliases,
    ) -> None:
        if capturable is not False:
            from .groups.dion import DION_NOT_CAPTURABLE

            raise ValueError(DION_NOT_CAPTURABLE)
        if isinstance(replicate_mesh, (int, float)) and not isinstance(replicate_mesh, bool):
            raise TypeError(f"replicate_mesh: got {replicate_mesh!r}; Dion's positional order is microsoft/dion's "
                            "(params, replicate_mesh, outer_shard_mesh, inner_shard_mesh, replicate_mesh_grad_sync, "
                            "rank_fraction, rank_multiple_of, lr, mu, ...): pass lr=... by keyword")
        defaults = dict(
            lr=lr, mu=mu, weight_decay=weight_decay, rank_fraction=rank_fraction, rank_multiple_of=rank_multiple_of,
            epsilon=epsilon, power_iters=power_iters, error_feedback=error_feedback, qr_method=qr_method,
            oversample=oversample, right_factor=right_factor, momentum_dtype=momentum_dtype, q_dtype=q_dtype,
            flatten=flatten,
        )
        given = {k: v for k, v in (("betas", betas), ("cqr_warmup_steps", cqr_warmup_steps),
                                   ("rcqr_oversample", rcqr_oversample)) if v is not None}
        for name, value in given.items():
            if name in aliases:
                raise TypeError(f"Dion: got multiple values for argument {name!r}")
            aliases[name] = value
        used = aliases_used(aliases, DION_ALIASES)
        apply_aliases(aliases, DION_ALIASES, defaults, DION_DEFAULTS, fixed="dion", where="Dion")
        if mixed_precision_config is not None:
            for key, value in mixed_precision_dtypes(mixed_precision_config).items():
                if value is not None and defaults[key] is not None and defaults[key] != value:
                    raise ValueError(f"mixed_precision_config: its {key} {value} conflicts with {key}="
                                     f"{defaults[key]}; give one of them")
                defaults[key] = defaults[key] if value is None else value
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed: expected an int, got {seed!r}")
        with named_as_given(used):
            normalize_dion_group({**defaults, "params": []})  # the defaults themselves, before any group
        if not isinstance(check_finite, bool):
            raise TypeError(f"check_finite: expected a bool, got {check_finite!r}")
        self.seed, self.check_finite = seed, check_finite
        self._meshes, self._plans = resolve_meshes(replicate_mesh, outer_shard_mesh, inner_shard_mesh,
                                                   replicate_mesh_grad_sync, process_group), {}
        self._runner = dion_runner(self._meshes, self._plans, seed)
        super().__init__(params, defaults)

    def __getstate__(self) -> dict:
        """torch's state (defaults, state, param_groups) plus the seed and the distributed plans,
        so ``copy.deepcopy`` / pickle give an optimizer that steps as this one does."""
        return {**super().__getstate__(), "seed": self.seed, "_meshes": self._meshes, "_plans": self._plans,
                "_runner": self._runner, "check_finite": self.check_finite}

    def _normalize_group(self, group: dict) -> None:
        """``normalize_dion_group``, then each param's distributed plan (kept once the group is)."""
        check_group_algorithm(group, "dion", "Dion")
        normalize_dion_group(group)
        plan_dion_group(group, self._meshes, self._plans)

    def add_param_group(self, param_group: dict) -> None:
        """torch's add_param_group (defaults, (name, tensor) pairs, leaf and duplicate checks),
        then ``normalize_dion_group`` and the layout checks; a rejected group is removed again.
        microsoft/dion's names (``rcqr_oversample``) are taken for ours; a group naming another
        ``algorithm`` or holding another algorithm's option is rejected."""
        used = aliases_used(param_group, DION_ALIASES)
        if isinstance(param_group, dict):
            param_group = canonical_group(dict(param_group), DION_ALIASES)
        with named_as_given(used):
            add_param_group_checked(self, param_group, self._normalize_group)

    def state_dict(self) -> dict:
        """torch's ``state_dict`` with dtype options as names (``state_dict_with_dtype_names``)."""
        return state_dict_with_dtype_names(self)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's ``load_state_dict`` through ``load_state_dict_checked``: saved groups
        completed from the current ones and validated first, every state tensor a copy, and
        ``momentum`` / ``Q`` restored from the saved tensors in the group's ``momentum_dtype``
        / ``q_dtype`` (torch casts floating state to the parameter's dtype, which would round a
        float32 momentum of a bfloat16 parameter). Distributed: the state of a DTensor
        parameter must be DTensors with its layout (``torch.distributed.checkpoint`` into
        ``init_state()``'s state), checked at the next step."""
        def spec(i: int, saved: dict, current: dict):
            canonical_group(saved, DION_ALIASES)
            check_group_algorithm(saved, "dion", "Dion")
            return DION_DEFAULTS, normalize_dion_group

        load_state_dict_checked(self, state_dict, spec, dion_state_dtype, algorithm_of=lambda group: "dion")
        self._runner.reset()

    @torch.no_grad()
    def init_state(self) -> None:
        """Create the state of every parameter now, with or without a gradient, without changing
        any parameter and without communication: ``momentum`` zeros, ``Q`` = Q0, ``step`` 0 —
        exactly what the first step would create (existing entries are kept). Call it on a fresh
        optimizer before ``torch.distributed.checkpoint.load(opt.state_dict(), ...)`` so there
        are tensors (DTensors with the right placements) to load into, then ``load_state_dict``."""
        init_dion_groups(self.param_groups, self.state, self._meshes, self._plans, seed=self.seed)

    @torch.no_grad()
    def synchronize_for_checkpoint(self) -> None:
        """Make the state the same on every replica before a checkpoint is saved: with
        compressed sync each replica's momentum is its own, this averages it over the replicate
        axis (and broadcasts Q, already equal, from the first replica). A no-op in one process,
        without a replicate axis or with ``replicate_mesh_grad_sync=False`` (as microsoft/dion).
        See ``ortho_fast.distributed.dion.synchronize_replicas``."""
        if self._meshes is not None:
            from .distributed.dion import synchronize_replicas

            synchronize_replicas(self.param_groups, self.state, self._meshes)

    @tracks_scheduler_calls
    @torch.no_grad()
    def step(self, closure=None):
        """One Dion step for every parameter with a gradient: every group is checked first
        (``check_dion_step``), then stepped (``dion_group_step``; distributed:
        ``ortho_fast.distributed.dion.sharded_dion_step``). Returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        init_groups_if_compiling(self)
        check_then_step(self.param_groups, self.state, {"dion": self._runner}, one_algorithm("dion"),
                        check_finite=self.check_finite)
        return loss

    def _init_group(self, group: dict) -> None:
        """``init_state`` (every parameter's, as the first step would create it; existing entries kept),
        one process only; run by dynamo outside the graph (``init_groups_if_compiling``), so Q0's
        seeded generator runs eagerly."""
        if self._meshes is None:
            init_dion_groups(self.param_groups, self.state, None, self._plans, seed=self.seed)
