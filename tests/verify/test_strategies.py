"""ortho_verify.strategies: prescribed spectra, families, scales, batches, provenance and targeting."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from ortho_verify.strategies import (
    MAX_SCALE,
    SPECTRUM_KINDS,
    build_example,
    make_spectrum,
    spectral_examples,
    target_worst_ratio,
)
from ortho_verify.tolerances import prescribed_spectrum_tolerance
from tests.strategies import spectral_matrices  # the re-export other tests use


@settings(deadline=None)
@given(spectral_examples(dtypes=("float64", "float32", "bfloat16"), max_batch=3, max_dim=24))
def test_examples_have_their_prescribed_spectra(example):
    *batch, m, n = example.matrix.shape
    assert example.singular_values.shape == (*batch, min(m, n))
    assert example.scale <= MAX_SCALE[example.dtype]
    for a, s in zip(example.matrix.reshape(-1, m, n), example.singular_values.reshape(-1, min(m, n))):
        assert np.all(np.diff(s) <= 0)
        computed = np.linalg.svd(a, compute_uv=False)
        assert np.max(np.abs(computed - s)) <= prescribed_spectrum_tolerance((m, n), s[0])
    # the tensor is the matrix rounded once to the input dtype, finite (no overflow at MAX_SCALE)
    t = example.tensor()
    assert t.dtype == getattr(torch, example.input_dtype) and bool(torch.isfinite(t).all())
    assert bool(torch.isfinite(torch.linalg.vector_norm(t, dim=(-2, -1))).all())


@pytest.mark.parametrize("kind", SPECTRUM_KINDS)
def test_families(kind):
    k = 12
    params = {"geometric": {"log_cond": 8.0}, "clustered": {"clusters": 3, "log_cond": 4.0, "spread": 1e-3},
              "rank_deficient": {"rank_fraction": 0.5, "log_cond": 2.0}, "dynamic_range": {"log_cond": 30.0},
              "flat": {}, "two_level": {"top_fraction": 0.25, "log_gap": 6.0}}[kind]
    s = make_spectrum(kind, k, **params)
    assert s.shape == (k,) and s[0] == 1.0 and np.all(np.diff(s) <= 0) and np.all(s >= 0)
    if kind in ("geometric", "dynamic_range"):
        assert s[-1] == pytest.approx(10.0 ** -params["log_cond"], rel=1e-12)
    if kind == "rank_deficient":
        assert 1 <= np.count_nonzero(s) < k
    if kind == "clustered":  # 3 groups whose levels differ by 1e2 and whose spread is 1e-3
        assert len(np.unique(np.round(np.log10(s)))) == 3
    if kind == "flat":
        assert np.all(s == 1.0)
    if kind == "two_level":
        assert set(np.unique(s)) == {1e-6, 1.0}


def test_batched_examples_have_per_matrix_scales_and_haar_vectors():
    ex = build_example("geometric", {"log_cond": 1.0}, shape=(2, 3, 10, 6), scale=1.0, seed=4)
    tops = ex.singular_values[..., 0].ravel()
    assert len(set(tops)) == 6 and tops.max() / tops.min() > 1.5  # 10^U(-2, 2) each
    mats = ex.matrix.reshape(6, 10, 6)
    assert not np.allclose(mats[0] / tops[0], mats[1] / tops[1])  # different singular vectors
    assert [c.name for c in ex.cases()][-1].endswith("[1, 2]")


def test_provenance_rebuilds_the_example():
    ex = build_example("two_level", {"top_fraction": 0.5, "log_gap": 3.0}, shape=(5, 9), scale=1e-30,
                       dtype="float32", seed=11)
    namespace = {"ortho_verify": __import__("ortho_verify.strategies")}
    again = eval(ex.provenance, namespace)
    assert np.array_equal(again.matrix, ex.matrix) and again.dtype == "float32"


def test_build_example_rejects_bad_arguments():
    for kwargs, word in (({"shape": (3,)}, "shape"), ({"shape": (3, 0)}, "shape"), ({"scale": -1.0}, "scale"),
                         ({"dtype": "int8"}, "dtype")):
        with pytest.raises(ValueError, match=word):
            build_example("flat", {}, **{"shape": (3, 3), **kwargs})
    with pytest.raises(ValueError, match="kind"):
        make_spectrum("noise", 3)


def test_target_worst_ratio_outside_a_test_returns_the_worst():
    class R:
        def __init__(self, ratio):
            self.ratio = ratio

    assert target_worst_ratio([R(0.1), R(3.0), R(math.inf)]) == math.inf
    with pytest.raises(ValueError, match="results"):
        target_worst_ratio([])


@settings(deadline=None)
@given(spectral_matrices(max_dim=12, max_cond=1e4), st.just(None))
def test_legacy_spectral_matrices_keeps_its_contract(drawn, _):
    a, s = drawn
    assert a.ndim == 2 and s.shape == (min(a.shape),) and np.all(np.diff(s) <= 0)
    assert np.max(np.abs(np.linalg.svd(a, compute_uv=False) - s)) <= prescribed_spectrum_tolerance(a.shape, s[0])


def test_module_docstring_example_runs_as_written():
    import textwrap

    import ortho_verify.strategies
    from ortho_verify.planted.bugs import newton_schulz_kernel

    doc = ortho_verify.strategies.__doc__
    code = textwrap.dedent(doc[doc.index("::\n") + 3:])
    namespace = {"my_kernel": newton_schulz_kernel}
    exec(compile(code, "verify/strategies.py docstring", "exec"), namespace)  # every name it uses is imported
    settings(max_examples=3, deadline=None, database=None)(namespace["test_my_kernel"])()


def test_verify_tests_leave_the_example_count_to_the_profile():
    """A hard-coded max_examples overrides the ortho-dev / ortho-ci / ortho-deep profiles
    (``--hypothesis-profile ortho-deep``)."""
    from pathlib import Path

    folder = Path(__file__).parent
    hard_coded = [f"{p.name}:{i}" for p in sorted(folder.glob("*.py"))
                  for i, line in enumerate(p.read_text().splitlines(), 1)
                  if line.lstrip().startswith("@settings(") and "max_examples" in line]
    assert not hard_coded, hard_coded
