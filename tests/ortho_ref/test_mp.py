"""ortho_ref's mpmath tier: float64 oracle vs 50 digits, the tier's own accuracy, bad input."""

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ortho_ref
from ortho_ref import mp
from ortho_verify import tolerances as tol
from tests.strategies import spectral_matrices

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


# The mpmath tests keep an explicit max_examples (it overrides the dev/ci/deep profiles on
# purpose): one example costs up to ~0.2 s (a 16 x 16 SVD at 50 digits, pure Python), so the
# default run takes 6 and the slow test below 150.
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
    from ortho_verify.inputs.spectra import matrix_with_spectrum

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


#: Digits at which the rank-deficient residuals are evaluated.
EVAL_DIGITS = 40


def _partial_isometry_residual_bounds(eps: float, norm_a: float, rank: int) -> dict:
    """Bounds on four residuals of u = U + E, U the exact rank-``rank`` partial isometry of A
    (Uᵀ A = H symmetric, U v = 0 for A v = 0), ‖E‖_F <= eps — exact in E, not first order:

    - isometry ‖u uᵀu − u‖_F: −E(I − UᵀU) + U EᵀU + U UᵀE (first order, ‖U‖₂ = 1) plus
      EEᵀU + EUᵀE + UEᵀE and EEᵀE: 3eps + 3eps² + eps³;
    - symmetry ‖uᵀA − Aᵀu‖_F = ‖EᵀA − AᵀE‖_F <= 2·eps·‖A‖₂ (linear in E);
    - trace |tr(uᵀu) − rank| = |2 tr(EᵀU) + ‖E‖_F²| <= 2·eps·√rank + eps² (‖U‖_F = √rank);
    - null space ‖u(e₁ − e₃)‖ = ‖E(e₁ − e₃)‖ <= √2·eps (linear in E);

    each plus the rounding of evaluating it at EVAL_DIGITS digits: a few dozen operations on
    entries of size <= max(1, ‖A‖₂), relative error 10^-EVAL_DIGITS each, < 10^(2 − EVAL_DIGITS)
    per unit of that size.
    """
    rounding = 10.0 ** (2 - EVAL_DIGITS)
    return {"isometry": 3 * eps + 3 * eps**2 + eps**3 + rounding, "symmetry": (2 * eps + rounding) * max(1.0, norm_a),
            "trace": 2 * eps * math.sqrt(rank) + eps**2 + rounding, "null": math.sqrt(2) * eps + rounding}


def test_rank_deficient_polar_is_the_partial_isometry():
    b = np.arange(12.0).reshape(6, 2) + 1.0
    a = np.hstack([b, b[:, :1]])  # rank 2 exactly: column 3 is a float64 copy of column 1
    u = ortho_ref.polar(a, digits=30)
    # E = u − U_exact has ‖E‖_F <= eps (the tier's contract, ``mp_accuracy``)
    norm_a = float(np.linalg.norm(a, 2))
    bounds = _partial_isometry_residual_bounds(tol.mp_accuracy(a.shape, 30), norm_a, rank=2)
    with mpmath.workdps(EVAL_DIGITS):
        gram = u.T @ u
        isometry_err = mpmath.sqrt(sum(x**2 for x in (u @ gram - u).ravel()))
        sym_err = mpmath.sqrt(sum(x**2 for x in (u.T @ a - a.T @ u).ravel()))
        trace = sum(gram[i, i] for i in range(3))
        null = mpmath.sqrt(sum(x**2 for x in (u[:, 0] - u[:, 2])))  # A(e1 − e3) = 0
        assert isometry_err <= bounds["isometry"]
        assert sym_err <= bounds["symmetry"]
        assert abs(trace - 2) <= bounds["trace"]
        assert null <= bounds["null"]


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
    for fn in (lambda a: ortho_ref.polar(a, digits=DIGITS),
               lambda a: ortho_ref.ns_map(a, [[1.5, -0.5, 0.0]], digits=DIGITS)):
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
    # called directly, the tier validates like ortho_ref.ns_map (safety = 0 divided by zero before)
    for kw, match in [(dict(safety=0.0), "^safety:"), (dict(eps=-1.0), "^eps:"), (dict(eps_mode="max"), "^eps_mode:")]:
        args = {**dict(safety=1.0, eps=1e-7, eps_mode="add"), **kw}
        with pytest.raises(ValueError, match=match):
            mp.ns_map(np.eye(2), [[1.5, -0.5, 0.0]], digits=DIGITS, **args)
    with pytest.raises(ValueError, match="^coefficients:"):
        mp.ns_map(np.eye(2), [[1.5, -0.5]], safety=1.0, eps=1e-7, eps_mode="add", digits=DIGITS)


def test_polar_tolerance_validity_limit():
    # docs/design.md, "Tolerances": first-order bound only where σ_k/‖A‖₂ >= 100·√k·u.
    k, u = 2, tol.unit_roundoff("float64")
    limit = tol.POLAR_VALIDITY * np.sqrt(k) * u
    assert tol.polar_tolerance(np.diag([1.0, 2 * limit])) is not None
    assert tol.polar_tolerance(np.diag([1.0, limit / 2])) is None
    assert tol.mp_agreement_tolerance(np.diag([1.0, limit / 2]), "polar") is None
    assert tol.polar_tolerance(np.zeros((2, 2))) is None
    with pytest.raises(ValueError, match="function"):
        tol.mp_agreement_tolerance(np.eye(2), "svd")
