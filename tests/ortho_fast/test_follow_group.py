"""A steady-state step resolves nothing about a Muon group: following the group dict through the
step (``scripts/follow_group.py``: maximal runs of traced lines in one ``ortho_fast`` file among
frames holding the dict) passes through at most 5 files and comes back to a file at most 5 times,
for Muon and NorMuon, with a fixed lr and with an lr scheduler. The options, layouts, checks and
stack plan are resolved when the group changes (``ortho_fast.groups.muon_plan.MuonPlan``); the
count before that plan was 18 stays in 5 files with 13 returns (30 stays, 7 files, 23 returns under
a scheduler), which these bounds reject.
"""

from __future__ import annotations

import pathlib
import sys

import pytest

from tests.load_file import load_file

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "follow_group.py"

#: The bounds the plan is held to (files and returns of one traced step).
MAX_FILES = 5
MAX_RETURNS = 5


@pytest.fixture(scope="module")
def follow_group():
    yield load_file(SCRIPT, "follow_group", register=True)
    sys.modules.pop("follow_group", None)


@pytest.mark.parametrize("scheduler", [False, True])
@pytest.mark.parametrize("name", ["muon", "normuon"])
def test_a_step_follows_the_group_through_few_files(follow_group, name, scheduler):
    out = follow_group.measure(name, d=4, layers=2, scheduler=scheduler)
    assert out["stays"], "the trace saw no frame holding the group"
    assert len(out["files"]) <= MAX_FILES, out
    assert out["returns"] <= MAX_RETURNS, out


def test_the_count_sees_a_group_passed_back_and_forth(follow_group, monkeypatch):
    """The measure can fail: a step that hands the group to the options cache and back at every check
    (as the runner did before its plan) counts a return per hand-over."""
    from ortho_fast.groups import muon as group_muon, options

    cache = options.OptionsCache()
    real = group_muon.MuonGroups.check

    def check(self, groups, state, finite=None):
        for group in groups:
            for _ in range(4):  # resolved through another file, four times
                cache.entry(group, group_muon.MUON_OPTION_KEYS, group_muon.resolve_muon_options)
                real(self, [group], state, finite)

    monkeypatch.setattr(group_muon.MuonGroups, "check", check)
    out = follow_group.measure("muon", d=4, layers=2)
    assert out["returns"] > MAX_RETURNS, out
