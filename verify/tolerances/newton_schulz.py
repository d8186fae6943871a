"""Newton–Schulz tolerances: ``newton_schulz`` vs ``ns_map`` in float32 / float64 (Frobenius), the
per-direction singular-value tolerances of bfloat16, and the bands and gains they are computed from
(``ortho_ref.ns_step_gains``, ``ns_step_magnitudes``, ``ns_diagonal_gain``); docs/tolerances.md.
"""

from __future__ import annotations

import functools
import math

import numpy as np

import ortho_ref
from ortho_verify.tolerances.roundoff import C_NS, U64, UNIT_ROUNDOFF, unit_roundoff

__all__ = [
    "COEFFICIENT_REGISTRY_TOLERANCE", "ROUNDINGS_PER_STEP", "gains_and_sizes", "ns_singular_value_tolerance",
    "ns_singular_value_tolerances", "ns_tolerance",
]


#: Rounding points per Newton–Schulz step: A = XXᵀ, B = bA + cA², X ← aX + BX.
ROUNDINGS_PER_STEP = 3


def ns_tolerance(sigma_hat: np.ndarray, coefficients, shape: tuple[int, int], dtype) -> float:
    """Frobenius tolerance for ‖newton_schulz(G) − ns_map(G)‖_F in float32/float64.

        C_NS · √k · (1 + √d) · (u + u64) · (G_0 + Σ_{t=1}^{T} G_t · S_t)

    Derivation (first order). Write the computed iterate as X̃_t = X_t + E_t where E_t is the
    rounding committed at step t (t = 0: rounding of the input and its normalization).
    Step t forms A = XXᵀ, B = bA + cA², X ← aX + BX. Its products have inner dimension
    ≤ d, and by Higham & Mary's probabilistic bound each contributes ≲ λ√d·u relative to the
    sizes of its terms; the sums add u relative to the same sizes. The terms are not the
    result: they are |a_t|x + |b_t|x³ + |c_t|x⁵ per singular value x of the step input, and
    cancel (``ortho_ref.ns_step_magnitudes`` gives their sup S_t). So per singular direction
    E_t ≲ (1 + √d)·u·S_t, and over k directions ‖E_t‖_F ≲ λ√k(1 + √d)·u·S_t. To first order
    E_t reaches the output multiplied by the Fréchet derivative of the remaining steps,
    whose norm is at most G_t (``ortho_ref.ns_step_gains``, Daleckii–Krein divided
    differences over the step-t spectrum). The u64 term covers the oracle's own
    backward-stable SVD. This refines the c·u·L_f·√k of docs/design.md ("Tolerances"): G_0 is the sup over the actual
    spectrum's hull, at most ``ortho_ref.ns_lipschitz(table, 0, σ̂_max)`` ≤ L_f (mean value
    theorem; checked on every call, see ``gains_and_sizes``), the later steps' roundings are
    weighted by their own gains G_t, and the inner-dimension and
    cancellation factors are explicit (a 1 × 1 input exceeded the form without S_t: local
    step errors of 9–14u against ~2u modelled).
    Shapes: sigma_hat (k,) the normalized singular values; shape (m, n).
    """
    u = unit_roundoff(dtype)
    m, n = shape
    gains, sizes = gains_and_sizes(sigma_hat, coefficients)
    weighted = float(gains[0] + np.dot(gains[1:], sizes))
    return C_NS * math.sqrt(min(m, n)) * (1 + math.sqrt(max(m, n))) * (u + U64) * weighted


def gains_and_sizes(sigma_hat: np.ndarray, coefficients) -> tuple[np.ndarray, np.ndarray]:
    """``ns_step_gains`` (G_0..G_T) and ``ns_step_magnitudes`` (S_1..S_T) over the hull [lo, hi]
    of σ̂ (widened by a relative 1e-12 when all σ̂ are equal).

    Checked against ``ortho_ref.ns_lipschitz`` on every call: G_0 = sup over [lo, hi] of
    max(|f′(x)|, |f(x)/x|), and |f(x)/x| = |f′(ξ)| for some ξ ∈ (0, x) (mean value theorem,
    f(0) = 0), so ns_lipschitz(lo, hi) <= G_0 <= ns_lipschitz(0, hi), and the latter is at most
    the L_f = sup_[0,1] |f′| of docs/design.md ("Tolerances") when hi <= 1. The lower inequality is exact in floating
    point (G_0 maximizes over a superset of ns_lipschitz's points); the upper one is allowed a
    relative √u64 ≈ 1.5e-8, far above the float64 rounding of f′ and f(x)/x (≲ 10³·u64 with the
    registry's cancellation) and far below the 1e-2 by which a sampled sup missed it.
    Raises: RuntimeError if either fails (the oracle's sup missed a critical point).
    """
    s = np.asarray(sigma_hat, dtype=np.float64)
    lo, hi = float(max(s.min(), 0.0)), float(s.max())
    if hi <= lo:
        hi = lo * (1 + 1e-12) + 1e-300
    table = np.ascontiguousarray(np.asarray(coefficients, dtype=np.float64))
    gains, sizes = _gains_and_sizes(table.tobytes(), table.shape, lo, hi)
    return gains.copy(), sizes.copy()


@functools.lru_cache(maxsize=4096)
def _gains_and_sizes(table_bytes: bytes, shape: tuple, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """``gains_and_sizes`` on the hull [lo, hi], memoized on the exact table bytes and float64 ends: the
    Newton–Schulz rows of one input call it with the same σ̂ and schedule once per dtype and kernel
    (float64 / float32, plain / Gram), and the oracle's root search is most of a row's cost."""
    coefficients = np.frombuffer(table_bytes, dtype=np.float64).reshape(shape)
    gains = ortho_ref.ns_step_gains(coefficients, lo, hi)
    inner, outer = ortho_ref.ns_lipschitz(coefficients, lo, hi), ortho_ref.ns_lipschitz(coefficients, 0.0, hi)
    if not inner <= gains[0] <= outer * (1 + math.sqrt(U64)):
        raise RuntimeError(f"ns_step_gains: G_0 = {gains[0]!r} outside [ns_lipschitz(lo, hi), ns_lipschitz(0, hi)] = "
                           f"[{inner!r}, {outer!r}] on σ̂ ∈ [{lo!r}, {hi!r}]")
    return gains, ortho_ref.ns_step_magnitudes(coefficients, lo, hi)


def ns_singular_value_tolerance(sigma_hat: np.ndarray, coefficients, shape: tuple[int, int], dtype) -> float:
    """Tolerance for max_i |σ_i(newton_schulz(G)) − f(σ̂_i)| (sorted); the bfloat16 check.

    Derivation. In bfloat16 (and float16) the CPU and GPU matmuls accumulate in float32 and
    round each output once, so each of the ROUNDINGS_PER_STEP products perturbs the iterate
    by about u relative to its scale (≤ max x_t ≈ 1); in float32/float64 the accumulation is
    in the same precision and adds the probabilistic √d of Higham & Mary (2019). To first order a perturbation E of a simple
    singular value moves it by uᵢᵀEvᵢ (Stewart & Sun 1990, ch. V), and that displacement of
    x_t is carried to the output by |∂x_T/∂x_t| along the exact trajectory. Summing over
    the input rounding and the T steps gives ``ortho_ref.ns_diagonal_gain``; with
    rho = ROUNDINGS_PER_STEP·a·(u + u64) (a = 1 or √d, above) the tolerance is
    rho·max_i sup_{|x − σ̂ᵢ| ≤ rho} gain(x) — the sup over the rounding neighbourhood makes
    the first-order estimate a mean-value one. Sorting both sides is
    justified by Weyl's inequality for the sorted singular values.
    This is a first-order model, not a rigorous bound; it is only informative where it is
    below the width of the band (well-conditioned inputs) — the check reports it regardless.
    """
    return float(np.max(ns_singular_value_tolerances(sigma_hat, coefficients, shape, dtype)))


def ns_singular_value_tolerances(sigma_hat: np.ndarray, coefficients, shape: tuple[int, int], dtype) -> np.ndarray:
    """Per-direction tolerances τ_i = rho·sup_{|x − σ̂ᵢ| ≤ rho} gain(x) (see
    ``ns_singular_value_tolerance``, whose value is their maximum).

    Used directly for |uᵢᵀ X_fast vᵢ − f(σ̂ᵢ)| with uᵢ, vᵢ the exact singular vectors of
    the input: to first order that projection is the i-th singular value of X_fast
    (Stewart & Sun 1990, ch. V), so each direction gets its own tolerance and the
    well-resolved directions of an ill-conditioned input keep a sharp check.
    Shapes: sigma_hat (k,) -> (k,) float64.
    """
    u = unit_roundoff(dtype)
    accumulation = 1.0 if u > UNIT_ROUNDOFF["float32"] else math.sqrt(max(shape))
    rho = ROUNDINGS_PER_STEP * accumulation * (u + U64)
    # Mean-value form: the gain's sup over each σ̂ᵢ ± rho, not its value at σ̂ᵢ — the steep
    # schedules' gains oscillate within one bf16 rounding of x ≈ 1 (a point value was
    # measured to be exceeded: polar_express_paper, a 3 × 1 input at σ̂ = 0.99).
    x = np.asarray(sigma_hat, dtype=np.float64)[:, None] + rho * np.linspace(-1.0, 1.0, 33)[None, :]
    gain = ortho_ref.ns_diagonal_gain(np.clip(x, 0.0, None), coefficients)
    return rho * np.max(gain, axis=1)


#: Two transcriptions of the same decimal literals must give the same float64 bits.
COEFFICIENT_REGISTRY_TOLERANCE = 0.0
