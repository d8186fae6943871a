"""Unit roundoffs and the rounding models every tolerance of ``ortho_verify.tolerances`` builds on.

Notation: u = unit roundoff of the compute dtype (2⁻⁵³ float64, 2⁻²⁴ float32, 2⁻⁸ bfloat16,
2⁻¹¹ float16), u64 = 2⁻⁵³ (the float64 oracle), k = min(m, n), d = max(m, n).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["C_NS", "U64", "UNIT_ROUNDOFF", "condition_number", "factor_roundoff", "matmul_roundoff", "unit_roundoff"]


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


def unit_roundoff(dtype) -> float:
    """u for a dtype given as a torch/numpy dtype or its name; ValueError if unknown."""
    name = str(dtype).replace("torch.", "").replace("numpy.", "")
    if name not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype: expected one of {sorted(UNIT_ROUNDOFF)}, got {dtype!r}")
    return UNIT_ROUNDOFF[name]


def factor_roundoff(dtype) -> float:
    """u_f + u64: QR and Cholesky run in float32 for bfloat16 / float16, else in the dtype."""
    return min(unit_roundoff(dtype), UNIT_ROUNDOFF["float32"]) + U64


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
