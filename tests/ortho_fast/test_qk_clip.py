"""QK-clip in torch (ortho_fast.functional.qk_clip): against the float64 reference in float64,
float32 and bfloat16 with the derived tolerance, bitwise no-op, fused layouts, no host sync."""

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from ortho_fast.functional.qk_clip import qk_clip_, qk_clip_factors
from ortho_ref.qk_clip import qk_clip, qk_clip_fused
from ortho_verify.tolerances.qk_clip import qk_clip_tolerance

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def rel_error(fast: torch.Tensor, ref: np.ndarray) -> float:
    f = fast.double().numpy()
    denom = np.where(ref == 0, 1.0, np.abs(ref))
    return float((np.abs(f - ref) / denom).max())


@st.composite
def case(draw):
    kv = draw(st.sampled_from([1, 2, 3]))
    r = draw(st.sampled_from([1, 2]))
    d = draw(st.sampled_from([1, 4, 8]))
    n = draw(st.sampled_from([2, 8]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    h = kv * r
    logits = rng.uniform(-5.0, 300.0, size=h)
    return h, kv, d, n, rng, logits


@pytest.mark.parametrize("dtype", list(DTYPES))
@given(case(), st.sampled_from([0.5, 0.25, 1.0]), st.sampled_from([1.0, 100.0, 0.1]))
def test_separate_against_reference(dtype, c, alpha, tau):
    h, kv, d, n, rng, logits = c
    tdt = DTYPES[dtype]
    wq = torch.tensor(rng.standard_normal((h * d, n)), dtype=tdt)
    wk = torch.tensor(rng.standard_normal((kv * d, n)), dtype=tdt)
    s = torch.tensor(logits, dtype=torch.float32)
    ref_q, ref_k = qk_clip(wq.double().numpy(), wk.double().numpy(), s.double().numpy(), threshold=tau, alpha=alpha,
                           num_heads=h, num_kv_heads=kv)
    qk_clip_(wq, s, threshold=tau, role="query", num_heads=h, num_kv_heads=kv, alpha=alpha)
    qk_clip_(wk, s, threshold=tau, role="key", num_heads=h, num_kv_heads=kv, alpha=alpha)
    bound = qk_clip_tolerance(dtype)
    assert rel_error(wq, ref_q) <= bound
    assert rel_error(wk, ref_k) <= bound


@pytest.mark.parametrize("layout", ["concatenated", "grouped"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@given(case())
def test_fused_against_reference(layout, dtype, c):
    h, kv, d, n, rng, logits = c
    w = torch.tensor(rng.standard_normal(((h + 2 * kv) * d, n)), dtype=DTYPES[dtype])
    s = torch.tensor(logits, dtype=torch.float32)
    ref = qk_clip_fused(w.double().numpy(), s.double().numpy(), threshold=100.0, num_heads=h, num_kv_heads=kv,
                        head_dim=d, layout=layout)
    qk_clip_(w, s, threshold=100.0, role="qkv", num_heads=h, num_kv_heads=kv, layout=layout)
    assert rel_error(w, ref) <= qk_clip_tolerance(dtype)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_no_head_over_threshold_is_bitwise_no_op(dtype):
    w = torch.randn(24, 5, dtype=DTYPES[dtype])
    before = w.clone()
    qk_clip_(w, torch.tensor([10.0, 100.0, -3.0, 99.9]), threshold=100.0, role="qkv", num_heads=4, num_kv_heads=2)
    assert torch.equal(w, before)


def test_tolerance_is_sharp():
    """A relative error of twice the bound on one entry fails the comparison; half of it passes."""
    rng = np.random.default_rng(3)
    w = torch.tensor(rng.standard_normal((8, 4)), dtype=torch.float64)
    s = torch.tensor([500.0, 1.0])
    ref = qk_clip_fused(w.numpy(), s.numpy(), threshold=100.0, num_heads=2, num_kv_heads=1, head_dim=2)
    qk_clip_(w, s, threshold=100.0, role="qkv", num_heads=2, num_kv_heads=1)
    bound = qk_clip_tolerance("float64")
    for factor, ok in ((2.0, False), (0.5, True)):
        bad = w.clone()
        bad[0, 0] *= 1 + factor * bound
        assert (rel_error(bad, ref) <= bound) is ok


def test_factors_group_max_and_exact_one():
    g = qk_clip_factors(torch.tensor([1.0, 200.0, 50.0, 100.0]), 100.0, 2)
    assert g.tolist() == [0.5, 1.0]


def test_bad_role_layout_shape():
    w = torch.zeros(8, 3)
    with pytest.raises(ValueError, match="role"):
        qk_clip_(w, torch.ones(2), threshold=1.0, role="value", num_heads=2)
    with pytest.raises(ValueError, match="layout"):
        qk_clip_(w, torch.ones(2), threshold=1.0, role="qkv", num_heads=2, layout="interleaved")
    with pytest.raises(ValueError, match="max_logits"):
        qk_clip_(w, torch.ones(3), threshold=1.0, role="query", num_heads=2)
    with pytest.raises(ValueError, match="weight"):
        qk_clip_(w, torch.ones(3), threshold=1.0, role="qkv", num_heads=3)
