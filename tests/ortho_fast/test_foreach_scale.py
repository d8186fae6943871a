"""``graph_scalars.foreach_scale_`` (the decoupled weight decay of Muon, Dion2 and Dion) gives the
bits of ``mul_`` on every tensor, bfloat16 and float16 on the CPU included, where torch's
``_foreach_mul_`` rounds the factor to the tensor's dtype first, and float32 / float64 ones on the
CPU, whose float factor it passes as a 0-dim tensor (``graph_scalars.cpu_factor``)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

from ortho_fast.functional.graph_scalars import foreach_scale_

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


@given(st.lists(st.sampled_from(DTYPES), min_size=1, max_size=6),
       st.floats(0.5, 1.0, exclude_max=True) | st.floats(-1e300, 1e300) | st.floats(-1e-300, 1e-300),
       st.integers(-200, 200), st.integers(0, 2**16))
def test_foreach_scale_has_the_bits_of_mul(dtypes, factor, exponent, seed):
    """Property: any mix of dtypes, any decay factor in [0.5, 1) or any finite float, entries of
    any magnitude (overflow and underflow included): each tensor equals its own mul_."""
    gen = torch.Generator().manual_seed(seed)
    ts = [torch.ldexp(torch.randn(7, 5, generator=gen, dtype=torch.float64), torch.tensor(exponent)).to(dt)
          for dt in dtypes]
    want = [t.clone().mul_(factor) for t in ts]
    foreach_scale_(ts, factor)
    for a, b in zip(ts, want):  # (an overflowed entry times 0 is NaN in both)
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_negative_zero_factor_gives_negative_zeros(dtype):
    """0.0 then −0.0 (equal as numbers, not as factors): each gives the signs of zero of its own mul_."""
    ts = [torch.tensor([1.0, -2.0, 0.0], dtype=dtype)]
    for factor in (0.0, -0.0, 0.0):
        got, want = [t.clone() for t in ts], ts[0].clone().mul_(factor)
        foreach_scale_(got, factor)
        assert torch.equal(torch.signbit(got[0]), torch.signbit(want))


def test_torchs_cpu_foreach_mul_differs_for_float16():
    """The reason the function exists: torch's CPU ``_foreach_mul_`` by a float is not ``mul_``
    for float16 (if torch changes this, the special case can go)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1000, generator=gen).to(torch.float16)
    out = [x.clone()]
    torch._foreach_mul_(out, 1 - 0.0123 * 0.1)
    assert not torch.equal(out[0], x.clone().mul_(1 - 0.0123 * 0.1))


@given(st.sampled_from([torch.bfloat16, torch.float16]), st.floats(0.5, 0.99), st.integers(0, 2**16))
def test_classic_momentum_of_low_precision_buffers_has_the_bits_of_one_tensor(dtype, mu, seed):
    """Property: Muon's classic momentum over a list of bfloat16 / float16 buffers (the
    ``_foreach`` form) equals ``muon_momentum`` on each pair bit for bit, as its docstring says."""
    from ortho_fast.functional.muon import muon_momentum, muon_momentum_foreach

    gen = torch.Generator().manual_seed(seed)
    grads = [torch.randn(6, 4, generator=gen).to(dtype) for _ in range(3)]
    bufs = [torch.randn(6, 4, generator=gen).to(dtype) for _ in range(3)]
    singles = [b.clone() for b in bufs]
    outs = muon_momentum_foreach(grads, bufs, mu=mu, nesterov=True, style="classic")
    for g, b, out, buf in zip(grads, singles, outs, bufs):
        want = muon_momentum(g, b, mu=mu, nesterov=True, style="classic")
        assert torch.equal(buf, b) and torch.equal(out, want)
