"""The Muon pipeline stages (MuonEq, Muon+, NorMuon) on the distributed layouts, on gloo ranks (one
launch): FSDP, DDP and TP "duplicated" equal one process bitwise (the owner runs the stages on the
very matrices one process does; NorMuon's second moment is broadcast from the owner so every rank
holds the one-process state), "blockwise" equals one process on each TP shard, TP "distributed"
rejects the stages and "blockwise" NorMuon at construction on every rank; the ledger equals
``muon_comm_volume`` with NorMuon's broadcast."""

from __future__ import annotations

import pytest
import torch

from ortho_verify.sharding.workers import run_workers

STEPS = 3
STAGES = dict(row_equilibration=True, renormalize=True, normuon_beta2=0.9, normuon_dim="by_shape",
              normuon_eps=1e-10, normuon_eps_mode="clamp", cautious_weight_decay=True)
NO_NORMUON = dict(row_equilibration=True, renormalize=True)

# (name, mesh, [(shape, placement codes)], dp axis, tp axis, tp_mode, options, expect)
CASES = [
    ("ddp plain", "1d", [((8, 12), ()), ((12, 8), ()), ((5, 3), ())], "x", None, "duplicated", STAGES, "bitwise"),
    ("ddp plain split", "1d", [((12, 4), ())], "x", None, "duplicated", dict(STAGES, split_sizes=(4, 8)), "bitwise"),
    ("fsdp S0/S1 uneven", "1d", [((8, 12), ("S0",)), ((7, 5), ("S0",)), ((6, 9), ("S1",))], "x", None, "duplicated",
     STAGES, "bitwise"),
    ("fsdp row normuon", "1d", [((6, 10), ("S0",))], "x", None, "duplicated", dict(STAGES, normuon_dim="row"),
     "bitwise"),
    ("fsdp+tp duplicated", "2d", [((8, 12), ("SS0", "S0")), ((12, 8), ("S0", "S1"))], "dp", "tp", "duplicated",
     STAGES, "bitwise"),
    ("tp blockwise", "2d", [((8, 12), ("R", "S0")), ((12, 8), ("R", "S1"))], "dp", "tp", "blockwise", NO_NORMUON,
     "blockwise"),
]


def _placement(code: str):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if code == "R":
        return Replicate()
    if code.startswith("SS"):
        return _StridedShard(int(code[2:]), split_factor=2)
    return Shard(int(code[1:]))


def _tp_dim(placements, index):
    from torch.distributed.tensor import Shard

    pl = placements[index] if index is not None else None
    return pl.dim if isinstance(pl, Shard) else None


def _run(case, meshes):
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    from ortho_fast import Muon
    from ortho_fast.distributed.comm import record_collectives
    from ortho_fast.distributed.volumes import muon_comm_volume
    from ortho_fast.functional.muon_stages import normuon_variance_shape

    name, mesh_name, params, dp, tp, mode, options, expect = case
    mesh = meshes[mesh_name]
    axis = {"x": mesh if mesh_name == "1d" else None, "dp": mesh["dp"] if mesh_name == "2d" else None,
            "tp": mesh["tp"] if mesh_name == "2d" else None, None: None}
    kw = dict(lr=0.05, weight_decay=0.1, dtype=torch.float64, **options)
    gen = torch.Generator().manual_seed(7)
    specs = [(shape, tuple(_placement(c) for c in codes)) for shape, codes in params]
    fulls = [0.01 * torch.randn(shape, generator=gen, dtype=torch.float64) for shape, _ in specs]
    grads = [[torch.randn(w.shape, generator=gen, dtype=torch.float64) for w in fulls] for _ in range(STEPS)]
    sharded = [torch.nn.Parameter(distribute_tensor(w, mesh, pl, src_data_rank=None) if pl else w.clone())
               for w, (_, pl) in zip(fulls, specs)]
    dims = mesh.mesh_dim_names
    tp_index = dims.index(tp) if tp in dims else None
    tp_size = mesh.size(tp_index) if tp_index is not None else 1
    tp_coord = mesh.get_coordinate()[tp_index] if tp_index is not None else 0
    tp_dims = [_tp_dim(pl, tp_index) if pl else None for _, pl in specs]
    blockwise = expect == "blockwise"
    pieces = [list(torch.chunk(w, tp_size, d)) if blockwise and d is not None else [w] for w, d in zip(fulls, tp_dims)]
    refs = [torch.nn.Parameter(x.clone()) for ps in pieces for x in ps]
    ref = Muon(refs, **kw)
    opt = Muon(sharded, distributed_mesh=axis[dp], tp_mesh=axis[tp], tp_mode=mode, **kw)

    def full(t):
        return (t.full_tensor() if isinstance(t, DTensor) else t).detach()

    out = {"bitwise": True, "variance_bitwise": True}
    for step in range(STEPS):
        for p, g, (_, pl) in zip(sharded, grads[step], specs):
            p.grad = distribute_tensor(g, p.device_mesh, pl, src_data_rank=None) if pl else g.clone()
        chunks = iter([x for g, d in zip(grads[step], tp_dims)
                       for x in (torch.chunk(g, tp_size, d) if blockwise and d is not None else [g])])
        for q in refs:
            q.grad = next(chunks).clone()
        ref.step()
        if step == STEPS - 1:
            with record_collectives() as ledger:
                opt.step()
        else:
            opt.step()
        it = iter(refs)
        for p, ps, d in zip(sharded, pieces, tp_dims):
            mine = [next(it) for _ in ps]
            expected = torch.cat([q.detach() for q in mine], d) if len(mine) > 1 else mine[0].detach()
            out["bitwise"] &= torch.equal(full(p), expected)
            if "normuon_beta2" in options:
                out["variance_bitwise"] &= torch.equal(opt.state[p]["variance_neuron"],
                                                       ref.state[mine[0]]["variance_neuron"])
    records = [r for r in ledger.records if r.tag != "check"]
    out["ledger"] = {op: sum(r.numel for r in records if r.op == op) for op in sorted({r.op for r in records})}
    dp_axis = axis[dp]
    dp_size, dp_pos = (dp_axis.size(), dp_axis.get_local_rank()) if dp_axis is not None else (1, 0)
    dp_index = dims.index(dp) if dp in dims else None
    analytic: dict[str, int] = {}
    for index, ((shape, pl), d, p) in enumerate(zip(specs, tp_dims, sharded)):
        fsdp = dp_index is not None and pl and not isinstance(pl[dp_index], Replicate)
        variance = 0
        if "normuon_beta2" in options:
            variance = opt.state[p]["variance_neuron"].numel()
            assert variance == (sum(torch.Size(normuon_variance_shape((r, shape[1]), options["normuon_dim"])).numel()
                                    for r in options.get("split_sizes", (shape[0],))))
        vol = muon_comm_volume(shape, dp="fsdp" if fsdp else "ddp", dp_size=dp_size,
                               dp_dim=pl[dp_index].dim if fsdp else 0, tp_mode=mode if d is not None else None,
                               tp_size=tp_size, tp_dim=d or 0, tp_index=tp_coord, owner=index % dp_size == dp_pos,
                               variance=variance)
        for op, v in vol.items():
            analytic[op] = analytic.get(op, 0) + v
    out["analytic"] = analytic
    return out


def _errors(meshes):
    from torch.distributed.tensor import distribute_tensor

    from ortho_fast import Muon, NorMuon

    m2 = meshes["2d"]
    full = torch.randn(8, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def tp_param():
        return torch.nn.Parameter(distribute_tensor(full, m2, [_placement("R"), _placement("S0")], src_data_rank=None))

    cases = {
        "distributed_eq": lambda: Muon([tp_param()], distributed_mesh=m2["dp"], tp_mesh=m2["tp"], tp_mode="distributed",
                                       row_equilibration=True),
        "distributed_renorm": lambda: Muon([tp_param()], tp_mesh=m2["tp"], tp_mode="distributed", renormalize=True),
        "distributed_normuon": lambda: NorMuon([tp_param()], tp_mesh=m2["tp"], tp_mode="distributed"),
        "blockwise_normuon": lambda: NorMuon([tp_param()], tp_mesh=m2["tp"], tp_mode="blockwise"),
    }
    out = {}
    for name, make in cases.items():
        try:
            make()
            out[name] = None
        except ValueError as err:
            out[name] = str(err)
    return out


def _worker(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    meshes = {"1d": init_device_mesh("cpu", (world,), mesh_dim_names=("x",)),
              "2d": init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))}
    results = {case[0]: _run(case, meshes) for case in CASES}
    results["errors"] = _errors(meshes)
    return results


@pytest.fixture(scope="module")
def world4():
    return run_workers(4, _worker, timeout=240)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_stages_equal_one_process(world4, case):
    for r in world4:
        got = r[case[0]]
        assert got["bitwise"] and got["variance_bitwise"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_ledger_matches_analytic_volume_with_normuon(world4, case):
    for r in world4:
        assert r[case[0]]["ledger"] == r[case[0]]["analytic"]


@pytest.mark.parametrize("name, key", [("distributed_eq", "row_equilibration"), ("distributed_renorm", "renormalize"),
                                       ("distributed_normuon", "normuon_beta2"),
                                       ("blockwise_normuon", "normuon_beta2")])
def test_unsupported_combinations_rejected_on_every_rank(world4, name, key):
    for r in world4:
        assert r["errors"][name] is not None and r["errors"][name].startswith(f"{key}:")


def test_volume_formula_counts_the_variance_broadcast():
    from ortho_fast.distributed.volumes import muon_comm_volume

    assert muon_comm_volume((8, 12), dp="fsdp", dp_size=4, variance=8) == {"gather": 96, "scatter": 96, "broadcast": 8}
    assert muon_comm_volume((8, 12), dp="ddp", dp_size=2, variance=12) == {"broadcast": 96 + 12}
    assert muon_comm_volume((8, 12), variance=8) == {}
    with pytest.raises(ValueError, match="variance"):
        muon_comm_volume((8, 12), variance=-1)
