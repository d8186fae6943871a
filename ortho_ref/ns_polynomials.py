"""The scalar side of Newton–Schulz: step polynomials, their composition and derivatives.

An odd polynomial step X <- aX + (bA + cA²)X with A = XXᵀ maps X = U Σ Vᵀ to
U p(Σ) Vᵀ with p(x) = a x + b x³ + c x⁵, so T steps after the normalization
X₀ = A / (s‖A‖_F + eps) give U f(Σ̂) Vᵀ with f = p_T ∘ … ∘ p_1 and Σ̂ = Σ / (s‖A‖_F + eps).
This module holds f as a function of one real variable (and the validation of a schedule and its
normalization); its exact bands and gains are ``ortho_ref.ns_bands``; the matrix map U f(Σ̂) Vᵀ is
``ortho_ref.ns_map``, which imports both modules, as does the mpmath tier ``ortho_ref.mp`` (docs/design.md, "Layers and
import rules": the scalar analysis sits below both, so neither imports the other's module).
Source: Amsel et al. 2025 (arXiv 2505.16932), Sec. 2; Higham, Functions of Matrices, ch. 8.
"""

from __future__ import annotations

import math

import numpy as np

from ._validate import as_coefficients, check_scalar

__all__ = [
    "EPS_MODES", "NS_MAP_BOUND", "check_bounded_schedule", "check_normalization", "check_ns_options", "ns_map_sups",
    "normalizer", "ns_derivative", "ns_diagonal_gain", "ns_polynomial",
]

EPS_MODES = ("add", "clamp")

#: The largest sup over σ̂ ∈ [0, 1] of |f_t(σ̂)| (the map after step t) a schedule may reach. Newton–
#: Schulz maps singular values towards 1: the registered schedules stay below 2 (Keller Jordan's
#: overshoot 1.202, Polar Express's first step 1.992); a map past 16 orthogonalizes nothing, and the
#: next step's A² = (XXᵀ)² then has singular values past 16⁴ = 65536, beyond float16's largest finite
#: number (65504), the narrowest dtype the product computes in. A divergent table (its map grows
#: without bound, e.g. a sign flipped) passes it within a few steps, where finite inputs give Inf / NaN.
NS_MAP_BOUND = 16.0


def _sup_on(row, h: float) -> float:
    """sup over x ∈ [0, h] of |p(x)|, p(x) = a x + b x³ + c x⁵: at x = h and at the critical points
    x² = y, 5c y² + 3b y + a = 0 (closed form), inside."""
    a, b, c = (float(v) for v in row)
    qa, qb, qc = 5 * c, 3 * b, a  # qa y² + qb y + qc = 0, solved without cancellation
    if qa == 0.0:
        ys = [-qc / qb] if qb != 0.0 else []
    else:
        disc = qb * qb - 4 * qa * qc
        q = -(qb + math.copysign(math.sqrt(disc), qb)) / 2 if disc >= 0.0 else 0.0
        ys = [] if disc < 0.0 else [q / qa] + ([qc / q] if q != 0.0 else [])
    pts = [h] + [math.sqrt(y) for y in ys if 0.0 <= y <= h * h]
    return max(abs(x * (a + x * x * (b + c * x * x))) for x in pts)


def ns_map_sups(coefficients, bound: float = math.inf) -> list[float]:
    """B_t = sup over σ̂ ∈ [0, 1] of |f_t(σ̂)|, f_t the composition of the first t steps, t = 1..T,
    exactly: B_t = sup over [0, B_{t−1}] of |p_t| (f_{t−1}([0, 1]) is an interval holding 0 and
    ±B_{t−1}, and p_t is odd), B_0 = 1. Stops after the first B_t past ``bound`` (or not a number).
    Shapes: coefficients (T, 3) -> list of up to T floats.
    Source: Amsel et al. 2025 (arXiv 2505.16932), Sec. 2 (the polynomial view)."""
    table = as_coefficients(coefficients)
    sups, h = [], 1.0
    for row in table:
        with np.errstate(over="ignore", invalid="ignore"):
            h = _sup_on(row, h)
        sups.append(h)
        if not h <= bound:
            break
    return sups


def check_bounded_schedule(coefficients, name: str = "coefficients") -> np.ndarray:
    """The (T, 3) float64 table of ``coefficients`` if its map stays within ``NS_MAP_BOUND`` on [0, 1]
    at every step (``ns_map_sups``); Keller Jordan's overshoot (1.202) and every registered schedule do.
    Raises: ValueError naming ``name``, the table and the first step t whose sup |f_t| on [0, 1]
    passes the bound (a divergent schedule: finite inputs give Inf / NaN)."""
    table = as_coefficients(coefficients, name)
    sups = ns_map_sups(table, NS_MAP_BOUND)
    if sups and not sups[-1] <= NS_MAP_BOUND:
        t = len(sups)
        row = tuple(float(v) for v in table[t - 1])
        raise ValueError(f"{name}: a divergent schedule: after step {t} of {len(table)} (row {row}) "
                         f"the map's sup over σ̂ ∈ [0, 1] is {sups[-1]:.3g} > {NS_MAP_BOUND:g} (NS_MAP_BOUND; the "
                         f"steps before: {[round(v, 3) for v in sups[:-1]]}): it grows without bound, so finite "
                         f"inputs give Inf / NaN; table {table.tolist()}")
    return table


def ns_polynomial(x, coefficients) -> np.ndarray:
    """f(x) = p_T(…p_1(x)), p_t(x) = a_t x + b_t x³ + c_t x⁵, elementwise in float64.

    Each step is evaluated as x·(a + x²(b + c x²)) (Horner in x²). f maps the normalized
    singular values σ̂ of the Newton–Schulz input to those of its output (``ns_map``).
    Shapes: x (...) float -> (...) float64; coefficients (T, 3) rows (a_t, b_t, c_t) or one (3,) row.
    Source: the polynomial view of Newton–Schulz, Amsel et al. 2025 (arXiv 2505.16932), Sec. 2
    (p_t and their composition); Higham, Functions of Matrices (2008), ch. 8.
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

    Along the trajectory x_t = p_t(x_{t−1}): f′ = Π_t p_t′(x_{t−1}) and
    f″ = Σ_t p_t″(x_{t−1})·(Π_{s<t} p_s′(x_{s−1}))²·Π_{s>t} p_s′(x_{s−1}), accumulated forward
    as g₂ ← p_t″·g₁² + p_t′·g₂, g₁ ← p_t′·g₁ (Faà di Bruno for a composition), with
    p_t′ = a_t + 3b_t x² + 5c_t x⁴ and p_t″ = 6b_t x + 20c_t x³.
    Shapes: x (...) float -> (...) float64; coefficients (T, 3) or one (3,) row.
    Source: Amsel et al. 2025 (arXiv 2505.16932), Sec. 2 (f as a composition of the p_t);
    f′(0) = Π a_t is the L_f of docs/design.md, "Tolerances", for the registry schedules.
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


def check_ns_options(coefficients, safety, eps, eps_mode) -> tuple[np.ndarray, float, float]:
    """Validate ``ns_map``'s schedule and normalization: (float64 (T, 3) table, safety, eps).

    Raises: ValueError naming the argument: a table not (T, 3) or not finite or divergent
    (``check_bounded_schedule``), safety <= 0 or not a number (a string too), eps < 0, eps_mode
    not in EPS_MODES.
    """
    table = check_bounded_schedule(coefficients)
    return (table, *check_normalization(safety, eps, eps_mode))


def check_normalization(safety, eps, eps_mode) -> tuple[float, float]:
    """(safety, eps) as floats, validated: safety > 0, eps >= 0 (finite real numbers, not strings),
    eps_mode in EPS_MODES. Raises: ValueError naming ``safety``, ``eps`` or ``eps_mode``."""
    safety = check_scalar(safety, "safety", low=0.0, low_open=True)
    eps = check_scalar(eps, "eps", low=0.0)
    if eps_mode not in EPS_MODES:
        raise ValueError(f"eps_mode: expected one of {EPS_MODES}, got {eps_mode!r}")
    return safety, eps


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
