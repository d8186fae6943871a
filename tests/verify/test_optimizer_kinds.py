"""Kinds of failure: "wrong math", "side effect" and "unsupported" counted apart in
check_optimizer / check_orthogonalizer reports, exceptions from the user's code as rows naming its
frame, side effects accepted explicitly, and ``device=``."""

import functools

import pytest
import torch

from ortho_verify import check_optimizer, check_orthogonalizer
from ortho_verify.planted.muon import (
    JORDAN_CONVENTIONS,
    TORCH_STYLE_CONVENTIONS,
    JordanStyleMuon,
    TorchStyleMuon,
    inplace_kernel,
    planted,
)
from ortho_verify.report.results import FAILURE_KINDS, CheckResult, failure_kind, verdict_text

FAST = dict(steps=2, statistical_matrices=0, shapes=((12, 8), (8, 12)))


def test_jordan_style_grad_overwrite_is_a_side_effect_only():
    report = check_optimizer(functools.partial(JordanStyleMuon, grad_in_place=True), JORDAN_CONVENTIONS,
                             param_dtype=torch.float32, **FAST)
    assert report.status == "failed"
    assert report.kinds["side effect"] > 0 and report.kinds["wrong math"] == 0 and report.kinds["unsupported"] == 0
    assert report.verdict_text.startswith("failed: side effect")
    assert {f.result.check for f in report.failures} == {"gradient_unchanged"}
    assert "side effect" in report.summary().splitlines()[0]


def test_accepted_side_effect_passes_and_says_so():
    report = check_optimizer(functools.partial(JordanStyleMuon, grad_in_place=True), JORDAN_CONVENTIONS,
                             param_dtype=torch.float32, allow_side_effects={"grad_mutated"}, **FAST)
    assert report.status == "passed", report.summary()
    accepted = [r for r in report.results if r.check == "gradient_unchanged"]
    assert accepted and all(r.extra.get("accepted_side_effect") == "grad_mutated" for r in accepted)
    assert any(r.note.startswith("accepted") for r in accepted)
    # the correct optimizer with nothing to accept also passes: the option accepts, it does not require
    assert check_optimizer(JordanStyleMuon, JORDAN_CONVENTIONS, param_dtype=torch.float32,
                           allow_side_effects={"grad_mutated"}, **FAST).passed


def test_unknown_side_effect_name_is_rejected():
    with pytest.raises(ValueError, match="allow_side_effects"):
        check_optimizer(JordanStyleMuon, JORDAN_CONVENTIONS, allow_side_effects={"grads"}, **FAST)


def _reject(p):
    if p.dtype == torch.bfloat16:
        raise TypeError(f"this Muon takes float32 parameters, got {p.dtype}")


class _RejectsBf16(TorchStyleMuon):
    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                _reject(p)
        return super().step(closure)


def test_exception_from_the_optimizer_is_an_unsupported_row_naming_the_users_frame():
    report = check_optimizer(_RejectsBf16, TORCH_STYLE_CONVENTIONS, **FAST)  # float32 and bfloat16
    assert report.status == "failed"
    assert report.kinds == {"wrong math": 0, "side effect": 0, "unsupported": 1, "recompile limit": 0}
    [row] = [f.result for f in report.failures]
    assert row.check == "optimizer_runs" and "bfloat16" in row.detail and "TypeError" in row.note
    assert __file__ in row.note and "_reject" in row.note  # the raising frame, in this file
    assert row.extra["frame"].startswith(__file__)
    # the float32 run was still judged
    assert any(r.check.startswith("muon_update") and r.passed and r.claimed for r in report.results)


def test_exception_in_the_constructor_is_a_row_too():
    def factory(params, **kwargs):
        raise ValueError("no such option")

    report = check_optimizer(factory, TORCH_STYLE_CONVENTIONS, param_dtype=torch.float32, **FAST)
    assert report.status == "failed" and report.kinds["unsupported"] == 1
    assert "factory" in report.failures[0].result.note


def test_wrong_coefficient_is_wrong_math():
    factory, conv = planted("coefficient b off by 1%")
    report = check_optimizer(factory, TORCH_STYLE_CONVENTIONS, param_dtype=torch.float32, **FAST)
    assert report.status == "failed"
    assert report.kinds["wrong math"] > 0 and report.kinds["side effect"] == 0 and report.kinds["unsupported"] == 0


def test_kernel_dividing_its_bf16_input_in_place_is_a_side_effect():
    report = check_orthogonalizer(inplace_kernel, dtype=torch.bfloat16, statistical=False, eps_mode="clamp")
    assert report.status == "failed"
    assert report.kinds["side effect"] > 0 and report.kinds["unsupported"] == 0 and report.kinds["wrong math"] == 0
    assert all(failure_kind(f.result) == "side effect" for f in report.failures
               if f.result.check == "input_unchanged")


def test_kinds_are_derived_from_the_check_and_counted_apart():
    rows = [CheckResult("input_unchanged", "a", "", 1.0, 0.0, False),
            CheckResult("orthogonalizer_runs", "a", "", float("inf"), 0.0, False),
            CheckResult("ns_vs_ns_map", "a", "", 2.0, 1.0, False),
            CheckResult("ns_vs_ns_map", "b", "", 0.5, 1.0, True)]
    assert set(FAILURE_KINDS) == {"wrong math", "side effect", "unsupported", "recompile limit"}
    assert failure_kind(rows[0]) == "side effect" and failure_kind(rows[1]) == "unsupported"
    assert failure_kind(rows[2]) == "wrong math"
    assert verdict_text(rows) == "failed: wrong math (1 row), side effect (1 row), unsupported (1 row)"
    assert verdict_text(rows[3:]) == "passed"


def test_device_cpu_and_a_clear_error_for_missing_cuda():
    report = check_optimizer(TorchStyleMuon, TORCH_STYLE_CONVENTIONS, param_dtype=torch.float32, device="cpu", **FAST)
    assert report.passed, report.summary()
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device"):
            check_optimizer(TorchStyleMuon, TORCH_STYLE_CONVENTIONS, device="cuda", **FAST)


def test_kernel_raising_on_bf16_is_unsupported_with_its_frame():
    def only_float32(g):
        if g.dtype == torch.bfloat16:
            raise TypeError("expected float32")
        return g

    report = check_orthogonalizer(only_float32, dtype=torch.bfloat16, statistical=False)
    assert report.status == "failed" and report.kinds["unsupported"] > 0
    runs = [f.result for f in report.failures if f.result.check == "orthogonalizer_runs"]
    assert runs and all(__file__ in r.note and "only_float32" in r.note for r in runs)


def test_kernel_side_effect_can_be_accepted():
    report = check_orthogonalizer(inplace_kernel, dtype=torch.bfloat16, statistical=False, eps_mode="clamp",
                                  allow_side_effects={"input_mutated"})
    assert report.status == "passed", report.summary()  # the output is right: only the side effect was wrong
    assert any(r.extra.get("accepted_side_effect") == "input_mutated" and r.note.startswith("accepted")
               for r in report.results)
