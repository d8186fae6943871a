"""Dion over the whole float32 range: a gradient whose entries exceed 1.8e19 (their squares overflow
float32) must step as a small one does. Dion's step is scale-invariant in exact arithmetic with
ε = 0 (P, Q and the update do not change when B is scaled; M scales with it), so the float32 step
at gradient 2^k·G and at G are two computed values of one exact update: the contract of two
forward errors of the same algorithm (``ortho_verify.tolerances.sharded_tolerance``'s derivation)."""

from __future__ import annotations

import pytest
import torch

import ortho_fast
from ortho_verify.tolerances import sharded_tolerance


def _update(scale_exponent: int, qr_method: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(20, 12, generator=gen)
    grads = [torch.randn(20, 12, generator=gen) for _ in range(3)]
    p = torch.nn.Parameter(w.clone())
    opt = ortho_fast.Dion([p], lr=0.01, rank_fraction=0.5, epsilon=0.0, weight_decay=0.0, qr_method=qr_method)
    for g in grads:
        p.grad = torch.ldexp(g, torch.tensor(scale_exponent))
        opt.step()
    return (p.detach() - w), opt.state[p]["Q"].clone()


@pytest.mark.parametrize("qr_method", ["householder", "cholesky_qr", "randomized_cholesky_qr"])
@pytest.mark.parametrize("exponent", [64, 100])  # entries ~1.8e19 and ~1.3e30
def test_huge_gradients_step_like_small_ones(qr_method, exponent):
    small_update, small_q = _update(0, qr_method)
    big_update, big_q = _update(exponent, qr_method)
    assert torch.isfinite(big_update).all() and big_update.norm() > 0  # no silent zero update
    for big, small in ((big_update, small_update), (big_q, small_q)):
        rel = ((big.double() - small.double()).norm() / small.double().norm()).item()
        assert rel <= sharded_tolerance("float32"), rel
