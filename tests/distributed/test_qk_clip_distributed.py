"""QK-clip of sharded attention weights (ortho_fast.distributed.qk_clip) against one process, on 4 gloo
ranks (one launch for the module): FSDP (Shard(0), heads crossing shard boundaries, uneven and empty shards),
TP colwise (Shard(0)) and rowwise (Shard(1)), FSDP on colwise TP (_StridedShard); fused and
separate weights, GQA. Muon itself is bitwise the one-process step on these layouts and the clip is
elementwise per row, so weights must be bitwise equal after every step. A NaN logit on one rank
raises on every rank, before anything changes.
"""

from __future__ import annotations

import pytest
import torch

from ortho_verify.sharding.workers import run_workers
from tests.distributed.placements import placement  # placement codes: R, S<d>, SS<d> (_StridedShard)

HEADS = dict(qk_clip_threshold=5.0, qk_clip_num_heads=4, qk_clip_num_kv_heads=2)
LOGITS = torch.tensor([1.0, 4.0, 6.0, 30.0])  # key group 0 below τ, group 1 above
# (name, mesh, dp, tp, [(shape, placement codes, role)], layout): shapes in head blocks of
# 8 (qkv: 4 + 2·2) / 4 (query) / 2 (key) rows.
CASES = [
    ("fsdp fused", "1d", "x", None, [((40, 6), ("S0",), "qkv")], "concatenated"),  # head_dim 5: heads cross shards
    ("fsdp fused grouped", "1d", "x", None, [((24, 5), ("S0",), "qkv")], "grouped"),  # 6 rows a rank, head_dim 3
    # the key's 6 rows over 4 ranks: 2, 2, 2 and an empty shard
    ("fsdp separate uneven", "1d", "x", None, [((12, 6), ("S0",), "query"), ((6, 6), ("S0",), "key")], "concatenated"),
    ("tp colwise fused", "1d", None, "x", [((32, 8), ("S0",), "qkv")], "grouped"),
    ("tp rowwise fused", "1d", None, "x", [((16, 12), ("S1",), "qkv")], "concatenated"),
    ("fsdp+tp colwise", "2d", "dp", "tp", [((40, 6), ("SS0", "S0"), "qkv")], "concatenated"),
]


def _run(case, meshes) -> dict:
    from torch.distributed.tensor import distribute_tensor

    from ortho_fast import Muon

    name, mesh_name, dp, tp, specs, layout = case
    mesh = meshes[mesh_name]
    axis = {"x": mesh if mesh_name == "1d" else None, "dp": mesh["dp"] if mesh_name == "2d" else None,
            "tp": mesh["tp"] if mesh_name == "2d" else None, None: None}
    split = mesh.size(-1)
    gen = torch.Generator().manual_seed(7)
    fulls = [0.05 * torch.randn(shape, generator=gen, dtype=torch.float64) for shape, _, _ in specs]
    placements = [tuple(placement(c, split) for c in codes) for _, codes, _ in specs]
    sharded = [torch.nn.Parameter(distribute_tensor(w, mesh, pl, src_data_rank=None))
               for w, pl in zip(fulls, placements)]
    refs = [torch.nn.Parameter(w.clone()) for w in fulls]
    roles = [role for _, _, role in specs]
    kw = dict(lr=0.05, dtype=torch.float64, qk_clip_layout=layout, **HEADS)
    group = {"qk_clip_roles": roles, "qk_clip_layer": "attn"}
    opt = Muon([{**group, "params": sharded}], distributed_mesh=axis[dp], tp_mesh=axis[tp], **kw)
    ref = Muon([{**group, "params": refs}], **kw)
    equal = True
    for step in range(2):
        grads = [torch.randn(w.shape, generator=gen, dtype=torch.float64) for w in fulls]
        for p, q, g, pl in zip(sharded, refs, grads, placements):
            p.grad = distribute_tensor(g, mesh, pl, src_data_rank=None)
            q.grad = g.clone()
        opt.step(qk_logits={"attn": LOGITS * (step + 1)})
        ref.step(qk_logits={"attn": LOGITS * (step + 1)})
        equal &= all(torch.equal(p.full_tensor(), q.detach()) for p, q in zip(sharded, refs))
    clipped = not torch.equal(refs[0].detach(), fulls[0])  # the clip did something (the update too)
    return {"equal": equal, "clipped": clipped}


def _nan_on_one_rank(mesh, rank: int) -> tuple[str | None, bool]:
    from torch.distributed.tensor import distribute_tensor

    from ortho_fast import Muon

    w = torch.randn(40, 6, dtype=torch.float64)
    p = torch.nn.Parameter(distribute_tensor(w, mesh, [placement("S0", 1)], src_data_rank=None))
    opt = Muon([{"params": [p], "qk_clip_roles": ["qkv"], "qk_clip_layer": "a"}], distributed_mesh=mesh, **HEADS)
    p.grad = distribute_tensor(torch.randn(40, 6, dtype=torch.float64), mesh, [placement("S0", 1)],
                               src_data_rank=None)
    logits = LOGITS.clone()
    if rank == 1:
        logits[2] = float("nan")
    before = p.to_local().clone()
    try:
        opt.step(qk_logits={"a": logits})
        error = None
    except ValueError as err:
        error = str(err)
    return error, torch.equal(p.to_local(), before) and len(opt.state) == 0


def _worker(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    meshes = {"1d": init_device_mesh("cpu", (world,), mesh_dim_names=("x",)),
              "2d": init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))}
    out = {case[0]: _run(case, meshes) for case in CASES}
    out["nan on rank 1"] = _nan_on_one_rank(meshes["1d"], rank)
    return out


@pytest.fixture(scope="module")
def world4():
    return run_workers(4, _worker, timeout=240)


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_sharded_clip_equals_one_process(world4, name):
    for rank, result in enumerate(world4):
        assert result[name]["equal"], (name, rank)
        assert result[name]["clipped"], (name, rank)


def test_nan_logit_on_one_rank_raises_everywhere(world4):
    for rank, (error, unchanged) in enumerate(r["nan on rank 1"] for r in world4):
        assert error is not None, rank
        assert unchanged, rank
    assert "qk_logits of layer 'a'" in world4[1]["nan on rank 1"][0]
