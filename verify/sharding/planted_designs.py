"""Distributed-Muon designs people run, written for the judge's tests of ``check_sharded_optimizer``
(not copied from any library): ``OwnerBatchMuon`` (DDP; the parameters dealt to ranks in batches of
the world size, each rank orthogonalizes one matrix per batch and keeps that matrix's momentum
alone, ZeRO-1 style, then one ``all_gather`` per batch brings the updated matrices to every rank)
and ``FutureMuon`` (DDP; averages the gradients with an asynchronous ``reduce_scatter_tensor`` whose
``Work`` future it waits on, which gloo does not implement). Muon: classic momentum with Nesterov,
Keller Jordan's Newton–Schulz (``planted_optimizers.newton_schulz_jordan``), √max(1, m/n),
decoupled weight decay (``planted_muon_conventions``)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .planted_optimizers import newton_schulz_jordan

__all__ = ["FutureMuon", "OwnerBatchMuon", "future_muon_factory", "owner_batch_muon_factory"]


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
