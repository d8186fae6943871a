"""ortho_ref.ns_map and the polynomial view: bands, Lipschitz constants, exactness."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ortho_ref
from ortho_verify.tolerances import U64, ns_singular_value_tolerance, ns_tolerance, svd_residual_tolerance
from tests.strategies import spectral_matrices

SCHEDULES = sorted(ortho_ref.SCHEDULES)

# Bands quoted in docs/design.md ("Muon") to 3 decimals: a correct computation differs from the quote by at
# most half a unit in the last quoted place.
QUOTE_HALF_UNIT = 0.5e-3
# γ_7 = 7u/(1 − 7u): one float64 evaluation of a step's p(x) = x(a + y(b + c y)) or
# p′(x) = a + y(3b + 5c y), y = x², errs by at most γ_7 times its term sum (y = fl(x²) counts
# once per power of y, 3b and 5c once, the Horner operations four times; Higham, Accuracy and
# Stability of Numerical Algorithms, 2002, eq. 5.3).
GAMMA7 = 7 * U64 / (1 - 7 * U64)


def _iterate(a, table, safety, eps):
    """The Newton–Schulz matrix iteration itself, in float64 numpy (an independent path)."""
    x = a / (safety * np.linalg.norm(a) + eps)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    for a_t, b_t, c_t in table:
        g = x @ x.T
        x = a_t * x + (b_t * g + c_t * g @ g) @ x
    return x.T if tall else x


@settings(deadline=None)
@given(spectral_matrices(max_dim=24), st.sampled_from(SCHEDULES))
def test_ns_map_equals_the_matrix_iteration(case, name):
    a, _ = case
    sched = ortho_ref.SCHEDULES[name]
    table = ortho_ref.schedule(name)
    ref = ortho_ref.ns_map(a, table, safety=sched.safety, eps=sched.eps)
    it = _iterate(a, table, sched.safety, sched.eps)
    sigma_hat = ortho_ref.normalized_singular_values(a, safety=sched.safety, eps=sched.eps)
    assert np.linalg.norm(ref - it) <= ns_tolerance(sigma_hat, table, a.shape, "float64")


@settings(deadline=None)
@given(spectral_matrices(max_dim=24), st.sampled_from(SCHEDULES))
def test_singular_values_are_f_of_normalized_ones(case, name):
    a, _ = case
    table = ortho_ref.schedule(name)
    out = ortho_ref.ns_map(a, table)
    expected = np.sort(np.abs(ortho_ref.ns_polynomial(ortho_ref.normalized_singular_values(a), table)))
    got = np.sort(ortho_ref.singular_values(out))
    # first-order sensitivity of f at σ̂ (rounding of σ̂ and of U f(Σ̂) Vᵀ) plus the SVD of the output
    sigma_hat = ortho_ref.normalized_singular_values(a)
    tol = ns_singular_value_tolerance(sigma_hat, table, a.shape, "float64") + svd_residual_tolerance(
        a.shape, max(1.0, float(expected.max())))
    assert np.max(np.abs(got - expected)) <= tol
    # transposition commutes with the map, up to the map's own sensitivity to rounding
    assert np.linalg.norm(ortho_ref.ns_map(a.T, table) - out.T) <= ns_tolerance(sigma_hat, table, a.shape, "float64")


def test_cubic_converges_to_polar_factor():
    a = np.random.default_rng(3).standard_normal((12, 8)) @ np.diag(np.geomspace(1, 0.3, 8))
    polar = ortho_ref.polar(a)
    table = ortho_ref.schedule("cubic", 60)
    # The cubic map contracts e = 1 − x quadratically once x is near 1; after 60 steps from
    # σ̂ >= 0.3/‖A‖_F the residual is at rounding level: compare with the SVD tolerance.
    assert np.linalg.norm(ortho_ref.ns_map(a, table, eps=0.0) - polar) <= svd_residual_tolerance(a.shape)


@pytest.mark.parametrize(
    "name, steps, lo, hi, band",
    [
        ("jordan", 5, 1e-3, 1.0, (0.471, 1.202)),
        ("you6", 6, 1e-3, 1.0, (0.866, 0.999)),
        # quoted "polar_express(1.02) x5": raw σ/‖A‖_F in [1e-3, 1] divided by the safety 1.02
        ("polar_express", 5, 1e-3 / 1.02, 1 / 1.02, (0.847, 1.141)),
    ],
)
def test_bands_quoted_in_design(name, steps, lo, hi, band):
    got = ortho_ref.ns_band(ortho_ref.schedule(name, steps), lo, hi)
    assert abs(got[0] - band[0]) <= QUOTE_HALF_UNIT and abs(got[1] - band[1]) <= QUOTE_HALF_UNIT


@pytest.mark.parametrize("name", ["jordan", "polar_express", "cesista5", "cubic"])
def test_lipschitz_is_product_of_a_where_maximal_at_zero(name):
    # f'(0) = Π a_t exactly; for these schedules |f'| is maximal at 0 (docs/design.md, "Tolerances").
    table = ortho_ref.schedule(name)
    prod = float(np.prod(table[:, 0]))
    lip = ortho_ref.ns_lipschitz(table)
    assert lip >= prod * (1 - 4 * len(table) * U64)
    assert lip <= prod * (1 + 4 * len(table) * U64)


@pytest.mark.parametrize("name, quoted, half_unit", [("jordan", 485.0, 0.5), ("polar_express", 990.0, 5.0)])
def test_lipschitz_quoted_in_design(name, quoted, half_unit):
    # docs/design.md, "Tolerances": "jordan×5 ≈ 485; polar_express×5 ≈ 990, the product of its a's". A correct value
    # is within half a unit of the last quoted significant digit (990 = 2 digits: 989.47).
    assert abs(ortho_ref.ns_lipschitz(ortho_ref.schedule(name)) - quoted) <= half_unit


@settings(deadline=None)
@given(st.sampled_from(SCHEDULES), st.floats(1e-4, 0.49), st.floats(0.5, 1.0))
def test_band_contains_samples_and_is_attained(name, lo, hi):
    table = ortho_ref.schedule(name)
    b_lo, b_hi = ortho_ref.ns_band(table, lo, hi)
    x = np.linspace(lo, hi, 5001)
    y = ortho_ref.ns_polynomial(x, table)
    slack = 8 * len(table) * U64 * max(1.0, abs(b_hi))
    assert y.min() >= b_lo - slack and y.max() <= b_hi + slack
    # attained: the band edges are values of f (min over a grid can only be above the min)
    assert y.min() - b_lo <= ortho_ref.ns_lipschitz(table, lo, hi) * (x[1] - x[0])


def _rounding_bounds(x: np.ndarray, table: np.ndarray, start: int = 0):
    """|g′(x_t)| and |g(x_t)/x_t| for g = p_T ∘ … ∘ p_{t+1}, t = ``start``, x_t = p_t(…p_1(x)) all
    evaluated in float64 by ortho_ref's formulas, each with a first-order bound on its rounding
    error, that of x_t included, by running error analysis (Higham, Accuracy and Stability of
    Numerical Algorithms, 2002, Sec. 3.3): z = fl(p·q) carries |p|e_q + |q|e_p + u|z|,
    z = fl(p + q) carries e_p + e_q + u|z|, the coefficients 3b, 5c one rounding each, x is exact.
    g(x)/x is the product Π (a_s + b_s y + c_s y²), y = x_{s−1}², as ortho_ref forms it.
    Returns (|g′|, e_g′, |g/x|, e_g/x), arrays shaped like x."""
    u = U64

    def mul(p, q):
        z = p[0] * q[0]
        return z, np.abs(p[0]) * q[1] + np.abs(q[0]) * p[1] + u * np.abs(z)

    def add(p, q):
        z = p[0] + q[0]
        return z, p[1] + q[1] + u * np.abs(z)

    one = (np.ones_like(x), 0.0 * x)
    y, d, q = (x, 0.0 * x), one, one
    for s, (a, b, c) in enumerate(table):
        y2 = mul(y, y)
        factor = add((a, 0.0), mul(y2, add((b, 0.0), mul((c, 0.0), y2))))
        if s >= start:
            d = mul(add((a, 0.0), mul(y2, add((3 * b, u * abs(3 * b)), mul((5 * c, u * abs(5 * c)), y2)))), d)
            q = mul(q, factor)
        y = mul(y, factor)
    return np.abs(d[0]), d[1], np.abs(q[0]), q[1]


def _sampled_gains(table: np.ndarray, lo: float, hi: float, n: int = 20001):
    """Per t = 0..T−1: the max over dense samples σ̂ ∈ [lo, hi] of max(|g_t′(x_t)|, |g_t(x_t)/x_t|)
    at x_t = p_t(…p_1(σ̂)), and the rounding bound (``_rounding_bounds``, x_t's own rounding
    included) at the maximizing sample.
    Every x_t lies in the step-t spectrum's hull, so sample <= G_t up to rounding. From one
    trajectory: g_t′(x_t) = Π_{s>t} p_s′(x_{s−1}), g_t(x_t)/x_t = Π_{s>t} p_s(x_{s−1})/x_{s−1}."""
    sigma = np.unique(np.concatenate([np.linspace(lo, hi, n), np.geomspace(max(lo, 1e-12 * hi), hi, n)]))
    xs, derivs, factors = [sigma], [], []
    for a, b, c in table:
        y2 = xs[-1] * xs[-1]
        derivs.append(a + y2 * (3 * b + 5 * c * y2))
        factors.append(a + y2 * (b + c * y2))
        xs.append(xs[-1] * factors[-1])
    out, d, q = [], np.ones_like(sigma), np.ones_like(sigma)
    for t in reversed(range(len(table))):
        d, q = d * derivs[t], q * factors[t]
        values = np.maximum(np.abs(d), np.abs(q))
        i = int(np.argmax(values))
        _, e_d, _, e_q = _rounding_bounds(sigma[i:i + 1], table, t)
        out.append((float(values[i]), float(max(e_d[0], e_q[0]))))
    return out[::-1]


@given(st.sampled_from(SCHEDULES), st.floats(0.0, 0.9), st.floats(0.05, 1.0), st.booleans())
@settings(deadline=None)
def test_step_gains_are_the_exact_sup(name, lo_frac, hi, from_zero):
    # Random intervals [lo, hi] ⊂ [0, 1], lo = 0 included; every registry schedule.
    table = ortho_ref.schedule(name)
    lo = 0.0 if from_zero else lo_frac * hi
    gains = ortho_ref.ns_step_gains(table, lo, hi)
    assert gains.shape == (len(table) + 1,) and gains[-1] == 1.0
    # Dense sampling (5x denser than the old sampled G_t, which it catches without its 1 % margin)
    # never exceeds G_t beyond the rounding of the two evaluations: the sample's, and the one at
    # G_t's maximizer, which matters only where that is the sample's neighbour (same bound).
    for t, (sampled, rounding) in enumerate(_sampled_gains(table, lo, hi)):
        assert sampled <= gains[t] + 2 * rounding, (t, sampled, gains[t])
    # Analytic sandwich (mean value theorem, f(0) = 0): sup|f′| on [lo, hi] <= G_0 <= sup|f′| on
    # [0, hi]; the lower one is exact (same points), the upper one up to the rounding of f(x)/x.
    assert ortho_ref.ns_lipschitz(table, lo, hi) <= gains[0]
    top = ortho_ref.ns_lipschitz(table, 0.0, hi)
    _, e_d, _, e_q = _rounding_bounds(np.linspace(lo, hi, 1001), table)
    assert gains[0] <= top + 2 * float(max(e_d.max(), e_q.max()))


@given(st.sampled_from(SCHEDULES), st.integers(0, 6), st.floats(0.0, 0.9), st.floats(0.05, 1.2))
@settings(deadline=None)
def test_one_step_gain_in_closed_form(name, row, lo_frac, hi):
    # One step p(x) = a x + b x³ + c x⁵, y = x²: p′ = a + 3b y + 5c y², p(x)/x = a + b y + c y²,
    # quadratics in y whose extrema on [lo², hi²] are at the ends and the vertices
    # y = −3b/(10c), y = −b/(2c) — an independent path to G_0 of a one-step table.
    rows = ortho_ref.schedule(name, 7)
    a, b, c = rows[row]
    lo = lo_frac * hi
    ys = [lo * lo, hi * hi] + [v for v in ((-3 * b / (10 * c), -b / (2 * c)) if c else ()) if lo * lo < v < hi * hi]
    ys = np.array(ys)
    expected = max(np.max(np.abs(a + ys * (3 * b + 5 * c * ys))), np.max(np.abs(a + ys * (b + c * ys))))
    got = ortho_ref.ns_step_gains(rows[row:row + 1], lo, hi)[0]
    # each side evaluates p′ or p/x once (GAMMA7 times its term sum <= |a| + 3|b|y + 5|c|y²,
    # y <= hi²); the vertices' own rounding moves the values only to second order
    size = abs(a) + hi * hi * (3 * abs(b) + 5 * abs(c) * hi * hi)
    assert abs(got - expected) <= 2 * GAMMA7 * size


def test_step_gains_regression_polar_express():
    # Reviewer's case: the sampled G_0 (219.78) was 0.9 % below sup|f′| = 221.73 on this interval.
    table = ortho_ref.schedule("polar_express")
    gains = ortho_ref.ns_step_gains(table, 0.01423, 1.0)
    assert gains[0] >= ortho_ref.ns_lipschitz(table, 0.01423, 1.0) > 221.7


def test_step_magnitudes_are_the_term_sums_at_the_hull_top():
    # S_t is increasing in x >= 0, so it is attained at the largest |x_{t−1}|: for jordan on
    # [1e-3, 1] that is 1 for step 1 and the band top max f_{t−1} for the later steps.
    table = ortho_ref.schedule("jordan")
    sizes = ortho_ref.ns_step_magnitudes(table, 1e-3, 1.0)
    tops = [1.0] + [ortho_ref.ns_band(table[:t], 1e-3, 1.0)[1] for t in range(1, len(table))]
    a, b, c = np.abs(table[0])
    expected = [x * (a + x * x * (b + c * x * x)) for x in tops]
    np.testing.assert_allclose(sizes, expected, rtol=8 * U64, atol=0)


def _step(row):
    a, b, c = row
    return lambda x: x * (a + x * x * (b + c * x * x))


def test_attracting_band_quoted_in_design():
    # docs/design.md, "Muon": "attracting band [0.68, 1.13]" for Keller Jordan's step; docs quote [0.682, 1.134].
    row = ortho_ref.schedule("jordan")[-1]
    lo, hi = ortho_ref.ns_attracting_band(row)
    assert abs(lo - 0.682) <= QUOTE_HALF_UNIT and abs(hi - 1.134) <= QUOTE_HALF_UNIT
    # J = [p(c), p(p(c))] with c the local minimum of p (closed form: 5c y² + 3b y + a = 0)
    a, b, c = row
    crit = np.sqrt(max(np.roots([5 * c, 3 * b, a]).real))
    p = _step(row)
    # Each value below is p(c) or p(p(c)) evaluated along some path: p(c) errs by GAMMA7·S
    # (S = the term sum at hi; an error in c matters only to second order, p′(c) = 0), and
    # p(p(c)) adds |p′(lo)| times that; two such values differ by twice it.
    slack_lo = 2 * GAMMA7 * hi * (abs(a) + hi * hi * (abs(b) + abs(c) * hi * hi))
    slack_hi = (1 + abs(a + lo * lo * (3 * b + 5 * c * lo * lo))) * slack_lo
    assert abs(lo - p(crit)) <= slack_lo and abs(hi - p(p(crit))) <= slack_hi
    # invariant and onto: p(J) = J, so no smaller interval is invariant under one step
    img = ortho_ref.ns_band(row, lo, hi)
    assert abs(img[0] - lo) <= slack_lo and abs(img[1] - hi) <= slack_hi
    # the repelling fixed point lies inside; five steps map [0.1, 1] onto J (docs/design.md, "Muon"):
    # their min and max are p(c) and p(p(c)) exactly, reached where an iterate passes through c
    x_star = np.sqrt(max(r.real for r in np.roots([c, b, a - 1]) if abs(r.imag) == 0 and 0 < r.real < 1.2))
    assert lo < x_star < hi and a + x_star**2 * (3 * b + 5 * c * x_star**2) < -1
    five = ortho_ref.ns_band(ortho_ref.schedule("jordan", 5), 0.1, 1.0)
    assert abs(five[0] - lo) <= slack_lo and abs(five[1] - hi) <= slack_hi


@given(st.sampled_from(SCHEDULES), st.floats(1e-3, 1.0))
@settings(deadline=None)
def test_orbits_end_in_the_attracting_band(name, x0):
    # Iterating a schedule's last step from σ̂ in [1e-3, 1] ends in its band. The float64 orbit
    # is a ρ-pseudo-orbit, ρ = GAMMA7·S, S the term sum at hi (the orbit's last values exceed hi
    # by at most the width below, ~1e-14, which changes S only to second order). Attracting x*
    # (band [x*, x*], λ = |p′(x*)| < 1): it settles within ρ/(1 − λ) of x*. Repelling x*
    # (jordan): values never fall below p(c) = lo by more than ρ, and a value within ρ below lo
    # maps within (1 + L)ρ above hi, L = sup|p′| on the band.
    row = ortho_ref.schedule(name)[-1]
    lo, hi = ortho_ref.ns_attracting_band(row)
    a, b, c = row
    rho = GAMMA7 * hi * (abs(a) + hi * hi * (abs(b) + abs(c) * hi * hi))
    if lo == hi:
        slope = abs(a + 3 * b * lo**2 + 5 * c * lo**4)
        assert slope < 1
        width = rho / (1 - slope)
    else:
        width = (1 + ortho_ref.ns_lipschitz(row, lo, hi)) * rho
    p, x = _step(row), x0
    for _ in range(200):  # cubic, the slowest, needs ~17 doublings from 1e-3, then converges quadratically
        x = p(x)
    for _ in range(50):
        x = p(x)
        assert lo - width <= x <= hi + width


@pytest.mark.parametrize("row, match", [
    ((4.0, -1.0, 0.0), "no attracting band"),  # x* = √3 repels and the orbit leaves (0, ∞)
    ((2.0, 0.0, 0.0), "no positive fixed point"),
    ((1.0, 2.0), "coefficients"),
])
def test_attracting_band_errors(row, match):
    with pytest.raises(ValueError, match=match):
        ortho_ref.ns_attracting_band(row)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(coefficients=[[1.0, 2.0]]), "coefficients"),
        (dict(coefficients=[[1.0, np.nan, 0.0]]), "coefficients"),
        (dict(coefficients=[[1.5, -0.5, 0.0]], safety=0.0), "safety"),
        (dict(coefficients=[[1.5, -0.5, 0.0]], eps=-1.0), "eps"),
        (dict(coefficients=[[1.5, -0.5, 0.0]], eps_mode="max"), "eps_mode"),
    ],
)
def test_ns_map_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ortho_ref.ns_map(np.eye(3), **kwargs)


def test_schedule_errors():
    with pytest.raises(KeyError, match="unknown schedule"):
        ortho_ref.schedule("nope")
    with pytest.raises(ValueError, match="steps"):
        ortho_ref.schedule("jordan", 0)
    with pytest.raises(ValueError, match="lo, hi"):
        ortho_ref.ns_band(ortho_ref.schedule("jordan"), 0.5, 0.1)
