"""Three distributed guarantees, one launch of 2 gloo ranks (``ortho_verify.sharding.workers.run_workers``):

- sharded Dion's column norms cannot overflow: a float32 gradient with entries of 1e19..1e20 (the
  squares pass float32's 3.4e38) steps on the FSDP and TP layouts as the one-process float32 Dion
  does (whose norms were already safe), within ``sharded_tolerance("float32")``, and the weights
  move (the old sharded norm gave inf, Q = 0 and a zero update forever);
- ``load_state_dict`` of a distributed optimizer with a NaN in one rank's shard of the state raises
  on every rank (that rank's error names the key, the other rank's says another rank rejected it)
  and changes no state on any rank; the next load of a good checkpoint still works (Dion, Dion2,
  Muon, and HybridOptimizer with Muon and Dion2 groups);
- runners of one optimizer on the same mesh agree once on load (one all-reduce, tag "load").
"""

from __future__ import annotations

import copy

import pytest
import torch

from ortho_verify.sharding.workers import run_workers
from ortho_verify.tolerances import sharded_tolerance

SHAPES = [(16, 8), (8, 12)]  # tall and wide: the working columns are the short side either way


def _full(seed: int, scale: float = 1.0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen) * scale for s in SHAPES]


def _overflow(mesh, placement) -> dict:
    """Max relative difference of the weights (sharded vs one process, 3 steps of huge float32
    gradients) and whether every sharded weight moved on each step."""
    from torch.distributed.tensor import distribute_tensor

    import ortho_fast

    w0 = _full(0, 0.02)
    sharded = [torch.nn.Parameter(distribute_tensor(w.clone(), mesh, [placement])) for w in w0]
    single = [torch.nn.Parameter(w.clone()) for w in w0]
    kw = dict(lr=0.01, rank_fraction=0.5, weight_decay=0.0)
    role = "outer_shard_mesh" if placement.dim == 0 else "inner_shard_mesh"
    opt_sharded = ortho_fast.Dion(sharded, **kw, **{role: mesh})
    opt_single = ortho_fast.Dion(single, **kw)
    worst, moved = 0.0, True
    for seed in (1, 2, 3):
        grads = _full(seed, 1e19 * seed)  # entries up to ~4e19 · seed: squares overflow float32
        before = [p.full_tensor().clone() for p in sharded]
        for p, q, g in zip(sharded, single, grads):
            p.grad = distribute_tensor(g, mesh, [placement])
            q.grad = g.clone()
        opt_sharded.step()
        opt_single.step()
        for p, q, b in zip(sharded, single, before):
            full = p.full_tensor()
            moved &= bool((full - b).abs().max() > 0) and bool(torch.isfinite(full).all())
            worst = max(worst, float((full - q.detach()).norm() / q.detach().norm()))
    return {"worst": worst, "moved": moved}


def _state_tensors(opt) -> list[torch.Tensor]:
    from torch.distributed.tensor import DTensor

    out = []
    for st in opt.state.values():
        for v in st.values():
            if torch.is_tensor(v):
                out.append((v.to_local() if isinstance(v, DTensor) else v).clone())
    return out


def _load_outcome(opt, state_dict) -> tuple[str | None, bool]:
    before = _state_tensors(opt)
    try:
        opt.load_state_dict(state_dict)
        error = None
    except ValueError as err:
        error = str(err)
    after = _state_tensors(opt)
    return error, len(before) == len(after) and all(map(torch.equal, before, after))


def _corrupt(state_dict, key: str, rank: int):
    """A deep copy of ``state_dict`` with a NaN in rank 1's local part of the first state's ``key``."""
    from torch.distributed.tensor import DTensor

    bad = copy.deepcopy(state_dict)
    if rank == 1:
        t = bad["state"][0][key]
        (t.to_local() if isinstance(t, DTensor) else t).view(-1)[0] = float("nan")
    return bad


def _workers(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import ortho_fast

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("x",))["x"]
    out = {"overflow FSDP": _overflow(mesh, Shard(0)), "overflow TP": _overflow(mesh, Shard(1))}

    def place(t):  # FSDP: Shard(0) on the mesh
        return distribute_tensor(t, mesh, [Shard(0)])

    # One good step, then load a checkpoint with a NaN in rank 1's part of the state key: Dion and
    # Dion2 on FSDP shards, Muon DDP (plain parameters on a process group).
    cases = {"dion": (lambda ps: ortho_fast.Dion(ps, lr=0.01, rank_fraction=0.5, outer_shard_mesh=mesh), place,
                      "momentum", 4),
             "dion2": (lambda ps: ortho_fast.Dion2(ps, lr=0.01, fraction=0.5, distributed_mesh=mesh), place,
                       "momentum", 8),
             "muon": (lambda ps: ortho_fast.Muon(ps, lr=0.02, distributed_mesh=mesh), lambda t: t,
                      "momentum_buffer", 6)}
    for name, (build, put, key, seed) in cases.items():
        ps = [torch.nn.Parameter(put(w.clone())) for w in _full(seed)]
        opt = build(ps)
        for p, g in zip(ps, _full(seed + 1)):
            p.grad = put(g)
        opt.step()
        good = copy.deepcopy(opt.state_dict())
        out[f"{name} load nan"] = _load_outcome(opt, _corrupt(good, key, rank))
        out[f"{name} load good"] = _load_outcome(opt, good)

    # HybridOptimizer with a Muon (DDP) and a Dion2 (FSDP) group on the same mesh: both runners
    # reduce over the same axis, so a load agrees once (it agreed once per runner before)
    from ortho_fast.distributed.comm import record_collectives

    muon_ps = [torch.nn.Parameter(w.clone()) for w in _full(10)]
    dion2_ps = [torch.nn.Parameter(place(w.clone())) for w in _full(12)]
    opt = ortho_fast.HybridOptimizer([{"params": muon_ps, "algorithm": "muon", "lr": 0.02},
                                      {"params": dion2_ps, "algorithm": "dion2", "lr": 0.01, "fraction": 0.5}],
                                     distributed_mesh=mesh)
    for p, g in zip(muon_ps + dion2_ps, _full(11) + [place(g) for g in _full(13)]):
        p.grad = g
    opt.step()
    good = copy.deepcopy(opt.state_dict())
    with record_collectives() as ledger:
        outcome = _load_outcome(opt, good)
    out["hybrid load good"] = outcome
    out["hybrid load all-reduces"] = sum(1 for r in ledger.records if r.tag == "load")
    out["hybrid load nan"] = _load_outcome(opt, _corrupt(good, "momentum_buffer", rank))
    return out


@pytest.fixture(scope="module")
def results():
    return run_workers(2, _workers, timeout=120)


@pytest.mark.parametrize("layout", ["overflow FSDP", "overflow TP"])
def test_sharded_dion_column_norms_do_not_overflow(results, layout):
    for out in results:
        assert out[layout]["moved"], out[layout]
        assert out[layout]["worst"] <= sharded_tolerance("float32"), out[layout]


@pytest.mark.parametrize("optimizer, key", [("dion", "momentum"), ("dion2", "momentum"), ("muon", "momentum_buffer"),
                                            ("hybrid", "momentum_buffer")])
def test_load_state_dict_with_a_nan_on_one_rank_raises_on_every_rank(results, optimizer, key):
    error0, unchanged0 = results[0][f"{optimizer} load nan"]
    error1, unchanged1 = results[1][f"{optimizer} load nan"]
    assert error1 is not None and key in error1 and "NaN" in error1, error1
    assert error0 is not None and "another rank rejected" in error0, error0
    assert unchanged0 and unchanged1
    assert all(out[f"{optimizer} load good"][0] is None for out in results)


def test_runners_on_the_same_mesh_agree_once_on_load(results):
    """HybridOptimizer's Muon and Dion2 runners share ``distributed_mesh``: one all-reduce (tag
    "load") per load, not one per runner."""
    assert all(out["hybrid load all-reduces"] == 1 for out in results), [out["hybrid load all-reduces"]
                                                                         for out in results]
