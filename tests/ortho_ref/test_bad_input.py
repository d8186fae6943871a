"""Bad input to the oracle: numbers given as strings, a negative safety where only σ̂ is computed,
Dion2's ``ef_decay`` past 1, a divergent coefficient table. Each raises ValueError naming the
argument; Keller Jordan's overshoot and every registered schedule stay valid.
"""

from __future__ import annotations

import numpy as np
import pytest

import ortho_fast
import ortho_ref
import ortho_verify

A = np.random.default_rng(0).standard_normal((6, 4))
JORDAN = ortho_ref.schedule("jordan")


@pytest.mark.parametrize("kw, name", [(dict(safety="1.0"), "safety"), (dict(eps="1e-7"), "eps"),
                                      (dict(safety=b"1"), "safety"), (dict(safety=-1.0), "safety")])
@pytest.mark.parametrize("fn", ["ns_map", "normalized_singular_values", "muon_step"])
def test_normalization_options(fn, kw, name):
    call = {"ns_map": lambda: ortho_ref.ns_map(A, JORDAN, **kw),
            "normalized_singular_values": lambda: ortho_ref.normalized_singular_values(A, **kw),
            "muon_step": lambda: ortho_ref.muon_step(A, A, A, lr=0.1, coefficients=JORDAN, **kw)}[fn]
    with pytest.raises(ValueError, match=f"^{name}: expected a"):
        call()


def test_a_number_as_a_number_still_passes():
    assert np.array_equal(ortho_ref.ns_map(A, JORDAN, safety=np.float64(1.0)), ortho_ref.ns_map(A, JORDAN))


def test_the_judge_names_a_negative_safety():
    """check_orthogonalizer computes σ̂ with the user's safety: the error names ``safety``."""
    with pytest.raises(ValueError, match="^safety: "):
        ortho_verify.check_orthogonalizer(ortho_fast.newton_schulz, safety=-1.0)


@pytest.mark.parametrize("ef_decay", [1.5, 1.0 + 1e-12, -0.1, "0.9"])
def test_dion2_ef_decay_outside_zero_one(ef_decay):
    with pytest.raises(ValueError, match="^ef_decay: "):
        ortho_ref.dion2_step(A, A, A, lr=0.1, ef_decay=ef_decay)


@pytest.mark.parametrize("ef_decay", [0.0, 1.0])
def test_dion2_ef_decay_ends_are_valid(ef_decay):
    assert ortho_ref.dion2_step(A, A, A, lr=0.1, ef_decay=ef_decay).weight.shape == A.shape


@pytest.mark.parametrize("table, step", [([(3.4445, 4.775, 2.0315)] * 5, 2), ([(20.0, 0.0, 0.0)], 1),
                                         ([(1.5, -0.5, 0.0), (1.5, -0.5, 0.0), (40.0, 0.0, 0.0)], 3)])
def test_divergent_table_names_the_table_and_the_step(table, step):
    with pytest.raises(ValueError, match=f"^coefficients: a divergent schedule: after step {step} of"):
        ortho_ref.ns_map(A, table)
    with pytest.raises(ValueError, match="^coefficients: a divergent schedule"):
        ortho_ref.muon_step(A, A, A, lr=0.1, coefficients=table)


def test_the_bound_is_where_the_sup_passes_it():
    """A one-step table a·x has sup |a| on [0, 1]: 16 is accepted, the next float above it is not."""
    ortho_ref.ns_map(A, [(ortho_ref.NS_MAP_BOUND, 0.0, 0.0)])
    with pytest.raises(ValueError, match="divergent"):
        ortho_ref.ns_map(A, [(np.nextafter(ortho_ref.NS_MAP_BOUND, np.inf), 0.0, 0.0)])


@pytest.mark.parametrize("name", sorted(ortho_ref.SCHEDULES))
def test_registered_schedules_stay_within_the_bound(name):
    sups = ortho_ref.ns_map_sups(ortho_ref.schedule(name, 12))
    assert max(sups) < 2.0
    if name == "jordan":
        assert 1.2 < max(sups) < 1.21  # the overshoot the bound must keep
