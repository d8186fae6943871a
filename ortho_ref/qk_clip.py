"""Reference QK-clip (MuonClip, Kimi K2): the query / key weights rescaled per head after the step.

Kimi Team, "Kimi K2: Open Agentic Intelligence" (arXiv 2507.20534), Sec. 2.1, Algorithm 1
(MuonClip): after the optimizer update, for every attention head h whose maximum attention logit
S_max^h (the largest pre-softmax score q·k / √d over the batch) exceeds the threshold τ,

    γ_h = τ / S_max^h,   W_q^h ← γ_h^α · W_q^h,   W_k^h ← γ_h^(1−α) · W_k^h,   α = 0.5,

so every logit of that head is multiplied by exactly γ_h (q·k is bilinear) and the head's maximum
logit of the same batch becomes τ. Heads with S_max^h ≤ τ are left untouched: a no-op when no
head exceeds τ.

Grouped-query attention (num_kv_heads < num_heads): one key head serves the
r = num_heads / num_kv_heads query heads h = g·r, …, g·r + r − 1 (the convention of torch's
``scaled_dot_product_attention(enable_gqa=True)`` and of Hugging Face's ``repeat_kv``). A key
head cannot be scaled per query head, so the factor is taken per key group,
γ_g = min(1, τ / max_{h in g} S_max^h), and applied as γ_g^α to every query head of the group
and γ_g^(1−α) to the key head (Megatron-LM ``SelfAttention.clip_qk``). Each logit of the group
is then scaled by γ_g ≤ τ / S_max^h, so no head of the group exceeds τ afterwards; with
num_kv_heads = num_heads this is exactly Kimi K2's per-head rule.

Not covered (documented in docs/math.md, "QK-clip (MuonClip)"): multi-head latent attention
(MLA), whose shared rotary key part Kimi K2 leaves unscaled and whose per-head rotary query part
it scales by γ_h (not γ_h^α); only standard multi-head / grouped-query attention with separate
or fused query / key projections is defined here.

Weights use PyTorch's layout (fan_out, fan_in): the rows of W_q are num_heads blocks of head_dim
rows, those of W_k num_kv_heads blocks. A fused QKV weight stacks the rows either
"concatenated" ([Q; K; V], nanoGPT's ``c_attn`` / Hugging Face's fused ``qkv_proj``) or
"grouped" (Megatron-LM's ``linear_qkv``: num_kv_heads groups of [r·d query rows, d key rows,
d value rows]).
"""

from __future__ import annotations

import math

import numpy as np

from ._validate import as_matrix

__all__ = ["FUSED_LAYOUTS", "qk_clip", "qk_clip_factors", "qk_clip_fused", "qkv_row_heads"]

#: Row orders of a fused QKV weight (see the module docstring).
FUSED_LAYOUTS = ("concatenated", "grouped")


def _count(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


def _heads(num_heads, num_kv_heads) -> tuple[int, int]:
    h = _count(num_heads, "num_heads")
    kv = h if num_kv_heads is None else _count(num_kv_heads, "num_kv_heads")
    if h % kv:
        raise ValueError(f"num_kv_heads: {kv} key heads must divide num_heads {h}")
    return h, kv


def qk_clip_factors(max_logits, *, threshold: float, num_heads: int, num_kv_heads: int | None = None) -> np.ndarray:
    """Per key group clip factor γ_g = min(1, τ / max_{h in g} S_max^h), exactly 1 where no head exceeds τ.

    Shapes: max_logits (num_heads,) float -> (num_kv_heads,) float64 (num_kv_heads None: num_heads).
    Units: logits are the attention scores before softmax (q·k / √d, as the model computes them).
    Source: Kimi K2 (arXiv 2507.20534), Algorithm 1; GQA grouping as Megatron-LM ``clip_qk``.
    Raises: ValueError naming the argument for a threshold that is not finite and > 0, head counts
    that are not positive or do not divide, logits of the wrong shape or not finite.
    """
    h, kv = _heads(num_heads, num_kv_heads)
    tau = float(threshold)
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"threshold: expected a finite number > 0, got {threshold!r}")
    s = np.asarray(max_logits)
    if s.dtype.kind not in "fiu":
        raise TypeError(f"max_logits: expected real numbers, got dtype {s.dtype}")
    s = s.astype(np.float64)
    if s.shape != (h,):
        raise ValueError(f"max_logits: expected shape ({h},) (one per query head), got {s.shape}")
    if not np.all(np.isfinite(s)):
        raise ValueError("max_logits: contains NaN or Inf; expected finite values")
    group_max = s.reshape(kv, h // kv).max(axis=1)
    return np.where(group_max > tau, tau / np.where(group_max > tau, group_max, 1.0), 1.0)


def _alpha(alpha: float) -> float:
    a = float(alpha)
    if not (0.0 <= a <= 1.0):
        raise ValueError(f"alpha: expected a number in [0, 1], got {alpha!r}")
    return a


def _scale_rows(w: np.ndarray, factors: np.ndarray, head_dim: int) -> np.ndarray:
    """Rows of ``w`` in len(factors) blocks of head_dim rows, block i times factors[i]."""
    return (w.reshape(len(factors), head_dim, -1) * factors[:, None, None]).reshape(w.shape)


def _head_dim(rows: int, heads: int, name: str, head_dim: int | None) -> int:
    if head_dim is None:
        if rows % heads:
            raise ValueError(f"{name}: {rows} rows are not {heads} heads of equal size")
        return rows // heads
    d = _count(head_dim, "head_dim")
    if rows != heads * d:
        raise ValueError(f"{name}: expected {heads} heads × head_dim {d} = {heads * d} rows, got {rows}")
    return d


def qk_clip(w_q, w_k, max_logits, *, threshold: float, alpha: float = 0.5, num_heads: int,
            num_kv_heads: int | None = None, head_dim: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """QK-clip of separate query and key projections: (W_q', W_k') with W_q^h · γ_g^α, W_k^g · γ_g^(1−α).

    Shapes: w_q (num_heads·d, n), w_k (num_kv_heads·d, n), max_logits (num_heads,) -> two float64
    arrays of the same shapes (new arrays; the inputs are not changed). ``head_dim`` d: None
    infers it from w_q's rows (the key must then have the same head size).
    Source: Kimi K2 (arXiv 2507.20534), Algorithm 1 (α = 0.5: √γ on each side); GQA as
    ``qk_clip_factors``.
    Raises: ValueError / TypeError naming the argument (see ``qk_clip_factors``; weights not 2-D,
    not finite, rows not heads × head_dim, different column counts; alpha outside [0, 1]).
    """
    wq, wk = as_matrix(w_q, "w_q"), as_matrix(w_k, "w_k")
    h, kv = _heads(num_heads, num_kv_heads)
    d = _head_dim(wq.shape[0], h, "w_q", head_dim)
    _head_dim(wk.shape[0], kv, "w_k", d)
    if wq.shape[1] != wk.shape[1]:
        raise ValueError(f"w_k: expected {wq.shape[1]} columns (w_q's), got {wk.shape[1]}")
    a = _alpha(alpha)
    gamma = qk_clip_factors(max_logits, threshold=threshold, num_heads=h, num_kv_heads=kv)
    return _scale_rows(wq, np.repeat(gamma ** a, h // kv), d), _scale_rows(wk, gamma ** (1.0 - a), d)


def qkv_row_heads(*, num_heads: int, num_kv_heads: int | None = None, head_dim: int,
                  layout: str = "concatenated") -> tuple[np.ndarray, np.ndarray]:
    """Which row of a fused QKV weight belongs to which query / key head.

    Returns (role, head), each of shape ((num_heads + 2·num_kv_heads)·head_dim,) int: role 0 query,
    1 key, 2 value; head the query head (role 0) or the key group (roles 1, 2) of that row.
    Source: nanoGPT ``c_attn`` / Hugging Face fused ``qkv_proj`` ("concatenated"); Megatron-LM
    ``linear_qkv`` ("grouped", ``SelfAttention.get_query_key_value_tensors``).
    Raises: ValueError naming ``layout`` or a head count.
    """
    h, kv = _heads(num_heads, num_kv_heads)
    d = _count(head_dim, "head_dim")
    r = h // kv
    if layout == "concatenated":
        role = np.concatenate([np.zeros(h * d, int), np.ones(kv * d, int), np.full(kv * d, 2)])
        head = np.concatenate([np.repeat(np.arange(h), d), np.repeat(np.arange(kv), d), np.repeat(np.arange(kv), d)])
    elif layout == "grouped":
        one = np.concatenate([np.zeros(r * d, int), np.ones(d, int), np.full(d, 2)])
        role = np.tile(one, kv)
        head = np.concatenate([np.concatenate([np.repeat(g * r + np.arange(r), d), np.full(2 * d, g)])
                               for g in range(kv)])
    else:
        raise ValueError(f"layout: expected one of {FUSED_LAYOUTS}, got {layout!r}")
    return role, head


def qk_clip_fused(w_qkv, max_logits, *, threshold: float, alpha: float = 0.5, num_heads: int,
                  num_kv_heads: int | None = None, head_dim: int, layout: str = "concatenated") -> np.ndarray:
    """QK-clip of a fused QKV weight: query rows of head h times γ_g^α, key rows of group g times
    γ_g^(1−α), value rows unchanged (``qkv_row_heads`` says which row is which).

    Shapes: w_qkv ((num_heads + 2·num_kv_heads)·head_dim, n), max_logits (num_heads,) -> a new
    float64 array of w_qkv's shape.
    Source: Kimi K2 (arXiv 2507.20534), Algorithm 1; fused layouts as ``qkv_row_heads``.
    Raises: ValueError / TypeError naming the argument (row count, layout, see ``qk_clip``).
    """
    w = as_matrix(w_qkv, "w_qkv")
    h, kv = _heads(num_heads, num_kv_heads)
    role, head = qkv_row_heads(num_heads=h, num_kv_heads=kv, head_dim=head_dim, layout=layout)
    if w.shape[0] != len(role):
        raise ValueError(f"w_qkv: expected ({h} + 2·{kv}) heads × head_dim {head_dim} = {len(role)} rows, "
                         f"got {w.shape[0]}")
    a = _alpha(alpha)
    gamma = qk_clip_factors(max_logits, threshold=threshold, num_heads=h, num_kv_heads=kv)
    row_factor = np.where(role == 0, gamma[np.minimum(head // (h // kv), kv - 1)] ** a,
                          np.where(role == 1, gamma[np.minimum(head, kv - 1)] ** (1.0 - a), 1.0))
    return w * row_factor[:, None]
