"""Exact bands, Lipschitz constants and first-order gains of a Newton–Schulz schedule's map f.

f = p_T ∘ … ∘ p_1 maps the normalized singular values σ̂ of the Newton–Schulz input to those of its
output (``ortho_ref.ns_polynomials``). Its extrema, the sups of |f′| and of the gains of the remaining
steps are found at the ends of an interval and at the roots of f′, f″ or f′ − f/x, located as sign
changes on a dense grid and refined by bisection (docs/math.md, §2.5).
Source: Amsel et al. 2025 (arXiv 2505.16932), Sec. 2; Higham, Functions of Matrices (2008), ch. 8.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ._validate import as_coefficients, check_scalar
from .ns_polynomials import ns_derivative, ns_polynomial

__all__ = ["ns_attracting_band", "ns_band", "ns_lipschitz", "ns_step_gains", "ns_step_magnitudes"]

@functools.lru_cache(maxsize=256)
def _grid(lo: float, hi: float, n: int = 20001) -> np.ndarray:
    """Dense grid on [lo, hi]: linear plus geometric points (resolves the region near 0).
    Read-only and cached per (lo, hi, n): the root searches of every table share the grid of one
    interval (its sort was a quarter of a search)."""
    pts = [np.linspace(lo, hi, n)]
    if lo > 0:
        pts.append(np.geomspace(lo, hi, n))
    else:
        pts.append(np.geomspace(max(hi * 1e-12, np.finfo(float).tiny), hi, n))
    grid = np.unique(np.concatenate(pts))
    grid.setflags(write=False)
    return grid


def _bisect(g, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bisection on the brackets [a_i, b_i] (g changes sign on each), all at once, until no
    midpoint lies strictly inside its bracket (float64 resolution). A root of a continuous g
    stays bracketed at every halving (Brent 1973, Algorithms for Minimization without
    Derivatives, ch. 4, whose zero finder falls back on exactly this step)."""
    sa = np.sign(g(a))
    for _ in range(1100):  # a bracket in [0, 1e308] halves to one ulp (>= 2^-1074) in < 1100 steps
        mid = 0.5 * (a + b)
        inside = (mid > a) & (mid < b)
        if not inside.any():
            break
        sm = np.sign(g(mid))
        right = inside & (sm == sa)  # the sign change is in [mid, b]
        a, b = np.where(right, mid, a), np.where(inside & ~right, mid, b)
    return 0.5 * (a + b)


def _critical_points(g, lo: float, hi: float) -> np.ndarray:
    """Roots of g on [lo, hi]: sign changes on a dense grid, refined by bisection, plus exact zeros.

    A root is found when it is the only sign change within one grid cell (spacing ≤ (hi − lo)/20000,
    finer near 0); touching roots (no sign change) are not extrema of the quantities searched."""
    x = _grid(lo, hi)
    with np.errstate(over="ignore", invalid="ignore"):  # far beyond the band, f overflows: no roots there
        v = g(x)
        idx = np.nonzero(np.sign(v[:-1]) * np.sign(v[1:]) < 0)[0]
        roots = np.concatenate([_bisect(g, x[idx], x[idx + 1]), x[v == 0]])
    return np.sort(roots)


def _ratio_slope(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """f′(x) − f(x)/x (= x·d/dx(f(x)/x)) without cancellation near 0.

    With A_t = p_t′(x_{t−1}) = a_t + 3b_t y + 5c_t y², B_t = p_t(x_{t−1})/x_{t−1} = a_t + b_t y + c_t y²
    (y = x_{t−1}²): f′ = Π A_t, f/x = Π B_t, and Π A − Π B = Σ_t (A_t − B_t)·Π_{s<t} B_s·Π_{s>t} A_s
    with A_t − B_t = y(2b_t + 4c_t y) formed exactly as a product, not a difference."""
    y = np.asarray(x, dtype=np.float64)
    parts = []
    for a, b, c in table:
        y2 = y * y
        big_a, big_b = a + y2 * (3 * b + 5 * c * y2), a + y2 * (b + c * y2)
        parts.append((big_a, big_b, y2 * (2 * b + 4 * c * y2)))
        y = y * big_b
    # Horner-like from the last step: S_t = (A_t − B_t)·Π_{s>t} A_s + B_t·S_{t+1} = Σ_{r>=t} ..., so
    # S_1 = Σ_t (A_t − B_t)·Π_{s<t} B_s·Π_{s>t} A_s; ``suffix`` is Π_{s>t} A_s
    total, suffix = np.zeros_like(y), np.ones_like(y)
    for big_a, big_b, diff in reversed(parts):
        total = diff * suffix + big_b * total
        suffix = suffix * big_a
    return total


#: The functions whose roots ``_roots`` caches: f′ (extrema of f), f″ (extrema of f′) and
#: f′ − f/x (extrema of f(x)/x).
_ROOT_FUNCTIONS = {
    "f1": lambda x, table: ns_derivative(x, table, 1),
    "f2": lambda x, table: ns_derivative(x, table, 2),
    "ratio": _ratio_slope,
}
#: Cached root sets cover [0, top] with top = hi rounded up to a power of 2^(1/8).
_TOP_STEPS_PER_OCTAVE = 8


@functools.lru_cache(maxsize=2048)
def _cached_roots(kind: str, table_bytes: bytes, steps: int, top: float) -> np.ndarray:
    table = np.frombuffer(table_bytes, dtype=np.float64).reshape(steps, 3)
    roots = _critical_points(lambda x: _ROOT_FUNCTIONS[kind](x, table), 0.0, top)
    roots.setflags(write=False)
    return roots


def _roots(kind: str, table: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Roots in [lo, hi] of the ``kind`` function of ``table`` (see ``_ROOT_FUNCTIONS``).

    The roots do not depend on the interval, so they are found once on [0, top] (top ≥ hi, at most
    2^(1/8) ≈ 1.09 times hi; grid spacing ≤ top/20000) and cached per (kind, table, top)."""
    if not hi > 0:
        return np.zeros(0)
    j = math.ceil(_TOP_STEPS_PER_OCTAVE * math.log2(hi))
    top = 2.0 ** (j / _TOP_STEPS_PER_OCTAVE)
    if top < hi:
        top = 2.0 ** ((j + 1) / _TOP_STEPS_PER_OCTAVE)
    r = _cached_roots(kind, np.ascontiguousarray(table, dtype=np.float64).tobytes(), len(table), top)
    return r[(r >= lo) & (r <= hi)]


def _candidates(kind: str, table: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """The interval's ends and the roots of the ``kind`` function inside it."""
    return np.concatenate([[lo, hi], _roots(kind, table, lo, hi)])


def _check_interval(lo, hi) -> tuple[float, float]:
    lo = check_scalar(lo, "lo", low=0.0)
    hi = check_scalar(hi, "hi", low=0.0)
    if not lo < hi:
        raise ValueError(f"lo, hi: expected 0 <= lo < hi, got lo={lo}, hi={hi}")
    return lo, hi


def ns_band(coefficients, lo: float, hi: float) -> tuple[float, float]:
    """Exact range [min f, max f] of a Newton–Schulz schedule's map f on an interval [lo, hi].

    f is a polynomial, so its extrema on [lo, hi] are at the ends or at roots of
    f′ = Π_t p_t′(x_{t−1}); the roots are bracketed as sign changes on a dense linear + geometric grid
    (spacing <= 1.09·hi/20000) and refined by bisection to float64 resolution — computed, not
    sampled: every root separated from the next by more than the spacing is found (docs/math.md, §2.5).

    Parameters
    ----------
    coefficients : (T, 3) array_like of float
        Rows (a_t, b_t, c_t), one per step, or one (3,) row.
    lo : float
        Left end, >= 0, in σ̂ units (singular values of the normalized input).
    hi : float
        Right end, > `lo`, in σ̂ units.

    Returns
    -------
    tuple of float
        (min f, max f) on [lo, hi], in σ̂ units.

    Raises
    ------
    ValueError
        Unless 0 <= `lo` < `hi` (finite), or if `coefficients` is not a finite (T, 3) table.

    References
    ----------
    N. Amsel, D. Persson, C. Musco, R. M. Gower, "The Polar Express", arXiv 2505.16932, 2025, Sec. 2;
    R. P. Brent, Algorithms for Minimization without Derivatives, Prentice-Hall, 1973, ch. 4
    (bracketing and bisection).

    Examples
    --------
    >>> from ortho_ref import ns_band, schedule
    >>> low, high = ns_band(schedule("jordan"), 1e-3, 1.0)  # the band quoted in docs/design.md
    >>> round(low, 3), round(high, 3)
    (0.471, 1.202)
    """
    table = as_coefficients(coefficients)
    lo, hi = _check_interval(lo, hi)
    vals = ns_polynomial(_candidates("f1", table, lo, hi), table)
    return float(vals.min()), float(vals.max())


def ns_lipschitz(coefficients, lo: float = 0.0, hi: float = 1.0) -> float:
    """Lipschitz constant L_f = sup |f′| of a Newton–Schulz schedule's map f on [lo, hi].

    The sup is taken at the ends and at the roots of
    f″ = Σ_t p_t″(x_{t−1})·(Π_{s<t} p_s′(x_{s−1}))²·Π_{s>t} p_s′(x_{s−1}), found as in ``ns_band``.
    Since p_t(0) = 0, f′(0) = Π_t a_t, the maximum on [0, 1] for every registered schedule. By the
    mean value theorem ns_lipschitz(t, lo, hi) <= G_0 <= ns_lipschitz(t, 0, hi) for the G_0 of
    ``ns_step_gains``, a check ``ortho_verify.tolerances`` makes on every Newton–Schulz tolerance.

    Parameters
    ----------
    coefficients : (T, 3) array_like of float
        Rows (a_t, b_t, c_t), one per step, or one (3,) row.
    lo : float, default 0.0
        Left end, >= 0, in σ̂ units.
    hi : float, default 1.0
        Right end, > `lo`, in σ̂ units.

    Returns
    -------
    float
        L_f, dimensionless.

    Raises
    ------
    ValueError
        Unless 0 <= `lo` < `hi` (finite), or if `coefficients` is not a finite (T, 3) table.

    References
    ----------
    N. Amsel, D. Persson, C. Musco, R. M. Gower, "The Polar Express", arXiv 2505.16932, 2025, Sec. 2;
    docs/math.md, §3 (L_f in the Newton–Schulz tolerance).

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import ns_lipschitz, schedule
    >>> bool(np.isclose(ns_lipschitz(schedule("jordan")), 3.4445 ** 5))
    True
    """
    table = as_coefficients(coefficients)
    lo, hi = _check_interval(lo, hi)
    return float(np.max(np.abs(ns_derivative(_candidates("f2", table, lo, hi), table))))


def _step_image(row, lo: float, hi: float) -> tuple[float, float]:
    """Exact image p([lo, hi]) of one step p(x) = a x + b x³ + c x⁵: p at the ends and at the
    real critical points inside, x² = y with 5c y² + 3b y + a = 0 (closed form)."""
    a, b, c = (float(v) for v in row)
    ys = np.roots([5 * c, 3 * b, a])
    ys = ys[np.isreal(ys)].real
    xs = np.sqrt(ys[ys >= 0])
    pts = np.concatenate([[lo, hi], xs, -xs])
    pts = pts[(pts >= lo) & (pts <= hi)]
    vals = pts * (a + pts * pts * (b + c * pts * pts))
    return float(vals.min()), float(vals.max())


def _step_hulls(table: np.ndarray, lo: float, hi: float) -> list[tuple[float, float]]:
    """[l_t, h_t] = the hull of |x_t| over σ̂ ∈ [lo, hi], t = 0..T, exactly: x_t(σ̂) fills the
    interval I_t = p_t(I_{t−1}) (a continuous image of an interval), computed by ``_step_image``."""
    cur, hulls = (lo, hi), []
    for row in [None, *table]:
        if row is not None:
            cur = _step_image(row, *cur)
        low, high = cur
        hulls.append((0.0 if low <= 0 <= high else min(abs(low), abs(high)), max(abs(low), abs(high))))
    return hulls


def _fixed_point_near_one(a: float, b: float, c: float) -> float:
    """The positive x with p(x) = x nearest 1: x² = y, c y² + b y + (a − 1) = 0."""
    ys = np.roots([c, b, a - 1.0])
    ys = ys[np.isreal(ys)].real
    xs = np.sqrt(ys[ys > 0])
    if xs.size == 0:
        raise ValueError(f"coefficients: the step ({a}, {b}, {c}) has no positive fixed point p(x) = x")
    return float(xs[np.argmin(np.abs(xs - 1.0))])


#: Relative half-width of the neighbourhood of x* that ``ns_attracting_band`` grows, and the
#: most interval iterations it runs (a repelling x* with |p′| ≥ 1.01 reaches a critical point
#: from 1e-9 in < 2100 steps).
_BAND_SEED, _BAND_ITERATIONS = 1e-9, 10000


def ns_attracting_band(coefficients) -> tuple[float, float]:
    """Attracting band [lo, hi] of one Newton–Schulz step p(x) = a x + b x³ + c x⁵, in σ̂ units.

    With x* the positive fixed point of p nearest 1: [x*, x*] if |p′(x*)| < 1; otherwise the
    smallest closed interval J with p(J) ⊆ J that contains a neighbourhood of x*, computed with
    exact interval images (grow J from x*·[1 − 1e-9, 1 + 1e-9] by J ← J ∪ p(J) until p(J) ⊆ J,
    then shrink J ← p(J) until p(J) = J). Singular values entering J stay in it. For Keller Jordan's
    step (x* ≈ 0.868, p′(x*) ≈ −1.58) J = [p(c), p(p(c))] with c the local minimum of p, the core
    of the interval map (docs/math.md, §2.5).

    Parameters
    ----------
    coefficients : (T, 3) array_like of float
        One row (a, b, c), or a table whose last row is the step analysed (the row a schedule
        repeats past its table).

    Returns
    -------
    tuple of float
        (lo, hi), in σ̂ units.

    Raises
    ------
    ValueError
        If `coefficients` is not a finite (T, 3) table, p has no positive fixed point, or the orbit
        of the neighbourhood leaves (0, 1000·max(1, x*)] (no attracting band; e.g. (4, −1, 0)).

    References
    ----------
    K. Jordan et al., "Muon: An optimizer for hidden layers in neural networks", blog post, 2024
    (the tuned quintic keeps singular values in a band around 1); N. Amsel et al., "The Polar
    Express", arXiv 2505.16932, 2025, Sec. 2–3; W. de Melo, S. van Strien, One-Dimensional
    Dynamics, Springer, 1993, ch. III (invariant intervals, the core).

    Examples
    --------
    >>> from ortho_ref import ns_attracting_band, schedule
    >>> [round(v, 4) for v in ns_attracting_band(schedule("jordan"))]
    [0.6818, 1.1344]
    >>> ns_attracting_band([1.5, -0.5, 0.0])  # the cubic: 1 attracts
    (1.0, 1.0)
    """
    row = as_coefficients(coefficients)[-1]
    a, b, c = (float(v) for v in row)
    x_star = _fixed_point_near_one(a, b, c)
    if abs(a + x_star**2 * (3 * b + 5 * c * x_star**2)) < 1.0:
        return x_star, x_star
    lo, hi = x_star * (1 - _BAND_SEED), x_star * (1 + _BAND_SEED)
    for _ in range(_BAND_ITERATIONS):
        img = _step_image(row, lo, hi)
        if img[0] >= lo and img[1] <= hi:
            break
        lo, hi = min(lo, img[0]), max(hi, img[1])
        if not (lo > 0 and math.isfinite(hi) and hi < 1e3 * max(1.0, x_star)):
            raise ValueError(f"coefficients: the orbit of a neighbourhood of the fixed point x* = {x_star:.6g} of the "
                             f"step ({a}, {b}, {c}) leaves (0, 1000·max(1, x*)]; the step has no attracting band")
    else:
        raise ValueError(f"coefficients: no invariant interval around x* = {x_star:.6g} after {_BAND_ITERATIONS} steps")
    for _ in range(_BAND_ITERATIONS):
        img = _step_image(row, lo, hi)
        if img == (lo, hi):
            break
        lo, hi = img
    return lo, hi


def ns_step_gains(coefficients, lo: float, hi: float) -> np.ndarray:
    """First-order gains G_0, ..., G_T of the Newton–Schulz map for inputs with σ̂ in [lo, hi].

    G_t bounds the Fréchet derivative, in the Frobenius norm, of the remaining map
    g_t = p_T ∘ … ∘ p_{t+1} at the step-t iterate: by the Daleckii–Krein divided differences it is
    at most sup max(|g_t′(x)|, |g_t(x)/x|) over the hull [l_t, h_t] of the step-t singular values.
    G_0 is the gain for the input rounding, G_T = 1. Computed exactly, not sampled: each hull is the
    image of [lo, hi] under p_t ∘ … ∘ p_1 from each quintic's closed-form critical points, and the
    sups are taken at the hull's ends and at the roots of g_t″ and of g_t′ − g_t/x (docs/math.md,
    §2.5).

    Parameters
    ----------
    coefficients : (T, 3) array_like of float
        Rows (a_t, b_t, c_t), one per step, or one (3,) row.
    lo : float
        Smallest σ̂, >= 0 (0 for a rank-deficient or unknown spectrum).
    hi : float
        Largest σ̂, > `lo`.

    Returns
    -------
    (T + 1,) float64 ndarray
        G_0, ..., G_T, dimensionless; with `lo` = 0, G_0 = ``ns_lipschitz(coefficients, 0, hi)``.

    Raises
    ------
    ValueError
        Unless 0 <= `lo` < `hi` (finite), or if `coefficients` is not a finite (T, 3) table.

    References
    ----------
    N. J. Higham, Functions of Matrices: Theory and Computation, SIAM, 2008, Thm. 3.11 and Sec. 8.1
    (Daleckii–Krein); N. Amsel et al., "The Polar Express", arXiv 2505.16932, 2025, Sec. 2.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import ns_lipschitz, ns_step_gains, schedule
    >>> gains = ns_step_gains(schedule("jordan"), 0.0, 1.0)
    >>> gains.shape, float(gains[-1])
    ((6,), 1.0)
    >>> bool(np.isclose(gains[0], ns_lipschitz(schedule("jordan"), 0.0, 1.0)))
    True
    """
    table = as_coefficients(coefficients)
    lo, hi = _check_interval(lo, hi)
    hulls = _step_hulls(table, lo, hi)
    gains = np.ones(len(table) + 1)
    for t, (l_t, h_t) in enumerate(hulls[:-1]):
        rest = table[t:]
        x = np.concatenate([_candidates("f2", rest, l_t, h_t), _candidates("ratio", rest, l_t, h_t)])
        gains[t] = max(float(np.max(np.abs(ns_derivative(x, rest)))), float(np.max(np.abs(_ratio(x, rest)))))
    return gains


def _ratio(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """f(x)/x = Π_t p_t(x_{t−1})/x_{t−1} = Π_t (a_t + b_t y + c_t y²), y = x_{t−1}²: no division,
    accurate for tiny and subnormal x, and Π a_t = f′(0) at x = 0."""
    y = np.asarray(x, dtype=np.float64)
    q = np.ones_like(y)
    for a, b, c in table:
        y2 = y * y
        factor = a + y2 * (b + c * y2)
        q, y = q * factor, y * factor
    return q


def ns_step_magnitudes(coefficients, lo: float, hi: float) -> np.ndarray:
    """Term sizes S_t = sup (|a_t| x + |b_t| x³ + |c_t| x⁵) over the step-t input spectrum, t = 1..T.

    The rounding committed in step t is relative to the sizes of its terms (aX, bSX, cS²X with
    S = XXᵀ), not to their sum, which cancels: for polar_express step 1 at x = 1 the terms are about
    47 times the result. With σ̂ in [lo, hi] the step-t input lies in the hull [l_{t−1}, h_{t−1}] of
    |x_{t−1}| (exact, as in ``ns_step_gains``), and the term sum increases with x >= 0, so S_t is
    its value at h_{t−1}.

    Parameters
    ----------
    coefficients : (T, 3) array_like of float
        Rows (a_t, b_t, c_t), one per step, or one (3,) row.
    lo : float
        Smallest σ̂, >= 0.
    hi : float
        Largest σ̂, > `lo`.

    Returns
    -------
    (T,) float64 ndarray
        S_1, ..., S_T, in σ̂ units.

    Raises
    ------
    ValueError
        Unless 0 <= `lo` < `hi` (finite), or if `coefficients` is not a finite (T, 3) table.

    References
    ----------
    N. J. Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., SIAM, 2002, ch. 3 (rounding
    errors of inner and matrix products, relative to |A||B|).

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import ns_step_magnitudes, schedule
    >>> table = schedule("jordan", 2)
    >>> s = ns_step_magnitudes(table, 0.0, 1.0)
    >>> bool(np.isclose(s[0], 3.4445 + 4.775 + 2.0315))  # step 1 at x = 1
    True
    """
    table = as_coefficients(coefficients)
    lo, hi = _check_interval(lo, hi)
    x = np.array([h for _, h in _step_hulls(table, lo, hi)[:-1]])
    a, b, c = np.abs(table).T
    return x * (a + x * x * (b + c * x * x))
