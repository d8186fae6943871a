"""``identify_orthogonalizer``: correct kernels written differently are identified with the right
declaration and pass; every planted kernel ends in a verdict that is not PASSED, its cause naming the
field or the row; a callable that is not a kernel gets a ValueError naming the probe."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_fast
import ortho_ref
from ortho_verify import identify_orthogonalizer
from ortho_verify.identify.kernel import DECLARABLE
from ortho_verify.identify.known import known_normalization
from ortho_verify.planted.bugs import JORDAN, PLANTED_BUGS, gram_newton_schulz_kernel, newton_schulz_kernel
from tests.strategies import profile_examples

KERNEL_BUGS = [b for b in PLANTED_BUGS if b.kind == "orthogonalizer"]
#: Planted kernels checked in the default run (the rest under -m slow): none — the default run names the fields
#: without the judge (``test_planted_fields_are_named``, ``test_a_correct_kernel_with_a_pinned_wrong_precision_fails``).
QUICK_BUGS = ()


def keller_style(g: torch.Tensor) -> torch.Tensor:
    """Newton–Schulz written as in Keller Jordan's Muon post: bfloat16 throughout, X / (‖X‖_F + 1e-7),
    the short side first via .mT, B = bA + cA², X ← aX + BX; returns bfloat16."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    x = g.bfloat16()
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(5):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if tall else x


def _field(found, name):
    return next(e for e in found.evidence if e.field == name)


def test_keller_style_bfloat16_kernel_is_identified_and_passes():
    found = identify_orthogonalizer(keller_style)
    d = found.declaration
    assert (d["coefficients"], d["safety"], d["eps"], d["eps_mode"]) == ("jordan", 1.0, 1e-7, "add")
    assert d["dtype"] == torch.float32 and d["compute_dtype"] == torch.bfloat16
    assert found.passed, found.summary()


def test_clamp_eps_float32_kernel_is_identified():
    kernel = functools.partial(ortho_fast.newton_schulz, eps_mode="clamp", dtype=torch.float32)
    found = identify_orthogonalizer(kernel, judge=False)
    assert found.declaration["eps_mode"] == "clamp" and "compute_dtype" not in found.declaration
    assert _field(found, "eps_mode").margin > 10  # "add" is far off on the tiny probes
    assert found.fits and not found.differences, found.summary()


def test_gram_float16_kernel_is_identified_as_gram():
    kernel = functools.partial(gram_newton_schulz_kernel, coefficients=JORDAN, restarts=(2,))
    found = identify_orthogonalizer(kernel)
    assert found.declaration["form"] == "gram" and found.declaration["compute_dtype"] == torch.float16
    assert found.passed, found.summary()


@pytest.mark.parametrize("name", ["jordan"] + [
    pytest.param(n, marks=pytest.mark.slow) for n in sorted(ortho_ref.SCHEDULES) if n != "jordan"])
def test_ortho_fast_newton_schulz_with_each_registered_schedule(name):
    sched = ortho_ref.SCHEDULES[name]
    kernel = functools.partial(ortho_fast.newton_schulz, coefficients=name, safety=sched.safety, eps=sched.eps,
                               dtype=torch.float32)
    found = identify_orthogonalizer(kernel, judge=False)
    d = found.declaration
    assert (d["coefficients"], d["safety"], d["eps"]) == (name, sched.safety, sched.eps) and "steps" not in d
    assert found.fits and not found.differences, found.summary()


@pytest.mark.parametrize("bug", [pytest.param(b, id=b.name, marks=() if b.name in QUICK_BUGS else pytest.mark.slow)
                                 for b in KERNEL_BUGS])
def test_every_planted_kernel_fails_from_identification_alone(bug):
    """The bug's check declares only the precision (``dtype``, default float32, and its ``check_kwargs``):
    every other field is identified, and the verdict is not PASSED, with a cause naming the field or row."""
    found = identify_orthogonalizer(bug.make(), **{"dtype": torch.float32, **bug.check_kwargs})
    assert not found.passed
    assert found.differences or (found.report is not None and found.report.cause), found.summary()


def test_planted_fields_are_named():
    wrong_c = identify_orthogonalizer(KERNEL_BUGS[0].make(), judge=False)
    assert any("c x1.005 of jordan" in d for d in wrong_c.differences), wrong_c.differences
    four = identify_orthogonalizer(functools.partial(newton_schulz_kernel, coefficients=JORDAN[:4]), judge=False)
    assert any("4 steps of jordan" in d for d in four.differences), four.differences
    tall = identify_orthogonalizer(functools.partial(newton_schulz_kernel, transpose_back=False), judge=False)
    assert any(d.startswith("tall (m > n) inputs fail") for d in tall.differences), tall.differences


def test_a_correct_kernel_with_a_pinned_wrong_precision_fails():
    found = identify_orthogonalizer(functools.partial(newton_schulz_kernel, dtype=torch.bfloat16), judge=False,
                                    dtype=torch.float32)
    assert any("declared float32, measured bfloat16" in d for d in found.differences)


@pytest.mark.parametrize("fn, what", [
    (lambda x: "not a tensor", "returned str"),
    (lambda x: x[..., :1], "shape (24, 1)"),
    (lambda x: 1 / 0, "raised ZeroDivisionError"),
])
def test_not_a_kernel_gets_a_value_error_naming_the_probe(fn, what):
    with pytest.raises(ValueError, match="probed with a float32 tensor of shape \\(24, 40\\)") as err:
        identify_orthogonalizer(fn)
    assert what in str(err.value)


def test_bad_arguments():
    with pytest.raises(TypeError, match="fn: expected a callable"):
        identify_orthogonalizer(None)
    with pytest.raises(ValueError, match="declared: unknown \\['coefficient'\\]"):
        identify_orthogonalizer(newton_schulz_kernel, coefficient="jordan")
    assert "coefficients" in DECLARABLE


@settings(deadline=None, derandomize=True, **profile_examples(15))
@given(safety=st.sampled_from([1.0, 1.01, 1.02, 1.05]), eps=st.sampled_from([1e-8, 1e-7, 1e-6, 1e-5]),
       eps_mode=st.sampled_from(["add", "clamp"]), name=st.sampled_from(["jordan", "polar_express", "cesista5"]))
def test_normalization_is_recovered_in_float32(safety, eps, eps_mode, name):
    """Any safety / eps / eps mode on a registered schedule is recovered exactly; one not in use with the
    schedule is a difference (never a pass from identification alone)."""
    kernel = functools.partial(ortho_fast.newton_schulz, coefficients=name, safety=safety, eps=eps,
                               eps_mode=eps_mode, dtype=torch.float32)
    found = identify_orthogonalizer(kernel, judge=False)
    d = found.declaration
    assert (d["coefficients"], d["safety"], d["eps"], d["eps_mode"]) == (name, safety, eps, eps_mode), found.summary()
    known = known_normalization(name, safety, eps, eps_mode)
    assert bool(known) == (not found.differences), found.differences
