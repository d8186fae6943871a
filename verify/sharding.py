"""``ortho-verify sharding``: every distributed layout of Dion and Muon against one process.

For each layout that fits the world size (DDP, FSDP, TP colwise / rowwise, HSDP, FSDP + TP with
``_StridedShard``, HSDP + TP; Muon's TP modes) the same seeded matrices (even, uneven and
emptily sharded shapes, tall and wide) are stepped ``steps`` times by the distributed optimizer
on DTensors and by the same optimizer in one process on the full tensors. After every step each
rank assembles the full weights and state (``DTensor.full_tensor()``) and rank 0 compares them
with the one-process run in relative Frobenius norm against ``sharded_tolerance(dtype)``
(DESIGN.md's layout contract). Three kinds of check:

- ``equal``: the sharded step equals the one-process step (every replica fed the same gradient),
  and every rank holds the same full weights and state (a digest per rank; rank 0's alone is
  compared with one process, so a DDP copy on another rank could otherwise diverge unseen).
- ``compressed``: Dion's compressed data-parallel sync (Ahn et al., arXiv 2504.05295, Sec. 3;
  DESIGN.md): replicas are fed *different* gradients; the weights and Q must be bitwise
  identical on every replica, the mean over replicas of the momentum must equal the momentum of
  one process fed the mean gradient, and the weights and Q must equal that process's; after
  ``synchronize_for_checkpoint()`` every replica's momentum equals it too.
- ``blockwise``: Muon's TP mode "blockwise" (Megatron / Emerging-Optimizers) is layout
  dependent by design; it is checked against its own definition: one-process Muon applied to
  each TP shard as a matrix of its own.

Every collective of each step is recorded (``ortho_fast.distributed.comm.record_collectives``)
and its elements are compared with the analytic volume of the layout (the Dion paper's Table 1
refined per layout, ``ortho_fast.distributed.dion.dion_comm_volume`` /
``ortho_fast.distributed.muon.muon_comm_volume``).

``run(world_size)`` starts gloo workers on CPU (``ortho_verify.workers.run_workers``); under
``torchrun`` (``RANK`` / ``WORLD_SIZE`` set, or a process group already initialized) the same
code runs in-process, with NCCL on CUDA when available. ``main(argv)`` is the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import torch
import torch.distributed as dist

import ortho_fast
from ortho_verify.tolerances import sharded_tolerance
from ortho_verify.workers import WorkerError, run_workers

__all__ = ["Layout", "LAYOUTS", "MATRICES", "QUICK_MATRICES", "DTYPES", "PLANTS", "DOCS_PATH", "layouts_for",
           "initial_weight", "gradient", "mean_gradient", "optimizer_options", "reference", "analytic_volume", "run",
           "under_torchrun", "main", "markdown_report", "layouts_doc"]

DTYPES = ("float64", "float32")
#: (m, n) of the test matrices: even at every world size, uneven (13 rows or 7 columns over 2, 4
#: or 8 ranks), and with fewer rows (5) than ranks, so some shards are empty; tall and wide
#: (Dion works on the transpose of a wide matrix, Muon on the wide side).
MATRICES = ((16, 24), (13, 7), (5, 11))
#: --quick: one shape even at 2 and 4 ranks (communication exactly the formula) and one uneven
#: with an empty shard at 4 ranks.
QUICK_MATRICES = ((12, 8), (5, 11))
STEPS, QUICK_STEPS = 3, 2
SEED = 0
#: Options of both the distributed and the one-process optimizer (a rank fraction below one
#: keeps Dion's error feedback in play; Newton–Schulz in the parameter's dtype).
DION_OPTIONS = dict(lr=0.02, mu=0.9, weight_decay=0.1, rank_fraction=0.5, seed=SEED)
MUON_OPTIONS = dict(lr=0.02, momentum=0.9, weight_decay=0.1, dtype=None)
STATE_KEYS = {"dion": ("momentum", "Q"), "muon": ("momentum_buffer",)}
DOCS_PATH = Path(__file__).resolve().parent.parent / "docs" / "layouts.md"
#: World sizes docs/layouts.md covers (``--write-docs`` runs them all).
DOCS_WORLD_SIZES = (1, 2, 4, 8)
#: Seconds a whole launch may take before its workers are killed (a hang fails, never blocks).
TIMEOUT = 900.0


@dataclass(frozen=True)
class Layout:
    """One distributed layout of one optimizer.

    ``dims``: mesh dim names (torchtitan / OLMo-core: "dp_replicate", "dp_shard", "tp"; "dp" for
    DDP). ``shape``: the mesh shape, -1 standing for world_size / (product of the others).
    ``placements``: one code per mesh dim for every matrix ("R" Replicate, "S0" / "S1" Shard,
    "SS0" ``_StridedShard(0)`` with split factor the size of the later mesh dims that shard
    dim 0, as FSDP2 on top of colwise TP), None for plain tensors (DDP). ``roles``: (optimizer
    argument, mesh dim) pairs; "dim:group" passes the dim's ProcessGroup instead of the 1-D
    mesh. ``check``: "equal", "compressed" or "blockwise" (see the module docstring).
    ``options``: extra optimizer arguments (see ``optimizer_options``: update options such as
    ``qr_method`` reach the one-process reference too, ``tp_mode`` /
    ``replicate_mesh_grad_sync`` only the distributed optimizer). ``bitwise``: the sharded step
    performs the same floating-point operations as one process, so equality must be exact.
    """

    name: str
    optimizer: str
    dims: tuple[str, ...] = ()
    shape: tuple[int, ...] = ()
    placements: tuple[str, ...] | None = None
    roles: tuple[tuple[str, str], ...] = ()
    check: str = "equal"
    options: tuple[tuple[str, object], ...] = ()
    bitwise: bool = False

    def mesh_shape(self, world_size: int) -> tuple[int, ...] | None:
        """The mesh shape at ``world_size``, or None if the layout does not fit: "single" runs at
        one rank only; a 1-D mesh takes every rank; in an N-D mesh the free dim gets >= 2 ranks."""
        if not self.shape:
            return () if world_size == 1 else None
        fixed = math.prod(s for s in self.shape if s != -1)
        rest, ok = divmod(world_size, fixed)
        if ok or rest < (1 if len(self.shape) == 1 else 2):
            return None
        return tuple(rest if s == -1 else s for s in self.shape)

    @property
    def tp_dim(self) -> int | None:
        return self.dims.index("tp") if "tp" in self.dims else None


def _dion(name, dims, shape, placements, roles, check="equal", bitwise=False, **options) -> Layout:
    return Layout(name, "dion", dims, shape, placements, roles, check, tuple(options.items()), bitwise)


def _muon(name, dims, shape, placements, roles, bitwise=False, **options) -> Layout:
    check = "blockwise" if options.get("tp_mode") == "blockwise" else "equal"
    return Layout(name, "muon", dims, shape, placements, roles, check, tuple(options.items()), bitwise)


_DP, _SHARD, _TP, _HSDP, _FSDP_TP = ("dp",), ("dp_shard",), ("tp",), ("dp_replicate", "dp_shard"), ("dp_shard", "tp")
_HSDP_TP = ("dp_replicate", "dp_shard", "tp")
_REP, _OUT, _IN = ("replicate_mesh", "dp_replicate"), ("outer_shard_mesh", "dp_shard"), ("inner_shard_mesh", "tp")
_COLWISE_2D, _ROWWISE_2D = ("SS0", "S0"), ("S0", "S1")
_MUON_2D = (("distributed_mesh", "dp_shard"), ("tp_mesh", "tp"))

#: Every layout checked, in report order (``layouts_for`` picks those that fit a world size).
LAYOUTS: tuple[Layout, ...] = (
    _dion("single", (), (), None, (), bitwise=True),
    _dion("DDP", _DP, (-1,), None, (("replicate_mesh", "dp"),), "compressed"),
    _dion("DDP, grads synced", _DP, (-1,), None, (("replicate_mesh", "dp"),), bitwise=True,
          replicate_mesh_grad_sync=False),
    _dion("FSDP", _SHARD, (-1,), ("S0",), (_OUT,)),
    _dion("TP colwise", _TP, (-1,), ("S0",), (_IN,)),
    _dion("TP rowwise", _TP, (-1,), ("S1",), (_IN,)),
    _dion("HSDP", _HSDP, (2, -1), ("R", "S0"), (_REP, _OUT), "compressed"),
    _dion("HSDP, grads synced", _HSDP, (2, -1), ("R", "S0"), (_REP, _OUT), replicate_mesh_grad_sync=False),
    _dion("FSDP + TP colwise", _FSDP_TP, (-1, 2), _COLWISE_2D, (_OUT, _IN)),
    _dion("FSDP + TP rowwise", _FSDP_TP, (-1, 2), _ROWWISE_2D, (_OUT, _IN)),
    _dion("HSDP + TP colwise", _HSDP_TP, (2, -1, 2), ("R", *_COLWISE_2D), (_REP, _OUT, _IN), "compressed"),
    _dion("HSDP + TP rowwise", _HSDP_TP, (2, -1, 2), ("R", *_ROWWISE_2D), (_REP, _OUT, _IN), "compressed"),
    # the other distributed code paths: a ProcessGroup, QR methods on sharded rows, Orth-Dion's gathered R
    _dion("DDP, process_group", _DP, (-1,), None, (("process_group", "dp:group"),), "compressed"),
    _dion("FSDP, randomized CholeskyQR", _SHARD, (-1,), ("S0",), (_OUT,), qr_method="randomized_cholesky_qr"),
    _dion("FSDP + TP rowwise, CholeskyQR2", _FSDP_TP, (-1, 2), _ROWWISE_2D, (_OUT, _IN), qr_method="cholesky_qr"),
    _dion("HSDP + TP colwise, randomized CholeskyQR", _HSDP_TP, (2, -1, 2), ("R", *_COLWISE_2D), (_REP, _OUT, _IN),
          "compressed", qr_method="randomized_cholesky_qr"),
    _dion("TP rowwise, Orth-Dion", _TP, (-1,), ("S1",), (_IN,), right_factor="qr"),
    _muon("single", (), (), None, (), bitwise=True),
    _muon("DDP", _DP, (-1,), None, (("distributed_mesh", "dp"),), bitwise=True),
    _muon("DDP, ProcessGroup", _DP, (-1,), None, (("distributed_mesh", "dp:group"),), bitwise=True),
    _muon("FSDP", _SHARD, (-1,), ("S0",), (("distributed_mesh", "dp_shard"),), bitwise=True),
    *(_muon(f"TP {wise} {mode}", _TP, (-1,), (code,), (("tp_mesh", "tp"),), bitwise=mode != "distributed",
            tp_mode=mode)
      for mode in ("duplicated", "distributed", "blockwise") for wise, code in (("colwise", "S0"), ("rowwise", "S1"))),
    *(_muon(f"FSDP + TP {wise} {mode}", _FSDP_TP, (-1, 2), codes, _MUON_2D, bitwise=mode != "distributed",
            tp_mode=mode)
      for mode in ("duplicated", "distributed", "blockwise")
      for wise, codes in (("colwise", _COLWISE_2D), ("rowwise", _ROWWISE_2D))),
)


def layouts_for(world_size: int, names: Sequence[str] | None = None) -> list[tuple[Layout, tuple[int, ...]]]:
    """(layout, mesh shape) of every layout of ``LAYOUTS`` that fits ``world_size``, optionally only
    those whose "optimizer/name" contains one of ``names`` (case-insensitive).
    Raises: ValueError naming ``world_size`` unless an int >= 1."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: expected an int >= 1, got {world_size!r}")
    out = []
    for lay in LAYOUTS:
        shape = lay.mesh_shape(world_size)
        label = f"{lay.optimizer}/{lay.name}".lower()
        if shape is not None and (not names or any(n.lower() in label for n in names)):
            out.append((lay, shape))
    return out


# ---------------------------------------------------------------------------------------
# Inputs: seeded on the global shape, identical in every process.
# ---------------------------------------------------------------------------------------


def _normal(shape: tuple[int, int], dtype: torch.dtype, *key) -> torch.Tensor:
    """N(0, 1) of ``shape`` from a generator seeded by ``key`` (a stable hash, not Python's hash())."""
    seed = int.from_bytes(hashlib.sha256(repr((SEED, *key)).encode()).digest()[:7], "little")
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def initial_weight(i: int, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """Matrix i's initial weight, N(0, 1/n)."""
    return _normal(shape, dtype, "weight", i) / math.sqrt(shape[1])


def gradient(i: int, step: int, replica: int, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """Matrix i's gradient at ``step`` on data-parallel replica ``replica``."""
    return _normal(shape, dtype, "grad", i, step, replica)


def mean_gradient(i: int, step: int, replicas: int, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """The mean over ``replicas`` of ``gradient`` (summed in float64, rounded once)."""
    return sum(gradient(i, step, j, shape, dtype).double() for j in range(replicas)).div(replicas).to(dtype)


# ---------------------------------------------------------------------------------------
# Placing tensors on a mesh and reading them back.
# ---------------------------------------------------------------------------------------


def _placements(layout: Layout, mesh_shape: tuple[int, ...]) -> list:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    out = []
    for d, code in enumerate(layout.placements):
        if code == "R":
            out.append(Replicate())
        elif code.startswith("SS"):
            later = [mesh_shape[e] for e in range(d + 1, len(mesh_shape)) if layout.placements[e] == f"S{code[2:]}"]
            out.append(_StridedShard(int(code[2:]), split_factor=math.prod(later)))
        else:
            out.append(Shard(int(code[1:])))
    return out


def _place(full: torch.Tensor, layout: Layout, mesh, device) -> torch.Tensor:
    """This rank's view of ``full``: a DTensor with the layout's placements (no communication:
    every rank holds the full tensor; on the replicate dim each replica keeps its own values),
    or a plain copy."""
    full = full.to(device)
    if layout.placements is None:
        return full.clone()
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full, mesh, _placements(layout, tuple(mesh.shape)), src_data_rank=None)


def _full(t: torch.Tensor) -> torch.Tensor:
    """A float64 CPU copy of the global tensor on every rank (a collective for a DTensor; never
    an alias of the optimizer's tensor, which the checks then modify)."""
    from ortho_fast.distributed.layout import is_dtensor

    return (t.full_tensor() if is_dtensor(t) else t).detach().to("cpu", torch.float64, copy=True)


def _replica(layout: Layout, mesh) -> tuple[int, int]:
    """(this rank's data-parallel replica, number of replicas) of a compressed-sync layout: the
    coordinate along the replicate mesh dim; (0, 1) when every rank is fed the same gradient."""
    if layout.check != "compressed":
        return 0, 1
    roles = dict(layout.roles)
    d = layout.dims.index(roles.get("replicate_mesh", roles.get("process_group", "")).partition(":")[0])
    return mesh.get_coordinate()[d], mesh.shape[d]


# ---------------------------------------------------------------------------------------
# The optimizers: distributed, one-process and the blockwise definition.
# ---------------------------------------------------------------------------------------


def optimizer_options(layout: Layout, *, distributed: bool = True) -> dict:
    """Constructor arguments of the layout's optimizer: ``DION_OPTIONS`` / ``MUON_OPTIONS`` and the
    layout's ``options`` — all of them for the distributed optimizer, only the update's own
    options (keys of ``ortho_fast.DION_DEFAULTS`` / ``MUON_DEFAULTS``, e.g. ``qr_method``) for the
    one-process reference (not ``tp_mode`` / ``replicate_mesh_grad_sync``)."""
    base, keys = ((DION_OPTIONS, ortho_fast.DION_DEFAULTS) if layout.optimizer == "dion"
                  else (MUON_OPTIONS, ortho_fast.MUON_DEFAULTS))
    extra = {k: v for k, v in layout.options if distributed or k in keys}
    return {**base, **extra}


def _optimizer(layout: Layout, params: list, mesh):
    """The distributed optimizer of the layout (a role "dim:group" passes the mesh dim's ProcessGroup)."""
    cls = ortho_fast.Dion if layout.optimizer == "dion" else ortho_fast.Muon
    meshes = {}
    for arg, dim in layout.roles:
        name, _, as_group = dim.partition(":")
        meshes[arg] = mesh[name].get_group() if as_group else mesh[name]
    return cls(params, **optimizer_options(layout), **meshes)


def _state(opt, params: list, optimizer: str) -> dict[str, list[torch.Tensor]]:
    """"weights" and every state tensor of ``STATE_KEYS`` per matrix, as full float64 tensors."""
    out = {"weights": [_full(p) for p in params]}
    for key in STATE_KEYS[optimizer]:
        out[key] = [_full(opt.state[p][key]) for p in params]
    return out


def _blocks(layout: Layout, mesh_shape: tuple[int, ...], shape: tuple[int, int]) -> tuple[int, list[int]]:
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
    a parameter of its own (Muon's blockwise definition) and the blocks are assembled back."""
    split = [_blocks(layout, mesh_shape, s) if layout.check == "blockwise" else (0, [s[0]]) for s in matrices]
    params = []
    for i, (shape, (d, sizes)) in enumerate(zip(matrices, split)):
        params.append([b.clone() for b in initial_weight(i, shape, dtype).to(device).split(sizes, d) if b.numel()])
    flat = [b for blocks in params for b in blocks]
    cls = ortho_fast.Dion if layout.optimizer == "dion" else ortho_fast.Muon
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


# ---------------------------------------------------------------------------------------
# Planted bugs: the checks must be able to fail.
# ---------------------------------------------------------------------------------------


def _skipping_matrix_all_reduce(collective):
    """``all_reduce`` that leaves every matrix (ndim >= 2: partial products, Gram matrices, column
    norms) unreduced; scalars and the optimizers' 1-D flags still travel, so the step runs."""

    def wrapped(tensor, *args, **kwargs):
        return None if tensor.ndim >= 2 else collective(tensor, *args, **kwargs)

    return wrapped


def _rotating(collective):
    """``collective`` (all_gather / gather) whose received list lands one rank over: every
    gathered block at the wrong shard offset."""

    def wrapped(*args, **kwargs):
        result = collective(*args, **kwargs)
        for parts in args:
            if isinstance(parts, list) and len(parts) > 1:
                parts[:] = parts[1:] + parts[:1]
        return result

    return wrapped


def _rotating_sent(collective):
    """``collective`` (scatter) whose blocks to send are rotated one rank over first: every rank
    receives its neighbour's block."""

    def wrapped(*args, **kwargs):
        for parts in args:
            if isinstance(parts, list) and len(parts) > 1:
                parts[:] = parts[1:] + parts[:1]
        return collective(*args, **kwargs)

    return wrapped


def _first_rank_only(collective):
    """``broadcast`` whose result reaches global rank 0 only: the other receiving ranks keep a
    zero buffer (as if they were on another group), so their copies diverge while rank 0's
    stays right."""

    def wrapped(tensor, *, group, group_src):  # as ``ortho_fast.distributed.comm.broadcast`` calls it
        result = collective(tensor, group=group, group_src=group_src)
        if dist.get_rank() not in (0, dist.get_global_rank(group, group_src)):
            tensor.zero_()
        return result

    return wrapped


#: name -> (what it breaks, {torch.distributed attribute: replacement factory}).
PLANTS = {
    "no_all_reduce": ("every all-reduce of a matrix skipped (partial sums left local)",
                      {"all_reduce": _skipping_matrix_all_reduce}),
    "rotated_blocks": ("every gathered block placed one rank over (a wrong shard offset)",
                       {"all_gather": _rotating, "gather": _rotating}),
    "rotated_scatter": ("every scattered block sent one rank over (the way back to the shards)",
                        {"scatter": _rotating_sent}),
    "broadcast_to_rank_0": ("every broadcast reaches global rank 0 only (the other copies diverge unseen by "
                            "rank 0's comparison)", {"broadcast": _first_rank_only}),
}


@contextlib.contextmanager
def _planted(name: str | None) -> Iterator[None]:
    """Within the block, replace the torch.distributed collectives that ``PLANTS[name]`` names."""
    if name is None:
        yield
        return
    saved = {attr: getattr(dist, attr) for attr in PLANTS[name][1]}
    try:
        for attr, make in PLANTS[name][1].items():
            setattr(dist, attr, make(saved[attr]))
        yield
    finally:
        for attr, original in saved.items():
            setattr(dist, attr, original)


# ---------------------------------------------------------------------------------------
# One layout on one rank.
# ---------------------------------------------------------------------------------------


@dataclass
class Plan:
    """What a launch runs (the same object on every rank)."""

    layouts: list[tuple[Layout, tuple[int, ...]]]
    dtypes: tuple[str, ...] = DTYPES
    matrices: tuple[tuple[int, int], ...] = MATRICES
    steps: int = STEPS
    plant: str | None = None
    references: dict = field(default_factory=dict)


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    den = torch.linalg.matrix_norm(want).item()
    diff = torch.linalg.matrix_norm(got - want).item()
    return diff / den if den else (0.0 if diff == 0 else math.inf)


def _digest(tensors: Sequence[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.numpy().tobytes())
    return h.hexdigest()


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
        p = _place(initial_weight(i, s, dtype), layout, mesh, device)
        opt = _optimizer(layout, [p], mesh)
        p.grad = _place(gradient(i, 0, replica, s, dtype), layout, mesh, device)
        with record_collectives() as ledger:
            opt.step()
        out.append(_volume(ledger))
    return _max_over_ranks(out)


def _check_layout(layout: Layout, mesh_shape, mesh, dtype_name: str, plan: Plan, device) -> dict | None:
    """Step the layout on this rank; on rank 0 the row of the report, None elsewhere."""
    from ortho_fast.distributed.comm import record_collectives

    rank, dtype = dist.get_rank(), getattr(torch, dtype_name)
    replica, replicas = _replica(layout, mesh)
    params = [_place(initial_weight(i, s, dtype), layout, mesh, device) for i, s in enumerate(plan.matrices)]
    opt = _optimizer(layout, params, mesh)
    ref = None
    if rank == 0:
        key = (layout.optimizer, layout.check == "blockwise" and (layout.tp_dim, mesh_shape, layout.placements),
               tuple(optimizer_options(layout, distributed=False).items()), dtype_name, replicas, plan.matrices,
               plan.steps)
        if key not in plan.references:
            plan.references[key] = reference(layout, mesh_shape, dtype, plan.matrices, plan.steps, replicas, device)
        ref = plan.references[key]
    errors: dict[str, float] = {}
    bitwise, identical, steps = True, True, []
    for step in range(plan.steps):
        for i, (p, s) in enumerate(zip(params, plan.matrices)):
            p.grad = _place(gradient(i, step, replica, s, dtype), layout, mesh, device)
        with record_collectives() as ledger, _planted(plan.plant):
            opt.step()
        steps.append((ledger.total_numel(), ledger.total_bytes()))
        state = _state(opt, params, layout.optimizer)
        # every rank must hold the same full weights and state (only rank 0's are compared with one
        # process; a plain or replicated copy on another rank could diverge unseen); compressed
        # sync: the weights and Q, each replica keeps its own momentum
        shared = state["weights"] + state.get("Q", []) if layout.check == "compressed" else sum(state.values(), [])
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, _digest(shared))
        identical &= len(set(everyone)) == 1
        if layout.check == "compressed":
            state["momentum"] = _world_mean(state["momentum"], device)
        if rank == 0:
            for key, tensors in state.items():
                for got, want in zip(tensors, ref[step][key]):
                    errors[key] = max(errors.get(key, 0.0), _relative(got, want))
                    bitwise &= torch.equal(got, want)
    if layout.check == "compressed":
        opt.synchronize_for_checkpoint()
        synced = [_full(opt.state[p]["momentum"]) for p in params]
        if rank == 0:
            errors["momentum after sync"] = max(_relative(g, w) for g, w in zip(synced, ref[-1]["momentum"]))
    steps = _max_over_ranks(steps)
    volumes = _matrix_volumes(layout, mesh, dtype, plan, device)
    if rank != 0:
        return None
    return _row(layout, mesh_shape, dtype_name, plan, errors, bitwise, identical, steps, volumes)


def _comm_verdict(measured: int, analytic: int | None, padded: int | None) -> str:
    if analytic is None:
        return "no formula"
    return "exact" if measured == analytic else "padding" if analytic < measured <= padded else "MISMATCH"


def _row(layout, mesh_shape, dtype_name, plan, errors, bitwise, identical, steps, volumes) -> dict:
    tol = sharded_tolerance(dtype_name)
    worst = max(errors.values())
    matrices = []
    for shape, (numel, nbytes) in zip(plan.matrices, volumes):
        analytic = analytic_volume(layout, mesh_shape, shape)
        padded = analytic_volume(layout, mesh_shape, shape, padded=True)
        matrices.append(dict(shape=list(shape), numel=numel, bytes=nbytes, analytic=analytic, padded=padded,
                             verdict=_comm_verdict(numel, analytic, padded)))
    verdicts = {m["verdict"] for m in matrices}
    comm_verdict = next(v for v in ("MISMATCH", "no formula", "padding", "exact") if v in verdicts)
    notes = []
    if layout.bitwise and not bitwise:
        notes.append("not bitwise equal (required: same operations as one process)")
    if not identical:
        notes.append("weights or state differ between ranks")
    if comm_verdict == "MISMATCH":
        notes.append("measured communication differs from the analytic volume")
    ok = worst <= tol and (bitwise or not layout.bitwise) and identical and comm_verdict != "MISMATCH"
    return dict(
        world_size=dist.get_world_size(), optimizer=layout.optimizer, layout=layout.name, mesh=list(mesh_shape),
        dims=list(layout.dims), placements=list(layout.placements) if layout.placements else None,
        check=layout.check, dtype=dtype_name, errors=errors, worst=worst, bound=tol, bitwise=bitwise,
        bitwise_required=layout.bitwise, replicas_identical=identical,
        status="pass" if ok else "FAIL", notes=notes, plant=plan.plant,
        comm=dict(numel=sum(m["numel"] for m in matrices), bytes=sum(m["bytes"] for m in matrices),
                  analytic=None if "no formula" in verdicts else sum(m["analytic"] for m in matrices),
                  verdict=comm_verdict, matrices=matrices, step_numel=[s[0] for s in steps],
                  step_bytes=[s[1] for s in steps]),
    )


# ---------------------------------------------------------------------------------------
# Launch: gloo workers, or in-process under torchrun.
# ---------------------------------------------------------------------------------------


def _worker(rank: int, world_size: int, plan: Plan) -> list[dict] | None:
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
            rows.append(_check_layout(layout, shape, mesh, dtype_name, plan, device))
    return rows if rank == 0 else None


def under_torchrun() -> bool:
    """True when this process is one rank of a launched job (torchrun's RANK / WORLD_SIZE, or a
    process group already initialized)."""
    return dist.is_initialized() or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def run(world_size: int | None = None, *, dtypes: Sequence[str] = DTYPES, quick: bool = False,
        layouts: Sequence[str] | None = None, plant: str | None = None, timeout: float = TIMEOUT) -> list[dict]:
    """Check every layout that fits ``world_size`` (see ``layouts_for``; ``layouts`` filters by
    name); returns one row per (layout, dtype) with "status" "pass" / "FAIL", the relative
    Frobenius differences per quantity ("errors", "worst"), the contract ("bound"), and "comm"
    (measured elements per step and rank, the analytic volume).

    Without a process group: forks ``world_size`` gloo workers on CPU (``run_workers``, killed
    after ``timeout`` seconds). Under torchrun: runs in this process on the launched world
    (``world_size`` None or equal to it; NCCL + CUDA if available, else gloo), and returns the
    rows on rank 0, [] elsewhere. ``plant``: a key of ``PLANTS`` (a bug the checks must catch).
    Raises: ValueError for a bad ``world_size``, an unknown dtype or plant, or a filter matching
    no layout; TimeoutError / ortho_verify.workers.WorkerError from the launch.
    """
    for d in dtypes:
        sharded_tolerance(d)  # ValueError naming the dtype
    if plant is not None and plant not in PLANTS:
        raise ValueError(f"plant: expected one of {sorted(PLANTS)} or None, got {plant!r}")
    launched = under_torchrun()
    if launched:
        if not dist.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            dist.init_process_group(backend)
        if world_size is not None and world_size != dist.get_world_size():
            raise ValueError(f"world_size: {world_size} given, but torchrun launched {dist.get_world_size()} ranks")
        world_size = dist.get_world_size()
    elif world_size is None:
        raise ValueError("world_size: required unless running under torchrun")
    chosen = layouts_for(world_size, layouts)
    if not chosen:
        raise ValueError(f"layouts: no layout matches {list(layouts or [])} at world size {world_size}")
    plan = Plan(chosen, tuple(dtypes), QUICK_MATRICES if quick else MATRICES, QUICK_STEPS if quick else STEPS, plant)
    if launched:
        return _worker(dist.get_rank(), world_size, plan) or []
    return run_workers(world_size, _worker, plan, timeout=timeout)[0]


# ---------------------------------------------------------------------------------------
# Communication: the analytic volume of each layout.
# ---------------------------------------------------------------------------------------


def _sharding(layout: Layout, mesh_shape: tuple[int, ...], role: str) -> tuple[int, int | None]:
    """(size, tensor dim it shards or None) of the mesh dim given to the optimizer argument ``role``;
    (1, None) if the layout has none. A dim of one rank issues no collective."""
    dim = dict(layout.roles).get(role)
    if dim is None:
        return 1, None
    d = layout.dims.index(dim.partition(":")[0])
    code = "R" if layout.placements is None else layout.placements[d]
    return mesh_shape[d], None if code == "R" else int(code[-1])


def _padded_shape(layout: Layout, mesh_shape: tuple[int, ...], shape: tuple[int, int]) -> tuple[int, int]:
    """(m, n) rounded up to a multiple of the number of ranks sharding each dim: the largest shard
    times the shard count (``torch.chunk`` shards, nested ceilings ceil(ceil(m/a)/b) = ceil(m/ab))."""
    out = list(shape)
    for d in (0, 1):
        k = math.prod(size for size, code in zip(mesh_shape, layout.placements or ()) if code != "R" and
                      int(code[-1]) == d)
        out[d] = k * math.ceil(shape[d] / k)
    return out[0], out[1]


def analytic_volume(layout: Layout, mesh_shape: tuple[int, ...], shape: tuple[int, int], *,
                    padded: bool = False) -> int | None:
    """Elements one rank's collectives carry in one step of an optimizer holding the (m, n) matrix
    alone, from the distributed optimizer's own formula (``muon_comm_volume`` /
    ``dion_comm_volume``, the Dion paper's Table 1 per layout), for the owner rank (the largest);
    ``padded``: evaluated at ``_padded_shape``, the most that zero-padded uneven shards can add
    (gloo and NCCL gather equal-sized blocks). Muon's formula counts that padding itself (its
    largest blocks), so for Muon ``padded`` changes nothing: the ledger must equal the formula
    for every shape. None where no formula exists (yet)."""
    m, n = _padded_shape(layout, mesh_shape, shape) if padded and layout.optimizer != "muon" else shape
    if layout.optimizer == "muon":
        from ortho_fast.distributed.muon import muon_comm_volume

        dp_size, dp_dim = _sharding(layout, mesh_shape, "distributed_mesh")
        tp_size, tp_dim = _sharding(layout, mesh_shape, "tp_mesh")
        dp = None if dp_size == 1 else "ddp" if dp_dim is None else "fsdp"
        tp_mode = optimizer_options(layout).get("tp_mode", "duplicated") if tp_size > 1 else None
        return sum(muon_comm_volume((m, n), dp=dp, dp_size=dp_size, dp_dim=dp_dim or 0, tp_mode=tp_mode,
                                    tp_size=tp_size, tp_dim=tp_dim or 0).values())
    from ortho_fast.distributed.dion import dion_comm_volume

    shards = [(size, dim) for role in ("outer_shard_mesh", "inner_shard_mesh")
              for size, dim in [_sharding(layout, mesh_shape, role)] if dim is not None]
    opts = optimizer_options(layout)
    variant = {k: opts[k] for k in ("qr_method", "right_factor", "power_iters", "oversample") if k in opts}
    replicas = max(_sharding(layout, mesh_shape, role)[0] for role in ("replicate_mesh", "process_group"))
    return sum(dion_comm_volume(
        m, n, ortho_fast.dion_rank(*shape, opts["rank_fraction"]), row_shards=[s for s, d in shards if d == 0],
        col_shards=[s for s, d in shards if d == 1], replicas=replicas,
        replicate_mesh_grad_sync=opts.get("replicate_mesh_grad_sync", True), **variant).values())


# ---------------------------------------------------------------------------------------
# Reports: terminal table, JSON, markdown, docs/layouts.md.
# ---------------------------------------------------------------------------------------


def _fmt(x: float) -> str:
    return "0" if x == 0 else f"{x:.1e}"


def _comm_cells(row: dict) -> tuple[str, str, str]:
    c = row["comm"]
    return str(c["numel"]), "—" if c["analytic"] is None else str(c["analytic"]), c["verdict"]


HEADERS = ("N", "optimizer", "layout", "mesh", "dtype", "check", "worst rel. diff", "bound", "result",
           "elements/step", "analytic", "comm")


def table_rows(rows: Sequence[dict]) -> list[tuple[str, ...]]:
    """One tuple of ``HEADERS`` cells per report row."""
    out = []
    for r in rows:
        mesh = "×".join(map(str, r["mesh"])) if r["mesh"] else "—"
        dims = f" ({', '.join(r['dims'])})" if r["dims"] else ""
        result = r["status"] + (" (bitwise)" if r["bitwise"] else "")
        out.append((str(r["world_size"]), r["optimizer"], r["layout"], mesh + dims, r["dtype"], r["check"],
                    _fmt(r["worst"]), _fmt(r["bound"]), result, *_comm_cells(r)))
    return out


def print_table(rows: Sequence[dict], console=None) -> None:
    """The rich table of ``table_rows`` (failures in red)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title="ortho-verify sharding: every layout against one process")
    for h in HEADERS:
        table.add_column(h, justify="right" if h in ("worst rel. diff", "bound", "N") else "left")
    for cells, r in zip(table_rows(rows), rows):
        table.add_row(*cells, style=None if r["status"] == "pass" else "bold red")
    console.print(table)


def _merged(rows: Sequence[dict]) -> dict[tuple, list[dict]]:
    """Rows grouped by (world size, optimizer, layout), in report order (one group: its dtypes)."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault((r["world_size"], r["optimizer"], r["layout"]), []).append(r)
    return out


def markdown_tables(rows: Sequence[dict]) -> list[str]:
    """Markdown lines: per world size one table (a line per layout, its dtypes side by side), and
    for the largest world size the communication of each matrix against its formula."""
    dtypes = [d for d in DTYPES if any(r["dtype"] == d for r in rows)]
    groups = _merged(rows)
    lines = []
    for world in sorted({key[0] for key in groups}):
        lines += [f"### World size {world}", "",
                  "| optimizer | layout | mesh (dims) | placements | check | " + " | ".join(
                      f"{d} rel. diff (≤ {_fmt(sharded_tolerance(d))})" for d in dtypes)
                  + " | result | elements/step | analytic | bytes/step (" + dtypes[0] + ") | comm |",
                  "|" + "---|" * (10 + len(dtypes))]
        for (w, opt, name), group in groups.items():
            if w != world:
                continue
            first, by_dtype = group[0], {r["dtype"]: r for r in group}
            mesh = "×".join(map(str, first["mesh"])) + f" ({', '.join(first['dims'])})" if first["mesh"] else "—"
            result = "pass" if all(r["status"] == "pass" for r in group) else "**FAIL**"
            result += " (bitwise)" if all(r["bitwise"] for r in group) else ""
            diffs = [_fmt(by_dtype[d]["worst"]) if d in by_dtype else "—" for d in dtypes]
            numel, analytic, verdict = _comm_cells(first)
            lines.append(f"| {opt} | {name} | {mesh} | {', '.join(first['placements'] or ['plain'])} | "
                         f"{first['check']} | {' | '.join(diffs)} | {result} | {numel} | {analytic} | "
                         f"{first['comm']['bytes']} | {verdict} |")
        lines.append("")
    world = max(key[0] for key in groups)
    shapes = [tuple(m["shape"]) for m in rows[0]["comm"]["matrices"]]
    lines += [f"### Communication per matrix at world size {world} (measured / analytic elements)", "",
              "| optimizer | layout | " + " | ".join(f"{m}×{n}" for m, n in shapes) + " |",
              "|" + "---|" * (2 + len(shapes))]
    for (w, opt, name), group in groups.items():
        if w == world:
            cells = [f"{m['numel']} / {m['analytic']}" + ("" if m["verdict"] == "exact" else f" ({m['verdict']})")
                     for m in group[0]["comm"]["matrices"]]
            lines.append(f"| {opt} | {name} | " + " | ".join(cells) + " |")
    return lines + [""]


def markdown_report(rows: Sequence[dict], meta: dict) -> str:
    """Markdown: the run's metadata and ``markdown_tables``."""
    return "\n".join(["# ortho-verify sharding report", "", *[f"- {k}: {v}" for k, v in meta.items()], "",
                      *markdown_tables(rows)])


def build_parser() -> argparse.ArgumentParser:
    """The ``ortho-verify sharding`` command line."""
    parser = argparse.ArgumentParser(
        prog="ortho-verify sharding",
        description="Check every distributed layout of Dion and Muon (DDP, FSDP, TP, HSDP and their combinations) "
                    "against the one-process optimizer on the full tensors, and count each step's communication "
                    "against the analytic volume. Starts gloo workers on CPU, or runs in-process under torchrun.")
    parser.add_argument("--world-size", type=int, nargs="+", default=[4], metavar="N",
                        help="world size(s) to run, each one launch (default: 4; ignored under torchrun)")
    parser.add_argument("--dtype", choices=DTYPES, action="append", help="dtype(s) to check (default: both)")
    parser.add_argument("--layout", action="append", metavar="NAME",
                        help="only layouts whose 'optimizer/name' contains NAME (repeatable)")
    parser.add_argument("--quick", action="store_true",
                        help=f"{len(QUICK_MATRICES)} matrices and {QUICK_STEPS} steps instead of "
                             f"{len(MATRICES)} and {STEPS}")
    parser.add_argument("--out", type=Path, default=Path("ortho-verify-out"),
                        help="folder for sharding.json and sharding.md (default: ./ortho-verify-out)")
    parser.add_argument("--write-docs", action="store_true",
                        help=f"also write docs/layouts.md; runs world sizes {' '.join(map(str, DOCS_WORLD_SIZES))} "
                             "besides those given (the page covers them all); not with --quick, --layout, --dtype, "
                             "nor under torchrun")
    parser.add_argument("--timeout", type=float, default=TIMEOUT,
                        help=f"seconds per launch before the workers are killed (default {TIMEOUT:g})")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks; returns 0 if every layout passed, 1 otherwise (2: bad arguments, from argparse)."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    if any(n < 1 for n in args.world_size):
        build_parser().error("--world-size: each N must be >= 1")
    if args.write_docs and (args.quick or args.layout or args.dtype):
        build_parser().error("--write-docs documents the full run: drop --quick, --layout and --dtype")
    if args.write_docs and under_torchrun():  # one launched world size, the page covers all of DOCS_WORLD_SIZES
        build_parser().error("--write-docs runs world sizes 1 2 4 8 as gloo workers: run it without torchrun")
    dtypes = tuple(args.dtype or DTYPES)
    started = time.perf_counter()
    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=220)
    rows, seconds = [], {}
    wanted = sorted(set(args.world_size) | set(DOCS_WORLD_SIZES if args.write_docs else ()))
    sizes = [None] if under_torchrun() else [n for n in wanted if layouts_for(n, args.layout)]
    if not sizes:
        build_parser().error(f"--layout: no layout matches {args.layout} at world sizes {args.world_size}")
    for n in sizes:
        begun = time.perf_counter()
        try:
            rows += run(n, dtypes=dtypes, quick=args.quick, layouts=args.layout, timeout=args.timeout)
        except (TimeoutError, WorkerError, ValueError) as err:  # a hang, a rank that raised, no layout under torchrun
            console.print(f"[bold red]world size {n}: {type(err).__name__}: {err}[/]")
            return 1
        seconds[n or dist.get_world_size()] = round(time.perf_counter() - begun, 1)
    if under_torchrun() and dist.get_rank() != 0:
        return 0
    print_table(rows, console)
    elapsed = time.perf_counter() - started
    failed = [r for r in rows if r["status"] != "pass"]
    meta = {"command": " ".join(["ortho-verify sharding", *(argv if argv is not None else sys.argv[1:])]),
            "backend": dist.get_backend() if dist.is_initialized() else "gloo (forked CPU workers)",
            "matrices": QUICK_MATRICES if args.quick else MATRICES, "steps": QUICK_STEPS if args.quick else STEPS,
            "elapsed_s": round(elapsed, 1), "seconds_per_world_size": seconds, "python": platform.python_version(), "torch": torch.__version__,
            "machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs"}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sharding.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str))
    (args.out / "sharding.md").write_text(markdown_report(rows, meta))
    if args.write_docs:
        DOCS_PATH.write_text(layouts_doc(rows, meta))
    style = "bold red" if failed else "green"
    console.print(f"[{style}]{len(rows) - len(failed)} of {len(rows)} layout checks passed[/] in {elapsed:.1f} s. "
                  f"Reports: {args.out / 'sharding.json'}, {args.out / 'sharding.md'}"
                  + (f", {DOCS_PATH}" if args.write_docs else ""))
    return 1 if failed else 0


_DOC = """\
# Distributed layouts of Dion and Muon

Generated by `ortho-verify sharding --write-docs` (`verify/sharding.py`, world sizes 1, 2, 4 and
8); the tables below are that run's output. `ortho-verify sharding --world-size N` runs the same
checks on N gloo workers on CPU; under `torchrun` the module runs in-process (NCCL on GPUs).

## What is checked

Every layout steps the same matrices {matrices} ({steps} steps, seeded N(0, 1) gradients,
weights N(0, 1/n)) with the distributed optimizer on DTensors (`distribute_tensor` with the
placements FSDP2 and tensor parallelism produce) and with the same optimizer in one process
on the full tensors. The shapes are even at 2, 4 and 8 ranks (16×24), uneven (13×7) and
sharded into empty blocks (5×11 over 8 ranks); tall and wide, so Dion works on the matrix and on
its transpose. Options: Dion `{dion}` (Householder QR unless the layout names another method),
Muon `{muon}` (Newton–Schulz in the parameter's dtype).

After every step every rank assembles the full weights and state (`DTensor.full_tensor()`)
and the largest relative Frobenius difference ‖X_sharded − X_one‖_F / ‖X_one‖_F over the
weights, the momentum and Q, all matrices and steps, must stay within DESIGN.md's contract,
`ortho_verify.tolerances.sharded_tolerance`: float64 ≤ 1e-12, float32 ≤ 1e-5 (its derivation is in
[tolerances.md](tolerances.md#sharded-vs-one-process-sharded_tolerance)). Three kinds of check:

- **equal**: every rank is fed the same gradient; the sharded step must equal one process, and
  every rank must hold the same full weights and state (their digests are compared: rank 0's
  copy alone is compared with one process).
  Where the sharded step performs the very operations of one process (Muon FSDP, DDP, TP
  "duplicated" and "blockwise"; Dion DDP with the gradients already averaged, which
  communicates nothing) the equality must be bitwise ("pass (bitwise)").
- **compressed**: Dion's compressed data-parallel sync (Ahn et al., arXiv 2504.05295, Sec. 3):
  each data-parallel replica is fed its own gradient. The weights and Q must be bitwise
  identical on every replica; the mean of the replicas' momenta must equal the momentum of one
  process fed the mean gradient (by linearity: the replicas average P and R, and each keeps
  its own error feedback); the weights and Q must equal that process's; after
  `synchronize_for_checkpoint()` every replica's momentum must equal it too.
- **blockwise**: Muon's TP mode "blockwise" is layout-dependent by design (Megatron /
  NVIDIA Emerging-Optimizers `newton_schulz_tp`): it is checked against its own definition,
  one-process Muon stepping each TP shard as a parameter of its own (scaled by the shard's shape).

A check must be able to fail: `tests/verify/test_sharding.py` plants a skipped all-reduce,
gathered blocks placed one rank over (a wrong shard offset), scattered blocks sent one rank over,
and a broadcast that reaches rank 0 only (the other DDP copies diverge), and requires those
layouts to fail.

## How Dion computes each layout (`ortho_fast/distributed/dion.py`)

Every rank runs the one-process step on its block B[I][:, J] of the working matrix B (m′, n′)
= (max(m, n), min(m, n)) — transposed when the *global* shape is wide, never because of the
sharding — and makes the sums over sharded dimensions global (Ahn et al., Algorithms 2–3):

- P = orth(B Q): the partial products B[I][:, J] Q[J] are all-reduced over the axes sharding
  the working columns ("P"); with rows sharded, P's rows are orthonormalized together:
  Householder gathers P ("gather_P", m′·r), CholeskyQR2 all-reduces each pass's r×r Gram
  ("gram", 2r²), randomized CholeskyQR the k×r sketch S P and one Gram (k = ⌈1.25 r⌉; the
  sketch is drawn at the global size, the same numbers as one process).
- R = Bᵀ P: all-reduced over the axes sharding the working rows ("R", n′·r).
- Q = R / ‖R[:, j]‖: the r column norms are all-reduced over the column axes ("norms");
  Orth-Dion's QR of R gathers R ("gather_R").
- Error feedback M ← B − (1 − μ) P Rᵀ and the update X ← X − lr·√(m/n)·P Qᵀ are local.

So a layout sharding the working columns only (FSDP or TP on the dim that becomes n′) moves
m′·r + r: the Dion paper's Table 1 weight-sharding volume (m + 1) r. Sharding the working rows
moves n′·r for R plus the orthonormalization of P's rows (m′·r with Householder, 2r² with
CholeskyQR2). The layouts:

- **DDP** (`replicate_mesh`, or `process_group` for plain tensors): compressed sync, P (before
  the orthonormalization) and R averaged over the replicas: (m′ + n′) r per matrix, Table 1's
  data-parallel volume (m + n) r, instead of the m n of a gradient all-reduce.
  **DDP, grads synced** (`replicate_mesh_grad_sync=False`): the gradients were averaged by DDP
  already; every replica computes the one-process step, no optimizer communication.
- **FSDP** (`outer_shard_mesh`, FSDP2's `Shard(0)`) and **TP colwise** (`inner_shard_mesh`,
  `Shard(0)`) shard the parameter's rows: the working columns of a wide matrix, the working rows
  of a tall one. **TP rowwise** (`Shard(1)`) shards the parameter's columns.
- **HSDP** (`replicate_mesh` × `outer_shard_mesh`, placements (Replicate, Shard(0))): FSDP
  within a replica plus the compressed sync of P and R across replicas; "grads synced" is
  OLMo-core's setting (FSDP2 all-reduces the gradients over the replicate dim).
- **FSDP + TP**: rowwise TP gives (Shard(0), Shard(1)), each dim sharded by one axis; colwise
  TP under FSDP2 gives (`_StridedShard(0, split_factor=tp)`, Shard(0)): one dim sharded by
  both axes, each TP rank's block the contiguous chunk tensor parallelism made, split further
  by FSDP. The sums run over each axis in turn; P is gathered over both.
- **HSDP + TP**: all three axes.
- Variants with their own collectives: randomized CholeskyQR (microsoft/dion's default) and
  CholeskyQR2 on sharded rows, Orth-Dion (the QR right factor) on sharded columns.

## How Muon computes each layout (`ortho_fast/distributed/muon.py`)

The momentum is elementwise on each rank's block. Each matrix has an owner on
`distributed_mesh` (round-robin by parameter index, as microsoft/dion's Muon):

- **FSDP** (a DTensor sharded on `distributed_mesh`): the blocks of the momentum U are gathered
  to the owner ("U", m n), the owner runs the one-process Newton–Schulz on the whole matrix,
  and scatters the result back ("O", m n): 2 m n per matrix, both directions of Table 1's
  m n for Muon under weight sharding.
- **DDP** (plain tensors or Replicate on `distributed_mesh`, a DeviceMesh or a ProcessGroup):
  every rank holds U; the owner orthogonalizes and broadcasts the result (m n). The gradient
  all-reduce that DDP does before the step (Table 1's data-parallel m n) is not the optimizer's.
- **TP** (`tp_mesh`, colwise `Shard(0)` / rowwise `Shard(1)`), by `tp_mode`: "duplicated"
  all-gathers the TP shards (m n) and every TP rank orthogonalizes the whole matrix, keeping
  its part; "distributed" runs Newton–Schulz on the shards, all-reducing the d×d Gram matrix
  each of the 5 steps (d the dimension that is not sharded) plus max|X| and ‖X‖_F² for the
  normalization: 5 d² + 2; "blockwise" orthogonalizes each shard alone, no communication.
- **FSDP + TP** (`distributed_mesh` × `tp_mesh`): the owner's dp position gathers each TP
  block (m n / tp) over the dp axis, runs the TP mode among the TP ranks at that position, and
  scatters back.
- Uneven shapes: the gathered, scattered and all-gathered blocks travel zero-padded to the
  largest shard (⌈m/p⌉ rows of m over p ranks, `torch.chunk`'s blocks); `muon_comm_volume`
  counts them so.

FSDP, DDP, "duplicated" and "blockwise" orthogonalize the very matrices one process does with
the same call, so they are bitwise equal; "distributed" sums the Gram matrix in another order.

## Counting communication

Every collective goes through `ortho_fast.distributed.comm` and is recorded in a `Ledger`
(op, axis, group size, elements, bytes, dtype, tag). The convention is the Dion paper's Table 1:
a collective counts its *logical tensor* — an all-reduce of an (m, r) tensor m·r elements, an
all-gather, gather or scatter the whole assembled tensor (every shard, padding included), a
broadcast the tensor once — and bytes are elements × the element size of the dtype that
travelled. What a ring algorithm puts on each link (2(p − 1)/p of an all-reduce) is a property
of the backend and is not counted. A group of one rank issues nothing.

"elements/step" is measured per matrix — one step of an optimizer holding that matrix alone, so
every collective is attributed to it — on the rank whose ledger is largest (the owner), summed
over the matrices. The small per-step flags (Muon's "check": 1 + (parameters) per axis; Dion's
"flags": 1 + 2·(parameters) per axis, `dion_check_volume`) are left out. "analytic" is the
distributed optimizer's own formula (`muon_comm_volume`, `dion_comm_volume`) summed the same way.
"comm" is **exact** when measured = analytic for every matrix. Muon's formula counts the zero
padding of uneven shards (gloo and NCCL gather equal-sized blocks, so uneven blocks travel padded
to the largest, ⌈m/p⌉ rows): every Muon layout must be exact for every shape. Dion's formula
counts m // p rows, so Dion must be exact where the sharded dims divide evenly (e.g. 16×24) and
may be **padding** for a matrix with uneven shards that measured more, but no more than the
formula evaluated at its padded shape (each sharded dim rounded up to a multiple of its shard
count); anything else is a **MISMATCH** and fails the layout.

## Results

"""


def layouts_doc(rows: Sequence[dict], meta: dict) -> str:
    """docs/layouts.md: what is checked, how each layout computes and communicates, the byte
    convention, and the run's tables (``markdown_tables``)."""
    head = _DOC.format(matrices=", ".join(f"{m}×{n}" for m, n in meta["matrices"]), steps=meta["steps"],
                       dion=", ".join(f"{k}={v}" for k, v in DION_OPTIONS.items()),
                       muon=", ".join(f"{k}={v}" for k, v in MUON_OPTIONS.items()))
    return head + "\n".join([*[f"- {k}: {v}" for k, v in meta.items()], "", *markdown_tables(rows)])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
