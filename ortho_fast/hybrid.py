"""One optimizer for a whole model: Muon or Dion for the matrices, AdamW or Lion for the rest.

``HybridOptimizer`` drives param groups whose ``algorithm`` is "muon", "dion", "adamw" or
"lion" through each algorithm's param-group contract (``<ALG>_DEFAULTS``,
``normalize_<alg>_group``, ``check_<alg>_step``, ``<alg>_group_step``). ``param_groups``
splits a model's parameters the way OLMo-core, Motif, Megatron and microsoft/dion do, and
``MuonConfig`` / ``DionConfig`` build the optimizer with those systems' defaults.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import torch
from torch import nn
from torch.optim import Optimizer

from ._state import add_param_group_checked, load_state_dict_checked, state_dict_with_dtype_names
from .coefficients import CoefficientsLike
from .dion import (DION_DEFAULTS, check_dion_step, dion_group_step, dion_state_dtype, normalize_dion_group,
                   plan_dion_group, resolve_meshes)
from .muon import DROPPED_NAME_COMPONENTS, MUON_DEFAULTS, check_muon_step, is_expert_name, muon_group_step, normalize_muon_group
from .scalar import (
    ADAMW_DEFAULTS, LION_DEFAULTS, adamw_group_step, check_adamw_step, check_lion_step, lion_group_step,
    normalize_adamw_group, normalize_lion_group,
)


class Algorithm(NamedTuple):
    """One param-group algorithm: its option defaults and its three group functions."""

    defaults: Mapping[str, object]
    normalize: Callable[[dict], None]
    check: Callable[[dict, Mapping], None]
    step: Callable[..., None]


#: The algorithms a group may name. "dion"'s step also takes ``seed`` and ``first_index``.
ALGORITHMS: dict[str, Algorithm] = {
    "muon": Algorithm(MUON_DEFAULTS, normalize_muon_group, check_muon_step, muon_group_step),
    "dion": Algorithm(DION_DEFAULTS, normalize_dion_group, check_dion_step, dion_group_step),
    "adamw": Algorithm(ADAMW_DEFAULTS, normalize_adamw_group, check_adamw_step, adamw_group_step),
    "lion": Algorithm(LION_DEFAULTS, normalize_lion_group, check_lion_step, lion_group_step),
}
MATRIX_ALGORITHMS = ("muon", "dion")
SCALAR_ALGORITHMS = ("adamw", "lion")

#: Group keys that belong to no algorithm's options but that groups legitimately carry.
_BOOKKEEPING_KEYS = ("params", "param_names", "algorithm")


def _in_group(index: int, algorithm: str, fn: Callable, *args, **kwargs):
    """Call fn; a ValueError / TypeError / KeyError gets "param group i (algorithm): " in front."""
    try:
        return fn(*args, **kwargs)
    except (ValueError, TypeError, KeyError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        raise type(err)(f"param group {index} ({algorithm}): {message}") from err


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


def _check_foreign_keys(group: dict, algorithm: str) -> None:
    """Reject an option of another algorithm that this one does not have (a likely mistake:
    ``momentum`` on an AdamW group does not set β1)."""
    own = ALGORITHMS[algorithm].defaults
    for key in group:
        if key in own or key in _BOOKKEEPING_KEYS:
            continue
        owners = [a for a, spec in ALGORITHMS.items() if key in spec.defaults]
        if owners:
            raise ValueError(f"{key}: an option of {'/'.join(owners)}, not of {algorithm} (its options: {sorted(own)})")


class HybridOptimizer(Optimizer):
    """One torch optimizer whose param groups each run their own ``algorithm``: "muon", "dion",
    "adamw" or "lion" (``ALGORITHMS``).

    A group's missing options come from ITS algorithm's defaults (``MUON_DEFAULTS``,
    ``DION_DEFAULTS``, ``ADAMW_DEFAULTS``, ``LION_DEFAULTS``), overridden per algorithm by
    ``defaults={"adamw": {...}, ...}``; groups without ``algorithm`` get ``algorithm=``
    (default None: every group must name one). ``step`` first runs every group's check (a
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
    from a named world mesh, as OLMo-core). AdamW and Lion groups are elementwise and run on
    DTensor parameters as they are. The step checks every group on every rank first (one small
    all-reduce for the groups that do not communicate, then one per algorithm that does), so a
    bad gradient on one rank raises on all of them before anything changes;
    ``synchronize_for_checkpoint()`` acts on the Dion groups as ``Dion``'s does. For a ``torch.distributed.checkpoint`` load, torch's ``get_state_dict``
    creates every group's state on a fresh optimizer (a step with zero gradients at lr 0, which
    changes no parameter).
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
        self.seed = seed
        self.algorithm = algorithm
        self.algorithm_defaults = {name: {**spec.defaults, **overrides.get(name, {})} for name, spec in ALGORITHMS.items()}
        from .distributed.muon import MuonSharding

        self._muon_sharding = MuonSharding(distributed_mesh, tp_mesh, tp_mode)
        self._dion_meshes, self._dion_plans = resolve_meshes(replicate_mesh, outer_shard_mesh, inner_shard_mesh,
                                                             replicate_mesh_grad_sync, process_group), {}
        super().__init__(params_or_groups, {})

    def __getstate__(self) -> dict:
        """torch's state (defaults, state, param_groups) plus this optimizer's own attributes, so
        ``copy.deepcopy`` / pickle give an optimizer that steps and adds groups as this one does."""
        return {**super().__getstate__(), **{key: self.__dict__[key] for key in (
            "seed", "algorithm", "algorithm_defaults", "_muon_sharding", "_dion_meshes", "_dion_plans")}}

    def _normalize(self, index: int, algorithm: str, group: dict) -> None:
        """The algorithm's ``normalize``, then the distributed plan of a Muon or Dion group."""
        _in_group(index, algorithm, ALGORITHMS[algorithm].normalize, group)
        if algorithm == "muon":
            _in_group(index, algorithm, self._muon_sharding.add_group, group)
        elif algorithm == "dion":
            _in_group(index, algorithm, plan_dion_group, group, self._dion_meshes, self._dion_plans)

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
            raise ValueError(f"param group {index}: algorithm: expected one of {sorted(ALGORITHMS)}, got {algorithm!r}{hint}")
        if "params" not in group:
            raise ValueError(f"param group {index} ({algorithm}): params: missing; expected a list of tensors")
        _in_group(index, algorithm, _from_microsoft_dion, group, algorithm, self.algorithm_defaults[algorithm])
        _in_group(index, algorithm, _check_foreign_keys, group, algorithm)
        for key, value in self.algorithm_defaults[algorithm].items():
            group.setdefault(key, value)
        add_param_group_checked(self, group, lambda g: self._normalize(index, algorithm, g))

    @torch.no_grad()
    def step(self, closure=None):
        """Check every group (``check_<alg>_step``), then step every group. Returns the
        closure's loss. Raises before any change (see the class docstring)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        sharded_muon, sharded_dion = self._muon_sharding.active, self._dion_meshes is not None
        local = []
        for i, group in enumerate(self.param_groups):
            algorithm = group.get("algorithm")
            if algorithm not in ALGORITHMS:
                raise ValueError(f"param group {i}: algorithm: expected one of {sorted(ALGORITHMS)}, got {algorithm!r}")
            if not ((algorithm == "muon" and sharded_muon) or (algorithm == "dion" and sharded_dion)):
                local.append((i, group))
        self._check_local_groups(local)
        if sharded_muon:  # checks on every rank, one all-reduce of an error flag
            self._muon_sharding.check(self._groups("muon"), self.state)
        if sharded_dion:  # checks on every rank, then (nothing changed before) every Dion group's step
            from .distributed.dion import sharded_dion_step

            sharded_dion_step(self._groups("dion"), self.state, self._dion_plans, self._dion_meshes, seed=self.seed)
        first_dion = 0
        for group in self.param_groups:
            if group["algorithm"] == "dion":
                if not sharded_dion:
                    dion_group_step(group, self.state, seed=self.seed, first_index=first_dion)
                first_dion += len(group["params"])
            elif group["algorithm"] == "muon" and sharded_muon:
                self._muon_sharding.group_step(group, self.state)
            else:
                ALGORITHMS[group["algorithm"]].step(group, self.state)
        return loss

    def _check_local_groups(self, groups: list[tuple[int, dict]]) -> None:
        """``check_<alg>_step`` of the (index, group) pairs whose algorithm does not communicate
        here (AdamW, Lion, a Muon / Dion without meshes; a DTensor gradient is checked finite on
        this rank's shard). In a distributed optimizer every group is checked even after an
        error, and one all-reduce (MAX) of an error flag over every axis the Muon and Dion groups
        communicate on makes the verdict global: a gradient one rank
        rejects raises on every rank, before the Muon / Dion checks' collectives, which the
        other ranks would otherwise wait in forever.
        Raises: the first error found here (naming "param group i (alg)"), on the other ranks
        ValueError saying another rank rejected its input."""
        axes = {a.ranks: a for a in (self._muon_sharding.dp, self._muon_sharding.tp,
                                     *(self._dion_meshes.comm_axes if self._dion_meshes else ()))
                if a is not None and a.size > 1}
        error = None
        for i, group in groups:
            algorithm = group["algorithm"]
            try:
                _in_group(i, algorithm, ALGORITHMS[algorithm].check, group, self.state)  # DTensors: local shards
            except (ValueError, TypeError, KeyError) as err:
                if not axes:
                    raise
                error = error or err
        if not axes or not groups:
            return
        import torch.distributed as dist

        from .distributed.comm import all_reduce_axes

        device = next((p.device for g in self.param_groups for p in g["params"]), torch.device("cpu"))  # NCCL: GPU
        flag = torch.tensor([float(error is not None)], device=device)
        all_reduce_axes(flag, list(axes.values()), op=dist.ReduceOp.MAX, tag="check")
        if error is not None:
            raise error
        if flag.item():
            raise ValueError("grad: another rank rejected its gradient, state or option in this step (its own error "
                             "names it); no parameter or state was changed")

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
        checked and completed first (see the class docstring), the loaded state owns its tensors."""
        load_state_dict_checked(self, state_dict, self._saved_group_spec,
                                lambda group, key, p: dion_state_dtype(group, key, p) if group["algorithm"] == "dion"
                                else None)

    @staticmethod
    def _saved_group_spec(i: int, group: dict, current: dict):
        """The saved group's algorithm (missing: the current one; another one: ValueError),
        its option keys and its normalize function (errors prefixed by "param group i (alg)")."""
        algorithm = group.setdefault("algorithm", current["algorithm"])
        if algorithm != current["algorithm"]:
            raise ValueError(f"param group {i}: the state dict's algorithm {algorithm!r} differs from this "
                             f"optimizer's {current['algorithm']!r}")
        spec = ALGORITHMS[algorithm]
        return spec.defaults, lambda trial: _in_group(i, algorithm, spec.normalize, trial)


# ---------------------------------------------------------------------------------------
# Which parameter goes where
# ---------------------------------------------------------------------------------------

#: Name components of embedding parameters (HF ``embed_tokens``, torchtitan ``tok_embeddings``,
#: nanoGPT ``wte``/``wpe``, OLMo-core ``embeddings``, BERT ``word_embeddings``, ...).
EMBEDDING_NAMES = ("embed_tokens", "tok_embeddings", "wte", "wpe", "embedding", "embeddings", "word_embeddings",
                   "position_embeddings")
#: Output-head names: ``lm_head`` as any component (HF, nanoGPT, nanochat, OLMo-core
#: ``lm_head.w_out``); ``output``, ``head``, ``output_layer`` only as the first component (Meta
#: Llama ``output``, timm ``head``, Megatron ``output_layer``), so that e.g. BERT's
#: ``attention.output.dense`` stays a matrix.
HEAD_NAMES = ("lm_head",)
TOP_LEVEL_HEAD_NAMES = ("output", "head", "output_layer")
#: Wrapper components dropped from names before matching (torch.compile, activation
#: checkpointing, FSDP1; as Motif), plus a leading ``module`` of DataParallel / DDP.
WRAPPER_NAME_COMPONENTS = tuple(DROPPED_NAME_COMPONENTS) + ("_fsdp_wrapped_module",)

Override = tuple  # (glob str | Callable[[torch.Tensor, str], bool], dict of group options)


def normalize_name(name: str, *, data_parallel: bool = False) -> str:
    """``name`` without wrapper components (``WRAPPER_NAME_COMPONENTS``; the leading
    ``module`` too when ``data_parallel``): "_orig_mod.blocks.0._checkpoint_wrapped_module.fc.weight"
    -> "blocks.0.fc.weight".

    Source: Motif Muon (drops ``_orig_mod`` of torch.compile and ``_checkpoint_wrapped_module``
    of activation checkpointing); FSDP1's ``_fsdp_wrapped_module`` and DataParallel / DDP's
    ``module`` prefix likewise.
    Raises: TypeError naming ``name`` for a name that is not a str.
    """
    if not isinstance(name, str):
        raise TypeError(f"name: expected a parameter name (str), got {type(name).__name__}")
    parts = [c for c in name.split(".") if c not in WRAPPER_NAME_COMPONENTS]
    if data_parallel and parts and parts[0] == "module":
        parts = parts[1:]
    return ".".join(parts)


def _is_embedding_name(name: str) -> bool:
    return any(c in EMBEDDING_NAMES for c in name.split(".")[:-1])


def _is_head_name(name: str) -> bool:
    modules = name.split(".")[:-1]
    return any(c in HEAD_NAMES for c in modules) or (bool(modules) and modules[0] in TOP_LEVEL_HEAD_NAMES)


def _category(p: torch.Tensor, names: list[str], embedding_ids: set, expert_keys: Sequence[str]) -> str:
    """"embedding", "head" (output-head matrices), "matrix" or "scalar" for one parameter
    with all its (normalized) names — a weight tied to the embedding is an embedding."""
    if id(p) in embedding_ids or any(_is_embedding_name(n) for n in names):
        return "embedding"
    if p.ndim >= 2 and any(_is_head_name(n) for n in names):
        return "head"
    expert = bool(expert_keys) and any(is_expert_name(n, expert_keys) for n in names)
    return "matrix" if p.ndim - int(expert) >= 2 else "scalar"


def _match(override: Override, p: torch.Tensor, name: str, normalized: str) -> bool:
    key = override[0]
    if isinstance(key, str):
        return fnmatch.fnmatchcase(normalized, key) or fnmatch.fnmatchcase(name, key)
    return bool(key(p, name))


def _resolve(value, fallback):
    return fallback if value is None else value


def param_groups(
    model: nn.Module,
    *,
    algorithm: str = "muon",
    scalar_algorithm: str = "adamw",
    lr: float | None = None,
    scalar_lr: float | None = None,
    weight_decay: float | None = None,
    scalar_weight_decay: float | None = None,
    embedding_weight_decay: float = 0.0,
    lm_head_lr_scale: str | None = "inv_sqrt_d_model",
    d_model: int | None = None,
    expert_keys: Sequence[str] = (),
    overrides: Sequence[Override] = (),
    matrix_options: Mapping[str, Any] | None = None,
    scalar_options: Mapping[str, Any] | None = None,
) -> list[dict]:
    """Split ``model``'s trainable parameters into ``HybridOptimizer`` groups.

    Per parameter (names normalized by ``normalize_name``; the first rule that applies):
    1. ``overrides``: (glob, options) or (predicate(param, name) -> bool, options) pairs, in
       the spirit of Megatron's ParamKey; the first match wins. A glob is matched
       (``fnmatch``, case-sensitive) against the normalized and the original name. The
       options go on top of the options of the parameter's own category — or, if they set
       ``algorithm`` to the other family, of that family's category ("matrix" or "scalar");
       an ``algorithm`` other than the category's keeps only its lr and weight_decay.
    2. "embedding": a parameter of an ``nn.Embedding`` / ``nn.EmbeddingBag``, or with a name
       component in ``EMBEDDING_NAMES`` (a weight tied to the embedding, such as nanoGPT's
       ``lm_head.weight``, is one) -> ``scalar_algorithm``, ``scalar_lr``,
       ``embedding_weight_decay`` (OLMo-core: 0).
    3. "head": an output-head weight with ≥ 2 dims (``HEAD_NAMES``, ``TOP_LEVEL_HEAD_NAMES``)
       -> ``scalar_algorithm`` at ``scalar_lr``/√d_model when ``lm_head_lr_scale`` is
       "inv_sqrt_d_model" (OLMo-core's DionConfig), ``scalar_lr`` when None. ``d_model``
       None: the head weight's fan_in (shape[-1], as OLMo-core). Head biases and norms are
       "scalar".
    4. "matrix": ≥ 2 dims, counting one dim less for names matching ``expert_keys`` (Motif,
       ``muon.is_expert_name``): 2-D weights, fused QKV, 3-D experts, 4-D conv ->
       ``algorithm`` (Muon: experts via its ``expert_keys``, ≥ 4-D conv flattened; Dion: ≥ 4-D
       conv with ``flatten=True``, experts rejected), ``lr``, ``weight_decay``. A 3-D
       parameter that matches no expert key (a conv1d weight, or an expert stack whose key
       is missing) is rejected by Muon and Dion when the optimizer is built: give
       ``expert_keys``, or an override with ``{"flatten": True}`` for conv1d.
    5. "scalar": everything else (norms, biases, gains, expert biases) -> ``scalar_algorithm``,
       ``scalar_lr``, ``scalar_weight_decay``.
    ``lr`` / ``weight_decay`` None: the matrix algorithm's defaults. ``scalar_lr`` None: ``lr``
    if given (microsoft/dion and OLMo-core use one lr for every group), else the scalar
    algorithm's default; ``scalar_weight_decay`` likewise from ``weight_decay``.
    ``matrix_options`` / ``scalar_options``: further options of every matrix / scalar group.
    Parameters with ``requires_grad=False`` are left out.

    Returns: groups {"params", "param_names" (original names), "algorithm", options...},
    one per distinct (algorithm, options), in order of first appearance.
    Source: OLMo-core ``DionConfig.default_group_overrides``; Motif Muon (name normalization,
    expert_keys); Megatron ParamKey (overrides); microsoft/dion (``algorithm`` groups).
    Raises: ValueError for an unknown algorithm (here or in an override) or
    ``lm_head_lr_scale``, a d_model that is not a positive int, no trainable parameter,
    heads of different fan_in without ``d_model``, expert weights with Dion; TypeError for an
    override that is not a (glob or predicate, dict) pair.
    """
    if algorithm not in MATRIX_ALGORITHMS:
        raise ValueError(f"algorithm: expected one of {MATRIX_ALGORITHMS}, got {algorithm!r}")
    if scalar_algorithm not in SCALAR_ALGORITHMS:
        raise ValueError(f"scalar_algorithm: expected one of {SCALAR_ALGORITHMS}, got {scalar_algorithm!r}")
    if lm_head_lr_scale not in ("inv_sqrt_d_model", None):
        raise ValueError(f"lm_head_lr_scale: expected 'inv_sqrt_d_model' or None, got {lm_head_lr_scale!r}")
    if d_model is not None and (isinstance(d_model, bool) or not isinstance(d_model, int) or d_model < 1):
        raise ValueError(f"d_model: expected a positive int or None, got {d_model!r}")
    for o in overrides:
        if not (isinstance(o, tuple) and len(o) == 2 and (isinstance(o[0], str) or callable(o[0]))
                and isinstance(o[1], Mapping)):
            raise TypeError(f"overrides: expected (glob or predicate(param, name), dict of options) pairs, got {o!r}")
        if o[1].get("algorithm", "muon") not in ALGORITHMS:
            raise ValueError(f"overrides: algorithm {o[1]['algorithm']!r} of {o[0]!r}; expected one of {sorted(ALGORITHMS)}")
    data_parallel = isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel))
    expert_keys = (expert_keys,) if isinstance(expert_keys, str) else tuple(expert_keys)

    names: dict[int, list[str]] = {}
    params: dict[int, torch.Tensor] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if p.requires_grad:
            params.setdefault(id(p), p)
            names.setdefault(id(p), []).append(name)
    if not params:
        raise ValueError("model: has no trainable parameters")
    embedding_ids = {id(p) for m in model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))
                     for p in m.parameters(recurse=False)}
    normalized = {k: [normalize_name(n, data_parallel=data_parallel) for n in v] for k, v in names.items()}
    category = {k: _category(params[k], normalized[k], embedding_ids, expert_keys) for k in params}

    lr = _resolve(lr, ALGORITHMS[algorithm].defaults["lr"])
    weight_decay = _resolve(weight_decay, ALGORITHMS[algorithm].defaults["weight_decay"])
    scalar_lr = _resolve(scalar_lr, lr)
    scalar_weight_decay = _resolve(scalar_weight_decay, weight_decay)
    heads = {params[k].shape[-1] for k in params if category[k] == "head"}
    if lm_head_lr_scale and heads and d_model is None and len(heads) > 1:
        raise ValueError(f"d_model: output heads of different fan_in {sorted(heads)}; pass d_model")
    head_lr = scalar_lr / math.sqrt(d_model or next(iter(heads))) if lm_head_lr_scale and heads else scalar_lr
    scalar = dict(scalar_options or {}, algorithm=scalar_algorithm, lr=scalar_lr, weight_decay=scalar_weight_decay)
    base = {
        "matrix": dict(matrix_options or {}, algorithm=algorithm, lr=lr, weight_decay=weight_decay),
        "scalar": scalar,
        "embedding": dict(scalar, weight_decay=embedding_weight_decay),
        "head": dict(scalar, lr=head_lr),
    }

    groups: dict[str, dict] = {}
    for k, p in params.items():
        name, norm = names[k][0], normalized[k][0]
        cat = category[k]
        extra: Mapping[str, Any] = next((o[1] for o in overrides if _match(o, p, name, norm)), {})
        chosen = extra.get("algorithm")
        if chosen in MATRIX_ALGORITHMS and cat != "matrix":
            cat = "matrix"
        elif chosen in SCALAR_ALGORITHMS and cat == "matrix":
            cat = "scalar"
        options = dict(base[cat])
        if chosen is not None and chosen != options["algorithm"]:  # keep lr / weight_decay only
            options = {"lr": options["lr"], "weight_decay": options["weight_decay"]}
        options.update(extra)
        if options["algorithm"] == "muon" and expert_keys:
            options.setdefault("expert_keys", expert_keys)
        if options["algorithm"] == "dion" and p.ndim > 2:
            if expert_keys and any(is_expert_name(n, expert_keys) for n in normalized[k]):
                raise ValueError(f"expert_keys: {name!r} is an expert weight of shape {tuple(p.shape)}; Dion here "
                                 "has no per-expert batching: use algorithm='muon' or route it with overrides")
            if p.ndim > 3:  # conv2d / conv3d; 3-D is ambiguous (conv1d or an unnamed expert stack)
                options.setdefault("flatten", True)
        key = repr(sorted(options.items(), key=lambda kv: kv[0]))
        group = groups.setdefault(key, {"params": [], "param_names": [], **options})
        group["params"].append(p)
        group["param_names"].append(name)
    return list(groups.values())


# ---------------------------------------------------------------------------------------
# Configurations with the defaults of the systems users come from
# ---------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class _HybridConfig:
    """Fields shared by ``MuonConfig`` and ``DionConfig`` (the scalar side and the grouping)."""

    scalar_algorithm: str = "adamw"
    scalar_lr: float | None = None
    scalar_betas: tuple[float, float] | None = None
    scalar_eps: float = 1e-8
    scalar_weight_decay: float | None = None
    embedding_weight_decay: float = 0.0
    lm_head_lr_scale: str | None = None
    d_model: int | None = None
    expert_keys: tuple[str, ...] = ()
    overrides: tuple = ()
    seed: int = 0

    #: Megatron's Lion betas for the scalar parameters of Muon (Emerging-Optimizers).
    LION_BETAS = (0.95, 0.98)

    def _matrix_options(self) -> dict:
        raise NotImplementedError

    def _scalar_options(self, adamw_betas: tuple[float, float]) -> dict:
        if self.scalar_algorithm == "lion":
            return {"betas": _resolve(self.scalar_betas, self.LION_BETAS)}
        return {"betas": _resolve(self.scalar_betas, adamw_betas), "eps": self.scalar_eps}

    def _build(self, model: nn.Module, algorithm: str, adamw_betas, scalar_weight_decay: float,
               mesh=None, **distributed) -> HybridOptimizer:
        matrix = self._matrix_options()
        groups = param_groups(
            model, algorithm=algorithm, scalar_algorithm=self.scalar_algorithm, lr=matrix.pop("lr"),
            scalar_lr=self.scalar_lr, weight_decay=matrix.pop("weight_decay"),
            scalar_weight_decay=_resolve(self.scalar_weight_decay, scalar_weight_decay),
            embedding_weight_decay=self.embedding_weight_decay, lm_head_lr_scale=self.lm_head_lr_scale,
            d_model=self.d_model, expert_keys=self.expert_keys, overrides=self.overrides,
            matrix_options=matrix, scalar_options=self._scalar_options(adamw_betas),
        )
        meshes = meshes_from_world_mesh(mesh)
        keys = ("distributed_mesh", "tp_mesh") if algorithm == "muon" else (
            "replicate_mesh", "outer_shard_mesh", "inner_shard_mesh", "replicate_mesh_grad_sync")
        return HybridOptimizer(groups, seed=self.seed, **{k: meshes[k] for k in keys if k in meshes}, **distributed)


def meshes_from_world_mesh(mesh) -> dict:
    """The distributed arguments of ``HybridOptimizer`` from a world DeviceMesh with named dims,
    as OLMo-core builds its Dion: ``dp_replicate`` + ``dp_shard`` -> HSDP (replicate mesh, outer
    shard mesh), any other single ``dp*`` dim -> the outer shard mesh (FSDP; DDP when the
    parameters are plain tensors), ``tp`` -> the inner shard mesh; gradient sync left to FSDP /
    DDP (``replicate_mesh_grad_sync=False``). Muon gets the same shard dim as ``distributed_mesh``
    and ``tp`` as ``tp_mesh`` (its parameters are replicated over ``dp_replicate``, whose gradient
    all-reduce FSDP does). Other dims (``cp``, ``pp``, ``ep``, ...) are not passed: a parameter
    sharded on one raises at construction. None -> {} (one process).
    Shapes: ``mesh`` an N-D DeviceMesh with ``mesh_dim_names``.
    Source: allenai/OLMo-core ``DionConfig`` (``src/olmo_core/optim/dion.py``).
    Raises: ValueError naming ``mesh`` for a mesh without dim names or with several ``dp*`` dims
    other than the ``dp_replicate`` / ``dp_shard`` pair.
    """
    if mesh is None:
        return {}
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    if not names:
        raise ValueError("mesh: expected a DeviceMesh with mesh_dim_names (e.g. ('dp_replicate', 'dp_shard', 'tp'))")
    dp = [n for n in names if n.startswith("dp")]
    replicate = shard = None
    if "dp_replicate" in names and "dp_shard" in names:
        replicate, shard = mesh["dp_replicate"], mesh["dp_shard"]
        dp = [n for n in dp if n not in ("dp_replicate", "dp_shard")]
    elif len(dp) == 1:
        shard, dp = mesh[dp[0]], []
    if dp:
        raise ValueError(f"mesh: cannot tell the data-parallel dims apart in {names}; expected 'dp_replicate' + "
                         f"'dp_shard' (HSDP) or a single 'dp*' dim")
    tp = mesh["tp"] if "tp" in names else None
    return dict(replicate_mesh=replicate, outer_shard_mesh=shard, inner_shard_mesh=tp, replicate_mesh_grad_sync=False,
                distributed_mesh=shard, tp_mesh=tp)


@dataclass(kw_only=True)
class MuonConfig(_HybridConfig):
    """Muon for the matrices, AdamW (or Lion) for the rest, with torch's defaults.

    Muon: torch.optim.Muon's defaults — lr 1e-3, weight_decay 0.1, momentum 0.95, nesterov,
    Keller Jordan's coefficients ("jordan"), bf16 Newton–Schulz, "original" lr adjustment
    √max(1, m/n) (torch's ``adjust_lr_fn=None``). ``ns_steps``, ``safety``, ``eps`` and
    ``eps_mode`` None come from the schedule exactly as in ``Muon``: "jordan" runs 5 steps
    with torch's X₀ = U / max(‖U‖_F, 1e-7) (bitwise torch.optim.Muon on CPU), "polar_express"
    5 steps with X₀ = U / (1.02‖U‖_F + 1e-6) (microsoft/dion, nanochat), "you6" 6 steps.
    ``muon_options``: any other ``MUON_DEFAULTS`` key (momentum_style, split_sizes, flatten, ...;
    a field that is set wins over the same key there).
    Scalars: torch.optim.AdamW's defaults — betas (0.9, 0.999), eps 1e-8, weight_decay 0.01 —
    at the Muon lr (``scalar_lr`` None; 1e-3 is also AdamW's default); embeddings without
    weight decay (OLMo-core); no output-head lr scaling (torch has none; "inv_sqrt_d_model"
    for OLMo-core's). ``scalar_algorithm="lion"`` (recommended with Muon by Megatron /
    Emerging-Optimizers) uses betas (0.95, 0.98) unless ``scalar_betas`` is given; Lion
    wants an lr 3–10× below AdamW's (Chen et al. 2023), so set ``scalar_lr``.
    ``build(model, mesh=None)`` -> ``HybridOptimizer`` over ``param_groups(model, ...)``; a named
    world ``mesh`` distributes it (``meshes_from_world_mesh``; ``tp_mode`` for tensor parallelism).
    Raises (at ``build``): what ``param_groups`` and ``HybridOptimizer`` raise.
    """

    lr: float = 1e-3
    weight_decay: float = 0.1
    momentum: float = 0.95
    nesterov: bool = True
    coefficients: CoefficientsLike = "jordan"
    ns_steps: int | None = None
    safety: float | None = None
    eps: float | None = None
    eps_mode: str | None = None
    adjust_lr: str | None = "original"
    tp_mode: str = "duplicated"
    muon_options: dict = field(default_factory=dict)

    def _matrix_options(self) -> dict:
        schedule = {k: v for k, v in (("ns_steps", self.ns_steps), ("safety", self.safety), ("eps", self.eps),
                                      ("eps_mode", self.eps_mode)) if v is not None}
        return dict(self.muon_options, lr=self.lr, weight_decay=self.weight_decay, momentum=self.momentum,
                    nesterov=self.nesterov, coefficients=self.coefficients, adjust_lr=self.adjust_lr, **schedule)

    def build(self, model: nn.Module, mesh=None) -> HybridOptimizer:
        """The optimizer for ``model`` (see the class docstring); ``mesh`` a named world
        DeviceMesh of a distributed model (``meshes_from_world_mesh``), with ``tp_mode``."""
        return self._build(model, "muon", ADAMW_DEFAULTS["betas"], ADAMW_DEFAULTS["weight_decay"], mesh,
                           tp_mode=self.tp_mode)


@dataclass(kw_only=True)
class DionConfig(_HybridConfig):
    """Dion for the matrices, AdamW (or Lion) for the rest, with OLMo-core's defaults.

    OLMo-core ``DionConfig`` (allenai/OLMo-core ``src/olmo_core/optim/dion.py``, the
    ``MatrixAwareOptimConfig`` versions; the first version had lr 1e-3): lr 0.01, mu 0.95,
    betas (0.9, 0.95) for AdamW, weight_decay 0.1 for every group but the
    embeddings (0), rank_fraction 1.0; rank_multiple_of 1, epsilon 1e-8 and power_iters 1
    from microsoft/dion's ``Dion``; AdamW eps = microsoft/dion's epsilon 1e-8. Grouping as
    OLMo-core: matrices -> Dion, embeddings -> AdamW without weight decay, vectors -> AdamW,
    output head -> AdamW at lr/√d_model; one lr for every group (``scalar_lr`` None).
    ``qr_method`` "randomized_cholesky_qr", microsoft/dion's default ("rcqr", oversample
    1.25), which OLMo-core does not override; ``ortho_fast.Dion`` itself defaults to
    "householder", the reference method.
    ``dion_options``: any other ``DION_DEFAULTS`` key. Lion for the scalars: betas (0.95,
    0.98) unless ``scalar_betas`` is given.
    ``build(model, mesh=None)`` -> ``HybridOptimizer`` over ``param_groups(model, ...)``; a named
    world ``mesh`` distributes it as OLMo-core does (``meshes_from_world_mesh``).
    """

    lr: float = 0.01
    mu: float = 0.95
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    rank_fraction: float = 1.0
    rank_multiple_of: int = 1
    epsilon: float = 1e-8
    power_iters: int = 1
    qr_method: str = "randomized_cholesky_qr"
    lm_head_lr_scale: str | None = "inv_sqrt_d_model"
    dion_options: dict = field(default_factory=dict)

    def _matrix_options(self) -> dict:
        return dict(self.dion_options, lr=self.lr, weight_decay=self.weight_decay, mu=self.mu,
                    rank_fraction=self.rank_fraction, rank_multiple_of=self.rank_multiple_of, epsilon=self.epsilon,
                    power_iters=self.power_iters, qr_method=self.qr_method)

    def build(self, model: nn.Module, mesh=None) -> HybridOptimizer:
        """The optimizer for ``model`` (see the class docstring); ``mesh`` a named world
        DeviceMesh of a distributed model (``meshes_from_world_mesh``: OLMo-core's mapping)."""
        return self._build(model, "dion", self.betas, self.weight_decay, mesh)
