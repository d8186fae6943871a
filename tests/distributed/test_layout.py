"""``ortho_fast.distributed.layout`` and ``comm`` on 4 gloo ranks (one launch for the module).

The index sets of every layout (Shard, uneven and empty shards, _StridedShard from FSDP2 on
top of colwise TP, flattened ndim > 2) are checked against ``DTensor.full_tensor()``; the
collectives against their definitions and their ledger records; the bad meshes raise."""

from __future__ import annotations

import time

import pytest
import torch

from ortho_verify.sharding.workers import WorkerError, run_workers
from tests.distributed.placements import placement

WORLD = 4
# (global shape, placements on the (2, 2) mesh ("a", "b"))
CASES = [
    ((8, 6), ("S0", "S1")), ((7, 5), ("S0", "S1")), ((3, 9), ("S0", "S0")), ((1, 4), ("S0", "R")),
    ((5, 3), ("R", "S1")), ((9, 4), ("SS0", "S0")), ((6, 2, 3), ("S1", "S0")), ((5, 4, 3), ("S2", "R")),
    ((2, 2), ("S1", "S1")),
]


def _layouts(rank: int, world: int):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    from ortho_fast.distributed import comm, layout

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
    axes = {"outer": layout.mesh_axis(mesh["a"], "outer_shard_mesh"),
            "inner": layout.mesh_axis(mesh["b"], "inner_shard_mesh")}
    out = {"mismatch": [], "empty": 0}
    for shape, codes in CASES:
        full = torch.arange(torch.Size(shape).numel(), dtype=torch.float64).reshape(shape)
        d = distribute_tensor(full, mesh, [placement(c, 2) for c in codes], src_data_rank=None)
        lay = layout.matrix_layout(d, axes)
        mat = full.reshape(shape[0], -1)
        local = d.to_local().reshape(len(lay.rows), len(lay.cols))
        if not torch.equal(mat[lay.rows][:, lay.cols], local):
            out["mismatch"].append((shape, codes))
        out["empty"] += local.numel() == 0
        # peer index sets agree with what the peer reports, and the blocks tile the matrix once
        blocks = comm.all_gather_blocks(local, axes["outer"], [tuple(map(len, lay.peer({"outer_shard_mesh": j})))
                                                              for j in range(2)])
        for j, blk in enumerate(blocks):
            r, c = lay.peer({"outer_shard_mesh": j})
            if not torch.equal(mat[r][:, c], blk):
                out["mismatch"].append((shape, codes, "peer", j))
        t = lay.transposed()
        if not torch.equal(mat.T[t.rows][:, t.cols], local.T):
            out["mismatch"].append((shape, codes, "T"))
    # collectives and their records
    with comm.record_collectives() as ledger:
        x = torch.full((3, 2), float(rank))
        comm.all_reduce_axes(x, [axes["outer"], axes["inner"]], tag="x")
        got = comm.gather_blocks(torch.full((1, rank + 1), float(rank)), axes["inner"], [(1, 1 + axes["inner"].ranks[i])
                                 for i in range(2)], owner=0, tag="g")
        back = comm.scatter_blocks(got, axes["inner"], [(1, 1 + axes["inner"].ranks[i]) for i in range(2)], owner=0,
                                   like=x, tag="s")
    out["sum"] = x[0, 0].item()
    out["scatter_ok"] = torch.equal(back, torch.full((1, rank + 1), float(rank)))
    out["records"] = [(r.op, r.axis, r.group_size, r.numel, r.bytes, r.tag) for r in ledger.records]
    # bad meshes
    errors = {}
    for name, call in {
        "two_d": lambda: layout.mesh_axis(mesh, "outer_shard_mesh"),
        "overlap": lambda: layout.check_axes([layout.mesh_axis(dist.group.WORLD, "replicate_mesh"), axes["outer"]]),
        "not_given": lambda: layout.matrix_layout(distribute_tensor(torch.zeros(4, 4), mesh, [placement("S0", 1),
                                                  placement("R", 1)]), {"inner": axes["inner"]}),
        "replicate_shards": lambda: layout.matrix_layout(distribute_tensor(torch.zeros(4, 4), mesh, [
            placement("S0", 1), placement("R", 1)]), {"replicate": axes["outer"]}),
    }.items():
        try:
            call()
            errors[name] = None
        except layout.LayoutError as e:
            errors[name] = str(e)
    out["errors"] = errors
    return out


@pytest.fixture(scope="module")
def results():
    return run_workers(WORLD, _layouts, timeout=120)


def test_index_sets_match_full_tensor(results):
    for r in results:
        assert r["mismatch"] == []
    assert sum(r["empty"] for r in results) > 0  # the (1, 4) and (2, 2) cases have empty shards


def test_collectives_and_ledger(results):
    assert all(r["sum"] == sum(range(WORLD)) for r in results)
    assert all(r["scatter_ok"] for r in results)
    rec = results[0]["records"]
    assert [x[0] for x in rec] == ["all_reduce", "all_reduce", "gather", "scatter"]
    assert rec[0][3:5] == rec[1][3:5] == (6, 24)  # a (3, 2) float32 all-reduce per axis: 6 elements, 24 bytes
    assert rec[2][3] == 2 * 2  # two blocks padded to (1, 2)


def test_bad_meshes_raise(results):
    errs = results[0]["errors"]
    assert "expected a 1-D DeviceMesh" in errs["two_d"]
    assert "overlap" in errs["overlap"]
    assert "none of the meshes the optimizer was given" in errs["not_given"]
    assert "replicate_mesh" in errs["replicate_shards"]


def test_worker_failure_and_timeout_are_reported():
    def boom(rank, world):
        if rank == 1:
            raise ValueError("planted")
        return rank

    with pytest.raises(WorkerError, match="planted"):
        run_workers(2, boom, timeout=60)

    def hang(rank, world):
        import torch.distributed as dist

        if rank == 0:
            dist.all_reduce(torch.zeros(1))  # rank 1 never joins: it is busy elsewhere
        else:
            time.sleep(600)
        return rank

    with pytest.raises(TimeoutError, match=r"ranks \[0, 1\] of 2 did not finish"):
        run_workers(2, hang, timeout=5)


@pytest.mark.parametrize("world_size, backend, name", [(0, "gloo", "world_size"), (2, "mpi", "backend"),
                                                       (True, "gloo", "world_size")])
def test_run_workers_names_a_bad_argument_before_launching(world_size, backend, name):
    with pytest.raises(ValueError, match=f"^{name}: expected"):
        run_workers(world_size, lambda rank, ws: rank, backend=backend)
