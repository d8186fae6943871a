"""Tests for ortho_fast.Muon and ortho_fast.Dion: parity with torch.optim.Muon, agreement with
the float64 oracle (ortho_ref.muon_step / dion_step) within ortho_verify.tolerances, determinism,
state_dict round trips and the error contract (checks before any state changes)."""

from __future__ import annotations

import copy
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_fast
import ortho_ref
from ortho_fast import Dion, Muon
from ortho_verify import tolerances as tol
from ortho_verify.spectra import matrix_with_spectrum
from tests.round_trip import assert_bitwise_same, round_trip

SHAPES = [(24, 16), (16, 24), (20, 20)]  # tall, wide, square
SHAPE_IDS = ["tall", "wide", "square"]


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _grad(shape, rng, cond: float = 1e3, scale: float = 1.0) -> np.ndarray:
    m, n = shape
    return matrix_with_spectrum(scale * np.geomspace(1.0, 1.0 / cond, min(m, n)), m, n, rng)


def _state_clone(opt) -> dict:
    return {id(p): {k: v.clone() for k, v in st_.items()} for p, st_ in opt.state.items()}


def _assert_state_equal(opt, saved: dict) -> None:
    assert {id(p) for p in opt.state} == set(saved)
    for p, st_ in opt.state.items():
        assert set(st_) == set(saved[id(p)])
        for k, v in st_.items():
            assert torch.equal(v, saved[id(p)][k]), k


def _assert_unchanged(ps, params_before, opt, state_before) -> None:
    """Every parameter and every state tensor is bitwise what it was before the failed step."""
    for p, before in zip(ps, params_before):
        assert torch.equal(p.detach(), before)
    _assert_state_equal(opt, state_before)


# =======================================================================================
# Muon
# =======================================================================================


@pytest.mark.parametrize("lr", [1e-3, 0.02])
@pytest.mark.parametrize("adjust_lr", ["original", "match_rms_adamw"])
@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_muon_bitwise_equals_torch_muon(shape, nesterov, adjust_lr, lr):
    rng = _rng("torch-muon", shape, nesterov, adjust_lr, lr)
    w0 = torch.tensor(0.02 * rng.standard_normal(shape), dtype=torch.float32)
    p_ref, p_fast = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    o_ref = torch.optim.Muon([p_ref], lr=lr, nesterov=nesterov, adjust_lr_fn=adjust_lr)
    o_fast = Muon([p_fast], lr=lr, nesterov=nesterov, adjust_lr=adjust_lr)
    for _ in range(3):
        g = torch.tensor(_grad(shape, rng), dtype=torch.float32)
        p_ref.grad, p_fast.grad = g.clone(), g.clone()
        o_ref.step()
        o_fast.step()
        assert float((p_ref.detach() - p_fast.detach()).abs().max()) <= tol.TORCH_MUON_TOLERANCE
        assert torch.equal(p_ref, p_fast)
        assert torch.equal(o_ref.state[p_ref]["momentum_buffer"], o_fast.state[p_fast]["momentum_buffer"])
    assert not torch.equal(p_fast.detach(), w0)  # the steps did something


def test_muon_bitwise_equals_torch_muon_several_params():
    """One optimizer over tall, wide and square parameters: ``Muon(params)`` with plain
    defaults is bitwise ``torch.optim.Muon(params)`` (its eps_mode resolves to torch's clamp)."""
    rng = _rng("torch-muon-multi")
    w0 = [torch.tensor(0.02 * rng.standard_normal(s), dtype=torch.float32) for s in SHAPES]
    ps_ref = [torch.nn.Parameter(w.clone()) for w in w0]
    ps_fast = [torch.nn.Parameter(w.clone()) for w in w0]
    o_ref = torch.optim.Muon(ps_ref)
    o_fast = Muon(ps_fast)
    assert o_fast.param_groups[0]["eps_mode"] == "clamp"
    for _ in range(3):
        for a, b in zip(ps_ref, ps_fast):
            g = torch.tensor(_grad(tuple(a.shape), rng), dtype=torch.float32)
            a.grad, b.grad = g.clone(), g.clone()
        o_ref.step()
        o_fast.step()
    for a, b in zip(ps_ref, ps_fast):
        assert torch.equal(a, b)
        assert torch.equal(o_ref.state[a]["momentum_buffer"], o_fast.state[b]["momentum_buffer"])


@pytest.mark.parametrize("eps_mode, equal", [(None, True), ("clamp", True), ("add", False)])
def test_muon_eps_mode_add_differs_from_torch_on_tiny_gradient(eps_mode, equal):
    """eps_mode='add' is not torch's clamp: with ‖U‖_F ≈ eps they differ (X₀ = U/(‖U‖ + eps)
    vs U/max(‖U‖, eps)), which shows the parity tests can fail; the default (None -> "clamp"
    for "jordan") and "clamp" give torch's bits here too."""
    rng = _rng("eps-mode")
    w0 = torch.tensor(0.02 * rng.standard_normal((8, 12)), dtype=torch.float32)
    p_ref, p_fast = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    o_ref, o_fast = torch.optim.Muon([p_ref], lr=0.02), Muon([p_fast], lr=0.02, eps_mode=eps_mode)
    g = torch.tensor(1e-6 * _grad((8, 12), rng), dtype=torch.float32)  # ‖U‖_F ≈ 1e-7 = eps
    p_ref.grad, p_fast.grad = g.clone(), g.clone()
    o_ref.step()
    o_fast.step()
    assert torch.equal(p_ref, p_fast) == equal


@pytest.mark.parametrize("coefficients, expected", [
    ("jordan", ("clamp", 1.0, 1e-7)), (ortho_fast.COEFFICIENTS["jordan"], ("clamp", 1.0, 1e-7)),
    ("polar_express", ("add", 1.02, 1e-6)), ("cesista5", ("add", 1.0, 1e-7)), ("you6", ("add", 1.0, 1e-7)),
    ([(3.4445, -4.7750, 2.0315)], ("add", 1.0, 1e-7)),  # a table, even Keller Jordan's row: "add"
])
def test_muon_normalization_defaults_follow_the_schedule(coefficients, expected):
    """eps_mode / safety / eps None resolve from the schedule: torch.optim.Muon's clamp for
    "jordan" only, Keller Jordan's original "add" (dion, Moonlight, nanochat) otherwise;
    explicit values win."""
    p = [torch.nn.Parameter(torch.ones(4, 6))]
    group = Muon(p, coefficients=coefficients).param_groups[0]
    assert (group["eps_mode"], group["safety"], group["eps"]) == expected
    assert ortho_fast.default_eps_mode(coefficients) == expected[0]
    group = Muon(p, coefficients=coefficients, eps_mode="add", safety=1.5, eps=0.0).param_groups[0]
    assert (group["eps_mode"], group["safety"], group["eps"]) == ("add", 1.5, 0.0)


MUON_COMBOS = [
    (style, nesterov, adjust, wd, coeffs)
    for style in ("ema", "classic")
    for nesterov in (True, False)
    for adjust in ("original", "match_rms_adamw", "spectral_norm", None)
    for wd in (0.0, 0.1)
    for coeffs in ("jordan", "polar_express")
]


@pytest.mark.parametrize("style, nesterov, adjust_lr, weight_decay, coefficients", MUON_COMBOS)
def test_muon_float64_matches_reference(style, nesterov, adjust_lr, weight_decay, coefficients):
    """The oracle runs the oracle's own schedule transcription and the documented default
    normalization (clamp for "jordan", add otherwise), so a wrong default on the fast side fails."""
    lr, mu = 0.02, 0.9
    sched, table = ortho_ref.SCHEDULES[coefficients], ortho_ref.schedule(coefficients)
    eps_mode = "clamp" if coefficients == "jordan" else "add"
    for shape in SHAPES:
        rng = _rng("muon-ref", shape, style, nesterov, adjust_lr, weight_decay, coefficients)
        g = _grad(shape, rng, cond=1e2, scale=3.0)
        w0 = 0.02 * rng.standard_normal(shape)
        m0 = _grad(shape, rng, cond=1e2, scale=2.0)  # nonzero momentum buffer
        p = torch.nn.Parameter(torch.tensor(w0))
        opt = Muon([p], lr=lr, weight_decay=weight_decay, momentum=mu, nesterov=nesterov, momentum_style=style,
                   coefficients=coefficients, adjust_lr=adjust_lr, dtype=torch.float64)
        opt.state[p]["momentum_buffer"] = torch.tensor(m0)
        p.grad = torch.tensor(g)
        opt.step()
        ref = ortho_ref.muon_step(w0, g, m0, lr=lr, mu=mu, nesterov=nesterov, momentum_style=style,
                                  coefficients=table, safety=sched.safety, eps=sched.eps, eps_mode=eps_mode,
                                  adjust_lr=adjust_lr, weight_decay=weight_decay)
        sigma_hat = ortho_ref.normalized_singular_values(ref.ns_input, safety=sched.safety, eps=sched.eps,
                                                         eps_mode=eps_mode)
        ns_tol = tol.ns_tolerance(sigma_hat, table, shape, "float64")
        w_tol = tol.muon_tolerance(ns_tol, ref.lr_scale, lr, float(np.linalg.norm(w0)),
                                   float(np.linalg.norm(ref.update)), "float64")
        m_tol = tol.momentum_tolerance(float(np.linalg.norm(g)), float(np.linalg.norm(m0)), "float64")
        w_err = np.linalg.norm(p.detach().numpy() - ref.weight)
        m_err = np.linalg.norm(opt.state[p]["momentum_buffer"].numpy() - ref.momentum)
        assert p.dtype == torch.float64 and opt.state[p]["momentum_buffer"].dtype == torch.float64
        assert w_err <= w_tol, f"{shape}: weight error {w_err:.3e} > {w_tol:.3e}"
        assert m_err <= m_tol, f"{shape}: momentum error {m_err:.3e} > {m_tol:.3e}"
        assert ref.lr_scale == ortho_fast.adjusted_lr_scale(adjust_lr, *shape)


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
    upd = ortho_fast.dion_update(x, torch.tensor(g), mom, q, lr=DION_LR, mu=DION_MU, weight_decay=DION_WD,
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
    rng = _rng("dion-ref", shape, rank_fraction, power_iters, error_feedback)
    w0 = 0.02 * rng.standard_normal(shape)
    m0 = _grad(shape, rng, cond=1e2, scale=0.5)
    q0 = rng.standard_normal(ortho_ref.q_shape(m, n, r))
    p = torch.nn.Parameter(torch.tensor(w0))
    opt = _dion_with_state(p, m0, q0, rank_fraction=rank_fraction, power_iters=power_iters,
                           error_feedback=error_feedback)
    state = opt.state[p]
    well_posed = 0
    for _ in range(3):
        g = _grad(shape, rng, cond=1e2)
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
    m0 = _grad((m, n), rng, cond=10.0**log_cond, scale=0.5)
    q0 = rng.standard_normal(ortho_ref.q_shape(m, n, r))
    g = _grad((m, n), rng, cond=10.0**log_cond)
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
    assert ortho_fast.dion_rank(m, n, rank_fraction) == r

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
    assert torch.equal(a[0], ortho_fast.initial_q((min(m, n), r), 3, 0, torch.float64, "cpu"))
    assert torch.equal(a[1], ortho_fast.initial_q((min(m, n), r), 3, 1, torch.float64, "cpu"))
    assert not torch.equal(a[0], a[1])  # a different parameter index draws a different Q0
    assert not torch.equal(a[0], q0_of(4)[0])  # a different seed too
    # the global RNG is not used
    torch.manual_seed(0)
    c = q0_of(3)
    torch.manual_seed(1)
    assert torch.equal(c[0], q0_of(3)[0])


def test_dion_same_seed_same_results():
    rng = _rng("dion-det")
    shapes = [(24, 16), (16, 24)]
    w0 = [0.02 * rng.standard_normal(s) for s in shapes]
    grads = [[_grad(s, rng) for s in shapes] for _ in range(3)]

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
    w0 = torch.tensor(0.02 * _rng("zero", shape).standard_normal(shape))
    p = torch.nn.Parameter(w0.clone())
    opt = Dion([p], lr=lr, weight_decay=wd, rank_fraction=0.5, seed=9)
    q0 = ortho_fast.initial_q((min(m, n), ortho_fast.dion_rank(m, n, 0.5)), 9, 0, torch.float64, "cpu")
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
    rng = _rng("dion-lowp")
    p = torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal((12, 8)), dtype=dtype))
    opt = Dion([p], rank_fraction=0.5)
    p.grad = torch.tensor(_grad((12, 8), rng), dtype=dtype)
    opt.step()
    assert p.dtype == dtype and bool(torch.isfinite(p).all())
    assert opt.state[p]["Q"].shape == (8, 4)


def test_muon_zero_gradient_with_eps_zero_only_decays():
    w0 = torch.ones(3, 4)
    p = torch.nn.Parameter(w0.clone())
    opt = Muon([p], lr=0.02, weight_decay=0.1, eps=0.0)
    p.grad = torch.zeros(3, 4)
    opt.step()
    assert torch.equal(p.detach(), w0 * (1 - 0.02 * 0.1))


# =======================================================================================
# state_dict round trip
# =======================================================================================


def _round_trip(make_opt, shapes, dtype, grads):
    w0 = [torch.tensor(0.02 * _rng("rt", s).standard_normal(s), dtype=dtype) for s in shapes]
    assert_bitwise_same(*round_trip(make_opt, w0, grads, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_muon_state_dict_round_trip(dtype):
    rng = _rng("rt-muon")
    grads = [[_grad(s, rng) for s in SHAPES] for _ in range(4)]
    _round_trip(lambda ps: Muon(ps, lr=0.02, momentum_style="classic", nesterov=False), SHAPES, dtype, grads)
    _round_trip(lambda ps: Muon(ps, lr=0.02), SHAPES, dtype, grads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dion_state_dict_round_trip(dtype):
    rng = _rng("rt-dion")
    grads = [[_grad(s, rng) for s in SHAPES] for _ in range(4)]
    _round_trip(lambda ps: Dion(ps, rank_fraction=0.5, power_iters=2, seed=11), SHAPES, dtype, grads)


# =======================================================================================
# Bad input
# =======================================================================================

OPTIMIZERS = {
    "Muon": lambda ps: Muon(ps, lr=0.02),
    "Dion": lambda ps: Dion(ps, rank_fraction=0.5),
}


# Muon flattens 3-D non-expert weights (conv1d) to (shape[0], prod(rest)): tests/ortho_fast/test_muon.py.
@pytest.mark.parametrize("name, bad_shape", [(n, s) for n in sorted(OPTIMIZERS) for s in ((5,), ())] + [("Dion", (2, 3, 4))])
def test_non_matrix_parameter_rejected(name, bad_shape):
    with pytest.raises(ValueError, match=r"^params:"):
        OPTIMIZERS[name]([torch.nn.Parameter(torch.ones(4, 3)), torch.nn.Parameter(torch.ones(bad_shape))])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("with_state", [False, True])
def test_nonfinite_grad_changes_nothing(name, bad, with_state):
    rng = _rng("nonfinite", name)
    ps = [torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(s))) for s in ((12, 8), (8, 12))]
    opt = OPTIMIZERS[name](ps)
    if with_state:
        for p in ps:
            p.grad = torch.tensor(_grad(tuple(p.shape), rng))
        opt.step()
    for bad_index in (0, 1):  # the bad gradient on the first, then on the second parameter
        for p in ps:
            p.grad = torch.tensor(_grad(tuple(p.shape), rng))
        ps[bad_index].grad[1, 2] = bad
        params_before = [p.detach().clone() for p in ps]
        state_before = _state_clone(opt)
        with pytest.raises(ValueError, match=r"^grad"):
            opt.step()
        _assert_unchanged(ps, params_before, opt, state_before)


def test_dion_wrong_q_shape_changes_nothing():
    rng = _rng("wrong-q")
    shapes = [(12, 8), (8, 12)]
    ps = [torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(s))) for s in shapes]
    opt = Dion(ps, rank_fraction=0.5)
    for p in ps:
        p.grad = torch.tensor(_grad(tuple(p.shape), rng))
    opt.step()
    for bad_q_shape in ((8, 5), (12, 4), (4, 8)):  # right shape is (8, 4) for both
        sd = copy.deepcopy(opt.state_dict())
        sd["state"][1]["Q"] = torch.ones(bad_q_shape, dtype=torch.float64)
        opt.load_state_dict(sd)
        for p in ps:
            p.grad = torch.tensor(_grad(tuple(p.shape), rng))
        params_before = [p.detach().clone() for p in ps]
        state_before = _state_clone(opt)
        with pytest.raises(ValueError, match=r"^Q:"):
            opt.step()
        _assert_unchanged(ps, params_before, opt, state_before)  # also the first parameter, whose Q is fine


def test_muon_wrong_momentum_shape_changes_nothing():
    rng = _rng("wrong-buf")
    ps = [torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(s))) for s in ((12, 8), (8, 12))]
    opt = Muon(ps, lr=0.02)
    for p in ps:
        p.grad = torch.tensor(_grad(tuple(p.shape), rng))
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    sd["state"][1]["momentum_buffer"] = torch.zeros(4, 4, dtype=torch.float64)
    opt.load_state_dict(sd)
    params_before = [p.detach().clone() for p in ps]
    state_before = _state_clone(opt)
    with pytest.raises(ValueError, match=r"momentum_buffer"):
        opt.step()
    _assert_unchanged(ps, params_before, opt, state_before)


P = [torch.nn.Parameter(torch.ones(4, 3))]


@pytest.mark.parametrize(
    "make, arg",
    [
        (lambda: Muon(P, lr=-1e-3), "lr"),
        (lambda: Muon(P, lr=float("nan")), "lr"),
        (lambda: Muon(P, momentum=1.5), "momentum"),
        (lambda: Muon(P, momentum=-0.1), "momentum"),
        (lambda: Muon(P, weight_decay=-0.1), "weight_decay"),
        (lambda: Muon(P, momentum_style="adam"), "momentum_style"),
        (lambda: Muon(P, adjust_lr="sqrt"), "adjust_lr"),
        (lambda: Muon(P, eps_mode="foo"), "eps_mode"),
        (lambda: Muon(P, ns_steps=0), "ns_steps"),
        (lambda: Muon(P, safety=0.0), "safety"),
        (lambda: Muon(P, eps=-1.0), "eps"),
        (lambda: Muon(P, coefficients=[[1.0, 2.0]]), "coefficients"),
        (lambda: Muon(P, coefficients="no_such_schedule"), "coefficients"),
        (lambda: Muon(P, lr="0.1"), "lr"),
        (lambda: Dion(P, lr=-0.01), "lr"),
        (lambda: Dion(P, mu=1.5), "mu"),
        (lambda: Dion(P, mu=-0.5), "mu"),
        (lambda: Dion(P, weight_decay=-1.0), "weight_decay"),
        (lambda: Dion(P, rank_fraction=0.0), "rank_fraction"),
        (lambda: Dion(P, rank_fraction=1.5), "rank_fraction"),
        (lambda: Dion(P, rank_multiple_of=0), "rank_multiple_of"),
        (lambda: Dion(P, power_iters=0), "power_iters"),
        (lambda: Dion(P, epsilon=-1e-8), "epsilon"),
        (lambda: Dion(P, qr_method="gram_schmidt"), "qr_method"),
    ],
)
def test_bad_hyperparameters_raise_value_error(make, arg):
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        make()


def test_unknown_schedule_error_is_a_key_error_and_a_value_error_listing_the_names():
    """UnknownScheduleError: a ValueError naming the argument (house rule) that is still the
    KeyError earlier versions raised; its message lists every registry name, unquoted."""
    with pytest.raises(ortho_fast.UnknownScheduleError) as info:
        Muon(P, coefficients="no_such_schedule")
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert str(info.value).startswith("coefficients: unknown schedule 'no_such_schedule'")
    assert all(repr(name) in str(info.value) for name in ortho_fast.COEFFICIENTS)
