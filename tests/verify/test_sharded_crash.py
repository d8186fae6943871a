"""check_sharded_optimizer on an optimizer that crashes on some layouts or shapes: it
is still judged on the ones it runs, and the crashes are classified by the layout and shape that
raised ("raises on empty shards", "does not take TP placements"), kind "unsupported"."""

from __future__ import annotations

import pytest
import torch

from ortho_verify import check_sharded_optimizer
from ortho_verify.report.results import failure_kind
from ortho_verify.sharding.layouts import SHARDED_LAYOUTS
from ortho_verify.sharding.planted_optimizers import crashing_muon_factory
from ortho_verify.sharding.sharded_check import DEFAULT_SHARDED_SHAPES, crash_kind

LAYOUTS = {lay.name: lay for lay in SHARDED_LAYOUTS}


def test_crash_kind_from_layout_and_shape():
    fsdp, tp = LAYOUTS["FSDP Shard(0)"], LAYOUTS["TP colwise"]
    assert crash_kind(fsdp, (4,), (3, 5)) == "raises on empty shards"
    assert crash_kind(fsdp, (4,), (13, 7)) == "raises on uneven shards"
    assert crash_kind(fsdp, (4,), (16, 8)) == "raises on this layout"
    assert crash_kind(tp, (4,), (16, 8)) == "does not take TP placements"
    assert crash_kind(tp, (4,), (3, 5)) == "raises on empty shards"  # the shape decides first
    assert crash_kind(LAYOUTS["FSDP Shard(1)"], (4,), (8, 3)) == "raises on empty shards"


def test_default_shapes_put_the_divisible_ones_first():
    divisible = [all(d % 4 == 0 for d in s) for _, s in DEFAULT_SHARDED_SHAPES]
    assert divisible == sorted(divisible, reverse=True) and divisible[0]


def test_crashing_optimizer_is_judged_where_it_runs():
    report = check_sharded_optimizer(crashing_muon_factory(), world_size=4, layouts=["FSDP Shard(0)", "TP colwise"],
                                     steps=1)
    assert report.status == "failed"
    # FSDP: judged (and right) on the shapes without empty shards
    fsdp = [r for r in report.results if r.check == "sharded_vs_one_process" and r.input.startswith("FSDP Shard(0)")]
    assert {r.input.split(" / ")[1] for r in fsdp} == {lab for lab, s in DEFAULT_SHARDED_SHAPES if s != (3, 5)}
    assert all(r.passed for r in fsdp)
    assert set(report.crashes) == {"raises on empty shards", "does not take TP placements", "raises on this layout"}
    assert report.crashes["raises on empty shards"] == ["FSDP Shard(0) / 3x5"]
    # on TP nothing ran, so nothing confirms that the empty shards are what it cannot take
    assert report.crashes["raises on this layout"] == ["TP colwise / 3x5"]
    assert len(report.crashes["does not take TP placements"]) == 4  # 16x8 (all 3), 8x16 (both), 12x12, 13x7
    crashes = [r for r in report.results if r.check == "layout_runs" and not r.passed]
    # each layout's combined launch (the verdict) and each shape that raised alone (where)
    assert len(crashes) == 8 and all(failure_kind(r) == "unsupported" for r in crashes)
    assert {r.input for r in crashes if "all parameters together" in r.detail} == {"FSDP Shard(0)", "TP colwise"}
    assert report.kinds["unsupported"] == 8 and report.kinds["wrong math"] == 0
    assert "crashes: raises on empty shards" in report.summary()


def test_cuda_without_gpus_is_a_clear_error():
    if torch.cuda.device_count() >= 2:
        pytest.skip("GPUs present")
    with pytest.raises(ValueError, match="device"):
        check_sharded_optimizer(crashing_muon_factory(), world_size=2, layouts=["DDP"], shapes=((8, 6),), steps=1,
                                device="cuda")


def test_device_cpu_is_the_default_launch():
    report = check_sharded_optimizer(crashing_muon_factory(crash=()), world_size=2, layouts=["FSDP Shard(0)"],
                                     shapes=((8, 6),), steps=1, device="cpu")
    assert report.passed, report.summary()


def _basis_dion(params, layout):
    from ortho_verify.sharding import PlantedDion

    kw = dict(lr=0.02, mu=0.9, weight_decay=0.1, rank_fraction=0.5, rotate_basis_when_sharded=True)
    if layout is None:
        return PlantedDion(params, **kw)
    return PlantedDion(params, replicate_mesh=layout.replicate_mesh, outer_shard_mesh=layout.outer_shard_mesh,
                       inner_shard_mesh=layout.inner_shard_mesh, **kw)


def test_basis_dependent_update_is_named_by_a_deterministic_replay():
    from ortho_verify import DionConventions

    report = check_sharded_optimizer(_basis_dion, DionConventions(), world_size=2, layouts=["FSDP Shard(0)", "DDP"],
                                     shapes=(("tall", (16, 8)), ("wide", (8, 16)), ("square", (12, 12))), steps=3)
    found = [d for d in report.disagreements if d["layout"] == "FSDP Shard(0)" and d["step"] is not None]
    assert {d["shape"].split()[0] for d in found} == {"tall", "wide", "square"}
    assert all("basis-dependent update" in d["cause"] for d in found), [d["cause"] for d in found]
    assert not [d for d in report.disagreements if d["layout"] == "DDP"]  # plain tensors: QR's own basis


def test_crash_message_names_the_users_frame():
    report = check_sharded_optimizer(crashing_muon_factory(), world_size=2, layouts=["FSDP Shard(0)", "TP colwise"],
                                     shapes=((8, 6),), steps=1)
    [row] = [r for r in report.results if r.check == "layout_runs" and r.input == "TP colwise"]
    assert not row.passed and "planted_optimizers.py" in row.note and "in step" in row.note, row.note
    assert report.crashes == {"does not take TP placements": ["TP colwise"]}  # the shape ran on FSDP
    alone = check_sharded_optimizer(crashing_muon_factory(), world_size=2, layouts=["TP colwise"], shapes=((8, 6),),
                                    steps=1)
    assert alone.crashes == {"raises on this layout": ["TP colwise"]}  # nothing ran that would confirm TP


def test_by_shape_provenance_rebuilds_the_input_it_ran():
    from ortho_verify.sharding import initial_weight

    report = check_sharded_optimizer(crashing_muon_factory(), world_size=4, layouts=["FSDP Shard(0)"],
                                     shapes=(("tall", (16, 8)), ("empty shards", (3, 5))), steps=1)
    arrays, how = report.inputs["FSDP Shard(0) / empty shards 3x5"]
    assert "initial_weight(1, (3, 5)" in how  # the rerun keeps the combined run's inputs
    assert (arrays["weight0"] == initial_weight(1, (3, 5), torch.float64).double().numpy()).all()
