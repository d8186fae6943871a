"""Batched Newton–Schulz orthogonalization on (..., m, n) tensors."""

from __future__ import annotations

import torch

from ._validate import check_hyper, check_matrix_tensor
from .coefficients import CoefficientsLike, resolve_coefficients

COMPUTE_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
EPS_MODES = ("add", "clamp")


def _quintic_step(x: torch.Tensor, a: float, b: float, c: float) -> torch.Tensor:
    """X <- aX + (bA + cA²)X with A = XXᵀ, on (m, n) or (batch, m, n) with m <= n.

    Written with addmm / baddbmm as in torch.optim.Muon, so that 2-D bf16 inputs give the
    same bits as torch's implementation.
    """
    if x.ndim == 2:
        gram = x @ x.T
        update = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        return torch.addmm(x, update, x, beta=a)
    gram = torch.bmm(x, x.mT)
    if c == 0.0:
        # torch's CPU baddbmm in bf16/fp16 returns ``gram`` unscaled when alpha == 0 for
        # matrices of 13 x 13 and up (beta ignored; measured on torch 2.13): scale directly.
        update = gram * b
    else:
        update = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
    return torch.baddbmm(x, update, x, beta=a)


def newton_schulz(
    g: torch.Tensor,
    coefficients: CoefficientsLike = "jordan",
    *,
    steps: int | None = None,
    safety: float = 1.0,
    eps: float = 1e-7,
    dtype: torch.dtype = torch.bfloat16,
    eps_mode: str = "add",
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Odd quintic Newton–Schulz iteration approximating the polar factor of each matrix.

    X₀ = G / (safety·‖G‖_F + eps) (``eps_mode="add"``; ``"clamp"`` divides by
    max(safety·‖G‖_F, eps) as torch.optim.Muon does), then per step (a, b, c):
    X <- aX + (bA + cA²)X with A = XXᵀ, computed on the wide side (tall inputs are
    transposed and transposed back). In exact arithmetic the result is U f(Σ̂) Vᵀ
    (``ortho_ref.ns_map``), not the polar factor U Vᵀ.

    Shapes: g (..., m, n) -> (..., m, n); leading dims are independent matrices, each with
    its own Frobenius norm. Dtypes: computed in ``dtype`` (bfloat16, float16, float32 or
    float64), returned in ``out_dtype`` (default: g.dtype). Device: that of ``g``.
    Args: ``coefficients`` a name in ``ortho_fast.COEFFICIENTS``, a schedule, or a (T, 3)
    table; ``steps`` overrides the number of steps (last row repeated beyond the table).
    Source: Keller Jordan's Muon (2024) ``zeropower_via_newtonschulz5``; torch.optim.Muon
    ``_zeropower_via_newtonschulz``; Amsel et al. 2025 (arXiv 2505.16932) for per-step rows.
    Raises: TypeError for a non-tensor or non-float ``g`` or an unsupported ``dtype``;
    ValueError for fewer than 2 dims, an empty matrix, a bad table, steps < 1, safety <= 0,
    eps < 0, or an unknown ``eps_mode``; KeyError for an unknown schedule name. NaN / Inf in
    ``g`` propagate (the optimizers check gradients before calling this).
    Contract: ‖result − ns_map(g)‖_F within ``verify.tolerances.ns_tolerance``.
    """
    check_matrix_tensor(g, "g")
    if dtype not in COMPUTE_DTYPES:
        raise TypeError(f"dtype: expected one of {COMPUTE_DTYPES}, got {dtype}")
    if eps_mode not in EPS_MODES:
        raise ValueError(f"eps_mode: expected one of {EPS_MODES}, got {eps_mode!r}")
    safety = check_hyper(safety, "safety", low_open=True)
    eps = check_hyper(eps, "eps")
    table = resolve_coefficients(coefficients, steps)

    m, n = g.shape[-2], g.shape[-1]
    batch_shape = g.shape[:-2]
    x = g.to(dtype)
    if x.ndim > 2:
        x = x.reshape(-1, m, n)
    transpose = m > n
    if transpose:
        x = x.mT
    if x.ndim == 2:
        norm = x.norm()
    else:
        norm = torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True)
    if safety != 1.0:
        norm = norm * safety
    denom = norm + eps if eps_mode == "add" else norm.clamp(min=eps)
    if eps == 0.0:  # a zero matrix maps to zero (as ns_map), not to 0/0
        denom = torch.where(denom == 0, torch.ones_like(denom), denom)
    x = x / denom
    for a, b, c in table:
        x = _quintic_step(x, a, b, c)
    if transpose:
        x = x.mT
    return x.reshape(*batch_shape, m, n).to(g.dtype if out_dtype is None else out_dtype)
