"""``check_sharded_optimizer`` on bad input: a factory that raises, hangs on one rank, steps only
some ranks, or leaves plain tensors where DTensors were given gives a failing row with the message
while the other layouts still run, and no worker process outlives the check; bad arguments raise
errors naming them."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest
import torch

from ortho_verify import MuonConventions, check_sharded_optimizer
from ortho_verify.sharding import PlantedMuon, planted_muon_factory
from ortho_verify.sharding.sharded_check import load_factory

SHAPES = ((8, 6),)


muon = planted_muon_factory  # PlantedMuon on the layout's meshes, with a planted bug or none


def raising(params, layout):
    if layout is not None and layout.name == "TP rowwise":
        raise RuntimeError("no TP support in this optimizer")
    return PlantedMuon(params, distributed_mesh=None if layout is None else layout.shard_mesh)


def unsharding(params, layout):
    """Builds the optimizer on plain full copies of DTensor parameters (``full_tensor()``)."""
    plain = [torch.nn.Parameter(p.full_tensor()) if hasattr(p, "full_tensor") else p for p in params]
    return PlantedMuon(plain)


def _children() -> list[int]:
    """Pids of this process's live child processes (from /proc)."""
    me, out = os.getpid(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            out.append(int(pid))
    return out


def _row(report, layout):
    return next(r for r in report.results if r.check == "layout_runs" and r.input == layout)


def test_raising_factory_fails_its_layout_only():
    report = check_sharded_optimizer(raising, world_size=2, layouts=["TP rowwise", "FSDP Shard(0)"], shapes=SHAPES,
                                     steps=1)
    row = _row(report, "TP rowwise")
    assert not row.passed and "no TP support in this optimizer" in row.note
    assert _row(report, "FSDP Shard(0)").passed
    assert any(r.check == "sharded_vs_one_process" and r.input.startswith("FSDP Shard(0)") and r.passed
               for r in report.results)
    assert "no TP support" in report.summary()


# "hang" waits out the idle limit (hang_floor, 5 s) on both layouts: slow; "rank_0_only" exercises
# the same kill path (a rank that waits forever) in the default run.
@pytest.mark.parametrize("bug", [pytest.param("hang", marks=pytest.mark.slow), "rank_0_only"])
def test_hanging_or_partial_step_is_killed(bug):
    before = set(_children())
    report = check_sharded_optimizer(muon(bug), world_size=2, layouts=["DDP", "FSDP Shard(0)"], shapes=SHAPES,
                                     steps=1, timeout=8.0)
    for name in ("DDP", "FSDP Shard(0)"):
        row = _row(report, name)
        if bug == "hang":
            assert not row.passed and row.note.startswith("hung: run_workers") and "sat idle" in row.note, row.note
            assert "idle limit 5.0 s" in row.note and "timeout 8 s" in row.note, row.note
        else:  # rank 1 skips the step: its next collective meets rank 0's, gloo fails or waits forever
            assert not row.passed and ("hung" in row.note or "raised" in row.note), row.note
    assert not report.passed
    assert not mp.active_children() and set(_children()) <= before  # no orphaned workers


def test_plain_tensors_where_dtensors_were_given():
    report = check_sharded_optimizer(unsharding, world_size=2, layouts=["FSDP Shard(0)", "DDP"], shapes=SHAPES,
                                     steps=1)
    row = _row(report, "FSDP Shard(0)")
    assert not row.passed and "holds a plain tensor" in row.note and "placements [Shard(dim=0)]" in row.note, row.note
    assert _row(report, "DDP").passed  # plain tensors are DDP's layout


def test_factory_returning_no_optimizer():
    with pytest.raises(TypeError, match="factory: returned int"):
        check_sharded_optimizer(lambda params, layout: 3, world_size=2, shapes=SHAPES, steps=1)
    report = check_sharded_optimizer(lambda p, lay: PlantedMuon(p) if lay is None else None, world_size=2,
                                     layouts=["DDP"], shapes=SHAPES, steps=1)
    assert report.status == "inconclusive" and "not supported" in report.summary()


def test_bad_arguments():
    f = muon()
    with pytest.raises(TypeError, match="factory"):
        check_sharded_optimizer("not callable")
    with pytest.raises(TypeError, match="conventions"):
        check_sharded_optimizer(f, "muon")
    with pytest.raises(TypeError, match="dtype"):
        check_sharded_optimizer(f, dtype=torch.bfloat16)
    for kw, word in (({"steps": 0}, "steps"), ({"timeout": 0}, "timeout"), ({"shapes": [(3,)]}, "shapes"),
                     ({"shapes": []}, "shapes"), ({"layouts": ["nothing"]}, "layouts"),
                     ({"world_size": 0}, "world_size")):
        with pytest.raises(ValueError, match=word):
            check_sharded_optimizer(f, **kw)
    with pytest.raises(ValueError, match="optimizer"):
        load_factory("no_colon")
    assert load_factory("ortho_verify.sharding:dion_factory").__name__ == "dion_factory"


def test_oracle_rows_with_conventions():
    """With conventions the one-process run is also checked against the oracle (check_optimizer)."""
    conv = MuonConventions(momentum_style="classic", ns_dtype=torch.float64, eps=1e-7, adjust_lr="original")
    report = check_sharded_optimizer(muon(), conv, world_size=2, layouts=["FSDP Shard(0)"], shapes=SHAPES, steps=2)
    oracle = [r for r in report.results if r.check.startswith("muon_update") or r.check == "muon_momentum"]
    assert oracle and report.passed, report.summary()
