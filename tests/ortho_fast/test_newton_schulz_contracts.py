"""ortho_fast.newton_schulz's bitwise contracts and API: the transpose rule, user tables equal
to named schedules and the tail rule (the last row repeated), zero matrices, output dtypes,
compute dtype names (Megatron's fp32_matmul_prec), torch.compile (eager, aot_eager) and bad
input naming the argument.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_ref
from ortho_fast import COEFFICIENTS, newton_schulz
from ortho_fast.coefficients import resolve_coefficients
from ortho_verify import tolerances as tol
from ortho_verify.inputs.spectra import matrix_with_spectrum
from tests.ortho_fast.helpers import MAX_DIM, SCHEDULE_NAMES, matrix_shapes

# ---------------------------------------------------------------------------------------
# Bitwise contracts: transpose, user tables, tail rule, dtypes
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@settings(deadline=None)
@given(shape=matrix_shapes(kinds=("tall", "wide")), seed=st.integers(0, 2**32 - 1),
       name=st.sampled_from(SCHEDULE_NAMES))
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


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
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
    for name in SCHEDULE_NAMES:
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
    assert torch.equal(compiled(g.mT.contiguous(), dtype=torch.float32),
                       newton_schulz(g.mT.contiguous(), dtype=torch.float32))


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
