"""QK-clip tolerance: the fast in-place clip against ``ortho_ref.qk_clip`` (docs/tolerances.md, "QK-clip").

The fast clip (``ortho_fast.functional.qk_clip.qk_clip_``) computes, per row block, in the compute
dtype c (float32; float64 for float64 weights) from the same weight W and the same logits S as
the reference:

    γ̂ = fl(fl(τ) / S)                 τ to c, the division:  γ̂ = γ(1 + δ₀)(1 + δ₁), |δ₀|, |δ₁| ≤ u_c
    f̂ = fl(γ̂^a), a ∈ {α, 1 − α}       torch ``pow``:         f̂ = γ̂^a(1 + δ₂), |δ₂| ≤ POW_ULPS·u_c
    Ŵ' = round_w(fl(W·f̂))             product, then the weight's dtype w: (1 + δ₃)(1 + δ₄),
                                                             |δ₃| ≤ u_c, |δ₄| ≤ u_w (δ₄ = 0 when w = c)

so |Ŵ' − W·f| ≤ ((2a + POW_ULPS + 1)·u_c + u_w)·|W·f| to first order, with a ≤ 1; the float64
reference adds at most 3·u64 (the division, the power and the product). The bound is elementwise
and relative to the reference entry |W'_ref|, so the check is as sharp on small entries as on
large ones. Rows of heads at or below τ get the factor 1.0 exactly on both sides: their error is 0.
"""

from __future__ import annotations

from .roundoff import U64, unit_roundoff

__all__ = ["POW_ULPS", "QK_CLIP_FIRST_ORDER", "qk_clip_tolerance"]

#: ulps of torch's ``pow`` (float32): the C library's ``powf`` is correctly rounded to < 1 ulp
#: (glibc), CUDA's ``powf`` documents 2 ulp; the larger is taken.
POW_ULPS = 2
#: Roundings of the compute dtype in the chain above (2a ≤ 2 for τ and the division, the power's
#: POW_ULPS, the product). A head whose S is within a few u_c of τ may be clipped on one side
#: only; its γ is then within 2u_c of 1 and the same bound covers it.
QK_CLIP_FIRST_ORDER = 2 + POW_ULPS + 1


def qk_clip_tolerance(weight_dtype) -> float:
    """Elementwise relative tolerance max |W'_fast − W'_ref| / |W'_ref| of a QK-clip.

    weight_dtype: "float64" / "float32" / "bfloat16" / "float16" (or the torch dtype) of the
    weight; the compute dtype is float64 for float64 weights, float32 otherwise.
    Derivation: the module docstring; (QK_CLIP_FIRST_ORDER·u_c + u_w + 3·u64)·(1 + 1e-3) (the
    factor covers the second-order products of the δ's, below (6u_c)² relative).
    """
    u_w = unit_roundoff(weight_dtype)
    u_c = U64 if u_w == U64 else unit_roundoff("float32")
    return (QK_CLIP_FIRST_ORDER * u_c + (u_w if u_w > u_c else 0.0) + 3 * U64) * (1 + 1e-3)
