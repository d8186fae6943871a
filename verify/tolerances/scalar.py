"""AdamW and Lion tolerances: per-entry bounds for one fast step vs ``ortho_ref.adamw_step`` /
``ortho_ref.lion_step``.
"""

from __future__ import annotations

import math

import numpy as np

import ortho_ref

from .roundoff import U64, unit_roundoff

__all__ = ["adamw_tolerances", "lion_tolerances"]


# --- AdamW and Lion ---
#
# Element-wise optimizers: per-entry absolute tolerances (arrays of the parameter's shape),
# first order in the unit roundoff. In torch the bias corrections, lr/(1 − β1ᵗ), 1 − lr·wd
# and 1 − β are Python floats (float64 whatever the parameter dtype), so their rounding is
# u64; the tensor operations round at the parameter dtype's u, and so does each such scalar
# when an operation converts it to the dtype (float32 "opmath" for bfloat16). ``u`` below is
# u + u64 (both sides of the comparison commit the same kinds of roundings; the oracle's
# formulas use no more operations than the fast side's).


def adamw_tolerances(ref: "ortho_ref.AdamWStep", weight, grad, exp_avg, *, lr: float, betas, eps: float,
                     dtype) -> dict:
    """Per-entry tolerances for (weight, exp_avg, exp_avg_sq) after one fast AdamW step vs
    ``ortho_ref.adamw_step`` (``ref``; weight, grad, exp_avg are the step's inputs).

    Derivation (t = ref.step, κᵢ = βᵢᵗ / (1 − βᵢᵗ), x = ref.update, d = √v/√(1 − β2ᵗ) + eps):
    - m = lerp(m₀, g, 1 − β1) or β1m₀ + (1 − β1)g: three roundings of terms bounded by
      |m₀| + |g| (cancellation possible) and the conversion of the weight: δm = 4u(|m₀| + |g|).
    - v = β2v₀ + (1 − β2)g²: on the (1 − β2)g² path its conversion, two products and the
      sum; all terms ≥ 0, so relative: δv = 4u·v.
    - 1 − βᵢᵗ: rounding of βᵢᵗ is amplified by the cancellation, relative (1 + κᵢ)·u64.
    - d: √v relative 2u (half of v's) + u; dividing by √(1 − β2ᵗ) (relative (1.5 + κ2/2)u64,
      then converted) + 2u; adding eps ≥ 0 (converted) + 2u: relative 7u + (1.5 + κ2/2)u64.
    - x·lr = (lr/(1 − β1ᵗ))·m/d: + u64 for lr/(1 − β1ᵗ), + 3u (convert, divide, multiply):
      δx = δm/((1 − β1ᵗ)·d) + |x|·(10u + (3.5 + κ1 + κ2/2)·2u64) (the scalars on both sides).
    - W' = W·(1 − lr·wd) − lr·x: the factor 2u64 per side and its conversion, multiply and
      subtract: δW = u(3|W| + lr|x|) + 4u64|W| + lr·δx.
    Without the conversions of the scalars (the counts 3u, 5u, 7u, 2|W|) a sweep of 2000 random float32
    steps exceeds the weight bound by 1.16× (2026-11-21, the project's 2-core CPU machine).
    First order: informative while (κ1 + κ2)·u64 and 10u are ≪ 1 (t = 1, β2 = 0.999: κ2 = 999);
    no underflow (g² and v normal numbers: the model above is relative).
    Source of the operation counts: torch ``_single_tensor_adam``; Higham, Accuracy and
    Stability, ch. 3 (model fl(a ∘ b) = (a ∘ b)(1 + δ), |δ| ≤ u).
    """
    u = unit_roundoff(dtype) + U64
    b1, b2 = (float(b) for b in betas)
    t = ref.step
    k1, k2 = b1**t / (1 - b1**t), b2**t / (1 - b2**t)
    bc1 = 1 - b1**t
    w0, g, m0 = (np.abs(np.asarray(a, dtype=np.float64)) for a in (weight, grad, exp_avg))
    x = np.abs(ref.update)
    d = np.sqrt(ref.exp_avg_sq) / math.sqrt(1 - b2**t) + eps
    d_m = 4 * u * (m0 + g)
    d_x = np.divide(d_m, bc1 * d, out=np.zeros_like(d_m), where=d > 0) + x * (10 * u + (3.5 + k1 + k2 / 2) * 2 * U64)
    d_w = u * (3 * w0 + lr * x) + 4 * U64 * w0 + lr * d_x
    return {"weight": d_w, "exp_avg": d_m, "exp_avg_sq": 4 * u * ref.exp_avg_sq}


def lion_tolerances(ref: "ortho_ref.LionStep", weight, grad, exp_avg, *, lr: float, dtype) -> dict:
    """Per-entry tolerances for (weight, exp_avg) after one fast Lion step vs
    ``ortho_ref.lion_step`` (``ref``; weight, grad, exp_avg are the step's inputs), and the
    ``sign_margin`` beyond which the two signs must agree.

    Derivation. c = lerp(m₀, g, 1 − β1) (fast) or β1m₀ + (1 − β1)g (oracle): three
    roundings each of terms bounded by |m₀| + |g| and the conversion of the weight, so
    |c_fast − c_ref| ≤ 4u(|m₀| + |g|) =: sign_margin; where |c_ref| > sign_margin,
    sign(c_fast) = sign(c_ref) exactly. The new momentum is the same interpolation with β2:
    δm = sign_margin. Where the signs agree, W' = W·(1 − lr·wd) − lr·s differs only by the
    factor (2u64 per side, then converted), the conversion of lr, the multiply and the
    subtraction: δW = u(3|W| + 2lr) + 4u64|W|. Where |c_ref| ≤ sign_margin the signs may
    differ (s ∈ {−1, 0, 1}), so δW gains 2·lr there: sign is discontinuous, no first-order
    bound exists.
    """
    u = unit_roundoff(dtype) + U64
    w0, g, m0 = (np.abs(np.asarray(a, dtype=np.float64)) for a in (weight, grad, exp_avg))
    margin = 4 * u * (m0 + g)
    d_w = u * (3 * w0 + 2 * lr) + 4 * U64 * w0 + np.where(np.abs(ref.interpolated) > margin, 0.0, 2 * lr)
    return {"weight": d_w, "exp_avg": margin, "sign_margin": margin}
