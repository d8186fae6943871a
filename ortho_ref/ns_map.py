"""The exact result of a Newton–Schulz schedule, as a function of the singular values.

An odd polynomial step X <- aX + (bA + cA²)X with A = XXᵀ maps X = U Σ Vᵀ to
U p(Σ) Vᵀ with p(x) = a x + b x³ + c x⁵, so T steps after the normalization
X₀ = A / (s‖A‖_F + eps) give U f(Σ̂) Vᵀ with f = p_T ∘ … ∘ p_1 and Σ̂ = Σ / (s‖A‖_F + eps).
Source: Amsel et al. 2025 (arXiv 2505.16932), Sec. 2; Higham, Functions of Matrices, ch. 8.
"""

from __future__ import annotations

import numpy as np
import scipy.optimize

from ._validate import as_coefficients, as_matrix, check_scalar
from .polar import _svd

EPS_MODES = ("add", "clamp")


def ns_polynomial(x, coefficients) -> np.ndarray:
    """f(x) = p_T(…p_1(x)), p_t(x) = a_t x + b_t x³ + c_t x⁵, elementwise in float64.

    Shapes: x (...) float -> (...) float64; coefficients (T, 3).
    Raises: ValueError for a malformed coefficient table.
    """
    table = as_coefficients(coefficients)
    y = np.asarray(x, dtype=np.float64)
    for a, b, c in table:
        y2 = y * y
        y = y * (a + y2 * (b + c * y2))
    return y


def _trajectory(x: np.ndarray, table: np.ndarray):
    """Points x_0..x_T, first and second derivatives p_t', p_t'' at x_{t-1}."""
    xs = [x]
    d1, d2 = [], []
    for a, b, c in table:
        y = xs[-1]
        y2 = y * y
        d1.append(a + y2 * (3 * b + 5 * c * y2))
        d2.append(y * (6 * b + 20 * c * y2))
        xs.append(y * (a + y2 * (b + c * y2)))
    return xs, d1, d2


def ns_derivative(x, coefficients, order: int = 1) -> np.ndarray:
    """f′(x) (order=1) or f″(x) (order=2) of the composed schedule, by the chain rule.

    Shapes: x (...) float -> (...) float64.
    Raises: ValueError for order not in (1, 2) or a malformed table.
    """
    if order not in (1, 2):
        raise ValueError(f"order: expected 1 or 2, got {order!r}")
    table = as_coefficients(coefficients)
    xs, d1, d2 = _trajectory(np.asarray(x, dtype=np.float64), table)
    g1 = np.ones_like(xs[0])
    g2 = np.zeros_like(xs[0])
    for p1, p2 in zip(d1, d2):
        g2 = p2 * g1 * g1 + p1 * g2
        g1 = p1 * g1
    return g1 if order == 1 else g2


def normalizer(norm: float, safety: float, eps: float, eps_mode: str) -> float:
    """The scalar the input is divided by: s·‖A‖_F + eps ("add") or max(s·‖A‖_F, eps) ("clamp").

    "add": Keller Jordan's Muon, microsoft/dion, nanochat. "clamp": torch.optim.Muon.
    Raises: ValueError for an unknown ``eps_mode``.
    """
    if eps_mode == "add":
        return safety * norm + eps
    if eps_mode == "clamp":
        return max(safety * norm, eps)
    raise ValueError(f"eps_mode: expected one of {EPS_MODES}, got {eps_mode!r}")


def normalized_singular_values(a, *, safety: float = 1.0, eps: float = 1e-7, eps_mode: str = "add") -> np.ndarray:
    """Σ̂ = σ(A) / normalizer(‖A‖_F), descending, float64, shape (min(m, n),).

    Raises: as ``ns_map``.
    """
    arr = as_matrix(a, "a")
    s = _svd(arr)[1]
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
    table = as_coefficients(coefficients)
    safety = check_scalar(safety, "safety", low=0.0, low_open=True)
    eps = check_scalar(eps, "eps", low=0.0)
    if eps_mode not in EPS_MODES:
        raise ValueError(f"eps_mode: expected one of {EPS_MODES}, got {eps_mode!r}")
    if digits is not None:
        from .mp import ns_map as mp_ns_map

        return mp_ns_map(arr, table, safety=safety, eps=eps, eps_mode=eps_mode, digits=digits)
    u, s, vt = _svd(arr)
    denom = normalizer(float(np.linalg.norm(arr)), safety, eps, eps_mode)
    if denom == 0.0:  # zero matrix with eps = 0: NS of 0 is 0
        return np.zeros_like(arr)
    return (u * ns_polynomial(s / denom, table)) @ vt


def _grid(lo: float, hi: float, n: int = 20001) -> np.ndarray:
    """Dense grid on [lo, hi]: linear plus geometric points (resolves the region near 0)."""
    pts = [np.linspace(lo, hi, n)]
    if lo > 0:
        pts.append(np.geomspace(lo, hi, n))
    else:
        pts.append(np.geomspace(max(hi * 1e-12, np.finfo(float).tiny), hi, n))
    return np.unique(np.concatenate(pts))


def _critical_points(g, lo: float, hi: float) -> np.ndarray:
    """Roots of g on [lo, hi] located by sign changes on a dense grid, refined by Brent's method."""
    x = _grid(lo, hi)
    v = g(x)
    idx = np.nonzero(np.sign(v[:-1]) * np.sign(v[1:]) < 0)[0]
    roots = [scipy.optimize.brentq(g, x[i], x[i + 1], xtol=1e-15, rtol=4 * np.finfo(float).eps) for i in idx]
    roots += list(x[np.nonzero(v == 0)[0]])
    return np.array(sorted(roots), dtype=np.float64)


def _check_interval(lo, hi) -> tuple[float, float]:
    lo = check_scalar(lo, "lo", low=0.0)
    hi = check_scalar(hi, "hi", low=0.0)
    if not lo < hi:
        raise ValueError(f"lo, hi: expected 0 <= lo < hi, got lo={lo}, hi={hi}")
    return lo, hi


def ns_band(coefficients, lo: float, hi: float) -> tuple[float, float]:
    """The exact range [min f, max f] of the composed schedule on [lo, hi].

    Computed from the endpoints and the critical points of f (roots of f′ located on a
    dense grid and refined by Brent's method), not sampled.
    Shapes: scalars -> (float, float). Units: singular values of the normalized input.
    Source: DESIGN.md "Exact-arithmetic output bands".
    Raises: ValueError unless 0 <= lo < hi, or for a malformed table.
    """
    table = as_coefficients(coefficients)
    lo, hi = _check_interval(lo, hi)
    pts = np.concatenate([[lo, hi], _critical_points(lambda x: ns_derivative(x, table), lo, hi)])
    vals = ns_polynomial(pts, table)
    return float(vals.min()), float(vals.max())


def ns_lipschitz(coefficients, lo: float = 0.0, hi: float = 1.0) -> float:
    """sup |f′| on [lo, hi], from the endpoints and the roots of f″.

    Shapes: -> float. jordan×5 on [0, 1]: 3.4445⁵ ≈ 485 (at 0).
    Raises: ValueError unless 0 <= lo < hi, or for a malformed table.
    """
    table = as_coefficients(coefficients)
    lo, hi = _check_interval(lo, hi)
    pts = np.concatenate([[lo, hi], _critical_points(lambda x: ns_derivative(x, table, 2), lo, hi)])
    return float(np.max(np.abs(ns_derivative(pts, table))))


def ns_step_gains(coefficients, lo: float, hi: float) -> np.ndarray:
    """First-order gains G_0..G_T of the Newton–Schulz map for inputs with σ̂ in [lo, hi].

    G_t bounds the Fréchet derivative (in the Frobenius norm) of the remaining map
    g_t = p_T ∘ … ∘ p_{t+1} at the step-t iterate X_t, whose singular values are
    x_t = p_t(…p_1(σ̂)). For a singular-value function g the Fréchet derivative acts on the
    (i, j) entry of a perturbation (in the singular-vector basis) by the divided differences
    (g(x_i) − g(x_j))/(x_i − x_j) and (g(x_i) + g(x_j))/(x_i + x_j), and on the null-space
    part by g(x_i)/x_i (Daleckii–Krein; Higham, Functions of Matrices, Thm. 3.11 and
    Sec. 8.1), all bounded by sup over the spectrum's hull of max(|g′(x)|, |g(x)/x|).
    G_T = 1 (the last rounding is not amplified). G_0 is the gain for the input rounding.

    Shapes: -> (T + 1,) float64. Computed on a dense grid of σ̂ with a 1 % margin; ``lo = 0``
    (rank-deficient or unknown spectrum) gives G_0 = sup|f′| on [0, hi].
    Raises: ValueError unless 0 <= lo < hi, or for a malformed table.
    """
    table = as_coefficients(coefficients)
    lo, hi = _check_interval(lo, hi)
    xs, _, _ = _trajectory(_grid(lo, hi, 4001), table)
    gains = np.ones(len(table) + 1)
    for t in range(len(table)):
        rest = table[t:]
        # The step-t spectrum fills the interval [min x_t, max x_t] (image of [lo, hi]).
        lo_t, hi_t = float(np.min(np.abs(xs[t]))), float(np.max(np.abs(xs[t])))
        x = np.concatenate([np.abs(xs[t]), np.linspace(lo_t, hi_t, 4001)])
        deriv = np.abs(ns_derivative(x, rest))
        pos = x[x > 0]
        ratio = np.abs(ns_polynomial(pos, rest) / pos)
        ratio0 = abs(float(np.prod(rest[:, 0]))) if lo_t == 0.0 else 0.0  # lim g(x)/x at 0 = g'(0)
        gains[t] = 1.01 * max(float(deriv.max()), float(ratio.max(initial=0.0)), ratio0)
    return gains


def ns_diagonal_gain(x, coefficients) -> np.ndarray:
    """Σ_{t=0}^{T} |∂x_T/∂x_t| along the exact trajectory x_t = p_t(…p_1(x)), elementwise.

    First-order gain of one singular value: a perturbation δ of the step-t iterate's
    i-th singular value (for a simple singular value δ = uᵢᵀ E vᵢ to first order; Stewart &
    Sun, Matrix Perturbation Theory, 1990, ch. V) moves the output's i-th singular value by
    |∂x_T/∂x_t|·δ;
    summing over the input rounding (t = 0) and the T steps gives this gain (t = T counts 1).
    Shapes: x (...) float -> (...) float64.
    Raises: ValueError for a malformed table.
    """
    table = as_coefficients(coefficients)
    _, d1, _ = _trajectory(np.asarray(x, dtype=np.float64), table)
    run = np.ones_like(np.asarray(x, dtype=np.float64))
    total = run.copy()
    for p1 in reversed(d1):
        run = run * np.abs(p1)
        total = total + run
    return total


def ns_step_magnitudes(coefficients, lo: float, hi: float) -> np.ndarray:
    """S_t = sup (|a_t|x + |b_t|x³ + |c_t|x⁵) over the step-t input spectrum, t = 1..T.

    The rounding committed while evaluating step t is relative to the sizes of its terms
    (aX, bA X, cA² X), not to their sum, which cancels: for polar_express step 1 at x = 1 the
    terms are ~47 times the result. With σ̂ in [lo, hi] the step-t input spectrum is the image
    of [lo, hi] under p_{t−1} ∘ … ∘ p_1 (a dense grid of σ̂ covers it).
    Shapes: -> (T,) float64.
    Raises: ValueError unless 0 <= lo < hi, or for a malformed table.
    """
    table = as_coefficients(coefficients)
    lo, hi = _check_interval(lo, hi)
    xs, _, _ = _trajectory(_grid(lo, hi, 4001), table)
    out = np.empty(len(table))
    for t, (a, b, c) in enumerate(np.abs(table)):
        x = np.abs(xs[t])
        out[t] = float(np.max(x * (a + x * x * (b + c * x * x))))
    return out
