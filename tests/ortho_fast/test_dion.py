"""ortho_fast.Dion with every option against the float64 oracle (ortho_ref.dion_step with the
same options) within ortho_verify.tolerances.dion_variant_tolerances: every QR method, right
factor, power_iters and rank fraction, the column normalization's epsilon, mixed precision,
float32 parameters, random shapes and spectra, and several steps carried by the optimizer.
QR methods, seeds and state_dict: test_dion_bitwise.py; bad input: test_dion_errors.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_fast
import ortho_ref
from ortho_fast import Dion
from ortho_fast.functional.dion import dion_update, initial_q
from ortho_fast.functional.qr import gaussian_sketch, sketch_generator, sketch_rows
from ortho_verify import tolerances as tol
from tests.ortho_fast.helpers import DION_SEED, rng_for, spectral_matrix

LR, MU, WD = 0.05, 0.9, 0.1
DTYPE_NAMES = {torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16"}


def _rounded(a: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """a rounded to ``dtype`` (so both sides start from the same numbers), as float64."""
    return torch.tensor(a).to(dtype).double().numpy()


def _sketches(opts, shape, r, step, dtype, index=0):
    """The float64 copies of the sketches the optimizer draws for parameter ``index`` at ``step``."""
    rows = max(shape)
    k = sketch_rows(r, opts.get("oversample", 1.25))
    if opts.get("qr_method") != "randomized_cholesky_qr" or k >= rows:
        return None
    gen = sketch_generator(DION_SEED, index, step, "cpu")
    f_dtype = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    return [gaussian_sketch(gen, k, rows, f_dtype, "cpu").double().numpy()
            for _ in range(opts.get("power_iters", 1))]


def _step_and_compare(shape, opts, *, param_dtype=torch.float64, momentum_dtype=None, q_dtype=None, cond=1e2,
                      key=(), state=None, expect_well_posed=True):
    """One Dion step with injected (momentum, Q, step) vs ortho_ref.dion_step; returns the ratios."""
    m, n = shape
    mdt, qdt = momentum_dtype or param_dtype, q_dtype or param_dtype
    rng = rng_for("cmp", shape, sorted(opts.items()), key)
    r = ortho_ref.dion_rank(m, n, opts.get("rank_fraction", 1.0), opts.get("rank_multiple_of", 1))
    w0 = _rounded(0.02 * rng.standard_normal(shape), param_dtype)
    g = _rounded(spectral_matrix(shape, rng, cond), param_dtype)
    if state is None:
        m0 = _rounded(spectral_matrix(shape, rng, cond, 0.5), mdt)
        q0 = _rounded(rng.standard_normal((min(m, n), r)), qdt)
    else:
        m0, q0 = (_rounded(a, d) for a, d in zip(state(shape, r, g, rng), (mdt, qdt)))
    p = torch.nn.Parameter(torch.tensor(w0, dtype=param_dtype))
    opt = Dion([p], lr=LR, mu=MU, weight_decay=WD, momentum_dtype=momentum_dtype, q_dtype=q_dtype,
               seed=DION_SEED, **opts)
    sd = opt.state_dict()
    sd["state"] = {0: {"momentum": torch.tensor(m0, dtype=mdt), "Q": torch.tensor(q0, dtype=qdt),
                       "step": torch.tensor(4)}}
    opt.load_state_dict(sd)
    assert opt.state[p]["momentum"].dtype == mdt and opt.state[p]["Q"].dtype == qdt
    p.grad = torch.tensor(g, dtype=param_dtype)
    opt.step()
    ref_opts = {k: v for k, v in opts.items() if k not in ("rank_fraction", "rank_multiple_of")}
    ref = ortho_ref.dion_step(w0, g, m0, q0, lr=LR, mu=MU, weight_decay=WD, rng=np.random.default_rng(0), **ref_opts)
    bounds = tol.dion_variant_tolerances(
        ref, q0, lr=LR, mu=MU, weight=w0, dtype=DTYPE_NAMES[mdt], param_dtype=DTYPE_NAMES[param_dtype],
        q_dtype=DTYPE_NAMES[qdt], sketches=_sketches(opts, shape, r, 5, mdt), grad_norm=float(np.linalg.norm(g)),
        **{k: v for k, v in ref_opts.items() if k != "rank_fraction"})
    st_ = opt.state[p]
    assert st_["Q"].shape == (min(m, n), r) and int(st_["step"]) == 5
    assert st_["momentum"].dtype == mdt and st_["Q"].dtype == qdt and p.dtype == param_dtype
    if expect_well_posed:
        assert bounds["well_posed"], bounds
    if not bounds["well_posed"]:
        return {}
    ratios = {}
    for name, fast, exact in (("weight", p.detach(), ref.weight), ("momentum", st_["momentum"], ref.momentum),
                              ("Q", st_["Q"], ref.Q)):
        err = float(np.linalg.norm(fast.double().numpy() - exact))
        assert err <= bounds[name], f"{name}: {err:.3e} > {bounds[name]:.3e}"
        ratios[name] = err / bounds[name]
    return ratios


OPTION_GRID = [
    dict(qr_method=qr, right_factor=rf, power_iters=pi)
    for qr in ortho_fast.functional.qr.QR_METHODS for rf in ortho_fast.functional.dion.RIGHT_FACTORS for pi in (1, 2, 3)
]


@pytest.mark.parametrize("opts", OPTION_GRID, ids=lambda o: f"{o['qr_method']}-{o['right_factor']}-{o['power_iters']}")
@pytest.mark.parametrize("shape, rank_fraction, rank_multiple_of", [
    ((24, 16), 1.0, 1), ((16, 24), 0.5, 1), ((64, 32), 1 / 16, 1), ((32, 64), 1 / 16, 4),
], ids=["tall-full", "wide-half", "tall-1/16", "wide-1/16-mult4"])
def test_float64_matches_reference_for_every_option(shape, rank_fraction, rank_multiple_of, opts):
    """float64, every QR method × right factor × power_iters 1–3, tall and wide, rank fractions
    1, 1/2, 1/16 (with rank_multiple_of 4): within ``dion_variant_tolerances``. κ(G) = 100 for one
    power iteration; 10 for more, where the first-order bound compounds a factor ≈ 2κ(BQ)² per
    iteration (worst case: an error of Q that no triangular factor absorbs) and is not well
    posed at 100 (the property test covers that range with the invariants)."""
    _step_and_compare(shape, dict(opts, rank_fraction=rank_fraction, rank_multiple_of=rank_multiple_of),
                      cond=1e2 if opts["power_iters"] == 1 else 10.0)


@pytest.mark.parametrize("epsilon", [0.3, 5.0])
@pytest.mark.parametrize("qr_method", ortho_fast.functional.qr.QR_METHODS)
@pytest.mark.parametrize("power_iters", [1, 2])
def test_float64_epsilon_matches_reference(epsilon, qr_method, power_iters):
    """The column normalization's ε at sizes comparable to ‖R_j‖ (‖B‖ ≈ 1 here), where a fast
    side that dropped or misplaced it would be far off; with 2 power iterations the shrunken
    columns of the intermediate Q feed the next B·Q."""
    for shape, rank_fraction in (((24, 16), 1.0), ((16, 24), 0.5)):
        _step_and_compare(shape, dict(qr_method=qr_method, power_iters=power_iters, epsilon=epsilon,
                                      rank_fraction=rank_fraction), cond=1e2 if power_iters == 1 else 10.0)


def _warm_state(shape, r, g, rng):
    """A momentum in G's subspace and a Q near the top right singular vectors of B (working
    orientation) — the regime a few steps into training, where κ(BQ) is small."""
    v = np.linalg.svd(g if shape[0] >= shape[1] else g.T)[2][:r].T
    return 0.5 * g, np.linalg.qr(v + 0.1 * rng.standard_normal(v.shape))[0]


@pytest.mark.parametrize("qr_method", ortho_fast.functional.qr.QR_METHODS)
@pytest.mark.parametrize("momentum_dtype, q_dtype", [
    (torch.float32, None), (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32), (torch.bfloat16, None),
])
def test_mixed_precision_matches_float64_reference(momentum_dtype, q_dtype, qr_method):
    """float64 parameters with float32 / bfloat16 momentum (the compute dtype) and Q, as
    microsoft/dion's DionMixedPrecisionConfig: within the tolerance derived for those dtypes.
    bfloat16 is well posed only where κ(BQ) is small: a warm Q (near the top right singular
    vectors), rank 2, a gradient whose top 2 singular values dominate."""
    opts = dict(qr_method=qr_method, rank_fraction=0.125)
    if momentum_dtype == torch.float32:
        _step_and_compare((40, 16), opts, momentum_dtype=momentum_dtype, q_dtype=q_dtype, key="f32")
    _step_and_compare((40, 16), opts, momentum_dtype=momentum_dtype, q_dtype=q_dtype, cond=30.0,
                      state=_warm_state, key="warm")


@pytest.mark.parametrize("qr_method", ortho_fast.functional.qr.QR_METHODS)
def test_float32_parameters(qr_method):
    _step_and_compare((24, 16), dict(qr_method=qr_method, rank_fraction=0.5), param_dtype=torch.float32, cond=10.0)


@settings(deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 40), log_cond=st.floats(0.0, 5.0),
       rank_fraction=st.sampled_from([1.0, 0.5, 0.25, 1 / 16]), power_iters=st.integers(1, 3),
       qr_method=st.sampled_from(ortho_fast.functional.qr.QR_METHODS),
       right_factor=st.sampled_from(ortho_fast.functional.dion.RIGHT_FACTORS),
       error_feedback=st.booleans(), seed=st.integers(0, 2**16))
def test_one_step_property(m, n, log_cond, rank_fraction, power_iters, qr_method, right_factor, error_feedback, seed):
    """Random shapes, spectra and options: compare with the oracle where the comparison is well
    posed; always: P orthonormal within its method's tolerance and the error-feedback identity."""
    opts = dict(rank_fraction=rank_fraction, power_iters=power_iters, qr_method=qr_method,
                right_factor=right_factor, error_feedback=error_feedback)
    _step_and_compare((m, n), opts, cond=10.0**log_cond, key=seed, expect_well_posed=False)
    rng = rng_for("inv", m, n, seed)
    r = ortho_ref.dion_rank(m, n, rank_fraction)
    x, g = torch.tensor(0.02 * rng.standard_normal((m, n))), torch.tensor(spectral_matrix((m, n), rng, 10.0**log_cond))
    mom, q = (torch.tensor(spectral_matrix((m, n), rng, 10.0**log_cond, 0.5)),
              torch.tensor(rng.standard_normal((min(m, n), r))))
    b = (mom + g).numpy()
    b = b.T if m < n else b
    gen = torch.Generator().manual_seed(seed)
    upd = dion_update(x, g, mom, q, lr=LR, mu=MU, weight_decay=WD, epsilon=1e-8, power_iters=power_iters,
                      qr_method=qr_method, right_factor=right_factor, generator=gen)
    p, r_mat = upd.P.numpy(), upd.R.numpy()
    omega = float(np.linalg.norm(p.T @ p - np.eye(r)))
    if qr_method != "randomized_cholesky_qr":  # the randomized one's bound needs the sketch (test_dion_bitwise.py)
        assert omega <= tol.qr_orthogonality_tolerance(b.shape[0], r, qr_method)
    if error_feedback:
        m_new = mom.numpy().T if m < n else mom.numpy()
        ef = tol.error_feedback_tolerance(np.linalg.norm(b), np.linalg.norm(p), np.linalg.norm(r_mat), MU,
                                          b.shape[0], r, "float64")
        assert np.linalg.norm(m_new - (b - (1 - MU) * p @ r_mat.T)) <= ef
        bound = tol.error_feedback_projection_tolerance(
            ef, rows=b.shape[0], b_norm=np.linalg.norm(b), m_norm=np.linalg.norm(m_new), r_norm=np.linalg.norm(r_mat),
            p_norm=np.linalg.norm(p), mu=MU, orthogonality=omega, dtype="float64")
        proj = np.eye(b.shape[0]) - p @ p.T
        assert np.linalg.norm(proj @ (m_new - b)) <= bound
        assert np.linalg.norm(p.T @ m_new - MU * p.T @ b) <= bound


def test_several_steps_track_the_reference():
    """Three optimizer steps (state, step counter and sketches carried by the optimizer), each
    compared with the oracle's step from the optimizer's own state before it."""
    shape, opts = (40, 24), dict(qr_method="randomized_cholesky_qr", right_factor="qr", power_iters=2,
                                 rank_fraction=0.25)
    rng = rng_for("multi")
    p = torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(shape)))
    opt = Dion([torch.nn.Parameter(torch.zeros(3, 2)), p], lr=LR, mu=MU, weight_decay=WD, seed=DION_SEED, **opts)
    r = ortho_ref.dion_rank(*shape, 0.25)
    for step in range(1, 4):
        g = spectral_matrix(shape, rng)
        w_in = p.detach().clone().numpy()
        st_ = opt.state.get(p, {})
        m_in = st_["momentum"].clone().numpy() if st_ else np.zeros(shape)
        q_in = (st_["Q"].clone().numpy() if st_
                else initial_q((24, r), DION_SEED, 1, torch.float64, "cpu").numpy())
        p.grad = torch.tensor(g)
        opt.step()
        ref_opts = {k: v for k, v in opts.items() if k != "rank_fraction"}
        ref = ortho_ref.dion_step(w_in, g, m_in, q_in, lr=LR, mu=MU, weight_decay=WD, rng=np.random.default_rng(0),
                                  **ref_opts)
        bounds = tol.dion_variant_tolerances(ref, q_in, lr=LR, mu=MU, weight=w_in, dtype="float64",
                                             sketches=_sketches(opts, shape, r, step, torch.float64, index=1),
                                             **ref_opts)
        assert bounds["well_posed"] and int(opt.state[p]["step"]) == step
        assert np.linalg.norm(p.detach().numpy() - ref.weight) <= bounds["weight"]
        assert np.linalg.norm(opt.state[p]["momentum"].numpy() - ref.momentum) <= bounds["momentum"]
