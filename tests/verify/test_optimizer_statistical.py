"""check_optimizer's statistical row ``optimizer_mean_deviation``: J same-shape
parameters in one optimizer, the per-direction mean of the update's deviation against the
Higham–Mary / Azuma–Hoeffding threshold (false alarm <= 1e-6 per row). Correct optimizers written
differently pass; the optimizer-level plants beyond the statistics' reach fail; the power script
runs at small n."""

from __future__ import annotations

import functools
import pathlib

import pytest
import torch

import ortho_fast
from ortho_verify import ORTHO_MUON, MuonConventions, check_optimizer
from ortho_verify.conventions import NORMUON
from ortho_verify.planted.muon import (
    JORDAN_CONVENTIONS,
    TORCH_STYLE_CONVENTIONS,
    JordanStyleMuon,
    TorchStyleMuon,
    planted,
)
from ortho_verify.report.results import verdict
from tests.load_file import load_file

STAT = dict(shapes=((4, 2),), steps=2, param_dtype=torch.bfloat16, statistical_matrices=16, statistical_shape=(24, 16))


def _row(report):
    [row] = [r for r in report.results if r.check == "optimizer_mean_deviation"]
    return row


# Three correct optimizers at two seeds each here; the false-alarm rate itself (3,000 seeded runs)
# is measured by scripts/optimizer_power.py and written into docs/verification.md.
@pytest.mark.parametrize("seed", [0, 7919])
@pytest.mark.parametrize("which", ["ours", "torch-style", "jordan-style"])
def test_correct_optimizers_pass_the_statistical_row(seed, which):
    factory, conv = {"ours": (ortho_fast.Muon, ORTHO_MUON), "torch-style": (TorchStyleMuon, TORCH_STYLE_CONVENTIONS),
                     "jordan-style": (JordanStyleMuon, JORDAN_CONVENTIONS)}[which]
    row = _row(check_optimizer(factory, conv, seed=seed, **STAT))
    assert row.passed and row.claimed and row.ratio < 1, row


@pytest.mark.parametrize("plant", ["NorMuon as Muon", "eps added, clamp declared", "Nesterov as g + mu*buf",
                                   "coefficient b off by 1%"])
def test_optimizer_level_plants_are_caught_in_bf16(plant):
    factory, conv = planted(plant)
    report = check_optimizer(factory, conv, **{**STAT, "statistical_matrices": 32, "statistical_shape": (40, 24)})
    row = _row(report)
    assert not row.passed and row.ratio > 1 and report.kinds["wrong math"] >= 1 and report.kinds["side effect"] == 0
    # the per-step rows alone miss it in bfloat16 (one step's window is wide)
    rest = check_optimizer(factory, conv, param_dtype=torch.bfloat16, steps=2, statistical_matrices=0)
    assert rest.status == "passed", rest.summary()


def test_default_is_on_where_the_window_is_wide_and_off_where_it_is_sharp():
    f32 = MuonConventions(eps_mode="clamp", ns_dtype=torch.float32)
    plain = functools.partial(TorchStyleMuon, ns_dtype=torch.float32)
    report = check_optimizer(plain, f32, param_dtype=torch.float32, steps=2, shapes=((8, 4),))
    assert not [r for r in report.results if r.check == "optimizer_mean_deviation"]
    report = check_optimizer(TorchStyleMuon, TORCH_STYLE_CONVENTIONS, param_dtype=torch.float32, steps=2,
                             shapes=((8, 4),))
    row = _row(report)  # float32 parameters, bfloat16 Newton–Schulz declared: on
    assert row.claimed and row.passed and "64 40x24" in row.detail


def test_stages_give_a_supplementary_row_that_leaves_the_verdict_alone():
    factory = functools.partial(ortho_fast.NorMuon, dtype=torch.float32)
    conv = NORMUON
    report = check_optimizer(factory, conv, param_dtype=torch.bfloat16, steps=2, shapes=((8, 4),),
                             statistical_matrices=8)
    row = _row(report)
    assert not row.claimed and row.extra.get("supplementary")
    _, reasons = verdict(report.results)
    assert not any("optimizer_mean_deviation" in why for why in reasons), reasons


@pytest.mark.parametrize("bad", [3, 7, True, 2.5, -1])
def test_statistical_matrices_is_validated(bad):
    with pytest.raises(ValueError, match="statistical_matrices"):
        check_optimizer(TorchStyleMuon, TORCH_STYLE_CONVENTIONS, statistical_matrices=bad)


def test_statistical_shape_is_validated():
    with pytest.raises(ValueError, match="statistical_shape"):
        check_optimizer(TorchStyleMuon, TORCH_STYLE_CONVENTIONS, statistical_shape=(1, 8))


def test_power_script_small_n():
    path = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "optimizer_power.py"
    mod = load_file(path, "optimizer_power")
    alarms = mod.false_alarm_runs(3, 8, (16, 12))
    assert [a["runs"] for a in alarms] == [1, 1, 1] and all(a["failures"] == 0 for a in alarms)
    row = mod.power_row("eps added, clamp declared", *planted("eps added, clamp declared"), "bfloat16", 16)
    assert row["stat"] is not None and not row["stat"].passed and row["verdict"].startswith("failed: wrong math")
