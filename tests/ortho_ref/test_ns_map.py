"""ortho_ref.ns_map and the polynomial view: bands, Lipschitz constants, exactness."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ortho_ref
from tests.strategies import spectral_matrices
from verify.tolerances import U64, ns_singular_value_tolerance, ns_tolerance, svd_residual_tolerance

SCHEDULES = sorted(ortho_ref.SCHEDULES)

# Bands quoted in DESIGN.md to 3 decimals: a correct computation differs from the quote by at
# most half a unit in the last quoted place.
QUOTE_HALF_UNIT = 0.5e-3


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


@settings(max_examples=40, deadline=None)
@given(spectral_matrices(max_dim=24), st.sampled_from(SCHEDULES))
def test_ns_map_equals_the_matrix_iteration(case, name):
    a, _ = case
    sched = ortho_ref.SCHEDULES[name]
    table = ortho_ref.schedule(name)
    ref = ortho_ref.ns_map(a, table, safety=sched.safety, eps=sched.eps)
    it = _iterate(a, table, sched.safety, sched.eps)
    sigma_hat = ortho_ref.normalized_singular_values(a, safety=sched.safety, eps=sched.eps)
    assert np.linalg.norm(ref - it) <= ns_tolerance(sigma_hat, table, a.shape, "float64")


@settings(max_examples=40, deadline=None)
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
        ("jordan", 5, 0.1, 1.0, (0.682, 1.134)),
        # quoted "polar_express(1.02) x5": raw σ/‖A‖_F in [1e-3, 1] divided by the safety 1.02
        ("polar_express", 5, 1e-3 / 1.02, 1 / 1.02, (0.847, 1.141)),
    ],
)
def test_bands_quoted_in_design(name, steps, lo, hi, band):
    got = ortho_ref.ns_band(ortho_ref.schedule(name, steps), lo, hi)
    assert abs(got[0] - band[0]) <= QUOTE_HALF_UNIT and abs(got[1] - band[1]) <= QUOTE_HALF_UNIT


@pytest.mark.parametrize("name", ["jordan", "polar_express", "cesista5", "cubic"])
def test_lipschitz_is_product_of_a_where_maximal_at_zero(name):
    # f'(0) = Π a_t exactly; for these schedules |f'| is maximal at 0 (DESIGN.md).
    table = ortho_ref.schedule(name)
    prod = float(np.prod(table[:, 0]))
    lip = ortho_ref.ns_lipschitz(table)
    assert lip >= prod * (1 - 4 * len(table) * U64)
    assert lip <= prod * (1 + 4 * len(table) * U64)


@pytest.mark.parametrize("name, quoted, half_unit", [("jordan", 485.0, 0.5), ("polar_express", 990.0, 5.0)])
def test_lipschitz_quoted_in_design(name, quoted, half_unit):
    # DESIGN.md: "jordan×5 ≈ 485; polar_express×5 ≈ 990, the product of its a's". A correct value
    # is within half a unit of the last quoted significant digit (990 = 2 digits: 989.47).
    assert abs(ortho_ref.ns_lipschitz(ortho_ref.schedule(name)) - quoted) <= half_unit


@settings(max_examples=30, deadline=None)
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


def test_step_gains_bound_the_derivative():
    table = ortho_ref.schedule("jordan")
    gains = ortho_ref.ns_step_gains(table, 1e-3, 1.0)
    assert gains.shape == (len(table) + 1,) and gains[-1] == 1.0
    assert gains[0] >= ortho_ref.ns_lipschitz(table, 1e-3, 1.0)


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
