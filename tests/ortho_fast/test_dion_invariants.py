"""ortho_fast.Dion against the float64 oracle (ortho_ref.dion_step) within
ortho_verify.tolerances.dion_tolerances, with and without error feedback, and the invariants of
each update on its own P and R (PᵀP = I, the error-feedback identity and projections); Q0
deterministic per seed and parameter index, the same seed giving the same results, zero
gradients and low-precision parameters.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_ref
from ortho_fast import Dion
from ortho_fast.functional.dion import dion_rank, dion_update, initial_q
from ortho_verify import tolerances as tol
from tests.ortho_fast.helpers import SHAPE_IDS, SHAPES, gradient_matrix, rng_for

# =======================================================================================
# Dion
# =======================================================================================

DION_LR, DION_MU, DION_WD = 0.01, 0.95, 0.1


def _dion_with_state(p, m0, q0, **kw) -> Dion:
    opt = Dion([p], lr=DION_LR, mu=DION_MU, weight_decay=DION_WD, **kw)
    sd = opt.state_dict()
    sd["state"] = {0: {"momentum": torch.tensor(m0), "Q": torch.tensor(q0)}}
    opt.load_state_dict(sd)
    return opt


def _dion_bounds(ref, q_in, w_in, error_feedback: bool) -> dict:
    """ortho_verify.tolerances.dion_tolerances for one step (with or without error feedback)."""
    return tol.dion_tolerances(ref, q_in, lr=DION_LR, mu=DION_MU, weight=w_in, dtype="float64",
                               error_feedback=error_feedback)


def _compare_with_reference(p, state, ref, bounds) -> bool:
    """Fast weight, momentum and Q against the oracle, where the step is well posed."""
    if not bounds["well_posed"]:
        return False
    for key, fast_val, ref_val in (("weight", p.detach(), ref.weight), ("momentum", state["momentum"], ref.momentum),
                                   ("Q", state["Q"], ref.Q)):
        err = np.linalg.norm(fast_val.numpy() - ref_val)
        assert err <= bounds[key], f"{key}: {err:.3e} > {bounds[key]:.3e} (kappa {bounds['kappa']:.2e})"
    return True


# The invariants are evaluated in extended precision (x87 80-bit long double on x86-64) so that
# the check's own rounding does not count against the tolerance, which bounds the fast side's.
EXT = np.longdouble


def _check_dion_invariants(w_in, g, m_in, q_in, *, power_iters, error_feedback):
    """Run dion_update on copies of the step's inputs and check, on its own P and R:
    PᵀP = I; M_new = B − (1−μ)PRᵀ, (I − PPᵀ)M_new = (I − PPᵀ)B and PᵀM_new = μPᵀB with error
    feedback; M_new = μPRᵀ, (I − PPᵀ)M_new = 0 and PᵀM_new = μPᵀB without."""
    m, n = w_in.shape
    x, mom, q = torch.tensor(w_in), torch.tensor(m_in), torch.tensor(q_in)
    upd = dion_update(x, torch.tensor(g), mom, q, lr=DION_LR, mu=DION_MU, weight_decay=DION_WD,
                      epsilon=1e-8, power_iters=power_iters, error_feedback=error_feedback)
    transposed = m < n
    b = (m_in + g).T if transposed else m_in + g
    m_new = mom.numpy().T if transposed else mom.numpy()
    pp, rr = upd.P.numpy(), upd.R.numpy()
    rows, r = pp.shape
    assert pp.shape == (b.shape[0], q_in.shape[1]) and rr.shape == (b.shape[1], q_in.shape[1])
    assert np.linalg.norm(pp.T @ pp - np.eye(r)) <= tol.orthonormality_tolerance(rows, r, "float64")
    # error_feedback_tolerance bounds forming c·PRᵀ and subtracting it, c = 1 − μ; without error
    # feedback c = μ (the same derivation with mu → 1 − μ).
    ef_tol = tol.error_feedback_tolerance(float(np.linalg.norm(b)), float(np.linalg.norm(pp)),
                                          float(np.linalg.norm(rr)), DION_MU if error_feedback else 1 - DION_MU,
                                          rows, r, "float64")
    b, m_new, pp, rr = (v.astype(EXT) for v in (b, m_new, pp, rr))
    mu = EXT(DION_MU)
    proj = np.eye(rows, dtype=EXT) - pp @ pp.T
    if error_feedback:
        expected, outside = b - (1 - mu) * (pp @ rr.T), proj @ b
    else:
        expected, outside = mu * (pp @ rr.T), np.zeros_like(b)
    assert float(np.linalg.norm(m_new - expected)) <= ef_tol
    assert float(np.linalg.norm(proj @ m_new - outside)) <= ef_tol
    assert float(np.linalg.norm(pp.T @ m_new - mu * (pp.T @ b))) <= ef_tol
    return x, mom, q


@pytest.mark.parametrize("error_feedback", [True, False])
@pytest.mark.parametrize("power_iters", [1, 2])
@pytest.mark.parametrize("rank_fraction", [1.0, 0.5, 0.25])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_dion_float64_matches_reference_three_steps(shape, rank_fraction, power_iters, error_feedback):
    m, n = shape
    r = ortho_ref.dion_rank(m, n, rank_fraction)
    rng = rng_for("dion-ref", shape, rank_fraction, power_iters, error_feedback)
    w0 = 0.02 * rng.standard_normal(shape)
    m0 = gradient_matrix(shape, rng, cond=1e2, scale=0.5)
    q0 = rng.standard_normal(ortho_ref.q_shape(m, n, r))
    p = torch.nn.Parameter(torch.tensor(w0))
    opt = _dion_with_state(p, m0, q0, rank_fraction=rank_fraction, power_iters=power_iters,
                           error_feedback=error_feedback)
    state = opt.state[p]
    well_posed = 0
    for _ in range(3):
        g = gradient_matrix(shape, rng, cond=1e2)
        w_in, m_in, q_in = p.detach().numpy().copy(), state["momentum"].numpy().copy(), state["Q"].numpy().copy()
        p.grad = torch.tensor(g)
        opt.step()
        assert state["Q"].shape == (min(m, n), r) and state["momentum"].shape == shape
        ref = ortho_ref.dion_step(w_in, g, m_in, q_in, lr=DION_LR, mu=DION_MU, weight_decay=DION_WD,
                                  power_iters=power_iters, error_feedback=error_feedback)
        well_posed += _compare_with_reference(p, state, ref, _dion_bounds(ref, q_in, w_in, error_feedback))
        x, mom, q = _check_dion_invariants(w_in, g, m_in, q_in, power_iters=power_iters,
                                           error_feedback=error_feedback)
        # the optimizer's step is dion_update on its state: same bits
        assert torch.equal(x, p.detach()) and torch.equal(mom, state["momentum"]) and torch.equal(q, state["Q"])
    assert well_posed == 3  # these inputs (cond 1e2, Gaussian Q0) are well posed: the comparison ran


def _dion_one_step(m, n, log_cond, rank_fraction, power_iters, error_feedback, seed) -> None:
    rng = np.random.default_rng(seed)
    r = ortho_ref.dion_rank(m, n, rank_fraction)
    w0 = 0.02 * rng.standard_normal((m, n))
    m0 = gradient_matrix((m, n), rng, cond=10.0**log_cond, scale=0.5)
    q0 = rng.standard_normal(ortho_ref.q_shape(m, n, r))
    g = gradient_matrix((m, n), rng, cond=10.0**log_cond)
    p = torch.nn.Parameter(torch.tensor(w0))
    opt = _dion_with_state(p, m0, q0, rank_fraction=rank_fraction, power_iters=power_iters,
                           error_feedback=error_feedback)
    p.grad = torch.tensor(g)
    opt.step()
    ref = ortho_ref.dion_step(w0, g, m0, q0, lr=DION_LR, mu=DION_MU, weight_decay=DION_WD,
                              power_iters=power_iters, error_feedback=error_feedback)
    _compare_with_reference(p, opt.state[p], ref, _dion_bounds(ref, q0, w0, error_feedback))
    _check_dion_invariants(w0, g, m0, q0, power_iters=power_iters, error_feedback=error_feedback)


@settings(deadline=None)
@given(
    m=st.integers(1, 48), n=st.integers(1, 48), log_cond=st.floats(0.0, 6.0),
    rank_fraction=st.sampled_from([1.0, 0.5, 0.25]), power_iters=st.integers(1, 2),
    error_feedback=st.booleans(), seed=st.integers(0, 2**32 - 1),
)
def test_dion_one_step_property(m, n, log_cond, rank_fraction, power_iters, error_feedback, seed):
    """Random shapes and spectra: compare with the oracle where well posed, invariants always."""
    _dion_one_step(m, n, log_cond, rank_fraction, power_iters, error_feedback, seed)


# Regression: without error feedback this input exceeded the bound written for M = B − (1−μ)PRᵀ
# (momentum error 7.5e-16 against 4.1e-16) before dion_tolerances took ``error_feedback``.
REPRO_NO_EF = (1, 4, 4)  # (m, n, seed)


def test_dion_no_error_feedback_momentum_tolerance():
    _dion_one_step(REPRO_NO_EF[0], REPRO_NO_EF[1], 0.0, 1.0, 1, False, REPRO_NO_EF[2])


@pytest.mark.parametrize("rank_fraction", [1.0, 0.5, 0.25])
@pytest.mark.parametrize("shape", SHAPES + [(7, 3), (3, 7), (1, 5)])
def test_dion_q0_deterministic_and_shaped(shape, rank_fraction):
    m, n = shape
    r = ortho_ref.dion_rank(m, n, rank_fraction)
    assert dion_rank(m, n, rank_fraction) == r

    def q0_of(seed, n_params=2):
        ps = [torch.nn.Parameter(torch.ones(shape, dtype=torch.float64)) for _ in range(n_params)]
        opt = Dion(ps, rank_fraction=rank_fraction, seed=seed)
        for p in ps:
            p.grad = torch.zeros_like(p)
        opt.step()  # zero gradient and zero momentum: Q stays Q0
        return [opt.state[p]["Q"].clone() for p in ps]

    a, b = q0_of(3), q0_of(3)
    assert a[0].shape == (min(m, n), r) == ortho_ref.q_shape(m, n, r)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert torch.equal(a[0], initial_q((min(m, n), r), 3, 0, torch.float64, "cpu"))
    assert torch.equal(a[1], initial_q((min(m, n), r), 3, 1, torch.float64, "cpu"))
    assert not torch.equal(a[0], a[1])  # a different parameter index draws a different Q0
    assert not torch.equal(a[0], q0_of(4)[0])  # a different seed too
    # the global RNG is not used
    torch.manual_seed(0)
    c = q0_of(3)
    torch.manual_seed(1)
    assert torch.equal(c[0], q0_of(3)[0])


def test_dion_same_seed_same_results():
    rng = rng_for("dion-det")
    shapes = [(24, 16), (16, 24)]
    w0 = [0.02 * rng.standard_normal(s) for s in shapes]
    grads = [[gradient_matrix(s, rng) for s in shapes] for _ in range(3)]

    def run(seed):
        ps = [torch.nn.Parameter(torch.tensor(w)) for w in w0]
        opt = Dion(ps, rank_fraction=0.5, seed=seed)
        for step in grads:
            for p, g in zip(ps, step):
                p.grad = torch.tensor(g)
            opt.step()
        return ps, opt

    (pa, oa), (pb, ob), (pc, _) = run(5), run(5), run(6)
    for a, b in zip(pa, pb):
        assert torch.equal(a, b)
        assert torch.equal(oa.state[a]["Q"], ob.state[b]["Q"])
        assert torch.equal(oa.state[a]["momentum"], ob.state[b]["momentum"])
    assert not torch.equal(pa[0], pc[0])


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_dion_zero_gradient_zero_momentum(shape):
    m, n = shape
    lr, wd = 0.05, 0.2
    w0 = torch.tensor(0.02 * rng_for("zero", shape).standard_normal(shape))
    p = torch.nn.Parameter(w0.clone())
    opt = Dion([p], lr=lr, weight_decay=wd, rank_fraction=0.5, seed=9)
    q0 = initial_q((min(m, n), dion_rank(m, n, 0.5)), 9, 0, torch.float64, "cpu")
    for step in range(2):
        p.grad = torch.zeros(shape, dtype=torch.float64)
        opt.step()
        assert torch.equal(opt.state[p]["Q"], q0)
        assert torch.equal(opt.state[p]["momentum"], torch.zeros(shape, dtype=torch.float64))
    assert torch.equal(p.detach(), w0 * (1 - lr * wd) * (1 - lr * wd))
    ref = ortho_ref.dion_step(w0.numpy(), np.zeros(shape), np.zeros(shape), q0.numpy(), lr=lr, weight_decay=wd)
    assert np.array_equal(ref.Q, q0.numpy()) and not np.any(ref.momentum)
    assert np.array_equal(ref.weight, (w0 * (1 - lr * wd)).numpy())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dion_low_precision_parameters_step(dtype):
    rng = rng_for("dion-lowp")
    p = torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal((12, 8)), dtype=dtype))
    opt = Dion([p], rank_fraction=0.5)
    p.grad = torch.tensor(gradient_matrix((12, 8), rng), dtype=dtype)
    opt.step()
    assert p.dtype == dtype and bool(torch.isfinite(p).all())
    assert opt.state[p]["Q"].shape == (8, 4)
