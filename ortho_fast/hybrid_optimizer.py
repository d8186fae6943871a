"""``HybridOptimizer``: one optimizer for a whole model, Muon or Dion for the matrices, AdamW or Lion for the rest.

``HybridOptimizer`` drives param groups whose ``algorithm`` is "muon", "dion", "adamw" or
"lion" through each algorithm's param-group contract (``ortho_fast.groups.algorithms``:
``<ALG>_DEFAULTS``, ``normalize_<alg>_group``, ``check_<alg>_step``, ``<alg>_group_step``) and the
one check-then-step driver (``ortho_fast.groups.driver``). ``param_groups`` (``ortho_fast.grouping``)
splits a model's parameters the way OLMo-core, Motif, Megatron and microsoft/dion do, and
``MuonConfig`` / ``DionConfig`` (``ortho_fast.config``) build the optimizer with those systems'
defaults; ``ortho_fast.hybrid`` gathers all of them.
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
    """One torch optimizer whose param groups each run their own ``algorithm``: "muon", "dion",
    "dion2", "adamw" or "lion" (``ALGORITHMS``).

    A group's missing options come from ITS algorithm's defaults (``MUON_DEFAULTS``,
    ``DION_DEFAULTS``, ``ADAMW_DEFAULTS``, ``LION_DEFAULTS``), overridden per algorithm by
    ``defaults={"adamw": {...}, ...}``; groups without ``algorithm`` get ``algorithm=``
    (default None: every group must name one). ``"capturable": True`` in a Muon, Dion2 or AdamW group
    (torch's option): its hyperparameters as 0-dim device tensors and no host read in its step (``Muon``'s
    ``capturable``); a Dion group refuses it (ValueError naming ``capturable``). ``step`` first runs every
    group's check (a
    NaN gradient anywhere: ValueError, nothing changed), then steps every group. Dion groups
    number their parameters among the Dion parameters only, in group order, so ``seed`` and
    that index draw the same Q0 as ``Dion(dion_groups, seed=seed)``; the seed is a
    constructor argument and not in ``state_dict`` (build the resumed optimizer with the same
    seed, as any other constructor argument). Groups from ``model.named_parameters()`` keep
    ``param_names`` (torch's named-parameter support; Muon's ``expert_keys`` needs them).

    microsoft/dion compatibility: its ``Dion`` / ``Muon`` take groups with ``algorithm``
    "adamw" / "lion"; the same groups work here. Its ``beta1``/``beta2`` become ``betas`` and
    its ``epsilon`` (AdamW) ``eps``; the state keys are torch.optim.AdamW's (``exp_avg``,
    ``exp_avg_sq``, ``step``) where dion has ``momentum``, ``variance``, and Lion's
    ``exp_avg`` is dion's ``momentum``. The AdamW step count is per parameter (torch)
    where dion counts per group (they differ only for a parameter that skipped steps). Its
    default betas (0.9, 0.95) are ``DionConfig``'s, not ``ADAMW_DEFAULTS`` (torch's).
    Its Muon groups map to "muon" with ``momentum_style="classic", nesterov=False,
    coefficients="polar_express", adjust_lr="spectral_norm"`` (dion's ``mu`` is our
    ``momentum``), its Dion groups to "dion" (same keys; ``qr_method`` "rcqr" accepted).

    Args: ``params_or_groups`` an iterable of tensors, (name, tensor) pairs or group dicts;
    ``seed`` (int) for Dion's Q0 and sketches; ``algorithm`` the algorithm of groups that
    name none; ``defaults`` per-algorithm option overrides.
    Distributed (every rank builds and steps the optimizer with the same groups): Dion groups
    take ``Dion``'s ``replicate_mesh``, ``outer_shard_mesh``, ``inner_shard_mesh``,
    ``replicate_mesh_grad_sync`` and ``process_group``; Muon groups take ``Muon``'s
    ``distributed_mesh``, ``tp_mesh`` and ``tp_mode`` (``meshes_from_world_mesh`` derives both
    from a named world mesh, as OLMo-core); Dion2 groups take Muon's ``distributed_mesh`` /
    ``tp_mesh`` (else Dion's ``outer_shard_mesh`` / ``inner_shard_mesh``) and ``replicate_mesh``
    (``ortho_fast.distributed.dion2.Dion2Sharding``). AdamW and Lion groups are elementwise and run on
    DTensor parameters as they are. The step checks every group on every rank first (one small
    all-reduce for the groups that do not communicate, then one per algorithm that does), so a
    bad gradient on one rank raises on all of them before anything changes;
    ``synchronize_for_checkpoint()`` acts on the Dion groups as ``Dion``'s does. For a ``torch.distributed.checkpoint``
    load, torch's ``get_state_dict``
    creates every group's state on a fresh optimizer (a step with zero gradients at lr 0, which
    changes no parameter).
    ``check_finite`` (default True): every gradient must be finite, decided for the whole step by
    one fused reduction on the device and one host read (a NaN / Inf raises ValueError naming the
    parameter, before any change); False checks nothing and reads nothing from the device (a NaN
    then propagates, as in torch.optim), which ``torch.compile(opt.step, fullgraph=True)`` needs.
    State: each algorithm's own (see its ``*_group_step``). ``load_state_dict`` checks that
    the saved groups run the same algorithms, fills options missing from a saved group (a
    torch.optim.AdamW / torch.optim.Muon checkpoint) from the current group, never aliases the
    given state dict's tensors, and keeps Dion's ``momentum_dtype`` / ``q_dtype``.
    Raises: TypeError / ValueError / KeyError naming "param group i (algorithm)" and the
    option, for an unknown algorithm, a group without ``params``, an option of another
    algorithm, or whatever the algorithm's normalize / check rejects; a rejected group is
    not added and a rejected step changes nothing.
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
        """Fill the group from its algorithm's defaults, add it with torch's checks (leaf
        tensors, no parameter in two groups, names on all groups or none), then validate it
        with the algorithm's ``normalize``; a rejected group is removed again."""
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
        """Check every group (``check_<alg>_step``), then step every group. Returns the
        closure's loss. Raises before any change (see the class docstring)."""
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
        """Create the Dion groups' state now (``Dion.init_state``: momentum zeros, Q = Q0, step 0,
        no communication, no parameter changed); the other algorithms create theirs as zeros
        in the step. Call it before ``torch.compile(opt.step, fullgraph=True)``: Q0 comes from a
        seeded generator, which a graph cannot hold."""
        init_dion_groups(self._groups("dion"), self.state, self._dion_meshes, self._dion_plans, seed=self.seed)

    @torch.no_grad()
    def synchronize_for_checkpoint(self) -> None:
        """``Dion.synchronize_for_checkpoint`` for the Dion groups (a no-op without compressed sync)."""
        if self._dion_meshes is not None:
            from .distributed.dion import synchronize_replicas

            synchronize_replicas(self._groups("dion"), self.state, self._dion_meshes)

    def state_dict(self) -> dict:
        """torch's ``state_dict`` with dtype options as names (``state_dict_with_dtype_names``)."""
        return state_dict_with_dtype_names(self)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load_state_dict through ``load_state_dict_checked``: the saved groups
        checked and completed first (see the class docstring; a torch.optim.Muon group's settings
        mapped as ``Muon.load_state_dict`` maps them), every saved parameter state checked against
        its group's algorithm (``check_saved_state``: Muon's ``momentum_buffer``, Dion's
        ``momentum`` / ``Q`` / ``step``, AdamW's ``exp_avg`` / ``exp_avg_sq`` / ``step``, Lion's
        ``exp_avg``: every key present, no other, real floating, shaped, finite, counts
        non-negative integers), all before anything changes; the loaded state owns its tensors."""
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
