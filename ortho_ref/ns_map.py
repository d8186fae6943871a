"""The exact result of a Newton–Schulz schedule as a matrix map: U f(Σ̂) Vᵀ by the float64 SVD.

An odd polynomial step X <- aX + (bA + cA²)X with A = XXᵀ maps X = U Σ Vᵀ to
U p(Σ) Vᵀ with p(x) = a x + b x³ + c x⁵, so T steps after the normalization
X₀ = A / (s‖A‖_F + eps) give U f(Σ̂) Vᵀ with f = p_T ∘ … ∘ p_1 and Σ̂ = Σ / (s‖A‖_F + eps).
The scalar function f, its bands and gains live in ``ortho_ref.ns_polynomials`` (re-exported
here, where they were first defined); ``digits=`` dispatches to the mpmath tier ``ortho_ref.mp``.
Source: Amsel et al. 2025 (arXiv 2505.16932), Sec. 2; Higham, Functions of Matrices, ch. 8.
"""

from __future__ import annotations

import numpy as np

from . import mp
from ._validate import as_matrix
from .linalg import thin_svd
from .ns_bands import (  # noqa: F401  (re-exported: the scalar analysis of the map)
    ns_attracting_band,
    ns_band,
    ns_lipschitz,
    ns_step_gains,
    ns_step_magnitudes,
)
from .ns_polynomials import (  # noqa: F401  (re-exported: the scalar analysis of the map)
    EPS_MODES,
    check_normalization,
    check_ns_options,
    normalizer,
    ns_derivative,
    ns_diagonal_gain,
    ns_polynomial,
)

__all__ = [
    "EPS_MODES", "check_ns_options", "normalized_singular_values", "normalizer", "ns_attracting_band", "ns_band",
    "ns_derivative", "ns_diagonal_gain", "ns_lipschitz", "ns_map", "ns_polynomial", "ns_step_gains",
    "ns_step_magnitudes",
]


def normalized_singular_values(a, *, safety: float = 1.0, eps: float = 1e-7, eps_mode: str = "add") -> np.ndarray:
    """Σ̂ = σ(A) / normalizer(‖A‖_F), descending, float64, shape (min(m, n),).

    Raises: as ``ns_map`` for ``a``, ``safety``, ``eps`` and ``eps_mode``.
    """
    arr = as_matrix(a, "a")
    safety, eps = check_normalization(safety, eps, eps_mode)
    s = thin_svd(arr)[1]
    return s / normalizer(float(np.linalg.norm(arr)), safety, eps, eps_mode)


def ns_map(a, coefficients, *, safety: float = 1.0, eps: float = 1e-7, eps_mode: str = "add",
           digits: int | None = None) -> np.ndarray:
    """Exact result of a Newton–Schulz iteration: U f(Σ / (safety·‖A‖_F + eps)) Vᵀ.

    Shapes: a (m, n) float -> (m, n) float64; coefficients (T, 3) rows (a_t, b_t, c_t),
    one per step (``ortho_ref.coefficients.schedule`` builds them by name).
    ``eps_mode="clamp"`` divides by max(safety·‖A‖_F, eps) instead (torch.optim.Muon).
    With ``digits`` (an int in [16, 1000], m, n <= 64) the map is evaluated by mpmath at the
    float64 values of a, the table, safety and eps, and returned as an (m, n) object array of
    ``mpmath.mpf`` (``ortho_ref.mp.ns_map``).
    Source: polynomial view of NS, Amsel et al. 2025 (arXiv 2505.16932), Sec. 2.
    Raises: TypeError for non-float ``a``; ValueError if ``a`` is not 2-D, empty or not
    finite, if the table is not (T, 3), if safety <= 0 or eps < 0, for an unknown eps_mode;
    with ``digits``: TypeError for a non-integer, ValueError outside [16, 1000] or for m or n > 64.
    Contract: exact up to the float64 SVD (backward stable, LAPACK gesdd); the same for
    tall and wide inputs (the fast side transposes tall ones; the SVD needs no transpose).
    With ``digits``: within 10^-digits·max(1, max|f|) of the exact value in every entry.
    """
    arr = as_matrix(a, "a")
    table, safety, eps = check_ns_options(coefficients, safety, eps, eps_mode)
    if digits is not None:
        return mp.ns_map(arr, table, safety=safety, eps=eps, eps_mode=eps_mode, digits=digits)
    u, s, vt = thin_svd(arr)
    denom = normalizer(float(np.linalg.norm(arr)), safety, eps, eps_mode)
    if denom == 0.0:  # zero matrix with eps = 0: NS of 0 is 0
        return np.zeros_like(arr)
    return (u * ns_polynomial(s / denom, table)) @ vt
