"""Distributed ``ortho_fast.Dion2`` on 4 gloo ranks (one launch): every Dion2 layout of
``ortho-verify sharding`` against one process ("global": DDP, FSDP, TP colwise / rowwise, HSDP,
FSDP + TP) or against its own definition ("local"), with the communication equal to
``dion2_comm_volume``; a planted skipped all-reduce fails; "local" differs from "global" where
the selected dimension is sharded; a bad gradient on one rank raises on every rank, changing
nothing."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import ortho_fast
from ortho_verify import sharding
from ortho_verify.tolerances import sharded_tolerance
from ortho_verify.workers import run_workers

WORLD = 4
NAMES = [f"dion2/{lay.name}" for lay, _ in sharding.layouts_for(WORLD, ["dion2/"])]
SHARDED = [n for n in NAMES if "DDP" not in n]


def _fsdp(scope: str, mesh, full: torch.Tensor, grad: torch.Tensor):
    from torch.distributed.tensor import Shard, distribute_tensor

    p = torch.nn.Parameter(distribute_tensor(full.clone(), mesh, [Shard(0)], src_data_rank=None))
    opt = ortho_fast.Dion2([p], distributed_mesh=mesh, lr=0.1, fraction=0.25, selection_scope=scope,
                           dtype=torch.float64)
    p.grad = distribute_tensor(grad.clone(), mesh, [Shard(0)], src_data_rank=None)
    return p, opt


def _launch(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    layouts = sharding.layouts_for(world, ["dion2/"])
    plan = sharding.Plan(layouts, dtypes=("float64", "float32"), steps=sharding.QUICK_STEPS)
    out = {"rows": sharding.worker(rank, world, plan)}
    planted = sharding.Plan([(lay, s) for lay, s in layouts if f"dion2/{lay.name}" in SHARDED], dtypes=("float64",),
                            matrices=sharding.QUICK_MATRICES, steps=1, plant="no_all_reduce")
    out["planted"] = sharding.worker(rank, world, planted)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    gen = torch.Generator().manual_seed(3)
    full, grad = torch.randn(16, 40, generator=gen, dtype=torch.float64), torch.randn(16, 40, generator=gen,
                                                                                       dtype=torch.float64)
    results = {}
    for scope in ("global", "local"):
        p, opt = _fsdp(scope, mesh, full, grad)
        opt.step()
        results[scope] = p.full_tensor()
    out["local_vs_global"] = float((results["local"] - results["global"]).norm() / results["global"].norm())
    p, opt = _fsdp("global", mesh, full, grad)
    before = p.full_tensor().clone()
    if rank == 1:
        p.grad.to_local().fill_(float("nan"))
    try:
        opt.step()
        out["bad_grad"] = "no error"
    except ValueError as err:
        out["bad_grad"] = str(err)
    out["unchanged"] = bool(torch.equal(p.full_tensor(), before)) and not opt.state.get(p)
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def launched():
    return run_workers(WORLD, _launch, timeout=600)


def test_every_layout_passes_with_the_analytic_volume(launched):
    rows = launched[0]["rows"]
    assert sorted({f"{r['optimizer']}/{r['layout']}" for r in rows}) == sorted(NAMES)
    for r in rows:
        assert r["status"] == "pass", (r["layout"], r["dtype"], r["errors"], r["notes"])
        assert r["worst"] <= sharded_tolerance(r["dtype"])
        assert r["comm"]["verdict"] == "exact", (r["layout"], r["comm"])
        assert r["replicas_identical"]
    assert {r["check"] for r in rows} == {"equal", "local"}
    assert all(r["comm"]["numel"] > 0 for r in rows if f"dion2/{r['layout']}" in SHARDED)


def test_planted_skipped_all_reduce_fails(launched):
    rows = launched[0]["planted"]
    assert rows and all(r["status"] == "FAIL" and r["worst"] > 1e3 * r["bound"] for r in rows), \
        [(r["layout"], r["worst"]) for r in rows]


def test_local_differs_from_global_when_rows_are_sharded(launched):
    assert launched[0]["local_vs_global"] > 1e-3


def test_bad_gradient_on_one_rank_raises_everywhere(launched):
    for rank, out in enumerate(launched):
        assert out["bad_grad"] != "no error", rank
        assert ("NaN" in out["bad_grad"]) == (rank == 1), (rank, out["bad_grad"])
        assert out["unchanged"], rank
