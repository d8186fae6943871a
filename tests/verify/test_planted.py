"""verify.check_orthogonalizer / check_optimizer: every planted bug is caught, correct
implementations (ours, torch.optim.Muon with its settings, the compact user classes) pass."""

import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings

import ortho_fast
from verify import (DION, ORTHO_MUON, TORCH_MUON, MuonConventions, check_optimizer, check_orthogonalizer,
                    check_orthogonalizer_example)
from verify.planted import CORRECT_OPTIMIZERS, PLANTED_BUGS, newton_schulz_kernel
from verify.strategies import build_example, spectral_examples, target_worst_ratio


def _ours(dtype, coefficients="jordan"):
    sched = ortho_fast.COEFFICIENTS[coefficients]
    return functools.partial(ortho_fast.newton_schulz, coefficients=coefficients, safety=sched.safety,
                             eps=sched.eps, dtype=dtype)


@pytest.mark.parametrize("bug", PLANTED_BUGS, ids=lambda b: b.name)
def test_every_planted_bug_is_caught(bug):
    if bug.kind == "orthogonalizer":
        report = check_orthogonalizer(bug.make(), coefficients="jordan", dtype=torch.float32)
    else:
        report = check_optimizer(bug.make(), bug.conventions)
    assert not report.passed, f"{bug.name} not caught"
    failure = report.failures[0]
    assert failure.inputs and failure.provenance  # the reproducing input comes with the failure
    assert failure.result.ratio > 1 and bug.name in [b.name for b in PLANTED_BUGS]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("coefficients", ["jordan", "polar_express"])
def test_our_newton_schulz_passes(dtype, coefficients):
    report = check_orthogonalizer(_ours(dtype, coefficients), coefficients=coefficients, dtype=dtype)
    assert report.passed, report.summary()
    assert len(report.results) > 40 and 0 < report.worst_ratio <= 1


def test_correct_user_kernels_pass():
    for fn in (newton_schulz_kernel, functools.partial(newton_schulz_kernel, shards=4)):
        report = check_orthogonalizer(fn, coefficients="jordan", dtype=torch.float32)
        assert report.passed, report.summary()


@pytest.mark.parametrize("optimizer, conventions", [
    (torch.optim.Muon, None),  # torch's own settings: EMA, Nesterov, jordan, bf16, eps clamped, "original"
    (torch.optim.Muon, TORCH_MUON),
    (ortho_fast.Muon, ORTHO_MUON),
    (functools.partial(ortho_fast.Muon, momentum_style="classic", nesterov=False, coefficients="polar_express",
                       adjust_lr="spectral_norm", dtype=torch.float32),
     MuonConventions(momentum_style="classic", nesterov=False, coefficients="polar_express", adjust_lr="spectral_norm",
                     ns_dtype=torch.float32)),
    (ortho_fast.Dion, DION),
    *CORRECT_OPTIMIZERS.values(),
], ids=["torch.optim.Muon", "torch.optim.Muon+TORCH_MUON", "ortho_fast.Muon", "ortho_fast.Muon(dion options)",
        "ortho_fast.Dion", *CORRECT_OPTIMIZERS])
def test_correct_optimizers_pass(optimizer, conventions):
    report = check_optimizer(optimizer, conventions)
    assert report.passed, report.summary()
    assert len(report.results) >= 6


def test_wrong_declared_conventions_fail():
    # torch.optim.Muon is EMA momentum: declaring microsoft/dion's classic momentum must fail
    report = check_optimizer(torch.optim.Muon, MuonConventions(momentum_style="classic", eps_mode="clamp"))
    assert not report.passed
    assert any(f.result.check == "muon_momentum" for f in report.failures)


def test_failures_reproduce():
    buggy = functools.partial(newton_schulz_kernel, coefficients=((3.4445, -4.7750, 2.0315),) * 4)
    report = check_orthogonalizer(buggy, coefficients="jordan", dtype=torch.float32)
    failure = report.failures[0]
    example = eval(failure.provenance, {"verify": __import__("verify.strategies")})
    again = check_orthogonalizer(buggy, coefficients="jordan", dtype=torch.float32, examples=[example])
    assert not again.passed
    assert any(np.array_equal(case.matrix, failure.inputs["input"]) for case in example.cases())


def test_crashes_in_place_changes_and_wrong_shapes_are_reported():
    def crash(g):
        raise RuntimeError("kernel exploded")

    def in_place(g):
        return g.mul_(0.0)

    cases = [build_example("geometric", {"log_cond": 1.0}, shape=(6, 4), dtype="float32")]
    for fn, check in ((crash, "orthogonalizer_runs"), (in_place, "input_unchanged"), (lambda g: g.mT, "output_shape")):
        report = check_orthogonalizer(fn, examples=cases)
        assert not report.passed and report.failures[0].result.check == check


def test_bad_arguments_raise_before_running():
    calls = []
    with pytest.raises(TypeError, match="dtype"):
        check_orthogonalizer(calls.append, dtype=torch.int32)
    with pytest.raises(ValueError, match="coefficients"):
        check_orthogonalizer(calls.append, coefficients="nonesuch")
    with pytest.raises(ValueError, match="coefficients"):
        check_orthogonalizer(calls.append, coefficients=[[1.0, 2.0]])
    with pytest.raises(ValueError, match="examples"):
        check_orthogonalizer(calls.append, examples=[])
    with pytest.raises(TypeError, match="conventions"):
        check_optimizer(torch.optim.SGD)
    with pytest.raises(ValueError, match="steps"):
        check_optimizer(ortho_fast.Dion, steps=1)
    with pytest.raises(ValueError, match="lr"):
        check_optimizer(ortho_fast.Muon, lr=0.0)
    assert calls == []


def test_report_summary_and_save(tmp_path):
    report = check_orthogonalizer(PLANTED_BUGS[1].make(), coefficients="jordan", dtype=torch.float32)
    text = report.summary(max_rows=2)
    assert "FAILED" in text and "reproduce: verify.strategies.build_example(" in text and "more" in text
    with pytest.raises(AssertionError, match="FAILED"):
        report.assert_passed()
    out = report.save(tmp_path / "r")
    assert (out / "report.md").is_file() and (out / "failures.npz").is_file()
    with np.load(out / "failures.npz") as z:
        assert len(z.files) == len({f.result.input for f in report.failures})


@settings(deadline=None)
@given(spectral_examples(dtypes=("float32", "bfloat16"), max_dim=16, max_batch=2))
def test_our_newton_schulz_on_drawn_spectra(example):
    results = check_orthogonalizer_example(_ours(getattr(torch, example.dtype)), example, coefficients="jordan")
    target_worst_ratio(results)
    assert all(r.passed for r in results), [r for r in results if not r.passed]
