"""``ortho_verify.check_sharded_optimizer``: anyone's distributed optimizer on every layout.

Planted distributed optimizers (``ortho_verify.sharding.PlantedMuon`` / ``PlantedDion``, written by
us, computed differently from ortho_fast) must pass when correct and be caught, with the cause in
the summary, on the layouts where each bug is wrong; ortho_fast's Dion and Muon pass through the
same public API. Each check forks 4 gloo ranks per layout: a quick subset of layouts and shapes
here, every layout behind ``slow``. Bad input: tests/verify/test_sharded_optimizer_errors.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_ref
from ortho_verify import DionConventions, check_sharded_optimizer
from ortho_verify.sharding import (
    SHARDED_LAYOUTS,
    PlantedDion,
    dion_factory,
    dion_replay,
    layout_pattern,
    layouts_for,
    muon_factory,
    planted_muon_factory,
)
from ortho_verify.tolerances import sharded_tolerance

WORLD = 4
SHAPES = (("tall", (16, 8)), ("square", (12, 12)), ("empty shards", (3, 5)))
STEPS = 2


muon = planted_muon_factory  # PlantedMuon on the layout's meshes, with a planted bug or none


def dion(orientation="shape"):
    def factory(params, layout):
        kw = dict(lr=0.02, mu=0.9, weight_decay=0.1, rank_fraction=0.5, orientation=orientation)
        if layout is None:
            return PlantedDion(params, **kw)
        return PlantedDion(params, replicate_mesh=layout.replicate_mesh, outer_shard_mesh=layout.outer_shard_mesh,
                           inner_shard_mesh=layout.inner_shard_mesh, **kw)
    return factory


def _check(factory, layouts, conventions=None, **kw):
    return check_sharded_optimizer(factory, conventions, world_size=WORLD, layouts=layouts, shapes=SHAPES,
                                   steps=STEPS, **kw)


def _failing(report) -> dict[str, set[str]]:
    """layout -> the shapes that disagree."""
    out: dict[str, set[str]] = {}
    for d in report.disagreements:
        out.setdefault(d["layout"], set()).add(d["shape"])
    return out


# ---------------------------------------------------------------------------------------
# No processes
# ---------------------------------------------------------------------------------------


def test_catalogue_fits_world_sizes():
    names = {lay.name for lay, _ in layouts_for(8, catalogue=SHARDED_LAYOUTS)}
    assert names == {lay.name for lay in SHARDED_LAYOUTS}
    four = {lay.name: shape for lay, shape in layouts_for(4, catalogue=SHARDED_LAYOUTS)}
    assert four["HSDP"] == (2, 2) and four["FSDP + TP colwise"] == (2, 2) and "HSDP + TP colwise" not in four
    assert all(lay.optimizer == "any" for lay in SHARDED_LAYOUTS)


@settings(deadline=None)
@given(m=st.integers(1, 9), n=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_replay_in_the_shape_orientation_is_the_oracle(m, n, seed):
    """``dion_replay`` forced into the orientation the global shape gives equals ``ortho_ref.dion_step``
    (its own derivation: the same Algorithm 1); the other orientation needs Q of the other length."""
    rng = np.random.default_rng(seed)
    w, mom, g = rng.standard_normal((m, n)), rng.standard_normal((m, n)), rng.standard_normal((m, n))
    transposed = ortho_ref.dion_transposed(m, n)
    r = max(1, min(m, n) // 2)
    q = np.linalg.qr(rng.standard_normal((min(m, n), r)))[0]
    ref = ortho_ref.dion_step(w, g, mom, q, lr=0.02, mu=0.9, weight_decay=0.1)
    out = dion_replay(w, mom, q, [g], transposed=transposed, lr=0.02, mu=0.9, weight_decay=0.1)
    assert np.linalg.norm(out[0] - ref.weight) <= sharded_tolerance("float64") * np.linalg.norm(ref.weight)
    if m != n:
        assert dion_replay(w, mom, q, [g], transposed=not transposed, lr=0.02, mu=0.9, weight_decay=0.1) is None


def test_layout_pattern_names_the_shared_role():
    by = {lay.name: lay for lay in SHARDED_LAYOUTS}
    tp = [by[n] for n in ("TP colwise", "TP rowwise", "FSDP + TP colwise")]
    text = layout_pattern(tp, [by["FSDP Shard(0)"], by["DDP"], by["HSDP"]])
    assert any("inner shard mesh" in t for t in text)
    assert layout_pattern([by["DDP"]], [by["FSDP Shard(0)"]])[0].startswith("fails exactly on the layouts with plain")
    assert layout_pattern([], [by["DDP"]]) == []


# ---------------------------------------------------------------------------------------
# Correct optimizers pass (ortho_fast's own through the same public API)
# ---------------------------------------------------------------------------------------

QUICK = ["DDP", "FSDP Shard(1)", "HSDP", "FSDP + TP colwise"]


@pytest.mark.parametrize("factory,conventions", [(muon(), None), (dion(), DionConventions()),
                                                 (dion_factory, DionConventions()), (muon_factory, None)],
                         ids=["planted muon", "planted dion", "ortho_fast dion", "ortho_fast muon"])
def test_correct_optimizers_pass(factory, conventions):
    report = _check(factory, QUICK, conventions)
    assert report.passed, report.summary()
    assert report.layouts == QUICK and not report.disagreements and not report.patterns
    rows = [r for r in report.results if r.check == "sharded_vs_one_process"]
    assert len(rows) == len(QUICK) * len(SHAPES) * STEPS
    assert all(r.tolerance == sharded_tolerance("float64") for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("factory", [dion_factory, muon_factory], ids=["dion", "muon"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ortho_fast_passes_every_layout(factory, dtype):
    report = check_sharded_optimizer(factory, world_size=WORLD, dtype=dtype)
    assert report.passed, report.summary()
    assert len(report.layouts) == len(layouts_for(WORLD, catalogue=SHARDED_LAYOUTS))


# ---------------------------------------------------------------------------------------
# Planted bugs: caught where they are wrong, with the cause
# ---------------------------------------------------------------------------------------


def test_local_shard_muon():
    report = _check(muon("local_shard"), ["DDP", "FSDP Shard(1)", "TP colwise"])
    failing = _failing(report)
    assert set(failing) == {"FSDP Shard(1)", "TP colwise"}  # DDP holds the full matrix: right there
    assert all("computed on the local shard" in d["cause"] for d in report.disagreements)
    assert any("sharded matrices" in p for p in report.patterns)
    assert all(d["worst"] > 1e6 * d["bound"] for d in report.disagreements)


def test_orientation_from_the_local_shard():
    """Dion choosing its working matrix from the shard's shape: wrong on FSDP Shard(0) for the tall
    and square matrices (their shards are wide), right on DDP; the replay names the orientation and
    the tall Q cannot be loaded by one process."""
    report = _check(dion("local_shard"), ["DDP", "FSDP Shard(0)"], DionConventions())
    assert _failing(report) == {"FSDP Shard(0)": {"tall 16x8", "square 12x12"}}
    for d in report.disagreements:
        assert "consistent with an orientation choice" in d["cause"] and "working matrix Bᵀ" in d["cause"]
    tall = next(d for d in report.disagreements if d["shape"] == "tall 16x8")
    assert "Q: (16, 4) here, (8, 4) in one process" in tall["cause"]
    assert "orientation" in report.summary()


def test_orientation_from_the_sharding():
    """microsoft/dion's rule (transposed whenever the outer shard is dim 0): Shard(0) wrong for tall
    and square, Shard(1) right; without conventions the tall Q's shape still says why."""
    report = _check(dion("sharding"), ["FSDP Shard(0)", "FSDP Shard(1)"])
    assert _failing(report) == {"FSDP Shard(0)": {"tall 16x8", "square 12x12"}}
    tall = next(d for d in report.disagreements if d["shape"] == "tall 16x8")
    assert "working matrix is transposed" in tall["cause"]


def test_missing_inner_reduction():
    report = _check(muon("no_inner_reduction"), ["FSDP Shard(0)", "TP colwise", "FSDP + TP colwise"])
    assert set(_failing(report)) == {"TP colwise", "FSDP + TP colwise"}
    assert any("inner shard mesh" in p for p in report.patterns)


def test_broadcast_from_rank_0():
    """DDP: matrix i is computed on rank i mod 4; broadcasting from rank 0 loses every matrix but the
    first (rank 0's own): caught on DDP only, the update missing."""
    report = _check(muon("broadcast_from_rank_0"), ["DDP", "FSDP Shard(0)"])
    assert _failing(report) == {"DDP": {"square 12x12", "empty shards 3x5"}}
    assert all("the update did not arrive" in d["cause"] for d in report.disagreements)
    assert any("plain replicated tensors" in p for p in report.patterns)
