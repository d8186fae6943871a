"""``ortho_verify.sharding`` (``ortho-verify sharding``): the layout list and the analytic volumes (no
processes), one launch of 4 gloo ranks checking a subset of layouts and the same layouts with
planted bugs (which must fail), and the command line at 2 ranks with --quick."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, strategies as st

from ortho_verify import sharding
from ortho_verify.sharding import LAYOUTS, Layout, analytic_volume, layouts_for
from ortho_verify.sharding.workers import run_workers
from ortho_verify.tolerances import sharded_tolerance

# ---------------------------------------------------------------------------------------
# The layout list (no processes)
# ---------------------------------------------------------------------------------------

ISSUE_LAYOUTS = {  # the issue's list: every one must run at 8 ranks
    "dion": ("DDP", "FSDP", "TP colwise", "TP rowwise", "HSDP", "FSDP + TP colwise", "FSDP + TP rowwise",
             "HSDP + TP colwise", "HSDP + TP rowwise"),
    "muon": ("DDP", "FSDP", *(f"{p}TP {w} {m}" for p in ("", "FSDP + ") for w in ("colwise", "rowwise")
                              for m in ("duplicated", "distributed", "blockwise"))),
}


def _names(world: int) -> set[tuple[str, str]]:
    return {(lay.optimizer, lay.name) for lay, _ in layouts_for(world)}


def test_layouts_fit_each_world_size():
    assert _names(8) >= {(opt, name) for opt, names in ISSUE_LAYOUTS.items() for name in names}
    shapes = {(lay.optimizer, lay.name): shape for lay, shape in layouts_for(8)}
    assert shapes[("dion", "HSDP + TP colwise")] == (2, 2, 2) and shapes[("dion", "HSDP")] == (2, 4)
    assert shapes[("dion", "FSDP + TP colwise")] == (4, 2) and shapes[("muon", "FSDP")] == (8,)
    one = layouts_for(1)
    assert ("dion", "single") in _names(1) and ("dion", "single") not in _names(2)
    assert all(len(shape) <= 1 for _, shape in one)  # 1-D meshes of one rank, no N-D mesh
    assert not any(len(shape) > 1 for _, shape in layouts_for(2))
    assert ("dion", "HSDP") in _names(4) and ("dion", "HSDP + TP rowwise") not in _names(4)
    assert not layouts_for(3, ["HSDP"])  # 3 ranks do not factor into 2 × something
    for world in (1, 2, 4, 8):
        for lay, shape in layouts_for(world):
            assert math.prod(shape) == world or shape == ()


def test_layout_filter_and_errors():
    assert {lay.optimizer for lay, _ in layouts_for(4, ["muon/"])} == {"muon"}
    assert [lay.name for lay, _ in layouts_for(4, ["dion/hsdp"])] == ["HSDP", "HSDP, grads synced"]
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="world_size"):
            layouts_for(bad)
    with pytest.raises(ValueError, match="dtype"):
        sharding.run(2, dtypes=("bfloat16",))
    with pytest.raises(ValueError, match="plant"):
        sharding.run(2, plant="nothing")
    with pytest.raises(ValueError, match="no layout matches"):
        sharding.run(2, layouts=["no such layout"])


def test_strided_shard_split_factor():
    from torch.distributed.tensor.placement_types import _StridedShard

    lay = next(lay for lay in LAYOUTS if lay.name == "HSDP + TP colwise")
    pls = sharding.dtensor_placements(lay, (2, 3, 4))
    assert isinstance(pls[1], _StridedShard) and pls[1].split_factor == 4 and pls[2].dim == 0


def test_blocks_follow_torch_chunk():
    lay = next(lay for lay in LAYOUTS if lay.name == "TP colwise blockwise")
    assert sharding.tp_blocks(lay, (8,), (5, 11)) == (0, [1, 1, 1, 1, 1])  # three empty shards dropped by chunk
    assert sharding.tp_blocks(lay, (4,), (13, 7)) == (0, [4, 4, 4, 1])
    row = next(lay for lay in LAYOUTS if lay.name == "FSDP + TP rowwise blockwise")
    assert sharding.tp_blocks(row, (4, 2), (13, 7)) == (1, [4, 3])


def test_inputs_are_seeded_and_replicas_differ():
    a = sharding.gradient(0, 1, 0, (5, 3), torch.float64)
    assert torch.equal(a, sharding.gradient(0, 1, 0, (5, 3), torch.float64))
    assert not torch.equal(a, sharding.gradient(0, 1, 1, (5, 3), torch.float64))
    mean = sharding.mean_gradient(0, 1, 2, (5, 3), torch.float64)
    torch.testing.assert_close(mean, (a + sharding.gradient(0, 1, 1, (5, 3), torch.float64)) / 2, rtol=0, atol=1e-15)
    assert torch.equal(sharding.initial_weight(2, (4, 4), torch.float32),
                       sharding.initial_weight(2, (4, 4), torch.float64).float())


def _layout(opt: str, name: str) -> Layout:
    return next(lay for lay in LAYOUTS if lay.optimizer == opt and lay.name == name)


def test_analytic_volumes_muon_table1():
    """Muon's rows of Table 1 (m n per collective of the data-parallel and weight-sharding
    layouts), per layout of ``LAYOUTS``."""
    m, n = 16, 24
    assert analytic_volume(_layout("muon", "DDP"), (4,), (m, n)) == m * n  # broadcast of the update
    assert analytic_volume(_layout("muon", "FSDP"), (4,), (m, n)) == 2 * m * n  # gather U + scatter O
    assert analytic_volume(_layout("muon", "TP colwise duplicated"), (4,), (m, n)) == m * n
    assert analytic_volume(_layout("muon", "TP colwise blockwise"), (4,), (m, n)) == 0
    assert analytic_volume(_layout("muon", "TP colwise distributed"), (4,), (m, n)) == 5 * n * n + 2
    assert analytic_volume(_layout("muon", "TP rowwise distributed"), (4,), (m, n)) == 5 * m * m + 2
    assert analytic_volume(_layout("muon", "FSDP"), (1,), (m, n)) == 0  # one rank issues nothing
    # uneven shards travel zero-padded to the largest: 13 rows over 4 ranks move as 4 × 4
    assert analytic_volume(_layout("muon", "FSDP"), (4,), (13, 7)) == 2 * 16 * 7
    assert analytic_volume(_layout("muon", "FSDP"), (4,), (13, 7), padded=True) == 2 * 16 * 7
    # FSDP over colwise TP (_StridedShard): TP block 0 of 13 rows over 2 is 7 rows, split over 4 dp ranks as 2, 2, 2, 1
    lay = _layout("muon", "FSDP + TP colwise duplicated")
    assert analytic_volume(lay, (4, 2), (13, 7)) == 2 * 4 * 2 * 7 + 2 * 7 * 7


def test_analytic_volumes_dion_table1():
    """Dion's rows of Table 1 for a wide (16, 24) matrix, r = 8, working matrix (24, 16):
    data-parallel (m′ + n′) r, weight sharding of the working columns (m′ + 1) r."""
    m, n, r = 24, 16, 8
    assert analytic_volume(_layout("dion", "DDP"), (4,), (n, m)) == (m + n) * r  # P and R averaged
    assert analytic_volume(_layout("dion", "DDP, grads synced"), (4,), (n, m)) == 0
    assert analytic_volume(_layout("dion", "FSDP"), (4,), (n, m)) == (m + 1) * r  # Shard(0): working columns
    assert analytic_volume(_layout("dion", "TP rowwise"), (4,), (n, m)) == n * r + m * r  # R, then P gathered
    assert analytic_volume(_layout("dion", "FSDP"), (1,), (n, m)) == 0


@given(m=st.integers(1, 40), n=st.integers(1, 40), world=st.sampled_from([2, 4, 8]))
def test_padded_volume_bounds_the_analytic(m, n, world):
    """The padded evaluation is never below the exact one, and equal when every sharded dim
    divides evenly (then the ledger must match the formula exactly)."""
    for lay, shape in layouts_for(world):
        exact = analytic_volume(lay, shape, (m, n))
        padded = analytic_volume(lay, shape, (m, n), padded=True)
        assert padded >= exact
        pm, pn = sharding.padded_shape(lay, shape, (m, n))
        assert pm >= m and pn >= n and (pm, pn) == sharding.padded_shape(lay, shape, (pm, pn))
        if (pm, pn) == (m, n):
            assert padded == exact


def test_docs_cover_every_layout():
    """docs/layouts.md is generated by the run; it must list every layout of ``LAYOUTS`` (rerun
    ``ortho-verify sharding --write-docs`` after changing them)."""
    text = sharding.DOCS_PATH.read_text()
    for world in sharding.DOCS_WORLD_SIZES:
        assert f"### World size {world}" in text
    for lay in LAYOUTS:
        assert f"| {lay.optimizer} | {lay.name} |" in text, lay.name
    assert "FAIL" not in text


def test_comm_verdict():
    assert sharding.comm_verdict(10, 10, 12) == "exact"
    assert sharding.comm_verdict(11, 10, 12) == "padding"
    assert sharding.comm_verdict(13, 10, 12) == "MISMATCH"
    assert sharding.comm_verdict(9, 10, 12) == "MISMATCH"  # a collective missing
    assert sharding.comm_verdict(9, None, None) == "no formula"


# ---------------------------------------------------------------------------------------
# One launch of 4 ranks: a subset of layouts, then the same layouts with planted bugs.
# ---------------------------------------------------------------------------------------

WORLD = 4
#: In ``LAYOUTS`` order: compressed sync (HSDP), _StridedShard, a sharded column dim, Muon's gather /
#: scatter, its blockwise definition and its Gram all-reduce under FSDP + TP.
SUBSET = ["dion/TP rowwise", "dion/HSDP", "dion/FSDP + TP colwise", "muon/FSDP", "muon/TP colwise blockwise",
          "muon/FSDP + TP rowwise distributed"]
#: plant -> the layouts (of those using the collective it breaks) that must fail with it.
PLANTED = {"no_all_reduce": ["dion/TP rowwise", "dion/HSDP", "dion/FSDP + TP colwise",
                             "muon/FSDP + TP rowwise distributed"],
           "rotated_blocks": ["muon/FSDP", "muon/FSDP + TP rowwise distributed"],
           "rotated_scatter": ["muon/FSDP"],
           "broadcast_to_rank_0": ["muon/DDP"]}
#: Plants that leave rank 0's copy right: only the comparison of every rank's digest catches them.
UNSEEN_BY_RANK_0 = ("broadcast_to_rank_0",)


def _exact(world: int, names: list[str]) -> list:
    return [(lay, shape) for lay, shape in layouts_for(world) if f"{lay.optimizer}/{lay.name}" in names]


def _launch(rank: int, world: int) -> dict:
    out = {}
    for plant in (None, *PLANTED):
        names = SUBSET if plant is None else PLANTED[plant]
        plan = sharding.Plan(_exact(world, names), dtypes=("float64",), matrices=sharding.QUICK_MATRICES,
                             steps=sharding.QUICK_STEPS, plant=plant)
        out[plant] = sharding.worker(rank, world, plan)
    return out


@pytest.fixture(scope="module")
def launched():
    return run_workers(WORLD, _launch, timeout=240)[0]


def test_subset_equals_one_process(launched):
    rows = launched[None]
    assert [f"{r['optimizer']}/{r['layout']}" for r in rows] == SUBSET
    tol = sharded_tolerance("float64")
    for r in rows:
        assert r["status"] == "pass", r
        assert r["bound"] == tol and 0 <= r["worst"] <= tol
        assert r["bitwise"] or not r["bitwise_required"]
        assert r["replicas_identical"]  # every rank holds the same full weights and state
        # Muon's formula counts the padding of uneven shards: exact for every shape
        assert r["comm"]["verdict"] in (("exact",) if r["optimizer"] == "muon" else ("exact", "padding"))
        even = r["comm"]["matrices"][0]  # (12, 8): every sharded dim divides by 2 and 4
        assert even["verdict"] == "exact" and even["numel"] == even["analytic"]
    compressed = [r for r in rows if r["check"] == "compressed"]
    assert compressed and all(r["replicas_identical"] and "momentum after sync" in r["errors"] for r in compressed)
    assert any(r["check"] == "blockwise" for r in rows)


def test_planted_bugs_fail(launched):
    for plant, names in PLANTED.items():
        rows = launched[plant]
        assert [f"{r['optimizer']}/{r['layout']}" for r in rows] == names
        for r in rows:
            assert r["status"] == "FAIL", (plant, r["layout"], r["worst"])
            if plant in UNSEEN_BY_RANK_0:
                assert r["worst"] <= r["bound"] and not r["replicas_identical"], (plant, r["layout"], r["worst"])
            else:
                assert r["worst"] > 1e3 * r["bound"], (plant, r["layout"], r["worst"])


# ---------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------


def test_cli_quick_world_size_2(tmp_path, capsys):
    code = sharding.main(["--world-size", "2", "--quick", "--dtype", "float64", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "sharding.json").read_text())
    assert code == 0, [r for r in report["rows"] if r["status"] != "pass"]
    assert {r["world_size"] for r in report["rows"]} == {2}
    assert len(report["rows"]) == len(layouts_for(2))
    md = (tmp_path / "sharding.md").read_text()
    assert "## World size 2" in md and "HSDP" not in md  # 2-D layouts need 4 ranks
    assert "layout checks passed" in capsys.readouterr().out


def test_cli_rejects_bad_arguments(monkeypatch):
    for argv in (["--world-size", "0"], ["--dtype", "bfloat16"], ["--world-size", "2", "--layout", "HSDP"],
                 ["--write-docs", "--quick"]):
        with pytest.raises(SystemExit) as exc:
            sharding.main(argv)
        assert exc.value.code == 2, argv
    # under torchrun only the launched world size runs: docs/layouts.md would lose the others
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as exc:
        sharding.main(["--write-docs"])
    assert exc.value.code == 2
