"""ortho_fast.Dion with every option against the float64 oracle (ortho_ref.dion_step with the
same options) within ortho_verify.tolerances.dion_variant_tolerances; mixed precision; determinism of
Q0 and the sketches; state_dict round trips; the param-group contract; bad input."""

from __future__ import annotations

import copy
import math
import zlib
from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ortho_fast
import ortho_ref
from ortho_fast import DION_DEFAULTS, Dion, check_dion_step, dion_group_step, normalize_dion_group
from ortho_fast.dion import sketch_rows
from ortho_verify import tolerances as tol
from ortho_verify.spectra import matrix_with_spectrum
from tests.round_trip import round_trip

LR, MU, WD, SEED = 0.05, 0.9, 0.1, 7
DTYPE_NAMES = {torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16"}


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _spectral(shape, rng, cond=1e2, scale=1.0):
    m, n = shape
    return matrix_with_spectrum(scale * np.geomspace(1.0, 1.0 / cond, min(m, n)), m, n, rng)


def _rounded(a: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """a rounded to ``dtype`` (so both sides start from the same numbers), as float64."""
    return torch.tensor(a).to(dtype).double().numpy()


def _sketches(opts, shape, r, step, dtype, index=0):
    """The float64 copies of the sketches the optimizer draws for parameter ``index`` at ``step``."""
    rows = max(shape)
    k = sketch_rows(r, opts.get("oversample", 1.25))
    if opts.get("qr_method") != "randomized_cholesky_qr" or k >= rows:
        return None
    gen = ortho_fast.sketch_generator(SEED, index, step, "cpu")
    f_dtype = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    return [ortho_fast.gaussian_sketch(gen, k, rows, f_dtype, "cpu").double().numpy()
            for _ in range(opts.get("power_iters", 1))]


def _step_and_compare(shape, opts, *, param_dtype=torch.float64, momentum_dtype=None, q_dtype=None, cond=1e2,
                      key=(), state=None, expect_well_posed=True):
    """One Dion step with injected (momentum, Q, step) vs ortho_ref.dion_step; returns the ratios."""
    m, n = shape
    mdt, qdt = momentum_dtype or param_dtype, q_dtype or param_dtype
    rng = _rng("cmp", shape, sorted(opts.items()), key)
    r = ortho_ref.dion_rank(m, n, opts.get("rank_fraction", 1.0), opts.get("rank_multiple_of", 1))
    w0 = _rounded(0.02 * rng.standard_normal(shape), param_dtype)
    g = _rounded(_spectral(shape, rng, cond), param_dtype)
    if state is None:
        m0 = _rounded(_spectral(shape, rng, cond, 0.5), mdt)
        q0 = _rounded(rng.standard_normal((min(m, n), r)), qdt)
    else:
        m0, q0 = (_rounded(a, d) for a, d in zip(state(shape, r, g, rng), (mdt, qdt)))
    p = torch.nn.Parameter(torch.tensor(w0, dtype=param_dtype))
    opt = Dion([p], lr=LR, mu=MU, weight_decay=WD, momentum_dtype=momentum_dtype, q_dtype=q_dtype, seed=SEED, **opts)
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
    for qr in ortho_fast.dion.QR_METHODS for rf in ortho_fast.dion.RIGHT_FACTORS for pi in (1, 2, 3)
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
@pytest.mark.parametrize("qr_method", ortho_fast.dion.QR_METHODS)
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


@pytest.mark.parametrize("qr_method", ortho_fast.dion.QR_METHODS)
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


@pytest.mark.parametrize("qr_method", ortho_fast.dion.QR_METHODS)
def test_float32_parameters(qr_method):
    _step_and_compare((24, 16), dict(qr_method=qr_method, rank_fraction=0.5), param_dtype=torch.float32, cond=10.0)


@settings(deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 40), log_cond=st.floats(0.0, 5.0),
       rank_fraction=st.sampled_from([1.0, 0.5, 0.25, 1 / 16]), power_iters=st.integers(1, 3),
       qr_method=st.sampled_from(ortho_fast.dion.QR_METHODS), right_factor=st.sampled_from(ortho_fast.dion.RIGHT_FACTORS),
       error_feedback=st.booleans(), seed=st.integers(0, 2**16))
def test_one_step_property(m, n, log_cond, rank_fraction, power_iters, qr_method, right_factor, error_feedback, seed):
    """Random shapes, spectra and options: compare with the oracle where the comparison is well
    posed; always: P orthonormal within its method's tolerance and the error-feedback identity."""
    opts = dict(rank_fraction=rank_fraction, power_iters=power_iters, qr_method=qr_method,
                right_factor=right_factor, error_feedback=error_feedback)
    _step_and_compare((m, n), opts, cond=10.0**log_cond, key=seed, expect_well_posed=False)
    rng = _rng("inv", m, n, seed)
    r = ortho_ref.dion_rank(m, n, rank_fraction)
    x, g = torch.tensor(0.02 * rng.standard_normal((m, n))), torch.tensor(_spectral((m, n), rng, 10.0**log_cond))
    mom, q = torch.tensor(_spectral((m, n), rng, 10.0**log_cond, 0.5)), torch.tensor(rng.standard_normal((min(m, n), r)))
    b = (mom + g).numpy()
    b = b.T if m < n else b
    gen = torch.Generator().manual_seed(seed)
    upd = ortho_fast.dion_update(x, g, mom, q, lr=LR, mu=MU, weight_decay=WD, epsilon=1e-8, power_iters=power_iters,
                                 qr_method=qr_method, right_factor=right_factor, generator=gen)
    p, r_mat = upd.P.numpy(), upd.R.numpy()
    omega = float(np.linalg.norm(p.T @ p - np.eye(r)))
    if qr_method != "randomized_cholesky_qr":  # the randomized one's bound needs the sketch (tested elsewhere)
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
    shape, opts = (40, 24), dict(qr_method="randomized_cholesky_qr", right_factor="qr", power_iters=2, rank_fraction=0.25)
    rng = _rng("multi")
    p = torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(shape)))
    opt = Dion([torch.nn.Parameter(torch.zeros(3, 2)), p], lr=LR, mu=MU, weight_decay=WD, seed=SEED, **opts)
    r = ortho_ref.dion_rank(*shape, 0.25)
    for step in range(1, 4):
        g = _spectral(shape, rng)
        w_in = p.detach().clone().numpy()
        st_ = opt.state.get(p, {})
        m_in = st_["momentum"].clone().numpy() if st_ else np.zeros(shape)
        q_in = st_["Q"].clone().numpy() if st_ else ortho_fast.initial_q((24, r), SEED, 1, torch.float64, "cpu").numpy()
        p.grad = torch.tensor(g)
        opt.step()
        ref_opts = {k: v for k, v in opts.items() if k != "rank_fraction"}
        ref = ortho_ref.dion_step(w_in, g, m_in, q_in, lr=LR, mu=MU, weight_decay=WD, rng=np.random.default_rng(0),
                                  **ref_opts)
        bounds = tol.dion_variant_tolerances(ref, q_in, lr=LR, mu=MU, weight=w_in, dtype="float64",
                                             sketches=_sketches(opts, shape, r, step, torch.float64, index=1), **ref_opts)
        assert bounds["well_posed"] and int(opt.state[p]["step"]) == step
        assert np.linalg.norm(p.detach().numpy() - ref.weight) <= bounds["weight"]
        assert np.linalg.norm(opt.state[p]["momentum"].numpy() - ref.momentum) <= bounds["momentum"]


# =======================================================================================
# QR methods on the fast side
# =======================================================================================


def _tall(rows, r, cond, seed):
    return torch.tensor(matrix_with_spectrum(np.geomspace(1.0, 1.0 / cond, r), rows, r, np.random.default_rng(seed)))


@pytest.mark.parametrize("dtype, cond", [(torch.float64, 1e9), (torch.float32, 1e5)])
def test_cholesky_qr2_falls_back_to_householder(dtype, cond):
    """κ(Y) beyond u^(-1/2) of the factorization dtype: CholeskyQR2 returns Householder's P bit for bit."""
    y = _tall(50, 10, cond, 0).to(dtype)
    assert torch.equal(ortho_fast.orthonormalize(y, "cholesky_qr"), ortho_fast.orthonormalize(y))
    y_ok = _tall(50, 10, 10.0, 0).to(dtype)
    assert not torch.equal(ortho_fast.orthonormalize(y_ok, "cholesky_qr"), ortho_fast.orthonormalize(y_ok))


def test_randomized_qr_sketch_and_fallback():
    """No compression (k >= rows): Householder, bit for bit, and the generator is not advanced;
    with compression the result depends only on the generator's seed."""
    y = _tall(10, 8, 10.0, 1)
    gen = torch.Generator().manual_seed(3)
    before = gen.get_state()
    assert torch.equal(ortho_fast.orthonormalize(y, "randomized_cholesky_qr", generator=gen), ortho_fast.orthonormalize(y))
    assert torch.equal(gen.get_state(), before)
    y = _tall(64, 6, 1e10, 2)  # far past CholeskyQR2: the sketch preconditions it
    a, b, c = (ortho_fast.orthonormalize(y, "randomized_cholesky_qr", generator=torch.Generator().manual_seed(s))
               for s in (4, 4, 5))
    assert torch.equal(a, b) and not torch.equal(a, c)
    sketch = ortho_fast.gaussian_sketch(torch.Generator().manual_seed(4), sketch_rows(6), 64, torch.float64, "cpu")
    ks = tol.sketch_condition(y.numpy(), sketch.numpy())
    omega = tol.qr_orthogonality_tolerance(64, 6, "randomized_cholesky_qr", sketch_condition=ks)
    assert np.linalg.norm(a.numpy().T @ a.numpy() - np.eye(6)) <= omega
    with pytest.raises(TypeError, match="^generator:"):
        ortho_fast.orthonormalize(y, "randomized_cholesky_qr")


# =======================================================================================
# Determinism and state_dict
# =======================================================================================

SHAPES = [(24, 16), (16, 24), (20, 20)]


def _run(make, grads, w0, dtype=torch.float64):
    ps = [torch.nn.Parameter(torch.tensor(w, dtype=dtype)) for w in w0]
    opt = make(ps)
    for step in grads:
        for p, g in zip(ps, step):
            p.grad = torch.tensor(g, dtype=dtype)
        opt.step()
    return ps, opt


def _assert_same(run_a, run_b):
    (pa, oa), (pb, ob) = run_a, run_b
    for a, b in zip(pa, pb):
        assert torch.equal(a, b)
        assert set(oa.state[a]) == set(ob.state[b]) == {"momentum", "Q", "step"}
        for k in oa.state[a]:
            assert oa.state[a][k].dtype == ob.state[b][k].dtype and torch.equal(oa.state[a][k], ob.state[b][k]), k


RANDOMIZED = dict(qr_method="randomized_cholesky_qr", power_iters=2, rank_fraction=0.5, right_factor="qr")


def test_same_seed_same_bits_and_no_global_rng():
    rng = _rng("det")
    w0 = [0.02 * rng.standard_normal(s) for s in SHAPES]
    grads = [[_spectral(s, rng) for s in SHAPES] for _ in range(3)]
    make = lambda seed: lambda ps: Dion(ps, seed=seed, **RANDOMIZED)  # noqa: E731
    torch.manual_seed(0)
    a = _run(make(5), grads, w0)
    torch.manual_seed(1)
    b = _run(make(5), grads, w0)
    _assert_same(a, b)
    c = _run(make(6), grads, w0)
    assert not torch.equal(a[0][0], c[0][0])


def test_optimizer_step_is_dion_update_with_the_documented_generator():
    """The optimizer's step on parameter i at step t is ``dion_update`` with Q0 = initial_q(…, seed, i)
    and the sketches of ``sketch_generator(seed, i, t)``, bit for bit."""
    rng = _rng("gen")
    ps = [torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(s))) for s in SHAPES]
    opt = Dion(ps, seed=SEED, **RANDOMIZED)
    x = ps[2].detach().clone()
    r = ortho_fast.dion_rank(20, 20, 0.5)
    mom, q = torch.zeros(20, 20, dtype=torch.float64), ortho_fast.initial_q((20, r), SEED, 2, torch.float64, "cpu")
    for t in (1, 2):
        for p in ps:
            p.grad = torch.tensor(_spectral(tuple(p.shape), rng))
        opt.step()
        ortho_fast.dion_update(x, ps[2].grad, mom, q, lr=0.01, mu=0.95, weight_decay=0.01, epsilon=1e-8,
                               power_iters=2, qr_method="randomized_cholesky_qr", right_factor="qr",
                               generator=ortho_fast.sketch_generator(SEED, 2, t, "cpu"))
        assert torch.equal(x, ps[2].detach()) and torch.equal(mom, opt.state[ps[2]]["momentum"])
        assert torch.equal(q, opt.state[ps[2]]["Q"])


@pytest.mark.parametrize("param_dtype, extra", [
    (torch.float64, RANDOMIZED),
    (torch.bfloat16, dict(RANDOMIZED, momentum_dtype=torch.float32, q_dtype=torch.float32)),
    (torch.float32, dict(qr_method="cholesky_qr", momentum_dtype=torch.bfloat16, rank_fraction=0.25)),
])
def test_state_dict_round_trip_is_bitwise(param_dtype, extra):
    """k steps, save, load into a fresh Dion on cloned parameters, continue: bitwise the
    uninterrupted run — the step counter re-draws the same sketches, and the state keeps its
    dtypes (a float32 momentum of a bfloat16 parameter is not rounded by load_state_dict)."""
    rng = _rng("rt", str(param_dtype))
    w0 = [0.02 * rng.standard_normal(s) for s in SHAPES]
    grads = [[_spectral(s, rng) for s in SHAPES] for _ in range(4)]
    make = lambda ps: Dion(ps, lr=0.02, seed=3, **extra)  # noqa: E731
    full, (resumed_ps, resumed) = round_trip(make, w0, grads, dtype=param_dtype)
    _assert_same(full, (resumed_ps, resumed))
    mdt = extra.get("momentum_dtype", param_dtype)
    assert resumed.state[resumed_ps[0]]["momentum"].dtype == mdt


# =======================================================================================
# Zero gradients, flatten, the param-group contract
# =======================================================================================


@pytest.mark.parametrize("qr_method", ortho_fast.dion.QR_METHODS)
@pytest.mark.parametrize("right_factor", ortho_fast.dion.RIGHT_FACTORS)
def test_zero_gradient_only_decays(qr_method, right_factor):
    p = torch.nn.Parameter(torch.ones(12, 8, dtype=torch.float64))
    opt = Dion([p], lr=0.1, weight_decay=0.5, rank_fraction=0.5, qr_method=qr_method, right_factor=right_factor, seed=2)
    p.grad = torch.zeros(12, 8, dtype=torch.float64)
    opt.step()
    assert torch.equal(opt.state[p]["Q"], ortho_fast.initial_q((8, 4), 2, 0, torch.float64, "cpu"))
    assert not opt.state[p]["momentum"].any() and torch.equal(p.detach(), torch.full((12, 8), 0.95, dtype=torch.float64))


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_flatten_conv_weight_equals_the_matrix_run(memory_format):
    """flatten=True: an (8, 3, 3, 3) weight steps exactly as the (8, 27) matrix (same seed and
    index), also when stored channels_last (no view: updated through a copy)."""
    rng = _rng("conv")
    w0 = torch.tensor(0.02 * rng.standard_normal((8, 3, 3, 3)))
    grads = [torch.tensor(rng.standard_normal((8, 3, 3, 3))) for _ in range(2)]
    conv = torch.nn.Parameter(w0.clone().to(memory_format=memory_format))
    mat = torch.nn.Parameter(w0.reshape(8, 27).clone())
    o_conv = Dion([conv], flatten=True, rank_fraction=0.5, seed=1, **{k: v for k, v in RANDOMIZED.items() if k != "rank_fraction"})
    o_mat = Dion([mat], rank_fraction=0.5, seed=1, **{k: v for k, v in RANDOMIZED.items() if k != "rank_fraction"})
    for g in grads:
        conv.grad, mat.grad = g.clone().to(memory_format=memory_format), g.reshape(8, 27).clone()
        o_conv.step()
        o_mat.step()
    assert torch.equal(conv.detach().reshape(8, 27), mat.detach())
    assert torch.equal(o_conv.state[conv]["momentum"].reshape(8, 27), o_mat.state[mat]["momentum"])
    assert o_conv.state[conv]["Q"].shape == (8, 4) and o_conv.state[conv]["momentum"].shape == (8, 3, 3, 3)


def test_group_functions_drive_dion_groups_like_dion():
    """The contract another optimizer uses: a group filled from DION_DEFAULTS, normalized,
    checked and stepped with ``first_index`` equals Dion's own step of the same parameter at
    the same global index, bit for bit."""
    rng = _rng("contract")
    w_a, w_b = (0.02 * rng.standard_normal(s) for s in ((6, 4), (24, 16)))
    grads = [rng.standard_normal((24, 16)) for _ in range(2)]
    a0, b0 = torch.nn.Parameter(torch.tensor(w_a)), torch.nn.Parameter(torch.tensor(w_b))
    opt = Dion([{"params": [a0]}, {"params": [b0], "qr_method": "rcqr", "rank_fraction": 0.5}], seed=SEED)
    b1 = torch.nn.Parameter(torch.tensor(w_b))
    group = dict(DION_DEFAULTS, params=[b1], qr_method="rcqr", rank_fraction=0.5, algorithm="dion")
    normalize_dion_group(group)
    assert group["qr_method"] == "randomized_cholesky_qr" == opt.param_groups[1]["qr_method"]
    state = defaultdict(dict)
    for g in grads:
        b0.grad, b1.grad = torch.tensor(g), torch.tensor(g)
        opt.step()
        check_dion_step(group, state)
        dion_group_step(group, state, seed=SEED, first_index=1)
    assert torch.equal(b0, b1)
    assert all(torch.equal(opt.state[b0][k], state[b1][k]) for k in ("momentum", "Q", "step"))
    assert set(DION_DEFAULTS) == set(opt.defaults)


# =======================================================================================
# Bad input: a clear error, nothing changed
# =======================================================================================

P = [torch.nn.Parameter(torch.ones(4, 3))]


@pytest.mark.parametrize("kwargs, exc, key", [
    (dict(rank_fraction=0.0), ValueError, "rank_fraction"),
    (dict(rank_fraction=1.0001), ValueError, "rank_fraction"),
    (dict(oversample=0.9), ValueError, "oversample"),
    (dict(right_factor="polar"), ValueError, "right_factor"),
    (dict(qr_method="cqr"), ValueError, "qr_method"),
    (dict(momentum_dtype=torch.int32), TypeError, "momentum_dtype"),
    (dict(q_dtype="float32"), TypeError, "q_dtype"),
    (dict(flatten=1), TypeError, "flatten"),
    (dict(error_feedback=None), TypeError, "error_feedback"),
    (dict(power_iters=True), ValueError, "power_iters"),
])
def test_bad_hyperparameters(kwargs, exc, key):
    with pytest.raises(exc, match=rf"^{key}:"):
        Dion(P, **kwargs)


@pytest.mark.parametrize("shape, flatten", [((5,), False), ((5,), True), ((2, 3, 4), False), ((0, 3), False)])
def test_non_matrix_parameters_rejected(shape, flatten):
    with pytest.raises(ValueError, match="^params:.*" + ("flatten=True" if len(shape) > 2 else "")):
        Dion([torch.nn.Parameter(torch.ones(shape))], flatten=flatten)


def test_bad_param_group_leaves_the_optimizer_unchanged():
    opt = Dion(P)
    with pytest.raises(ValueError, match="^right_factor:"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(5, 5))], "right_factor": "svd"})
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["params"] == P


def _snapshot(ps, opt):
    return [p.detach().clone() for p in ps], copy.deepcopy({id(p): dict(s) for p, s in opt.state.items()})


def _assert_snapshot(ps, opt, snap):
    params, state = snap
    assert all(torch.equal(p.detach(), b) for p, b in zip(ps, params))
    assert {id(p) for p in opt.state} == set(state)
    for p, s in opt.state.items():
        assert set(s) == set(state[id(p)])
        assert all(torch.equal(v, state[id(p)][k]) if torch.is_tensor(v) else v == state[id(p)][k] for k, v in s.items())


@pytest.mark.parametrize("corrupt, match", [
    (lambda ps, opt: ps[1].grad.__setitem__((0, 0), float("nan")), "^grad"),
    (lambda ps, opt: ps[1].grad.__setitem__((1, 2), -float("inf")), "^grad"),
    (lambda ps, opt: opt.state[ps[1]].__setitem__("step", 3), "^step:"),
    (lambda ps, opt: opt.param_groups[1].__setitem__("lr", -1.0), "^lr:"),
    (lambda ps, opt: opt.param_groups[1].__setitem__("lr", float("nan")), "^lr:"),
    (lambda ps, opt: opt.param_groups[1].__setitem__("epsilon", "1e-8"), "^epsilon:"),
    (lambda ps, opt: opt.state[ps[1]].__setitem__("Q", torch.ones(8, 3, dtype=torch.float64)), "^Q:"),
    (lambda ps, opt: opt.state[ps[0]].__setitem__("momentum", torch.ones(2, 2, dtype=torch.float64)), "^momentum:"),
])
def test_bad_step_changes_nothing(corrupt, match):
    """Two groups, randomized QR: a bad gradient, hyperparameter (set by a scheduler) or state in
    the second group raises before the first group (or anything) changes."""
    rng = _rng("bad")
    ps = [torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(s))) for s in ((12, 8), (8, 12))]
    opt = Dion([{"params": [ps[0]]}, {"params": [ps[1]]}], seed=1, **RANDOMIZED)
    for p in ps:
        p.grad = torch.tensor(_spectral(tuple(p.shape), rng))
    opt.step()
    for p in ps:
        p.grad = torch.tensor(_spectral(tuple(p.shape), rng))
    corrupt(ps, opt)
    snap = _snapshot(ps, opt)
    with pytest.raises((ValueError, TypeError), match=match):
        opt.step()
    _assert_snapshot(ps, opt, snap)


def test_named_parameters_are_accepted():
    """Dion(model.named_parameters()) keeps torch's param_names and steps exactly as
    Dion(model.parameters()) (same order, same seed and indices)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8, bias=False), torch.nn.Linear(8, 4, bias=False)).double()
    twin = copy.deepcopy(model)
    named, plain = Dion(model.named_parameters(), seed=2, **RANDOMIZED), Dion(twin.parameters(), seed=2, **RANDOMIZED)
    assert named.param_groups[0]["param_names"] == ["0.weight", "1.weight"]
    rng = _rng("named")
    for _ in range(2):
        for p, q in zip(model.parameters(), twin.parameters()):
            p.grad = q.grad = torch.tensor(rng.standard_normal(tuple(p.shape)))
        named.step()
        plain.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))
    with pytest.raises(ValueError, match="^rank_fraction:"):
        Dion(torch.nn.Linear(3, 2, bias=False).named_parameters(), rank_fraction=2.0)


@pytest.mark.parametrize("seed", [True, 1.5, "3", None])
def test_seed_must_be_an_int(seed):
    with pytest.raises(TypeError, match="^seed:"):
        Dion(P, seed=seed)


def test_load_state_dict_copies_every_tensor():
    """o2.load_state_dict(o1.state_dict()) then o2.step(): o1's step counter (it seeds the
    randomized QR sketches), momentum and Q, and the state dict, are unchanged."""
    rng = _rng("no-alias")
    ps = [torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(s))) for s in SHAPES]
    o1 = Dion(ps, seed=1, **RANDOMIZED)
    for p in ps:
        p.grad = torch.tensor(_spectral(tuple(p.shape), rng))
    o1.step()
    sd = o1.state_dict()
    before = copy.deepcopy(sd["state"])
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    o2 = Dion(qs, seed=1, **RANDOMIZED)
    o2.load_state_dict(sd)
    for q in qs:
        q.grad = torch.tensor(_spectral(tuple(q.shape), rng))
    o2.step()
    for i, (p, q) in enumerate(zip(ps, qs)):
        assert int(o2.state[q]["step"]) == 2
        for key in ("momentum", "Q", "step"):
            assert torch.equal(o1.state[p][key], before[i][key]) and torch.equal(sd["state"][i][key], before[i][key])


@pytest.mark.parametrize("key, value, exc", [("rank_fraction", 2.0, ValueError), ("qr_method", "svd", ValueError),
                                             ("momentum_dtype", torch.int8, TypeError)])
def test_load_state_dict_rejects_a_bad_saved_group_before_any_change(key, value, exc):
    rng = _rng("bad-saved")
    ps = [torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(s))) for s in SHAPES]
    opt = Dion([{"params": ps[:1]}, {"params": ps[1:]}], seed=1, **RANDOMIZED)
    for p in ps:
        p.grad = torch.tensor(_spectral(tuple(p.shape), rng))
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    sd["param_groups"][1][key] = value
    for st_ in sd["state"].values():
        st_["step"] += 5
    groups_before = copy.deepcopy([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups])
    snap = _snapshot(ps, opt)
    with pytest.raises(exc, match=f"^{key}:"):
        opt.load_state_dict(sd)
    _assert_snapshot(ps, opt, snap)
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == groups_before


@pytest.mark.parametrize("call, exc, arg", [
    (lambda: ortho_fast.dion_rank(8, 4, 0.0), ValueError, "rank_fraction"),
    (lambda: ortho_fast.dion_rank(8, 4, -1.0), ValueError, "rank_fraction"),
    (lambda: ortho_fast.dion_rank(8, 4, 2.0), ValueError, "rank_fraction"),
    (lambda: ortho_fast.dion_rank(8, 4, float("nan")), ValueError, "rank_fraction"),
    (lambda: ortho_fast.dion_rank(8, 4, 0.5, 0), ValueError, "rank_multiple_of"),
    (lambda: ortho_fast.dion_rank(8, 4, 0.5, 2.0), ValueError, "rank_multiple_of"),
    (lambda: ortho_fast.dion_rank(0, 4), ValueError, "m"),
    (lambda: ortho_fast.dion_right_factor(torch.ones(4, 2), "bogus"), ValueError, "right_factor"),
    (lambda: ortho_fast.initial_q((4, 0), 0, 0, torch.float32, "cpu"), ValueError, "shape"),
    (lambda: ortho_fast.initial_q((4, 2, 1), 0, 0, torch.float32, "cpu"), ValueError, "shape"),
    (lambda: ortho_fast.initial_q((4, 2), 0, 0, torch.int64, "cpu"), TypeError, "dtype"),
    (lambda: ortho_fast.sketch_generator(0, 0, 0, "cpu"), ValueError, "step"),
    (lambda: ortho_fast.gaussian_sketch(torch.Generator(), 0, 8, torch.float32, "cpu"), ValueError, "k"),
    (lambda: ortho_fast.gaussian_sketch(None, 2, 8, torch.float32, "cpu"), TypeError, "generator"),
])
def test_public_helpers_reject_bad_input_naming_the_argument(call, exc, arg):
    with pytest.raises(exc, match=f"^{arg}:"):
        call()


def test_rank_fraction_and_multiple_match_the_oracle():
    for m, n, frac, mult in [(64, 32, 1 / 16, 1), (64, 32, 1 / 16, 8), (4096, 1024, 1 / 16, 128), (5, 3, 0.01, 1)]:
        assert ortho_fast.dion_rank(m, n, frac, mult) == ortho_ref.dion_rank(m, n, frac, mult)
    p = torch.nn.Parameter(torch.ones(64, 48))
    opt = Dion([p], rank_fraction=1 / 16, rank_multiple_of=4)
    p.grad = torch.ones(64, 48)
    opt.step()
    assert opt.state[p]["Q"].shape == (48, 4) and math.isclose(ortho_fast.dion_rank(64, 48, 1 / 16, 4), 4)


def test_orthonormalize_bad_input():
    with pytest.raises(ValueError, match="^y:"):
        ortho_fast.orthonormalize(torch.ones(2, 3))
    with pytest.raises(ValueError, match="^method:"):
        ortho_fast.orthonormalize(torch.ones(3, 2), "svd")
    with pytest.raises(TypeError, match="^generator:"):
        ortho_fast.dion_update(torch.ones(3, 2), torch.ones(3, 2), torch.zeros(3, 2), torch.ones(2, 1), lr=0.1, mu=0.9,
                               weight_decay=0.0, epsilon=1e-8, qr_method="randomized_cholesky_qr")
