"""Defaults that exercise the kernel's own dtype:
``check_orthogonalizer`` feeds inputs in the declared compute dtype, ``check_optimizer`` runs
float32 and bfloat16 parameters by default, and the gradient and the state are checked for
writes the algorithm does not make."""

from __future__ import annotations

import functools

import pytest
import torch

import ortho_fast
from ortho_verify import check_optimizer, check_orthogonalizer, default_examples
from ortho_verify.checks.optimizer_checks import DEFAULT_PARAM_DTYPES
from ortho_verify.planted.bugs import CORRECT_OPTIMIZERS, SimpleMuon, newton_schulz_kernel


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
def test_inputs_in_the_kernels_dtype(dtype):
    seen = set()

    def kernel(g):
        seen.add(g.dtype)
        return ortho_fast.newton_schulz(g, "jordan", dtype=dtype)

    assert all(ex.tensor().dtype == dtype for ex in default_examples(dtype))
    report = check_orthogonalizer(kernel, dtype=dtype)
    assert seen == {dtype}
    assert report.passed, report.summary()


def test_bf16_kernel_working_in_place_on_its_input_is_caught():
    """A bfloat16 kernel that normalizes its input in place when it already has the compute
    dtype: invisible with float32 inputs (the cast made a copy), caught by ``input_unchanged``."""
    def kernel(g):
        x = g.to(torch.bfloat16)  # no copy when g is bfloat16
        x.div_(torch.linalg.vector_norm(x.float()).to(x.dtype) + 1e-7)
        return newton_schulz_kernel(x, dtype=torch.bfloat16)

    report = check_orthogonalizer(kernel, dtype=torch.bfloat16)
    assert not report.passed
    assert any(r.check == "input_unchanged" and not r.passed for r in report.results)


def test_check_optimizer_runs_float32_and_bfloat16_by_default():
    assert DEFAULT_PARAM_DTYPES == (torch.float32, torch.bfloat16)
    cls, conventions = CORRECT_OPTIMIZERS["SimpleMuon"]
    report = check_optimizer(cls, conventions, steps=1, shapes=((9, 6),))
    assert report.passed, report.summary()
    per_step = {r.input for r in report.results if r.check != "optimizer_mean_deviation"}  # + statistical
    assert per_step - {"decay probe 48x12 step 1", "decay probe 48x12 bfloat16 step 1"} == {"9x6 step 1",
                                                                                            "9x6 bfloat16 step 1"}
    single = check_optimizer(cls, conventions, steps=1, shapes=((9, 6),), param_dtype=torch.bfloat16)
    assert {r.input for r in single.results if r.check != "optimizer_mean_deviation"} == {"9x6 step 1",
                                                                                          "decay probe 48x12 step 1"}


@pytest.mark.parametrize("optimizer", [ortho_fast.Muon, ortho_fast.Dion, torch.optim.Muon],
                         ids=lambda o: o.__module__ + "." + o.__name__)
def test_correct_optimizers_pass_both_dtypes(optimizer):
    report = check_optimizer(optimizer)
    assert report.passed, report.summary()
    assert any(r.input.endswith("bfloat16 step 2") for r in report.results)


def test_momentum_normalized_in_place_is_caught_in_bfloat16_alone():
    """The issue's bug: the buffer normalized in place only for bfloat16 parameters; caught by the
    default dtypes, missed by a float32-only run."""
    class Bf16Normalizing(SimpleMuon):
        @torch.no_grad()
        def step(self, closure=None):
            self.normalize_buffer_in_place = any(p.dtype == torch.bfloat16 for g in self.param_groups
                                                 for p in g["params"])
            return super().step(closure)

    _, conventions = CORRECT_OPTIMIZERS["SimpleMuon"]
    assert check_optimizer(Bf16Normalizing, conventions, param_dtype=torch.float32).passed
    report = check_optimizer(Bf16Normalizing, conventions)
    failing = {(r.check, r.input.split()[1]) for r in report.results if not r.passed}
    assert ("muon_momentum", "bfloat16") in failing
    assert all(dt == "bfloat16" for _, dt in failing)


def test_gradient_written_in_place_is_caught():
    _, conventions = CORRECT_OPTIMIZERS["SimpleMuon"]
    report = check_optimizer(functools.partial(SimpleMuon, nesterov_in_place=True), conventions, steps=1)
    failing = {r.check for r in report.results if not r.passed}
    assert failing == {"gradient_unchanged"}
    assert "modified the gradient in place" in next(r.cause for r in report.results if not r.passed)


def test_state_aliasing_the_gradient_is_caught():
    class Aliasing(SimpleMuon):
        @torch.no_grad()
        def step(self, closure=None):
            super().step(closure)
            for group in self.param_groups:
                for p in group["params"]:
                    self.state[p]["last_grad"] = p.grad  # a reference, not a copy

    _, conventions = CORRECT_OPTIMIZERS["SimpleMuon"]
    report = check_optimizer(Aliasing, conventions, steps=1, shapes=((9, 6),))
    [row] = [r for r in report.results if r.check == "state_not_aliased" and r.input == "9x6 step 1"]
    assert not row.passed and "last_grad" in row.note
