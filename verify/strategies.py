"""Hypothesis strategies: matrices with prescribed singular spectra, for testing orthogonalizers.

Every example is U diag(s) Vᵀ with Haar-random U, V (QR of a Gaussian with the sign fix,
``ortho_verify.inputs.spectra.haar_orthogonal``) and a spectrum s from one of six families, so the
singular values are known exactly and the singular vectors are in general position.
``hypothesis.extra.numpy.arrays`` is not used for matrices: its draws are mostly low rank
and never ill-conditioned in a controlled way.

Families (largest singular value 1 before scaling):

=================  ==============================================================
``geometric``      s_i = 10^(−c·i/(k−1)), condition number 10^c, c ∈ [0, 8]
``clustered``      1–4 clusters at geometric levels (cond ≤ 1e8), relative spread ≤ 1e-2
``rank_deficient`` rank r < k (geometric, cond ≤ 1e4), then k − r exact zeros
``dynamic_range``  geometric with condition number 10^c, c ∈ [8, 30]: most values
                   are below the float32 / float64 resolution of the largest one
``flat``           all ones (a scaled orthogonal matrix: σ̂ = 1/√k)
``two_level``      j values at 1, k − j at 10^−c, c ∈ [1, 8]
=================  ==============================================================

Scales from 1e-30 to 1e30 multiply the whole matrix (float64); float32 and bfloat16
inputs stop at ``MAX_SCALE`` (see there). Layouts: tall (m > n), wide (m < n), square,
optionally with batch dimensions (each batch element its own Haar vectors and its own
scale within 10^±2 of the example's, so a per-batch normalization bug shows).

Use in a test (``my_kernel``: your (..., m, n) -> (..., m, n) Newton–Schulz function)::

    from hypothesis import given
    from ortho_verify import check_orthogonalizer_example
    from ortho_verify.strategies import spectral_examples, target_worst_ratio

    @given(spectral_examples(dtypes=("float32",), max_batch=3))
    def test_my_kernel(example):
        results = check_orthogonalizer_example(my_kernel, example, coefficients="jordan")
        target_worst_ratio(results)          # steer the search toward the worst error/tolerance
        assert all(r.passed for r in results)
"""

from __future__ import annotations

import math

import numpy as np

from .inputs.examples import (
    DTYPES,
    LAYOUTS,
    MAX_SCALE,
    MIN_SCALE,
    SPECTRUM_KINDS,
    SpectralExample,
    build_example,
    make_spectrum,
)
from .inputs.spectra import haar_orthogonal, matrix_with_spectrum
from .optional import require

_hypothesis = require("hypothesis", "ortho_verify.strategies")
st = require("hypothesis.strategies", "ortho_verify.strategies")
note, target = _hypothesis.note, _hypothesis.target
currently_in_test_context = require("hypothesis.control", "ortho_verify.strategies").currently_in_test_context

__all__ = [
    "DTYPES", "LAYOUTS", "MAX_SCALE", "SPECTRUM_KINDS", "SpectralExample", "build_example", "haar_orthogonal",
    "make_spectrum", "spectral_examples", "spectral_matrices", "target_worst_ratio",
]

_PARAMETERS = {  # hypothesis strategies for each family's parameters
    "geometric": {"log_cond": st.floats(0.0, 8.0)},
    "clustered": {"clusters": st.integers(1, 4), "log_cond": st.floats(0.0, 8.0), "spread": st.floats(0.0, 1e-2)},
    "rank_deficient": {"rank_fraction": st.floats(0.0, 1.0), "log_cond": st.floats(0.0, 4.0)},
    "dynamic_range": {"log_cond": st.floats(8.0, 30.0)},
    "flat": {},
    "two_level": {"top_fraction": st.floats(0.0, 1.0), "log_gap": st.floats(1.0, 8.0)},
}


@st.composite
def _shapes(draw, layouts, min_dim: int, max_dim: int, max_batch: int) -> tuple[int, ...]:
    possible = [lay for lay in layouts if lay == "square" or max_dim > min_dim]
    layout = draw(st.sampled_from(possible))
    if layout == "square":
        m = n = draw(st.integers(min_dim, max_dim))
    else:
        small = draw(st.integers(min_dim, max_dim - 1))
        large = draw(st.integers(small + 1, max_dim))
        m, n = (large, small) if layout == "tall" else (small, large)
    batch = draw(st.lists(st.integers(1, max_batch), max_size=2)) if max_batch > 0 else []
    return (*batch, m, n)


@st.composite
def spectral_examples(draw, *, kinds=SPECTRUM_KINDS, dtypes=("float64",), layouts=LAYOUTS, min_dim: int = 1,
                      max_dim: int = 32, max_batch: int = 0, min_scale: float = MIN_SCALE,
                      max_scale: float = 1e30) -> SpectralExample:
    """Strategy for ``SpectralExample``: a family from ``kinds``, its parameters, a layout,
    batch dims (up to 2, each <= ``max_batch``; none when 0), a dtype from ``dtypes`` and a
    scale 10^U(log10 min_scale, log10 max) with max = min(max_scale, MAX_SCALE[dtype]).

    Records the example's provenance with ``hypothesis.note`` (printed with a failure).
    Raises: ValueError (from hypothesis, at draw time) for empty choices or min_dim > max_dim.
    """
    kind = draw(st.sampled_from(kinds))
    params = {name: draw(strategy) for name, strategy in _PARAMETERS[kind].items()}
    shape = draw(_shapes(layouts, min_dim, max_dim, max_batch))
    dtype = draw(st.sampled_from(dtypes))
    top = math.log10(min(max_scale, MAX_SCALE[dtype]))
    scale = 10.0 ** draw(st.floats(math.log10(min_scale), top))
    example = build_example(kind, params, shape=shape, scale=scale, dtype=dtype, seed=draw(st.integers(0, 2**32 - 1)))
    note(f"spectral example: {example.provenance}")
    return example


def target_worst_ratio(results, label: str = "error/tolerance") -> float:
    """Inside a hypothesis test: ``note()`` the worst result and ``target()`` its
    error/tolerance ratio (log10, capped at 1e6), so the search steers toward the inputs
    closest to failing. Outside a test it only returns the ratio.

    ``results``: objects with ``.ratio`` (``ortho_verify.checks.CheckResult``); returns the worst ratio.
    Raises: ValueError for an empty ``results``.
    """
    if not results:
        raise ValueError("results: expected at least one check result")
    worst = max(results, key=lambda r: r.ratio)
    if currently_in_test_context():
        note(f"worst check: {worst}")
        target(math.log10(min(max(worst.ratio, 1e-30), 1e6)), label=label)
    return worst.ratio


@st.composite
def spectral_matrices(draw, max_dim: int = 32, min_dim: int = 1, max_cond: float = 1e6, rank_deficient: bool = True):
    """(m, n) float64 matrix with Haar singular vectors and a drawn spectrum: geometric
    decay with condition number in [1, max_cond], optionally with trailing zeros, scaled by
    10^[-3, 3]. Returns (matrix, singular values descending, length min(m, n))."""
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
