"""TF32 kernels (``dtype="high"``): float32 storage, matmul operands rounded to 10 bits, float32
accumulation — simulated on the CPU by ``round_to_tf32`` on every product's operands."""

import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from ortho_verify import check_orthogonalizer
from ortho_verify.api import default_examples
from ortho_verify.planted.bugs import JORDAN, round_to_tf32, tf32_newton_schulz_kernel
from ortho_verify.tolerances import TF32_UNIT_ROUNDOFF, operand_roundings, per_product_roundoff, unit_roundoff

finite32 = st.floats(-2.0**127, 2.0**127, allow_nan=False, width=32)


@settings(deadline=None)
@given(st.lists(finite32, min_size=1, max_size=16))
def test_round_to_tf32_keeps_ten_bits_nearest(values):
    x = torch.tensor(values, dtype=torch.float32)
    r = round_to_tf32(x)
    assert torch.all((r.view(torch.int32) & ((1 << 13) - 1)) == 0)  # 10 significand bits left
    normal = x.abs() >= 2.0**-126
    err = (r.double() - x.double()).abs()
    assert torch.all(err[normal] <= TF32_UNIT_ROUNDOFF * x.double().abs()[normal])  # round to nearest
    assert torch.equal(round_to_tf32(r), r)  # idempotent


def test_round_to_tf32_ties_to_even_and_specials():
    x = torch.tensor([1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-10 + 2**-12, float("inf"), float("nan"), -0.0])
    r = round_to_tf32(x)
    assert r[:3].tolist() == [1.0, 1 + 2**-9, 1 + 2**-10]
    assert r[3] == float("inf") and torch.isnan(r[4])
    with pytest.raises(TypeError, match="float32"):
        round_to_tf32(x.double())


def test_tf32_roundoff_model():
    assert unit_roundoff("high") == unit_roundoff("tf32") == 2.0**-11
    assert operand_roundings("tf32") == 2 and operand_roundings("float16") == 1
    # two operand roundings at 2^-11, float32 accumulation: about twice float16's rho
    assert per_product_roundoff("tf32", (40, 24)) == pytest.approx(2 * per_product_roundoff("float16", (40, 24)),
                                                                    rel=0.01)


def test_tf32_kernel_passes_as_high_and_fails_as_float32():
    report = check_orthogonalizer(tf32_newton_schulz_kernel, dtype="high")
    assert report.passed, report.summary()
    assert "tf32" in report.subject
    assert {"ns_projected_singular_values"} <= {r.check for r in report.results}
    few = default_examples("float32")[:5]
    same = check_orthogonalizer(tf32_newton_schulz_kernel, dtype=torch.float32, compute_dtype="high", examples=few)
    alone = check_orthogonalizer(tf32_newton_schulz_kernel, dtype="high", examples=few)
    assert same.passed and [r.ratio for r in same.results] == [r.ratio for r in alone.results]
    # TF32 products where float32 is declared: measured 274x float32's tolerance
    assert not check_orthogonalizer(tf32_newton_schulz_kernel, dtype=torch.float32, examples=few).passed


def test_bfloat16_operands_declared_tf32_fail():
    """7-bit operands (bfloat16) where 10-bit (TF32) are declared: measured 1.4-1.5x the TF32 rows."""
    report = check_orthogonalizer(functools.partial(tf32_newton_schulz_kernel, operand_bits="bfloat16"), dtype="high")
    assert not report.passed
    assert max(f.result.ratio for f in report.failures) > 1.0


def test_tf32_coefficient_off_by_half_a_percent_fails():
    """c off by 0.5% in a TF32 kernel: the per-direction rows fail (measured 1.6x); 0.1% is within (0.26x)."""
    wrong = tuple((a, b, c * 1.005) for a, b, c in JORDAN)
    assert not check_orthogonalizer(functools.partial(tf32_newton_schulz_kernel, coefficients=wrong),
                                    dtype="high").passed


def test_tf32_has_no_statistical_row():
    report = check_orthogonalizer(tf32_newton_schulz_kernel, dtype="high", statistical=True,
                                  examples=default_examples("float32")[:2])
    assert "ns_mean_deviation" not in {r.check for r in report.results}
    assert np.isfinite(report.worst_ratio)
