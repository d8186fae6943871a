"""Tests for ortho_verify.inputs.spectra: Haar matrices and matrices with prescribed spectra."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from ortho_verify.inputs.spectra import MatrixCase, haar_orthogonal, matrix_with_spectrum, synthetic_matrices
from ortho_verify.tolerances import U64 as U, prescribed_spectrum_tolerance


def tol_constant(m: int, n: int) -> float:
    """The tolerance of ortho_verify.tolerances.prescribed_spectrum_tolerance in units of u·σ_max."""
    return prescribed_spectrum_tolerance((m, n)) / U


dims = st.integers(min_value=1, max_value=40)
# Zero or a normal float far from under/overflow, so that rounding (not underflow)
# is the only error source the tolerance has to cover.
singular_value = st.one_of(st.just(0.0), st.floats(min_value=1e-12, max_value=1e12))


@st.composite
def shape_and_spectrum(draw):
    m, n = draw(dims), draw(dims)
    s = draw(st.lists(singular_value, min_size=0, max_size=min(m, n)))
    return m, n, np.array(s, dtype=np.float64)


@given(shape_and_spectrum(), st.integers(0, 2**32 - 1))
def test_singular_values_match_prescribed(case, seed):
    m, n, s = case
    a = matrix_with_spectrum(s, m, n, np.random.default_rng(seed))
    assert a.shape == (m, n) and a.dtype == np.float64
    expected = np.zeros(min(m, n))
    expected[: s.size] = np.sort(s)[::-1]
    computed = np.linalg.svd(a, compute_uv=False)
    sigma_max = s.max(initial=0.0)
    assert np.max(np.abs(computed - expected)) <= tol_constant(m, n) * U * sigma_max


@given(dims, st.integers(0, 2**32 - 1))
def test_haar_is_orthogonal(n, seed):
    q = haar_orthogonal(n, np.random.default_rng(seed))
    assert q.shape == (n, n) and q.dtype == np.float64
    assert np.linalg.norm(q.T @ q - np.eye(n), 2) <= tol_constant(n, n) * U


def test_haar_sign_fix_gives_positive_r_diagonal():
    # Q^T Z must be the R factor of the unique QR with positive diagonal (Mezzadri 2007).
    rng = np.random.default_rng(7)
    q = haar_orthogonal(12, rng)
    z = np.random.default_rng(7).standard_normal((12, 12))
    r = q.T @ z
    assert np.all(np.diag(r) > 0)
    assert np.allclose(np.tril(r, -1), 0.0, atol=prescribed_spectrum_tolerance(z.shape, np.linalg.norm(z, 2)))


def test_haar_mean_is_zero():
    # Haar measure is invariant under Q -> -Q, so E[Q] = 0; without the sign fix it is not.
    rng = np.random.default_rng(0)
    n, draws = 4, 4000
    mean = sum(haar_orthogonal(n, rng) for _ in range(draws)) / draws
    # Each entry has variance 1/n, so the sample mean has std 1/sqrt(n * draws); 5 sigma.
    assert np.max(np.abs(mean)) < 5.0 / np.sqrt(n * draws)


@pytest.mark.parametrize(
    "args, word",
    [
        (([1.0, -1.0], 3, 3), "singular_values"),
        (([1.0, np.nan], 3, 3), "singular_values"),
        (([1.0, np.inf], 3, 3), "singular_values"),
        (([[1.0]], 3, 3), "singular_values"),
        (([1.0, 1.0, 1.0], 2, 5), "min\\(m, n\\)"),
        (([1.0], 0, 3), "m and n"),
        (([1.0], 3, -1), "m and n"),
    ],
)
def test_matrix_with_spectrum_rejects_bad_input(args, word):
    with pytest.raises(ValueError, match=word):
        matrix_with_spectrum(*args, np.random.default_rng(0))


def test_haar_rejects_bad_n():
    with pytest.raises(ValueError, match="n must be"):
        haar_orthogonal(0, np.random.default_rng(0))


def test_matrix_case_validates():
    with pytest.raises(ValueError, match="float64"):
        MatrixCase("x", np.zeros((2, 2), dtype=np.float32), "synthetic", "d")
    with pytest.raises(ValueError, match="source"):
        MatrixCase("x", np.zeros((2, 2)), "made-up", "d")


@pytest.mark.parametrize("quick", [True, False])
def test_synthetic_matrices_have_their_spectra(quick):
    cases = synthetic_matrices(quick=quick, seed=3)
    names = [c.name for c in cases]
    assert len(names) == len(set(names))
    families = {name.split("/")[1] for name in names}
    assert families == {"well-conditioned", "cond1e6", "rank-deficient", "tall", "wide", "square"}
    for c in cases:
        m, n = c.matrix.shape
        assert c.source == "synthetic" and c.name.endswith(f"/{m}x{n}") and c.description
        s = np.linalg.svd(c.matrix, compute_uv=False)
        assert abs(s[0] - 1.0) <= tol_constant(m, n) * U
        family = c.name.split("/")[1]
        if family == "tall":
            assert m > n
        if family == "wide":
            assert m < n
        if family == "cond1e6":
            assert abs(s[-1] - 1e-6) <= tol_constant(m, n) * U
        if family == "rank-deficient":
            r = min(m, n) // 4
            assert s[r - 1] >= 0.1 - tol_constant(m, n) * U and s[r] <= tol_constant(m, n) * U


def test_synthetic_matrices_deterministic_and_quick_is_prefix():
    quick = synthetic_matrices(quick=True, seed=5)
    full = synthetic_matrices(quick=False, seed=5)
    again = synthetic_matrices(quick=True, seed=5)
    other = synthetic_matrices(quick=True, seed=6)
    assert len(full) > len(quick)
    assert max(max(c.matrix.shape) for c in full) <= 512
    for a, b, c, d in zip(quick, full, again, other):
        assert a.name == b.name == c.name
        assert np.array_equal(a.matrix, b.matrix) and np.array_equal(a.matrix, c.matrix)
        assert not np.array_equal(a.matrix, d.matrix)
