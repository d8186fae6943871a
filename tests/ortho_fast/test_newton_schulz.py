"""Tests for ortho_fast.newton_schulz against the exact oracle ortho_ref.ns_map.

Every tolerance comes from ortho_verify.tolerances (derived there from perturbation theory);
bitwise equality is asserted only where it is the contract (same torch ops in the same order).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_ref
from ortho_fast import COEFFICIENTS, newton_schulz, resolve_coefficients
from ortho_verify import tolerances as tol
from ortho_verify.spectra import matrix_with_spectrum

SCHEDULES = sorted(COEFFICIENTS)
TORCH = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAX_DIM = 48


@st.composite
def shapes(draw, max_dim: int = MAX_DIM, min_dim: int = 1, kinds=("tall", "wide", "square")):
    """(m, n) that is tall (m > n), wide (m < n) or square, with min_dim <= m, n <= max_dim."""
    kind = draw(st.sampled_from(kinds))
    small = draw(st.integers(min_dim, max_dim - 1))
    if kind == "square":
        return small, small
    large = draw(st.integers(small + 1, max_dim))
    return (large, small) if kind == "tall" else (small, large)


@st.composite
def spectral_matrices(draw, max_dim: int = MAX_DIM, min_dim: int = 1):
    """A float64 (m, n) matrix U diag(s) Vᵀ with s geometric from `scale` down to scale/cond,
    cond in [1, 1e6], overall scale in [1e-3, 1e3], from a hypothesis-drawn seed."""
    m, n = draw(shapes(max_dim, min_dim))
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


@pytest.mark.parametrize("name", SCHEDULES)
@settings(deadline=None)
@given(a=spectral_matrices())
def test_float64_matches_ns_map_within_ns_tolerance(name, a):
    _check_ns_tolerance(name, "float64", a)


@pytest.mark.parametrize("name", SCHEDULES)
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
@pytest.mark.parametrize("name, value", [("jordan", -0.0008520375827612452), ("polar_express", -0.00010086800206755943)])
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


@pytest.mark.parametrize("name", SCHEDULES)
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
    shape=shapes(32),
    batch=st.integers(2, 4),
    log_cond=st.floats(0.0, 6.0),
    seed=st.integers(0, 2**32 - 1),
    name=st.sampled_from(SCHEDULES),
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
@pytest.mark.parametrize("name", SCHEDULES)
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
@given(shape=shapes(24), log_cond=st.floats(0.0, 6.0), seed=st.integers(0, 2**32 - 1))
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


# ---------------------------------------------------------------------------------------
# Bitwise contracts: transpose, user tables, tail rule, dtypes
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@settings(deadline=None)
@given(shape=shapes(kinds=("tall", "wide")), seed=st.integers(0, 2**32 - 1), name=st.sampled_from(SCHEDULES))
def test_transpose_is_bitwise(dtype, shape, seed, name):
    """A tall input is transposed to the wide side, iterated and transposed back: exactly the
    operations applied to its wide transpose."""
    g = torch.from_numpy(np.random.default_rng(seed).standard_normal(shape))
    a = newton_schulz(g.mT, name, dtype=dtype)
    b = newton_schulz(g, name, dtype=dtype).mT
    assert torch.equal(a, b)


@settings(deadline=None)
@given(n=st.integers(1, MAX_DIM), log_cond=st.floats(0.0, 6.0), seed=st.integers(0, 2**32 - 1))
def test_square_transpose_within_tolerance(n, log_cond, seed):
    """Square inputs are not transposed (Gram XXᵀ either way); NS(Gᵀ) = NS(G)ᵀ holds to rounding."""
    a = matrix_with_spectrum(np.geomspace(1.0, 10.0**-log_cond, n), n, n, np.random.default_rng(seed))
    table = ortho_ref.schedule("jordan")
    bound = tol.ns_tolerance(ortho_ref.normalized_singular_values(a), table, a.shape, "float64")
    g = torch.from_numpy(a)
    diff = newton_schulz(g.mT, dtype=torch.float64) - newton_schulz(g, dtype=torch.float64).mT
    assert float(torch.linalg.norm(diff)) <= 2 * bound  # each side within `bound` of ns_map


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_user_table_equals_named_schedule_and_tail_rule(name, dtype):
    rng = np.random.default_rng(7)
    for shape in ((12, 20), (20, 12), (16, 16)):
        g = torch.from_numpy(rng.standard_normal(shape))
        sched = COEFFICIENTS[name]
        rows = sched.table()
        kw = dict(safety=sched.safety, eps=sched.eps, dtype=dtype)
        named = newton_schulz(g, name, **kw)
        assert torch.equal(newton_schulz(g, rows, **kw), named)
        assert torch.equal(newton_schulz(g, np.array(rows), **kw), named)
        assert torch.equal(newton_schulz(g, torch.tensor(rows, dtype=torch.float64), **kw), named)
        # steps beyond a user table repeat its last row
        t = len(rows)
        extended = newton_schulz(g, rows + [rows[-1], rows[-1]], **kw)
        assert torch.equal(newton_schulz(g, rows, steps=t + 2, **kw), extended)
        # fewer steps truncate
        assert torch.equal(newton_schulz(g, rows, steps=2, **kw), newton_schulz(g, rows[:2], **kw))


def test_tail_rule_distinguishes_schedules():
    """The repeated last row is observable: a user table of polar_express_paper's first 5 rows
    run for 7 steps differs from the named schedule's 7 steps (rows 6 and 7 differ)."""
    g = torch.from_numpy(np.random.default_rng(1).standard_normal((16, 24)))
    rows = COEFFICIENTS["polar_express_paper"].table()
    user7 = newton_schulz(g, rows, steps=7, dtype=torch.float64)
    named7 = newton_schulz(g, "polar_express_paper", steps=7, dtype=torch.float64)
    assert resolve_coefficients(rows, 7)[5:] == [rows[-1], rows[-1]]
    assert not torch.equal(user7, named7)


def test_named_steps_beyond_table_use_tail():
    g = torch.from_numpy(np.random.default_rng(2).standard_normal((10, 14)))
    for name in SCHEDULES:
        sched = COEFFICIENTS[name]
        t = sched.default_steps + 3
        expected_rows = list(sched.rows[:t]) + [sched.tail] * max(0, t - len(sched.rows))
        assert torch.equal(
            newton_schulz(g, name, steps=t, dtype=torch.float64),
            newton_schulz(g, expected_rows, dtype=torch.float64),
        )


@pytest.mark.parametrize("eps_mode", ["add", "clamp"])
@pytest.mark.parametrize("shape", [(5, 7), (7, 5), (3, 4, 6)])
def test_zero_matrix_gives_zeros(shape, eps_mode):
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        out = newton_schulz(torch.zeros(shape), dtype=dtype, eps_mode=eps_mode)
        assert out.shape == shape
        assert torch.equal(out, torch.zeros(shape))


# Regression: with eps = 0 a zero matrix once gave 0/0 = NaN.
@pytest.mark.parametrize("eps_mode", ["add", "clamp"])
def test_zero_matrix_with_eps_zero_gives_zeros(eps_mode):
    table = ortho_ref.schedule("jordan")
    ref = ortho_ref.ns_map(np.zeros((3, 4)), table, eps=0.0, eps_mode=eps_mode)
    for shape in ((3, 4), (2, 3, 4)):
        out = newton_schulz(torch.zeros(shape, dtype=torch.float64), eps=0.0, eps_mode=eps_mode, dtype=torch.float64)
        assert torch.equal(out.reshape(-1, 3, 4)[0], torch.from_numpy(ref))


def test_output_dtype():
    g64 = torch.from_numpy(np.random.default_rng(3).standard_normal((6, 9)))
    assert newton_schulz(g64).dtype == torch.float64
    assert newton_schulz(g64.float()).dtype == torch.float32
    assert newton_schulz(g64.bfloat16(), dtype=torch.float32).dtype == torch.bfloat16
    out = newton_schulz(g64, dtype=torch.float32, out_dtype=torch.float16)
    assert out.dtype == torch.float16
    assert torch.equal(out, newton_schulz(g64, dtype=torch.float32).to(torch.float16))
    assert newton_schulz(g64.float(), dtype=torch.float64, out_dtype=torch.bfloat16).dtype == torch.bfloat16


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
# Bad input: clear errors naming the argument
# ---------------------------------------------------------------------------------------

G = torch.ones(4, 6)


@pytest.mark.parametrize(
    "call, exc, arg",
    [
        (lambda: newton_schulz(torch.ones(5)), ValueError, "g"),
        (lambda: newton_schulz(torch.ones(0, 4)), ValueError, "g"),
        (lambda: newton_schulz(torch.ones(4, 0)), ValueError, "g"),
        (lambda: newton_schulz(torch.ones(3, 4, dtype=torch.int64)), TypeError, "g"),
        (lambda: newton_schulz(torch.ones(3, 4, dtype=torch.bool)), TypeError, "g"),
        (lambda: newton_schulz(np.ones((3, 4))), TypeError, "g"),
        (lambda: newton_schulz([[1.0, 2.0], [3.0, 4.0]]), TypeError, "g"),
        (lambda: newton_schulz(G, "no_such_schedule"), ValueError, "coefficients"),
        (lambda: newton_schulz(G, [[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]]), ValueError, "coefficients"),
        (lambda: newton_schulz(G, [[1.0, float("nan"), 0.0]]), ValueError, "coefficients"),
        (lambda: newton_schulz(G, steps=0), ValueError, "steps"),
        (lambda: newton_schulz(G, steps=-2), ValueError, "steps"),
        (lambda: newton_schulz(G, safety=0), ValueError, "safety"),
        (lambda: newton_schulz(G, safety=-1.0), ValueError, "safety"),
        (lambda: newton_schulz(G, eps=-1), ValueError, "eps"),
        (lambda: newton_schulz(G, eps=float("nan")), ValueError, "eps"),
        (lambda: newton_schulz(G, eps_mode="foo"), ValueError, "eps_mode"),
        (lambda: newton_schulz(G, dtype=torch.int32), TypeError, "dtype"),
    ],
)
def test_bad_input_raises_naming_argument(call, exc, arg):
    # messages start with "<arg>:" (KeyError's str() adds quotes)
    with pytest.raises(exc, match=rf"^['\"]?{arg}:"):
        call()


# ---------------------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_matches_eager_bitwise(backend):
    torch._dynamo.reset()
    g = torch.from_numpy(np.random.default_rng(6).standard_normal((16, 24))).float()
    eager = newton_schulz(g, dtype=torch.float32)
    compiled = torch.compile(newton_schulz, backend=backend, fullgraph=False)
    t0 = time.perf_counter()
    out = compiled(g, dtype=torch.float32)
    assert time.perf_counter() - t0 < 60
    assert out.dtype == eager.dtype and out.shape == eager.shape
    assert torch.equal(out, eager)
    # tall input goes through the transpose branch
    assert torch.equal(compiled(g.mT.contiguous(), dtype=torch.float32), newton_schulz(g.mT.contiguous(), dtype=torch.float32))


# ---------------------------------------------------------------------------------------
# Dtype policy: compute dtype names, None, Megatron's fp32_matmul_prec names
# ---------------------------------------------------------------------------------------


def test_compute_dtype_names_map_onto_the_policy():
    """None computes in the input's dtype; Megatron's "medium" is bfloat16 and "highest" is
    float32 (same bits as naming the dtype); "high" computes in float32 under
    set_float32_matmul_precision("high") and restores the caller's setting."""
    a = matrix_with_spectrum(np.geomspace(1, 1e-3, 12), 12, 20, np.random.default_rng(8))
    g = torch.from_numpy(a)
    assert torch.equal(newton_schulz(g, dtype=None), newton_schulz(g, dtype=torch.float64))
    assert torch.equal(newton_schulz(g.float(), dtype=None), newton_schulz(g.float(), dtype=torch.float32))
    assert torch.equal(newton_schulz(g, dtype="medium"), newton_schulz(g, dtype=torch.bfloat16))
    assert torch.equal(newton_schulz(g, dtype="highest"), newton_schulz(g, dtype=torch.float32))
    assert not torch.equal(newton_schulz(g, dtype="medium"), newton_schulz(g, dtype="highest"))
    before = torch.get_float32_matmul_precision()
    high = newton_schulz(g, dtype="high").numpy()
    assert torch.get_float32_matmul_precision() == before
    table = ortho_ref.schedule("jordan")
    # TF32 (where a backend uses it for "high") rounds inputs to 10 mantissa bits: float16's u.
    bound = tol.ns_tolerance(ortho_ref.normalized_singular_values(a), table, a.shape, "float16")
    assert np.linalg.norm(high - ortho_ref.ns_map(a, table)) <= bound


def test_per_step_user_rows_not_in_the_registry():
    """A user's per-step table (Emerging-Optimizers' 4-decimal Polar Express, 8 rows) as a list,
    an array and a tensor: all equal, and within ns_tolerance of ns_map with the same rows."""
    rows = [(8.2051, -22.9019, 16.4607), (4.0664, -2.8612, 0.5184), (3.9096, -2.8234, 0.5250),
            (3.2856, -2.4153, 0.4853), (2.2779, -1.6198, 0.3985), (1.8726, -1.2307, 0.3585),
            (1.8564, -1.2132, 0.3568), (1.8750, -1.2500, 0.3750)]
    a = matrix_with_spectrum(np.geomspace(1, 1e-4, 16), 16, 24, np.random.default_rng(9))
    g = torch.from_numpy(a)
    out = newton_schulz(g, rows, dtype=torch.float64)
    assert torch.equal(out, newton_schulz(g, np.array(rows), dtype=torch.float64))
    assert torch.equal(out, newton_schulz(g, torch.tensor(rows, dtype=torch.float64), dtype=torch.float64))
    table = np.array(rows)
    bound = tol.ns_tolerance(ortho_ref.normalized_singular_values(a), table, a.shape, "float64")
    assert np.linalg.norm(out.numpy() - ortho_ref.ns_map(a, table)) <= bound


@pytest.mark.parametrize("bad", [None, {"a": 1.0}, [[1.0, "x", 2.0]]])
def test_coefficients_not_numbers_raise_type_error(bad):
    with pytest.raises((TypeError, ValueError), match=r"^coefficients:"):
        newton_schulz(G, bad)


def test_bad_compute_dtype_name():
    with pytest.raises(TypeError, match=r"^dtype:"):
        newton_schulz(G, dtype="low")


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
