"""The default Muon step writes U of float32 parameters straight into its bfloat16 stack
(docs/performance.md, "The workspace"): bfloat16 has float32's exponent range, so gradients scaled
by any power of two up to bfloat16's largest finite value give the same update bit for bit (the
power-of-two scale on the stack is exact); above it (the top 0.2% of float32's range) the write
rounds to Inf as torch.optim.Muon's cast does."""

from __future__ import annotations

import math

import torch
from hypothesis import given, strategies as st

import ortho_fast

SHAPES = [(24, 16), (24, 16), (16, 40), (16, 40)]


def _inputs(seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen) for s in SHAPES], [torch.randn(s, generator=gen) for s in SHAPES]


def _update(scale_exponent: int, seed: int) -> list[torch.Tensor]:
    """The change of the parameters over two Muon steps with every gradient scaled by 2^e."""
    weights, grads = _inputs(seed)
    ps = [torch.nn.Parameter(w.clone()) for w in weights]
    opt = ortho_fast.Muon(ps, lr=0.02, weight_decay=0.0)
    for _ in range(2):
        for p, g in zip(ps, grads):
            p.grad = torch.ldexp(g, torch.tensor(scale_exponent))
        opt.step()
    return [p.detach() - w for p, w in zip(ps, weights)]


@given(st.integers(-100, 0), st.integers(0, 2**16))
def test_gradients_scaled_up_to_bfloat16s_largest_value_give_the_same_update(below, seed):
    """Property: scaling every gradient by 2^e, for e up to the largest with max|G|·2^e below
    bfloat16's largest finite value (U is a convex combination of gradients: no larger), changes
    no bit of the update."""
    largest = max(float(g.abs().max()) for g in _inputs(seed)[1])
    top = math.floor(math.log2(torch.finfo(torch.bfloat16).max / largest))
    reference = _update(0, seed)
    scaled = _update(top + below, seed)
    assert all(torch.isfinite(u).all() for u in scaled)
    assert all(torch.equal(a, b) for a, b in zip(reference, scaled))
