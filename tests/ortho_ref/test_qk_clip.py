"""The QK-clip reference (ortho_ref.qk_clip): Kimi K2's per-head rule checked by its defining
property (the max logit of a clipped head becomes τ, the others keep theirs), GQA grouping,
fused layouts equal to the separate weights, the no-op, and bad input."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from ortho_ref.qk_clip import qk_clip, qk_clip_factors, qk_clip_fused, qkv_row_heads
from ortho_verify.tolerances import U64


# float64 logits recomputed from clipped weights: each logit is a length-d dot product of
# entries scaled by the clip factors (three float64 roundings of the factor and the scaled
# entries, then the d-term sum): relative 4·d·u64 is a bound for the difference (γ·(q·k) vs
# (γ^α q)·(γ^(1−α) k)); 8 heads of d ≤ 8 keep it far below any planted error (≥ 1e-3 relative).
def logit_tolerance(d: int) -> float:
    return 4 * (d + 4) * U64


def max_logits(wq, wk, x, num_heads, num_kv_heads):
    """Per query head max over token pairs of (x W_qᵀ)_h · (x W_kᵀ)_g / √d, g = h // r."""
    d = wq.shape[0] // num_heads
    q = (x @ wq.T).reshape(len(x), num_heads, d)
    k = (x @ wk.T).reshape(len(x), num_kv_heads, d)
    k = np.repeat(k, num_heads // num_kv_heads, axis=1)
    return np.einsum("ihd,jhd->hij", q, k).reshape(num_heads, -1).max(axis=1) / np.sqrt(d)


@st.composite
def attention(draw):
    kv = draw(st.sampled_from([1, 2, 4]))
    r = draw(st.sampled_from([1, 2]))
    d = draw(st.sampled_from([2, 4, 8]))
    n = draw(st.sampled_from([3, 8]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    h = kv * r
    wq = rng.standard_normal((h * d, n)) * rng.uniform(0.5, 3.0, size=(h, 1, 1)).repeat(d, 1).reshape(h * d, 1)
    wk = rng.standard_normal((kv * d, n))
    x = rng.standard_normal((5, n))
    return wq, wk, x, h, kv, d


@given(attention(), st.floats(0.1, 0.9), st.sampled_from([0.0, 0.3, 0.5, 1.0]))
def test_clipped_max_logits_become_tau(case, quantile, alpha):
    wq, wk, x, h, kv, d = case
    s = max_logits(wq, wk, x, h, kv)
    tau = float(np.quantile(np.abs(s), quantile)) + 1e-3
    wq2, wk2 = qk_clip(wq, wk, s, threshold=tau, alpha=alpha, num_heads=h, num_kv_heads=kv)
    s2 = max_logits(wq2, wk2, x, h, kv)
    group_max = s.reshape(kv, -1).max(axis=1)
    gamma = np.repeat(np.minimum(1.0, tau / group_max), h // kv)
    tol = logit_tolerance(d) * np.abs(s).max()
    np.testing.assert_allclose(s2, gamma * s, rtol=0, atol=tol)  # every logit of a group scaled by γ_g
    assert np.all(s2 <= tau + tol)
    over = np.repeat(group_max > tau, h // kv)
    assert np.allclose(s2[over].reshape(-1), gamma[over] * s[over], atol=tol)
    np.testing.assert_array_equal(wq2[np.repeat(~over, d)], wq[np.repeat(~over, d)])  # untouched heads: exact


def test_mha_is_kimi_per_head_rule():
    rng = np.random.default_rng(0)
    wq, wk = rng.standard_normal((8, 5)), rng.standard_normal((8, 5))
    s = np.array([1.0, 50.0, 3.0, 400.0])
    wq2, wk2 = qk_clip(wq, wk, s, threshold=100.0, num_heads=4)
    expect = np.array([1.0, 1.0, 1.0, np.sqrt(100 / 400)]).repeat(2)[:, None]
    np.testing.assert_array_equal(wq2, wq * expect)
    np.testing.assert_array_equal(wk2, wk * expect)


def test_no_head_over_threshold_is_a_no_op():
    rng = np.random.default_rng(1)
    wq, wk = rng.standard_normal((12, 4)), rng.standard_normal((6, 4))
    wq2, wk2 = qk_clip(wq, wk, [1.0, -2.0, 5.0, 5.0], threshold=5.0, num_heads=4, num_kv_heads=2)
    np.testing.assert_array_equal(wq2, wq)
    np.testing.assert_array_equal(wk2, wk)
    assert qk_clip_factors([1.0, 5.0], threshold=5.0, num_heads=2).tolist() == [1.0, 1.0]


@pytest.mark.parametrize("layout", ["concatenated", "grouped"])
@given(attention(), st.floats(0.1, 0.9))
def test_fused_equals_separate(layout, case, quantile):
    wq, wk, x, h, kv, d = case
    wv = np.random.default_rng(7).standard_normal(wk.shape)
    s = max_logits(wq, wk, x, h, kv)
    tau = float(np.quantile(np.abs(s), quantile)) + 1e-3
    role, head = qkv_row_heads(num_heads=h, num_kv_heads=kv, head_dim=d, layout=layout)
    fused = np.empty((len(role), wq.shape[1]))
    for r_, w in enumerate((wq, wk, wv)):
        fused[role == r_] = w.reshape(-1, d, w.shape[1])[np.unique(head[role == r_])].reshape(-1, w.shape[1])
    out = qk_clip_fused(fused, s, threshold=tau, num_heads=h, num_kv_heads=kv, head_dim=d, layout=layout)
    wq2, wk2 = qk_clip(wq, wk, s, threshold=tau, num_heads=h, num_kv_heads=kv)
    np.testing.assert_array_equal(out[role == 0], wq2)
    np.testing.assert_array_equal(out[role == 1], wk2)
    np.testing.assert_array_equal(out[role == 2], fused[role == 2])


def test_grouped_layout_rows():
    role, head = qkv_row_heads(num_heads=4, num_kv_heads=2, head_dim=1, layout="grouped")
    assert role.tolist() == [0, 0, 1, 2, 0, 0, 1, 2]
    assert head.tolist() == [0, 1, 0, 0, 2, 3, 1, 1]


@pytest.mark.parametrize("kwargs, match", [
    (dict(threshold=-1.0), "threshold"),
    (dict(threshold=float("nan")), "threshold"),
    (dict(max_logits=[1.0, float("nan"), 1.0, 1.0]), "max_logits"),
    (dict(max_logits=[1.0, 2.0, 3.0]), "max_logits"),
    (dict(num_kv_heads=3), "num_kv_heads"),
    (dict(num_heads=0), "num_heads"),
    (dict(alpha=1.5), "alpha"),
    (dict(head_dim=3), "w_q"),
])
def test_bad_input_named(kwargs, match):
    rng = np.random.default_rng(2)
    args = dict(w_q=rng.standard_normal((8, 3)), w_k=rng.standard_normal((4, 3)), max_logits=[1.0, 9.0, 3.0, 4.0],
                threshold=2.0, num_heads=4, num_kv_heads=2)
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        qk_clip(**args)


def test_fused_bad_rows_and_layout():
    w = np.ones((10, 3))
    with pytest.raises(ValueError, match="w_qkv"):
        qk_clip_fused(w, [1.0, 2.0], threshold=1.0, num_heads=2, head_dim=2)
    with pytest.raises(ValueError, match="layout"):
        qk_clip_fused(np.ones((8, 3)), [1.0, 2.0], threshold=1.0, num_heads=2, head_dim=2, layout="interleaved")
