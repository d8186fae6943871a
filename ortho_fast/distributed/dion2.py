"""Dion2 over DeviceMesh / DTensor / ProcessGroup: DDP, FSDP (``Shard(0)``), TP (colwise
``Shard(0)``, rowwise ``Shard(1)``), HSDP and their combinations, uneven and empty shards.

Per sharded matrix W (m, n) (``ortho_fast.distributed.layout.matrix_layout``: this rank holds
``W[I][:, J]``), with the slices chosen by the **global** shape (rows when m <= n,
``dion2_select_rows``; microsoft/dion lets FSDP's row sharding force rows, we do not):

1. B = M + G on the local block (no communication);
2. the L1 norms of this rank's slices over its part of the other dimension, written at their
   global slice indices into a zero vector of length N (the number of slices) and all-reduced
   (SUM) over every axis that shards the matrix: each rank then holds every slice's full L1 norm
   (a slice's partial sums are added across the axes that shard the other dimension; the zeros
   of the other ranks add nothing);
3. the selection S from that vector, the same on every rank: "global" the top
   k = ⌈fraction·N⌉ (layout invariant: equal to one process up to the summation order of the
   norms, which only matters at near-ties), "local" the top max(1, ⌈fraction·(largest shard)⌉)
   of each shard of the selected dimension (the index sets of the ranks along the axes that
   shard it; microsoft/dion's per-shard "local" selection), equal to ``ortho_ref.dion2``'s
   "local" scope with those shards;
4. M[S] ← ef_decay·B[S] on the local block; this rank's part of B_S written into a zero
   (k, n) (or (m, k)) matrix and all-reduced over the same axes: every rank holds B_S bitwise as
   one process assembles it, orthogonalizes it (``orthogonalize_selected`` with the group's
   ``gram``, on the one-process orientation and batch shape: the same bits) and updates its own
   block, W ← W·(1 − lr·wd), W[S] −= lr·s·O_S, with s from the global shape.

Plain tensors and parameters replicated on every mesh dim (DDP, with gradients already averaged)
take the one-process step (``dion2_group_step``'s, from the group's plan) on every rank: no communication. Communication
per sharded matrix and step (``volumes.dion2_comm_volume``): N + k·(other dimension) elements
all-reduced per sharding axis, plus the agreement of ``comm.raise_together`` before the step.
Source: microsoft/dion ``dion/dion2.py`` (its "global" scope assembles whole matrices; this
reduces only the norms and the selected submatrix); docs/math.md, "Dion2".
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import torch
import torch.distributed as dist

from ..functional import dion2 as dion2_math
from ..functional.stacked import Workspace
from ..groups.dion2 import Dion2Options, cached_dion2_plan, check_dion2_planned
from ..groups.dion2_chunks import run_dion2_plan
from ..groups.driver import INPUT_ERRORS, GroupRunner, describe_groups
from ..validation import FiniteCheck, is_dtensor, local_tensor
from .comm import all_reduce_axes, raise_together
from .layout import LayoutError, MatrixLayout, MeshAxis, check_axes, matrix_layout, mesh_axis

__all__ = ["Dion2Sharding", "dion2_selection", "sharded_dion2_step", "shard_slices"]

_HINT = "pass it as distributed_mesh (FSDP) or tp_mesh (TP)"


def shard_slices(lay: MatrixLayout, rows: bool) -> list[torch.Tensor]:
    """The global slice indices held by each position along the axes that shard the selected
    dimension (rows if ``rows`` else columns): a partition of range(N), one set per position in
    mesh order (one set, all of range(N), when that dimension is not sharded)."""
    axes = lay.row_axes if rows else lay.col_axes
    out = []
    for pos in itertools.product(*(range(a.size) for a in axes)):
        r, c = lay.peer({a.name: p for a, p in zip(axes, pos)})
        out.append(r if rows else c)
    return out


def dion2_selection(norms: torch.Tensor, fraction: float, scope: str, shards: Sequence[torch.Tensor]) -> torch.Tensor:
    """The selected slice indices (ascending, int64 on ``norms``' device) from the full norm vector
    (N,): "global" top ⌈fraction·N⌉; "local" per shard of ``shards`` its top max(1,
    ⌈fraction·(largest shard)⌉), at most its size (``ortho_ref.dion2`` "local" scope)."""
    if scope == "global" or len(shards) <= 1:
        return dion2_math.dion2_select(norms, dion2_math.dion2_num_selected(fraction, norms.numel()))
    k = max(1, int(math.ceil(fraction * max(len(s) for s in shards))))
    picked = []
    for s in shards:
        if len(s):
            s = s.to(norms.device)
            picked.append(s[dion2_math.dion2_select(norms[s], min(k, len(s)))])
    return torch.cat(picked).sort().values


def sharded_dion2_step(p: torch.Tensor, st: dict, lay: MatrixLayout, options: Dion2Options) -> None:
    """One Dion2 step of one sharded parameter (see the module docstring); ``st`` its state (a
    ``momentum`` DTensor laid out as ``p`` is created as zeros)."""
    if "momentum" not in st:
        st["momentum"] = torch.zeros_like(p)
    m, n = lay.shape
    rows = dion2_math.dion2_select_rows(m, n)
    axes = [*lay.row_axes, *lay.col_axes]
    shape = lay.local_shape
    w = local_tensor(p).view(shape)
    b = local_tensor(st["momentum"]).view(shape)
    dion2_math.dion2_accumulate(local_tensor(p.grad).view(shape), b)
    wt, bt = (w, b) if rows else (w.mT, b.mT)  # slices along dim 0
    mine = (lay.rows if rows else lay.cols).to(b.device)
    other = (lay.cols if rows else lay.rows).to(b.device)
    size, other_size = (m, n) if rows else (n, m)
    norms = b.new_zeros(size)
    norms[mine] = dion2_math.dion2_slice_norms(bt, True)
    all_reduce_axes(norms, axes, tag="norms")
    selected = dion2_selection(norms, options.fraction, options.selection_scope, shard_slices(lay, rows))
    here = torch.isin(mine, selected).nonzero().flatten()  # local positions of the selected slices
    at = torch.searchsorted(selected, mine[here])  # their rows in B_S
    sub = b.new_zeros(len(selected), other_size)
    part = bt.index_select(0, here)
    sub[at.unsqueeze(1), other.unsqueeze(0)] = part
    all_reduce_axes(sub, axes, tag="submatrix")
    bt.index_copy_(0, here, part * options.ef_decay)
    # B_S in the one-process orientation, a batch of one: the very call of ``dion2_group_step`` (the
    # same kernel and bits for every ``gram`` / dtype), not the 2-D path of newton_schulz_resolved
    ortho = dion2_math.orthogonalize_selected((sub if rows else sub.mT.contiguous()).unsqueeze(0), options.table,
                                              safety=options.safety, eps=options.epsilon,
                                              compute_dtype=options.compute_dtype, precision=options.precision,
                                              gram=options.gram)[0]
    ortho = ortho if rows else ortho.mT
    scale = dion2_math.dion2_lr_scale(options.adjust_lr, m, n)
    wt.mul_(1 - options.lr * options.weight_decay)
    wt.index_add_(0, here, ortho[at][:, other].to(wt.dtype) * (-options.lr * scale))


class Dion2Sharding(GroupRunner):
    """The distributed runner of a ``Dion2`` optimizer: its meshes and each parameter's layout.

    Args: ``distributed_mesh`` a 1-D DeviceMesh (FSDP; also DDP of replicated parameters) or a
    ProcessGroup (DDP of plain tensors), ``tp_mesh`` a 1-D DeviceMesh of tensor parallelism,
    ``replicate_mesh`` a 1-D DeviceMesh holding whole replicas (HSDP's replicate dim; only joins
    the cross-rank agreement). ``active`` is False when all are None.
    Raises: LayoutError (a ValueError) for a mesh that is not 1-D, does not contain this rank or
    overlaps another; ``add_group``: LayoutError for a DTensor sharded on a mesh dim that is none
    of them, a Partial placement, or a sharded parameter of ndim > 2 without ``flatten``.
    As a ``GroupRunner`` (``communicates``): ``check`` checks locally and then agrees on every
    rank (``raise_together``: error flag, parameters, options, which parameters have gradients)
    before any collective of the step; ``step`` runs one group.
    """

    communicates = True

    def __init__(self, distributed_mesh=None, tp_mesh=None, replicate_mesh=None) -> None:
        self.outer = mesh_axis(distributed_mesh, "distributed_mesh")
        self.inner = mesh_axis(tp_mesh, "tp_mesh")
        self.replicate = mesh_axis(replicate_mesh, "replicate_mesh")
        given: list[MeshAxis | None] = [self.replicate, self.outer, self.inner]
        check_axes(given)
        self.axes = [a for a in given if a is not None]
        self.active = any(x is not None for x in (distributed_mesh, tp_mesh, replicate_mesh))
        self.layouts: dict[torch.Tensor, MatrixLayout] = {}
        #: id(group) -> the ``groups.dion2.Dion2Plan`` of its plain and replicated parameters (their
        #: one-process step) with the group's options; cleared by ``reset``
        self.step_plans: dict = {}
        self.checked: dict = {}  # the plans ``check`` used, for the steps that follow
        self.workspace = Workspace()  # the one-process step's buffers, kept between steps

    def agree(self, error: BaseException | None, device=None) -> None:
        """Make a local verdict global (``load_state_dict``: a corrupt shard on one rank): raise
        ``error`` on its rank and ValueError ("another rank rejected") on every other rank of the
        optimizer's axes (``raise_together``, tag "load"); nothing when every rank passes None."""
        raise_together(error, self.agree_axes, tag="load", device=device)

    @property
    def agree_axes(self) -> list:
        """The axes ``agree`` reduces over."""
        return list(self.axes)

    def options(self, group: dict) -> Dion2Options:
        return self.plan(group).options

    def plan(self, group: dict):
        """The group's plan over its parameters that are not sharded (``groups.dion2.cached_dion2_plan``)."""
        return cached_dion2_plan(self.step_plans, group, keep=self.keep)

    def keep(self, p: torch.Tensor) -> bool:
        """Whether parameter ``p`` takes the one-process step (it is not sharded)."""
        return p not in self.layouts

    def reset(self) -> None:
        super().reset()
        self.step_plans.clear()
        self.checked.clear()

    def add_group(self, group: dict) -> None:
        """Lay out every parameter of a normalized Dion2 group; nothing is kept if one fails."""
        layouts = {}
        for i, p in enumerate(group["params"]):
            if not is_dtensor(p):
                continue
            try:
                lay = matrix_layout(p, {"replicate": self.replicate, "outer": self.outer, "inner": self.inner},
                                    hint=_HINT)
            except LayoutError as err:
                raise LayoutError(f"parameter {i} (shape {tuple(p.shape)}): {err}") from None
            if lay.is_sharded and p.ndim > 2 and not group["flatten"]:
                raise LayoutError(f"parameter {i} (shape {tuple(p.shape)}): a sharded parameter of ndim > 2 needs "
                                  "flatten=True (batches of matrices are not sharded here)")
            if lay.is_sharded:
                layouts[p] = lay
        self.layouts.update(layouts)

    def check(self, groups, state, finite: FiniteCheck | None = None) -> None:
        error = None
        has_grad = []
        try:
            for group in groups:
                self.checked[id(group)] = check_dion2_planned(self.step_plans, group, state,
                                                              finite if finite is not None else False, self.keep)
                for i, p in enumerate(group["params"]):
                    g = p.grad
                    has_grad.append(g is not None)
                    if g is not None and (is_dtensor(g) != is_dtensor(p) or (
                            is_dtensor(p) and tuple(g.placements) != tuple(p.placements))):
                        raise ValueError(f"grad: expected the layout of parameter {i} "
                                         f"({getattr(p, 'placements', 'a plain tensor')}), got "
                                         f"{getattr(g, 'placements', 'a plain tensor')}")
            if finite is not None:
                finite_error = finite.error()
                if finite_error is not None:
                    raise finite_error
        except INPUT_ERRORS as err:
            error = err
        flags = torch.zeros(1 + len(has_grad), dtype=torch.float64)
        flags[1:] = torch.tensor(has_grad, dtype=torch.float64) if has_grad else flags[1:]
        device = next((p.device for g in groups for p in g["params"]), torch.device("cpu"))
        if dist.get_backend() == "nccl":
            flags = flags.to(device)
        reduced = raise_together(error, self.axes, flags, digest=describe_groups(groups))
        ranks = math.prod(a.size for a in self.axes)
        if has_grad and not all(v in (0.0, ranks) for v in reduced[1:].tolist()):
            raise ValueError("grad: a parameter has a gradient on some ranks only; every rank must step the same "
                             "parameters (no parameter or state was changed)")

    @torch.no_grad()
    def step(self, group: dict, state, first_index: int) -> None:
        plan = self.checked.pop(id(group), None)
        if plan is None or plan.group is not group:
            plan = self.plan(group)
        options = plan.options
        if plan.live:
            run_dion2_plan(plan, state, options.lr, options.weight_decay, options.ef_decay, self.workspace)
        for p in group["params"]:
            if p.grad is not None and p in self.layouts:
                sharded_dion2_step(p, state[p], self.layouts[p], options)
