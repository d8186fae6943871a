"""The stage checks of the judge (ortho_verify.checks.stages): planted bugs in each stage are caught,
those sized from the check's own tolerance just beyond it, and stages written differently from
ortho_fast's pass. Bugs are planted through the documented patch points of
``ortho_fast.functional.muon_stages`` (``equilibrate``, ``renormalize_factor``, ``normuon_factor``:
the post stages are factors that O is multiplied by)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import ortho_fast.functional.muon_stages as fast_stages  # patch points: equilibrate, renormalize_factor, normuon_factor
from ortho_verify.checks import stages as stage_checks
from ortho_verify.inputs.spectra import MatrixCase, matrix_with_spectrum


def _case(m, n, cond=1e2, seed=0):
    s = np.geomspace(1.0, 1.0 / cond, min(m, n))
    return MatrixCase(f"stages/{m}x{n}", matrix_with_spectrum(s, m, n, np.random.default_rng(seed)), "synthetic", "t")


CASES = [_case(24, 16), _case(12, 30, cond=1e3), _case(20, 20, cond=10)]
_REAL = {name: getattr(fast_stages, name) for name in ("equilibrate", "renormalize_factor", "normuon_factor")}


def _rows(case, config, dtype):
    return stage_checks.check_muon_stages(case, config, dtype)


def _caught(rows, quantity=""):
    return any(not r.passed for r in rows if r.detail.endswith(quantity))


def _weight_row(rows):
    return next(r for r in rows if r.detail.endswith(" weight"))


# ---------------------------------------------------------------------------------------
# stages written differently from ortho_fast's pass
# ---------------------------------------------------------------------------------------

def _equilibrate_other(x, side="row", *, floor=fast_stages.NORM_FLOOR):
    """MuonEq through the Gram diagonal and a mean of squares, in float64."""
    w = x.to(torch.float64)
    if side == "column":
        return _equilibrate_other(w.mT, "row", floor=floor).mT.to(fast_stages.stage_dtype(x.dtype))
    sq = torch.einsum("...ij,...ij->...i", w, w)
    target = sq.mean(dim=-1, keepdim=True).sqrt()
    out = w * (target / sq.sqrt().clamp_min(floor)).unsqueeze(-1)
    return out.to(fast_stages.stage_dtype(x.dtype))


def _renormalize_other(o, *, floor=fast_stages.NORM_FLOOR):
    """Muon+'s factor through a sum of squares and a division, in float64."""
    w = o.to(torch.float64)
    norm = (w * w).sum(dim=(-2, -1), keepdim=True).sqrt().clamp_min(floor)
    return (math.sqrt(min(w.shape[-2:])) / norm).to(fast_stages.stage_dtype(o.dtype))


def _normuon_other(o, variance, *, beta2, eps=1e-8, eps_mode="add", dim="row", gain=None, bug=None):
    """NorMuon as a user writes it: the whole matrix formed in float64 (times ``gain``, Muon+'s
    factor), statistics with an explicit EMA, the division as a product with the reciprocal, the
    norm restored with a ratio of sums of squares of the matrices, returned as the factor the
    input is multiplied by. ``bug`` plants one mistake (see the tests)."""
    g = 1.0 if gain is None else gain.to(torch.float64)
    w = o.to(torch.float64) * g
    rows = fast_stages.normuon_side(w.shape[-2], w.shape[-1], dim) == "row"
    if bug == "wrong_dim":
        rows = not rows
    red = -1 if rows else -2
    ms = (w * w).sum(dim=red, keepdim=True) / w.shape[red]
    b2 = beta2 if bug != "beta2" else 1.0 - (1.0 - beta2) * 1.5
    v = b2 * variance.to(torch.float64).reshape(ms.shape) + (1.0 - b2) * ms
    variance.copy_(v.reshape(variance.shape))
    d = v.sqrt() + eps if eps_mode == "add" else v.clamp_min(eps).sqrt()
    y = w * d.reciprocal()
    if bug == "no_renormalization":
        return (g * d.reciprocal()).to(fast_stages.stage_dtype(o.dtype))
    ratio = ((w * w).sum(dim=(-2, -1), keepdim=True) / (y * y).sum(dim=(-2, -1), keepdim=True)).sqrt()
    return (g * d.reciprocal() * ratio).to(fast_stages.stage_dtype(o.dtype))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_stages_written_differently_pass(monkeypatch, case, dtype):
    monkeypatch.setattr(fast_stages, "equilibrate", _equilibrate_other)
    monkeypatch.setattr(fast_stages, "renormalize_factor", _renormalize_other)
    monkeypatch.setattr(fast_stages, "normuon_factor", _normuon_other)
    for config in stage_checks.STAGE_CONFIGS:
        rows = _rows(case, config, dtype)
        assert rows and all(r.passed for r in rows), [(r.detail, r.error / r.tolerance) for r in rows if not r.passed]


# ---------------------------------------------------------------------------------------
# planted bugs
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_missing_renormalization_caught(monkeypatch, dtype):
    monkeypatch.setattr(fast_stages, "renormalize_factor", lambda o, floor=fast_stages.NORM_FLOOR:
                        o.new_ones((*o.shape[:-2], 1, 1), dtype=fast_stages.stage_dtype(o.dtype)))
    assert all(_caught(_rows(case, "Muon+", dtype)) for case in CASES)


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_missing_equilibration_and_wrong_side_caught(monkeypatch, dtype):
    monkeypatch.setattr(fast_stages, "equilibrate", lambda x, side="row", floor=fast_stages.NORM_FLOOR:
                        x.to(fast_stages.stage_dtype(x.dtype)))
    assert all(_caught(_rows(case, "MuonEq", dtype)) for case in CASES)
    monkeypatch.setattr(fast_stages, "equilibrate", lambda x, side="row", floor=fast_stages.NORM_FLOOR:
                        _REAL["equilibrate"](x, "column" if side == "row" else "row", floor=floor))
    assert all(_caught(_rows(case, "MuonEq", dtype)) for case in CASES)


@pytest.mark.parametrize("bug", ["no_renormalization", "beta2"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_normuon_bugs_caught(monkeypatch, bug, dtype):
    """NorMuon without the norm restored, or an EMA weight 1.5·(1 − β₂) (β₂ 0.95 read as 0.925)."""
    monkeypatch.setattr(fast_stages, "normuon_factor", lambda *a, **k: _normuon_other(*a, **k, bug=bug))
    for config in ("microsoft/dion NorMuon", "nanochat"):
        rows = [r for case in CASES for r in _rows(case, config, dtype)]
        assert _caught(rows), config


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_wrong_reduction_dimension_caught(monkeypatch, dtype):
    """Per column where the declared statistic is per row (square case: the state has the same size)."""
    monkeypatch.setattr(fast_stages, "normuon_factor", lambda *a, **k: _normuon_other(*a, **k, bug="wrong_dim"))
    assert _caught(_rows(CASES[2], "microsoft/dion NorMuon", dtype))


@pytest.mark.parametrize("stage", ["renormalize", "normuon"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_bug_just_beyond_the_tolerance_caught_and_just_below_passes(monkeypatch, stage, dtype):
    """The final update scaled by 1 + η with η sized from the check's own weight tolerance: twice
    the tolerance fails, half of it passes (so the tolerance is the sharp line the derivation draws,
    not a bound many times wider than what it guards)."""
    case, config = CASES[0], {"renormalize": "Muon+", "normuon": "microsoft/dion NorMuon"}[stage]
    row = _weight_row(_rows(case, config, dtype))
    opts = stage_checks.STAGE_CONFIGS[config]
    run = stage_checks.StageRun(case, opts, dtype)
    ref = stage_checks.stage_reference(run, opts, 0.95)
    step = opts["lr"] * ref.lr_scale * float(np.linalg.norm(ref.update))
    name = "renormalize_factor" if stage == "renormalize" else "normuon_factor"
    for factor, caught in ((2.0, True), (0.5, False)):
        eta = factor * row.tolerance / step
        real = _REAL[name]
        monkeypatch.setattr(fast_stages, name, lambda *a, real=real, eta=eta, **k: real(*a, **k) * (1.0 + eta))
        planted = _weight_row(_rows(case, config, dtype))
        assert (not planted.passed) == caught, (factor, planted.error / planted.tolerance)


@pytest.mark.parametrize("stage", ["renormalize", "normuon"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_stage_map_bug_just_beyond_its_tolerance(monkeypatch, stage, dtype):
    """The stages given the same inputs (the claim that holds in bfloat16): an output scaled by
    1 + η, η twice the row's tolerance relative to the output's norm, fails; half of it passes."""
    case, config = CASES[0], {"renormalize": "Muon+", "normuon": "microsoft/dion NorMuon"}[stage]
    detail = f"{config}/{dtype} post-orthogonalization stages"
    row = next(r for r in _rows(case, config, dtype) if r.detail == detail)
    opts = stage_checks.STAGE_CONFIGS[config]
    ref = stage_checks.stage_reference(stage_checks.StageRun(case, opts, dtype), opts, 0.95)
    name = "renormalize_factor" if stage == "renormalize" else "normuon_factor"
    for factor, caught in ((2.0, True), (0.5, False)):
        eta = factor * row.tolerance / float(np.linalg.norm(ref.update))
        real = _REAL[name]
        monkeypatch.setattr(fast_stages, name, lambda *a, real=real, eta=eta, **k: real(*a, **k) * (1.0 + eta))
        planted = next(r for r in _rows(case, config, dtype) if r.detail == detail)
        assert (not planted.passed) == caught, (factor, planted.error / planted.tolerance)


def test_stage_jobs_cover_every_config_and_dtype():
    jobs = stage_checks.stage_jobs(CASES[:1])
    assert len(jobs) == len(stage_checks.STAGE_CONFIGS) * len(stage_checks.STAGE_DTYPES)


def test_sharding_page_names_the_normuon_stage_options():
    """docs/layouts.md's template spells the normuon-stages options out (the page's text is filled
    with the Dion and Muon options only): they must be the registry's."""
    from importlib import resources

    from ortho_verify.sharding import MUON_OPTIONS, layouts, markdown

    extra = ", ".join(f"{k}={v}" for k, v in layouts.NORMUON_OPTIONS.items() if k not in MUON_OPTIONS)
    text = resources.files("ortho_verify.sharding").joinpath(markdown.TEMPLATE).read_text(encoding="utf-8")
    assert f"`{extra}`" in text.replace("\n", " ")
