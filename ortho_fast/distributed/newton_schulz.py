"""Newton–Schulz on a matrix sharded over one mesh axis (tensor parallelism, ``tp_mode="distributed"``)."""

from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist

from ..coefficients import resolve_coefficients
from ..functional.newton_schulz import float32_matmul_precision, resolve_compute_dtype
from . import comm
from .layout import MeshAxis

__all__ = ["newton_schulz_sharded"]


def newton_schulz_sharded(block: torch.Tensor, axis: MeshAxis | None, *, sharded_dim: int, coefficients="jordan",
                          steps: int | None = None, safety: float = 1.0, eps: float = 1e-7, eps_mode: str = "add",
                          dtype=torch.bfloat16, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Newton–Schulz on a matrix X (m, n) sharded over ``axis`` along ``sharded_dim``; returns this
    rank's block of the result.

    Shapes: ``block`` (r, n) = X[R, :] for ``sharded_dim=0`` (or (m, c) = X[:, C] for 1), the
    blocks of the ranks of ``axis`` partitioning that dim (empty blocks allowed) -> the same
    shape, in ``out_dtype`` (default the block's dtype). Options as ``ortho_fast.newton_schulz``.
    Algorithm: with Y = Xᵀ for ``sharded_dim=0`` (X otherwise), the sharded dim is the one the
    Gram matrix contracts: A = Y Yᵀ = Σ_ranks Y_k Y_kᵀ is all-reduced (d × d, d the unsharded
    dim) and each rank updates its columns Y_k ← a·Y_k + (b·A + c·A²)·Y_k. Since
    p(XXᵀ)X = X p(XᵀX), this is the one-process iteration in exact arithmetic whichever side
    is sharded; the one-process code works on the wide side, so sharding the long dim costs the
    same d = min(m, n) and sharding the short one a Gram of max(m, n)² (the case Megatron warns
    "wastes compute"). The normalization X / (s·‖X‖_F + eps) (or max(·) for "clamp") takes the
    power-of-two scale β from the all-reduced max |X| (as ``newton_schulz``, to keep ‖X‖_F in
    range) and ‖X‖_F² from an all-reduced sum. bfloat16 / float16: the Gram matrix and ‖X‖_F²
    are summed in float32 and rounded once, as the one-process matmul accumulates.
    Communication: 2 + steps·d² elements (all-reduces over ``axis``, tags "ns_scale", "ns_norm",
    "gram"); every rank of ``axis`` must call it with its block, empty or not.
    Source: NVIDIA Emerging-Optimizers ``newton_schulz_tp(mode="distributed")`` /
    ``distributed_normalize_p2`` (which transposes so that the partition dim is contracted);
    Megatron-LM ``TensorParallelMuon``.
    Raises: ValueError for ``sharded_dim`` not 0 / 1 or a block that is not 2-D; the errors of
    ``resolve_coefficients`` / ``resolve_compute_dtype`` for bad options.
    """
    if sharded_dim not in (0, 1) or block.ndim != 2:
        raise ValueError(f"sharded_dim: expected 0 or 1 and a 2-D block, got {sharded_dim!r} and shape "
                         f"{tuple(block.shape)}")
    table = resolve_coefficients(coefficients, steps)
    compute, precision = resolve_compute_dtype(dtype, block.dtype)
    acc = torch.float32 if compute in (torch.bfloat16, torch.float16) else compute
    y = block.mT if sharded_dim == 0 else block
    amax = y.abs().amax() if y.numel() else y.new_zeros(())
    comm.all_reduce(amax, axis, op=dist.ReduceOp.MAX, tag="ns_scale")
    # β = 2^e with max|X| in [2^(e−1), 2^e), capped at the dtype's largest power of two (newton_schulz's scale)
    exponent = torch.frexp(amax).exponent.clamp(max=math.floor(math.log2(torch.finfo(block.dtype).max)))
    beta = torch.ldexp(torch.ones_like(amax), exponent)
    x = (y / beta).to(compute)
    sq = x.to(acc).square().sum()
    comm.all_reduce(sq, axis, tag="ns_norm")
    norm = sq.sqrt().to(compute) * safety if safety != 1.0 else sq.sqrt().to(compute)
    wide = torch.promote_types(compute, beta.dtype)
    eps_scaled = (torch.full_like(beta, eps, dtype=compute).to(wide) / beta.to(wide)).to(compute)
    denom = norm + eps_scaled if eps_mode == "add" else torch.maximum(norm, eps_scaled)
    if eps == 0.0:
        denom = torch.where(denom == 0, torch.ones_like(denom), denom)
    x = x / denom
    with float32_matmul_precision(precision) if precision else contextlib.nullcontext():
        for a, b, c in table:
            gram = x.to(acc) @ x.to(acc).mT
            comm.all_reduce(gram, axis, tag="gram")
            gram = gram.to(compute)
            x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    out = x.mT if sharded_dim == 0 else x
    return out.to(block.dtype if out_dtype is None else out_dtype)
