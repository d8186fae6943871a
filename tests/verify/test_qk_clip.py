"""ortho-verify's QK-clip rows (ortho_verify.checks.qk_clip): pass on ortho_fast and on a correct clip
written differently, in float64 / float32 / bfloat16 and every layout; every planted bug is caught."""

import numpy as np
import pytest

from ortho_verify.checks.qk_clip import (
    QK_CLIP_CONTROL,
    QK_CLIP_LAYOUTS,
    QK_CLIP_PLANTED,
    check_qk_clip,
    qk_clip_jobs,
    qk_clip_logits,
)
from ortho_verify.inputs.spectra import MatrixCase, matrix_with_spectrum

DTYPES = ("float64", "float32", "bfloat16")


def case(m=24, n=16, seed=0):
    s = np.geomspace(1.0, 1e-2, min(m, n))
    return MatrixCase(f"test/{m}x{n}", matrix_with_spectrum(s, m, n, np.random.default_rng(seed)), "synthetic", "test")


@pytest.mark.parametrize("layout", QK_CLIP_LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("planted", [None, QK_CLIP_CONTROL])
def test_passes_on_correct_code(layout, dtype, planted):
    [row] = check_qk_clip(case(), dtype, layout, planted)
    assert row.passed and row.claimed and row.error <= row.tolerance, row


@pytest.mark.parametrize("layout", QK_CLIP_LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("planted", QK_CLIP_PLANTED)
def test_every_planted_bug_is_caught(layout, dtype, planted):
    if planted == "wrong_fused_split" and not layout.startswith("qkv"):
        pytest.skip("separate query / key weights have no fused split to get wrong")
    [row] = check_qk_clip(case(), dtype, layout, planted)
    assert not row.passed, row


def test_logits_straddle_the_threshold():
    s = qk_clip_logits(case(), 4)
    assert s[0] < s[1] < 100 < s[2] < s[3]


def test_rows_that_do_not_fit_make_no_claim():
    [row] = check_qk_clip(case(m=20), "float32", "qkv grouped")  # 20 rows are not 8 head blocks
    assert row.passed and not row.claimed and "head blocks" in row.note


def test_jobs_cover_layouts_and_dtypes():
    jobs = qk_clip_jobs([case()])
    assert len(jobs) == len(QK_CLIP_LAYOUTS) * 3
    assert all(r.passed for _, thunk in jobs[:2] for r in thunk())


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("factor, passes", [(2.0, False), (0.5, True)])
def test_an_error_just_beyond_the_tolerance_fails(monkeypatch, dtype, factor, passes):
    """One entry of the clipped weight off by factor × the tolerance (relative), through the documented
    seam ortho_fast.functional.qk_clip.qk_clip_: twice the bound fails the row, half of it passes."""
    from ortho_fast.functional import qk_clip as fast_qk
    from ortho_verify.tolerances.qk_clip import qk_clip_tolerance

    real = fast_qk.qk_clip_

    def off_by(weight, *args, **kwargs):
        real(weight, *args, **kwargs)
        weight[0, 0] = (weight[0, 0].double() * (1 + factor * qk_clip_tolerance(dtype))).to(weight.dtype)
        return weight

    monkeypatch.setattr(fast_qk, "qk_clip_", off_by)
    [row] = check_qk_clip(case(), dtype, "qkv grouped")
    assert row.passed is passes, row
