"""float16 kernels: the per-direction rows and the statistical row ``ns_mean_deviation`` in float16
(unit roundoff 2⁻¹¹, float32 accumulation), the compute dtype declared apart from the input dtype,
and float16's range in the default inputs."""

import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_fast
import ortho_ref
from ortho_verify import check_orthogonalizer
from ortho_verify.api import FLOAT16_MIN_SCALE, check_orthogonalizer_statistics, compute_name, default_examples
from ortho_verify.checks.statistical import statistical_batch
from ortho_verify.inputs.examples import MAX_SCALE
from ortho_verify.planted.bugs import JORDAN, newton_schulz_kernel
from ortho_verify.tolerances import ns_singular_value_tolerances, per_product_roundoff

FP16 = functools.partial(newton_schulz_kernel, dtype=torch.float16)


def _perturbed_c(percent):
    return tuple((a, b, c * (1 + percent / 100)) for a, b, c in JORDAN)


def test_user_float16_kernel_passes_every_row():
    """A user's float16 kernel (planted.newton_schulz_kernel, not ortho_fast's), float16 inputs."""
    report = check_orthogonalizer(FP16, dtype=torch.float16)
    assert report.passed, report.summary()
    checks = {r.check for r in report.results}
    assert {"ns_projected_singular_values", "ns_mean_deviation"} <= checks
    assert "float16" in report.subject


def test_ortho_fast_float16_kernel_passes_with_float32_inputs():
    """ortho_fast's float16 Newton–Schulz given float32 inputs, judged with float16's model."""
    def kernel(x):
        return ortho_fast.newton_schulz(x, "jordan", dtype=torch.float16, out_dtype=torch.float32)

    report = check_orthogonalizer(kernel, dtype=torch.float32, compute_dtype=torch.float16)
    assert report.passed, report.summary()
    assert "float16 on float32 inputs" in report.subject


def test_float16_statistical_row_catches_a_coefficient_off_by_a_tenth_of_a_percent():
    """c off by 0.1%: the statistical row fails (measured 4.4x its threshold); the correct kernel passes
    on the same batch."""
    batch = statistical_batch(1.0, (40, 24), None, 256, "float16", seed=1000)
    right = check_orthogonalizer_statistics(FP16, batch, dtype=torch.float16)[0]
    wrong = check_orthogonalizer_statistics(functools.partial(FP16, coefficients=_perturbed_c(0.1)), batch,
                                            dtype=torch.float16)[0]
    assert right.passed and right.claimed, right
    assert not wrong.passed and wrong.ratio > 1.0, wrong


@pytest.mark.parametrize("compute", [torch.float16, torch.float32])
def test_bfloat16_arithmetic_declared_as_float16_fails(compute):
    """A kernel computing in bfloat16 (3 fewer bits) declared float16 fails the per-direction rows
    (measured 2.5-3.2x), with float16 or float32 inputs."""
    input_dtype = torch.float16 if compute == torch.float16 else torch.float32
    kernel = functools.partial(newton_schulz_kernel, dtype=torch.bfloat16)
    report = check_orthogonalizer(kernel, dtype=input_dtype, compute_dtype=torch.float16, statistical=False)
    assert not report.passed
    assert any(f.result.check in ("ns_vs_ns_map", "ns_projected_singular_values") for f in report.failures)


def test_float32_inputs_computing_in_bfloat16_are_judged_as_bfloat16():
    """dtype=float32, compute_dtype=bfloat16: a bf16 kernel on float32 inputs passes with bf16's model and
    fails when declared float32."""
    kernel = functools.partial(newton_schulz_kernel, dtype=torch.bfloat16)
    kernel32 = lambda x: kernel(x).float()  # noqa: E731  (float32 out, as its input)
    assert check_orthogonalizer(kernel32, dtype=torch.float32, compute_dtype=torch.bfloat16,
                                statistical=False).passed
    assert not check_orthogonalizer(kernel32, dtype=torch.float32, statistical=False).passed


def test_float16_default_inputs_stay_in_float16_range():
    examples = default_examples("float16")
    scales = [ex.scale for ex in examples]
    assert min(scales) >= 1e-5 * 0.99 and max(scales) <= MAX_SCALE["float16"]
    for ex in examples:
        t = ex.tensor()
        assert t.dtype == torch.float16 and torch.isfinite(t).all() and t.abs().amax() > 0
    # float32 inputs of a float16 kernel are clipped to float16's range too
    assert max(ex.scale for ex in default_examples("float32", compute_dtype="float16")) <= MAX_SCALE["float16"]
    assert min(ex.scale for ex in default_examples("float32", compute_dtype="float16")) >= 1e-5 * 0.99
    assert FLOAT16_MIN_SCALE > 2.0**-14


def test_compute_name():
    assert compute_name(torch.float32) == "float32"
    assert compute_name(torch.float32, torch.float16) == "float16"
    assert compute_name("high") == "tf32" and compute_name(torch.float32, "high") == "tf32"
    with pytest.raises(TypeError, match="compute_dtype"):
        compute_name(torch.float32, torch.int8)
    with pytest.raises(TypeError, match="dtype"):
        check_orthogonalizer(FP16, dtype=torch.int32)


@settings(deadline=None)
@given(st.lists(st.floats(0.05, 1.0), min_size=1, max_size=12), st.integers(2, 64), st.integers(1, 64))
def test_float16_tolerance_is_eight_times_finer_than_bfloat16(sigmas, m, n):
    """Same accumulation (float32), unit roundoff 2⁻¹¹ vs 2⁻⁸: ρ scales by 1/8 and the tolerance by
    about that (the gain's sup is taken over a ρ-neighbourhood, so not exactly)."""
    s = np.sort(np.array(sigmas))[::-1]
    table = ortho_ref.schedule("jordan")
    assert per_product_roundoff("float16", (m, n)) < per_product_roundoff("bfloat16", (m, n)) / 7.9
    t16 = ns_singular_value_tolerances(s, table, (m, n), "float16")
    t8 = ns_singular_value_tolerances(s, table, (m, n), "bfloat16")
    assert np.all(t16 > 0) and np.all(t16 <= t8)


def test_a_float16_failure_replays_with_its_compute_dtype():
    from ortho_verify import replay_example

    kernel = functools.partial(newton_schulz_kernel, dtype=torch.bfloat16)
    declared = dict(dtype=torch.float32, compute_dtype=torch.float16)
    report = check_orthogonalizer(kernel, examples=default_examples("float32", compute_dtype="float16")[:6],
                                  **declared)
    failure = report.failures[0]
    rows = replay_example(kernel, failure, **declared)
    assert [(r.check, r.error, r.tolerance) for r in rows] == [(failure.result.check, failure.result.error,
                                                                 failure.result.tolerance)]
