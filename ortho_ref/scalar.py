"""Reference AdamW and Lion steps (float64, any shape, pure functions; numpy only).

The element-wise optimizers that Muon and Dion hand embeddings, norms, biases and the
output head to. Each function returns new arrays and never mutates its inputs.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._validate import as_like, check_scalar


def _as_array(a, name: str) -> np.ndarray:
    """``a`` as a finite float64 array of its own shape (0-D included), or raise."""
    return as_like(a, name, np.shape(a))


def _betas(betas) -> tuple[float, float]:
    try:
        b1, b2 = betas
    except (TypeError, ValueError):
        raise ValueError(f"betas: expected a pair (beta1, beta2), got {betas!r}") from None
    return (check_scalar(b1, "betas[0]", low=0.0, high=1.0), check_scalar(b2, "betas[1]", low=0.0, high=1.0))


class AdamWStep(NamedTuple):
    """Result of ``adamw_step``: new ``weight``, ``exp_avg`` (m), ``exp_avg_sq`` (v), all of
    the weight's shape; ``step`` t, the number of steps taken including this one; ``update``
    the direction m̂ / (√v̂ + eps) that was scaled by lr (shape of the weight)."""

    weight: np.ndarray
    exp_avg: np.ndarray
    exp_avg_sq: np.ndarray
    step: int
    update: np.ndarray


def adamw_step(
    weight,
    grad,
    exp_avg,
    exp_avg_sq,
    step: int,
    *,
    lr: float,
    betas=(0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
) -> AdamWStep:
    """One reference AdamW step (decoupled weight decay), bias-corrected as torch.optim.AdamW.

    With t = step + 1:
        m ← β1·m + (1 − β1)·g,            v ← β2·v + (1 − β2)·g²,
        m̂ = m / (1 − β1ᵗ),                 √v̂ = √v / √(1 − β2ᵗ),
        W ← W·(1 − lr·weight_decay) − lr · m̂ / (√v̂ + eps).
    eps is added to the bias-corrected √v̂ and the decay uses lr·weight_decay (torch). With
    eps = 0, a coordinate with m = v = 0 gets update 0 (the limit eps → 0; torch gives NaN).

    Shapes: weight, grad, exp_avg, exp_avg_sq any common shape (0-D included), float ->
    AdamWStep of float64 arrays of that shape. ``step``: the number of steps already taken
    (torch's ``state["step"]`` before the call; 0 for fresh state). Defaults: torch.optim.AdamW's.
    Source: Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019
    (arXiv 1711.05101), Algorithm 2; torch.optim.AdamW (``_single_tensor_adam``).
    Raises: TypeError for non-float arrays; ValueError for shape mismatches, NaN/Inf, a
    negative ``exp_avg_sq``, step not an integer >= 0, lr/eps/weight_decay < 0 or betas
    outside [0, 1).
    """
    w = _as_array(weight, "weight")
    g = as_like(grad, "grad", w.shape)
    m = as_like(exp_avg, "exp_avg", w.shape)
    v = as_like(exp_avg_sq, "exp_avg_sq", w.shape)
    if np.any(v < 0):
        raise ValueError("exp_avg_sq: expected non-negative values (a running mean of squared gradients)")
    if isinstance(step, bool) or int(step) != step or step < 0:
        raise ValueError(f"step: expected an integer >= 0 (steps already taken), got {step!r}")
    lr = check_scalar(lr, "lr", low=0.0)
    eps = check_scalar(eps, "eps", low=0.0)
    weight_decay = check_scalar(weight_decay, "weight_decay", low=0.0)
    b1, b2 = _betas(betas)
    if b1 == 1.0 or b2 == 1.0:
        raise ValueError(f"betas: expected values in [0, 1), got {betas!r}")

    t = int(step) + 1
    m_new = b1 * m + (1.0 - b1) * g
    v_new = b2 * v + (1.0 - b2) * g * g
    denom = np.sqrt(v_new) / np.sqrt(1.0 - b2**t) + eps
    update = _safe_ratio(m_new / (1.0 - b1**t), denom)
    w_new = w * (1.0 - lr * weight_decay) - lr * update
    return AdamWStep(w_new, m_new, v_new, t, update)


def _safe_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den with 0 / 0 := 0 (eps = 0 and a coordinate whose gradients were all zero)."""
    out = np.zeros_like(num)
    np.divide(num, den, out=out, where=den > 0)
    return out


class LionStep(NamedTuple):
    """Result of ``lion_step``: new ``weight`` and ``exp_avg`` (m), ``update`` = sign(c) ∈
    {−1, 0, +1} (sign(0) = 0), the direction scaled by lr, and ``interpolated`` c =
    β1·m + (1 − β1)·g whose sign it is; all of the weight's shape."""

    weight: np.ndarray
    exp_avg: np.ndarray
    update: np.ndarray
    interpolated: np.ndarray


def lion_step(weight, grad, exp_avg, *, lr: float, betas=(0.9, 0.99), weight_decay: float = 0.0) -> LionStep:
    """One reference Lion step (evoLved sIgn mOmeNtum):

        c = β1·m + (1 − β1)·g,   W ← W·(1 − lr·weight_decay) − lr·sign(c),
        m ← β2·m + (1 − β2)·g.

    Shapes: weight, grad, exp_avg any common shape (0-D included), float -> LionStep of
    float64 arrays of that shape. Defaults: betas (0.9, 0.99) and weight_decay 0 as the
    paper and lucidrains/lion-pytorch (Megatron uses betas (0.95, 0.98)).
    Source: Chen et al., "Symbolic Discovery of Optimization Algorithms", NeurIPS 2023
    (arXiv 2302.06675), the Lion algorithm (Algorithm 2, beside AdamW's Algorithm 1);
    microsoft/dion ``lion_update``.
    Raises: TypeError for non-float arrays; ValueError for shape mismatches, NaN/Inf,
    lr/weight_decay < 0 or betas outside [0, 1].
    """
    w = _as_array(weight, "weight")
    g = as_like(grad, "grad", w.shape)
    m = as_like(exp_avg, "exp_avg", w.shape)
    lr = check_scalar(lr, "lr", low=0.0)
    weight_decay = check_scalar(weight_decay, "weight_decay", low=0.0)
    b1, b2 = _betas(betas)
    c = b1 * m + (1.0 - b1) * g
    update = np.sign(c)
    w_new = w * (1.0 - lr * weight_decay) - lr * update
    return LionStep(w_new, b2 * m + (1.0 - b2) * g, update, c)
