"""Distributed ``ortho_fast.Muon`` (FSDP / DDP over ``distributed_mesh``, TP over ``tp_mesh``) against
one-process ``ortho_fast.Muon`` on the full tensors, on gloo ranks (one launch per world size).

Every case steps 3 times from the same weights and gradients on every rank and compares the
weights and momenta after each step with the one-process optimizer (``banks=False``: the
distributed step orthogonalizes matrix by matrix, never stacking; Gram Newton–Schulz where the
one process takes it): bitwise where the sharded
step orthogonalizes the very matrix one process does (FSDP, DDP, TP "duplicated"), within
``sharded_tolerance`` for TP "distributed" (the Gram matrix summed in another order), and
bitwise against its own definition for TP "blockwise" (one-process Muon on each TP shard as a
parameter of its own). Parameters come from ``distribute_tensor`` with the placements FSDP2 and
TP produce, and in one case from ``fully_shard`` over ``parallelize_module`` themselves. The
communication ledger of the third step is compared with ``muon_comm_volume``. Bad meshes and
layouts raise at construction on every rank; a bad gradient on one rank raises on all of them.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

from ortho_verify.sharding.workers import run_workers
from ortho_verify.tolerances import sharded_tolerance
from tests.distributed.placements import placement  # placement codes: R, S<d>, SS<d> (_StridedShard)
from tests.strategies import spectral_matrices

STEPS = 3
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bf16": torch.float32}  # bf16: NS dtype, fp32 params


def _case(name, mesh, params, *, dp=None, tp=None, mode="duplicated", dtype="float64", expect="bitwise", **kw):
    return dict(name=name, mesh=mesh, params=params, dp=dp, tp=tp, mode=mode, dtype=dtype, expect=expect, kw=kw)


def _tp_cases(mesh: str, dp: str | None, tp: str, codes_col, codes_row, tag: str):
    """Colwise and rowwise TP, each mode, on a tall, a wide and an uneven matrix (float64), and
    "distributed" in float32 on the tall and wide ones (divisible: the ledger is exact)."""
    out = []
    for kind, codes in (("colwise", codes_col), ("rowwise", codes_row)):
        even = [((12, 8), codes), ((8, 12), codes)]
        for mode, expect in (("duplicated", "bitwise"), ("blockwise", "blockwise"), ("distributed", "rtol")):
            out.append(_case(f"{tag} {kind} {mode}", mesh, even + [((7, 5), codes)], dp=dp, tp=tp, mode=mode,
                             expect=expect))
        out.append(_case(f"{tag} {kind} distributed float32", mesh, even, dp=dp, tp=tp, mode="distributed",
                         dtype="float32", expect="rtol"))
    return out


WORLD4_CASES = [
    _case("fsdp even", "1d", [((8, 12), ("S0",)), ((12, 8), ("S0",)), ((8, 4, 2, 2), ("S0",))], dp="x"),
    _case("fsdp uneven+empty", "1d", [((7, 5), ("S0",)), ((3, 9), ("S0",)), ((2, 6), ("S1",)), ((6, 2, 2, 2), ("S1",))],
          dp="x"),
    _case("fsdp bf16 nesterov-off classic", "1d", [((7, 5), ("S0",)), ((8, 12), ("S1",))], dp="x", dtype="bf16",
          momentum_style="classic", nesterov=False, coefficients="polar_express", adjust_lr="spectral_norm"),
    _case("fsdp float32 cautious", "1d", [((12, 8), ("S0",)), ((5, 3), ("S0",))], dp="x", dtype="float32",
          cautious_weight_decay=True),
    _case("fsdp adjusted_lr decay", "1d", [((12, 8), ("S0",)), ((7, 5), ("S1",)), ((4, 9), ("S0",))], dp="x",
          weight_decay_style="adjusted_lr"),
    _case("ddp plain adjusted_lr cautious split", "plain", [((12, 4), ()), ((12, 6), ())], dp="x", split_sizes=(8, 4),
          weight_decay_style="adjusted_lr", cautious_weight_decay=True),
    _case("ddp plain", "plain", [((8, 12), ()), ((12, 8), ()), ((5, 3), ()), ((6, 4, 3, 3), ()), ((9, 4), ())], dp="x"),
    _case("ddp plain split", "plain", [((12, 4), ()), ((12, 6), ())], dp="x", split_sizes=(3, 1, 2), split_groups=2,
          num_heads=(3, 1, 1)),
    _case("ddp plain experts", "plain", [((2, 6, 4), ()), ((5, 4), ())], dp="x", expert_keys=("experts",),
          names=("mlp.experts.w", "attn.proj")),
    _case("ddp replicated dtensor", "1d", [((8, 12), ("R",)), ((7, 5), ("R",))], dp="x"),
    *_tp_cases("1d", None, "x", ("S0",), ("S1",), "tp4"),
    *_tp_cases("2d", "dp", "tp", ("SS0", "S0"), ("S0", "S1"), "fsdp+tp"),
    _case("ddp+tp colwise duplicated", "2d", [((8, 12), ("R", "S0")), ((12, 8), ("R", "S0"))], dp="dp", tp="tp"),
    _case("ddp+tp rowwise distributed", "2d", [((12, 8), ("R", "S1"))], dp="dp", tp="tp", mode="distributed",
          expect="rtol"),
    _case("fsdp(dp)+unsharded on tp", "2d", [((8, 12), ("S0", "R")), ((5, 3), ("S1", "R"))], dp="dp", tp="tp",
          mode="blockwise"),
    _case("fully_shard over parallelize_module duplicated", "2d", "model", dp="dp", tp="tp"),
    _case("fully_shard over parallelize_module distributed", "2d", "model", dp="dp", tp="tp", mode="distributed",
          expect="rtol"),
    _case("fully_shard over parallelize_module blockwise", "2d", "model", dp="dp", tp="tp", mode="blockwise",
          expect="blockwise"),
]

WORLD2_CASES = [
    _case("fsdp 2 uneven+empty", "1d", [((1, 5), ("S0",)), ((9, 4), ("S0",)), ((5, 7), ("S1",))], dp="x"),
    _case("ddp process group", "plain", [((8, 12), ()), ((5, 3), ()), ((12, 8), ())], dp="pg"),
    _case("ddp process group banks", "plain", [((8, 12), ()), ((8, 12), ()), ((8, 12), ())], dp="pg", banks=True,
          expect="rtol"),
    _case("tp2 colwise distributed float32", "1d", [((12, 8), ("S0",)), ((5, 7), ("S0",))], tp="x",
          mode="distributed", dtype="float32", expect="rtol"),
    _case("tp2 rowwise duplicated", "1d", [((8, 12), ("S1",)), ((5, 7), ("S1",))], tp="x"),
    _case("tp2 rowwise blockwise", "1d", [((8, 12), ("S1",)), ((5, 7), ("S1",))], tp="x", mode="blockwise",
          expect="blockwise"),
]


# ---------------------------------------------------------------------------------------------
# Inside the workers
# ---------------------------------------------------------------------------------------------


def _model_params(mesh, dtype):
    """Weights of Linear(6, 10) colwise and Linear(10, 6) rowwise TP, then FSDP2 over dp."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10, bias=False), torch.nn.Linear(10, 6, bias=False)).to(dtype)
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "1": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    return list(model.parameters())


def _tp_dim(placements, tp_dim_index):
    from torch.distributed.tensor import Shard

    pl = placements[tp_dim_index] if tp_dim_index is not None else None
    return pl.dim if isinstance(pl, Shard) else None  # _StridedShard is not a Shard subclass in torch 2.13


def _run_case(case: dict, meshes: dict, rank: int) -> dict:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, distribute_tensor

    from ortho_fast import Muon
    from ortho_fast.distributed.comm import record_collectives
    from ortho_fast.distributed.volumes import muon_comm_volume

    dtype = DTYPES[case["dtype"]]
    kw = dict(lr=0.05, weight_decay=0.1, dtype=torch.bfloat16 if case["dtype"] == "bf16" else dtype, **case["kw"])
    names = kw.pop("names", None)
    mesh = meshes.get(case["mesh"])
    gen = torch.Generator().manual_seed(1234)
    if case["params"] == "model":
        sharded = _model_params(mesh, dtype)
        specs = [(tuple(p.shape), tuple(p.placements)) for p in sharded]
        with torch.no_grad():
            for p in sharded:
                p.mul_(0.01)
        fulls = [p.full_tensor().detach() for p in sharded]
    else:
        split = mesh.size(-1) if mesh is not None else 1
        specs = [(shape, tuple(placement(c, split) for c in codes)) for shape, codes in case["params"]]
        # weights of the size of one update (lr·O ~ 0.05/√k): a float32 ΔW = W_new − W_old then
        # keeps its own precision (with |W| ≫ |ΔW| the rounding of W alone makes ΔW differ by ~u·|W|/|ΔW|)
        fulls = [(0.01 * torch.randn(shape, generator=gen, dtype=torch.float64)).to(dtype) for shape, _ in specs]
        sharded = [torch.nn.Parameter(distribute_tensor(w, mesh, pl, src_data_rank=None) if pl else w.clone())
                   for w, (_, pl) in zip(fulls, specs)]
    grads = [[torch.randn(w.shape, generator=gen, dtype=torch.float64).to(dtype) for w in fulls] for _ in range(STEPS)]
    axis = {"x": meshes.get("1d"), "dp": mesh["dp"] if case["mesh"] == "2d" else None,
            "tp": mesh["tp"] if case["mesh"] == "2d" else None, "pg": dist.group.WORLD, None: None}
    dims = mesh.mesh_dim_names if mesh is not None else ()
    tp_index = dims.index(case["tp"]) if case["tp"] in dims else None
    tp_size = mesh.size(tp_index) if tp_index is not None else 1
    tp_coord = mesh.get_coordinate()[tp_index] if tp_index is not None else 0
    tp_dims = [_tp_dim(pl, tp_index) if pl else None for _, pl in specs]

    # the reference: one process on the full tensors, or on each TP shard for "blockwise"
    blockwise = case["expect"] == "blockwise"
    pieces = [list(torch.chunk(w, tp_size, d)) if blockwise and d is not None else [w] for w, d in zip(fulls, tp_dims)]
    ref_params = [torch.nn.Parameter(x.clone()) for ps in pieces for x in ps]
    # the distributed step orthogonalizes matrix by matrix: the one-process bits of banks=False (and
    # TP "distributed" runs its own plain steps: gram=False is the one-process counterpart)
    plain = {"gram": False} if case["mode"] == "distributed" else {}
    ref = Muon(list(zip(names, ref_params)) if names else ref_params, **{"banks": False, **plain, **kw})
    params = list(zip(names, sharded)) if names else sharded
    opt = Muon(params, distributed_mesh=axis[case["dp"]], tp_mesh=axis[case["tp"]], tp_mode=case["mode"], **kw)

    def full(t):
        return (t.full_tensor() if isinstance(t, DTensor) else t).detach()

    def joined(group_of_pieces, d):
        return torch.cat(group_of_pieces, d) if len(group_of_pieces) > 1 else group_of_pieces[0]

    out = {"bitwise": True, "momentum_bitwise": True, "rel": 0.0, "ledger": None, "analytic": None}
    for step in range(STEPS):
        before = [full(p).clone() for p in sharded]
        for p, g, (_, pl) in zip(sharded, grads[step], specs):
            p.grad = (distribute_tensor(g, p.device_mesh, pl, src_data_rank=None) if isinstance(p, DTensor)
                      else g.clone())
        chunks = iter([x for g, d in zip(grads[step], tp_dims)
                       for x in (torch.chunk(g, tp_size, d) if blockwise and d is not None else [g])])
        for q in ref_params:
            q.grad = next(chunks).clone()
        ref.step()
        if step == STEPS - 1:
            with record_collectives() as ledger:
                opt.step()
        else:
            opt.step()
        it = iter(ref_params)
        for p, w0, ps, d in zip(sharded, before, pieces, tp_dims):
            mine = [next(it) for _ in ps]
            expected = joined([q.detach() for q in mine], d)
            expected_m = joined([ref.state[q]["momentum_buffer"] for q in mine], d)
            got = full(p)
            out["bitwise"] &= torch.equal(got, expected)
            out["momentum_bitwise"] &= torch.equal(full(opt.state[p]["momentum_buffer"]), expected_m)
            delta, delta_ref = (got - w0).double(), (expected - w0).double()
            out["rel"] = max(out["rel"], float((delta - delta_ref).norm() / delta_ref.norm()))
    records = [r for r in ledger.records if r.tag != "check"]
    out["ledger"] = {op: sum(r.numel for r in records if r.op == op) for op in sorted({r.op for r in records})}
    # the analytic volume for this rank (owner: round-robin by parameter index along the dp axis)
    dp_axis = axis[case["dp"]]
    dp_size = dist.get_world_size(dp_axis) if case["dp"] == "pg" else dp_axis.size() if dp_axis is not None else 1
    dp_pos = dist.get_rank() if case["dp"] == "pg" else dp_axis.get_local_rank() if dp_axis is not None else 0
    dp_index = dims.index(case["dp"]) if case["dp"] in dims else None
    analytic: dict[str, int] = {}
    for index, ((shape, pl), d) in enumerate(zip(specs, tp_dims)):
        from torch.distributed.tensor import Replicate

        fsdp = dp_index is not None and pl and not isinstance(pl[dp_index], Replicate)
        vol = muon_comm_volume(shape, dp=None if dp_axis is None else "fsdp" if fsdp else "ddp", dp_size=dp_size,
                               dp_dim=pl[dp_index].dim if fsdp else 0, tp_mode=case["mode"] if d is not None else None,
                               tp_size=tp_size, tp_dim=d or 0, tp_index=tp_coord, owner=index % dp_size == dp_pos)
        for op, v in vol.items():
            analytic[op] = analytic.get(op, 0) + v
    out["analytic"] = analytic
    out["tp_coord"] = tp_coord
    return out


def _errors(meshes: dict, rank: int) -> dict:
    """Each bad input, raised (or not) on this rank; the message or None."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Partial, distribute_tensor

    from ortho_fast import Muon

    m1, m2 = meshes["1d"], meshes["2d"]
    w = torch.randn(8, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def dt(mesh, *codes, shape=(8, 8)):
        full = torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        return torch.nn.Parameter(distribute_tensor(full, mesh, [placement(c, 2) for c in codes], src_data_rank=None))

    cases = {
        "non_1d": lambda: Muon([w.clone()], distributed_mesh=m2),
        "overlap": lambda: Muon([w.clone()], distributed_mesh=m1, tp_mesh=m2["tp"]),
        "not_given": lambda: Muon([dt(m2, "S0", "S1")], distributed_mesh=m2["dp"]),
        "no_mesh": lambda: Muon([dt(m1, "S0")]),
        "partial": lambda: Muon([torch.nn.Parameter(DTensor.from_local(w.clone(), m1, [Partial()]))],
                                distributed_mesh=m1),
        "process_group": lambda: Muon([dt(m1, "S0")], distributed_mesh=dist.group.WORLD),
        "interleaved": lambda: Muon([dt(m2, "S0", "S0")], distributed_mesh=m2["dp"], tp_mesh=m2["tp"]),
        "tp_mode": lambda: Muon([w.clone()], distributed_mesh=m1, tp_mode="sharded"),
        "banks": lambda: Muon([dt(m1, "S0")], distributed_mesh=m1, banks=True),
        "split_sizes": lambda: Muon([dt(m1, "S0")], distributed_mesh=m1, split_sizes=(4, 4)),
        "flatten": lambda: Muon([dt(m1, "S0", shape=(4, 3, 5))], distributed_mesh=m1, flatten=False),
    }
    out = {}
    for name, make in cases.items():
        try:
            make()
            out[name] = None
        except ValueError as err:  # LayoutError is a ValueError
            out[name] = f"{type(err).__name__}: {err}"
    # a non-finite gradient on one rank's shard: every rank raises, nothing changes
    p = dt(m1, "S0")
    opt = Muon([p], distributed_mesh=m1)
    grad = torch.ones(8, 8, dtype=torch.float64)
    grad[7, 7] = float("nan")  # lives on the last rank only
    p.grad = distribute_tensor(grad, m1, [placement("S0", 1)], src_data_rank=None)
    before = p.to_local().clone()
    try:
        opt.step()
        out["nan_grad"] = None
    except ValueError as err:
        out["nan_grad"] = str(err)
    out["nan_grad_unchanged"] = torch.equal(before, p.to_local()) and not opt.state
    out.update(_grad_presence(m1, rank))
    out.update(_momentum_layouts(m1))
    return out


def _outcome(opt, params: list) -> tuple[str | None, bool]:
    """(the error ``opt.step()`` raised as "Type: message", or None; whether every parameter and
    momentum kept its value)."""
    from torch.distributed.tensor import DTensor

    def local(t):
        return (t.to_local() if isinstance(t, DTensor) else t).detach().clone()

    before = [local(p) for p in params] + [local(s["momentum_buffer"]) for s in opt.state.values()]
    try:
        opt.step()
        error = None
    except Exception as err:  # noqa: BLE001 - the type is part of the result
        error = f"{type(err).__name__}: {err}"
    after = [local(p) for p in params] + [local(s["momentum_buffer"]) for s in opt.state.values()]
    return error, len(before) == len(after) and all(torch.equal(a, b) for a, b in zip(before, after))


def _grad_presence(mesh, rank: int) -> dict:
    """A parameter with a gradient on some ranks only (DDP and FSDP): every rank raises, nothing
    changes (before: the owner's broadcast / the gather waited for the ranks that skipped it).
    A parameter without a gradient on every rank is skipped, the others step as one process."""
    from torch.distributed.tensor import distribute_tensor

    from ortho_fast import Muon

    gen = torch.Generator().manual_seed(5)
    fulls = [torch.randn(8, 6, generator=gen, dtype=torch.float64) for _ in range(3)]
    grads = [torch.randn(8, 6, generator=gen, dtype=torch.float64) for _ in range(3)]
    out = {}
    for kind in ("ddp", "fsdp"):
        if kind == "ddp":
            params = [torch.nn.Parameter(w.clone()) for w in fulls]
        else:
            params = [torch.nn.Parameter(distribute_tensor(w, mesh, [placement("S0", 1)], src_data_rank=None))
                      for w in fulls]
        opt = Muon(params, distributed_mesh=mesh, dtype=torch.float64)
        for i, (p, g) in enumerate(zip(params, grads)):  # parameter 1 (owner: rank 1) misses rank 2's gradient
            if not (i == 1 and rank == 2):
                p.grad = g.clone() if kind == "ddp" else distribute_tensor(g, mesh, [placement("S0", 1)],
                                                                           src_data_rank=None)
        out[f"partial_grad_{kind}"] = _outcome(opt, params)
    # no gradient anywhere for parameter 0: it and its state stay untouched, the others step as one process
    params = [torch.nn.Parameter(distribute_tensor(w, mesh, [placement("S0", 1)], src_data_rank=None)) for w in fulls]
    refs = [torch.nn.Parameter(w.clone()) for w in fulls]
    opt, ref = Muon(params, distributed_mesh=mesh, dtype=torch.float64), Muon(refs, dtype=torch.float64)
    for p, q, g in list(zip(params, refs, grads))[1:]:
        p.grad, q.grad = distribute_tensor(g, mesh, [placement("S0", 1)], src_data_rank=None), g.clone()
    opt.step()
    ref.step()
    out["no_grad_anywhere"] = (params[0] not in opt.state and torch.equal(params[0].full_tensor(), fulls[0])
                               and all(torch.equal(p.full_tensor(), q.detach()) for p, q in zip(params, refs)))
    return out


def _momentum_layouts(mesh) -> dict:
    """A loaded ``momentum_buffer`` whose layout is not the parameter's (a plain full tensor, or a
    DTensor of other placements, on an FSDP parameter): ValueError naming it on every rank before
    any change (before: the plain (4, 8) momentum broadcast the (1, 8) local gradient into every
    row, then a RuntimeError)."""
    from torch.distributed.tensor import distribute_tensor

    from ortho_fast import Muon

    gen = torch.Generator().manual_seed(6)
    w, g = (torch.randn(4, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    out = {}
    for name, buf in (("plain", torch.ones(4, 8, dtype=torch.float64)),
                      ("placements", distribute_tensor(torch.ones(4, 8, dtype=torch.float64), mesh,
                                                       [placement("S1", 1)], src_data_rank=None))):
        p = torch.nn.Parameter(distribute_tensor(w, mesh, [placement("S0", 1)], src_data_rank=None))
        opt = Muon([p], distributed_mesh=mesh, dtype=torch.float64)
        opt.load_state_dict({"state": {0: {"momentum_buffer": buf}}, "param_groups": opt.state_dict()["param_groups"]})
        p.grad = distribute_tensor(g, mesh, [placement("S0", 1)], src_data_rank=None)
        out[f"momentum_{name}"] = _outcome(opt, [p])
    return out


def _worker(rank: int, world: int, cases: list[dict], with_errors: bool) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    meshes = {"1d": init_device_mesh("cpu", (world,), mesh_dim_names=("x",))}
    if world == 4:
        meshes["2d"] = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    results = {case["name"]: _run_case(case, meshes, rank) for case in cases}
    if with_errors:
        results["errors"] = _errors(meshes, rank)
    return results


@pytest.fixture(scope="module")
def world4():
    return run_workers(4, _worker, WORLD4_CASES, True, timeout=240)


@pytest.fixture(scope="module")
def world2():
    return run_workers(2, _worker, WORLD2_CASES, False, timeout=120)


# ---------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------


def _all_cases():
    return [("world4", c) for c in WORLD4_CASES] + [("world2", c) for c in WORLD2_CASES]


@pytest.mark.parametrize("world,case", _all_cases(), ids=lambda x: x["name"] if isinstance(x, dict) else x)
def test_equals_one_process(world, case, request):
    results = request.getfixturevalue(world)
    for r in results:
        got = r[case["name"]]
        assert got["momentum_bitwise"]  # momentum is elementwise: bitwise in every layout
        if case["expect"] in ("bitwise", "blockwise"):
            assert got["bitwise"], got["rel"]
        else:
            assert got["rel"] <= sharded_tolerance(torch.float32 if case["dtype"] != "float64" else torch.float64)


@pytest.mark.parametrize("world,case", _all_cases(), ids=lambda x: x["name"] if isinstance(x, dict) else x)
def test_ledger_matches_analytic_volume(world, case, request):
    results = request.getfixturevalue(world)
    for r in results:
        got = r[case["name"]]
        ledger, analytic = got["ledger"], got["analytic"]
        assert ledger == analytic  # uneven shards included: the formula counts their zero padding


@given(spectral_matrices(max_dim=24), st.sampled_from([0, 1]), st.sampled_from(["jordan", "polar_express", "cesista5"]))
def test_sharded_newton_schulz_on_one_rank_is_newton_schulz(example, sharded_dim, coefficients):
    """With the Gram matrix of either side (p(XXᵀ)X = X p(XᵀX)) and the normalization from the
    reduced max and sum of squares, the sharded iteration is the one-process one up to rounding."""
    from ortho_fast import newton_schulz
    from ortho_fast.distributed.newton_schulz import newton_schulz_sharded

    x = torch.from_numpy(example[0])
    kw = dict(safety=1.02, eps=1e-6) if coefficients == "polar_express" else {}
    ref = newton_schulz(x, coefficients, dtype=torch.float64, **kw)
    got = newton_schulz_sharded(x, None, sharded_dim=sharded_dim, coefficients=coefficients, dtype=torch.float64, **kw)
    assert float((got - ref).norm() / ref.norm()) <= sharded_tolerance(torch.float64)


def test_comm_volume_formulas():
    from ortho_fast.distributed.volumes import muon_comm_volume

    assert muon_comm_volume((8, 12), dp="fsdp", dp_size=4) == {"gather": 96, "scatter": 96}
    assert muon_comm_volume((8, 12), dp="ddp", dp_size=2, owner=False) == {"broadcast": 96}
    assert muon_comm_volume((8, 12), tp_mode="duplicated", tp_size=4) == {"all_gather": 96}
    assert muon_comm_volume((8, 12), tp_mode="blockwise", tp_size=4) == {}
    # distributed: the Gram of the unsharded dim each step, plus max|X| and the norm
    assert muon_comm_volume((8, 12), tp_mode="distributed", tp_size=2, tp_dim=0,
                            ns_steps=5) == {"all_reduce": 5 * 144 + 2}
    assert muon_comm_volume((8, 12), tp_mode="distributed", tp_size=2, tp_dim=1,
                            ns_steps=3) == {"all_reduce": 3 * 64 + 2}
    # a group of one rank issues nothing
    assert muon_comm_volume((8, 12), dp="fsdp", dp_size=1, tp_mode="duplicated", tp_size=1) == {}
    # uneven shards travel zero-padded to the largest (torch.chunk: 7 rows over 4 ranks are 2, 2, 2, 1)
    assert muon_comm_volume((7, 5), dp="fsdp", dp_size=4) == {"gather": 8 * 5, "scatter": 8 * 5}
    assert muon_comm_volume((5, 3), dp="fsdp", dp_size=4, dp_dim=1) == {"gather": 4 * 5, "scatter": 4 * 5}  # 1, 1, 1, 0
    assert muon_comm_volume((6, 2, 2, 2), dp="fsdp", dp_size=4, dp_dim=1) == {"gather": 4 * 6 * 4, "scatter": 96}
    assert muon_comm_volume((7, 5), tp_mode="duplicated", tp_size=2, tp_dim=1) == {"all_gather": 7 * 6}
    # FSDP + TP: the dp collectives move one TP block (torch.chunk's), dp splits it further; non-owners skip TP
    assert muon_comm_volume((7, 5), dp="fsdp", dp_size=2, tp_mode="distributed", tp_size=2, tp_index=1,
                            owner=False) == {"gather": 2 * 2 * 5, "scatter": 20}  # TP block 3 rows: 2 + 1
    assert muon_comm_volume((7, 5), dp="fsdp", dp_size=2, tp_mode="duplicated", tp_size=2, tp_dim=1, tp_index=1) == {
        "gather": 2 * 4 * 2, "scatter": 16, "all_gather": 7 * 6}  # TP block (7, 2), dp blocks of 4 and 3 rows
    with pytest.raises(ValueError, match="dp"):
        muon_comm_volume((8, 12), dp="hsdp")
    with pytest.raises(ValueError, match="shape"):
        muon_comm_volume((8,), dp="fsdp", dp_size=2)


def test_bad_input_raises_on_every_rank(world4):
    expected = {
        "non_1d": "expected a 1-D DeviceMesh", "overlap": "overlap", "not_given": "none of the meshes",
        "no_mesh": "none of the meshes", "partial": "Partial", "process_group": "ProcessGroup",
        "interleaved": "interleaved", "tp_mode": "tp_mode", "banks": "banks", "split_sizes": "split_sizes",
        "flatten": "flatten",
    }
    for r in world4:
        errors = r["errors"]
        for name, text in expected.items():
            assert errors[name] is not None and text in errors[name], (name, errors[name])
        assert errors["nan_grad"] is not None and errors["nan_grad_unchanged"]
    assert "NaN" in world4[3]["errors"]["nan_grad"]  # the rank holding the NaN names it
    assert "another rank" in world4[0]["errors"]["nan_grad"]


def test_gradient_on_some_ranks_raises_everywhere(world4):
    for r in world4:
        errors = r["errors"]
        for kind in ("ddp", "fsdp"):
            error, unchanged = errors[f"partial_grad_{kind}"]
            assert error is not None and error.startswith("ValueError") and "some ranks" in error, (kind, error)
            assert "parameter 1" in error and unchanged, (kind, error)
        assert errors["no_grad_anywhere"]


def test_momentum_of_another_layout_raises_everywhere(world4):
    for r in world4:
        for name in ("plain", "placements"):
            error, unchanged = r["errors"][f"momentum_{name}"]
            assert error is not None and error.startswith("ValueError: momentum_buffer"), (name, error)
            assert unchanged, name
