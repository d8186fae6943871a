"""ortho_verify.check_orthogonalizer / check_optimizer: every planted bug is caught, correct
implementations (ours, torch.optim.Muon with its settings, the compact user classes) pass."""

import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings

import ortho_fast
from ortho_verify import (
    DION,
    ORTHO_MUON,
    TORCH_MUON,
    MuonConventions,
    check_optimizer,
    check_orthogonalizer,
    check_orthogonalizer_example,
)
from ortho_verify.planted.bugs import CORRECT_OPTIMIZERS, PLANTED_BUGS, newton_schulz_kernel
from ortho_verify.strategies import build_example, spectral_examples, target_worst_ratio


def _ours(dtype, coefficients="jordan"):
    sched = ortho_fast.COEFFICIENTS[coefficients]
    return functools.partial(ortho_fast.newton_schulz, coefficients=coefficients, safety=sched.safety,
                             eps=sched.eps, dtype=dtype)


@pytest.mark.parametrize("bug", PLANTED_BUGS, ids=lambda b: b.name)
def test_every_planted_bug_is_caught(bug):
    if bug.kind == "orthogonalizer":
        report = check_orthogonalizer(bug.make(), coefficients="jordan", **{"dtype": torch.float32, **bug.check_kwargs})
    else:
        report = check_optimizer(bug.make(), bug.conventions, **bug.check_kwargs)
    assert report.status == "failed", f"{bug.name} not caught"
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


@pytest.mark.parametrize("optimizer, conventions", [
    (ortho_fast.Dion, DION), CORRECT_OPTIMIZERS["SimpleDion"],
    (functools.partial(ortho_fast.Dion, momentum_dtype=torch.float32, q_dtype=torch.float32), DION),
], ids=["ortho_fast.Dion", "SimpleDion", "ortho_fast.Dion(float32 state)"])
def test_correct_bf16_dion_passes_on_evidence(optimizer, conventions):
    report = check_optimizer(optimizer, conventions, param_dtype=torch.bfloat16)
    assert report.passed, report.summary()
    assert all(r.claimed for r in report.results)  # every row counted is a comparison that was made
    by_check = {check: [r for r in report.results if r.check == check]
                for check in ("dion_vs_reference", "dion_update_structure", "dion_momentum_split")}
    assert len(by_check["dion_update_structure"]) == len(by_check["dion_momentum_split"]) == 6  # 3 shapes x 2 steps
    if by_check["dion_vs_reference"]:  # float32 state: P determined by B, the reference comparison is made
        assert len(by_check["dion_vs_reference"]) == 18
    else:  # bfloat16 state: the invariants are the evidence, and say why
        assert all("reference not compared: ill-posed" in r.note for r in by_check["dion_momentum_split"])


def test_wrong_declared_conventions_fail():
    # torch.optim.Muon is EMA momentum: declaring microsoft/dion's classic momentum must fail
    report = check_optimizer(torch.optim.Muon, MuonConventions(momentum_style="classic", eps_mode="clamp"))
    assert not report.passed
    assert any(f.result.check == "muon_momentum" for f in report.failures)


def test_failures_reproduce():
    buggy = functools.partial(newton_schulz_kernel, coefficients=((3.4445, -4.7750, 2.0315),) * 4)
    report = check_orthogonalizer(buggy, coefficients="jordan", dtype=torch.float32)
    failure = report.failures[0]
    example = eval(failure.provenance, {"ortho_verify": __import__("ortho_verify.strategies")})
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
    with pytest.raises(TypeError, match="dtype"):  # not a ValueError from inside build_example
        check_orthogonalizer(calls.append, dtype=torch.complex64)  # (float16 is judged)
    with pytest.raises(TypeError, match="compute_dtype"):
        check_orthogonalizer(calls.append, dtype=torch.float32, compute_dtype=torch.int8)
    with pytest.raises(ValueError, match="examples"):
        check_orthogonalizer(calls.append, examples=[build_example("flat", {}, shape=(2, 3, 4))], batched=False)
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
    assert "FAILED" in text and "reproduce: ortho_verify.strategies.build_example(" in text and "more" in text
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


def test_two_dimensional_kernel_with_batched_false():
    def kernel_2d(g):  # Moonlight-style: one (m, n) matrix only
        assert g.ndim == 2, "expected a matrix"
        return newton_schulz_kernel(g)

    report = check_orthogonalizer(kernel_2d, coefficients="jordan", dtype=torch.float32)
    assert report.status == "failed"
    assert {f.result.check for f in report.failures} == {"orthogonalizer_runs"}
    assert all("raised on a batched (" in f.result.note and "batched=False" in f.result.note for f in report.failures)
    report = check_orthogonalizer(kernel_2d, coefficients="jordan", dtype=torch.float32, batched=False)
    assert report.passed, report.summary()
    assert all(len(report.inputs[r.input][0]["input"].shape) == 2 for r in report.results)


def test_zeros_fail_every_informative_bf16_row():
    report = check_orthogonalizer(lambda g: torch.zeros_like(g), coefficients="jordan", dtype=torch.bfloat16)
    rows = [r for r in report.results if r.check in ("ns_vs_ns_map", "ns_projected_singular_values", "spread_in_band")]
    assert {r.status for r in rows} == {"fail", "no claim"}
    vacuous = [r for r in rows if r.status == "no claim"]
    assert all(r.note and r.tolerance > 0 for r in vacuous)
    assert "no claim (" in report.summary(max_rows=100) and all(r.input in report.summary(max_rows=100)
                                                                for r in vacuous)
    # the same rows are claims that hold for a correct kernel: only the hopeless ones make none
    ours = check_orthogonalizer(_ours(torch.bfloat16), coefficients="jordan", dtype=torch.bfloat16)
    assert ours.passed and {(r.check, r.input) for r in ours.results if not r.claimed} == \
        {(r.check, r.input) for r in vacuous}


def test_nothing_compared_is_inconclusive_not_passed():
    tiny = [build_example("geometric", {"log_cond": 1.0}, shape=(17, 9), scale=1e-30, dtype="bfloat16")]
    report = check_orthogonalizer(_ours(torch.bfloat16), coefficients="jordan", dtype=torch.bfloat16, examples=tiny)
    assert report.status == "inconclusive" and report.inconclusive and not report.passed and not report
    assert all(not r.claimed for r in report.results if r.check != "input_unchanged")
    assert "INCONCLUSIVE" in report.summary() and "nothing compared — ns_vs_ns_map" in report.summary()
    with pytest.raises(AssertionError, match="INCONCLUSIVE"):
        report.assert_passed()
