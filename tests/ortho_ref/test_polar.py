"""ortho_ref.polar: properties of the polar decomposition, and bad input."""

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings

import ortho_ref
from ortho_verify.tolerances import mp_accuracy, polar_condition_tolerance, svd_residual_tolerance
from tests.strategies import spectral_matrices


@settings(deadline=None)
@given(spectral_matrices())
def test_polar_properties(case):
    a, s = case
    m, n = a.shape
    u, h = ortho_ref.polar_decomposition(a)
    k = min(m, n)
    gram = u.T @ u if m >= n else u @ u.T
    rank = int(np.sum(s > 0))
    if rank == k:  # the polar factor has orthonormal columns (rows) only at full rank
        assert np.linalg.norm(gram - np.eye(k)) <= svd_residual_tolerance(a.shape)
    assert np.linalg.norm(u @ h - a) <= svd_residual_tolerance(a.shape, float(s[0]))
    assert np.array_equal(h, h.T)
    eig = np.linalg.eigvalsh(h)
    assert eig.min() >= -svd_residual_tolerance(a.shape, float(s[0]))
    assert np.array_equal(ortho_ref.polar(a), u)


def test_polar_of_orthogonal_is_itself():
    q = np.linalg.qr(np.random.default_rng(0).standard_normal((7, 4)))[0]
    assert np.linalg.norm(ortho_ref.polar(q) - q) <= svd_residual_tolerance(q.shape)


def test_polar_matches_scipy():
    import scipy.linalg

    a = np.random.default_rng(1).standard_normal((9, 5))
    u_ref, _ = scipy.linalg.polar(a)
    assert np.linalg.norm(ortho_ref.polar(a) - u_ref) <= svd_residual_tolerance(a.shape)


@settings(deadline=None)
@given(spectral_matrices())
def test_polar_condition_formula(case):
    # Higham, Functions of Matrices, Thm. 8.9, from the computed singular values: exact.
    a, _ = case
    s = ortho_ref.singular_values(a)
    kappa = ortho_ref.polar_condition(a)
    if s[-1] == 0.0:
        assert kappa == np.inf
    elif a.shape[0] != a.shape[1]:
        assert kappa == 1.0 / s[-1]
    elif a.shape[0] == 1:
        assert kappa == 0.0
    else:
        assert kappa == 2.0 / (s[-1] + s[-2])


def _diagonal_case(m, n, s):
    """A = diag(s) padded to (m, n) and its worst-case direction E (integers, exact in float64):
    the skew pair of the last two singular directions (square) or the last column moved into
    the orthogonal complement (tall; wide is its transpose)."""
    k = min(m, n)
    a = np.zeros((max(m, n), k))
    a[np.arange(k), np.arange(k)] = s
    e = np.zeros_like(a)
    if m == n:
        e[k - 2, k - 1], e[k - 1, k - 2] = 1.0, -1.0
    else:
        e[k, k - 1] = 1.0
    return (a, e) if m >= n else (a.T, e.T)


@pytest.mark.parametrize("m, n, s", [(4, 4, [9.0, 7.0, 3.0, 2.0]), (5, 3, [8.0, 5.0, 3.0]), (2, 6, [6.0, 1.0]),
                                     (2, 2, [1000.0, 1.0])])
def test_polar_condition_is_attained(m, n, s):
    # Central difference of the exact (50-digit) polar factor along the worst-case direction E,
    # h = 2^-30 so that A ± hE are exact float64 matrices. For these inputs the polar factor
    # along A + tE is known in closed form (a plane rotation by atan(2t/(σ_{n-1} + σ_n)), or
    # the last column (σ_k e_k + t e_{k+1})/√(σ_k² + t²)), giving
    # ‖D‖_F/‖E‖_F = κ/√(1 + x²) with x = 2h/(σ_{n-1} + σ_n) (square) or h/σ_k (rectangular).
    a, e = _diagonal_case(m, n, np.array(s))
    h = 2.0**-30
    digits = 50
    plus, minus = ortho_ref.polar(a + h * e, digits=digits), ortho_ref.polar(a - h * e, digits=digits)
    with mpmath.workdps(2 * digits):
        e_norm = mpmath.sqrt(float(np.sum(e * e)))  # exact: e has integer entries
        ratio = mpmath.sqrt(sum(x**2 for x in ((plus - minus) / (2 * h)).ravel())) / e_norm
        if m == n:
            kappa, x = mpmath.mpf(2) / (s[-1] + s[-2]), mpmath.mpf(2 * h) / (s[-1] + s[-2])
        else:
            kappa, x = 1 / mpmath.mpf(s[-1]), mpmath.mpf(h) / s[-1]
        closed_form = kappa / mpmath.sqrt(1 + x**2)
        # each 50-digit factor is within mp_accuracy of the exact one (Frobenius)
        assert abs(ratio - closed_form) <= mp_accuracy(a.shape, digits) / (h * e_norm)
    assert abs(ortho_ref.polar_condition(a) - float(kappa)) <= polar_condition_tolerance(a)


def test_polar_condition_special_cases():
    assert ortho_ref.polar_condition(np.array([[-3.0]])) == 0.0  # sign(a) is locally constant
    assert ortho_ref.polar_condition(np.array([[0.0]])) == np.inf
    assert ortho_ref.polar_condition(np.array([[1.0, 0.0], [2.0, 0.0]])) == np.inf  # a zero column
    assert ortho_ref.polar_condition(np.array([[2.0], [0.0]])) == 0.5


@pytest.mark.parametrize(
    "bad, exc, match",
    [
        (np.ones(3), ValueError, "2-D"),
        (np.ones((2, 2, 2)), ValueError, "2-D"),
        (np.ones((0, 3)), ValueError, "non-empty"),
        (np.ones((3, 3), dtype=np.int64), TypeError, "floating"),
        (np.ones((3, 3), dtype=complex), TypeError, "floating"),
        (np.array([[1.0, np.nan], [0.0, 1.0]]), ValueError, "NaN or Inf"),
        (np.array([[1.0, np.inf], [0.0, 1.0]]), ValueError, "NaN or Inf"),
    ],
)
def test_bad_input(bad, exc, match):
    for fn in (ortho_ref.polar, ortho_ref.polar_decomposition, ortho_ref.polar_condition,
               lambda x: ortho_ref.ns_map(x, [[1.5, -0.5, 0.0]])):
        with pytest.raises(exc, match=match) as info:
            fn(bad)
        assert "a:" in str(info.value)
