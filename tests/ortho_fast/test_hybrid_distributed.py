"""ortho_fast.HybridOptimizer on 2 gloo ranks, one launch for the module: a gradient that one
rank alone rejects (in a sharded or unsharded Muon / Dion group, an AdamW DTensor shard or a
plain AdamW parameter) raises on both ranks before anything changes, and the next step runs.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ortho_fast import HybridOptimizer

# ---------------------------------------------------------------------------------------
# Distributed: one launch of 2 gloo ranks for the module.
# ---------------------------------------------------------------------------------------

#: name -> (Dion sharded, Muon sharded, index of the parameter whose gradient is NaN on rank 1 only).
#: Parameters: 0 the Dion matrix, 1 the Muon matrix, 2 an AdamW DTensor vector (FSDP), 3 a plain AdamW vector.
_BAD_ON_ONE_RANK = {
    "adamw DTensor shard": (True, True, 2), "adamw plain": (True, True, 3), "muon sharded": (True, True, 1),
    "dion sharded": (True, True, 0), "muon not distributed": (True, False, 1), "dion not distributed": (False, True, 0),
}


def _distributed_hybrid(rank: int, world: int) -> dict:
    """Each case of ``_BAD_ON_ONE_RANK``: a good step, then a step whose gradient rank 1 alone
    rejects (every rank must raise, nothing change), then a good step (the ranks still agree)."""
    import hashlib

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("x",))
    shapes = ((8, 6), (6, 4), (8,), (4,))

    def place(full, sharded):
        return distribute_tensor(full, mesh, [Shard(0)], src_data_rank=None) if sharded else full.clone()

    def local(t):
        return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()

    out = {}
    for name, (dion_sharded, muon_sharded, bad) in _BAD_ON_ONE_RANK.items():
        sharded = (dion_sharded, muon_sharded, True, False)
        gen = torch.Generator().manual_seed(0)
        full = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
        ps = [nn.Parameter(place(w, sh)) for w, sh in zip(full, sharded)]
        groups = [{"params": [p], "algorithm": a} for p, a in zip(ps, ("dion", "muon", "adamw", "adamw"))]
        meshes = dict(outer_shard_mesh=mesh["x"] if dion_sharded else None,
                      distributed_mesh=mesh["x"] if muon_sharded else None)
        opt = HybridOptimizer(groups, seed=3, **meshes)

        def step(nan: bool):
            for i, (p, s, sh) in enumerate(zip(ps, shapes, sharded)):
                g = torch.randn(s, generator=gen, dtype=torch.float64)
                if nan and i == bad and rank == 1:
                    g.view(-1)[-1] = float("nan")  # the last row / entry: rank 1's block when sharded
                p.grad = place(g, sh)
            opt.step()

        step(False)
        before = [local(t) for p in ps for t in (p, *opt.state[p].values())]
        try:
            step(True)
            out[name] = None
        except ValueError as err:
            out[name] = str(err)
        after = [local(t) for p in ps for t in (p, *opt.state[p].values())]
        out[name + " unchanged"] = len(before) == len(after) and all(map(torch.equal, before, after))
        step(False)
        digest = hashlib.sha256(b"".join(local(p).numpy().tobytes() for p, sh in zip(ps, sharded) if not sh))
        digests = [None] * world
        dist.all_gather_object(digests, digest.hexdigest())
        out[name + " replicas agree"] = len(set(digests)) == 1
    return out


@pytest.fixture(scope="module")
def distributed_hybrid():
    from ortho_verify.sharding.workers import run_workers

    return run_workers(2, _distributed_hybrid, timeout=120)


@pytest.mark.parametrize("name", list(_BAD_ON_ONE_RANK))
def test_bad_gradient_on_one_rank_raises_on_every_rank_without_change(distributed_hybrid, name):
    """A NaN that only rank 1 sees — in a sharded Dion or Muon group, in an AdamW DTensor's shard,
    in a plain AdamW parameter, or in a Muon / Dion group that does not communicate beside one
    that does — raises on both ranks (rank 1 naming the group and the gradient, rank 0 saying
    another rank rejected it) before any parameter or state changes on either, and the next
    step runs on both (no rank left waiting in a collective)."""
    index = _BAD_ON_ONE_RANK[name][2]
    for rank, out in enumerate(distributed_hybrid):
        err = out[name]
        assert err is not None, (rank, name)
        if rank == 1:
            assert "NaN or Inf" in err and (index not in (2, 3) or f"param group {index} (adamw): grad" in err), err
        else:
            assert "another rank" in err, err
        assert out[name + " unchanged"] and out[name + " replicas agree"], (rank, name)
