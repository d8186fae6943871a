"""Distributed ``ortho_fast.Dion`` on gloo ranks against one process (one launch per world size).

Every layout of docs/design.md, "Distributed layouts and the layout contract" (the cases and
the code each rank runs: tests/distributed/dion_workers.py) steps 3 times and is compared with
``ortho_fast.Dion`` in one process on the full tensors (``DTensor.full_tensor()``): weights,
momenta and Q in relative Frobenius norm within ``ortho_verify.tolerances.sharded_tolerance``
(the layout contract). Under compressed sync the one-process run is fed the replicas' mean
gradient, the replicas' weights and Q must be identical and their mean momentum must match
(and every replica's after ``synchronize_for_checkpoint``). Hypothesis draws further layouts
(shapes 1..11, placements on a (2, 2) mesh, QR method, right factor, rank fraction). The ledger
of each step equals ``dion_comm_volume`` + ``dion_check_volume``; bad meshes and parameters
raise at construction on every rank, a bad gradient on one rank raises on all (no hang); a
``torch.distributed.checkpoint`` save / load into ``init_state()`` / continue equals the
uninterrupted run bitwise. Dion's distributed API in one process (Table 1's volumes,
``init_state``, deepcopy / pickle): test_dion_distributed_one_process.py.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

import ortho_fast
from ortho_fast.distributed.volumes import dion_check_volume, dion_comm_volume
from ortho_fast.functional.dion import dion_rank
from ortho_verify.sharding.workers import run_workers
from ortho_verify.tolerances import sharded_tolerance
from tests.distributed.dion_workers import CASES, F64, IN, MESHES, OUT, REP, Case, option_items, worker

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
    options = option_items(qr_method=draw(st.sampled_from(ortho_fast.functional.qr.QR_METHODS)),
                    right_factor=draw(st.sampled_from(ortho_fast.functional.dion.RIGHT_FACTORS)),
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
    out = {world: run_workers(world, worker, random_cases, ckpt, timeout=240) for world in (4, 2)}
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
        r = dion_rank(m, n, dict(case.options).get("rank_fraction", 1.0))
        sharded = [(c, shape[d]) for d, c in enumerate(codes or ()) if c != "R"]
        rows = [s for c, s in sharded if c.endswith("S0")]
        cols = [s for c, s in sharded if not c.endswith("S0")]
        vol = dion_comm_volume(m, n, r, row_shards=rows, col_shards=cols, replicas=replicas,
                               replicate_mesh_grad_sync=sync, **opts)
        for tag, v in vol.items():
            total[tag] = total.get(tag, 0) + v
    axes = [shape[names.index(dim)] for arg, dim in case.roles if arg in (OUT, IN)]
    axes += [replicas]  # the checks agree over the replicas even when the gradients arrive synced
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
