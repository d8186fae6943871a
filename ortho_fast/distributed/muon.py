"""Muon over torch.distributed: FSDP or DDP over ``distributed_mesh``, tensor parallelism over ``tp_mesh``.

``ortho_fast.Muon(params, ..., distributed_mesh=None, tp_mesh=None, tp_mode="duplicated")``
drives ``MuonSharding``, which reads every parameter's placements once at construction
(``ortho_fast.distributed.layout``) and steps each matrix in five phases, the same on every
rank, every collective through ``ortho_fast.distributed.comm`` (so a ``Ledger`` sees them),
after ``MuonSharding.check`` made every rank agree that the inputs are valid and which
parameters have a gradient (the same on every rank, or the collectives would not match):

1. momentum on this rank's block (elementwise, so a shard's momentum is bitwise the one-process
   momentum restricted to it; a DTensor parameter keeps a DTensor momentum like itself);
2. over ``distributed_mesh`` (the *dp* axis, p ranks): each matrix has an owner, the rank at
   position ``index % p`` (round-robin by parameter index over all groups, as microsoft/dion's
   Muon). FSDP (the parameter is sharded on the dp axis): every rank's block of the momentum
   matrix U is gathered to the owner (``gather_blocks``); DDP (a plain tensor, or replicated
   on the dp axis): every rank already holds U, only the owner goes on;
3. the owner orthogonalizes. Without tensor parallelism the whole matrix (``newton_schulz``,
   the one-process call). With a ``tp_mesh`` sharding the parameter (``tp_mode``, Megatron /
   NVIDIA Emerging-Optimizers ``newton_schulz_tp``): "duplicated" all-gathers the TP shards,
   orthogonalizes the whole matrix on every TP rank and keeps its own part; "distributed" runs
   Newton–Schulz on the shards with the Gram matrix all-reduced each step
   (``newton_schulz_sharded``); "blockwise" orthogonalizes each TP shard alone and scales it
   by the shard's own shape (Megatron's blockwise passes ``partition_dim=None`` to both the
   orthogonalization and the scale) — layout-dependent by design;
4. back over the dp axis: FSDP scatters the owner's result (``scatter_blocks``), DDP
   broadcasts it;
5. W ← W·(1 − lr·wd) − lr·s·O on this rank's block, s from the global (m, n) (blockwise: the shard's).

Equality with one process (``ortho_fast.Muon`` on the full tensors): FSDP, DDP and TP
"duplicated" orthogonalize the very matrix one process does with the same call, and the
rest is elementwise, so they are bitwise equal; "distributed" sums the Gram matrix in
another order, equal to rounding (``ortho_verify.tolerances.sharded_tolerance``); "blockwise"
equals ``ortho_fast.Muon`` stepping each TP shard as a parameter of its own.

Memory and overlap: phase 2 runs for every matrix of a param group before phase 3, so each
rank orthogonalizes its own ~1/p of the matrices while the others do theirs (an owner holds its
gathered matrices of one group at once, as dion's batches). The collectives are blocking.

FSDP + TP (``distributed_mesh=mesh["dp"], tp_mesh=mesh["tp"]``): phase 2 gathers over dp the
TP shard of each rank's TP position (FSDP2 on top of colwise TP gives ``_StridedShard``,
rowwise TP ``Shard(0)`` on dp and ``Shard(1)`` on tp), phase 3 runs the TP mode among the
owners (one TP group: they share their dp position), phase 4 scatters over dp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..functional import muon as muon_math, muon_stages as stage_math
from ..functional.layout import MuonLayout, is_expert_name
from ..groups.driver import GroupRunner, describe_groups
from ..groups.muon import MuonPlans, momentum_of, param_layout, param_name, resolve_muon_options
from ..groups.muon_stages import VARIANCE_KEY, normuon_variances
from ..groups.options import MuonOptions
from ..validation import FiniteCheck, check_choice, is_dtensor, local_tensor
from . import comm
from .layout import TP_MODES, LayoutError, MatrixLayout, check_axes, matrix_layout, mesh_axis
from .newton_schulz import newton_schulz_sharded

__all__ = ["MuonSharding"]

_HINT = "pass its mesh dimension as distributed_mesh (FSDP) or tp_mesh (tensor parallelism)"


@dataclass
class _Plan:
    """How one parameter is stepped (fixed at construction from its placements)."""

    owner: int  # dp position of the rank that orthogonalizes it
    layout: MatrixLayout | None = None  # None: the whole parameter on this rank (plain or replicated)
    dp_shards: bool = False
    tp_dim: int | None = None  # matrix dim the tp axis shards (0 rows, 1 cols), None: not sharded by tp
    tp_shape: tuple[int, int] = (0, 0)  # the block of this rank's TP position (the whole matrix without TP)
    tp_index: tuple[torch.Tensor, torch.Tensor] | None = None  # its global rows / cols
    dp_shapes: list[tuple[int, int]] = field(default_factory=list)  # every dp peer's block
    dp_index: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # ... positions in the TP block
    tp_shapes: list[tuple[int, int]] = field(default_factory=list)  # every TP position's block
    tp_blocks: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # ... global rows / cols


@dataclass
class _GroupPlan:
    """What the exchange phases of one group read, built with its ``MuonPlan`` (``entry``; a new one
    when the group changes, the scalars a scheduler sets read from ``entry.options`` at each step)."""

    entry: object  # the group's ``MuonPlan``
    members: list[tuple[int, torch.Tensor, _Plan]]  # (index in the group, parameter, placements plan)
    ns_kwargs: dict  # the group's Newton–Schulz options for ``newton_schulz_sharded``
    verified: set = field(default_factory=set)  # indices whose sharded options passed with these options


@dataclass
class _Item:
    """One parameter in one step."""

    p: torch.Tensor
    index: int  # in its group
    plan: _Plan
    u: torch.Tensor  # momentum output on this rank (param-shaped local tensor)
    t: torch.Tensor | None = None  # the owner's input: the TP block (sharded) or None
    mats: list[torch.Tensor] = field(default_factory=list)  # whole parameter: the Newton–Schulz inputs
    outs: list[torch.Tensor] = field(default_factory=list)


def _positions(index: torch.Tensor, within: torch.Tensor, size: int) -> torch.Tensor:
    """Positions of the global indices ``index`` inside the index set ``within``."""
    inverse = torch.full((size,), -1, dtype=torch.int64)
    inverse[within] = torch.arange(len(within))
    return inverse[index]


def _assemble(parts: list[torch.Tensor], index: list[tuple[torch.Tensor, torch.Tensor]],
              shape: tuple[int, int]) -> torch.Tensor:
    out = parts[0].new_empty(shape)
    for part, (r, c) in zip(parts, index):
        out[r[:, None], c] = part
    return out


def _same_set(parts: list[torch.Tensor], whole: torch.Tensor) -> bool:
    joined = torch.cat(parts)
    return len(joined) == len(whole) and torch.equal(joined.sort().values, whole.sort().values)


class MuonSharding(MuonPlans, GroupRunner):
    """The distributed plan of a ``Muon`` optimizer: its meshes, and per parameter who owns it and
    where its blocks live (see the module docstring for the algorithm).

    Args: ``distributed_mesh`` a 1-D DeviceMesh (FSDP and DDP) or a ProcessGroup (DDP of plain
    tensors only; microsoft/dion's convention), ``tp_mesh`` a 1-D DeviceMesh (or ProcessGroup)
    of tensor parallelism, ``tp_mode`` one of ``TP_MODES``. Both None: ``active`` is False and
    the optimizer runs the one-process step (then a sharded DTensor parameter is an error).
    Raises: ValueError naming ``tp_mode``; LayoutError (a ValueError) for a mesh that is not
    1-D, does not contain this rank, or overlaps the other one; RuntimeError if torch.distributed
    is not initialized. ``add_group`` raises LayoutError / ValueError for a parameter (see there).
    Every check depends only on the meshes and placements, which all ranks share, so an error
    is raised on every rank, before any collective. As a ``GroupRunner`` (``communicates``):
    ``check`` makes every rank agree, ``step`` runs one group by its plan (``_GroupPlan``: the
    group's ``MuonPlan`` and what the exchange phases read, made when the group changes).
    """

    communicates = True

    def __init__(self, distributed_mesh=None, tp_mesh=None, tp_mode: str = "duplicated") -> None:
        check_choice(tp_mode, "tp_mode", TP_MODES)
        self.tp_mode = tp_mode
        self.dp = mesh_axis(distributed_mesh, "distributed_mesh")
        self.tp = mesh_axis(tp_mesh, "tp_mesh")
        check_axes([self.dp, self.tp])
        self.dp_is_group = isinstance(distributed_mesh, dist.ProcessGroup)
        self.active = distributed_mesh is not None or tp_mesh is not None
        self.plans: dict[torch.Tensor, _Plan] = {}
        self.step_plans: dict = {}  # each group's ``MuonPlan`` (``MuonPlans``; cleared by ``reset``)
        self.exchange_plans: dict[int, _GroupPlan] = {}  # each group's ``_GroupPlan`` (cleared by ``reset``)
        self.checked: dict[int, _GroupPlan] = {}  # the plans the last ``check`` used, for the steps after it

    def __getstate__(self) -> dict:  # a copied optimizer plans its own groups again
        return {**super().__getstate__(), "exchange_plans": {}, "checked": {}}

    def reset(self) -> None:
        """``GroupRunner.reset``, and the groups' exchange plans with the step plans."""
        super().reset()
        self.exchange_plans, self.checked = {}, {}

    def agree(self, error: BaseException | None, device=None) -> None:
        """Make a local verdict global (``load_state_dict``: a corrupt shard on one rank): raise
        ``error`` on its rank and ValueError ("another rank rejected") on every other rank of the
        dp / tp axes (``comm.raise_together``, tag "load"); nothing when every rank passes None.
        One process (no mesh): nothing here (the caller raises its own error)."""
        if self.active:
            comm.raise_together(error, self.agree_axes, tag="load", device=device)

    @property
    def agree_axes(self) -> list:
        """The axes ``agree`` reduces over (none without a mesh)."""
        return [a for a in (self.dp, self.tp) if a is not None] if self.active else []

    def _group_plans(self, groups: list[dict], then=None):
        """Each group's ``_GroupPlan`` in turn: the kept one while its ``MuonPlan`` is the same object
        (a scheduler's lr keeps it), else built again from the group; ``then(plan)`` runs on each
        before the next group is planned (``check``: a group's errors before the next one's)."""
        for group in groups:
            entry = self.plan(group)  # ``MuonPlans.plan``: options, layouts, gradient checks
            gp = self.exchange_plans.get(id(group))
            if gp is None or gp.entry is not entry:
                gp = _GroupPlan(entry, [(i, p, self.plans[p]) for i, p in enumerate(group["params"])],
                                dict(coefficients=group["coefficients"], steps=group["ns_steps"], dtype=group["dtype"]))
                if not torch.compiler.is_compiling():
                    self.exchange_plans[id(group)] = gp
            if then is not None:
                then(gp)
            yield gp

    # -- construction --------------------------------------------------------------------

    def add_group(self, group: dict) -> None:
        """Plan every parameter of a normalized Muon group; nothing is kept if one fails.

        Raises: LayoutError for a DTensor sharded on a mesh dim that is neither mesh (or any
        sharded DTensor when no mesh was given), a Partial placement, a DTensor with a
        ProcessGroup ``distributed_mesh``, or the tp and dp axes sharding one tensor dim with
        the TP shards interleaved (``Shard(d)`` on dp before ``Shard(d)`` on tp: FSDP2 on top
        of TP gives ``_StridedShard`` and contiguous TP shards); ValueError naming ``banks``,
        ``split_sizes``, ``num_heads``, ``expert_keys`` or ``flatten`` for a sharded parameter
        that would need them.
        """
        start = len(self.plans)
        plans = {p: self._plan(group, i, p, start + i) for i, p in enumerate(group["params"])}
        self.plans.update(plans)

    def _plan(self, group: dict, i: int, p: torch.Tensor, index: int) -> _Plan:
        name = param_name(group, i, p)
        owner = index % self.dp.size if self.dp else 0
        if not is_dtensor(p):
            return _Plan(owner)
        if self.dp_is_group:
            raise LayoutError(f"distributed_mesh: a ProcessGroup means DDP of plain tensors, but {name} is a DTensor "
                              f"(placements {tuple(p.placements)}); pass the 1-D DeviceMesh dimension instead, e.g. "
                              f"distributed_mesh=mesh['dp']")
        try:
            lay = matrix_layout(p, {"outer": self.dp, "inner": self.tp}, hint=_HINT)
        except LayoutError as err:
            raise LayoutError(f"{name}: {err}") from None
        if not lay.is_sharded:
            return _Plan(owner)
        options = resolve_muon_options(group)
        _check_sharded_options(group, options, i, p, name)
        dp_name, tp_name = (axis.name if axis else "" for axis in (self.dp, self.tp))
        in_rows, in_cols = [a.name for a in lay.row_axes], [a.name for a in lay.col_axes]
        dp_shards = dp_name in in_rows + in_cols
        tp_dim = 0 if tp_name in in_rows else 1 if tp_name in in_cols else None
        check_stage_mode(options, None if tp_dim is None else self.tp_mode, name)
        tl = lay.without(dp_name)  # the block of this rank's TP position
        plan = _Plan(owner, lay, dp_shards, tp_dim, tl.local_shape, (tl.rows, tl.cols))
        m, n = lay.shape
        if dp_shards:
            peers = [lay.peer({dp_name: j}) for j in range(self.dp.size)]
            if not (_same_set([r for r, _ in peers], tl.rows) if dp_name in in_rows else
                    _same_set([c for _, c in peers], tl.cols)):
                raise LayoutError(
                    f"{name}: distributed_mesh and tp_mesh shard the same tensor dim with the tensor-parallel shards "
                    f"interleaved (placements {tuple(p.placements)}); FSDP on top of tensor parallelism shards each TP "
                    f"shard further (torch's fully_shard gives _StridedShard on the dp dim), so each TP rank's "
                    f"block stays the contiguous chunk that parallelize_module made")
            plan.dp_shapes = [(len(r), len(c)) for r, c in peers]
            plan.dp_index = [(_positions(r, tl.rows, m), _positions(c, tl.cols, n)) for r, c in peers]
        if tp_dim is not None:
            plan.tp_blocks = [tl.peer({tp_name: t}) for t in range(self.tp.size)]
            plan.tp_shapes = [(len(r), len(c)) for r, c in plan.tp_blocks]
        # index tensors where the blocks live (CPU index sets would be copied to the GPU at every use)
        plan.tp_index = tuple(x.to(p.device) for x in plan.tp_index)
        plan.dp_index, plan.tp_blocks = ([(r.to(p.device), c.to(p.device)) for r, c in pairs]
                                         for pairs in (plan.dp_index, plan.tp_blocks))
        return plan

    # -- the step ------------------------------------------------------------------------

    def _owns(self, plan: _Plan) -> bool:
        return self.dp is None or plan.owner == self.dp.index

    def check(self, groups: list[dict], state, finite: FiniteCheck | None = None) -> None:
        """``check_muon_step`` for every group plus the distributed invariants (the gradient and
        an existing ``momentum_buffer`` of a DTensor parameter are DTensors of its placements and
        mesh, a plain parameter's are plain; options still allowed for sharded parameters), then
        one all-reduce (SUM) over the dp and tp axes of 1 + N numbers (an error flag, then per
        parameter of ``groups`` whether it has a gradient), so every rank raises if any rank found
        a problem, and every rank raises if a parameter has a gradient on some ranks and not on
        others (its collectives would not match: a hang, or blocks of different parameters
        exchanged). Communication: 1 + N elements per axis of more than one rank (tag "check").
        Raises: the local error (ValueError / TypeError) where it was found, ValueError elsewhere;
        ValueError naming the parameters with a gradient on some ranks only. Nothing changes first."""
        self.checked = {}
        error, plans = None, []
        try:
            plans.extend(self._group_plans(groups, lambda gp: self._check_plan(gp, state, finite)))
            if finite is not None:
                error = finite.error()  # this rank's gradient blocks, one host sync
        except Exception as err:  # noqa: BLE001 - re-raised by raise_together, after the peers have heard of it
            error = err
        entries = ([(gp.entry.names[i], p) for gp in plans for i, p, _ in gp.members] if len(plans) == len(groups)
                   else [(None, p) for group in groups for p in group["params"]])  # a group failed: raised below
        device = next((p.device for _, p in entries), torch.device("cpu"))  # NCCL: the GPU
        flags = torch.tensor([0.0, *(float(p.grad is not None) for _, p in entries)], device=device)
        axes = [a for a in (self.dp, self.tp) if a is not None]
        comm.raise_together(error, axes, flags, tag="check", digest=describe_groups(groups, tp_mode=self.tp_mode))
        ranks = math.prod(a.size for a in axes)
        partial = [name for (name, _), n in zip(entries, flags[1:].tolist()) if 0 < n < ranks]
        if partial:
            raise ValueError(f"grad: {', '.join(partial)} have a gradient on some ranks and not on others; every rank "
                             f"of distributed_mesh and tp_mesh must step the same parameters (no parameter or state "
                             f"was changed)")
        self.checked = {id(gp.entry.group): gp for gp in plans}

    def _check_plan(self, gp: _GroupPlan, state, finite: FiniteCheck | None) -> None:
        """``check``'s local checks of one group (raising as ``check``)."""
        entry = gp.entry
        entry.check(state, finite if finite is not None else False)  # ``check_muon_step``, kept per tensor
        for i, p, plan in gp.members:
            if p.grad is None:
                continue
            buf = state[p].get("momentum_buffer") if p in state else None
            for key, t in (("grad", p.grad), ("momentum_buffer", buf)):
                if t is not None and not _same_layout(p, t):
                    hint = ("; load sharded optimizer state with torch.distributed.checkpoint (set_optimizer_state_dict"
                            "), which keeps each parameter's placements") if key == "momentum_buffer" else ""
                    raise ValueError(f"{key}: expected the parameter's layout ({entry.names[i]}: {_layout_name(p)}), "
                                     f"got {_layout_name(t)}{hint}")
            if plan.layout is not None and i not in gp.verified:  # options fixed per plan: checked once
                _check_sharded_options(entry.group, entry.options, i, p, entry.names[i])
                check_stage_mode(entry.options, None if plan.tp_dim is None else self.tp_mode, entry.names[i])
                gp.verified.add(i)

    @torch.no_grad()
    def step(self, groups_or_group, state, first_index: int | None = None) -> None:
        """``GroupRunner.step``: one group (``step(group, state, first_index)``); called with the list of
        groups and no index, one distributed Muon step for all of them (``check``, then ``group_step``)."""
        if first_index is not None:
            self.group_step(groups_or_group, state)
            return
        self.check(groups_or_group, state, FiniteCheck())
        for group in groups_or_group:
            self.group_step(group, state)

    def group_step(self, group: dict, state) -> None:
        """The five phases of the module docstring for one group, every rank in the same order, read
        from the group's ``_GroupPlan`` (the one ``check`` used, or the group's kept one)."""
        gp = self.checked.pop(id(group), None)
        self._run(gp if gp is not None and gp.entry.group is group else next(self._group_plans([group])), state)

    def _run(self, gp: _GroupPlan, state) -> None:
        options = gp.entry.options
        items: list[_Item] = []
        for i, p, plan in gp.members:
            if p.grad is None:
                continue
            u = momentum_of(p, state, options, grad=local_tensor(p.grad), buf_of=local_tensor)
            items.append(_Item(p, i, plan, u))
            if plan.layout is None and self._owns(plan):
                items[-1].mats = gp.entry.layout(i, p).matrices(u)
        for it in [it for it in items if it.plan.layout is not None]:  # phase 2: to the owner (sharded)
            block = it.u.reshape(it.plan.layout.local_shape)
            if it.plan.dp_shards:
                parts = comm.gather_blocks(block, self.dp, it.plan.dp_shapes, it.plan.owner, tag="U")
                it.t = None if parts is None else _assemble(parts, it.plan.dp_index, it.plan.tp_shape)
            elif self._owns(it.plan):
                it.t = block
        self._owner_phase(items, gp, options, state)  # phase 3
        for it in items:  # phase 4: back from the owner
            self._return(it, gp)
        if options.normuon_beta2 is not None and self.dp is not None:  # NorMuon's second moment from the owner
            for it in items:
                normuon_variances(it.p, state, self._variance_layout(it, gp), options.normuon_dim)  # non-owners
                comm.broadcast(state[it.p][VARIANCE_KEY], self.dp, it.plan.owner, tag="variance")
        for it in items:  # phase 5
            self._apply(it, gp)

    def _owner_phase(self, items: list[_Item], gp: _GroupPlan, options: MuonOptions, state) -> None:
        """Phase 3 on the owner: TP all-gathers ("duplicated"), then every whole-matrix Newton–Schulz in one
        ``orthogonalize`` call (banks apply to plain parameters), then the "distributed" ones (collectives inside),
        each in parameter order. The pipeline stages (MuonEq before, Muon+ and NorMuon after) run on the owner's
        whole matrices as in one process ("blockwise": each TP shard its own matrix; "distributed" rejects them)."""
        mine = [it for it in items if self._owns(it.plan)]
        local: list[tuple[_Item, torch.Tensor]] = [(it, x) for it in mine for x in it.mats]
        for it in mine:
            if it.plan.layout is None:
                continue
            mode = self.tp_mode if it.plan.tp_dim is not None else None
            if mode == "duplicated":
                parts = comm.all_gather_blocks(it.t, self.tp, it.plan.tp_shapes, tag="U")
                local.append((it, _assemble(parts, it.plan.tp_blocks, it.plan.layout.shape)))
            elif mode is None or (mode == "blockwise" and it.t.numel()):
                local.append((it, it.t))
        inputs = stage_math.pre_orthogonalize([x for _, x in local], equilibration=options.equilibration)
        outs = muon_math.orthogonalize(inputs, options.table, **options.orthogonalize_kwargs())
        outs = self._post_stages(local, outs, gp, options, state)
        for (it, _), o in zip(local, outs):
            full = it.plan.layout is not None and it.plan.tp_dim is not None and self.tp_mode == "duplicated"
            it.outs.append(o[it.plan.tp_index[0][:, None], it.plan.tp_index[1]] if full else o)
        for it in mine:
            if it.plan.layout is not None and it.plan.tp_dim is not None and self.tp_mode == "distributed":
                it.outs.append(newton_schulz_sharded(
                    it.t, self.tp, sharded_dim=it.plan.tp_dim, **gp.ns_kwargs, safety=options.safety, eps=options.eps,
                    eps_mode=options.eps_mode, out_dtype=_out_dtype(options, it.u)))
            elif it.plan.layout is not None and not it.outs:  # an empty blockwise TP shard
                it.outs.append(it.t.to(_out_dtype(options, it.u)))

    def _post_stages(self, local, outs, gp: _GroupPlan, options: MuonOptions, state) -> list[torch.Tensor]:
        """Muon+ and NorMuon on the owner's matrices (one ``post_orthogonalize`` call per parameter;
        NorMuon's second moment ``state[p]["variance_neuron"]`` is the whole matrix's, kept on every
        rank: created as zeros where missing, broadcast from the owner after the step)."""
        if not options.renormalize and options.normuon_beta2 is None:
            return list(outs)
        result, start = [], 0
        while start < len(local):
            it = local[start][0]
            count = sum(1 for other, _ in local[start:] if other is it)
            variances = (normuon_variances(it.p, state, self._variance_layout(it, gp), options.normuon_dim)
                         if options.normuon_beta2 is not None else None)
            result += stage_math.post_orthogonalize(list(outs[start:start + count]), variances,
                                                    **options.post_orthogonalize_kwargs())
            start += count
        return result

    def _variance_layout(self, it: _Item, gp: _GroupPlan) -> MuonLayout:
        """The layout NorMuon's second moment of ``it`` follows: the one-process layout of a whole
        parameter, the global (m, n) matrix of a sharded one."""
        if it.plan.layout is None:
            return gp.entry.layout(it.index, it.p)
        m, n = it.plan.layout.shape
        return MuonLayout((), m, n, 1, ((0, m, m),))

    def _return(self, it: _Item, gp: _GroupPlan) -> None:
        """Phase 4: this rank's block of the orthogonalized matrix (``it.outs``) from the owner."""
        if self.dp is None:
            return
        plan, mine = it.plan, self._owns(it.plan)
        dtype = _out_dtype(gp.entry.options, it.u)
        if plan.layout is None:  # DDP of a whole parameter: broadcast each Newton–Schulz output
            shapes = gp.entry.layout(it.index, it.p).matrix_shapes()
            outs = [o.contiguous() for o in it.outs] if mine else [it.u.new_empty(s, dtype=dtype) for s in shapes]
            it.outs = [comm.broadcast(o, self.dp, plan.owner, tag="O") for o in outs]
        elif plan.dp_shards:
            blocks = [it.outs[0][r[:, None], c] for r, c in plan.dp_index] if mine else None
            it.outs = [comm.scatter_blocks(blocks, self.dp, plan.dp_shapes, plan.owner,
                                           like=it.u.new_empty(0, dtype=dtype), tag="O")]
        else:  # DDP of a TP shard
            out = it.outs[0].contiguous() if mine else it.u.new_empty(plan.layout.local_shape, dtype=dtype)
            it.outs = [comm.broadcast(out, self.dp, plan.owner, tag="O")]

    def _apply(self, it: _Item, gp: _GroupPlan) -> None:
        """Phase 5 on this rank's block (the parameter's local tensor, in place)."""
        w, plan = local_tensor(it.p), it.plan
        update = gp.entry.options.update_kwargs()
        if plan.layout is None:
            muon_math.muon_update(w, gp.entry.layout(it.index, it.p), it.outs, **update)
            return
        r, c = plan.layout.local_shape
        if r * c == 0:
            return
        shape = plan.tp_shape if plan.tp_dim is not None and self.tp_mode == "blockwise" else plan.layout.shape
        muon_math.muon_update(w, MuonLayout((), r, c, 1, ((0, r, r),)), it.outs, shapes=[shape], **update)


def _same_layout(p: torch.Tensor, t: torch.Tensor) -> bool:
    """Whether ``t`` (a gradient or momentum) is laid out as the parameter ``p``: both plain, or
    DTensors with the same placements on the same mesh (so their local blocks match)."""
    return is_dtensor(p) == is_dtensor(t) and (
        not is_dtensor(p) or (t.placements == p.placements and t.device_mesh == p.device_mesh))


def _layout_name(t: torch.Tensor) -> str:
    return f"a DTensor with placements {tuple(t.placements)}" if is_dtensor(t) else "a plain tensor"


def _out_dtype(options: MuonOptions, like: torch.Tensor) -> torch.dtype:
    """The dtype phase 3 hands out for an input like ``like``: ``orthogonalize``'s (the compute dtype,
    or the input's for ``dtype=None``: after MuonEq, ``stage_dtype``), promoted by Muon+'s / NorMuon's
    factors (``stage_dtype``) when they are on: what a non-owner receives."""
    dtype = like.dtype if options.compute_dtype is None else options.compute_dtype
    dtype = stage_math.stage_dtype(dtype) if options.compute_dtype is None and options.equilibration else dtype
    stages = options.renormalize or options.normuon_beta2 is not None
    return torch.promote_types(dtype, stage_math.stage_dtype(dtype)) if stages else dtype


def _check_sharded_options(group: dict, options: MuonOptions, i: int, p: torch.Tensor, name: str) -> None:
    """ValueError naming the first option a sharded parameter cannot take: a sharded parameter
    is one (shape[0], prod(shape[1:])) matrix, orthogonalized alone."""
    names = group.get("param_names")
    expert = bool(options.expert_keys and names) and is_expert_name(names[i], options.expert_keys)
    lay = param_layout(group, options, i, p)
    bad = ("banks" if options.banks else "expert_keys" if expert else "flatten" if lay.batch else
           "split_sizes" if len(lay.blocks) > 1 or lay.groups > 1 else
           "num_heads" if lay.blocks[0][2] != lay.m else None)
    if bad:
        raise ValueError(f"{bad}: {name} is sharded (placements {tuple(p.placements)}); a sharded parameter is "
                         f"orthogonalized as one (shape[0], prod(shape[1:])) matrix, so {bad}={group[bad]!r} cannot "
                         f"apply to it (put it in a param group without {bad})")


def check_stage_mode(options: MuonOptions, tp_mode: str | None, name: str) -> None:
    """ValueError naming the first pipeline stage a parameter sharded by tensor parallelism in
    ``tp_mode`` cannot take: "distributed" never holds a whole matrix (MuonEq's row norms and
    Muon+'s / NorMuon's Frobenius norms would need their own all-reduces, not implemented), and
    NorMuon's per-shard second moment under "blockwise" is not implemented. ``gram=True`` is a
    whole-matrix kernel: "distributed" runs its own plain steps on the shards (``gram=None`` there
    means those steps)."""
    if tp_mode == "distributed":
        bad = ("row_equilibration" if options.equilibration else "renormalize" if options.renormalize else
               "normuon_beta2" if options.normuon_beta2 is not None else "gram" if options.gram else None)
    elif tp_mode == "blockwise":
        bad = "normuon_beta2" if options.normuon_beta2 is not None else None
    else:
        bad = None
    if bad:
        raise ValueError(f"{bad}: {name} is sharded by tp_mesh with tp_mode={tp_mode!r}, which cannot run this "
                         f"pipeline stage (use tp_mode='duplicated', or a param group without {bad})")
