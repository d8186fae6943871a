"""User-style Dion implementations written independently of ``ortho_fast``: the free-sign-QR
Dion (correct; a false alarm before the checks compared up to column signs), a Dion that
never transposes (Q of shape (n, r) for wide matrices), and a Dion that orthonormalizes in
float32 for float64 parameters. Each is correct code written differently from ours: it must
pass ``ortho_verify.check_optimizer`` with the conventions it declares
(``FREE_SIGN_DION_CONVENTIONS`` and friends; tests/verify/test_gauge.py).
"""

from __future__ import annotations

import math
from typing import Iterable

import torch

from ..conventions import DionConventions

__all__ = ["FreeSignDion", "NEVER_TRANSPOSE_CONVENTIONS", "FREE_SIGN_DION_CONVENTIONS"]


class FreeSignDion(torch.optim.Optimizer):
    """A compact Dion (Ahn et al., arXiv 2504.05295, Algorithm 1) whose QR leaves the column
    signs of P free, as ``torch.linalg.qr`` does (Householder, LAPACK geqrf: diag R of either
    sign), with every other column flipped on top so that the gauge is exercised at every step.

    B = M + G; Y = B Q; P = qr(Y).Q·D; R = BᵀP; M ← B − (1 − μ)PRᵀ; Q ← R_j/(‖R_j‖ + ε);
    W ← W(1 − lr·wd) − lr·√(m/n)·P Qᵀ, in the working orientation (the transpose when m < n, or
    never with ``transpose=False``: Q then has shape (n, r) for every matrix).
    ``orthonormalize_dtype``: the dtype of Y, the QR and P (e.g. float32 for float64 parameters;
    default the parameter's, float32 for bfloat16 / float16 as microsoft/dion). ``roll_q``
    plants a bug: Q is stored with its columns rolled by one (not a gauge: caught).
    Args: lr, mu, weight_decay, rank_fraction as microsoft/dion; ``seed`` for Q0.
    State: ``momentum`` (m, n) and ``Q`` ((min(m, n), r), or (n, r) with ``transpose=False``).
    Raises: ValueError for non-2-D params.
    """

    def __init__(self, params: Iterable, lr: float = 0.01, mu: float = 0.95, weight_decay: float = 0.01, *,
                 rank_fraction: float = 1.0, seed: int = 0, transpose: bool = True,
                 orthonormalize_dtype: torch.dtype | None = None, epsilon: float = 1e-8,
                 roll_q: bool = False) -> None:
        super().__init__(params, dict(lr=lr, mu=mu, weight_decay=weight_decay, rank_fraction=rank_fraction))
        if any(p.ndim != 2 for group in self.param_groups for p in group["params"]):
            raise ValueError("params: FreeSignDion expects 2-D (m, n) parameters")
        self.seed, self.transpose, self.orth_dtype, self.epsilon = seed, transpose, orthonormalize_dtype, epsilon
        self.roll_q = roll_q

    @torch.no_grad()
    def step(self, closure=None):
        """One step for every parameter with a gradient."""
        for index, (group, p) in enumerate((g, p) for g in self.param_groups for p in g["params"]):
            if p.grad is None:
                continue
            m, n = p.shape
            flip = self.transpose and m < n
            state = self.state[p]
            if "Q" not in state:
                cols = n if not flip else m
                r = max(1, min(m, n, int(group["rank_fraction"] * min(m, n))))
                gen = torch.Generator().manual_seed(1000 * self.seed + index)
                state["momentum"] = torch.zeros_like(p)
                state["Q"] = torch.randn(cols, r, generator=gen, dtype=torch.float64).to(p.dtype)
            b = state["momentum"] + p.grad
            bw = b.mT if flip else b
            odt = self.orth_dtype or (torch.float32 if p.dtype in (torch.bfloat16, torch.float16) else p.dtype)
            p_mat, _ = torch.linalg.qr((bw.to(odt) @ state["Q"].to(odt)))
            signs = torch.tensor([(-1.0) ** j for j in range(p_mat.shape[1])], dtype=odt)
            p_mat = (p_mat * signs).to(p.dtype)
            r_mat = bw.mT @ p_mat
            state["momentum"].copy_(b - (1 - group["mu"]) * ((p_mat @ r_mat.mT).mT if flip else p_mat @ r_mat.mT))
            q_new = r_mat / (torch.linalg.vector_norm(r_mat, dim=0, keepdim=True) + self.epsilon)
            state["Q"] = q_new.roll(1, dims=1) if self.roll_q else q_new  # roll_q: planted bug
            upd = p_mat @ q_new.mT
            p.mul_(1 - group["lr"] * group["weight_decay"]).add_(upd.mT if flip else upd,
                                                                 alpha=-group["lr"] * math.sqrt(m / n))


#: What ``FreeSignDion`` computes, in ``check_optimizer``'s terms: microsoft/dion's state keys and
#: μ keyword (the column signs need no declaration: the comparison is gauge-invariant).
FREE_SIGN_DION_CONVENTIONS = DionConventions()
#: ``FreeSignDion(transpose=False)``: Q of shape (n, r) for wide matrices too.
NEVER_TRANSPOSE_CONVENTIONS = DionConventions(orientation="never_transpose")
