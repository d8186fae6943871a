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
    """Per key group QK-clip factor γ_g = min(1, τ / max over h in g of S_max^h).

    Group g holds the query heads h = g·r, ..., g·r + r − 1, r = num_heads / num_kv_heads. A group
    whose heads all have S_max^h <= τ gets exactly 1; with num_kv_heads = num_heads this is Kimi K2's
    per-head γ_h = τ / S_max^h where S_max^h > τ.

    Parameters
    ----------
    max_logits : (num_heads,) array_like of float
        S_max^h, each query head's largest attention logit (pre-softmax q·k / √d, as the model
        computes it) over the batch; finite.
    threshold : float
        τ, in logit units; finite and > 0.
    num_heads : int
        Query heads, >= 1.
    num_kv_heads : int, optional
        Key (and value) heads, dividing `num_heads`. Default None: `num_heads` (no grouping).

    Returns
    -------
    (num_kv_heads,) float64 ndarray
        γ_g in (0, 1].

    Raises
    ------
    TypeError
        If `max_logits` is not real numbers.
    ValueError
        Naming the argument: `threshold` not finite and > 0; head counts not positive integers or
        not dividing; `max_logits` of the wrong shape or not finite.

    References
    ----------
    Kimi Team, "Kimi K2: Open Agentic Intelligence", arXiv 2507.20534, 2025, Sec. 2.1, Algorithm 1
    (MuonClip); grouped-query attention as Megatron-LM ``SelfAttention.clip_qk``.

    Examples
    --------
    >>> from ortho_ref import qk_clip_factors
    >>> qk_clip_factors([50.0, 200.0, 80.0, 100.0], threshold=100.0, num_heads=4, num_kv_heads=2).tolist()
    [0.5, 1.0]
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
    """QK-clip of separate query and key projections: W_q^h ← γ_g^α·W_q^h, W_k^g ← γ_g^(1−α)·W_k^g.

    γ_g from ``qk_clip_factors``; every logit of group g is multiplied by exactly γ_g (q·k is
    bilinear), so no head exceeds τ on the same batch afterwards. The inputs are not modified.

    Parameters
    ----------
    w_q : (num_heads·d, n) array_like of float
        The query projection, num_heads blocks of d rows (PyTorch's (fan_out, fan_in) layout).
    w_k : (num_kv_heads·d, n) array_like of float
        The key projection, num_kv_heads blocks of d rows.
    max_logits : (num_heads,) array_like of float
        S_max^h per query head, in logit units.
    threshold : float
        τ, finite and > 0.
    alpha : float, default 0.5
        The query side's share α of the factor, in [0, 1] (Kimi K2: 0.5).
    num_heads : int
        Query heads, >= 1.
    num_kv_heads : int, optional
        Key (and value) heads, dividing `num_heads`. Default None: `num_heads` (no grouping).
    head_dim : int, optional
        d. Default None: inferred from `w_q`'s rows (the key must have the same head size).

    Returns
    -------
    w_q : (num_heads·d, n) float64 ndarray
        The clipped query projection.
    w_k : (num_kv_heads·d, n) float64 ndarray
        The clipped key projection.

    Raises
    ------
    TypeError
        If a weight has a non-float dtype or `max_logits` is not real numbers.
    ValueError
        Naming the argument: as ``qk_clip_factors``; a weight not 2-D or not finite, rows that are
        not heads × head_dim, different column counts, or `alpha` outside [0, 1].

    References
    ----------
    Kimi Team, "Kimi K2: Open Agentic Intelligence", arXiv 2507.20534, 2025, Sec. 2.1, Algorithm 1.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref.qk_clip import qk_clip
    >>> rng = np.random.default_rng(0)
    >>> w_q, w_k = rng.standard_normal((2, 2, 4))  # one head, head_dim 2, n = 4
    >>> x = rng.standard_normal(4)
    >>> q2, k2 = qk_clip(w_q, w_k, [400.0], threshold=100.0, num_heads=1)
    >>> bool(np.isclose((q2 @ x) @ (k2 @ x), 0.25 * (w_q @ x) @ (w_k @ x)))  # γ = 100 / 400
    True
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
    """Which row of a fused QKV weight belongs to which query head or key group, and in which role.

    "concatenated": [Q; K; V] (nanoGPT ``c_attn``, Hugging Face fused ``qkv_proj``). "grouped":
    num_kv_heads groups of [r·d query rows, d key rows, d value rows] (Megatron-LM ``linear_qkv``),
    r = num_heads / num_kv_heads.

    Parameters
    ----------
    num_heads : int
        Query heads, >= 1.
    num_kv_heads : int, optional
        Key (and value) heads, dividing `num_heads`. Default None: `num_heads` (no grouping).
    head_dim : int
        d, rows per head, >= 1.
    layout : {"concatenated", "grouped"}, default "concatenated"
        The row order.

    Returns
    -------
    role : ((num_heads + 2·num_kv_heads)·head_dim,) int ndarray
        0 query, 1 key, 2 value, per row.
    head : ((num_heads + 2·num_kv_heads)·head_dim,) int ndarray
        The query head (role 0) or the key group (roles 1, 2) of each row.

    Raises
    ------
    ValueError
        Naming `layout` or a head count that is not a positive integer or does not divide.

    References
    ----------
    nanoGPT ``c_attn``; Hugging Face ``qkv_proj``; Megatron-LM
    ``SelfAttention.get_query_key_value_tensors``.

    Examples
    --------
    >>> from ortho_ref import qkv_row_heads
    >>> role, head = qkv_row_heads(num_heads=2, head_dim=1)
    >>> role.tolist(), head.tolist()
    ([0, 0, 1, 1, 2, 2], [0, 1, 0, 1, 0, 1])
    >>> qkv_row_heads(num_heads=2, head_dim=1, layout="grouped")[0].tolist()
    [0, 1, 2, 0, 1, 2]
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
    """QK-clip of a fused QKV weight: query rows of head h × γ_g^α, key rows of group g × γ_g^(1−α).

    Value rows are unchanged; ``qkv_row_heads`` says which row is which and γ_g comes from
    ``qk_clip_factors``. The input is not modified.

    Parameters
    ----------
    w_qkv : ((num_heads + 2·num_kv_heads)·head_dim, n) array_like of float
        The fused weight, rows in `layout` order.
    max_logits : (num_heads,) array_like of float
        S_max^h per query head, in logit units.
    threshold : float
        τ, finite and > 0.
    alpha : float, default 0.5
        The query side's share α of the factor, in [0, 1].
    num_heads : int
        Query heads, >= 1.
    num_kv_heads : int, optional
        Key (and value) heads, dividing `num_heads`. Default None: `num_heads` (no grouping).
    head_dim : int
        d, rows per head, >= 1.
    layout : {"concatenated", "grouped"}, default "concatenated"
        The row order (``qkv_row_heads``).

    Returns
    -------
    float64 ndarray
        The clipped weight, of `w_qkv`'s shape.

    Raises
    ------
    TypeError
        If `w_qkv` has a non-float dtype or `max_logits` is not real numbers.
    ValueError
        Naming the argument: as ``qk_clip``; a row count that is not (num_heads + 2·num_kv_heads)·
        head_dim, or an unknown `layout`.

    References
    ----------
    Kimi Team, "Kimi K2: Open Agentic Intelligence", arXiv 2507.20534, 2025, Sec. 2.1, Algorithm 1;
    fused layouts as ``qkv_row_heads``.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import qk_clip_fused
    >>> w = qk_clip_fused(np.ones((4, 3)), [400.0, 25.0], threshold=100.0, num_heads=2, num_kv_heads=1,
    ...                   head_dim=1)
    >>> w[:, 0].tolist()  # γ = 100 / 400: √γ on the query and key rows, value row kept
    [0.5, 0.5, 0.5, 1.0]
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
