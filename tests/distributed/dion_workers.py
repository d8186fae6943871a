"""The layouts of test_dion_distributed.py and what each gloo rank runs for them.

``CASES`` lists, per world size (4 and 2), every layout of docs/design.md, "Distributed
layouts and the layout contract": DDP (both sync modes), FSDP Shard(0), TP colwise /
rowwise, HSDP (compressed sync and FSDP-synced gradients), FSDP + TP with ``_StridedShard``,
HSDP + TP, with tall and wide matrices, uneven and empty shards, the three QR methods,
Orth-Dion, two power iterations, flattened ndim > 2 weights and mixed precision. ``worker``
is the function ``ortho_verify.sharding.workers.run_workers`` forks on every rank: it steps each case
sharded and, on rank 0, in one process, and adds the world-4 extras (FSDP2 over a tensor
parallel module, bad construction, a bad step on one rank, a DCP checkpoint round trip). It
returns plain data; the tests in test_dion_distributed.py judge it. ``seeded_tensor`` (a
tensor drawn from a generator seeded by its key), ``LR`` and ``SEED`` serve
test_dion_distributed_one_process.py too.
"""

from __future__ import annotations

import hashlib
import zlib
from typing import NamedTuple

import torch

import ortho_fast
from tests.distributed.placements import placement

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


def option_items(**kw) -> tuple:
    return tuple(kw.items())


TALL_WIDE = (((16, 8), ("S0",)), ((8, 16), ("S0",)))
HALF = option_items(rank_fraction=0.5)
CASES = {4: [
    Case("FSDP tall + wide", "x", ((OUT, "x"),), TALL_WIDE, HALF, ledger=True),
    Case("FSDP float32", "x", ((OUT, "x"),), TALL_WIDE, HALF, F32),
    Case("FSDP uneven + empty shards", "x", ((OUT, "x"),), (((10, 7), ("S0",)), ((3, 2), ("S0",)), ((2, 9), ("S0",)))),
    Case("TP colwise", "x", ((IN, "x"),), (((12, 8), ("S0",)), ((8, 12), ("S0",))), ledger=True),
    Case("TP rowwise", "x", ((IN, "x"),), (((12, 8), ("S1",)), ((8, 12), ("S1",))), ledger=True),
    Case("FSDP cholesky_qr", "x", ((OUT, "x"),), TALL_WIDE, option_items(rank_fraction=0.5, qr_method="cholesky_qr"),
         ledger=True),
    Case("FSDP randomized, 2 power iterations", "x", ((OUT, "x"),), TALL_WIDE,
         option_items(rank_fraction=0.5, qr_method="randomized_cholesky_qr", power_iters=2), ledger=True),
    Case("TP Orth-Dion", "x", ((IN, "x"),), (((8, 16), ("S0",)), ((16, 8), ("S1",))),
         option_items(rank_fraction=0.5, right_factor="qr"), ledger=True),
    Case("FSDP flatten", "x", ((OUT, "x"),), (((8, 2, 3), ("S0",)), ((4, 4, 3), ("S1",)), ((12, 4, 2), ("S1",))),
         option_items(flatten=True), ledger=True),
    Case("FSDP mixed precision", "x", ((OUT, "x"),), TALL_WIDE,
         option_items(rank_fraction=0.5, momentum_dtype=F32, q_dtype=F32)),
    Case("DDP compressed", "x", (("process_group", None),), (((12, 8), None), ((6, 10), None)), HALF,
         mode="compressed", ledger=True),
    Case("DDP grads synced", "x", ((REP, "x"),), (((12, 8), None), ((6, 10), None)),
         HALF + option_items(replicate_mesh_grad_sync=False), mode="bitwise", ledger=True),
    Case("HSDP compressed", "ab", ((REP, "a"), (OUT, "b")), (((16, 8), ("R", "S0")), ((8, 16), ("R", "S0"))), HALF,
         mode="compressed", ledger=True),
    Case("HSDP compressed float32", "ab", ((REP, "a"), (OUT, "b")), (((16, 8), ("R", "S0")), ((7, 10), ("R", "S0"))),
         HALF, F32, mode="compressed"),
    Case("HSDP grads synced", "ab", ((REP, "a"), (OUT, "b")), (((16, 8), ("R", "S0")), ((8, 16), ("R", "S0"))),
         HALF + option_items(replicate_mesh_grad_sync=False), ledger=True),
    Case("FSDP + TP colwise (_StridedShard)", "ab", ((OUT, "a"), (IN, "b")),
         (((12, 8), ("SS0", "S0")), ((8, 12), ("SS0", "S0"))), HALF, ledger=True),
    Case("FSDP + TP rowwise", "ab", ((OUT, "a"), (IN, "b")), (((12, 8), ("S0", "S1")), ((8, 12), ("S0", "S1"))), HALF,
         ledger=True),
    Case("FSDP + TP uneven, cholesky_qr", "ab", ((OUT, "a"), (IN, "b")),
         (((7, 5), ("S0", "S1")), ((5, 7), ("SS0", "S0")), ((3, 9), ("S1", "S0"))),
         option_items(qr_method="cholesky_qr")),
    Case("FSDP + TP uneven, randomized, float32", "ab", ((OUT, "a"), (IN, "b")),
         (((9, 6), ("S0", "S1")), ((6, 11), ("SS0", "S0"))), option_items(qr_method="randomized_cholesky_qr"), F32),
    Case("HSDP + TP compressed", "roi", ((REP, "r"), (OUT, "o"), (IN, "i")),
         (((12, 8), ("R", "S0", "S0")), ((8, 12), ("R", "S0", "S1"))), HALF, mode="compressed"),
], 2: [
    Case("FSDP uneven", "x", ((OUT, "x"),), (((7, 5), ("S0",)), ((5, 7), ("S0",)), ((1, 3), ("S0",)))),
    Case("TP rowwise Orth-Dion", "x", ((IN, "x"),), (((6, 9), ("S1",)), ((9, 6), ("S1",))),
         option_items(right_factor="qr")),
    Case("DDP compressed", "x", ((REP, "x"),), (((10, 4), None),), HALF, mode="compressed", ledger=True),
]}


# ---------------------------------------------------------------------------------------
# Inside the workers.
# ---------------------------------------------------------------------------------------


def seeded_tensor(key, shape, dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
    return torch.randn(shape, generator=gen, dtype=F64).to(dtype)


def _place(full: torch.Tensor, mesh, codes) -> torch.Tensor:
    from torch.distributed.tensor import distribute_tensor

    if codes is None:
        return full.clone()
    return distribute_tensor(full, mesh, [placement(c) for c in codes], src_data_rank=None)


def _full(t: torch.Tensor) -> torch.Tensor:
    from ortho_fast.validation import is_dtensor

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
        per = [seeded_tensor((case.name, "g", i, step, k), shape, F64) for k in range(replicas)]
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
    w0 = [seeded_tensor((case.name, "w", i), shape, case.dtype) for i, (shape, _) in enumerate(case.params)]
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
            g = seeded_tensor(("fsdp2", i, step), r.shape, F64)
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
    """Every bad argument of docs/design.md, "Distributed layouts and the layout contract", constructed
    on every rank: the error text."""
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
        p = torch.nn.Parameter(_place(seeded_tensor("bad", (8, 6), F64), x, ("S0",)))
        before = p.detach().to_local().clone()
        opt = ortho_fast.Dion([p], outer_shard_mesh=x)
        g = seeded_tensor("bad-g", (8, 6), F64)
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
        ws = weights or [seeded_tensor(("ckpt", i), s, F64) for i, s in enumerate(shapes)]
        params = [torch.nn.Parameter(_place(w, mesh, codes)) for w in ws]
        return params, ortho_fast.Dion(params, **opts, **args)

    def run(params, opt, steps, layout=fsdp):
        for step in steps:
            for i, (p, s) in enumerate(zip(params, shapes)):
                p.grad = _place(seeded_tensor(("ckpt-g", i, step), s, F64), *layout[:2])
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


def worker(rank: int, world: int, random_cases: list, ckpt_dir: str) -> dict:
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
