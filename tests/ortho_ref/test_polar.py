"""ortho_ref.polar: properties of the polar decomposition, and bad input."""

import numpy as np
import pytest
from hypothesis import given, settings

import ortho_ref
from tests.strategies import spectral_matrices
from verify.tolerances import svd_residual_tolerance


@settings(max_examples=60, deadline=None)
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
    for fn in (ortho_ref.polar, ortho_ref.polar_decomposition, lambda x: ortho_ref.ns_map(x, [[1.5, -0.5, 0.0]])):
        with pytest.raises(exc, match=match) as info:
            fn(bad)
        assert "a:" in str(info.value)
