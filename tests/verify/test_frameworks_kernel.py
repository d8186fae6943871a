"""ortho_verify.frameworks.jax_kernel: a Newton–Schulz function written in JAX judged by
check_orthogonalizer through the adapter — a correct kernel passes (float32, bfloat16), planted bugs
fail with their cause named, conversion keeps dtype, shape and values, and the kernel stays pure."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings, strategies as st

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from ortho_verify import check_orthogonalizer  # noqa: E402
from ortho_verify.frameworks import jax_kernel  # noqa: E402

JORDAN = ((3.4445, -4.7750, 2.0315),) * 5
#: Tall, wide and batched: every orientation the kernel branches on, few shapes (one compilation each).
SHAPES = [(37, 16), (12, 29), (3, 20, 20)]


def jax_newton_schulz(x, coefficients=JORDAN, *, dtype=jnp.float32, eps=1e-7, transpose_back=True):
    """A user's Newton–Schulz kernel in JAX, (..., m, n) -> (..., m, n) in x's dtype, computed in
    ``dtype``: X₀ = G/(‖G‖_F + eps) (norm in float32), X ← aX + (bA + cA²)X on the wide side. The
    coefficient products are formed in float32 and rounded once, as torch does for a Python scalar
    (JAX would round the scalar itself to bfloat16: a = 3.4445 -> 3.4375).
    ``transpose_back=False`` plants a bug: a tall input's result is reshaped, not transposed, back."""
    f32 = lambda t: t.astype(jnp.float32)  # noqa: E731
    y = (f32(x) / (jnp.linalg.norm(f32(x), axis=(-2, -1), keepdims=True) + eps)).astype(dtype)
    tall = y.shape[-2] > y.shape[-1]
    if tall:
        y = jnp.swapaxes(y, -1, -2)
    for a, b, c in coefficients:
        gram = y @ jnp.swapaxes(y, -1, -2)
        poly = (b * f32(gram) + c * f32(gram @ gram)).astype(dtype)
        y = (a * f32(y) + f32(poly @ y)).astype(dtype)
    if tall:
        y = jnp.swapaxes(y, -1, -2) if transpose_back else y.reshape(x.shape)
    return y.astype(x.dtype)


@pytest.mark.parametrize("dtype, jdtype", [(torch.float32, jnp.float32), (torch.bfloat16, jnp.bfloat16)],
                         ids=["float32", "bfloat16"])
def test_correct_jax_kernel_passes(dtype, jdtype):
    kernel = jax_kernel(jax.jit(functools.partial(jax_newton_schulz, dtype=jdtype)))
    report = check_orthogonalizer(kernel, coefficients="jordan", dtype=dtype, shapes=SHAPES)
    assert report.passed, report.summary()
    assert 0 < report.worst_ratio <= 1 and any(r.check == "ns_mean_deviation" for r in report.results)


PLANTED = {
    "coefficient c 1% off": (dict(coefficients=((3.4445, -4.7750, 2.0315 * 1.01),) * 5), "c x1.01"),
    "tall input not transposed back": (dict(transpose_back=False), "reshaped, not transposed, back"),
    "bfloat16 declared as float32": (dict(dtype=jnp.bfloat16), "computes in bfloat16 where float32 is declared"),
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_planted_jax_bugs_fail_with_their_cause(name):
    options, cause = PLANTED[name]
    kernel = jax_kernel(jax.jit(functools.partial(jax_newton_schulz, **options)))
    report = check_orthogonalizer(kernel, coefficients="jordan", dtype=torch.float32, shapes=SHAPES, statistical=False)
    assert report.status == "failed"
    assert cause in report.cause, report.cause
    if name == "tall input not transposed back":  # wide and square inputs take the other branch: they pass
        assert all("37, 16" in f.result.input for f in report.failures), [f.result.input for f in report.failures]


@settings(deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=2, max_size=4),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), seed=st.integers(0, 2**16))
def test_round_trip_keeps_dtype_shape_and_bits(shape, dtype, seed):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
    seen = {}

    def identity(a):
        seen["dtype"], seen["shape"] = str(a.dtype), a.shape
        return a

    out = jax_kernel(identity)(x)
    assert seen == {"dtype": str(dtype).removeprefix("torch."), "shape": tuple(shape)}
    assert out.dtype == dtype and out.shape == x.shape and torch.equal(out, x)
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_round_trip_through_numpy_where_dlpack_is_refused(monkeypatch, dtype):
    def refuse(*args, **kwargs):
        raise BufferError("no DLPack here")

    monkeypatch.setattr(jax.dlpack, "from_dlpack", refuse)
    monkeypatch.setattr(torch, "from_dlpack", refuse)
    x = torch.randn(3, 5).to(dtype)
    out = jax_kernel(lambda a: a * 2)(x)
    assert out.dtype == dtype and torch.equal(out, x * 2)


def test_kernel_is_pure_both_ways():
    """fn never sees a later write to the torch input, and writing into the output changes nothing in JAX."""
    kept = {}

    def keep(a):
        kept["input"] = a
        kept["output"] = a * 2
        return kept["output"]

    x = torch.ones(3, 4)
    out = jax_kernel(keep)(x)
    x.add_(1.0)
    out.zero_()
    assert float(kept["input"].sum()) == 12.0 and float(kept["output"].sum()) == 24.0
    assert torch.equal(jax_kernel(keep)(torch.ones(3, 4)), torch.full((3, 4), 2.0))  # same input, same output


def test_vmap_maps_a_matrix_only_function_over_batch_dims():
    def one_matrix(a):
        if a.ndim != 2:
            raise ValueError("2-D only")
        return a @ a.T @ a

    x = torch.randn(2, 3, 4, 5)
    out = jax_kernel(one_matrix, vmap=True)(x)
    assert out.shape == x.shape
    torch.testing.assert_close(out[1, 2], x[1, 2] @ x[1, 2].T @ x[1, 2])
    with pytest.raises(ValueError, match="2-D only"):
        jax_kernel(one_matrix)(x)


def test_bad_input_names_the_argument():
    with pytest.raises(TypeError, match="^fn: expected a callable"):
        jax_kernel(None)
    with pytest.raises(TypeError, match="^vmap: expected a bool"):
        jax_kernel(jnp.tanh, vmap="yes")
    listy = jax_kernel(lambda a: [a])
    with pytest.raises(TypeError, match=r"^fn: returned list, expected a jax.Array of shape \(2, 3\)"):
        listy(torch.ones(2, 3))
    if not jax.config.jax_enable_x64:  # JAX would compute in float32: refused, not silently cast
        with pytest.raises(TypeError, match=r"^x: torch.float64 needs JAX's 64-bit mode"):
            jax_kernel(jnp.tanh)(torch.ones(2, 2, dtype=torch.float64))
    report = check_orthogonalizer(listy, shapes=[(6, 4)], statistical=False)
    assert report.status == "failed"
    assert all(f.result.check == "orthogonalizer_runs" and "fn: returned list" in f.result.note
               for f in report.failures)
