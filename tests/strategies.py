"""Hypothesis strategies shared by the tests: matrices with prescribed spectra."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from verify.spectra import matrix_with_spectrum


@st.composite
def spectral_matrices(draw, max_dim: int = 32, min_dim: int = 1, max_cond: float = 1e6, rank_deficient: bool = True):
    """(m, n) float64 matrix with Haar singular vectors and a drawn spectrum: geometric
    decay with condition number in [1, max_cond], optionally with trailing zeros, scaled by
    10^[-3, 3]. Returns (matrix, singular values descending)."""
    m = draw(st.integers(min_dim, max_dim))
    n = draw(st.integers(min_dim, max_dim))
    k = min(m, n)
    log_cond = draw(st.floats(0.0, float(np.log10(max_cond))))
    rank = draw(st.integers(1, k)) if rank_deficient else k
    scale = 10.0 ** draw(st.floats(-3.0, 3.0))
    s = np.zeros(k)
    s[:rank] = scale * np.geomspace(1.0, 10.0 ** -log_cond, rank)
    seed = draw(st.integers(0, 2**32 - 1))
    return matrix_with_spectrum(s, m, n, np.random.default_rng(seed)), s
