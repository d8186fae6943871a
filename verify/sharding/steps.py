"""One layout on the ranks of a launch: placing tensors on a mesh, the distributed and the
one-process optimizers, and the comparison of every step (``check_layout``); ``worker`` runs a
``Plan`` on one rank."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.distributed as dist

import ortho_fast

from ..tolerances import sharded_tolerance
from .dion2_reference import dion2_local_reference
from .inputs import gradient, initial_weight, mean_gradient
from .layouts import DTYPES, MATRICES, STATE_KEYS, STEPS, Layout, optimizer_options
from .planted import planted
from .tensors import digest, dtensor_placements, full_copy, place, relative_difference
from .volumes import analytic_volume, comm_verdict

__all__ = ["FLAG_TAGS", "OPTIMIZERS", "Plan", "check_layout", "dtensor_placements", "reference", "tp_blocks", "worker"]


def _replica(layout: Layout, mesh) -> tuple[int, int]:
    """(this rank's data-parallel replica, number of replicas) of a compressed-sync layout: the
    coordinate along the replicate mesh dim; (0, 1) when every rank is fed the same gradient."""
    if layout.check != "compressed":
        return 0, 1
    roles = dict(layout.roles)
    d = layout.dims.index(roles.get("replicate_mesh", roles.get("process_group", "")).partition(":")[0])
    return mesh.get_coordinate()[d], mesh.shape[d]


#: The optimizer class of each ``Layout.optimizer``.
OPTIMIZERS = {"dion": ortho_fast.Dion, "muon": ortho_fast.Muon, "dion2": ortho_fast.Dion2,
              "normuon-stages": ortho_fast.Muon}


def _optimizer(layout: Layout, params: list, mesh):
    """The distributed optimizer of the layout (a role "dim:group" passes the mesh dim's ProcessGroup)."""
    cls = OPTIMIZERS[layout.optimizer]
    meshes = {}
    for arg, dim in layout.roles:
        name, _, as_group = dim.partition(":")
        meshes[arg] = mesh[name].get_group() if as_group else mesh[name]
    return cls(params, **optimizer_options(layout), **meshes)


def _state(opt, params: list, optimizer: str) -> dict[str, list[torch.Tensor]]:
    """"weights" and every state tensor of ``STATE_KEYS`` per matrix, as full float64 tensors."""
    out = {"weights": [full_copy(p) for p in params]}
    for key in STATE_KEYS[optimizer]:
        out[key] = [full_copy(opt.state[p][key]) for p in params]
    return out


def tp_blocks(layout: Layout, mesh_shape: tuple[int, ...], shape: tuple[int, int]) -> tuple[int, list[int]]:
    """(tensor dim, sizes) of the TP shards of a matrix (``torch.chunk`` semantics: trailing
    shards smaller or empty, as DTensor's Shard); the whole matrix if the layout has no TP dim."""
    if layout.tp_dim is None:
        return 0, [shape[0]]
    d, tp = int(layout.placements[layout.tp_dim][1:]), mesh_shape[layout.tp_dim]
    return d, [c.shape[0] for c in torch.arange(shape[d]).chunk(tp)]


def reference(layout: Layout, mesh_shape: tuple[int, ...], dtype: torch.dtype, matrices, steps: int,
              replicas: int, device="cpu") -> list[dict[str, list[torch.Tensor]]]:
    """The one-process run the layout must equal, on ``device`` (the sharded run's device type:
    bitwise comparisons need the same kernels): per step, "weights" and the state keys of every
    matrix (full, float64 on the CPU). Fed the mean of the ``replicas`` gradients (Dion's
    compressed sync: one process fed the mean gradient); for a blockwise layout each TP shard is
    a parameter of its own (Muon's blockwise definition) and the blocks are assembled back; Dion2's
    "local" layouts run their own definition (``dion2_local_reference``)."""
    if layout.check == "local":
        return dion2_local_reference(layout, mesh_shape, dtype, matrices, steps, device)
    split = [tp_blocks(layout, mesh_shape, s) if layout.check == "blockwise" else (0, [s[0]]) for s in matrices]
    params = []
    for i, (shape, (d, sizes)) in enumerate(zip(matrices, split)):
        params.append([b.clone() for b in initial_weight(i, shape, dtype).to(device).split(sizes, d) if b.numel()])
    flat = [b for blocks in params for b in blocks]
    cls = OPTIMIZERS[layout.optimizer]
    opt = cls(flat, **optimizer_options(layout, distributed=False))
    out = []
    for step in range(steps):
        for i, (shape, (d, sizes)) in enumerate(zip(matrices, split)):
            grads = [g for g in mean_gradient(i, step, replicas, shape, dtype).to(device).split(sizes, d) if g.numel()]
            for p, g in zip(params[i], grads):
                p.grad = g.clone()
        opt.step()
        state = {"weights": [torch.cat(blocks, d).to("cpu", torch.float64) for blocks, (d, _) in zip(params, split)]}
        for key in STATE_KEYS[layout.optimizer]:
            state[key] = [torch.cat([opt.state[b][key] for b in blocks], d).to("cpu", torch.float64)
                          for blocks, (d, _) in zip(params, split)]
        out.append(state)
    return out


@dataclass
class Plan:
    """What a launch runs (the same object on every rank)."""

    layouts: list[tuple[Layout, tuple[int, ...]]]
    dtypes: tuple[str, ...] = DTYPES
    matrices: tuple[tuple[int, int], ...] = MATRICES
    steps: int = STEPS
    plant: str | None = None
    references: dict = field(default_factory=dict)


def _world_mean(tensors: Sequence[torch.Tensor], device) -> list[torch.Tensor]:
    """Mean over every rank of each tensor (float64, outside any ledger). With the replicate dim
    of size R, each replica's tensor is held by world/R ranks, so this is the replicas' mean."""
    out = []
    for t in tensors:
        buf = t.to(device)
        dist.all_reduce(buf)
        out.append(buf.cpu() / dist.get_world_size())
    return out


#: Ledger tags of the small flags the distributed optimizers all-reduce before a step (so every
#: rank raises if one rank found a bad gradient): Muon's "check", Dion's "flags"
#: (``dion_check_volume``); counted apart from the algorithm's volume.
FLAG_TAGS = ("check", "flags")


def _volume(ledger) -> tuple[int, int]:
    """(elements, bytes) of a ledger without the per-step flags."""
    kept = [r for r in ledger.records if r.tag not in FLAG_TAGS]
    return sum(r.numel for r in kept), sum(r.bytes for r in kept)


def _max_over_ranks(values: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Elementwise largest over the ranks of a list of (elements, bytes)."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, values)
    return [tuple(map(max, zip(*column))) for column in zip(*everyone)]


def _matrix_volumes(layout: Layout, mesh, dtype: torch.dtype, plan: Plan, device) -> list[tuple[int, int]]:
    """(elements, bytes) of one step of an optimizer holding matrix i alone, for every matrix:
    the largest over the ranks, error flags left out. One matrix per optimizer attributes every
    collective to its matrix (a step of several interleaves them in one ledger)."""
    from ortho_fast.distributed.comm import record_collectives

    replica, _ = _replica(layout, mesh)
    out = []
    for i, s in enumerate(plan.matrices):
        p = place(initial_weight(i, s, dtype), layout, mesh, device)
        opt = _optimizer(layout, [p], mesh)
        p.grad = place(gradient(i, 0, replica, s, dtype), layout, mesh, device)
        with record_collectives() as ledger:
            opt.step()
        out.append(_volume(ledger))
    return _max_over_ranks(out)


def check_layout(layout: Layout, mesh_shape, mesh, dtype_name: str, plan: Plan, device) -> dict | None:
    """Step the layout on this rank; on rank 0 the row of the report, None elsewhere."""
    from ortho_fast.distributed.comm import record_collectives

    rank, dtype = dist.get_rank(), getattr(torch, dtype_name)
    replica, replicas = _replica(layout, mesh)
    params = [place(initial_weight(i, s, dtype), layout, mesh, device) for i, s in enumerate(plan.matrices)]
    opt = _optimizer(layout, params, mesh)
    ref = None
    if rank == 0:
        key = (layout.optimizer, layout.check in ("blockwise", "local")
               and (layout.tp_dim, mesh_shape, layout.placements),
               tuple(optimizer_options(layout, distributed=False).items()), dtype_name, replicas, plan.matrices,
               plan.steps)
        if key not in plan.references:
            plan.references[key] = reference(layout, mesh_shape, dtype, plan.matrices, plan.steps, replicas, device)
        ref = plan.references[key]
    errors: dict[str, float] = {}
    bitwise, identical, steps = True, True, []
    for step in range(plan.steps):
        for i, (p, s) in enumerate(zip(params, plan.matrices)):
            p.grad = place(gradient(i, step, replica, s, dtype), layout, mesh, device)
        with record_collectives() as ledger, planted(plan.plant):
            opt.step()
        steps.append((ledger.total_numel(), ledger.total_bytes()))
        state = _state(opt, params, layout.optimizer)
        # every rank must hold the same full weights and state (only rank 0's are compared with one
        # process; a plain or replicated copy on another rank could diverge unseen); compressed
        # sync: the weights and Q, each replica keeps its own momentum
        shared = state["weights"] + state.get("Q", []) if layout.check == "compressed" else sum(state.values(), [])
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, digest(shared))
        identical &= len(set(everyone)) == 1
        if layout.check == "compressed":
            state["momentum"] = _world_mean(state["momentum"], device)
        if rank == 0:
            for key, tensors in state.items():
                for got, want in zip(tensors, ref[step][key]):
                    errors[key] = max(errors.get(key, 0.0), relative_difference(got, want))
                    bitwise &= torch.equal(got, want)
    if layout.check == "compressed":
        opt.synchronize_for_checkpoint()
        synced = [full_copy(opt.state[p]["momentum"]) for p in params]
        if rank == 0:
            errors["momentum after sync"] = max(relative_difference(g, w) for g, w in zip(synced, ref[-1]["momentum"]))
    steps = _max_over_ranks(steps)
    volumes = _matrix_volumes(layout, mesh, dtype, plan, device)
    if rank != 0:
        return None
    return _row(layout, mesh_shape, dtype_name, plan, errors, bitwise, identical, steps, volumes)


def _row(layout, mesh_shape, dtype_name, plan, errors, bitwise, identical, steps, volumes) -> dict:
    tol = sharded_tolerance(dtype_name)
    worst = max(errors.values())
    matrices = []
    for shape, (numel, nbytes) in zip(plan.matrices, volumes):
        analytic = analytic_volume(layout, mesh_shape, shape)
        padded = analytic_volume(layout, mesh_shape, shape, padded=True)
        matrices.append(dict(shape=list(shape), numel=numel, bytes=nbytes, analytic=analytic, padded=padded,
                             verdict=comm_verdict(numel, analytic, padded)))
    verdicts = {m["verdict"] for m in matrices}
    overall = next(v for v in ("MISMATCH", "no formula", "padding", "exact") if v in verdicts)
    notes = []
    if layout.bitwise and not bitwise:
        notes.append("not bitwise equal (required: same operations as one process)")
    if not identical:
        notes.append("weights or state differ between ranks")
    if overall == "MISMATCH":
        notes.append("measured communication differs from the analytic volume")
    ok = worst <= tol and (bitwise or not layout.bitwise) and identical and overall != "MISMATCH"
    return dict(
        world_size=dist.get_world_size(), optimizer=layout.optimizer, layout=layout.name, mesh=list(mesh_shape),
        dims=list(layout.dims), placements=list(layout.placements) if layout.placements else None,
        check=layout.check, dtype=dtype_name, errors=errors, worst=worst, bound=tol, bitwise=bitwise,
        bitwise_required=layout.bitwise, replicas_identical=identical,
        status="pass" if ok else "FAIL", notes=notes, plant=plan.plant,
        comm=dict(numel=sum(m["numel"] for m in matrices), bytes=sum(m["bytes"] for m in matrices),
                  analytic=None if "no formula" in verdicts else sum(m["analytic"] for m in matrices),
                  verdict=overall, matrices=matrices, step_numel=[s[0] for s in steps],
                  step_bytes=[s[1] for s in steps]),
    )


def worker(rank: int, world_size: int, plan: Plan) -> list[dict] | None:
    """Run ``plan`` on this rank of an initialized process group (``run`` forks gloo workers on it,
    or calls it under torchrun): every layout in every dtype; the report rows on rank 0, None
    elsewhere."""
    import logging

    from torch.distributed.device_mesh import init_device_mesh

    # full_tensor() of a _StridedShard DTensor warns on every call that it takes two all-gathers.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    meshes: dict = {}
    rows = []
    for layout, shape in plan.layouts:
        mesh = None
        if shape:
            key = (shape, layout.dims)
            if key not in meshes:
                meshes[key] = init_device_mesh(device.type, shape, mesh_dim_names=layout.dims)
            mesh = meshes[key]
        for dtype_name in plan.dtypes:
            rows.append(check_layout(layout, shape, mesh, dtype_name, plan, device))
    return rows if rank == 0 else None
