"""``check_sharded_optimizer`` on Dion2: ortho_fast's Dion2 ("global" selection) and a correct
Dion2 of our own (``PlantedDion2``, full matrices on every rank) equal their one-process run on
the layouts; the layout-dependent choices it plants (rows forced by row sharding, per-shard top-k)
are caught on the layouts where they change the step. Forks 2 gloo ranks per layout."""

from __future__ import annotations

import pytest

from ortho_verify import check_sharded_optimizer
from ortho_verify.sharding.planted_dion2 import DION2_BUGS, PlantedDion2, dion2_factory, planted_dion2_factory

WORLD = 2
#: A tall matrix (columns selected: row sharding must not force rows) and a wide one with an uneven
#: split of its selected rows over 2 ranks.
SHAPES = (("tall", (16, 8)), ("wide", (7, 12)))
LAYOUTS = ["DDP", "FSDP Shard(0)", "TP rowwise"]


def _failing(report) -> set[tuple[str, str]]:
    """(layout, shape name) of every disagreement."""
    return {(d["layout"], d["shape"].split()[0]) for d in report.disagreements}


@pytest.mark.parametrize("factory", [dion2_factory, planted_dion2_factory(None)], ids=["ortho_fast", "ours"])
def test_correct_dion2_equals_one_process(factory):
    report = check_sharded_optimizer(factory, world_size=WORLD, layouts=LAYOUTS, shapes=SHAPES, steps=2)
    assert report.passed, report.summary()


def test_layout_dependent_selection_is_caught():
    report = check_sharded_optimizer(planted_dion2_factory("shard_forces_rows"), world_size=WORLD,
                                     layouts=["FSDP Shard(0)"], shapes=SHAPES, steps=2)
    assert _failing(report) == {("FSDP Shard(0)", "tall")}, report.summary()
    report = check_sharded_optimizer(planted_dion2_factory("local_shard"), world_size=WORLD,
                                     layouts=["FSDP Shard(0)"], shapes=SHAPES, steps=2)
    assert ("FSDP Shard(0)", "wide") in _failing(report), report.summary()


def test_planted_bug_names_are_checked():
    with pytest.raises(ValueError, match="bug"):
        PlantedDion2([], bug="nothing")
    assert set(DION2_BUGS) == {None, "shard_forces_rows", "local_shard"}
