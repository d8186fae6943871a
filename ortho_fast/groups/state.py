"""Param groups and state dicts of Muon, Dion and HybridOptimizer (one code path for all
three): a group is validated before it stays, a saved group before anything changes, and the
loaded state tensors are the optimizer's own."""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch.optim import Optimizer

#: (index, saved group, current group) -> (option keys of the group, normalize function). It
#: may complete or check the saved group first (HybridOptimizer fills in and checks ``algorithm``).
GroupSpec = Callable[[int, dict, dict], "tuple[Iterable[str], Callable[[dict], None]]"]
#: (group, state key, parameter) -> the dtype that state entry is kept in, or None for torch's
#: rule (floating state cast to the parameter's dtype).
StateDtype = Callable[[dict, str, torch.Tensor], "torch.dtype | None"]


def add_param_group_checked(optimizer: Optimizer, param_group: dict, normalize: Callable[[dict], None]) -> None:
    """torch's ``add_param_group`` (defaults, (name, tensor) pairs -> ``param_names``, leaf and
    duplicate checks), then ``normalize`` on the added group; a rejected group is removed again.

    Raises: whatever torch or ``normalize`` raise; the optimizer's groups are then as before.
    """
    Optimizer.add_param_group(optimizer, param_group)
    try:
        normalize(optimizer.param_groups[-1])
    except Exception:
        optimizer.param_groups.pop()
        raise


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


def load_state_dict_checked(optimizer: Optimizer, state_dict: dict, group_spec: GroupSpec,
                            state_dtype: StateDtype | None = None) -> None:
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

    Raises: whatever ``group_spec`` or its normalize function raise (before any change), and
    torch's errors for a state dict of another shape.
    """
    saved = [{k: _dtype_from_name(v) for k, v in g.items()} for g in state_dict["param_groups"]]
    if len(saved) == len(optimizer.param_groups):
        for i, (group, current) in enumerate(zip(saved, optimizer.param_groups)):
            keys, normalize = group_spec(i, group, current)
            for key in keys:
                group.setdefault(key, current[key])
            trial = {**group, "params": current["params"]}
            if current.get("param_names") and not trial.get("param_names"):
                trial["param_names"] = current["param_names"]
            normalize(trial)
            group.update({key: trial[key] for key in keys})
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
