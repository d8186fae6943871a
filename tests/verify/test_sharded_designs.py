"""check_sharded_optimizer on the distributed-Muon designs people run (planted, our own code):
a combined launch that raises is a failing row even when every shape alone runs; state kept by
an owner rank is a placement, not a cause; a backend without a feature gets its own row; a hang
costs seconds; bfloat16 Newton–Schulz is judged by the reduction-order bound, and a per-shard
Newton–Schulz fails in every dtype."""

from __future__ import annotations

import time

import pytest
import torch

from ortho_verify import check_sharded_optimizer
from ortho_verify.report.results import failure_kind
from ortho_verify.sharding.crashes import BACKEND_KIND, COMBINED_KIND
from ortho_verify.sharding.planted_designs import future_muon_factory, owner_batch_muon_factory
from ortho_verify.sharding.planted_optimizers import planted_muon_conventions, planted_muon_factory

MIXED = "16x8,12x12,16x8"


def _crash_rows(report):
    return [r for r in report.results if r.check == "layout_runs" and not r.passed]


def test_mixed_shape_all_gather_crash_is_recorded():
    report = check_sharded_optimizer(owner_batch_muon_factory(), world_size=2, layouts=["DDP"], shapes=MIXED,
                                     dtype=torch.float32, steps=2)
    assert report.status == "failed", report.summary()
    [row] = [r for r in _crash_rows(report) if r.input == "DDP"]
    assert failure_kind(row) == "unsupported"
    assert "invalid tensor size" in row.note or "size" in row.note, row.note
    assert "planted_designs.py" in row.note and "factory_run.py" not in row.note, row.note
    assert report.crashes == {COMBINED_KIND: ["DDP"]}
    # each shape alone runs, and is judged (owner-kept momentum is no cause)
    judged = [r for r in report.results if r.check == "sharded_vs_one_process"]
    assert {r.input for r in judged} == {"DDP / 16x8#0", "DDP / 16x8#1", "DDP / 12x12"}
    assert all(r.passed for r in judged)


def test_owner_placement_is_recognized_and_passes():
    report = check_sharded_optimizer(owner_batch_muon_factory(group_by_shape=True), world_size=2, layouts=["DDP"],
                                     shapes=MIXED + ",8x16", dtype=torch.float32, steps=2)
    assert report.passed, report.summary()
    state = [r for r in report.results if r.check == "state_gathers"]
    assert len(state) == 4 and all("owner placement" in r.detail for r in state[:3]), [r.detail for r in state]
    declared = check_sharded_optimizer(owner_batch_muon_factory(group_by_shape=True), world_size=2, layouts=["DDP"],
                                       shapes="16x8,16x8", dtype=torch.float32, steps=1, state_placement="replicated")
    bad = [r for r in declared.results if r.check == "state_gathers" and not r.passed]
    assert bad and all("declared" in r.note for r in bad)
    assert not any("orientation" in d["cause"] for d in declared.disagreements)


def test_backend_feature_is_its_own_row():
    report = check_sharded_optimizer(future_muon_factory(), world_size=2, layouts=["DDP"], shapes="8x6",
                                     dtype=torch.float32, steps=1)
    [row] = _crash_rows(report)
    assert failure_kind(row) == "unsupported" and row.cause == BACKEND_KIND
    assert "Work::getFuture" in row.note and "gloo" in row.note and "NCCL" in row.note, row.note
    assert list(report.crashes) == [BACKEND_KIND] and report.kinds["wrong math"] == 0


def test_hang_costs_the_floor_not_the_timeout():
    begun = time.perf_counter()
    report = check_sharded_optimizer(planted_muon_factory("hang"), world_size=2, layouts=["DDP", "FSDP Shard(0)"],
                                     shapes="8x6", dtype=torch.float32, steps=1, timeout=300, hang_floor=2.0)
    elapsed = time.perf_counter() - begun
    assert report.crashes.get("hung") == ["DDP", "FSDP Shard(0)"], report.crashes
    assert all(v["limit_s"] <= 2.0 for v in report.limits.values()), report.limits
    assert elapsed < 30, elapsed


@pytest.mark.parametrize("bug, ns_dtype, passes", [(None, torch.bfloat16, True), ("local_shard", torch.bfloat16, False),
                                                   ("local_shard", None, False)])
def test_bfloat16_bound_tells_gather_from_local_shard(bug, ns_dtype, passes):
    conv = planted_muon_conventions(ns_dtype or torch.float32)
    report = check_sharded_optimizer(planted_muon_factory(bug, ns_dtype), conv, world_size=2,
                                     layouts=["FSDP Shard(0)", "TP rowwise"], shapes="16x8,8x16,12x12",
                                     dtype=torch.float32, steps=2)
    rows = [r for r in report.results if r.check == "sharded_vs_one_process"]
    assert rows and ("bfloat16 compute" in rows[0].detail) == (ns_dtype is not None)
    if passes:
        assert all(r.passed for r in rows), report.summary()
    else:  # every sharded (layout, shape) fails at every step
        assert not any(r.passed for r in rows), [r.ratio for r in rows]


def test_torch_muon_on_fsdp2_passes_in_its_bfloat16():
    muon = getattr(torch.optim, "Muon", None)
    if muon is None:
        pytest.skip("torch.optim.Muon needs torch 2.9+")

    def factory(params, layout):
        return muon(params, lr=0.02, weight_decay=0.1)

    report = check_sharded_optimizer(factory, world_size=2, layouts=["FSDP Shard(0)"], shapes="16x8,8x16,13x7",
                                     dtype=torch.float32, steps=2)
    assert report.compute.startswith("bfloat16, torch.optim.Muon")
    assert report.passed, report.summary()
    strict = check_sharded_optimizer(factory, world_size=2, layouts=["FSDP Shard(0)"], shapes="16x8",
                                     dtype=torch.float32, steps=1, compute_dtype="float32")
    assert not strict.passed  # the float32 contract: bfloat16's own rounding exceeds it


@pytest.mark.slow
def test_every_layout_at_four_ranks():
    """At 4 ranks on every layout with the default shapes: Newton–Schulz per local shard fails every
    sharded (layout, shape, step) in bfloat16 and in float32; gather-then-orthogonalize passes."""
    conv = planted_muon_conventions()
    gather = check_sharded_optimizer(planted_muon_factory(None, torch.bfloat16), conv, world_size=4,
                                     dtype=torch.float32)
    assert gather.passed, gather.summary()
    for ns_dtype in (torch.bfloat16, None):
        report = check_sharded_optimizer(planted_muon_factory("local_shard", ns_dtype),
                                         planted_muon_conventions(ns_dtype or torch.float32), world_size=4,
                                         dtype=torch.float32)
        rows = [r for r in report.results if r.check == "sharded_vs_one_process" and not r.input.startswith("DDP")]
        assert {r.input.split(" / ")[0] for r in rows} == set(report.layouts) - {"DDP"}
        assert rows and not any(r.passed for r in rows), [(r.input, r.detail, r.ratio) for r in rows if r.passed]
