"""Distributed-Muon designs people run, written for the judge's tests of ``check_sharded_optimizer``
(not copied from any library): ``OwnerBatchMuon`` (DDP; the parameters dealt to ranks in batches of
the world size, each rank orthogonalizes one matrix per batch and keeps that matrix's momentum
alone, ZeRO-1 style, then one ``all_gather`` per batch brings the updated matrices to every rank)
and ``FutureMuon`` (DDP; averages the gradients with an asynchronous ``reduce_scatter_tensor`` whose
``Work`` future it waits on, which gloo does not implement). Muon: classic momentum with Nesterov,
Keller Jordan's Newton–Schulz (``planted_optimizers.newton_schulz_jordan``), √max(1, m/n),
decoupled weight decay (``planted_muon_conventions``). ``GatherL2Muon`` (any layout; every rank
all-gathers the full gradient and weight, steps the full matrix, keeps its shard): EMA momentum
with Nesterov, coupled L2 decay G ← G + wd·W, Newton–Schulz in bfloat16 written as its own loop
(``gather_l2_conventions``); ``l2_bug`` "dropped_when_sharded" leaves the L2 term out on DTensor
parameters only."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .planted_optimizers import newton_schulz_jordan
from .tensors import full_value, is_dtensor, write_full

__all__ = ["L2_BUGS", "FutureMuon", "GatherL2Muon", "OwnerBatchMuon", "future_muon_factory", "gather_l2_conventions",
           "gather_l2_muon_factory", "owner_batch_muon_factory"]

#: GatherL2Muon's bugs: what each gets wrong.
L2_BUGS = {None: "correct", "dropped_when_sharded": "no L2 term on DTensor (sharded) parameters"}


def _muon_update(opt, p, group) -> torch.Tensor:
    """The orthogonalized step of ``p`` (momentum in ``opt.state[p]``), in p's dtype."""
    buf = opt.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
    buf.mul_(group["momentum"]).add_(p.grad)
    u = p.grad + group["momentum"] * buf
    dt = opt.ns_dtype or u.dtype
    return newton_schulz_jordan(u.to(dt)).to(p.dtype)


def _apply(p, o, group) -> None:
    m, n = p.shape
    p.mul_(1 - group["lr"] * group["weight_decay"]).add_(o, alpha=-group["lr"] * math.sqrt(max(1.0, m / n)))


class OwnerBatchMuon(torch.optim.Optimizer):
    """Muon on plain replicated tensors over ``process_group`` (None: one process). Batches of
    ``world`` parameters (in the given order, or grouped by shape with ``group_by_shape``): rank r
    steps the batch's r-th matrix (its momentum lives only there) and ``all_gather`` fills every
    rank's copies; a short last batch is padded with scratch tensors. Without ``group_by_shape`` a
    batch can mix shapes, and gloo's ``all_gather`` raises on tensors of different sizes.
    ``ns_dtype``: Newton–Schulz's dtype (None: the parameter's)."""

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.9, weight_decay: float = 0.1, *,
                 process_group=None, group_by_shape: bool = False, ns_dtype=None):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))
        self.group, self.group_by_shape, self.ns_dtype = process_group, group_by_shape, ns_dtype

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = list(group["params"])
            if self.group is None:
                for p in params:
                    _apply(p, _muon_update(self, p, group), group)
                continue
            world, me = dist.get_world_size(self.group), dist.get_rank(self.group)
            lists = [params]
            if self.group_by_shape:
                lists = [[p for p in params if p.shape == s] for s in dict.fromkeys(p.shape for p in params)]
            for same in lists:
                for base in range(0, len(same), world):
                    batch = same[base:base + world]
                    slots = batch + [torch.empty_like(batch[-1]) for _ in range(world - len(batch))]
                    if me < len(batch):
                        _apply(batch[me], _muon_update(self, batch[me], group), group)
                    dist.all_gather(slots, slots[me], group=self.group)


class FutureMuon(torch.optim.Optimizer):
    """Muon on plain replicated tensors that first averages each gradient over ``process_group``
    with ``reduce_scatter_tensor(..., async_op=True).get_future()`` and an all-gather (the
    pattern of overlapped distributed optimizers); on gloo the future raises "Work::getFuture not
    implemented". Every rank then steps every matrix."""

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.9, weight_decay: float = 0.1, *,
                 process_group=None, ns_dtype=None):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))
        self.group, self.ns_dtype = process_group, ns_dtype

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if self.group is not None:
                    world = dist.get_world_size(self.group)
                    flat = p.grad.reshape(-1)
                    pad = torch.zeros(-(-flat.numel() // world) * world, dtype=flat.dtype)
                    pad[:flat.numel()] = flat
                    part = torch.empty(pad.numel() // world, dtype=flat.dtype)
                    dist.reduce_scatter_tensor(part, pad, group=self.group, async_op=True).get_future().wait()
                    dist.all_gather_into_tensor(pad, part / world, group=self.group)
                    p.grad.copy_(pad[:flat.numel()].reshape(p.shape))
                _apply(p, _muon_update(self, p, group), group)


def owner_batch_muon_factory(group_by_shape: bool = False, ns_dtype=None):
    """A ``check_sharded_optimizer`` factory of ``OwnerBatchMuon``: DDP over the layout's process
    group; None (no claim) on layouts with DTensor placements."""
    def factory(params, layout):
        if layout is not None and layout.placements is not None:
            return None
        group = None if layout is None else layout.process_group
        return OwnerBatchMuon(params, process_group=group, group_by_shape=group_by_shape, ns_dtype=ns_dtype)
    return factory


def future_muon_factory(ns_dtype=None):
    """A ``check_sharded_optimizer`` factory of ``FutureMuon``: DDP only (None on DTensor layouts)."""
    def factory(params, layout):
        if layout is not None and layout.placements is not None:
            return None
        return FutureMuon(params, process_group=None if layout is None else layout.process_group, ns_dtype=ns_dtype)
    return factory


class GatherL2Muon(torch.optim.Optimizer):
    """Muon with L2 weight decay coupled into the gradient, G' = G + wd·W; EMA momentum
    M ← βM + (1 − β)G' and Nesterov U = (1 − β)G' + βM; Newton–Schulz in ``ns_dtype`` on the wide
    side of U/(‖U‖_F + 1e-7) with Keller Jordan's (3.4445, −4.7750, 2.0315) × 5; W ← W −
    lr·√max(1, m/n)·O. On DTensor parameters every rank all-gathers the full gradient and weight
    (``full_tensor()``), steps the full matrix (momentum kept whole on every rank; each Newton–Schulz
    Gram matrix X Xᵀ summed from the ranks' column blocks of the wide X, all-reduced in
    ``ns_dtype``) and writes back its own shard; plain tensors (one process, DDP) are stepped as
    they are. ``l2_bug``: a key of
    ``L2_BUGS``. Shapes: 2-D parameters."""

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, weight_decay: float = 0.1, *,
                 ns_dtype=torch.bfloat16, l2_bug: str | None = None):
        if l2_bug not in L2_BUGS:
            raise ValueError(f"l2_bug: expected one of {list(L2_BUGS)}, got {l2_bug!r}")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))
        self.ns_dtype, self.l2_bug = ns_dtype, l2_bug

    def _gram(self, x: torch.Tensor, sharded: bool) -> torch.Tensor:
        """X Xᵀ in ``ns_dtype``; where ``sharded``, each rank's product over its contiguous block of
        X's columns, all-reduced (summed in ``ns_dtype``) over the world."""
        if not sharded:
            return x @ x.T
        block = x.tensor_split(dist.get_world_size(), dim=1)[dist.get_rank()]
        part = block @ block.T
        dist.all_reduce(part)
        return part

    def _orthogonalize(self, u: torch.Tensor, sharded: bool) -> torch.Tensor:
        x = u.to(self.ns_dtype)
        wide = x.shape[0] <= x.shape[1]
        x = x if wide else x.T
        x = x / (x.norm() + 1e-7)
        for _ in range(5):
            a = self._gram(x, sharded)
            x = 3.4445 * x + (-4.7750 * a + 2.0315 * (a @ a)) @ x
        return (x if wide else x.T).to(u.dtype)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, beta, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                w, g = full_value(p), full_value(p.grad)
                if not (self.l2_bug == "dropped_when_sharded" and is_dtensor(p)):
                    g = g + wd * w
                buf = self.state[p].get("momentum_buffer")
                if buf is None:
                    buf = self.state[p]["momentum_buffer"] = torch.zeros_like(g)
                buf.lerp_(g, 1 - beta)
                o = self._orthogonalize(g.lerp(buf, beta), is_dtensor(p))
                m, n = w.shape
                write_full(p, w - lr * max(1.0, m / n) ** 0.5 * o)


def gather_l2_muon_factory(l2_bug: str | None = None, weight_decay: float = 0.1):
    """A ``check_sharded_optimizer`` factory of ``GatherL2Muon`` (bfloat16 Newton–Schulz) with
    ``l2_bug`` and ``weight_decay``, on every layout."""
    def factory(params, layout):
        return GatherL2Muon(params, weight_decay=weight_decay, l2_bug=l2_bug)
    return factory


def gather_l2_conventions():
    """``MuonConventions`` of ``GatherL2Muon``: EMA momentum with Nesterov, Keller Jordan's schedule,
    U/(‖U‖_F + 1e-7), √max(1, m/n), ``weight_decay_style`` "l2", Newton–Schulz in bfloat16."""
    from ..conventions import MuonConventions

    return MuonConventions(momentum_style="ema", nesterov=True, eps=1e-7, eps_mode="add", weight_decay_style="l2",
                           ns_dtype=torch.bfloat16)
