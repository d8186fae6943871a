"""Diagnoses: each failing check names the likely cause; a kernel that
never returns fails its example after the timeout instead of hanging."""

import functools
import threading

import numpy as np
import pytest
import torch

from ortho_verify import MuonConventions, check_optimizer, check_orthogonalizer
from ortho_verify.api import call_with_timeout
from ortho_verify.checks.diagnoses import momentum_cause, scale_cause
from ortho_verify.planted.bugs import JORDAN, SimpleMuon, newton_schulz_kernel
from ortho_verify.strategies import build_example

FLOAT32_MUON = MuonConventions(ns_dtype=torch.float32)
CASES = [build_example("geometric", {"log_cond": 1.0}, shape=(12, 8), dtype="float32")]


def _causes(report):
    return {f.result.cause for f in report.failures}


def test_wrong_sign_of_b_is_a_divergence():
    bad = functools.partial(newton_schulz_kernel, coefficients=((3.4445, 4.7750, 2.0315),) * 5)
    report = check_orthogonalizer(bad, dtype=torch.float32)
    causes = _causes(report)
    assert report.status == "failed" and len(causes) == 1 and "diverged" in causes.pop()


def test_a_map_that_goes_negative_says_the_update_ascends():
    bad = functools.partial(newton_schulz_kernel, coefficients=JORDAN[:4] + ((1.5, -2.0, 0.0),))
    report = check_orthogonalizer(bad, dtype=torch.float32, examples=CASES)
    assert any("map negative on sigma_hat in [" in c and "ascends" in c for c in _causes(report)), report.summary()
    assert all(f.result.note.startswith("cause: ") for f in report.failures)  # the summary shows it


def test_dropped_nesterov_is_named_as_such():
    report = check_optimizer(functools.partial(SimpleMuon, nesterov=False), FLOAT32_MUON)
    assert all(r.passed for r in report.results if r.check == "muon_momentum")  # the symptom is in the update
    assert any("Nesterov term dropped" in c for c in _causes(report)), report.summary()


def test_in_place_normalized_momentum_is_named():
    report = check_optimizer(functools.partial(SimpleMuon, normalize_buffer_in_place=True), FLOAT32_MUON)
    rows = [f.result for f in report.failures if f.result.check == "muon_momentum"]
    assert rows and all("normalized in place" in r.cause for r in rows)


def test_wrong_lr_scale_names_the_modes():
    report = check_optimizer(functools.partial(SimpleMuon, adjust_lr="spectral_norm"), FLOAT32_MUON)
    assert any("constant factor" in c and "spectral_norm where original is declared" in c for c in _causes(report)), \
        report.summary()


def test_cause_helpers_on_planted_arrays():
    rng = np.random.default_rng(0)
    ref, g, m = (rng.standard_normal((6, 4)) for _ in range(3))
    assert "s = 0.5" in scale_cause(0.5 * ref, ref, 1e-9) and scale_cause(ref, ref, 1e-9) == ""
    assert "no ratio of known lr scales" in scale_cause(0.37 * ref, ref, 1e-9, (6, 4))
    assert "classic" in momentum_cause(0.9 * m + g, g, m, mu=0.9, declared="ema", tolerance=1e-9)
    assert "every known" in momentum_cause(m + 3 * g, g, m, mu=0.9, declared="ema", tolerance=1e-9)


def test_a_kernel_that_never_returns_fails_after_the_timeout():
    release = threading.Event()

    def hangs(g):
        release.wait(30)  # ends when the test releases it
        return g

    try:
        report = check_orthogonalizer(hangs, dtype=torch.float32, examples=CASES, timeout_s=0.2)
    finally:
        release.set()
    [row] = report.results
    assert row.check == "orthogonalizer_runs" and not row.passed and "did not return within 0.2 s" in row.note
    assert call_with_timeout(lambda x: x + 1, 1, None) == ("ok", 2)
    with pytest.raises(ValueError, match="timeout_s"):
        call_with_timeout(abs, 1, 0)
