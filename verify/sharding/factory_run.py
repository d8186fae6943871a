"""Running a user's optimizer factory (``check_sharded_optimizer``): in one process on the full
tensors (``one_process_run``) and on the ranks of one layout (``layout_rank_run``), on the seeded
inputs of ``ortho_verify.sharding.inputs`` (every replica fed the same gradient)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .inputs import gradient, initial_weight
from .layouts import Layout
from .mesh_layout import sharded_layout
from .tensors import full_copy, is_dtensor, place

__all__ = ["FactoryPlan", "hyperparameters", "layout_rank_run", "one_process_run"]


@dataclass(frozen=True)
class FactoryPlan:
    """One layout of a user's factory: ``shapes`` are (label, (m, n)) pairs, parameter i of shape
    (m, n) starts from ``initial_weight(i, (m, n), dtype)`` and gets ``gradient(i, step, 0, ...)``."""

    factory: Callable
    layout: Layout
    mesh_shape: tuple[int, ...]
    shapes: tuple[tuple[str, tuple[int, int]], ...]
    dtype: str
    steps: int
    #: the seed index of each parameter (None: its position): a rerun of some of the parameters
    #: keeps the inputs of the combined run.
    seeds: tuple[int, ...] | None = None

    def seed(self, i: int) -> int:
        """Parameter i's seed index of ``initial_weight`` / ``gradient``."""
        return i if self.seeds is None else self.seeds[i]


def _checked_optimizer(opt, where: str):
    if not callable(getattr(opt, "step", None)) or not hasattr(opt, "state"):
        raise TypeError(f"factory: returned {type(opt).__name__} for {where}; expected a torch.optim.Optimizer-like "
                        "object with .step() and .state (or None: layout not supported)")
    return opt


def hyperparameters(opt) -> dict:
    """The int / float / bool entries of the optimizer's first param group (lr, momentum, ...)."""
    groups = getattr(opt, "param_groups", None) or [{}]
    return {k: v for k, v in groups[0].items() if isinstance(v, (int, float, bool))}


def _state(opt, params: list) -> list[dict[str, torch.Tensor]]:
    """Every tensor of ``opt.state[p]`` per parameter, assembled (``full_copy``), in key order."""
    out = []
    for p in params:
        entry = opt.state.get(p, {}) if hasattr(opt.state, "get") else {}
        out.append({k: full_copy(v) for k, v in sorted(entry.items(), key=lambda kv: str(kv[0]))
                    if isinstance(v, torch.Tensor)})
    return out


def _state_kinds(opt, params: list) -> list[dict[str, str]]:
    """Per parameter, per state tensor: "dtensor" or "plain" (what this rank holds)."""
    out = []
    for p in params:
        entry = opt.state.get(p, {}) if hasattr(opt.state, "get") else {}
        out.append({str(k): "dtensor" if is_dtensor(v) else "plain" for k, v in entry.items()
                    if isinstance(v, torch.Tensor)})
    return out


def one_process_run(factory: Callable, shapes, dtype: str, steps: int, device="cpu", inputs=None,
                    seeds=None) -> dict:
    """``factory(params, None)`` on plain full tensors (``torch.nn.Parameter``), stepped ``steps``
    times. ``inputs``: (initial weights, per step gradients) replacing the seeded ones (the
    local-shard reference); ``seeds``: the seed index of each parameter (default its position).
    Returns "weights" (per step, per parameter, float64 CPU), "state" (``opt.state`` tensors per
    parameter after step 1 and after the last step: "state_first", "state"), "hyper"
    (``hyperparameters``) and "type" (the optimizer's class). Raises what the factory or the step raises."""
    dt = getattr(torch, dtype)
    if inputs is None:
        ids = list(range(len(shapes))) if seeds is None else list(seeds)
        inputs = ([initial_weight(ids[i], s, dt) for i, (_, s) in enumerate(shapes)],
                  [[gradient(ids[i], t, 0, s, dt) for i, (_, s) in enumerate(shapes)] for t in range(steps)])
    params = [torch.nn.Parameter(w.to(device).clone()) for w in inputs[0]]
    opt = _checked_optimizer(factory(params, None), "the one-process run (layout None)")
    weights, first = [], None
    for t in range(steps):
        for p, g in zip(params, inputs[1][t]):
            p.grad = g.to(device).clone()
        opt.step()
        weights.append([p.detach().to("cpu", torch.float64, copy=True) for p in params])
        if t == 0:
            first = _state(opt, params)
    return {"weights": weights, "state_first": first, "state": _state(opt, params), "hyper": hyperparameters(opt),
            "type": type(opt)}


def _local(t: torch.Tensor) -> torch.Tensor:
    return (t.to_local() if is_dtensor(t) else t).detach().clone()


def _check_placed(params: list, placements, step: int, shapes) -> None:
    """Raise ValueError if a parameter stopped being a DTensor with the layout's placements."""
    if placements is None:
        return
    for p, (label, _) in zip(params, shapes):
        if not is_dtensor(p) or not is_dtensor(p.data):
            raise ValueError(f"parameter {label!r} is a plain {type(p.data).__name__} after step {step + 1}: the "
                             f"layout gave a DTensor with placements {list(placements)}")
        if tuple(p.placements) != tuple(placements):
            raise ValueError(f"parameter {label!r} has placements {list(p.placements)} after step {step + 1}, "
                             f"expected {list(placements)}")


def _check_holds(opt, params: list, placements) -> None:
    """Raise ValueError if the optimizer holds plain tensors where the layout gave DTensors (or
    tensors other than the parameters given: it would step copies, never the model's weights)."""
    given = {id(p) for p in params}
    held = [q for group in getattr(opt, "param_groups", []) for q in group.get("params", [])]
    for j, q in enumerate(held):
        if id(q) not in given:
            kind = "a plain tensor" if placements is not None and not is_dtensor(q) else "a tensor"
            raise ValueError(f"the optimizer holds {kind} {type(q).__name__}{tuple(q.shape)} (param_groups params "
                             f"[{j}]) that is not one of the parameters given"
                             + (f" (DTensors with placements {list(placements)})" if placements is not None else "")
                             + ": it steps copies, not the model's weights")


def layout_rank_run(rank: int, world_size: int, plan: FactoryPlan) -> dict:
    """Step ``plan.factory`` on this rank's view of the layout; returns (on every rank) the full
    weights per step ("weights"), the assembled state after step 1 and at the end, the
    hyperparameters, and "local_shard": per parameter the relative difference between this rank's
    shard and the one-process run of the same factory on that shard alone (None if not
    comparable), "state_kinds" (per parameter, per state key: "dtensor" or "plain") and
    "local_shapes" (this rank's shard shape per parameter: state placement is recognized from
    them). "unsupported" when the factory returned None. Raises what the factory or a
    step raises, and ValueError when a parameter stops being a DTensor of the layout's placements."""
    import logging

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from .tensors import relative_difference

    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    lay, dt = plan.layout, getattr(torch, plan.dtype)
    mesh = init_device_mesh(device.type, plan.mesh_shape, mesh_dim_names=lay.dims)
    view = sharded_layout(lay, mesh)
    params = [torch.nn.Parameter(place(initial_weight(plan.seed(i), s, dt), lay, mesh, device))
              for i, (_, s) in enumerate(plan.shapes)]
    local_start = [_local(p) for p in params]
    opt = plan.factory(params, view)
    if opt is None:
        return {"unsupported": True}
    _checked_optimizer(opt, f"layout {lay.name!r}")
    _check_holds(opt, params, view.placements)
    weights, local_grads, first = [], [], None
    for t in range(plan.steps):
        for i, (p, (_, s)) in enumerate(zip(params, plan.shapes)):
            p.grad = place(gradient(plan.seed(i), t, 0, s, dt), lay, mesh, device)
        local_grads.append([_local(p.grad) for p in params])
        opt.step()
        _check_placed(params, view.placements, t, plan.shapes)
        weights.append([full_copy(p) for p in params])
        if t == 0:
            first = _state(opt, params)
    state = _state(opt, params)
    local_end = [_local(p).to("cpu", torch.float64) for p in params]
    local_shard = [None] * len(params)
    if view.placements is not None:  # the same factory in one process on each shard as a matrix of its own
        keep = [i for i, w in enumerate(local_start) if w.numel()]
        try:
            ref = one_process_run(plan.factory, [plan.shapes[i] for i in keep], plan.dtype, plan.steps, device,
                                  inputs=([local_start[i] for i in keep], [[g[i] for i in keep] for g in local_grads]))
            for j, i in enumerate(keep):
                local_shard[i] = relative_difference(local_end[i], ref["weights"][-1][j])
        except Exception:  # noqa: BLE001 - a diagnosis only: the factory may not take a shard alone
            pass
    return {"weights": weights, "state_first": first, "state": state, "hyper": hyperparameters(opt),
            "local_shard": local_shard, "rank": rank, "state_kinds": _state_kinds(opt, params),
            "local_shapes": [tuple(_local(p).shape) for p in params]}
