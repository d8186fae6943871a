"""Distributed ``ortho_fast.Dion`` on gloo ranks against one process (one launch per world size).

Every layout of DESIGN.md's table — DDP (both sync modes), FSDP Shard(0), TP colwise / rowwise,
HSDP (compressed sync and FSDP-synced gradients), FSDP + TP with ``_StridedShard``, HSDP + TP,
FSDP2 ``fully_shard`` over ``parallelize_module`` — with tall and wide matrices (both
orientations), uneven and empty shards, the three QR methods, Orth-Dion, two power
iterations, flattened ndim > 2 weights and mixed precision, steps 3 times and is compared with
``ortho_fast.Dion`` in one process on the full tensors (``DTensor.full_tensor()``): weights,
momenta and Q in relative Frobenius norm within ``ortho_verify.tolerances.sharded_tolerance``
(DESIGN.md's contract). Under compressed sync the one-process run is fed the replicas' mean
gradient, the replicas' weights and Q must be identical and their mean momentum must match
(and every replica's after ``synchronize_for_checkpoint``). Hypothesis draws further layouts
(shapes 1..11, placements on a (2, 2) mesh, QR method, right factor, rank fraction). The ledger
of each step equals ``dion_comm_volume`` + ``dion_check_volume``; bad meshes and parameters
raise at construction on every rank, a bad gradient on one rank raises on all (no hang); a
``torch.distributed.checkpoint`` save / load into ``init_state()`` / continue equals the
uninterrupted run bitwise.
"""

from __future__ import annotations

import copy
import hashlib
import io
import math
import zlib
from typing import NamedTuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ortho_fast
from ortho_fast.distributed.dion import dion_check_volume, dion_comm_volume
from ortho_verify.tolerances import sharded_tolerance
from ortho_verify.workers import run_workers

LR, MU, WD, SEED, STEPS = 0.05, 0.9, 0.1, 5, 3
F64, F32 = torch.float64, torch.float32
#: Mesh shapes (and dim names) per world size; a case names one by its key.
MESHES = {4: {"x": ((4,), ("x",)), "ab": ((2, 2), ("a", "b")), "roi": ((2, 1, 2), ("r", "o", "i"))},
          2: {"x": ((2,), ("x",))}}
OUT, IN, REP = "outer_shard_mesh", "inner_shard_mesh", "replicate_mesh"


class Case(NamedTuple):
    """One layout: ``roles`` (optimizer argument, mesh dim; ("process_group", None) for the world
    group), ``params`` ((global shape, placement codes or None for a plain tensor), ...),
    ``mode``: "equal" (same gradient everywhere), "compressed" (each replica its own gradient),
    "bitwise" (same gradient, result bitwise equal to one process); ``ledger``: check the
    per-step volume against the analytic one (dims divisible by their shard counts)."""

    name: str
    mesh: str
    roles: tuple
    params: tuple
    options: tuple = ()
    dtype: torch.dtype = F64
    mode: str = "equal"
    ledger: bool = False


def _opts(**kw) -> tuple:
    return tuple(kw.items())


TALL_WIDE = (((16, 8), ("S0",)), ((8, 16), ("S0",)))
HALF = _opts(rank_fraction=0.5)
CASES = {4: [
    Case("FSDP tall + wide", "x", ((OUT, "x"),), TALL_WIDE, HALF, ledger=True),
    Case("FSDP float32", "x", ((OUT, "x"),), TALL_WIDE, HALF, F32),
    Case("FSDP uneven + empty shards", "x", ((OUT, "x"),), (((10, 7), ("S0",)), ((3, 2), ("S0",)), ((2, 9), ("S0",)))),
    Case("TP colwise", "x", ((IN, "x"),), (((12, 8), ("S0",)), ((8, 12), ("S0",))), ledger=True),
    Case("TP rowwise", "x", ((IN, "x"),), (((12, 8), ("S1",)), ((8, 12), ("S1",))), ledger=True),
    Case("FSDP cholesky_qr", "x", ((OUT, "x"),), TALL_WIDE, _opts(rank_fraction=0.5, qr_method="cholesky_qr"),
         ledger=True),
    Case("FSDP randomized, 2 power iterations", "x", ((OUT, "x"),), TALL_WIDE,
         _opts(rank_fraction=0.5, qr_method="randomized_cholesky_qr", power_iters=2), ledger=True),
    Case("TP Orth-Dion", "x", ((IN, "x"),), (((8, 16), ("S0",)), ((16, 8), ("S1",))),
         _opts(rank_fraction=0.5, right_factor="qr"), ledger=True),
    Case("FSDP flatten", "x", ((OUT, "x"),), (((8, 2, 3), ("S0",)), ((4, 4, 3), ("S1",)), ((12, 4, 2), ("S1",))),
         _opts(flatten=True), ledger=True),
    Case("FSDP mixed precision", "x", ((OUT, "x"),), TALL_WIDE,
         _opts(rank_fraction=0.5, momentum_dtype=F32, q_dtype=F32)),
    Case("DDP compressed", "x", (("process_group", None),), (((12, 8), None), ((6, 10), None)), HALF,
         mode="compressed", ledger=True),
    Case("DDP grads synced", "x", ((REP, "x"),), (((12, 8), None), ((6, 10), None)),
         HALF + _opts(replicate_mesh_grad_sync=False), mode="bitwise", ledger=True),
    Case("HSDP compressed", "ab", ((REP, "a"), (OUT, "b")), (((16, 8), ("R", "S0")), ((8, 16), ("R", "S0"))), HALF,
         mode="compressed", ledger=True),
    Case("HSDP compressed float32", "ab", ((REP, "a"), (OUT, "b")), (((16, 8), ("R", "S0")), ((7, 10), ("R", "S0"))),
         HALF, F32, mode="compressed"),
    Case("HSDP grads synced", "ab", ((REP, "a"), (OUT, "b")), (((16, 8), ("R", "S0")), ((8, 16), ("R", "S0"))),
         HALF + _opts(replicate_mesh_grad_sync=False), ledger=True),
    Case("FSDP + TP colwise (_StridedShard)", "ab", ((OUT, "a"), (IN, "b")),
         (((12, 8), ("SS0", "S0")), ((8, 12), ("SS0", "S0"))), HALF, ledger=True),
    Case("FSDP + TP rowwise", "ab", ((OUT, "a"), (IN, "b")), (((12, 8), ("S0", "S1")), ((8, 12), ("S0", "S1"))), HALF,
         ledger=True),
    Case("FSDP + TP uneven, cholesky_qr", "ab", ((OUT, "a"), (IN, "b")),
         (((7, 5), ("S0", "S1")), ((5, 7), ("SS0", "S0")), ((3, 9), ("S1", "S0"))), _opts(qr_method="cholesky_qr")),
    Case("FSDP + TP uneven, randomized, float32", "ab", ((OUT, "a"), (IN, "b")),
         (((9, 6), ("S0", "S1")), ((6, 11), ("SS0", "S0"))), _opts(qr_method="randomized_cholesky_qr"), F32),
    Case("HSDP + TP compressed", "roi", ((REP, "r"), (OUT, "o"), (IN, "i")),
         (((12, 8), ("R", "S0", "S0")), ((8, 12), ("R", "S0", "S1"))), HALF, mode="compressed"),
], 2: [
    Case("FSDP uneven", "x", ((OUT, "x"),), (((7, 5), ("S0",)), ((5, 7), ("S0",)), ((1, 3), ("S0",)))),
    Case("TP rowwise Orth-Dion", "x", ((IN, "x"),), (((6, 9), ("S1",)), ((9, 6), ("S1",))), _opts(right_factor="qr")),
    Case("DDP compressed", "x", ((REP, "x"),), (((10, 4), None),), HALF, mode="compressed", ledger=True),
]}


# ---------------------------------------------------------------------------------------
# Inside the workers.
# ---------------------------------------------------------------------------------------


def _placement(code: str):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if code == "R":
        return Replicate()
    if code.startswith("SS"):
        return _StridedShard(int(code[2:]), split_factor=2)
    return Shard(int(code[1:]))


def _tensor(key, shape, dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
    return torch.randn(shape, generator=gen, dtype=F64).to(dtype)


def _place(full: torch.Tensor, mesh, codes) -> torch.Tensor:
    from torch.distributed.tensor import distribute_tensor

    if codes is None:
        return full.clone()
    return distribute_tensor(full, mesh, [_placement(c) for c in codes], src_data_rank=None)


def _full(t: torch.Tensor) -> torch.Tensor:
    from ortho_fast.distributed.layout import is_dtensor

    return (t.full_tensor() if is_dtensor(t) else t).detach().to(F64, copy=True)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    scale = float(torch.linalg.norm(want))
    return float(torch.linalg.norm(got - want)) / (scale if scale else 1.0)


def _replica(case: Case, mesh) -> tuple[int, int]:
    """(this rank's replica, number of replicas) whose gradients differ (compressed mode)."""
    import torch.distributed as dist

    if case.mode != "compressed":
        return 0, 1
    role = dict(case.roles)
    if "process_group" in role:
        return dist.get_rank(), dist.get_world_size()
    d = mesh.mesh_dim_names.index(role[REP])
    return mesh.get_coordinate()[d], mesh.shape[d]


def _mesh_args(case: Case, mesh) -> dict:
    import torch.distributed as dist

    return {arg: dist.group.WORLD if dim is None else mesh[dim] for arg, dim in case.roles}


def _grads(case: Case, step: int, replica: int, replicas: int):
    """This replica's gradients and the replicas' mean (what one process is fed)."""
    mine, mean = [], []
    for i, (shape, _) in enumerate(case.params):
        per = [_tensor((case.name, "g", i, step, k), shape, F64) for k in range(replicas)]
        mine.append(per[replica].to(case.dtype))
        mean.append((sum(per) / replicas).to(case.dtype))
    return mine, mean


def _digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def _run_case(case: Case, meshes: dict, steps: int = STEPS) -> dict | None:
    """Step ``case`` sharded; on rank 0 the comparison with one process, None elsewhere."""
    import torch.distributed as dist

    from ortho_fast.distributed.comm import record_collectives

    mesh, rank, world = meshes[case.mesh], dist.get_rank(), dist.get_world_size()
    w0 = [_tensor((case.name, "w", i), shape, case.dtype) for i, (shape, _) in enumerate(case.params)]
    params = [torch.nn.Parameter(_place(w, mesh, codes)) for w, (_, codes) in zip(w0, case.params)]
    opts = dict(lr=LR, mu=MU, weight_decay=WD, seed=SEED, **dict(case.options))
    opt = ortho_fast.Dion(params, **opts, **_mesh_args(case, mesh))
    replica, replicas = _replica(case, mesh)
    ref_params = [torch.nn.Parameter(w.clone()) for w in w0]
    ref = ortho_fast.Dion(ref_params, **{k: v for k, v in opts.items() if k != "replicate_mesh_grad_sync"})
    ledgers = []
    for step in range(steps):
        mine, mean = _grads(case, step, replica, replicas)
        for p, g, (_, codes) in zip(params, mine, case.params):
            p.grad = _place(g, mesh, codes)
        with record_collectives() as ledger:
            opt.step()
        ledgers.append(ledger.by_tag())
        if rank == 0:
            for p, g in zip(ref_params, mean):
                p.grad = g
            ref.step()
    got = {"weights": [_full(p) for p in params], "Q": [_full(opt.state[p]["Q"]) for p in params],
           "momentum": [_full(opt.state[p]["momentum"]) for p in params]}
    digests = [None] * world
    dist.all_gather_object(digests, _digest(got["weights"] + got["Q"]))
    if case.mode == "compressed":  # each replica's momentum is held by world / replicas ranks
        for t in got["momentum"]:
            dist.all_reduce(t)
            t.div_(world)
        opt.synchronize_for_checkpoint()
        synced = [_full(opt.state[p]["momentum"]) for p in params]
    if rank != 0:
        return None
    want = {"weights": [p.detach().double() for p in ref_params],
            "Q": [ref.state[p]["Q"].double() for p in ref_params],
            "momentum": [ref.state[p]["momentum"].double() for p in ref_params]}
    out = {"errors": {k: max(_rel(g, w) for g, w in zip(got[k], want[k])) for k in got},
           "bitwise": all(torch.equal(g, w) for k in got for g, w in zip(got[k], want[k])),
           "identical": len(set(digests)) == 1, "ledgers": ledgers}
    if case.mode == "compressed":
        out["errors"]["momentum after synchronize_for_checkpoint"] = max(_rel(g, w) for g, w in zip(synced,
                                                                                                    want["momentum"]))
    return out


def _fsdp2_tp_case(meshes: dict) -> dict | None:
    """FSDP2 ``fully_shard`` on "a" over TP ``parallelize_module`` on "b" (colwise, then rowwise)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = meshes["ab"]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(10, 5, bias=False)).double()
    full0 = [p.detach().clone() for p in model.parameters()]
    parallelize_module(model, mesh["b"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["a"])
    params = list(model.parameters())
    opt = ortho_fast.Dion(params, lr=LR, mu=MU, weight_decay=WD, seed=SEED, outer_shard_mesh=mesh["a"],
                          inner_shard_mesh=mesh["b"])
    ref_params = [torch.nn.Parameter(w.clone()) for w in full0]
    ref = ortho_fast.Dion(ref_params, lr=LR, mu=MU, weight_decay=WD, seed=SEED)
    for step in range(STEPS):
        for i, (p, r) in enumerate(zip(params, ref_params)):
            g = _tensor(("fsdp2", i, step), r.shape, F64)
            p.grad = _redistribute_like(g, p)
            r.grad = g
        opt.step()
        ref.step()
    got = [_full(p) for p in params] + [_full(opt.state[p]["Q"]) for p in params]
    if dist.get_rank() != 0:
        return None
    want = [p.detach() for p in ref_params] + [ref.state[p]["Q"] for p in ref_params]
    return {"placements": [str(tuple(p.placements)) for p in params], "error": max(map(_rel, got, want))}


def _redistribute_like(full: torch.Tensor, p) -> torch.Tensor:
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None)


def _bad_construction(meshes: dict) -> dict:
    """Every bad argument of DESIGN.md / the issue, constructed on every rank: the error text."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial

    x, ab = meshes["x"], meshes["ab"]
    sub = DeviceMesh("cpu", torch.tensor([0, 1]))  # every rank creates it; ranks 2 and 3 are not in it

    def param(mesh, codes, shape=(8, 6)):
        return torch.nn.Parameter(_place(torch.ones(shape, dtype=F64), mesh, codes))

    partial = torch.nn.Parameter(DTensor.from_local(torch.ones(8, 6, dtype=F64), x, [Partial()], run_check=False))
    calls = {
        "two_d": lambda: ortho_fast.Dion([param(ab, ("S0", "R"))], outer_shard_mesh=ab),
        "overlap": lambda: ortho_fast.Dion([param(ab, ("S0", "R"))], replicate_mesh=x, outer_shard_mesh=ab["a"]),
        "not_given": lambda: ortho_fast.Dion([param(ab, ("S0", "S1"))], outer_shard_mesh=ab["a"]),
        "replicate_shards": lambda: ortho_fast.Dion([param(ab, ("S0", "R"))], replicate_mesh=ab["a"],
                                                    outer_shard_mesh=ab["b"]),
        "partial": lambda: ortho_fast.Dion([partial], outer_shard_mesh=x),
        "pg_with_dtensor": lambda: ortho_fast.Dion([param(x, ("S0",))], process_group=dist.group.WORLD),
        "pg_with_mesh": lambda: ortho_fast.Dion([param(x, ("S0",))], process_group=dist.group.WORLD,
                                                outer_shard_mesh=x),
        "pg_type": lambda: ortho_fast.Dion([torch.nn.Parameter(torch.ones(4, 4))], process_group="world"),
        "sync_type": lambda: ortho_fast.Dion([param(x, ("S0",))], outer_shard_mesh=x, replicate_mesh_grad_sync=1),
        "no_mesh": lambda: ortho_fast.Dion([param(x, ("S0",))]),
        "flatten_uneven": lambda: ortho_fast.Dion([param(ab, ("R", "S1"), (8, 3, 2))], inner_shard_mesh=ab["b"],
                                                  flatten=True),
        "not_in_mesh": lambda: ortho_fast.Dion([param(sub, ("S0",))], outer_shard_mesh=x),
        "flatten_strided": lambda: ortho_fast.Dion([param(ab, ("R", "S2"), (12, 4, 2))], inner_shard_mesh=ab["b"],
                                                   flatten=True),
    }
    out = {}
    for name, call in calls.items():
        try:
            call()
            out[name] = None
        except (ValueError, TypeError) as e:
            out[name] = f"{type(e).__name__}: {e}"
    return out


def _bad_step(meshes: dict) -> dict:
    """A gradient that only some ranks reject: every rank must raise, nothing may change."""
    import torch.distributed as dist

    x, rank = meshes["x"], dist.get_rank()
    out = {}
    for name in ("nan_on_rank_1", "grad_missing_on_rank_2", "grad_placements"):
        p = torch.nn.Parameter(_place(_tensor("bad", (8, 6), F64), x, ("S0",)))
        before = p.detach().to_local().clone()
        opt = ortho_fast.Dion([p], outer_shard_mesh=x)
        g = _tensor("bad-g", (8, 6), F64)
        if name == "nan_on_rank_1" and rank == 1:
            g[2, 1] = float("nan")  # rank 1's block is rows 2..3
        p.grad = _place(g, x, ("R",) if name == "grad_placements" else ("S0",))
        if name == "grad_missing_on_rank_2" and rank == 2:
            p.grad = None
        try:
            opt.step()
            out[name] = None
        except ValueError as e:
            out[name] = str(e)
        out[name + " unchanged"] = torch.equal(p.detach().to_local(), before) and not opt.state
    return out


def _checkpoint(meshes: dict, path: str) -> dict:
    """FSDP: 2 steps, synchronize + dcp.save, a fresh optimizer with init_state() + dcp.load +
    load_state_dict, 2 more steps — against 4 uninterrupted steps (local shards, bitwise). The
    same checkpoint loaded into FSDP + TP on the (2, 2) mesh (DCP reshards momentum and Q) and
    continued: the full tensors against the uninterrupted run (relative)."""
    import torch.distributed.checkpoint as dcp

    x, ab = meshes["x"], meshes["ab"]
    shapes = ((12, 8), (6, 10))
    fsdp = (x, ("S0",), dict(outer_shard_mesh=x))
    fsdp_tp = (ab, ("S0", "S1"), dict(outer_shard_mesh=ab["a"], inner_shard_mesh=ab["b"]))
    opts = dict(lr=LR, mu=MU, weight_decay=WD, seed=SEED, rank_fraction=0.5, qr_method="randomized_cholesky_qr")

    def fresh(layout, weights=None):
        mesh, codes, args = layout
        ws = weights or [_tensor(("ckpt", i), s, F64) for i, s in enumerate(shapes)]
        params = [torch.nn.Parameter(_place(w, mesh, codes)) for w in ws]
        return params, ortho_fast.Dion(params, **opts, **args)

    def run(params, opt, steps, layout=fsdp):
        for step in steps:
            for i, (p, s) in enumerate(zip(params, shapes)):
                p.grad = _place(_tensor(("ckpt-g", i, step), s, F64), *layout[:2])
            opt.step()

    def resume(layout, weights):
        params, opt = fresh(layout, weights)
        opt.init_state()
        loaded = {"optim": opt.state_dict()}
        dcp.load(loaded, checkpoint_id=path)
        opt.load_state_dict(loaded["optim"])
        run(params, opt, range(2, 4), layout)
        return params, opt

    pa, oa = fresh(fsdp)
    run(pa, oa, range(4))
    pb, ob = fresh(fsdp)
    run(pb, ob, range(2))
    ob.synchronize_for_checkpoint()
    dcp.save({"optim": ob.state_dict()}, checkpoint_id=path)
    weights = [_full(p) for p in pb]
    pc, oc = resume(fsdp, weights)
    same = all(torch.equal(a.to_local(), c.to_local()) for a, c in zip(pa, pc))
    for a, c in zip(pa, pc):
        for key in ("momentum", "Q", "step"):
            va, vc = oa.state[a][key], oc.state[c][key]
            same &= torch.equal(getattr(va, "_local_tensor", va), getattr(vc, "_local_tensor", vc))
            same &= type(va) is type(vc) and getattr(va, "placements", None) == getattr(vc, "placements", None)
    pd, od = resume(fsdp_tp, weights)
    resharded = max(_rel(_full(t_d), _full(t_a)) for a, d in zip(pa, pd)
                    for t_a, t_d in [(a, d)] + [(oa.state[a][k], od.state[d][k]) for k in ("momentum", "Q")])
    return {"bitwise": same, "q_placements": [str(oa.state[p]["Q"].placements) for p in pa],
            "resharded": resharded, "resharded_q_placements": [str(od.state[p]["Q"].placements) for p in pd]}


def _worker(rank: int, world: int, random_cases: list, ckpt_dir: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    meshes = {k: init_device_mesh("cpu", shape, mesh_dim_names=names) for k, (shape, names) in MESHES[world].items()}
    out = {"cases": {c.name: _run_case(c, meshes) for c in CASES[world]}}
    if world == 4:
        out["random"] = [_run_case(c, meshes, steps=2) for c in random_cases]
        out["fsdp2"] = _fsdp2_tp_case(meshes)
        out["construction"] = _bad_construction(meshes)
        out["step"] = _bad_step(meshes)
        out["checkpoint"] = _checkpoint(meshes, ckpt_dir)
    return out


# ---------------------------------------------------------------------------------------
# Hypothesis layouts and the launches.
# ---------------------------------------------------------------------------------------


@st.composite
def _layouts(draw) -> Case:
    """A matrix of shape 1..11 on the (2, 2) mesh (outer "a", inner "b") with any placement
    pair the layouts produce (Replicate, Shard(0/1), _StridedShard(0) under a Shard(0)), a QR
    method, a right factor and a rank fraction."""
    shape = (draw(st.integers(1, 11)), draw(st.integers(1, 11)))
    b = draw(st.sampled_from(("R", "S0", "S1")))
    a = draw(st.sampled_from(("R", "S0", "S1") + (("SS0",) if b == "S0" else ())))
    options = _opts(qr_method=draw(st.sampled_from(ortho_fast.dion.QR_METHODS)),
                    right_factor=draw(st.sampled_from(ortho_fast.dion.RIGHT_FACTORS)),
                    rank_fraction=draw(st.sampled_from((0.3, 0.5, 1.0))))
    return Case(f"random {shape} {a},{b} {dict(options)}", "ab", ((OUT, "a"), (IN, "b")), ((shape, (a, b)),), options)


def _draw_layouts(count: int) -> list[Case]:
    drawn: list[Case] = []

    @settings(max_examples=count, derandomize=True, database=None, deadline=None)
    @given(_layouts())
    def collect(case):
        drawn.append(case)

    collect()
    return list(dict.fromkeys(drawn))  # hypothesis may repeat an example


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    random_cases = _draw_layouts(16)
    ckpt = str(tmp_path_factory.mktemp("dcp"))
    out = {world: run_workers(world, _worker, random_cases, ckpt, timeout=240) for world in (4, 2)}
    return out, random_cases


def _cases():
    return [(world, c) for world in (4, 2) for c in CASES[world]]


@pytest.mark.parametrize("world, case", _cases(), ids=lambda v: v.name if isinstance(v, Case) else f"world{v}")
def test_layout_equals_one_process(results, world, case):
    got = results[0][world][0]["cases"][case.name]
    tol = sharded_tolerance(dict(case.options).get("momentum_dtype") or case.dtype)  # mixed: the state's precision
    assert max(got["errors"].values()) <= tol, got["errors"]
    assert got["identical"]  # every rank's full weights and Q agree (replicas stay identical)
    if case.mode == "bitwise":
        assert got["bitwise"]


def test_random_layouts_equal_one_process(results):
    out, cases = results
    assert len(cases) >= 10
    for case, got in zip(cases, out[4][0]["random"], strict=True):
        assert max(got["errors"].values()) <= sharded_tolerance(F64), (case.name, got["errors"])


def test_fsdp2_over_tensor_parallel_module(results):
    got = results[0][4][0]["fsdp2"]
    assert got["placements"] == ["(_StridedShard(dim=0, sf=2), Shard(dim=0))", "(Shard(dim=0), Shard(dim=1))"]
    assert got["error"] <= sharded_tolerance(F64)


def _analytic(case: Case, world: int) -> dict[str, int]:
    """The per-step volume of ``case`` from ``dion_comm_volume`` and ``dion_check_volume``."""
    shape, names = MESHES[world][case.mesh]
    roles = dict(case.roles)
    opts = {k: v for k, v in case.options if k in ("qr_method", "right_factor", "power_iters")}
    sync = dict(case.options).get("replicate_mesh_grad_sync", True)
    replicas = world if "process_group" in roles else shape[names.index(roles[REP])] if REP in roles else 1
    total: dict[str, int] = {}
    for pshape, codes in case.params:
        m, n = pshape[0], math.prod(pshape[1:])
        r = ortho_fast.dion_rank(m, n, dict(case.options).get("rank_fraction", 1.0))
        sharded = [(c, shape[d]) for d, c in enumerate(codes or ()) if c != "R"]
        rows = [s for c, s in sharded if c.endswith("S0")]
        cols = [s for c, s in sharded if not c.endswith("S0")]
        vol = dion_comm_volume(m, n, r, row_shards=rows, col_shards=cols, replicas=replicas,
                               replicate_mesh_grad_sync=sync, **opts)
        for tag, v in vol.items():
            total[tag] = total.get(tag, 0) + v
    axes = [shape[names.index(dim)] for arg, dim in case.roles if arg in (OUT, IN)]
    axes += [replicas] if sync else []
    for tag, v in dion_check_volume(len(case.params), sum(s > 1 for s in axes)).items():
        total[tag] = total.get(tag, 0) + v
    return total


@pytest.mark.parametrize("world, case", [(w, c) for w, c in _cases() if c.ledger],
                         ids=lambda v: v.name if isinstance(v, Case) else f"world{v}")
def test_ledger_equals_analytic_volume(results, world, case):
    ledgers = results[0][world][0]["cases"][case.name]["ledgers"]
    want = _analytic(case, world)
    assert all(ledger == want for ledger in ledgers[1:]), (ledgers, want)  # step 1 has the same volume too
    assert ledgers[0] == want


def test_table1_volumes():
    """The Dion paper's Table 1 cases: data-parallel (m + n)·r, weight sharding over the working
    columns (m + 1)·r; rows sharded with CholeskyQR2: 2r² + n·r."""
    assert sum(dion_comm_volume(64, 32, 8, replicas=4).values()) == (64 + 32) * 8
    assert sum(dion_comm_volume(32, 64, 8, row_shards=(4,)).values()) == (64 + 1) * 8
    assert dion_comm_volume(64, 32, 8, row_shards=(4,), qr_method="cholesky_qr") == {"gram": 2 * 64, "R": 32 * 8}
    assert dion_comm_volume(64, 32, 8, replicas=4, replicate_mesh_grad_sync=False) == {}
    with pytest.raises(ValueError, match="r <= min"):
        dion_comm_volume(4, 3, 5)
    # Dion's aliases mean the same method; an unknown method or a count that is no count is an error
    assert dion_comm_volume(64, 32, 8, row_shards=(4,), qr_method="rcqr") == dion_comm_volume(
        64, 32, 8, row_shards=(4,), qr_method="randomized_cholesky_qr") == {"sketch": 10 * 8, "gram": 64, "finite": 1,
                                                                             "R": 32 * 8}
    for kwargs, name in ((dict(qr_method="cqr"), "qr_method"), (dict(right_factor="norm"), "right_factor"),
                         (dict(power_iters=0), "power_iters"), (dict(oversample=0.5), "oversample")):
        with pytest.raises(ValueError, match=f"^{name}:"):
            dion_comm_volume(64, 32, 8, row_shards=(4,), **kwargs)


def test_bad_construction_raises_on_every_rank(results):
    expected = {
        "two_d": "outer_shard_mesh: expected a 1-D DeviceMesh", "overlap": "overlap",
        "not_given": "none of the meshes the optimizer was given", "replicate_shards": "is the replicate_mesh",
        "partial": "Partial", "pg_with_dtensor": "process_group: DDP over a ProcessGroup steps plain tensors",
        "pg_with_mesh": "process_group: pass either", "pg_type": "TypeError: process_group",
        "sync_type": "TypeError: replicate_mesh_grad_sync", "no_mesh": "DTensor parameters need the mesh arguments",
        "flatten_uneven": "no placement of Q", "not_in_mesh": "param:",
        # dim 2 split evenly, but each rank's flattened columns are strided: the hint names dim 1
        "flatten_strided": "shard dim 0, or dim 1 with a size the mesh divides",
    }
    for rank, out in enumerate(results[0][4]):
        errors = out["construction"]
        for name, text in expected.items():
            if name == "not_in_mesh":  # ranks 0, 1: the sub-mesh is not a given mesh; 2, 3: not in it
                text = "none of the meshes" if rank < 2 else "this rank is not part of the parameter's mesh"
            assert errors[name] is not None and text in errors[name], (rank, name, errors[name])


def test_bad_step_raises_on_every_rank_without_change(results):
    for rank, out in enumerate(results[0][4]):
        step = out["step"]
        assert ("NaN or Inf" if rank == 1 else "another rank rejected") in step["nan_on_rank_1"]
        assert "on some ranks and not on others" in step["grad_missing_on_rank_2"]
        assert "grad: expected a DTensor with the parameter's mesh" in step["grad_placements"]
        assert all(step[k + " unchanged"] for k in ("nan_on_rank_1", "grad_missing_on_rank_2", "grad_placements"))


def test_checkpoint_round_trip_is_bitwise(results):
    for out in results[0][4]:
        assert out["checkpoint"]["bitwise"]
    # Q of the tall (12, 8) Shard(0) weight: its working columns (dim 1) are whole -> Replicate;
    # the wide (6, 10) one works on the transpose, whose columns are the sharded dim 0.
    got = results[0][4][0]["checkpoint"]
    assert got["q_placements"] == ["(Replicate(),)", "(Shard(dim=0),)"]
    # loaded into FSDP + TP (S0, S1): Q follows the columns sharded by TP (tall) / FSDP (wide)
    assert got["resharded_q_placements"] == ["(Replicate(), Shard(dim=0))", "(Shard(dim=0), Replicate())"]
    assert got["resharded"] <= sharded_tolerance(F64)


def test_init_state_one_process():
    """init_state() creates exactly the state the first step creates (with and without a grad,
    no parameter change); the run after it is bitwise the run without it;
    synchronize_for_checkpoint() is a no-op in one process."""
    shapes = ((6, 4), (3, 7))

    def make():
        params = [torch.nn.Parameter(_tensor(("init", i), s, F64)) for i, s in enumerate(shapes)]
        return params, ortho_fast.Dion(params, lr=LR, seed=SEED, rank_fraction=0.5)

    pa, oa = make()
    pb, ob = make()
    ob.init_state()
    assert all(torch.equal(a, b) for a, b in zip(pa, pb))
    for i, (p, q_shape) in enumerate(zip(pb, ((4, 2), (3, 2)))):
        st = ob.state[p]
        assert torch.equal(st["Q"], ortho_fast.initial_q(q_shape, SEED, i, F64, "cpu"))
        assert torch.equal(st["momentum"], torch.zeros_like(p)) and int(st["step"]) == 0
    ob.synchronize_for_checkpoint()
    for step in range(2):
        for params in (pa, pb):
            for i, p in enumerate(params):
                p.grad = _tensor(("init-g", i, step), p.shape, F64)
        oa.step()
        ob.step()
    for a, b in zip(pa, pb):
        assert torch.equal(a, b)
        assert all(torch.equal(oa.state[a][k], ob.state[b][k]) for k in ("momentum", "Q", "step"))


def test_deepcopy_and_pickle_step_as_the_original():
    """copy.deepcopy / pickle keep the seed and the (one-process: empty) distributed plan, which
    torch's Optimizer.__getstate__ drops: the copies step bitwise as the original."""
    params = [torch.nn.Parameter(_tensor(("copy", i), s, F64)) for i, s in enumerate(((6, 4), (3, 7)))]
    opt = ortho_fast.Dion(params, lr=LR, seed=SEED, rank_fraction=0.5, qr_method="randomized_cholesky_qr")
    for step in range(2):
        for i, p in enumerate(params):
            p.grad = _tensor(("copy-g", i, step), p.shape, F64)
        if step == 1:
            buffer = io.BytesIO()
            torch.save(opt, buffer)
            copies = [copy.deepcopy(opt), torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)]
        opt.step()
    for copied in copies:
        assert copied.seed == SEED
        mine = [p for g in copied.param_groups for p in g["params"]]
        for a, b in zip(params, mine):
            b.grad = a.grad.clone()
        copied.step()
        assert all(torch.equal(a, b) for a, b in zip(params, mine))
        assert all(torch.equal(opt.state[a][k], copied.state[b][k]) for a, b in zip(params, mine)
                   for k in ("momentum", "Q", "step"))
