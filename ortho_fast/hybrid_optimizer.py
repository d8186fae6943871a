"""``HybridOptimizer``: one optimizer for a whole model, Muon or Dion for the matrices, AdamW or Lion for the rest.

``HybridOptimizer`` drives param groups whose ``algorithm`` is "muon", "dion", "adamw" or
"lion" through each algorithm's param-group contract (``ortho_fast.groups.algorithms``:
``<ALG>_DEFAULTS``, ``normalize_<alg>_group``, ``check_<alg>_step``, ``<alg>_group_step``) and the
one check-then-step driver (``ortho_fast.groups.driver``). ``param_groups`` (``ortho_fast.param_assignment``)
assigns a model's parameters the way OLMo-core, Motif, Megatron and microsoft/dion do, and
``MuonConfig`` / ``DionConfig`` (``ortho_fast.config``) build the optimizer with those systems'
defaults; the three are importable from ``ortho_fast``.
"""

from __future__ import annotations

import operator
from typing import Any, Iterable, Mapping

import torch
from torch.optim import Optimizer

from .compat import (
    DION2_ALIASES,
    DION_ALIASES,
    MUON_ALIASES,
    aliases_used,
    canonical_group,
    from_torch_muon_group,
    named_as_given,
)
from .dion import dion_runner, init_dion_groups, plan_dion_group, resolve_meshes
from .groups.algorithms import ALGORITHMS, SCALAR_ALGORITHMS, local_runners
from .groups.dion import dion_state_dtype
from .groups.driver import (
    SchedulerCalls,
    check_then_step,
    describe_groups,
    init_groups_if_compiling,
    labelled,
    tracks_scheduler_calls,
)
from .groups.first_state import init_first_state
from .groups.muon import muon_state_algorithm
from .groups.state import add_param_group_checked, load_state_dict_checked, state_dict_with_dtype_names

__all__ = ["HybridOptimizer"]


#: Group keys that belong to no algorithm's options but that groups legitimately carry.
_BOOKKEEPING_KEYS = ("params", "param_names", "algorithm")


def _from_microsoft_dion(group: dict, algorithm: str, defaults: Mapping[str, Any]) -> None:
    """microsoft/dion's scalar-group names -> ours: ``beta1``/``beta2`` -> ``betas`` (the
    missing one from ``defaults``), ``epsilon`` -> ``eps`` (AdamW). Raises ValueError when
    both spellings are given."""
    if algorithm not in SCALAR_ALGORITHMS:
        return
    if "beta1" in group or "beta2" in group:
        if "betas" in group:
            raise ValueError("betas: give either betas or microsoft/dion's beta1/beta2, not both")
        b1, b2 = defaults["betas"]
        group["betas"] = (group.pop("beta1", b1), group.pop("beta2", b2))
    if algorithm == "adamw" and "epsilon" in group:
        if "eps" in group:
            raise ValueError("eps: give either eps or microsoft/dion's epsilon, not both")
        group["eps"] = group.pop("epsilon")


def _canonical(group: dict, algorithm: str, saved: bool = False) -> None:
    """Other systems' names in a Muon / Dion group -> ours (``ortho_fast.compat``); a saved
    torch.optim.Muon group also gets torch's behaviour (``from_torch_muon_group``)."""
    if algorithm == "muon":
        if saved:
            from_torch_muon_group(group)
        canonical_group(group, MUON_ALIASES)
    elif algorithm == "dion":
        canonical_group(group, DION_ALIASES)
    elif algorithm == "dion2":
        canonical_group(group, DION2_ALIASES)


def _state_algorithm(group: dict) -> str:
    """The ``STATE_SPECS`` key of a group's saved state: its algorithm, "normuon" for a Muon group
    with NorMuon on (its ``variance_neuron`` too)."""
    return muon_state_algorithm(group) if group["algorithm"] == "muon" else group["algorithm"]


def _check_foreign_keys(group: dict, algorithm: str) -> None:
    """Reject an option of another algorithm that this one does not have (a likely mistake:
    ``momentum`` on an AdamW group does not set β1)."""
    own = ALGORITHMS[algorithm].defaults
    for key in group:
        if key in own or key in _BOOKKEEPING_KEYS or key == "capturable":  # torch's option: each algorithm's own
            continue
        if key.startswith("qk_clip"):
            raise ValueError(f"{key}: QK-clip runs in ortho_fast.Muon / NorMuon only (its step takes the max "
                             f"logits); HybridOptimizer groups do not clip")
        owners = [a for a, spec in ALGORITHMS.items() if key in spec.defaults]
        if owners:
            raise ValueError(f"{key}: an option of {'/'.join(owners)}, not of {algorithm} (its options: {sorted(own)})")


class HybridOptimizer(SchedulerCalls, Optimizer):
    """One torch optimizer whose param groups each run their own algorithm: Muon, Dion, Dion2, AdamW or Lion.

    Each group names its ``algorithm`` ("muon", "dion", "dion2", "adamw", "lion"); its missing options come
    from that algorithm's defaults. ``step`` checks every group, then steps every group, so a bad gradient
    anywhere changes nothing. docs/optimizers.md, "HybridOptimizer", has the details and microsoft/dion's
    group conventions; ``param_groups`` / ``MuonConfig`` / ``DionConfig`` build the groups of a model.

    Parameters
    ----------
    params_or_groups : iterable of Tensor, (name, Tensor) pairs or dict
        The parameters or param groups (``param_groups(model)``).
    seed : int, default 0
        The seed of Dion's Q0 and sketches (Dion parameters numbered among themselves, in group order).
    algorithm : str, optional
        The algorithm of groups that name none (None: every group must name one).
    defaults : dict of {algorithm: dict}, optional
        Per-algorithm option overrides of the defaults.
    replicate_mesh, outer_shard_mesh, inner_shard_mesh : 1-D DeviceMesh or ProcessGroup, optional
        ``Dion``'s axes (Dion2 takes the shard meshes when ``distributed_mesh`` / ``tp_mesh`` are None).
    replicate_mesh_grad_sync : bool, default True
        ``Dion``'s compressed gradient synchronization over the replicate axis.
    process_group : ProcessGroup, optional
        ``Dion``'s DDP over plain tensors.
    distributed_mesh, tp_mesh, tp_mode : DeviceMesh or ProcessGroup, DeviceMesh, str, default None, None, "duplicated"
        ``Muon``'s (and Dion2's) data-parallel and tensor-parallel axes.
    check_finite : bool, default True
        Check every gradient finite (one host read); False for ``torch.compile(opt.step, fullgraph=True)``.

    Raises
    ------
    ValueError, TypeError, KeyError
        Naming "param group i (algorithm)" and the option: an unknown algorithm, a group without
        ``params``, an option of another algorithm, or what the algorithm rejects; nothing changes.

    References
    ----------
    microsoft/dion's ``Dion`` / ``Muon`` groups with ``algorithm`` "adamw" / "lion"; ``torch.optim.AdamW``;
    Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms" (Lion), arXiv 2302.06675.

    Examples
    --------
    >>> import torch, ortho_fast
    >>> w, b = torch.nn.Parameter(torch.randn(8, 4)), torch.nn.Parameter(torch.zeros(8))
    >>> opt = ortho_fast.HybridOptimizer([{"params": [w], "algorithm": "muon", "lr": 0.02},
    ...                                   {"params": [b], "algorithm": "adamw", "lr": 1e-3}])
    >>> w.grad, b.grad = torch.randn(8, 4), torch.randn(8)
    >>> opt.step()
    """

    def __init__(
        self,
        params_or_groups: Iterable,
        *,
        seed: int = 0,
        algorithm: str | None = None,
        defaults: Mapping[str, Mapping[str, Any]] | None = None,
        replicate_mesh=None,
        outer_shard_mesh=None,
        inner_shard_mesh=None,
        replicate_mesh_grad_sync: bool = True,
        process_group=None,
        distributed_mesh=None,
        tp_mesh=None,
        tp_mode: str = "duplicated",
        check_finite: bool = True,
    ) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed: expected an int, got {seed!r}")
        if algorithm is not None and algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm: expected one of {sorted(ALGORITHMS)} or None, got {algorithm!r}")
        overrides = dict(defaults or {})
        for name, opts in overrides.items():
            if name not in ALGORITHMS:
                raise ValueError(f"defaults: unknown algorithm {name!r}; expected keys among {sorted(ALGORITHMS)}")
            unknown = sorted(set(opts) - set(ALGORITHMS[name].defaults))
            if unknown:
                raise ValueError(f"defaults[{name!r}]: unknown option {unknown[0]!r}; expected among "
                                 f"{sorted(ALGORITHMS[name].defaults)}")
        if not isinstance(check_finite, bool):
            raise TypeError(f"check_finite: expected a bool, got {check_finite!r}")
        self.seed, self.check_finite = seed, check_finite
        self.algorithm = algorithm
        self.algorithm_defaults = {name: {**spec.defaults, **overrides.get(name, {})}
                                   for name, spec in ALGORITHMS.items()}
        from .distributed.muon import MuonSharding

        self._muon_sharding = MuonSharding(distributed_mesh, tp_mesh, tp_mode)
        self._dion_meshes, self._dion_plans = resolve_meshes(replicate_mesh, outer_shard_mesh, inner_shard_mesh,
                                                             replicate_mesh_grad_sync, process_group), {}
        self._runners = local_runners(seed)
        if self._muon_sharding.active:
            self._runners["muon"] = self._muon_sharding
        self._runners["dion"] = dion_runner(self._dion_meshes, self._dion_plans, seed)
        if any(x is not None for x in (distributed_mesh, tp_mesh, outer_shard_mesh, inner_shard_mesh, replicate_mesh)):
            from .distributed.dion2 import Dion2Sharding

            # Dion2 groups: Muon's FSDP / TP meshes, else Dion's outer / inner shard meshes.
            self._runners["dion2"] = Dion2Sharding(distributed_mesh if distributed_mesh is not None
                                                   else outer_shard_mesh,
                                                   tp_mesh if tp_mesh is not None else inner_shard_mesh, replicate_mesh)
        super().__init__(params_or_groups, {})

    def __getstate__(self) -> dict:
        """torch's state (defaults, state, param_groups) plus this optimizer's own attributes, so
        ``copy.deepcopy`` / pickle give an optimizer that steps and adds groups as this one does."""
        return {**super().__getstate__(), **{key: self.__dict__[key] for key in (
            "seed", "algorithm", "algorithm_defaults", "_muon_sharding", "_dion_meshes", "_dion_plans", "_runners",
            "check_finite")}}

    def _normalize(self, index: int, algorithm: str, group: dict) -> None:
        """The algorithm's ``normalize``, then the distributed plan of a Muon or Dion group."""
        labelled(index, algorithm, ALGORITHMS[algorithm].normalize, group)
        if algorithm == "muon":
            labelled(index, algorithm, self._muon_sharding.add_group, group)
        elif algorithm == "dion":
            labelled(index, algorithm, plan_dion_group, group, self._dion_meshes, self._dion_plans)

    def _groups(self, algorithm: str) -> list[dict]:
        return [g for g in self.param_groups if g["algorithm"] == algorithm]

    def add_param_group(self, param_group: dict) -> None:
        """Add a param group: filled from its algorithm's defaults, torch's checks, then validated.

        torch's checks: leaf tensors, no parameter in two groups, names on all groups or none.

        Parameters
        ----------
        param_group : dict
            ``params``, ``algorithm`` (else the constructor's) and any option of that algorithm.

        Raises
        ------
        ValueError, TypeError, KeyError
            Naming "param group i (algorithm)" and the option; a rejected group is removed again.
        """
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group: expected a dict, got {type(param_group).__name__}")
        index = len(self.param_groups)
        group = dict(param_group)
        algorithm = group.setdefault("algorithm", self.algorithm)
        if algorithm not in ALGORITHMS:
            hint = " (name it in every group, or pass algorithm=...)" if algorithm is None else ""
            raise ValueError(f"param group {index}: algorithm: expected one of {sorted(ALGORITHMS)}, got "
                             f"{algorithm!r}{hint}")
        if "params" not in group:
            raise ValueError(f"param group {index} ({algorithm}): params: missing; expected a list of tensors")
        used = aliases_used(group,
                            {"muon": MUON_ALIASES, "dion": DION_ALIASES, "dion2": DION2_ALIASES}.get(algorithm, ()))
        labelled(index, algorithm, _from_microsoft_dion, group, algorithm, self.algorithm_defaults[algorithm])
        labelled(index, algorithm, _canonical, group, algorithm)
        labelled(index, algorithm, _check_foreign_keys, group, algorithm)
        for key, value in self.algorithm_defaults[algorithm].items():
            group.setdefault(key, value)
        with named_as_given(used):  # errors name the user's names (mu, not momentum)
            add_param_group_checked(self, group, lambda g: self._normalize(index, algorithm, g))

    @tracks_scheduler_calls
    @torch.no_grad()
    def step(self, closure=None):
        """Check every group (gradients, state, options), then step every group.

        Distributed, the checks agree across ranks first, so a bad gradient on one rank raises on all.

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
        for i, algorithm in enumerate(map(operator.methodcaller("get", "algorithm"), self.param_groups)):
            if algorithm not in ALGORITHMS:
                raise ValueError(f"param group {i}: algorithm: expected one of {sorted(ALGORITHMS)}, got "
                                 f"{algorithm!r}")
        axes = {a.ranks: a for a in (self._muon_sharding.dp, self._muon_sharding.tp,
                                     *(self._dion_meshes.check_axes if self._dion_meshes else ()))
                if a is not None and a.size > 1}
        init_groups_if_compiling(self)
        check_then_step(self.param_groups, self.state, self._runners, operator.itemgetter("algorithm"), label=True,
                        agree=self._agree(list(axes.values())) if axes else None, check_finite=self.check_finite)
        return loss

    def _init_group(self, group: dict) -> None:
        """The state the first step creates for every group (``group``: the first; ``init_first_state``;
        the Dion groups: ``init_state``), one process only; run by dynamo outside the graph
        (``init_groups_if_compiling``)."""
        for group in self.param_groups:
            algorithm = group.get("algorithm")
            if algorithm == "dion":
                if self._dion_meshes is None:
                    init_dion_groups(self._groups("dion"), self.state, None, self._dion_plans, seed=self.seed)
            elif self._runners.get(algorithm) is not None and not getattr(self._runners[algorithm], "communicates",
                                                                          False):
                init_first_state(group, self.state, algorithm, self._runners.get("muon"))

    def _agree(self, axes: list):
        """The cross-rank verdict on the groups that do not communicate here (AdamW, Lion, a Muon /
        Dion without meshes; a DTensor gradient is checked finite on this rank's shard): one
        all-reduce of an error flag over every axis the Muon and Dion groups communicate on, so a
        gradient one rank rejects raises on every rank, before the Muon / Dion checks'
        collectives, which the other ranks would otherwise wait in forever
        (``ortho_fast.distributed.comm.raise_together``)."""
        def agree(error) -> None:
            from .distributed.comm import raise_together

            device = next((p.device for g in self.param_groups for p in g["params"]), torch.device("cpu"))  # NCCL: GPU
            raise_together(error, axes, tag="check", device=device,
                           digest=describe_groups(self.param_groups, seed=self.seed))

        return agree

    @torch.no_grad()
    def init_state(self) -> None:
        """Create the Dion groups' state now, as ``Dion.init_state``, changing no parameter.

        The other algorithms create theirs as zeros in the step. Call it before
        ``torch.compile(opt.step, fullgraph=True)``: Q0 comes from a seeded generator, which a graph
        cannot hold.
        """
        init_dion_groups(self._groups("dion"), self.state, self._dion_meshes, self._dion_plans, seed=self.seed)

    @torch.no_grad()
    def synchronize_for_checkpoint(self) -> None:
        """``Dion.synchronize_for_checkpoint`` for the Dion groups (a no-op without compressed sync)."""
        if self._dion_meshes is not None:
            from .distributed.dion import synchronize_replicas

            synchronize_replicas(self._groups("dion"), self.state, self._dion_meshes)

    def state_dict(self) -> dict:
        """torch's ``state_dict``, with dtype options written as their names.

        Returns
        -------
        dict
            ``{"state": {index: dict}, "param_groups": [dict, ...]}``; each state is its algorithm's.
        """
        return state_dict_with_dtype_names(self)

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state dict, checked before anything changes; the loaded state owns its tensors.

        The saved groups must run the same algorithms and are completed from the current ones (a
        torch.optim.Muon group's settings mapped as ``Muon.load_state_dict`` maps them); every saved
        parameter state is checked against its group's algorithm (Muon's ``momentum_buffer``, Dion's
        ``momentum`` / ``Q`` / ``step``, AdamW's ``exp_avg`` / ``exp_avg_sq`` / ``step``, Lion's ``exp_avg``).

        Parameters
        ----------
        state_dict : dict
            As ``state_dict`` returns.

        Raises
        ------
        ValueError, TypeError
            A bad group option, parameter id or state entry, naming the key, before anything changes.
        """
        load_state_dict_checked(self, state_dict, self._saved_group_spec,
                                lambda group, key, p: dion_state_dtype(group, key, p) if group["algorithm"] == "dion"
                                else None, algorithm_of=_state_algorithm)
        for runner in self._runners.values():
            runner.reset()

    @staticmethod
    def _saved_group_spec(i: int, group: dict, current: dict):
        """The saved group's algorithm (missing: the current one; another one: ValueError),
        its option keys and its normalize function (errors prefixed by "param group i (alg)")."""
        algorithm = group.setdefault("algorithm", current["algorithm"])
        if algorithm != current["algorithm"]:
            raise ValueError(f"param group {i}: the state dict's algorithm {algorithm!r} differs from this "
                             f"optimizer's {current['algorithm']!r}")
        labelled(i, algorithm, _canonical, group, algorithm, saved=True)
        spec = ALGORITHMS[algorithm]
        return spec.defaults, lambda trial: labelled(i, algorithm, spec.normalize, trial)
