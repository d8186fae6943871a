"""Dion for one process (Ahn et al., arXiv 2504.05295, Algorithm 1)."""

from __future__ import annotations

import math
from typing import Iterable, NamedTuple

import torch
from torch.optim import Optimizer

from ._validate import check_finite, check_hyper

QR_METHODS = ("householder",)


def dion_rank(m: int, n: int, rank_fraction: float = 1.0, rank_multiple_of: int = 1) -> int:
    """r = min(ceil_to_multiple(rank_multiple_of, rank_fraction·min(m, n)), m, n), at least 1.

    Source: microsoft/dion ``Dion(rank_fraction, rank_multiple_of)``.
    """
    k = int(rank_multiple_of)
    return max(1, min(k * math.ceil(rank_fraction * min(m, n) / k), m, n))


def orthonormalize(y: torch.Tensor) -> torch.Tensor:
    """Thin Householder QR of y (m, r), m >= r, with signs fixed so that diag(R) > 0.

    Returns P (m, r) in y's dtype with PᵀP = I. sign(0) := +1 (rank-deficient y).
    bfloat16 / float16 inputs are factored in float32 (as microsoft/dion ``dion_simple.py``).
    """
    low_precision = y.dtype in (torch.bfloat16, torch.float16)
    q, r = torch.linalg.qr(y.float() if low_precision else y, mode="reduced")
    signs = torch.where(torch.diagonal(r) < 0, -1.0, 1.0).to(q.dtype)
    return (q * signs).to(y.dtype)


class DionUpdate(NamedTuple):
    """Diagnostics of one ``dion_update``: P (m', r) and R (n', r) in the working orientation."""

    P: torch.Tensor
    R: torch.Tensor


@torch.no_grad()
def dion_update(
    x: torch.Tensor,
    g: torch.Tensor,
    m: torch.Tensor,
    q: torch.Tensor,
    *,
    lr: float,
    mu: float,
    weight_decay: float,
    epsilon: float,
    power_iters: int = 1,
    error_feedback: bool = True,
) -> DionUpdate:
    """One Dion step in place on weight x (m, n), momentum m (m, n) and right factor q.

    B = M + G (transposed when m < n, by the global shape only); P = orth(BQ);
    R = BᵀP; M ← B − (1−μ)PRᵀ (``error_feedback=False``: M ← μPRᵀ); Q ← R / (‖R_j‖ + ε);
    X ← (1 − lr·wd)X − lr·√(m/n)·PQᵀ. B = 0: M ← B, Q kept, only weight decay applies.
    Shapes: x, g, m (m, n); q (min(m, n), r). Dtypes: all floating, computed in m's dtype.
    Source: Ahn et al., arXiv 2504.05295, Algorithm 1; microsoft/dion ``dion_simple.py``.
    Contract: equals ``ortho_ref.dion_step`` within ``verify.tolerances.dion_tolerances``.
    """
    rows, cols = x.shape
    transposed = rows < cols
    m.add_(g.to(m.dtype))  # m now holds B
    b = m.mT if transposed else m
    x.mul_(1 - lr * weight_decay)
    r_dim = q.shape[1]
    if not bool(b.any()):
        return DionUpdate(b.new_zeros(b.shape[0], r_dim), b.new_zeros(b.shape[1], r_dim))
    qw = q.to(m.dtype)
    for it in range(power_iters):
        p = orthonormalize(b @ qw)
        r = b.mT @ p
        if it + 1 < power_iters:
            qw = r / (torch.linalg.vector_norm(r, dim=0, keepdim=True) + epsilon)
    if error_feedback:
        b.sub_((1 - mu) * (p @ r.mT))
    else:
        b.copy_(mu * (p @ r.mT))
    q.copy_(r / (torch.linalg.vector_norm(r, dim=0, keepdim=True) + epsilon))
    delta = p @ q.to(p.dtype).mT
    x.add_((delta.mT if transposed else delta).to(x.dtype), alpha=-lr * math.sqrt(rows / cols))
    return DionUpdate(p, r)


def _seed_for(seed: int, index: int) -> int:
    """Deterministic 63-bit seed for parameter ``index`` (splitmix64-style mixing)."""
    z = (seed * 0x9E3779B97F4A7C15 + index + 1) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFF


def initial_q(shape: tuple[int, int], seed: int, index: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Q0 ~ N(0, 1) of the global shape, drawn on the CPU from a generator seeded by
    (seed, parameter index) — never the global RNG, identical on every device."""
    gen = torch.Generator(device="cpu").manual_seed(_seed_for(seed, index))
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)


class Dion(Optimizer):
    """Dion (DIstributed OrthoNormalization) for 2-D parameters, one process.

    Args follow microsoft/dion: lr 0.01, mu 0.95, weight_decay 0.01, rank_fraction 1.0,
    rank_multiple_of 1, epsilon 1e-8, power_iters 1; ``error_feedback`` (default True);
    ``seed`` makes Q0 deterministic per parameter (index in the order of ``params``).
    State per parameter: ``momentum`` (m, n) and ``Q`` (min(m, n), r) — inject a known Q
    through ``load_state_dict`` (its shape is checked at the next step).
    Source: Ahn et al., arXiv 2504.05295, Algorithm 1; microsoft/dion.
    Raises: ValueError at construction for non-2-D parameters or bad hyperparameters; at
    ``step`` for non-finite or mis-shaped gradients or a Q of the wrong shape, before any
    parameter or state changes.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 0.01,
        mu: float = 0.95,
        weight_decay: float = 0.01,
        *,
        rank_fraction: float = 1.0,
        rank_multiple_of: int = 1,
        epsilon: float = 1e-8,
        power_iters: int = 1,
        error_feedback: bool = True,
        qr_method: str = "householder",
        seed: int = 0,
    ) -> None:
        check_hyper(lr, "lr")
        check_hyper(mu, "mu", high=1.0)
        check_hyper(weight_decay, "weight_decay")
        check_hyper(rank_fraction, "rank_fraction", high=1.0, low_open=True)
        check_hyper(epsilon, "epsilon")
        for name, val in (("rank_multiple_of", rank_multiple_of), ("power_iters", power_iters)):
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {val!r}")
        if qr_method not in QR_METHODS:
            raise ValueError(f"qr_method: expected one of {QR_METHODS}, got {qr_method!r}")
        defaults = dict(
            lr=lr, mu=mu, weight_decay=weight_decay, rank_fraction=rank_fraction,
            rank_multiple_of=rank_multiple_of, epsilon=epsilon, power_iters=power_iters,
            error_feedback=error_feedback, qr_method=qr_method,
        )
        super().__init__(params, defaults)
        self.seed = int(seed)
        for group in self.param_groups:
            for p in group["params"]:
                if not p.is_floating_point():
                    raise TypeError(f"params: Dion expects floating-point parameters, got dtype {p.dtype}")
                if p.ndim != 2:
                    raise ValueError(
                        f"params: Dion expects 2-D (m, n) parameters; got shape {tuple(p.shape)}. "
                        "Give vectors, scalars and embeddings to AdamW/Lion."
                    )

    def _rank(self, p: torch.Tensor, group: dict) -> int:
        return dion_rank(p.shape[0], p.shape[1], group["rank_fraction"], group["rank_multiple_of"])

    def _check(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if g.is_sparse or torch.is_complex(g) or g.shape != p.shape:
                    raise ValueError(f"grad: expected a dense real tensor of shape {tuple(p.shape)}, got {tuple(g.shape)}")
                check_finite(g, f"grad of parameter with shape {tuple(p.shape)}")
                state = self.state.get(p, {})
                want = (min(p.shape), self._rank(p, group))
                if "Q" in state and tuple(state["Q"].shape) != want:
                    raise ValueError(f"Q: expected shape {want} for parameter of shape {tuple(p.shape)}, got {tuple(state['Q'].shape)}")
                if "momentum" in state and state["momentum"].shape != p.shape:
                    raise ValueError(f"momentum: expected shape {tuple(p.shape)}, got {tuple(state['momentum'].shape)}")

    def _init_state(self, p: torch.Tensor, group: dict, index: int) -> dict:
        state = self.state[p]
        if "momentum" not in state:
            state["momentum"] = torch.zeros_like(p)
        if "Q" not in state:
            state["Q"] = initial_q((min(p.shape), self._rank(p, group)), self.seed, index, p.dtype, p.device)
        return state

    @torch.no_grad()
    def step(self, closure=None):
        """One Dion step for every parameter with a gradient. Returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check()  # all checks before the first change
        index = 0
        for group in self.param_groups:
            for p in group["params"]:
                index += 1
                if p.grad is None:
                    continue
                state = self._init_state(p, group, index - 1)
                dion_update(
                    p, p.grad, state["momentum"], state["Q"], lr=group["lr"], mu=group["mu"],
                    weight_decay=group["weight_decay"], epsilon=group["epsilon"],
                    power_iters=group["power_iters"], error_feedback=group["error_feedback"],
                )
        return loss
