"""Tests for ortho_fast.newton_schulz against the exact oracle ortho_ref.ns_map: every schedule
in float64 / float32 (Frobenius error) and bfloat16 (singular values), batches (each matrix its
own norm), eps_mode "clamp" and safety, inductor-compiled runs, power-of-two rescaling and huge
or tiny inputs. Bitwise contracts and bad input: test_newton_schulz_contracts.py.

Every tolerance comes from ortho_verify.tolerances (derived there from perturbation theory);
bitwise equality is asserted only where it is the contract (same torch ops in the same order).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_ref
from ortho_fast import COEFFICIENTS, newton_schulz
from ortho_verify import tolerances as tol
from ortho_verify.inputs.spectra import matrix_with_spectrum
from tests.ortho_fast.helpers import MAX_DIM, SCHEDULE_NAMES, matrix_shapes

TORCH = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@st.composite
def spectral_matrices(draw, max_dim: int = MAX_DIM, min_dim: int = 1):
    """A float64 (m, n) matrix U diag(s) Vᵀ with s geometric from `scale` down to scale/cond,
    cond in [1, 1e6], overall scale in [1e-3, 1e3], from a hypothesis-drawn seed."""
    m, n = draw(matrix_shapes(max_dim, min_dim))
    log_cond = draw(st.floats(0.0, 6.0))
    log_scale = draw(st.floats(-3.0, 3.0))
    seed = draw(st.integers(0, 2**32 - 1))
    k = min(m, n)
    s = 10.0**log_scale * np.geomspace(1.0, 10.0**-log_cond, k)
    return matrix_with_spectrum(s, m, n, np.random.default_rng(seed))


def _fast(a: np.ndarray, name: str, dtype: str, **kw) -> np.ndarray:
    sched = COEFFICIENTS[name]
    out = newton_schulz(torch.from_numpy(a), name, safety=sched.safety, eps=sched.eps, dtype=TORCH[dtype], **kw)
    return out.to(torch.float64).numpy()


# ---------------------------------------------------------------------------------------
# Accuracy against the oracle
# ---------------------------------------------------------------------------------------


# 1 x 1 and 1 x 2 inputs have no averaging and the steps' terms cancel: ns_tolerance covers
# this through ns_step_magnitudes (found by the regression test for 1 x 1 inputs below).
FLOAT32_MIN_DIM = 1


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
@settings(deadline=None)
@given(a=spectral_matrices())
def test_float64_matches_ns_map_within_ns_tolerance(name, a):
    _check_ns_tolerance(name, "float64", a)


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
@settings(deadline=None)
@given(a=spectral_matrices(min_dim=FLOAT32_MIN_DIM))
def test_float32_matches_ns_map_within_ns_tolerance(name, a):
    _check_ns_tolerance(name, "float32", a)


def _oracle_schedule(name: str):
    """(table, schedule) of the oracle's own transcription (``ortho_ref.schedule``), never the
    fast registry's: a typo in a coefficient, safety or eps of ``ortho_fast.COEFFICIENTS``
    makes the fast side (which runs its registry) disagree with this reference."""
    return ortho_ref.schedule(name), ortho_ref.SCHEDULES[name]


def _check_ns_tolerance(name: str, dtype: str, a: np.ndarray) -> None:
    table, sched = _oracle_schedule(name)
    ref = ortho_ref.ns_map(a, table, safety=sched.safety, eps=sched.eps)
    sigma_hat = ortho_ref.normalized_singular_values(a, safety=sched.safety, eps=sched.eps)
    fast = _fast(a, name, dtype)
    assert fast.shape == a.shape
    err = np.linalg.norm(fast - ref)
    bound = tol.ns_tolerance(sigma_hat, table, a.shape, dtype)
    assert err <= bound, f"{name}/{dtype} {a.shape}: ‖fast − ns_map‖_F = {err:.3e} > {bound:.3e}"


@pytest.mark.parametrize("name, field, value", [("jordan", "tail", (3.4445, -4.7750, 2.0316)),
                                                ("polar_express", "safety", 1.01), ("cesista5", "eps", 1e-3)])
def test_a_typo_in_the_fast_registry_is_caught(monkeypatch, name, field, value):
    """The reference comes from ortho_ref's own transcription: one changed digit (or the
    normalization) of ortho_fast.COEFFICIENTS fails the float64 comparison."""
    a = matrix_with_spectrum(np.geomspace(1.0, 1e-2, 8), 8, 12, np.random.default_rng(0))
    _check_ns_tolerance(name, "float64", a)
    monkeypatch.setitem(COEFFICIENTS, name, dataclasses.replace(COEFFICIENTS[name], **{field: value}))
    with pytest.raises(AssertionError, match="fast − ns_map"):
        _check_ns_tolerance(name, "float64", a)


# Regression: these inputs exceeded ns_tolerance before it counted the steps' term sizes S_t.
@pytest.mark.parametrize("name, value",
                         [("jordan", -0.0008520375827612452), ("polar_express", -0.00010086800206755943)])
def test_float32_1x1_within_ns_tolerance(name, value):
    _check_ns_tolerance(name, "float32", np.array([[value]]))


def _low_precision_singular_value_error(name: str, a: np.ndarray, dtype: str, fast: np.ndarray | None = None):
    table, sched = _oracle_schedule(name)
    sigma_hat = ortho_ref.normalized_singular_values(a, safety=sched.safety, eps=sched.eps)
    if fast is None:
        fast = _fast(a, name, dtype)
    sv_fast = np.sort(ortho_ref.singular_values(fast))
    sv_ref = np.sort(ortho_ref.ns_polynomial(sigma_hat, table))
    err = float(np.max(np.abs(sv_fast - sv_ref)))
    return err, tol.ns_singular_value_tolerance(sigma_hat, table, a.shape, dtype)


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
@settings(deadline=None)
@given(a=spectral_matrices())
def test_bfloat16_singular_values_within_tolerance(name, a):
    err, bound = _low_precision_singular_value_error(name, a, "bfloat16")
    assert err <= bound, f"{name}/bf16 {a.shape}: max |Δσ| = {err:.3e} > {bound:.3e}"


# ---------------------------------------------------------------------------------------
# Batching: each matrix is an independent problem with its own Frobenius norm
# ---------------------------------------------------------------------------------------


@settings(deadline=None)
@given(
    shape=matrix_shapes(32),
    batch=st.integers(2, 4),
    log_cond=st.floats(0.0, 6.0),
    seed=st.integers(0, 2**32 - 1),
    name=st.sampled_from(SCHEDULE_NAMES),
)
def test_batched_equals_per_matrix_with_own_norm(shape, batch, log_cond, seed, name):
    m, n = shape
    rng = np.random.default_rng(seed)
    s = np.geomspace(1.0, 10.0**-log_cond, min(m, n))
    mats = [matrix_with_spectrum(s, m, n, rng) for _ in range(batch)]
    mats[1] = mats[1] * 1e3  # one member far larger: a shared (batch-wide) norm would shrink the others
    stacked = torch.from_numpy(np.stack(mats))
    table, sched = _oracle_schedule(name)
    fast_sched = COEFFICIENTS[name]
    kw = dict(safety=fast_sched.safety, eps=fast_sched.eps, dtype=torch.float64)
    out = newton_schulz(stacked, name, **kw)
    assert out.shape == (batch, m, n)
    for i, a in enumerate(mats):
        sigma_hat = ortho_ref.normalized_singular_values(a, safety=sched.safety, eps=sched.eps)
        bound = tol.ns_tolerance(sigma_hat, table, a.shape, "float64")
        ref = ortho_ref.ns_map(a, table, safety=sched.safety, eps=sched.eps)
        single = newton_schulz(torch.from_numpy(a), name, **kw).numpy()
        assert np.linalg.norm(out[i].numpy() - ref) <= bound, f"member {i} vs ns_map"
        assert np.linalg.norm(out[i].numpy() - single) <= bound, f"member {i} vs single call"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_batched_low_precision_matches_per_matrix_singular_values(name, dtype):
    """Batched (b, m, n) in bf16 / fp16 (torch.bmm / baddbmm path) against the oracle's singular
    values, per matrix, with ns_singular_value_tolerance; tall members go through the transpose.
    Regression for cubic (c = 0): torch's CPU baddbmm in bf16/fp16 ignores beta when alpha = 0
    for matrices >= 13 x 13, which made the batched iteration diverge."""
    rng = np.random.default_rng(11)
    sched = COEFFICIENTS[name]
    for m, n in ((16, 20), (20, 16), (16, 16)):
        mats = [matrix_with_spectrum(np.geomspace(1.0, 1e-2, min(m, n)) * 10.0**j, m, n, rng) for j in range(3)]
        out = newton_schulz(torch.from_numpy(np.stack(mats)), name, safety=sched.safety, eps=sched.eps,
                            dtype=TORCH[dtype])
        assert out.shape == (3, m, n) and out.dtype == torch.float64
        for a, o in zip(mats, out):
            err, bound = _low_precision_singular_value_error(name, a, dtype, o.numpy())
            assert err <= bound, f"{name}/{dtype} batched {a.shape}: max |Δσ| = {err:.3e} > {bound:.3e}"


@settings(deadline=None)
@given(shape=matrix_shapes(24), log_cond=st.floats(0.0, 6.0), seed=st.integers(0, 2**32 - 1))
def test_extra_leading_dims(shape, log_cond, seed):
    """(b1, b2, m, n) gives the same result as the flattened (b1·b2, m, n) batch."""
    m, n = shape
    rng = np.random.default_rng(seed)
    s = np.geomspace(1.0, 10.0**-log_cond, min(m, n))
    mats = np.stack([matrix_with_spectrum(s, m, n, rng) for _ in range(6)])
    g = torch.from_numpy(mats)
    out4 = newton_schulz(g.reshape(2, 3, m, n), dtype=torch.float64)
    out3 = newton_schulz(g, dtype=torch.float64)
    assert out4.shape == (2, 3, m, n)
    assert torch.equal(out4.reshape(6, m, n), out3)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_eps_mode_clamp_matches_oracle(dtype):
    """eps_mode='clamp' (torch.optim.Muon's normalization) against ns_map(eps_mode='clamp');
    with a tiny matrix (‖G‖_F < eps) clamp and add normalize differently."""
    rng = np.random.default_rng(4)
    table = ortho_ref.schedule("jordan")
    for scale in (1.0, 1e-8):
        a = matrix_with_spectrum(scale * np.geomspace(1, 1e-2, 12), 12, 20, rng)
        ref = ortho_ref.ns_map(a, table, eps_mode="clamp")
        sigma_hat = ortho_ref.normalized_singular_values(a, eps_mode="clamp")
        fast = newton_schulz(torch.from_numpy(a), dtype=TORCH[dtype], eps_mode="clamp").double().numpy()
        assert np.linalg.norm(fast - ref) <= tol.ns_tolerance(sigma_hat, table, a.shape, dtype)
    add = newton_schulz(torch.from_numpy(a), dtype=torch.float64, eps_mode="add")
    assert not torch.equal(add, torch.from_numpy(fast))


def test_safety_is_applied():
    """safety s divides the input by s·‖G‖_F: matches ns_map with the same safety, and
    differs from safety 1."""
    rng = np.random.default_rng(5)
    a = matrix_with_spectrum(np.geomspace(1, 1e-3, 10), 10, 16, rng)
    table = ortho_ref.schedule("polar_express")
    fast = newton_schulz(torch.from_numpy(a), "polar_express", safety=1.02, eps=1e-6, dtype=torch.float64).numpy()
    ref = ortho_ref.ns_map(a, table, safety=1.02, eps=1e-6)
    sigma_hat = ortho_ref.normalized_singular_values(a, safety=1.02, eps=1e-6)
    bound = tol.ns_tolerance(sigma_hat, table, a.shape, "float64")
    assert np.linalg.norm(fast - ref) <= bound
    ref1 = ortho_ref.ns_map(a, table, safety=1.0, eps=1e-6)
    assert np.linalg.norm(fast - ref1) > bound


# ---------------------------------------------------------------------------------------
# torch.compile with the default (inductor) backend: g++ on CPU
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_inductor_compile_within_ns_tolerance_of_eager():
    """torch.compile(fullgraph=True, inductor) may fuse and reorder roundings, so bitwise
    equality is not the contract: the compiled result must satisfy the eager contract (within
    ns_tolerance of ns_map in float32 / float64, singular values within
    ns_singular_value_tolerance in bfloat16), hence within twice the tolerance of eager."""
    torch._dynamo.reset()
    compiled = torch.compile(newton_schulz, fullgraph=True)
    table = ortho_ref.schedule("jordan")
    rng = np.random.default_rng(12)
    for shape in ((24, 16), (3, 16, 24)):  # the transpose branch and the batched path; 6 graphs < recompile_limit
        mats = rng.standard_normal(shape)
        g = torch.from_numpy(mats)
        for dtype in ("float64", "float32", "bfloat16"):
            out = compiled(g, dtype=TORCH[dtype]).numpy()
            eager = newton_schulz(g, dtype=TORCH[dtype]).numpy()
            for a, o, e in zip(mats.reshape(-1, *shape[-2:]),
                               out.reshape(-1, *shape[-2:]), eager.reshape(-1, *shape[-2:])):
                sigma_hat = ortho_ref.normalized_singular_values(a)
                if dtype == "bfloat16":
                    err, bound = _low_precision_singular_value_error("jordan", a, dtype, o)
                    assert err <= bound
                    continue
                bound = tol.ns_tolerance(sigma_hat, table, a.shape, dtype)
                assert np.linalg.norm(o - ortho_ref.ns_map(a, table)) <= bound
                assert np.linalg.norm(o - e) <= 2 * bound


# Scale: the normalization is computed on X/2^e (exact), so a power-of-two rescaling of the
# input leaves every bit unchanged, and huge or tiny matrices (whose plain ‖X‖_F overflows or
# underflows in float32 / bfloat16 / float16) still get U f(Σ̂) Vᵀ.
@settings(deadline=None)
@given(a=spectral_matrices(max_dim=12), k=st.integers(-60, 60),  # entries stay normal numbers
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]), batched=st.booleans())
def test_power_of_two_rescaling_is_bitwise_invariant(a, k, dtype, batched):
    g = torch.tensor(a, dtype=torch.float64)
    g = torch.stack([g, 2 * g]) if batched else g
    x = g.to(dtype)
    assert torch.equal(newton_schulz(x * 2.0**k, eps=0.0, dtype=dtype), newton_schulz(x, eps=0.0, dtype=dtype))


@pytest.mark.parametrize("dtype, scale, input_dtype", [
    (torch.float32, 1e30, None), (torch.float32, 1e-30, None), (torch.float32, 3e37, None),
    (torch.float16, 1e4, None), (torch.float16, 1.2e5, None),  # max|G| in [32768, 65504]: β capped at 2^15
    (torch.float16, 1e7, torch.float32),  # float32 input beyond float16's range, computed in float16
    (torch.bfloat16, 1e30, None)])
def test_huge_and_tiny_inputs_match_ns_map(dtype, scale, input_dtype):
    a = matrix_with_spectrum(np.geomspace(1.0, 1e-2, 8), 8, 16, np.random.default_rng(0)) * scale
    g = torch.tensor(a).to(input_dtype or dtype)
    assert torch.isfinite(g).all()
    fast = newton_schulz(g, eps=0.0, dtype=dtype).double().numpy()
    table = ortho_ref.schedule("jordan")
    ref = ortho_ref.ns_map(a, table, eps=0.0)
    sigma_hat = ortho_ref.normalized_singular_values(a, eps=0.0)
    name = str(dtype).removeprefix("torch.")
    if dtype == torch.float32:
        assert np.linalg.norm(fast - ref) <= tol.ns_tolerance(sigma_hat, table, a.shape, name)
    else:  # low precision: sorted singular values (Weyl), as the other bf16/fp16 checks
        bound = tol.ns_singular_value_tolerance(sigma_hat, table, a.shape, name)
        err = np.max(np.abs(np.linalg.svd(fast, compute_uv=False) - np.linalg.svd(ref, compute_uv=False)))
        assert err <= bound
