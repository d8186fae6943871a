"""The reduction-order bound of a bfloat16 Newton–Schulz (``sharded_compute_tolerance``) and state
placement recognition (``ortho_verify.sharding.placement.recognize``), without launching."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_ref
from ortho_verify.sharding.placement import recognize, state_placement
from ortho_verify.tolerances import newton_schulz_in, sharded as sharded_module, sharded_compute_tolerance
from tests.strategies import profile_examples

JORDAN = ortho_ref.schedule("jordan")


def _u(m, n, seed):
    return np.random.default_rng(seed).standard_normal((m, n))


@settings(deadline=None, **profile_examples(3))
@given(m=st.integers(3, 16), n=st.integers(3, 16), seed=st.integers(0, 10**6), w=st.sampled_from([2, 4]))
def test_reduction_orders_pass_and_a_step_beyond_fails(m, n, seed, w):
    u = _u(m, n, seed)
    tol, sim = sharded_compute_tolerance(u, JORDAN, "bfloat16", w, "float32")
    one = newton_schulz_in(u, JORDAN, "bfloat16")
    # the same map written differently: rows and columns permuted (every sum in another order), undone after
    rng = np.random.default_rng(seed + 2)
    rows, cols = rng.permutation(m), rng.permutation(n)
    other = newton_schulz_in(u[rows][:, cols], JORDAN, "bfloat16")[np.argsort(rows)][:, np.argsort(cols)]
    assert float((other - one).norm() / one.norm()) <= tol
    # a difference just beyond the bound fails
    noise = torch.from_numpy(np.random.default_rng(seed + 1).standard_normal((m, n)))
    bad = one + 1.01 * tol * one.norm() * noise / noise.norm()
    assert float((bad - one).norm() / one.norm()) > tol


@settings(deadline=None, **profile_examples(3))
@given(m=st.integers(3, 16), n=st.integers(3, 16), seed=st.integers(0, 10**6))
def test_the_sharded_runs_own_l2_input_is_covered(m, n, seed):
    """U_s = U + wd·ΔW (the sharded run's weight off one process's by lr·s times a bfloat16 update
    difference): the sharded evaluation at U_s, rows and columns permuted, within the bound given U_s; the
    term vanishes for U_s = U. (A step beyond the bound fails: the test above and test_sharded_l2.py.)"""
    rng = np.random.default_rng(seed)
    u, dw = _u(m, n, seed), rng.standard_normal((m, n))
    u_s = u + 0.1 * 0.02 * 0.05 * dw * np.sqrt(min(m, n)) / np.linalg.norm(dw)  # wd·lr·5%·‖O‖_F
    tol, sim = sharded_compute_tolerance(u, JORDAN, "bfloat16", 2, "float32", u_sharded=u_s)
    assert tol >= sharded_compute_tolerance(u, JORDAN, "bfloat16", 2, "float32")[0]
    assert sharded_compute_tolerance(u, JORDAN, "bfloat16", 2, "float32", u_sharded=u.copy()) == \
        sharded_compute_tolerance(u, JORDAN, "bfloat16", 2, "float32")
    one = newton_schulz_in(u, JORDAN, "bfloat16")
    rows, cols = rng.permutation(m), rng.permutation(n)
    other = newton_schulz_in(u_s[rows][:, cols], JORDAN, "bfloat16")[np.argsort(rows)][:, np.argsort(cols)]
    assert float((other - one).norm() / one.norm()) <= tol


def _small(seed):
    """A small input (3..8 × 3..8: few roundings per product, the widest spread of realizations)."""
    rng = np.random.default_rng(seed)
    m, n = int(rng.integers(3, 9)), int(rng.integers(3, 9))
    return _u(m, n, seed)


# inputs on which a random deal exceeded the bound built on the three block orders alone (1.16-1.73x)
DEALT = [149, 264, 658, 677]


@pytest.mark.parametrize("seed", DEALT)
def test_a_random_deal_of_the_inner_sums_is_within_the_bound(seed, monkeypatch):
    """A sharded run may sum its partial products in an order the judge does not simulate (a ring
    all-reduce starts each output chunk on another rank): a seeded random deal of every product's
    inner indices to 2 ranks, another than the bound's own (seed 1000), is within the bound; the bound
    without its ``RANDOM_SPLITS`` deals fails it on these inputs."""
    u = _small(seed)
    one = newton_schulz_in(u, JORDAN, "bfloat16")
    dealt = newton_schulz_in(u, JORDAN, "bfloat16", 2, order="random", seed=1000)
    difference = float((dealt - one).norm() / one.norm())
    assert difference <= sharded_compute_tolerance(u, JORDAN, "bfloat16", 2, "float32")[0]
    monkeypatch.setattr(sharded_module, "RANDOM_SPLITS", 0)
    assert difference > sharded_compute_tolerance(u, JORDAN, "bfloat16", 2, "float32")[0]


@settings(deadline=None, **profile_examples(3))
@given(seed=st.integers(0, 10**6), deal=st.integers(sharded_module.RANDOM_SPLITS, 10**6), w=st.sampled_from([2, 4]))
def test_random_deals_on_small_inputs_are_within_the_bound(seed, deal, w):
    u = _small(seed)
    tol, _ = sharded_compute_tolerance(u, JORDAN, "bfloat16", w, "float32")
    one = newton_schulz_in(u, JORDAN, "bfloat16")
    dealt = newton_schulz_in(u, JORDAN, "bfloat16", 2 + deal % (w - 1), order="random", seed=deal)
    assert float((dealt - one).norm() / one.norm()) <= tol


def test_a_random_deal_is_seeded_and_an_unknown_order_names_itself():
    u = _small(0)
    same = [newton_schulz_in(u, JORDAN, "bfloat16", 2, order="random", seed=5) for _ in range(2)]
    assert torch.equal(same[0], same[1])
    with pytest.raises(ValueError, match="order"):
        newton_schulz_in(u, JORDAN, "bfloat16", 2, order="shuffled")


def test_newton_schulz_per_local_shard_exceeds_the_bound():
    u = _u(16, 8, 3)
    tol, _ = sharded_compute_tolerance(u, JORDAN, "bfloat16", 2, "float32")
    one = newton_schulz_in(u, JORDAN, "bfloat16")
    local = torch.cat([newton_schulz_in(u[:8], JORDAN, "bfloat16"), newton_schulz_in(u[8:], JORDAN, "bfloat16")])
    assert float((local - one).norm() / one.norm()) > 3 * tol


@pytest.mark.parametrize("bad", [dict(compute_dtype="float32"), dict(world_size=0), dict(u_sharded=_u(3, 4, 0))])
def test_bad_arguments_name_themselves(bad):
    kw = dict(compute_dtype="bfloat16", world_size=2, u_sharded=None)
    kw.update(bad)
    with pytest.raises(ValueError, match=next(iter(bad))):
        sharded_compute_tolerance(_u(4, 3, 0), JORDAN, kw["compute_dtype"], kw["world_size"], "float32",
                                  u_sharded=kw["u_sharded"])


def _run(rank, state, kinds=None, local=(8, 8)):
    return {"rank": rank, "state": [state], "state_kinds": [kinds or {k: "plain" for k in state}],
            "local_shapes": [local]}


def test_placements_are_recognized():
    full = {"momentum_buffer": torch.zeros(16, 8)}
    half = {"momentum_buffer": torch.zeros(8, 8)}
    rep = recognize(0, [_run(0, full), _run(1, full)], full)
    assert rep[0] == "replicated" and rep[1] == {"momentum_buffer": (16, 8)}
    assert recognize(0, [_run(0, full), _run(1, {})], full)[0] == "owner"
    assert recognize(0, [_run(0, half), _run(1, half)], full)[0] == "sharded"
    assert recognize(0, [_run(0, full, {"momentum_buffer": "dtensor"}), _run(1, full)], full)[0] == "sharded"
    odd = recognize(0, [_run(0, {"momentum_buffer": torch.zeros(8, 16)}), _run(1, half)], full)
    assert odd[0] is None and "rank 0" in odd[2]
    with pytest.raises(ValueError, match="state_placement"):
        state_placement("zero1")
