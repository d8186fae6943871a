"""Dion (Ahn et al., arXiv 2504.05295, Algorithm 1), with the variants of microsoft/dion: the ``Dion``
optimizer class and the glue to its distributed form.

The class only owns state and grouping: the per-tensor math is in ``ortho_fast.functional.dion``
(``dion_update``, ``dion_right_factor``, ``initial_q``, ``dion_rank``) and
``ortho_fast.functional.qr`` (``orthonormalize`` and the sketches), the param-group contract in
``ortho_fast.groups.dion`` (``DION_DEFAULTS``, ``normalize_dion_group``, ``check_dion_step``,
``dion_group_step``), the sharded step in ``ortho_fast.distributed.dion``
(``Dion(..., outer_shard_mesh=...)``); import those names from there.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch.optim import Optimizer

from .compat import DION_ALIASES, aliases_used, apply_aliases, canonical_group, mixed_precision_dtypes, named_as_given
from .functional.qr import RCQR_OVERSAMPLE
from .groups.dion import DION_DEFAULTS, DionGroups, dion_state_dtype, init_dion_state, normalize_dion_group
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

__all__ = ["Dion", "dion_runner", "init_dion_groups", "plan_dion_group", "resolve_meshes"]


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
    """Dion (DIstributed OrthoNormalization) for matrix parameters, one process or over meshes.

    Per matrix X (m, n) (transposed when m < n), rank r: B = M + G, P = orth(B·Q), R = Bᵀ·P, M ← B − (1 − μ)·P·Rᵀ
    (error feedback), Q ← R / (‖R_j‖ + ε), X ← X·(1 − lr·wd) − lr·√(m/n)·P·Qᵀ. The signature is microsoft/dion's,
    in its positional order; docs/optimizers.md, "Dion", explains every option.

    Parameters
    ----------
    params : iterable of Tensor, (name, Tensor) pairs or dict
        The ≥ 2-D parameters or param groups.
    replicate_mesh, outer_shard_mesh, inner_shard_mesh : 1-D DeviceMesh or ProcessGroup, default None
        The replicate (DDP, HSDP), outer shard (FSDP ``Shard(0)``) and inner shard (TP) axes.
    replicate_mesh_grad_sync : bool, default True
        Synchronize the replicas' gradients compressed (P and R averaged); False: already averaged.
    rank_fraction, rank_multiple_of : float in (0, 1], int, default 1.0, 1
        r = ⌈rank_fraction·min(m, n)⌉ rounded up to a multiple of ``rank_multiple_of`` (at most min(m, n)).
    lr, mu : float, default 0.01, 0.95
        Learning rate and momentum (error-feedback) coefficient.
    betas : (float, float), optional
        microsoft/dion's AdamW / Lion betas: validated, unused (those groups run in ``HybridOptimizer``).
    weight_decay, epsilon : float, default 0.01, 1e-8
        Decoupled weight decay; the epsilon of the column normalization.
    power_iters : int, default 1
        Power iterations per step.
    qr_method : {"householder", "cholesky_qr", "randomized_cholesky_qr"}, default "householder"
        How P is orthonormalized (aliases "qr", "rcqr").
    cqr_warmup_steps, rcqr_oversample, mixed_precision_config : optional
        microsoft/dion's: ignored; ``oversample``; its ``DionMixedPrecisionConfig`` (or a dict) of state dtypes.
    error_feedback, oversample, right_factor : bool, float, str, default True, 1.25, "column_norm"
        Keep (1 − μ)·P·Rᵀ out of M; sketch rows per rank of randomized QR; "column_norm" or "qr" (Orth-Dion).
    momentum_dtype, q_dtype : torch.dtype, optional
        State dtypes (None: the parameter's).
    flatten, seed : bool, int, default False, 0
        ≥ 3-D parameters as (shape[0], prod(rest)); the seed of Q0 and the sketches.
    process_group : ProcessGroup, optional
        DDP over plain tensors (instead of the meshes).
    check_finite, capturable : bool, default True, False
        Check every gradient finite (one host read); ``capturable`` must be False (the step reads the host).
    **aliases
        Other names of microsoft/dion and OLMo-core; an unknown one raises TypeError with the closest name.

    Raises
    ------
    ValueError, TypeError
        A bad option, parameter, gradient or state, naming it, before any parameter or state changes.
    LayoutError
        A mesh or a DTensor placement the sharded step cannot use (a ValueError).

    References
    ----------
    Ahn et al. 2025, "Dion: Distributed Orthonormalized Updates", arXiv 2504.05295, Algorithm 1 and
    its distributed form; microsoft/dion ``dion/dion.py``.

    Examples
    --------
    >>> import torch, ortho_fast
    >>> w = torch.nn.Parameter(torch.randn(8, 4))
    >>> opt = ortho_fast.Dion([w], lr=0.01, rank_fraction=0.5)
    >>> w.grad = torch.randn(8, 4)
    >>> opt.step()
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
        """Add a param group: torch's checks, then the group's options and its parameters' layouts validated.

        microsoft/dion's names (``rcqr_oversample``) are taken for ours; a group naming another
        ``algorithm`` or holding another algorithm's option is rejected.

        Parameters
        ----------
        param_group : dict
            ``params`` and any option of the constructor.

        Raises
        ------
        ValueError, TypeError
            A bad option or parameter, naming it; a rejected group is removed again.
        """
        used = aliases_used(param_group, DION_ALIASES)
        if isinstance(param_group, dict):
            param_group = canonical_group(dict(param_group), DION_ALIASES)
        with named_as_given(used):
            add_param_group_checked(self, param_group, self._normalize_group)

    def state_dict(self) -> dict:
        """torch's ``state_dict``, with dtype options written as their names.

        Returns
        -------
        dict
            ``{"state": {index: {"momentum", "Q", "step"}}, "param_groups": [dict, ...]}``.
        """
        return state_dict_with_dtype_names(self)

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state dict, checked before anything changes, keeping the configured state dtypes.

        Saved groups are completed from the current ones and validated first; every state tensor is a
        copy; ``momentum`` / ``Q`` are restored in the group's ``momentum_dtype`` / ``q_dtype`` (torch would
        cast them to the parameter's dtype). A DTensor parameter's state must be DTensors with its layout
        (``torch.distributed.checkpoint`` into ``init_state()``'s state), checked at the next step.

        Parameters
        ----------
        state_dict : dict
            As ``state_dict`` returns: per parameter ``momentum``, ``Q`` (finite, shaped) and ``step`` (an int ≥ 0).

        Raises
        ------
        ValueError, TypeError
            A bad group option, parameter id or state entry, naming the key, before anything changes.
        """
        def spec(i: int, saved: dict, current: dict):
            canonical_group(saved, DION_ALIASES)
            check_group_algorithm(saved, "dion", "Dion")
            return DION_DEFAULTS, normalize_dion_group

        load_state_dict_checked(self, state_dict, spec, dion_state_dtype, algorithm_of=lambda group: "dion")
        self._runner.reset()

    @torch.no_grad()
    def init_state(self) -> None:
        """Create the state of every parameter now, as the first step would, changing no parameter.

        ``momentum`` zeros, ``Q`` = Q0, ``step`` 0, without communication (existing entries are kept).
        Call it on a fresh optimizer before ``torch.distributed.checkpoint.load(opt.state_dict(), ...)``,
        so there are tensors (DTensors with the right placements) to load into, then ``load_state_dict``.
        """
        init_dion_groups(self.param_groups, self.state, self._meshes, self._plans, seed=self.seed)

    @torch.no_grad()
    def synchronize_for_checkpoint(self) -> None:
        """Make the state the same on every replica before a checkpoint is saved.

        With compressed sync each replica's momentum is its own: this averages it over the replicate
        axis (and broadcasts Q, already equal, from the first replica). A no-op in one process, without a
        replicate axis or with ``replicate_mesh_grad_sync=False`` (as microsoft/dion); see
        ``ortho_fast.distributed.dion.synchronize_replicas``.
        """
        if self._meshes is not None:
            from .distributed.dion import synchronize_replicas

            synchronize_replicas(self.param_groups, self.state, self._meshes)

    @tracks_scheduler_calls
    @torch.no_grad()
    def step(self, closure=None):
        """One Dion step for every parameter with a gradient; every group is checked before any changes.

        Parameters
        ----------
        closure : callable, optional
            Re-evaluates the model and returns the loss (torch.optim's ``closure``).

        Returns
        -------
        Tensor or None
            The closure's loss, or None without a closure.
        """
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
