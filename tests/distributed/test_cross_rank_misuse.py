"""Misuse across ranks raises on every rank, before anything changes, and never hangs or aborts:
parameter lists of different lengths, shapes of equal numel, another lr or qr_method on one rank
(the replicas would silently diverge), and a NaN on one rank of a Dion over a ``process_group`` whose
gradients arrive synced (``replicate_mesh_grad_sync=False``: the replicas still raise together).
A zero gradient after a nonzero one (B = M != 0) still steps, sharded as in one process.
One launch of 2 gloo ranks for the module (``ortho_verify.sharding.workers.run_workers``)."""

from __future__ import annotations

import pytest
import torch

from ortho_verify.sharding.workers import run_workers
from ortho_verify.tolerances import sharded_tolerance


def _params(rank: int, shapes):
    gen = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64)) for s in shapes]


def _step_outcome(opt, ps, grads) -> tuple[str | None, bool]:
    """(the error's text or None, whether every parameter and state tensor is unchanged)."""
    for p, g in zip(ps, grads):
        p.grad = g
    before = [t.detach().clone() for p in ps for t in (p, *(v for v in opt.state[p].values() if torch.is_tensor(v)))]
    try:
        opt.step()
        error = None
    except ValueError as err:
        error = str(err)
    after = [t.detach().clone() for p in ps for t in (p, *(v for v in opt.state[p].values() if torch.is_tensor(v)))]
    return error, len(before) == len(after) and all(map(torch.equal, before, after))


def _grads(ps, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in ps]


def _misuse(rank: int, world: int) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import ortho_fast

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    out = {}

    # Muon DDP: rank 1 has one parameter more
    shapes = [(8, 6), (6, 10)] + ([(5, 5)] if rank == 1 else [])
    ps = _params(rank, shapes)
    opt = ortho_fast.Muon(ps, lr=0.02, distributed_mesh=mesh["dp"])
    out["muon extra parameter"] = _step_outcome(opt, ps, _grads(ps, 1))

    # Muon DDP: shapes of equal numel
    ps = _params(rank, [(8, 6), (6, 8) if rank == 0 else (12, 4)])
    opt = ortho_fast.Muon(ps, lr=0.02, distributed_mesh=mesh["dp"])
    out["muon shapes"] = _step_outcome(opt, ps, _grads(ps, 2))

    # Dion FSDP: one rank edits lr after construction
    full = _params(0, [(8, 6), (6, 10)])
    ps = [torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)])) for p in full]
    opt = ortho_fast.Dion(ps, lr=0.01, rank_fraction=0.5, outer_shard_mesh=mesh["dp"])
    _step_outcome(opt, ps, [distribute_tensor(g, mesh, [Shard(0)]) for g in _grads(full, 3)])  # a good step
    if rank == 1:
        opt.param_groups[0]["lr"] = 0.02
    out["dion lr"] = _step_outcome(opt, ps, [distribute_tensor(g, mesh, [Shard(0)]) for g in _grads(full, 4)])

    # Dion DDP over a process group: another qr_method on one rank
    ps = _params(rank, [(8, 6), (6, 10)])
    opt = ortho_fast.Dion(ps, lr=0.01, rank_fraction=0.5, process_group=dist.group.WORLD,
                          qr_method="householder" if rank == 0 else "cholesky_qr")
    out["dion qr_method"] = _step_outcome(opt, ps, _grads(ps, 5))

    # Dion over a process group with synced gradients: a NaN on rank 1 only
    ps = _params(rank, [(8, 6), (6, 10)])
    opt = ortho_fast.Dion(ps, lr=0.01, rank_fraction=0.5, process_group=dist.group.WORLD,
                          replicate_mesh_grad_sync=False)
    grads = _grads(ps, 6)
    if rank == 1:
        grads[1][2, 3] = float("nan")
    out["dion nan synced"] = _step_outcome(opt, ps, grads)
    out["dion nan synced, next step runs"] = _step_outcome(opt, ps, _grads(ps, 7))

    # a zero gradient after a nonzero one, FSDP-sharded, against one process
    full = _params(0, [(8, 6), (6, 10)])
    sharded = [torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)])) for p in full]
    single = [torch.nn.Parameter(p.detach().clone()) for p in full]
    opt_sharded = ortho_fast.Dion(sharded, lr=0.01, rank_fraction=0.5, outer_shard_mesh=mesh["dp"])
    opt_single = ortho_fast.Dion(single, lr=0.01, rank_fraction=0.5)
    for seed, zero in ((8, False), (9, True), (10, True), (11, False)):
        grads = [torch.zeros_like(g) if zero else g for g in _grads(full, seed)]
        _step_outcome(opt_single, single, grads)
        _step_outcome(opt_sharded, sharded, [distribute_tensor(g, mesh, [Shard(0)]) for g in grads])
        worst = max(((a.full_tensor() - b).norm() / b.norm()).item() for a, b in zip(sharded, single))
        out[f"zero gradient step {seed}"] = worst
    return out


@pytest.fixture(scope="module")
def misuse():
    return run_workers(2, _misuse, timeout=120)


@pytest.mark.parametrize("case, text", [
    ("muon extra parameter", "parameters: the ranks disagree"),
    ("muon shapes", "parameters: the ranks disagree"),
    ("dion lr", "options: the ranks disagree"),
    ("dion qr_method", "options: the ranks disagree"),
])
def test_ranks_that_disagree_raise_together(misuse, case, text):
    for rank, out in enumerate(misuse):
        error, unchanged = out[case]
        assert error is not None and text in error, (rank, error)
        assert unchanged, rank


def test_nan_on_one_replica_with_synced_gradients_raises_everywhere(misuse):
    error0, unchanged0 = misuse[0]["dion nan synced"]
    error1, unchanged1 = misuse[1]["dion nan synced"]
    assert error1 is not None and "NaN or Inf" in error1
    assert error0 is not None and "another rank rejected" in error0
    assert unchanged0 and unchanged1
    assert all(out["dion nan synced, next step runs"] == (None, False) for out in misuse)


def test_zero_gradient_after_a_nonzero_one_steps_as_one_process(misuse):
    for out in misuse:
        for seed in (8, 9, 10, 11):
            assert out[f"zero gradient step {seed}"] <= sharded_tolerance("float64"), (seed, out)
