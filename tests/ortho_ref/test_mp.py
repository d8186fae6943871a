"""ortho_ref's mpmath tier: float64 oracle vs 50 digits, the tier's own accuracy, bad input."""

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ortho_ref
from ortho_ref import mp
from tests.strategies import spectral_matrices
from verify import tolerances as tol

DIGITS = 50
SCHEDULES = sorted(ortho_ref.SCHEDULES)
# Hypothesis inputs stay <= 16 x 16 (a 16 x 16 SVD at 50 digits takes ~0.2 s); condition
# numbers up to 1e10 reach both sides of the polar bound's first-order validity limit.
CASES = spectral_matrices(max_dim=16, max_cond=1e10)


def _max_abs_diff(x, y) -> mpmath.mpf:
    with mpmath.workdps(2 * DIGITS + 20):
        return max(abs(p - q) for p, q in zip(x.ravel(), y.ravel()))


def _check_polar(a, s):
    exact = ortho_ref.polar(a, digits=DIGITS)
    assert exact.shape == a.shape and exact.dtype == object
    bound = tol.mp_agreement_tolerance(a, "polar", digits=DIGITS)
    if bound is not None:
        assert np.linalg.norm(ortho_ref.polar(a) - mp.to_float64(exact)) <= bound
    else:  # below first-order validity: the property U·H = A with the exact U and float64 H
        _, h = ortho_ref.polar_decomposition(a)
        resid = np.linalg.norm(mp.to_float64(exact) @ h - a)
        assert resid <= tol.polar_hermitian_tolerance(a.shape, float(s[0])) + tol.svd_residual_tolerance(
            a.shape, float(s[0]))


def _check_ns_map(a, name, eps_mode):
    sched = ortho_ref.SCHEDULES[name]
    table = ortho_ref.schedule(name)
    kw = dict(safety=sched.safety, eps=sched.eps, eps_mode=eps_mode)
    exact = ortho_ref.ns_map(a, table, digits=DIGITS, **kw)
    bound = tol.mp_agreement_tolerance(a, "ns_map", table, digits=DIGITS, **kw)
    assert np.linalg.norm(ortho_ref.ns_map(a, table, **kw) - mp.to_float64(exact)) <= bound


@settings(max_examples=6, deadline=None)
@given(CASES)
def test_float64_polar_agrees_with_50_digits(case):
    _check_polar(*case)


@settings(max_examples=6, deadline=None)
@given(CASES, st.sampled_from(SCHEDULES), st.sampled_from(["add", "clamp"]))
def test_float64_ns_map_agrees_with_50_digits(case, name, eps_mode):
    _check_ns_map(case[0], name, eps_mode)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(CASES, st.sampled_from(SCHEDULES), st.sampled_from(["add", "clamp"]))
def test_float64_agrees_with_50_digits_deep(case, name, eps_mode):
    _check_polar(*case)
    _check_ns_map(case[0], name, eps_mode)


def _ill_conditioned(m, n, cond, seed):
    from verify.spectra import matrix_with_spectrum

    return matrix_with_spectrum(np.geomspace(1.0, 1.0 / cond, min(m, n)), m, n, np.random.default_rng(seed))


@pytest.mark.parametrize("a", [
    _ill_conditioned(9, 6, 1e12, 0),
    _ill_conditioned(5, 8, 1e3, 1),
    np.hstack([np.arange(12.0).reshape(6, 2), np.arange(12.0).reshape(6, 2)[:, :1]]),  # exactly rank 2
])
def test_mp_result_is_correct_to_its_digits(a):
    # Contract: every entry within 10^-digits·scale of the exact value, so two runs differ by at
    # most the sum of their bounds (scale 1 for the polar factor, max(1, max|f|) for ns_map).
    table = ortho_ref.schedule("polar_express")
    f_max = float(np.max(np.abs(ortho_ref.ns_polynomial(ortho_ref.normalized_singular_values(a, safety=1.02), table))))
    for fn, scale in ((lambda d: ortho_ref.polar(a, digits=d), 1.0),
                      (lambda d: ortho_ref.ns_map(a, table, safety=1.02, digits=d), max(1.0, f_max))):
        diff = _max_abs_diff(fn(DIGITS), fn(DIGITS + 20))
        assert diff <= scale * (mpmath.mpf(10) ** -DIGITS + mpmath.mpf(10) ** -(DIGITS + 20))


def test_rank_deficient_polar_is_the_partial_isometry():
    b = np.arange(12.0).reshape(6, 2) + 1.0
    a = np.hstack([b, b[:, :1]])  # rank 2 exactly: column 3 is a float64 copy of column 1
    u = ortho_ref.polar(a, digits=30)
    # E = u − U_exact has ‖E‖_F <= eps (contract); the checks below are first order in E.
    eps = tol.mp_accuracy(a.shape, 30)
    with mpmath.workdps(40):
        gram = u.T @ u
        isometry_err = mpmath.sqrt(sum(x**2 for x in (u @ gram - u).ravel()))  # U UᵀU = U: 3‖E‖
        sym_err = mpmath.sqrt(sum(x**2 for x in (u.T @ a - a.T @ u).ravel()))  # UᵀA = H: 2‖E‖‖A‖₂
        trace = sum(gram[i, i] for i in range(3))  # rank 2: |tr(EᵀU + UᵀE)| <= 2√3‖E‖
        null = mpmath.sqrt(sum(x**2 for x in (u[:, 0] - u[:, 2])))  # A(e1 − e3) = 0: √2‖E‖
    assert isometry_err <= 3.5 * eps
    assert sym_err <= 2.5 * eps * float(np.linalg.norm(a, 2))
    assert abs(trace - 2) <= 2.5 * np.sqrt(3) * eps
    assert null <= 1.5 * np.sqrt(2) * eps


def test_zero_matrix():
    assert np.all(mp.to_float64(ortho_ref.polar(np.zeros((3, 2)), digits=20)) == 0.0)
    assert np.all(mp.to_float64(ortho_ref.ns_map(np.zeros((2, 3)), [[1.5, -0.5, 0.0]], eps=0.0, digits=20)) == 0.0)


def test_hi_lo_round_trip():
    x = ortho_ref.polar(_ill_conditioned(4, 3, 10.0, 2), digits=DIGITS)
    hi, lo = mp.to_hi_lo(x)
    assert np.array_equal(hi, mp.to_float64(x))
    assert np.all(np.abs(lo) <= np.spacing(np.abs(hi)) / 2)  # hi is the nearest float64
    back = mp.from_hi_lo(hi, lo)
    with mpmath.workdps(2 * DIGITS):
        for v, w in zip(x.ravel(), back.ravel()):
            assert abs(v - w) <= abs(v) * mpmath.mpf(2) ** -106
    with pytest.raises(ValueError, match="hi, lo"):
        mp.from_hi_lo(hi, lo[:1])


def test_global_precision_is_untouched():
    before = mpmath.mp.prec
    ortho_ref.polar(np.eye(2), digits=40)
    ortho_ref.ns_map(np.eye(2), [[1.5, -0.5, 0.0]], digits=40)
    with pytest.raises(ValueError):
        ortho_ref.polar(np.eye(2), digits=5000)
    assert mpmath.mp.prec == before


@pytest.mark.parametrize("digits, exc, match", [
    (15, ValueError, "float64"),
    (mp.MAX_DIGITS + 1, ValueError, str(mp.MAX_DIGITS)),
    (50.0, TypeError, "integer"),
    ("50", TypeError, "integer"),
    (True, TypeError, "integer"),
])
def test_bad_digits(digits, exc, match):
    for fn in (lambda: ortho_ref.polar(np.eye(3), digits=digits),
               lambda: ortho_ref.ns_map(np.eye(3), [[1.5, -0.5, 0.0]], digits=digits)):
        with pytest.raises(exc, match=match):
            fn()


@pytest.mark.parametrize("shape", [(mp.MAX_DIM + 1, 2), (3, mp.MAX_DIM + 1), (1000, 1000)])
def test_too_large_is_refused_before_any_work(shape):
    # A 1000 x 1000 SVD at 50 digits would take days: the limit is checked first.
    for fn in (lambda a: ortho_ref.polar(a, digits=DIGITS), lambda a: ortho_ref.ns_map(a, [[1.5, -0.5, 0.0]], digits=DIGITS)):
        with pytest.raises(ValueError, match=f"MAX_DIM = {mp.MAX_DIM}"):
            fn(np.ones(shape))


def test_bad_matrix_and_options_with_digits():
    with pytest.raises(ValueError, match="NaN or Inf"):
        ortho_ref.polar(np.array([[np.nan, 1.0]]), digits=DIGITS)
    with pytest.raises(TypeError, match="floating"):
        ortho_ref.polar(np.eye(2, dtype=int), digits=DIGITS)
    with pytest.raises(ValueError, match="eps_mode"):
        ortho_ref.ns_map(np.eye(2), [[1.5, -0.5, 0.0]], eps_mode="max", digits=DIGITS)
    with pytest.raises(ValueError, match="coefficients"):
        ortho_ref.ns_map(np.eye(2), [[1.5, -0.5]], digits=DIGITS)


def test_polar_tolerance_validity_limit():
    # DESIGN.md: first-order bound only where σ_k/‖A‖₂ >= 100·√k·u.
    k, u = 2, tol.unit_roundoff("float64")
    limit = tol.POLAR_VALIDITY * np.sqrt(k) * u
    assert tol.polar_tolerance(np.diag([1.0, 2 * limit])) is not None
    assert tol.polar_tolerance(np.diag([1.0, limit / 2])) is None
    assert tol.mp_agreement_tolerance(np.diag([1.0, limit / 2]), "polar") is None
    assert tol.polar_tolerance(np.zeros((2, 2))) is None
    with pytest.raises(ValueError, match="function"):
        tol.mp_agreement_tolerance(np.eye(2), "svd")
