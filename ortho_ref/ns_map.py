"""The exact result of a Newton–Schulz schedule as a matrix map: U f(Σ̂) Vᵀ by the float64 SVD.

An odd polynomial step X <- aX + (bA + cA²)X with A = XXᵀ maps X = U Σ Vᵀ to
U p(Σ) Vᵀ with p(x) = a x + b x³ + c x⁵, so T steps after the normalization
X₀ = A / (s‖A‖_F + eps) give U f(Σ̂) Vᵀ with f = p_T ∘ … ∘ p_1 and Σ̂ = Σ / (s‖A‖_F + eps).
The scalar function f lives in ``ortho_ref.ns_polynomials``, its bands and gains in
``ortho_ref.ns_bands`` (both re-exported here); ``digits=`` dispatches to the mpmath tier ``ortho_ref.mp``.
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
    """Singular values of the Newton–Schulz input after the normalization: σ̂ = σ(A) / d.

    d = safety·‖A‖_F + eps ("add") or max(safety·‖A‖_F, eps) ("clamp"), as in ``ns_map``; these are
    the arguments of the scalar map f that ``ns_map`` applies (docs/math.md, §2.1).

    Parameters
    ----------
    a : (m, n) array_like of float16, float32 or float64
        The matrix; m, n >= 1, finite.
    safety : float, default 1.0
        Multiplies ‖A‖_F; > 0 (Polar Express as used by microsoft/dion uses 1.02).
    eps : float, default 1e-7
        Added to (or the floor of) the scaled norm, in the units of `a`; >= 0.
    eps_mode : {"add", "clamp"}, default "add"
        "add": Keller Jordan's Muon, microsoft/dion, nanochat; "clamp": torch.optim.Muon.

    Returns
    -------
    (min(m, n),) float64 ndarray
        σ̂ in descending order, dimensionless; in [0, 1/safety].

    Raises
    ------
    TypeError
        If `a` has a non-float dtype.
    ValueError
        If `a` is not 2-D, is empty or holds NaN or Inf, if `safety` <= 0, `eps` < 0, or `eps_mode`
        is not "add" or "clamp".

    References
    ----------
    K. Jordan et al., "Muon: An optimizer for hidden layers in neural networks", blog post, 2024,
    and KellerJordan/Muon ``zeropower_via_newtonschulz5`` (X / (‖X‖_F + 1e-7)); ``torch.optim.Muon``
    (the clamp).

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import normalized_singular_values
    >>> normalized_singular_values(np.diag([3.0, 4.0]), eps=0.0).tolist()
    [0.8, 0.6]
    """
    arr = as_matrix(a, "a")
    safety, eps = check_normalization(safety, eps, eps_mode)
    s = thin_svd(arr)[1]
    return s / normalizer(float(np.linalg.norm(arr)), safety, eps, eps_mode)


def ns_map(a, coefficients, *, safety: float = 1.0, eps: float = 1e-7, eps_mode: str = "add",
           digits: int | None = None) -> np.ndarray:
    """Exact result of a Newton–Schulz iteration: U f(Σ / d) Vᵀ for A = U Σ Vᵀ.

    A step X ← a X + (b S + c S²) X with S = X Xᵀ maps the singular values by p(x) = a x + b x³ + c x⁵
    and keeps the singular vectors, so T steps from X₀ = A / d give U f(Σ / d) Vᵀ with
    f = p_T ∘ … ∘ p_1 and d = safety·‖A‖_F + eps ("add") or max(safety·‖A‖_F, eps) ("clamp").
    This computes it from the float64 SVD (docs/math.md, §2.3). The result is not the polar factor:
    jordan×5 leaves σ̂ ∈ [1e-3, 1] anywhere in [0.47, 1.20] (``ns_band``).

    Parameters
    ----------
    a : (m, n) array_like of float16, float32 or float64
        The matrix; m, n >= 1, finite. Tall and wide inputs are treated alike.
    coefficients : (T, 3) array_like of float
        Rows (a_t, b_t, c_t), one per step (``schedule`` builds them by name), or one (3,) row; its
        map must stay within ``NS_MAP_BOUND`` (``check_bounded_schedule``).
    safety : float, default 1.0
        Multiplies ‖A‖_F; > 0 (1.02 for Polar Express as used by microsoft/dion and nanochat).
    eps : float, default 1e-7
        Added to (or the floor of) the scaled norm, in the units of `a`; >= 0.
    eps_mode : {"add", "clamp"}, default "add"
        "add": Keller Jordan's Muon, microsoft/dion, nanochat; "clamp": torch.optim.Muon.
    digits : int, optional
        Default None: float64. An int in [16, 1000] (and m, n <= 64): evaluated by mpmath
        (``ortho_ref.mp.ns_map``) at the float64 values of `a`, the table, `safety` and `eps`.

    Returns
    -------
    (m, n) float64 ndarray or (m, n) object ndarray of mpmath.mpf
        The map, dimensionless; exact up to the backward-stable float64 SVD (LAPACK gesdd), or with
        `digits` within 10^-digits·max(1, max|f|) of the exact value in every entry. A zero `a`
        with `eps` = 0 gives zeros.

    Raises
    ------
    TypeError
        If `a` has a non-float dtype, or `digits` is not an integer.
    ValueError
        If `a` is not 2-D, is empty or holds NaN or Inf; if `coefficients` is not (T, 3), not finite
        or divergent; if `safety` <= 0, `eps` < 0 or `eps_mode` is unknown; with `digits`, if it is
        outside [16, 1000] or m or n exceeds 64.

    References
    ----------
    N. Amsel, D. Persson, C. Musco, R. M. Gower, "The Polar Express: Optimal Matrix Sign Methods and
    Their Application to the Muon Algorithm", arXiv 2505.16932, 2025, Sec. 2 (the polynomial view);
    K. Jordan et al., "Muon", blog post, 2024, and KellerJordan/Muon ``zeropower_via_newtonschulz5``
    (the iteration); N. J. Higham, Functions of Matrices, SIAM, 2008, ch. 8.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import ns_map, ns_polynomial, schedule
    >>> table = schedule("jordan")
    >>> a = np.diag([0.6, 0.8])
    >>> x = ns_map(a, table, eps=0.0)
    >>> bool(np.allclose(x, np.diag(ns_polynomial([0.6, 0.8], table))))
    True
    >>> y = a / np.linalg.norm(a)
    >>> for a_t, b_t, c_t in table:
    ...     s = y @ y.T
    ...     y = a_t * y + (b_t * s + c_t * s @ s) @ y
    >>> bool(np.allclose(x, y))
    True
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
