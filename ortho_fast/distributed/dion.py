"""Dion over DeviceMesh / DTensor / ProcessGroup: the one-process step on local blocks.

Every rank runs ``ortho_fast.dion``'s step (``_dion_apply``) on its block B[I][:, J] of the
working matrix B (m', n') — the momentum plus gradient, transposed when the GLOBAL shape has
m < n, never because of the sharding (microsoft/dion lets FSDP's Shard(0) pick the
orientation, so its result depends on the layout) — with the sums over sharded dimensions
made global (Ahn et al., arXiv 2504.05295: the compressed data-parallel sync and the sharded
variant of the paper's distributed Dion):

- P = orth(B Q): the partial products B[I][:, J] Q[J] are all-reduced over the axes sharding
  the columns J (sum), with ``replicate_mesh_grad_sync`` also averaged over the replicas
  (compressed data-parallel sync, P = orth(mean_i B_i Q)); the rows I of P are then made
  orthonormal together: ``householder`` gathers P over the axes sharding the rows and runs
  the one-process Householder QR (the same algorithm on the same matrix up to the order of
  the sums); ``cholesky_qr`` all-reduces the r×r Gram of each CholeskyQR pass, with the
  one-process Householder fallback decided on every rank from the global Gram;
  ``randomized_cholesky_qr`` draws the sketch at the global size k × m' (the same numbers as
  one process), multiplies this rank's columns of it, and all-reduces S P (k × r) and the Gram.
- R = Bᵀ P: the partial products are all-reduced over the axes sharding the rows (and
  averaged over the replicas when syncing).
- Q = R / ‖R[:, j]‖: the r column norms are all-reduced over the axes sharding the columns;
  Orth-Dion's QR of R gathers R like the Householder P.
- Error feedback and the weight update are local.

Q0 is ``initial_q`` of the global shape sliced to this rank's rows of Q; the sketches come from
``sketch_generator(seed, index, step)`` at the global size. So every layout computes the
one-process update to rounding (docs/design.md, "Distributed layouts and the layout contract": float64 relative
Frobenius <= 1e-12, float32 <= 1e-5, ``ortho_verify.tolerances.sharded_tolerance``). Whether B = 0 anywhere
(one process then skips the update), whether each rank's gradient is finite and whether the
state is well formed are decided for all parameters at once by one small all-reduce per
mesh axis, so a bad input raises on every rank and never hangs a collective.

Every collective goes through ``ortho_fast.distributed.comm`` and is recorded in its ledger;
``dion_comm_volume`` gives the analytic volume of each layout.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import torch
import torch.distributed as dist

from ..functional.dion import initial_q
from ..functional.qr import WHOLE, WholeDim, householder
from ..groups.dion import (
    cached_dion_plan,
    check_planned,
    dion_state_dtype,
    init_dion_state,
    param_rank,
    step_block,
)
from ..groups.driver import GroupRunner, describe_groups
from ..validation import FiniteCheck, is_dtensor, local_tensor
from .comm import all_gather_blocks, all_reduce, all_reduce_axes, broadcast, raise_together
from .layout import (
    LayoutError,
    MatrixLayout,
    MeshAxis,
    check_axes,
    dim_indices,
    flat_indices,
    matrix_layout,
    mesh_axis,
)

__all__ = ["DionMeshes", "ShardedDim", "DionPlan", "ShardedDionGroups", "resolve_dion_meshes", "dion_plan",
           "init_sharded_state", "sharded_dion_step", "synchronize_replicas"]


@dataclass(frozen=True)
class DionMeshes:
    """The mesh axes a distributed ``Dion`` was given (``resolve_dion_meshes``).

    ``replicate`` (DDP, the replicate dim of HSDP; from ``replicate_mesh`` or
    ``process_group``), ``outer`` (FSDP), ``inner`` (TP); ``sync`` is
    ``replicate_mesh_grad_sync``; ``from_process_group`` whether ``replicate`` came from
    ``process_group`` (then every parameter must be a plain tensor).
    """

    replicate: MeshAxis | None
    outer: MeshAxis | None
    inner: MeshAxis | None
    sync: bool
    from_process_group: bool = False

    @property
    def roles(self) -> dict[str, MeshAxis | None]:
        return {"replicate": self.replicate, "outer": self.outer, "inner": self.inner}

    @property
    def replica(self) -> MeshAxis | None:
        """The axis Dion averages P and R over (compressed sync), or None."""
        rep = self.replicate
        return rep if self.sync and rep is not None and rep.size > 1 else None

    @property
    def check_axes(self) -> tuple[MeshAxis, ...]:
        """The axes the per-step checks are agreed over: every axis of more than one rank, the
        replicate axis too without compressed sync (its replicas step the same parameters and
        must raise together)."""
        return tuple(a for a in (self.replicate, self.outer, self.inner) if a is not None and a.size > 1)

    @property
    def comm_axes(self) -> tuple[MeshAxis, ...]:
        """The axes the per-step checks are reduced over: every axis this optimizer communicates on."""
        return tuple(a for a in (self.replica, self.outer, self.inner) if a is not None and a.size > 1)

    def replica_mean(self, t: torch.Tensor, tag: str) -> torch.Tensor:
        """In-place mean of ``t`` over the replicas (a no-op without compressed sync)."""
        axis = self.replica
        if axis is None:
            return t
        return all_reduce(t, axis, tag=tag).div_(axis.size)


def resolve_dion_meshes(replicate_mesh=None, outer_shard_mesh=None, inner_shard_mesh=None,
                        replicate_mesh_grad_sync: bool = True, process_group=None) -> DionMeshes | None:
    """The ``DionMeshes`` of ``Dion``'s distribution arguments; None when none is given (one process).

    Each mesh is a 1-D DeviceMesh (e.g. ``world_mesh["dp"]``) or a ProcessGroup;
    ``process_group`` (DDP with plain tensors) is the replicate axis and excludes the meshes.
    Raises (before any state exists): TypeError naming ``replicate_mesh_grad_sync`` (not a
    bool) or ``process_group`` (not a ProcessGroup); ValueError naming ``process_group`` when
    given with a mesh argument; LayoutError naming the mesh argument for a mesh that is not 1-D,
    that this rank is not part of, or that overlaps another (``layout.check_axes``);
    RuntimeError if torch.distributed is not initialized.
    """
    if not isinstance(replicate_mesh_grad_sync, bool):
        raise TypeError(f"replicate_mesh_grad_sync: expected a bool, got {replicate_mesh_grad_sync!r}")
    meshes = (replicate_mesh, outer_shard_mesh, inner_shard_mesh)
    if process_group is not None:
        if any(m is not None for m in meshes):
            raise ValueError("process_group: pass either process_group (DDP over plain tensors) or the mesh arguments "
                             "(replicate_mesh, outer_shard_mesh, inner_shard_mesh), not both")
        if not isinstance(process_group, dist.ProcessGroup):
            raise TypeError("process_group: expected a torch.distributed.ProcessGroup, got "
                            f"{type(process_group).__name__}")
        return DionMeshes(mesh_axis(process_group, "process_group"), None, None, replicate_mesh_grad_sync, True)
    if all(m is None for m in meshes):
        return None
    axes = [mesh_axis(m, name) for m, name in zip(meshes, ("replicate_mesh", "outer_shard_mesh", "inner_shard_mesh"))]
    check_axes(axes)
    return DionMeshes(*axes, replicate_mesh_grad_sync)


class ShardedDim(WholeDim):
    """One dimension of the working matrix sharded over mesh axes (the interface of
    ``ortho_fast.functional.qr.WholeDim``, here with collectives).

    ``index``: this rank's global indices along the dimension (int64, possibly empty or
    strided); ``axes``: the axes sharding it, in mesh-dim order; ``length``: its global length.
    ``sum`` all-reduces over the axes; ``gather`` assembles the whole (total, r) matrix from
    every rank's rows (one all-gather per axis, uneven blocks padded).
    """

    def __init__(self, layout: MatrixLayout, which: int, gather_tag: str):
        self.layout, self.which, self.gather_tag = layout, which, gather_tag
        self.index = (layout.rows, layout.cols)[which]
        self.axes = (layout.row_axes, layout.col_axes)[which]
        self.length = layout.shape[which]

    def total(self, y: torch.Tensor) -> int:
        return self.length

    def sum(self, t: torch.Tensor, tag: str) -> torch.Tensor:
        return all_reduce_axes(t, self.axes, tag=tag)

    def all_finite(self, p: torch.Tensor, needed: bool = True) -> torch.Tensor:
        if not needed:
            return torch.ones((), dtype=torch.bool, device=p.device)
        bad = torch.isfinite(p).logical_not().any().to(p.dtype).reshape(1)
        return self.sum(bad, "finite")[0] == 0

    def sketch(self, s: torch.Tensor) -> torch.Tensor:
        return s[:, self.index.to(s.device)]

    def householder(self, y: torch.Tensor) -> torch.Tensor:
        return householder(self.gather(y))[self.index.to(y.device)]

    def column_norms(self, rf: torch.Tensor) -> torch.Tensor:
        """‖rf[:, j]‖₂ of the whole matrix per column, (1, r), in rf's dtype: each rank sums its
        block's squares in float64 and the r sums are all-reduced in float64 ("norms": the same
        r numbers per axis as before, 8 bytes each). Finite float32 / bfloat16 / float16 entries
        cannot overflow these squares (at most 1.2e77), so a float32 gradient with entries above
        1.8e19 gives no infinite norm, Q = 0 and a zero update forever (the one-process
        ``WholeDim.column_norms`` scales by a power of two instead: that needs the global
        maximum, one more collective). float64 blocks sum in float64 (entries above 1.3e154
        would overflow there)."""
        squares = rf.to(torch.float64).square().sum(dim=0, keepdim=True)
        return self.sum(squares, "norms").sqrt().to(rf.dtype)

    @cached_property
    def _gather_plan(self) -> tuple[list[tuple[int, ...]], torch.Tensor]:
        """Per axis, the block lengths of its ranks after the previous axes were gathered, and
        the global indices of the gathered rows in gathered order."""
        held: list[dict[str, int]] = [{}]
        sizes = []
        for axis in self.axes:
            sizes.append(tuple(sum(len(self.layout.peer({**pos, axis.name: j})[self.which]) for pos in held)
                               for j in range(axis.size)))
            held = [{**pos, axis.name: j} for j in range(axis.size) for pos in held]
        order = torch.cat([self.layout.peer(pos)[self.which] for pos in held])
        return sizes, order

    def gather(self, y: torch.Tensor) -> torch.Tensor:
        """The whole (total, r) matrix whose rows ``index`` this rank holds in ``y``."""
        sizes, order = self._gather_plan
        for axis, lengths in zip(self.axes, sizes):
            y = torch.cat(all_gather_blocks(y, axis, [(k, y.shape[1]) for k in lengths], tag=self.gather_tag))
        full = y.new_empty((self.length, y.shape[1]))
        full[order.to(y.device)] = y
        return full


@dataclass(frozen=True)
class DionPlan:
    """How one parameter is stepped: ``shape`` (m, n) of its global matrix; ``local_shape`` its
    block (|I|, |J|) in the parameter's orientation; ``rows`` / ``cols`` the working
    orientation's dimensions (``WHOLE`` or a ``ShardedDim``); ``q_index`` this rank's rows of Q;
    ``q_placements`` Q's placements on the parameter's mesh (None for a plain tensor)."""

    shape: tuple[int, int]
    local_shape: tuple[int, int]
    rows: WholeDim
    cols: WholeDim
    q_index: torch.Tensor
    q_placements: tuple | None


def _q_placements(param, transposed: bool) -> tuple:
    """Q's placements: the kind (Shard / _StridedShard) of each mesh dim sharding the working
    column dim of the parameter, on Q's dim 0; Replicate elsewhere. A flattened ndim > 2
    parameter sharded on a trailing dim must give Q's rows the same blocks (checked at every
    coordinate of the sharding mesh dims).
    Raises: LayoutError naming ``param`` when it does not (dim 1 sharded unevenly, or a later dim
    sharded while an earlier trailing dim has size > 1: the columns are then strided)."""
    from torch.distributed.tensor.placement_types import Replicate, Shard, _StridedShard

    mesh, placements, shape = param.device_mesh, tuple(param.placements), tuple(param.shape)
    out = []
    for pl in placements:
        if isinstance(pl, (Shard, _StridedShard)) and (pl.dim % param.ndim == 0) == transposed:
            out.append(_StridedShard(0, split_factor=pl.split_factor) if isinstance(pl, _StridedShard) else Shard(0))
        else:
            out.append(Replicate())
    if param.ndim > 2 and not transposed:
        n = math.prod(shape[1:])
        sharding = [d for d, pl in enumerate(out) if not isinstance(pl, Replicate)]
        coordinate = list(mesh.get_coordinate())
        for values in itertools.product(*(range(mesh.size(d)) for d in sharding)):
            for d, v in zip(sharding, values):
                coordinate[d] = v
            cols = flat_indices(dim_indices(shape, tuple(mesh.shape), coordinate, placements)[1:], shape[1:])
            if not torch.equal(cols, dim_indices((n, 1), tuple(mesh.shape), coordinate, out)[0]):
                raise LayoutError(f"param: the flattened parameter of shape {shape} with placements {placements} has "
                                  f"column blocks that no placement of Q ({n}, r) reproduces (each rank's flattened "
                                  f"columns must be the contiguous chunk torch.chunk gives Q's rows); shard dim 0, or "
                                  f"dim 1 with a size the mesh divides")
    return tuple(out)


def dion_plan(param: torch.Tensor, meshes: DionMeshes) -> DionPlan:
    """The ``DionPlan`` of a parameter (plain tensor or DTensor) under ``meshes``.

    Raises (at construction, before any state exists): LayoutError naming ``process_group``
    for a DTensor with ``process_group``, and ``layout.matrix_layout``'s errors (a Partial
    placement, a sharded mesh dim that is none of the given meshes or is the replicate mesh, a
    mesh this rank is not part of), and ``_q_placements``' (uneven trailing-dim shards of a
    flattened parameter).
    """
    if meshes.from_process_group and is_dtensor(param):
        raise LayoutError("process_group: DDP over a ProcessGroup steps plain tensors; got a DTensor parameter of "
                          f"shape {tuple(param.shape)} ({tuple(param.placements)}): pass its meshes as replicate_mesh "
                          f"/ outer_shard_mesh / inner_shard_mesh instead")
    layout = matrix_layout(param, meshes.roles)
    m, n = layout.shape
    transposed = m < n
    work = layout.transposed() if transposed else layout
    rows = ShardedDim(work, 0, "gather_P") if work.row_axes else WHOLE
    cols = ShardedDim(work, 1, "gather_R") if work.col_axes else WHOLE
    q_placements = _q_placements(param, transposed) if is_dtensor(param) else None
    return DionPlan((m, n), layout.local_shape, rows, cols, work.cols, q_placements)


def init_sharded_state(p: torch.Tensor, st: dict, group: dict, plan: DionPlan, *, seed: int, index: int) -> None:
    """Create the missing state of parameter ``p`` (global index ``index``) without communication
    and without changing ``p``: for a DTensor, ``momentum`` zeros with p's mesh and placements
    and ``Q`` the rows ``plan.q_index`` of the one-process Q0 (``initial_q`` of the global
    (min(m, n), r)) as a DTensor with ``plan.q_placements``; ``step`` 0. Plain tensors: as one
    process (``init_dion_state``)."""
    if plan.q_placements is None:
        init_dion_state(p, st, group, seed=seed, index=index)
        return
    from torch.distributed.tensor import DTensor

    local, mesh = p.to_local(), p.device_mesh
    if "momentum" not in st:
        zeros = torch.zeros(local.shape, dtype=dion_state_dtype(group, "momentum", p), device=local.device)
        st["momentum"] = DTensor.from_local(zeros, mesh, p.placements, run_check=False, shape=p.shape,
                                            stride=p.stride())
    if "Q" not in st:
        k, r = min(plan.shape), param_rank(p, group)
        q0 = initial_q((k, r), seed, index, dion_state_dtype(group, "Q", p), local.device)
        st["Q"] = DTensor.from_local(q0[plan.q_index.to(q0.device)].contiguous(), mesh, plan.q_placements,
                                     run_check=False, shape=torch.Size((k, r)), stride=(r, 1))
    if "step" not in st:
        st["step"] = torch.zeros((), dtype=torch.int64)


def _check_block(p: torch.Tensor, st: dict, plan: DionPlan, finite: FiniteCheck | None) -> torch.Tensor:
    """This rank's gradient block of ``p`` after checking that the gradient and any state have
    the parameter's layout (a DTensor's mesh and placements; Q with ``plan.q_placements``) and
    adds the block to ``finite`` (None: finiteness not checked). Raises ValueError naming ``grad`` /
    ``momentum`` / ``Q``."""
    g = p.grad
    if is_dtensor(p):
        if not is_dtensor(g) or g.device_mesh != p.device_mesh or tuple(g.placements) != tuple(p.placements):
            got = f"{tuple(g.placements)} on {g.device_mesh}" if is_dtensor(g) else "a plain tensor"
            raise ValueError(f"grad: expected a DTensor with the parameter's mesh {p.device_mesh} and placements "
                             f"{tuple(p.placements)}, got {got} (reduce a Partial gradient first)")
        for key, placements in (("momentum", tuple(p.placements)), ("Q", plan.q_placements)):
            t = st.get(key)
            if t is not None and not (is_dtensor(t) and t.device_mesh == p.device_mesh
                                      and tuple(t.placements) == placements):
                raise ValueError(f"{key}: expected a DTensor on the parameter's mesh with placements {placements} "
                                 f"(load a checkpoint with torch.distributed.checkpoint into init_state()'s state)")
    elif any(is_dtensor(t) for t in (g, st.get("momentum"), st.get("Q"))):
        raise ValueError(f"grad: the parameter of shape {tuple(p.shape)} is a plain tensor; its grad, momentum and Q "
                         f"must be plain tensors too")
    block = local_tensor(g)
    if finite is not None:
        finite.add(block, f"grad of parameter with shape {tuple(p.shape)}")
    return block


def _nonzero(block: torch.Tensor, st: dict, dtype: torch.dtype) -> torch.Tensor:
    """Whether B = momentum + grad is nonzero on this block (a bool tensor, no host sync), without
    forming B: the rounded sum m + g is zero exactly when m == −g (IEEE addition; the grad cast
    to the momentum dtype, ``dtype``)."""
    g = block.to(dtype)
    mom = st.get("momentum")
    return g.any() if mom is None else (local_tensor(mom) != g.neg()).any()


class ShardedDionGroups(GroupRunner):
    """Runs a distributed ``Dion``'s groups (``GroupRunner`` of ``ortho_fast.groups.driver``):
    ``check`` on every rank together, then ``step`` per group on each rank's block.

    ``check(groups, state, finite)``: on every rank, the group checks (``check_dion_step``'s, from the
    group's plan kept in ``step_plans`` (``groups.dion.cached_dion_plan``), without
    the finiteness test), the gradient's and state's layouts, the finiteness of this rank's
    gradient blocks (``finite``, one host sync), and whether B != 0 on each block; then
    ``comm.raise_together`` over ``meshes.check_axes`` (the replicate axis included without
    compressed sync): 9 numbers per axis (an error flag and the digest of the parameters and
    options, so ranks built or edited differently raise together), then 2N (per parameter "has a
    gradient" and "B != 0").
    ``step(group, state, first_index)``: each parameter with a gradient on its block
    (``step_block`` with the plan's ``rows`` / ``cols`` and the replicas' mean), numbered as in
    one process so its Q0 and sketches are the same.
    Raises (in ``check``, on every rank, before any parameter or state changes): ValueError naming
    what the ranks disagree on (parameters, options); the failing rank's own ValueError /
    TypeError, on the others a ValueError saying another rank rejected its input; ValueError when
    a parameter has a gradient on some ranks and not on others.
    """

    communicates = True

    def __init__(self, plans: dict, meshes: DionMeshes, seed: int) -> None:
        self.plans, self.meshes, self.seed = plans, meshes, seed
        self.step_plans: dict = {}  # id(group) -> its ``groups.dion.DionPlan`` (options, live parameters, kwargs)
        self.checked: dict = {}  # the plans the last ``check`` used, for the steps that follow
        self._nonzero: dict[int, bool] = {}

    def options(self, group: dict):
        return cached_dion_plan(self.step_plans, group).options

    def reset(self) -> None:
        super().reset()
        self.step_plans.clear()
        self.checked = {}

    def agree(self, error: BaseException | None, device=None) -> None:
        """Make a local verdict global (``load_state_dict``: a corrupt shard on one rank): raise
        ``error`` on its rank and ValueError ("another rank rejected") on every other rank of
        ``meshes.check_axes`` (``raise_together``, tag "load"); nothing when every rank passes None."""
        raise_together(error, self.agree_axes, tag="load", device=device)

    @property
    def agree_axes(self) -> list:
        """The axes ``agree`` reduces over."""
        return list(self.meshes.check_axes)

    def check(self, groups, state, finite: FiniteCheck | None = None) -> None:
        entries = [(group, p) for group in groups for p in group["params"]]
        device = local_tensor(entries[0][1]).device if entries else None  # NCCL reduces device tensors only
        flags = torch.zeros(1 + 2 * len(entries), dtype=torch.float64, device=device)
        error = None
        try:
            planned = {}
            for group in groups:
                planned[id(group)] = cached_dion_plan(self.step_plans, group)
                check_planned(planned[id(group)], state, False)
            for k, (group, p) in enumerate(entries):
                if p.grad is not None:
                    st = state.get(p, {})
                    block = _check_block(p, st, self.plans[p], finite)
                    flags[1 + 2 * k] = 1.0
                    dtype = planned[id(group)].options.momentum_dtype or p.dtype  # ``dion_state_dtype``
                    flags[2 + 2 * k] = _nonzero(block, st, dtype).to(flags.device)
            if finite is not None:
                error = finite.error()  # this rank's gradient blocks, one host sync
        except (ValueError, TypeError) as e:
            error = e
        axes = self.meshes.check_axes
        raise_together(error, axes, flags, tag="flags", digest=describe_groups(groups, seed=self.seed))
        ranks = math.prod(a.size for a in axes)
        has_grad = flags[1::2]
        partial = ((has_grad > 0) & (has_grad < ranks)).nonzero().flatten().tolist()
        if partial:
            raise ValueError(f"grad: parameters {partial} (in param-group order) have a gradient on some ranks and not "
                             f"on others; every rank must step the same parameters")
        nonzero = (flags[2::2] > 0).tolist()
        self._nonzero = {id(p): nz for (_, p), nz in zip(entries, nonzero)}
        self.checked = planned  # the plans this check used, for the steps that follow

    def step(self, group: dict, state, first_index: int) -> None:
        group_plan = self.checked.pop(id(group), None)
        if group_plan is None or group_plan.group is not group:
            group_plan = cached_dion_plan(self.step_plans, group)
        options, kwargs = group_plan.options, group_plan.kwargs
        for i, p in group_plan.live:
            plan, st, k = self.plans[p], state[p], first_index + i
            if "step" not in st or "Q" not in st or "momentum" not in st:
                init_sharded_state(p, st, group, plan, seed=self.seed, index=k)
            step_block(local_tensor(p), local_tensor(p.grad), local_tensor(st["momentum"]), local_tensor(st["Q"]), st,
                       options, seed=self.seed, index=k, shape=plan.shape, local_shape=plan.local_shape,
                       rows=plan.rows, cols=plan.cols, replica_mean=self.meshes.replica_mean,
                       nonzero=self._nonzero[id(p)], kwargs=kwargs)


def sharded_dion_step(groups: Sequence[dict], state, plans, meshes: DionMeshes, *, seed: int) -> None:
    """One distributed Dion step for every parameter with a gradient of ``groups`` (all at once):
    ``ShardedDionGroups.check`` then its ``step`` per group. Raises as ``ShardedDionGroups.check``."""
    runner = ShardedDionGroups(plans, meshes, seed)
    runner.check(groups, state, FiniteCheck())
    first = 0
    for group in groups:
        runner.step(group, state, first)
        first += len(group["params"])


def _in_place(t: torch.Tensor, collective) -> None:
    buf = t if t.is_contiguous() else t.contiguous()
    collective(buf)
    if buf is not t:
        t.copy_(buf)


@torch.no_grad()
def synchronize_replicas(groups: Sequence[dict], state, meshes: DionMeshes) -> None:
    """Average every ``momentum`` over the replicas and broadcast every ``Q`` from the first
    replica, so the state is the same on every replica before a checkpoint is saved (DCP writes
    one replica's copy). With compressed sync the momenta differ between replicas (each keeps
    its own error feedback, docs/design.md "Dion"); their mean is the momentum of one process fed the mean
    gradient. Q is already the same on every replica (it is computed from all-reduced values);
    the broadcast makes that independent of the backend. A no-op without compressed sync
    (``meshes.replica`` None: no replicate axis, or ``replicate_mesh_grad_sync=False``)."""
    axis = meshes.replica
    if axis is None:
        return
    for group in groups:
        for p in group["params"]:
            st = state.get(p, {})
            if "momentum" in st:
                mom = local_tensor(st["momentum"])
                _in_place(mom, lambda t: all_reduce(t, axis, tag="sync").div_(axis.size))
            if "Q" in st:
                _in_place(local_tensor(st["Q"]), lambda t: broadcast(t, axis, 0, tag="sync"))
