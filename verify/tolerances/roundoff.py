"""Unit roundoffs and the rounding models every tolerance of ``ortho_verify.tolerances`` builds on.

Notation: u = unit roundoff of the compute dtype (2⁻⁵³ float64, 2⁻²⁴ float32, 2⁻⁸ bfloat16,
2⁻¹¹ float16), u64 = 2⁻⁵³ (the float64 oracle), k = min(m, n), d = max(m, n).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["C_NS", "COMPUTE_PRECISIONS", "PER_DIRECTION_PRECISIONS", "TF32_UNIT_ROUNDOFF", "U64", "UNIT_ROUNDOFF",
           "compute_precision", "condition_number", "factor_roundoff", "matmul_roundoff", "operand_roundings",
           "scaled_sum_bound", "unit_roundoff"]


U64 = 2.0**-53

UNIT_ROUNDOFF = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "bfloat16": 2.0**-8,
    "float16": 2.0**-11,
}

#: Probabilistic constant λ of Higham & Mary (2019), "A new approach to probabilistic
#: rounding error analysis", Thm. 3.1: an inner product of length d in precision u has
#: error ≤ λ·√d·u·|x|ᵀ|y| with probability ≥ 1 − 2exp(−λ²(1−u)²/2). A Frobenius norm sums
#: k·d such independent errors, so it concentrates at its root-mean-square, ≈ √d·u per unit
#: of norm; λ = 2 allows two standard deviations above it.
C_NS = 2.0


#: TF32, NVIDIA's float32 matmul mode of Ampere and later GPUs (``torch.set_float32_matmul_precision("high")``,
#: Emerging-Optimizers' ``fp32_matmul_prec="high"``): float32 storage, each product's *operands*
#: rounded to a 10-bit significand (unit roundoff 2⁻¹¹, float16's), the products accumulated and
#: stored in float32. Not a storage dtype: it is named "tf32" (or "high") only as a compute precision.
TF32_UNIT_ROUNDOFF = 2.0**-11

#: The compute precisions the Newton–Schulz checks model: the storage dtypes and "tf32".
COMPUTE_PRECISIONS = ("float64", "float32", "tf32", "bfloat16", "float16")
#: Compute precisions judged per singular direction (their u is too coarse for a Frobenius
#: comparison with ``ns_map`` to be informative): ``compare_ns_output``'s low-precision rows.
PER_DIRECTION_PRECISIONS = ("bfloat16", "float16", "tf32")


def compute_precision(name) -> str:
    """The canonical compute-precision name: a torch dtype or dtype name of ``UNIT_ROUNDOFF``, or
    "tf32" / "high" (-> "tf32"); ValueError naming dtype otherwise."""
    text = str(name).replace("torch.", "").replace("numpy.", "")
    if text in ("tf32", "high"):
        return "tf32"
    if text not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype: expected one of {list(COMPUTE_PRECISIONS)} (or 'high' for tf32), got {name!r}")
    return text


def operand_roundings(dtype) -> int:
    """Roundings of one matrix product that reach its result at the unit roundoff u: 1 for a storage
    dtype (the result is rounded once; bfloat16 / float16 accumulate in float32, float32 / float64
    in their own precision, counted apart as √d·u), 2 for TF32 (both operands are rounded to
    10 bits before the float32 products: fl(AB) = (A + ΔA)(B + ΔB), |ΔA| ≤ u|A|, |ΔB| ≤ u|B|)."""
    return 2 if compute_precision(dtype) == "tf32" else 1


def unit_roundoff(dtype) -> float:
    """u for a dtype given as a torch/numpy dtype or its name ("tf32" / "high": 2⁻¹¹, TF32's
    product operands); ValueError if unknown."""
    name = str(dtype).replace("torch.", "").replace("numpy.", "")
    if name in ("tf32", "high"):
        return TF32_UNIT_ROUNDOFF
    if name not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype: expected one of {sorted(UNIT_ROUNDOFF)}, got {dtype!r}")
    return UNIT_ROUNDOFF[name]


def factor_roundoff(dtype) -> float:
    """u_f + u64: QR and Cholesky run in float32 for bfloat16 / float16, else in the dtype."""
    return min(unit_roundoff(dtype), UNIT_ROUNDOFF["float32"]) + U64


def scaled_sum_bound(exact_abs, m_abs, kz_abs, dtype):
    """Entrywise bound on |fl(M + k·Z) − (M + k·Z)| for a sum formed with k and the arithmetic in
    float32 (or wider, for float64) and rounded once to ``dtype``:

        u·|M + k·Z| + 3u_c·(|M| + |k·Z|),   u = unit_roundoff(dtype), u_c its compute precision's

    Derivation: k rounded to the compute precision, k·Z and the sum each add one relative rounding
    u_c of what they form ((1 + u_c)³ − 1 < 3u_c(1 + u_c) of |M| + |k·Z|, the (1 + u_c) absorbed
    for u_c ≤ 2⁻²⁴ since the bound then holds with (1 + u)(1 + u_c) rounded up), then the cast to
    ``dtype`` one rounding u of the result. torch's CPU ``add(M, Z, alpha=k)`` on float16 /
    bfloat16 tensors rounds k to the tensor's dtype instead: a relative error up to u in k, the
    same in every entry, outside this bound. Arguments: numpy arrays or tensors (float64)."""
    u, uc = unit_roundoff(dtype), min(unit_roundoff(dtype), UNIT_ROUNDOFF["float32"])
    return (u + 2 * U64) * exact_abs + 3 * uc * (1 + u) * (m_abs + kz_abs)


def matmul_roundoff(dtype, inner: int) -> float:
    """ε with ‖fl(AB) − AB‖_F ≤ ε·‖A‖_F‖B‖_F for an inner dimension ``inner``.

    One rounding of each output (u) plus the accumulation, in float32 for bfloat16 / float16
    matmuls (CPU and GPU) or in the dtype itself, with Higham & Mary's probabilistic factor
    C_NS·√inner; entrywise |fl(AB) − AB| ≤ ε|A||B| and ‖|A||B|‖_F ≤ ‖A‖_F‖B‖_F.
    """
    return unit_roundoff(dtype) + C_NS * math.sqrt(inner) * min(unit_roundoff(dtype), UNIT_ROUNDOFF["float32"]) + U64


def condition_number(a: np.ndarray) -> float:
    """κ₂(a) = σ_max/σ_min of a matrix (LAPACK SVD, float64); inf if σ_min = 0."""
    sv = np.linalg.svd(a, compute_uv=False)
    return float(sv[0] / sv[-1]) if sv[-1] > 0 else math.inf
