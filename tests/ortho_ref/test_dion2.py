"""Reference Dion2 (``ortho_ref.dion2``): the selection (dimension, count, L1 norm, ties, local
scope), error feedback on the selected slices only, the submatrix orthogonalization and the
update, as exact identities and properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ortho_ref
from ortho_ref.dion2 import (
    dion2_num_selected,
    dion2_select,
    dion2_select_rows,
    dion2_shard_chunks,
    dion2_slice_norms,
    dion2_step,
)

PE = ortho_ref.schedule("polar_express")


def _arrays(seed: int, m: int, n: int):
    rng = np.random.default_rng(seed)
    return 0.02 * rng.standard_normal((m, n)), rng.standard_normal((m, n)), 0.5 * rng.standard_normal((m, n))


shapes = st.tuples(st.integers(1, 12), st.integers(1, 12))
fractions = st.sampled_from([0.1, 0.25, 0.3, 0.5, 0.75, 1.0])


@settings(deadline=None, max_examples=40)
@given(shape=shapes, fraction=fractions, seed=st.integers(0, 2**31), ef=st.floats(0.0, 1.0))
def test_selection_momentum_and_update_slices(shape, fraction, seed, ef):
    m, n = shape
    w, g, mom = _arrays(seed, m, n)
    step = dion2_step(w, g, mom, lr=0.1, fraction=fraction, ef_decay=ef, weight_decay=0.1)
    b = mom + g
    rows = m <= n
    assert step.rows is rows
    size = m if rows else n
    assert step.selected.size == min(size, max(1, math.ceil(fraction * size)))
    mask = np.zeros(size, dtype=bool)
    mask[step.selected] = True
    view = (lambda a: a) if rows else (lambda a: a.T)
    # error feedback only on the selected slices: exactly ef·B there, B elsewhere
    np.testing.assert_array_equal(view(step.momentum)[mask], ef * view(b)[mask])
    np.testing.assert_array_equal(view(step.momentum)[~mask], view(b)[~mask])
    # the update is zero off the selection; there it is ns_map of the submatrix
    assert not np.any(view(step.update)[~mask])
    sub = view(b)[mask]
    np.testing.assert_allclose(view(step.update)[mask], ortho_ref.ns_map(sub, PE, safety=1.02, eps=1e-8).reshape(
        sub.shape) if rows else ortho_ref.ns_map(sub.T, PE, safety=1.02, eps=1e-8).T, rtol=0, atol=1e-13)
    # every selected L1 norm is >= every unselected one
    if mask.any() and (~mask).any():
        assert step.norms[mask].min() >= step.norms[~mask].max()
    scale = math.sqrt(m / n)
    np.testing.assert_allclose(step.weight, w * (1 - 0.1 * 0.1) - 0.1 * scale * step.update, rtol=0, atol=1e-15)


@settings(deadline=None, max_examples=25)
@given(shape=shapes, seed=st.integers(0, 2**31))
def test_fraction_one_is_the_whole_matrix(shape, seed):
    w, g, mom = _arrays(seed, *shape)
    step = dion2_step(w, g, mom, fraction=1.0, orthogonalizer="polar")
    np.testing.assert_allclose(step.update, ortho_ref.polar(mom + g), atol=1e-12)
    np.testing.assert_allclose(step.momentum, 0.95 * (mom + g), atol=0)


@settings(deadline=None, max_examples=25)
@given(shape=st.tuples(st.integers(2, 10), st.integers(2, 10)), seed=st.integers(0, 2**31))
def test_polar_submatrix_is_orthonormal_along_the_selected_slices(shape, seed):
    w, g, mom = _arrays(seed, *shape)
    step = dion2_step(w, g, mom, fraction=0.5, orthogonalizer="polar")
    sub = step.update[step.selected] if step.rows else step.update[:, step.selected].T
    np.testing.assert_allclose(sub @ sub.T, np.eye(sub.shape[0]), atol=1e-12)


@settings(deadline=None, max_examples=25)
@given(shape=shapes, seed=st.integers(0, 2**31), perm_seed=st.integers(0, 2**31))
def test_permutation_equivariance(shape, seed, perm_seed):
    """Permuting the slices permutes the step (random data: no ties, the selection moves along)."""
    m, n = shape
    w, g, mom = _arrays(seed, m, n)
    rows = m <= n
    perm = np.random.default_rng(perm_seed).permutation(m if rows else n)
    p = (lambda a: a[perm]) if rows else (lambda a: a[:, perm])
    a, b = dion2_step(w, g, mom, fraction=0.3), dion2_step(p(w), p(g), p(mom), fraction=0.3)
    np.testing.assert_allclose(b.weight, p(a.weight), atol=1e-12)
    np.testing.assert_array_equal(b.momentum, p(a.momentum))


def test_l1_not_l2_and_columns_for_tall():
    """Row 0 has the larger L2 norm, row 1 the larger L1 norm: L1 picks row 1. A tall matrix
    selects columns."""
    b = np.array([[3.0, 0.0, 0.0], [1.5, 1.5, 1.5]])
    step = dion2_step(np.zeros((2, 3)), b, np.zeros((2, 3)), fraction=0.5)
    assert step.rows and step.selected.tolist() == [1]
    tall = dion2_step(np.zeros((3, 2)), b.T, np.zeros((3, 2)), fraction=0.5)
    assert not tall.rows and tall.selected.tolist() == [1]
    assert not np.any(tall.update[:, 0])


def test_num_selected_follows_the_reference_float_ceiling():
    assert dion2_num_selected(0.07, 100) == 8  # 0.07·100 = 7.000000000000001 in float64, as microsoft/dion
    assert dion2_num_selected(0.3, 10) == 3
    assert dion2_num_selected(0.25, 8) == 2
    assert dion2_num_selected(0.01, 8) == 1
    assert dion2_num_selected(1.0, 7) == 7
    assert dion2_select_rows(4, 4) and not dion2_select_rows(5, 4)
    for bad in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match="fraction"):
            dion2_num_selected(bad, 4)


def test_ties_lower_index_and_given_selection():
    assert dion2_select([1.0, 2.0, 2.0, 0.5], 1).tolist() == [1]
    assert dion2_select([2.0, 2.0, 2.0], 2).tolist() == [0, 1]
    w, g, mom = _arrays(3, 4, 6)
    given_sel = dion2_step(w, g, mom, fraction=0.5, selected=[3, 0])
    assert given_sel.selected.tolist() == [0, 3]
    with pytest.raises(ValueError, match="selected"):
        dion2_step(w, g, mom, selected=[0, 0])


@settings(deadline=None, max_examples=25)
@given(size=st.integers(1, 20), shards=st.integers(1, 8), fraction=fractions, seed=st.integers(0, 2**31))
def test_local_scope_is_per_shard_top_k(size, shards, fraction, seed):
    w, g, mom = _arrays(seed, size, 24)
    chunks = dion2_shard_chunks(size, shards)
    assert np.array_equal(np.concatenate(chunks), np.arange(size))
    step = dion2_step(w, g, mom, fraction=fraction, selection_scope="local", shards=chunks)
    k = max(1, math.ceil(fraction * max(c.size for c in chunks)))
    norms = dion2_slice_norms(mom + g, True)
    for c in chunks:
        mine = np.intersect1d(step.selected, c)
        assert mine.size == min(k, c.size)
        rest = np.setdiff1d(c, mine)
        if mine.size and rest.size:
            assert norms[mine].min() >= norms[rest].max()
    one = dion2_step(w, g, mom, fraction=fraction, selection_scope="local", shards=[np.arange(size)])
    np.testing.assert_array_equal(one.weight, dion2_step(w, g, mom, fraction=fraction).weight)


def test_bad_input_names_the_argument():
    w, g, mom = _arrays(0, 3, 4)
    for kwargs, name in (({"fraction": 0.0}, "fraction"), ({"ef_decay": -1.0}, "ef_decay"), ({"lr": -1.0}, "lr"),
                         ({"adjust_lr": "original"}, "adjust_lr"), ({"selection_scope": "all"}, "selection_scope"),
                         ({"orthogonalizer": "qr"}, "orthogonalizer"),
                         ({"selection_scope": "local", "shards": [[0, 1]]}, "shards")):
        with pytest.raises(ValueError, match=name):
            dion2_step(w, g, mom, **kwargs)
    with pytest.raises(ValueError, match="grad"):
        dion2_step(w, g[:2], mom)


def test_zero_accumulation_gives_no_update():
    z = np.zeros((3, 5))
    step = dion2_step(np.ones((3, 5)), z, z, lr=0.1, weight_decay=0.0)
    assert not np.any(step.update) and np.array_equal(step.weight, np.ones((3, 5)))


@pytest.mark.parametrize("orthogonalizer", ["newton_schulz", "polar"])
def test_mpmath_tier_agrees_with_float64(orthogonalizer):
    """The submatrix orthogonalized at 40 digits agrees with the float64 oracle within
    ``mp_agreement_tolerance`` of that submatrix (times lr·s in the weight)."""
    from ortho_verify import tolerances as tol

    w, g, mom = _arrays(7, 6, 9)
    hi = dion2_step(w, g, mom, fraction=0.5, orthogonalizer=orthogonalizer, digits=40)
    lo = dion2_step(w, g, mom, fraction=0.5, orthogonalizer=orthogonalizer)
    sub = (mom + g)[lo.selected]
    bound = tol.mp_agreement_tolerance(sub, "ns_map" if orthogonalizer == "newton_schulz" else "polar", PE,
                                       safety=1.02, eps=1e-8, digits=40)
    assert bound is not None
    assert np.linalg.norm(hi.update - lo.update) <= bound
    assert np.array_equal(hi.momentum, lo.momentum) and np.array_equal(hi.selected, lo.selected)
