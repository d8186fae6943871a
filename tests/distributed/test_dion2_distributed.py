"""Distributed ``ortho_fast.Dion2`` on 4 gloo ranks (one launch): every Dion2 layout of
``ortho-verify sharding`` against one process ("global": DDP, FSDP, TP colwise / rowwise, HSDP,
FSDP + TP) or against its own definition ("local"), with the communication equal to
``dion2_comm_volume``, and hypothesis-drawn placements on a (2, 2) mesh; a planted skipped all-reduce fails; "local"
differs from "global" where the selected dimension is sharded; a bad gradient on one rank raises on every rank, changing
nothing."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings, strategies as st

import ortho_fast
from ortho_verify import sharding
from ortho_verify.sharding.workers import run_workers
from ortho_verify.tolerances import sharded_tolerance

WORLD = 4
NAMES = [f"dion2/{lay.name}" for lay, _ in sharding.layouts_for(WORLD, ["dion2/"])]
SHARDED = [n for n in NAMES if "DDP" not in n]


@st.composite
def _random_layouts(draw):
    """A Dion2 layout on the (2, 2) mesh ("a" = distributed_mesh, "b" = tp_mesh) with any placement
    pair (Replicate, Shard(0/1), _StridedShard(0) under a Shard(0)), a matrix of 1..11 by 1..11, a
    fraction and a selection scope ("local" checked against its definition)."""
    b = draw(st.sampled_from(("R", "S0", "S1")))
    a = draw(st.sampled_from(("R", "S0", "S1") + (("SS0",) if b == "S0" else ())))
    scope = draw(st.sampled_from(("global", "local")))
    lay = sharding.Layout(f"random {a},{b} {scope}", "dion2", ("a", "b"), (2, 2), (a, b),
                          (("distributed_mesh", "a"), ("tp_mesh", "b")), "local" if scope == "local" else "equal",
                          (("selection_scope", scope), ("fraction", draw(st.sampled_from((0.1, 0.3, 0.5))))))
    return lay, (draw(st.integers(1, 11)), draw(st.integers(1, 11)))


def _draw(count: int) -> list:
    drawn: list = []

    @settings(max_examples=count, derandomize=True, database=None, deadline=None)
    @given(_random_layouts())
    def collect(case):
        drawn.append(case)

    collect()
    return list(dict.fromkeys(drawn))


RANDOM = _draw(12)


def _fsdp(scope: str, mesh, full: torch.Tensor, grad: torch.Tensor):
    from torch.distributed.tensor import Shard, distribute_tensor

    p = torch.nn.Parameter(distribute_tensor(full.clone(), mesh, [Shard(0)], src_data_rank=None))
    opt = ortho_fast.Dion2([p], distributed_mesh=mesh, lr=0.1, fraction=0.25, selection_scope=scope,
                           dtype=torch.float64)
    p.grad = distribute_tensor(grad.clone(), mesh, [Shard(0)], src_data_rank=None)
    return p, opt


def _gram_against_one_process(mesh, full: torch.Tensor, grad: torch.Tensor) -> list:
    """FSDP (``Shard(0)``) of a wide 16 x 40 (rows selected and sharded) and of a tall 40 x 16 (columns
    selected, B_S summed over the row shards) with gram=True in float16 / float32 stepped twice, each against one
    process: equal bit for bit (B_S is assembled exactly and orthogonalized by the one-process call)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    out = []
    for w0, g, dtype in ((full, grad, torch.float16), (full.T.contiguous(), grad.T.contiguous(), torch.float32)):
        p = torch.nn.Parameter(distribute_tensor(w0.clone(), mesh, [Shard(0)], src_data_rank=None))
        q = torch.nn.Parameter(w0.clone())
        options = dict(lr=0.1, fraction=0.25, selection_scope="global", dtype=dtype, gram=True)
        sharded, alone = ortho_fast.Dion2([p], distributed_mesh=mesh, **options), ortho_fast.Dion2([q], **options)
        for step in range(2):
            p.grad = distribute_tensor((g * (step + 1)).clone(), mesh, [Shard(0)], src_data_rank=None)
            q.grad = g * (step + 1)
            sharded.step(), alone.step()
        out.append(bool(torch.equal(p.full_tensor(), q.detach())))
    return out


def _launch(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    layouts = sharding.layouts_for(world, ["dion2/"])
    plan = sharding.Plan(layouts, dtypes=("float64", "float32"), steps=sharding.QUICK_STEPS)
    out = {"rows": sharding.worker(rank, world, plan), "random": []}
    for lay, shape in RANDOM:
        random_plan = sharding.Plan([(lay, (2, 2))], dtypes=("float64",), matrices=(shape,), steps=2)
        out["random"] += sharding.worker(rank, world, random_plan) or []
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
    out["gram_bitwise"] = _gram_against_one_process(mesh, full.float(), grad.float())
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


def test_random_layouts_equal_one_process_or_their_definition(launched):
    rows = launched[0]["random"]
    assert len(rows) == len(RANDOM)
    for r in rows:
        assert r["status"] == "pass", (r["layout"], r["errors"], r["notes"], r["comm"]["matrices"])
        assert r["comm"]["verdict"] == "exact", (r["layout"], r["comm"]["matrices"])


def test_planted_skipped_all_reduce_fails(launched):
    rows = launched[0]["planted"]
    assert rows and all(r["status"] == "FAIL" and r["worst"] > 1e3 * r["bound"] for r in rows), \
        [(r["layout"], r["worst"]) for r in rows]


def test_local_differs_from_global_when_rows_are_sharded(launched):
    assert launched[0]["local_vs_global"] > 1e-3


def test_gram_steps_equal_one_process_bitwise(launched):
    assert all(out["gram_bitwise"] == [True, True] for out in launched), [out["gram_bitwise"] for out in launched]


def test_bad_gradient_on_one_rank_raises_everywhere(launched):
    for rank, out in enumerate(launched):
        assert out["bad_grad"] != "no error", rank
        assert ("NaN" in out["bad_grad"]) == (rank == 1), (rank, out["bad_grad"])
        assert out["unchanged"], rank
