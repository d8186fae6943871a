"""Param groups and state dicts of Muon, Dion and HybridOptimizer (one code path for all
three): a group is validated before it stays, a saved group before anything changes, and the
loaded state tensors are the optimizer's own."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

import torch
from torch.optim import Optimizer

from ..validation import check_finite, local_tensor
from .algorithms import ALGORITHMS
from .dion import matrix_shape, param_rank
from .muon import normuon_variance_state_shape
from .muon_stages import VARIANCE_KEY

#: Keys a param group may carry besides its algorithm's options.
GROUP_BOOKKEEPING = ("params", "param_names", "algorithm")

#: (index, saved group, current group) -> (option keys of the group, normalize function). It
#: may complete or check the saved group first (HybridOptimizer fills in and checks ``algorithm``).
GroupSpec = Callable[[int, dict, dict], "tuple[Iterable[str], Callable[[dict], None]]"]
#: (group, state key, parameter) -> the dtype that state entry is kept in, or None for torch's
#: rule (floating state cast to the parameter's dtype).
StateDtype = Callable[[dict, str, torch.Tensor], "torch.dtype | None"]


def add_param_group_checked(optimizer: Optimizer, param_group: dict, normalize: Callable[[dict], None]) -> None:
    """torch's ``add_param_group`` (defaults, (name, tensor) pairs -> ``param_names``, leaf and
    duplicate checks), then ``normalize`` on the added group; a rejected group is removed again.

    Also rejected (before ``normalize``): a parameter listed twice in the group (torch only
    warns, and the step would update it twice) and a parameter on the meta device (no data to
    step: ``model.to_empty(device=...)`` and initialize it first).

    Raises: whatever torch or ``normalize`` raise; ValueError starting with "params" and naming
    the parameter (index in the group, and its name where given) for a duplicate or a meta
    tensor; the optimizer's groups are then as before.
    """
    _check_not_in_other_groups(optimizer, param_group)
    with warnings.catch_warnings():  # torch's "duplicate parameters" warning: raised below instead
        warnings.filterwarnings("ignore", message=".*duplicate parameters.*")
        Optimizer.add_param_group(optimizer, param_group)
    try:
        check_group_params(optimizer.param_groups[-1])
        normalize(optimizer.param_groups[-1])
    except Exception:
        optimizer.param_groups.pop()
        raise


def _check_not_in_other_groups(optimizer: Optimizer, param_group) -> None:
    """A parameter of ``param_group`` already in another group raises naming both places (torch's
    own error names neither). Only for a list / tuple of parameters (a generator is left to torch:
    reading it here would consume it)."""
    params = param_group.get("params") if isinstance(param_group, Mapping) else None
    if isinstance(params, torch.Tensor):
        params = [params]
    if not isinstance(params, (list, tuple)):
        return
    where = {id(p): (i, j) for i, g in enumerate(optimizer.param_groups) for j, p in enumerate(g["params"])}
    for j, p in enumerate(params):
        p = p[1] if isinstance(p, tuple) and len(p) == 2 else p  # (name, tensor) pairs
        if id(p) in where:
            i, k = where[id(p)]
            raise ValueError(f"params: parameter {j} of the new param group is already parameter {k} of param group "
                             f"{i}; a parameter belongs to one group")


def check_group_params(group: dict) -> None:
    """Every parameter of a group once, none on the meta device. Raises: ValueError starting with
    "params" naming the parameter (its index in the group, its name where the group has
    ``param_names``). Changes nothing."""
    names = group.get("param_names") or []

    def name(i: int) -> str:
        return f"parameter {i}" + (f" ({names[i]!r})" if i < len(names) else "")

    seen: dict[int, int] = {}
    for i, p in enumerate(group["params"]):
        if id(p) in seen:
            raise ValueError(f"params: {name(i)} is {name(seen[id(p)])} again (the same tensor twice in one param "
                             "group would be stepped twice); list each parameter once")
        seen[id(p)] = i
        if isinstance(p, torch.Tensor) and p.device.type == "meta":
            raise ValueError(f"params: {name(i)} of shape {tuple(p.shape)} is on the meta device (no data to update); "
                             "materialize the model first (model.to_empty(device=...) and initialize it), then build "
                             "the optimizer")


def check_group_algorithm(group: dict, algorithm: str, optimizer: str) -> None:
    """A group given to ``Muon`` / ``Dion`` may name its algorithm (microsoft/dion's groups do)
    only as this one, and may not hold an option of another algorithm (``rank_fraction`` on a
    Muon group does nothing: a likely mistake).
    Raises: ValueError naming ``algorithm`` or the foreign option."""
    named = group.get("algorithm", algorithm)
    if named != algorithm:
        raise ValueError(f"algorithm: {optimizer} runs {algorithm!r} groups only, got {named!r}; use "
                         "ortho_fast.HybridOptimizer for groups of several algorithms")
    own = ALGORITHMS[algorithm].defaults
    for key in group:
        owners = [a for a, spec in ALGORITHMS.items() if key in spec.defaults]
        if key not in own and key not in GROUP_BOOKKEEPING and owners:
            raise ValueError(f"{key}: an option of {'/'.join(owners)}, not of {algorithm} (its options: {sorted(own)})")


#: The options of torch.optim's optimizers (their ``defaults`` in torch 2.13) that no algorithm
#: here has, with the optimizers that have them: a saved group holding one is another optimizer's
#: (a torch.optim.SGD state dict has ``dampening``), unless the key is accepted for the algorithm
#: at that value (``TORCH_KEYS_ACCEPTED``).
TORCH_ONLY_OPTIONS: dict[str, tuple[str, ...]] = {
    "dampening": ("SGD",), "maximize": ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "NAdam", "RAdam", "Adamax"),
    "foreach": ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad"), "fused": ("SGD", "Adam", "AdamW", "Adagrad"),
    "differentiable": ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad"),  # capturable: Muon's / Dion2's too
    "amsgrad": ("Adam", "AdamW"), "decoupled_weight_decay": ("Adam", "AdamW", "NAdam", "RAdam"),
    "alpha": ("RMSprop", "ASGD"), "centered": ("RMSprop",), "lr_decay": ("Adagrad",),
    "initial_accumulator_value": ("Adagrad",), "momentum_decay": ("NAdam",), "rho": ("Adadelta",),
    "etas": ("Rprop",), "step_sizes": ("Rprop",), "lambd": ("ASGD",), "t0": ("ASGD",), "beta2_decay": ("Adafactor",),
    "d": ("Adafactor",), "history_size": ("LBFGS",), "max_iter": ("LBFGS",), "line_search_fn": ("LBFGS",),
}
_ANY_BOOL = (None, False, True)
#: torch.optim.AdamW's keys an AdamW group accepts (``HybridOptimizer`` loads torch.optim.AdamW
#: checkpoints) at the values whose step is ours: implementation switches at any value,
#: ``maximize`` / ``amsgrad`` off, decoupled weight decay on.
TORCH_KEYS_ACCEPTED: dict[str, dict[str, tuple]] = {
    "adamw": {"foreach": _ANY_BOOL, "fused": _ANY_BOOL, "capturable": _ANY_BOOL, "differentiable": (False,),
              "maximize": (False,), "amsgrad": (False,), "decoupled_weight_decay": (True,)},
}


def _algorithm_of_options(keys) -> str | None:
    """The algorithm whose option keys are ``keys`` (a group spec's), or None."""
    keys = set(keys)
    return next((name for name, spec in ALGORITHMS.items() if set(spec.defaults) == keys), None)


def check_foreign_options(group: Mapping, keys, where: str) -> None:
    """Reject a saved group holding an option its algorithm (``keys``: its option keys) lacks
    but another optimizer has: another ortho_fast algorithm's (Muon's ``momentum`` in a state
    dict given to Dion2) or a torch.optim optimizer's (``TORCH_ONLY_OPTIONS``: SGD's
    ``dampening``), so that a foreign state dict never sets this optimizer's lr / momentum.
    Other unknown keys (a scheduler's ``initial_lr``, a user's own) are kept.
    Raises: ValueError starting with the key, naming its owners and ``where``. Changes nothing."""
    from ..compat import FIXED

    algorithm = _algorithm_of_options(keys)
    keys = set(keys)
    fixed = {f.name for table in FIXED.values() for f in table}  # other systems' names, checked by their tables
    accepted = TORCH_KEYS_ACCEPTED.get(algorithm or "", {})
    for key, value in group.items():
        if key in keys or key in GROUP_BOOKKEEPING or key in fixed or not isinstance(key, str):
            continue
        if key in accepted and any(value is v or (type(value) is type(v) and value == v) for v in accepted[key]):
            continue
        owners = [f"ortho_fast {a}" for a, spec in ALGORITHMS.items() if key in spec.defaults]
        owners += [f"torch.optim.{o}" for o in TORCH_ONLY_OPTIONS.get(key, ())]
        if owners:
            mine = algorithm or "this optimizer"
            raise ValueError(f"{key}: an option of {' / '.join(owners)}, not of {mine} ({where} holds "
                             f"{key}={value!r}): the state dict is another optimizer's; load it into that optimizer")


_DTYPE_PREFIX = "torch."


def state_dict_with_dtype_names(optimizer: Optimizer) -> dict:
    """torch's ``Optimizer.state_dict`` with every torch.dtype group option (Muon's ``dtype``,
    Dion's ``momentum_dtype`` / ``q_dtype``) written as its name ("torch.float32"):
    ``torch.distributed.checkpoint``'s full state dict (``StateDictOptions(full_state_dict=True)``)
    rejects a torch.dtype value. ``load_state_dict_checked`` reads the names back."""
    state_dict = Optimizer.state_dict(optimizer)
    for group in state_dict["param_groups"]:  # torch's copies of the groups
        for key, value in group.items():
            if isinstance(value, torch.dtype):
                group[key] = str(value)
    return state_dict


def _dtype_from_name(value):
    """"torch.float32" -> torch.float32 (what ``state_dict_with_dtype_names`` wrote); anything else as is."""
    if isinstance(value, str) and value.startswith(_DTYPE_PREFIX):
        dtype = getattr(torch, value[len(_DTYPE_PREFIX):], None)
        if isinstance(dtype, torch.dtype):
            return dtype
    return value


def _param_shape(p: torch.Tensor, group: dict) -> tuple[int, ...]:
    return tuple(p.shape)


def _dion_q_shape(p: torch.Tensor, group: dict) -> tuple[int, ...]:
    m, n = matrix_shape(p)
    return (min(m, n), param_rank(p, group))


@dataclass(frozen=True)
class StateSpec:
    """The per-parameter state one algorithm keeps, as ``load_state_dict`` checks it.

    ``tensors``: state key -> expected shape of parameter ``p`` in its (completed, normalized)
    group; each must be a real floating tensor of that shape, finite. ``counts``: keys holding
    a step count, a one-element tensor with a non-negative integer value (float32 in
    torch.optim.AdamW's layout, int64 in Dion's). A non-empty entry must hold every key (a
    missing key would be re-created as zeros: a silently different run) but those
    ``optional(group)`` names (keys whose re-creation changes nothing in that group) and no other.
    ``nonnegative``: keys of second moments (averages of squares), which must hold no negative
    entry (the step takes their square root: a negative one makes the parameter NaN).
    """

    algorithm: str
    tensors: Mapping[str, Callable[[torch.Tensor, dict], tuple[int, ...]]]
    counts: tuple[str, ...] = ()
    optional: Callable[[dict], tuple[str, ...]] = lambda group: ()
    nonnegative: tuple[str, ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        return (*self.tensors, *self.counts)


#: The state of each algorithm (``ortho_fast.groups.algorithms.ALGORITHMS``' names).
STATE_SPECS: dict[str, StateSpec] = {
    "muon": StateSpec("Muon", {"momentum_buffer": _param_shape}),
    # Dion's step only keys the sketches of randomized Cholesky QR: elsewhere a missing one changes nothing
    "dion": StateSpec("Dion", {"momentum": _param_shape, "Q": _dion_q_shape}, ("step",),
                      lambda group: () if group["qr_method"] in ("randomized_cholesky_qr", "rcqr") else ("step",)),
    # Muon with NorMuon on (``ortho_fast.groups.muon.muon_state_algorithm``): its second moment too.
    "normuon": StateSpec("NorMuon", {"momentum_buffer": _param_shape, VARIANCE_KEY: normuon_variance_state_shape},
                         nonnegative=(VARIANCE_KEY,)),
    "dion2": StateSpec("Dion2", {"momentum": _param_shape}),
    "adamw": StateSpec("AdamW", {"exp_avg": _param_shape, "exp_avg_sq": _param_shape}, ("step",),
                       nonnegative=("exp_avg_sq",)),
    "lion": StateSpec("Lion", {"exp_avg": _param_shape}),
}


def _owners(key: str) -> str:
    owners = [spec.algorithm for spec in STATE_SPECS.values() if key in spec.keys]
    return f" (a state key of {'/'.join(owners)}: a checkpoint of another optimizer?)" if owners else ""


def check_saved_state(entry, spec: StateSpec, p: torch.Tensor, group: dict, where: str) -> None:
    """Check one parameter's saved state ``entry`` against ``spec``; change nothing.

    Raises: ValueError starting with the state key (or "state") and naming the parameter
    (``where``): an entry that is not a dict, a key of another optimizer or a missing key, a
    tensor that is not real floating (an int64 Q), of the wrong shape or not finite, a second
    moment (``spec.nonnegative``) with a negative entry, a step count that is not a one-element
    tensor holding a non-negative integer, any tensor on the meta device (no data to load).
    """
    if not isinstance(entry, Mapping):
        raise ValueError(f"state: expected a dict of tensors for {where}, got {type(entry).__name__}")
    if not entry:  # {}: no state, as an absent entry (what reading ``opt.state[p]`` leaves behind)
        return
    for key in entry:
        if key not in spec.keys:
            raise ValueError(f"{key}: not a {spec.algorithm} state key{_owners(key)}; {spec.algorithm} keeps "
                             f"{list(spec.keys)} ({where})")
    missing = [k for k in spec.keys if k not in entry and k not in spec.optional(group)]
    if missing:
        raise ValueError(f"{missing[0]}: missing from the saved {spec.algorithm} state of {where} (it has "
                         f"{sorted(entry)}); a resumed run would re-create it and differ")
    for key in [k for k in entry if isinstance(entry[k], torch.Tensor) and entry[k].device.type == "meta"]:
        raise ValueError(f"{key}: a meta-device tensor (shape {tuple(entry[key].shape)}, no data) for {where}: the "
                         "checkpoint was loaded or built on the meta device; load it with map_location='cpu' (or "
                         "the parameters' device) and materialize its tensors first")
    for key, shape_of in spec.tensors.items():
        value, want = entry[key], shape_of(p, group)
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            got = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"{key}: expected a real floating-point tensor for {where}, got {got}")
        if tuple(value.shape) != want:
            raise ValueError(f"{key}: expected shape {want} for {where}, got {tuple(value.shape)}")
        check_finite(value, f"{key} of {where}")
        if key in spec.nonnegative:
            local = local_tensor(value)
            if local.numel() and bool(local.amin() < 0):
                raise ValueError(f"{key}: a second moment must be >= 0, got a minimum of {local.amin().item():.3g} "
                                 f"for {where} (a corrupt checkpoint: its square root would make the parameter NaN)")
    for key in spec.counts:
        if key not in entry:
            continue
        value = entry[key]
        ok = (isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex()
              and value.dtype != torch.bool)
        number = value.item() if ok else None
        if not ok or not (number == number and abs(number) != float("inf")) or number < 0 or number != int(number):
            raise ValueError(f"{key}: expected a one-element tensor holding a non-negative integer step count for "
                             f"{where}, got {value!r}")


def distributed_runners(optimizer: Optimizer) -> list:
    """The runners of ``optimizer`` that agree across ranks: every attribute (or value of a dict
    attribute) with ``communicates`` set and an ``agree(error, device)`` method (``ortho_fast.distributed``'s
    ``MuonSharding`` and ``ShardedDionGroups``), each once, in attribute order (the same on every
    rank: every rank builds the optimizer the same way). Empty for a one-process optimizer."""
    found: list = []
    for value in vars(optimizer).values():
        for runner in (value.values() if isinstance(value, dict) else (value,)):
            if (getattr(runner, "communicates", False) is True and callable(getattr(runner, "agree", None))
                    and not any(runner is r for r in found)):
                found.append(runner)
    return found


def _agree_key(runner) -> object:
    """What identifies a runner's agreement: the member ranks of each axis it reduces over
    (``agree_axes``; the same on every rank for the same meshes), or the runner itself when it
    does not say. Runners of one optimizer on the same meshes (``HybridOptimizer``'s Muon and
    Dion2 on ``distributed_mesh``) then agree once on load, not once each."""
    axes = getattr(runner, "agree_axes", None)
    return ("runner", id(runner)) if axes is None else frozenset(a.ranks for a in axes)


def check_state_dict_ids(state_dict: Mapping) -> None:
    """The parameter ids of a state dict: each listed once across its ``param_groups``, and every
    key of its ``state`` one of them (torch's load drops an entry whose key is not: a checkpoint
    whose keys became strings "0", "1" — through JSON — would start every parameter from empty
    state, silently). Raises: ValueError starting with "param_groups" (a malformed group, an id
    listed twice) or "state" (naming the key; a string of an id says how to convert). Changes nothing."""
    groups, state = state_dict["param_groups"], state_dict["state"]
    if not isinstance(groups, (list, tuple)):
        raise ValueError(f"param_groups: expected a list of dicts, got {type(groups).__name__}")
    if not isinstance(state, Mapping):
        raise ValueError(f"state: expected a dict {{parameter id: state}}, got {type(state).__name__}")
    owner: dict = {}
    for i, group in enumerate(groups):
        if not isinstance(group, Mapping) or not isinstance(group.get("params"), (list, tuple)):
            raise ValueError(f"param_groups: group {i} must be a dict whose 'params' is a list of parameter ids, got "
                             f"{group!r:.80}")
        for pid in group["params"]:
            if not isinstance(pid, (int, str)) or isinstance(pid, bool):
                raise ValueError(f"param_groups: group {i} lists {pid!r} ({type(pid).__name__}); expected parameter "
                                 "ids (ints, as Optimizer.state_dict() writes them)")
            if pid in owner:
                where = "again" if owner[pid] == i else f"and in param group {owner[pid]}"
                raise ValueError(f"param_groups: parameter id {pid!r} is listed twice (in param group {i} {where}); "
                                 "each parameter of a state dict appears once (a hand-edited or merged checkpoint?)")
            owner[pid] = i
    for key in state:
        if key in owner:
            continue
        if isinstance(key, str) and key.strip().lstrip("-").isdigit() and int(key) in owner:
            raise ValueError(f"state: key {key!r} is a string but the param_groups list parameter ids as ints (the "
                             "state dict went through JSON?); loading it would start every parameter from empty state. "
                             "Convert the keys first: state_dict['state'] = {int(k): v for k, v in "
                             "state_dict['state'].items()}")
        ids = sorted(owner, key=str)
        raise ValueError(f"state: key {key!r} is not a parameter id of the state dict's param_groups "
                         f"({ids[:8]}{' ...' if len(ids) > 8 else ''}); its state would be dropped")


def describe_saved_groups(saved: Sequence[Mapping]) -> str:
    """What a state dict's groups hold, for an error: their option names, and the optimizer they
    point to (torch.optim's by ``TORCH_ONLY_OPTIONS``, ours by ``algorithm`` or by options only one
    of ``STATE_SPECS``' algorithms has)."""
    keys = sorted({k for g in saved for k in g if isinstance(k, str)} - set(GROUP_BOOKKEEPING))
    torch_owners = None
    for key in keys:
        if key in TORCH_ONLY_OPTIONS:
            owners = set(TORCH_ONLY_OPTIONS[key])
            torch_owners = owners if torch_owners is None else torch_owners & owners
    named = sorted({str(g["algorithm"]) for g in saved if "algorithm" in g})
    if torch_owners:
        source = "those of " + " / ".join(f"torch.optim.{o}" for o in sorted(torch_owners))
    elif named:
        source = f"algorithm {', '.join(named)}"
    else:
        from .algorithms import ALGORITHMS

        shared = {a: len(set(keys) & set(spec.defaults) - {"lr", "weight_decay"}) for a, spec in ALGORITHMS.items()}
        most = max(shared.values())
        source = "mostly " + " / ".join(a for a, n in shared.items() if n == most) + "'s" if most else "unknown"
    return f"its groups hold the options {keys} ({source})"


def _checked_groups(optimizer: Optimizer, state_dict, group_spec: GroupSpec, algorithm_of) -> list[dict]:
    """Steps 0 and 1 of ``load_state_dict_checked`` and its saved-state check: the completed
    saved groups, or the first error (nothing changed)."""
    if not isinstance(state_dict, Mapping) or not {"state", "param_groups"} <= set(state_dict):
        raise ValueError("state_dict: expected a dict with 'state' and 'param_groups' (an optimizer's state_dict())")
    check_state_dict_ids(state_dict)
    saved = [{k: _dtype_from_name(v) for k, v in g.items()} for g in state_dict["param_groups"]]
    if len(saved) != len(optimizer.param_groups):
        raise ValueError(f"param_groups: the state dict has {len(saved)} param group(s), this optimizer "
                         f"{len(optimizer.param_groups)} (a checkpoint of another model or optimizer?); "
                         f"{describe_saved_groups(saved)}")
    for i, (group, current) in enumerate(zip(saved, optimizer.param_groups)):
        if len(group["params"]) != len(current["params"]):
            raise ValueError(f"param_groups: param group {i} of the state dict has {len(group['params'])} "
                             f"parameter(s), this optimizer's {len(current['params'])} (a checkpoint of another "
                             "model, or groups built in another order?)")
    trials = []
    if len(saved) == len(optimizer.param_groups):
        for i, (group, current) in enumerate(zip(saved, optimizer.param_groups)):
            keys, normalize = group_spec(i, group, current)
            check_foreign_options(group, keys, f"param group {i} of the state dict")
            for key in keys:
                group.setdefault(key, current[key])
            trial = {**group, "params": current["params"]}
            if current.get("param_names") and not trial.get("param_names"):
                trial["param_names"] = current["param_names"]
            normalize(trial)
            group.update({key: trial[key] for key in keys})
            trials.append((i, trial, group))
    if algorithm_of is not None:
        for i, trial, group in trials:
            if len(group["params"]) != len(trial["params"]):
                continue  # torch raises its own error, before any change
            spec = STATE_SPECS[algorithm_of(trial)]
            for j, (pid, p) in enumerate(zip(group["params"], trial["params"])):
                if pid in state_dict["state"]:
                    check_saved_state(state_dict["state"][pid], spec, p, trial,
                                      f"parameter {j} of param group {i} (shape {tuple(p.shape)})")
    return saved


def load_state_dict_checked(optimizer: Optimizer, state_dict: dict, group_spec: GroupSpec,
                            state_dtype: StateDtype | None = None,
                            algorithm_of: Callable[[dict], str] | None = None) -> None:
    """``torch.optim.Optimizer.load_state_dict`` with this package's guarantees.

    0. Dtype names written by ``state_dict_with_dtype_names`` become torch.dtypes again.
    1. Each saved group (when there are as many as the optimizer has; otherwise torch raises
       its own error) gets the options it lacks from the current group (a torch.optim.Muon or
       torch.optim.AdamW checkpoint has fewer keys) and is normalized — on a trial copy with
       the current parameters and names — by the function ``group_spec`` returns, so a bad
       saved group raises before the optimizer changes.
    2. torch's ``load_state_dict`` with the completed groups.
    3. Every loaded state tensor is replaced by a copy: torch keeps the given tensor itself
       where no cast is needed (``step``, a same-dtype buffer), so the optimizer and the state
       dict (and the optimizer it came from) would share memory and one's step would change
       the other. Entries for which ``state_dtype`` gives a dtype are instead copied from the
       saved tensor in that dtype (torch's cast to the parameter's dtype would round e.g. a
       float32 momentum of a bfloat16 parameter).

    Between 1 and 2, with ``algorithm_of`` (completed group -> a key of ``STATE_SPECS``), every
    saved parameter's state is checked (``check_saved_state``: keys, dtypes, shapes, finiteness,
    step counts), so a corrupt or foreign checkpoint raises before the optimizer changes.

    A distributed optimizer (``distributed_runners``) makes the verdict of these checks global
    before anything changes: a corrupt state on one rank (a NaN in its shard) raises there and
    ValueError (``another rank rejected``) on every other rank (``comm.raise_together``: one
    all-reduce per mesh axis, also when every rank is fine; runners on the same axes agree once),
    so no rank loads while another does not.
    Raises: whatever ``group_spec``, its normalize function or ``check_saved_state`` raise
    (before any change); ValueError for a state dict without "state" / "param_groups", with
    another number of groups or of parameters in a group, or whose ids or keys do not match
    (``check_state_dict_ids``), or holding another optimizer's options (``check_foreign_options``).
    """
    error, saved = None, []
    try:
        saved = _checked_groups(optimizer, state_dict, group_spec, algorithm_of)
    except (ValueError, TypeError, KeyError) as err:
        error = err
    device = next((p.device for g in optimizer.param_groups for p in g["params"]), None)  # NCCL: the GPU
    agreed: set = set()
    for runner in distributed_runners(optimizer):  # every rank raises together, before any change
        key = _agree_key(runner)
        if key in agreed:  # these process groups agreed already: one verdict per set of axes
            continue
        agreed.add(key)
        runner.agree(error, device=device)
    if error is not None:
        raise error
    ids = [i for g in state_dict["param_groups"] for i in g["params"]]
    params = [p for g in optimizer.param_groups for p in g["params"]]
    source = {p: state_dict["state"].get(i, {}) for i, p in zip(ids, params)}
    Optimizer.load_state_dict(optimizer, {**state_dict, "param_groups": saved})
    for group in optimizer.param_groups:
        for p in group["params"]:
            st = optimizer.state.get(p, {})
            for key, value in list(st.items()):
                original = source.get(p, {}).get(key)
                dtype = state_dtype(group, key, p) if state_dtype is not None else None
                if dtype is not None and torch.is_tensor(original):
                    st[key] = original.to(device=p.device, dtype=dtype, copy=True)
                elif torch.is_tensor(value):
                    st[key] = value.clone()
