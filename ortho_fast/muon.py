"""Muon for one process: momentum, Newton–Schulz orthogonalization, scaled update."""

from __future__ import annotations

import math
from typing import Iterable

import torch
from torch.optim import Optimizer

from ._validate import check_finite, check_hyper
from .coefficients import COEFFICIENTS, CoefficientsLike, resolve_coefficients
from .newton_schulz import COMPUTE_DTYPES, EPS_MODES, newton_schulz

MOMENTUM_STYLES = ("ema", "classic")
ADJUST_LR_MODES = ("original", "match_rms_adamw", "spectral_norm", None)


def adjusted_lr_scale(adjust_lr: str | None, m: int, n: int) -> float:
    """lr multiplier for an (m, n) = (fan_out, fan_in) weight.

    "original" √max(1, m/n) (Keller Jordan, torch.optim.Muon); "match_rms_adamw"
    0.2·√max(m, n) (Moonlight, arXiv 2502.16982); "spectral_norm" √(m/n) (microsoft/dion);
    None: 1. Raises: ValueError for an unknown mode.
    """
    if adjust_lr == "original":
        return math.sqrt(max(1.0, m / n))
    if adjust_lr == "match_rms_adamw":
        return 0.2 * math.sqrt(max(m, n))
    if adjust_lr == "spectral_norm":
        return math.sqrt(m / n)
    if adjust_lr is None:
        return 1.0
    raise ValueError(f"adjust_lr: expected one of {ADJUST_LR_MODES}, got {adjust_lr!r}")


def muon_momentum(grad: torch.Tensor, buf: torch.Tensor, *, mu: float, nesterov: bool, style: str) -> torch.Tensor:
    """Update the momentum buffer in place and return the matrix to orthogonalize.

    "ema": M ← M + (1−μ)(G − M) (``lerp``), U = G + μ(M − G) if nesterov else M
    (torch.optim.Muon, Keller Jordan, nanochat). "classic": M ← μM + G, U = G + μM if
    nesterov else M (microsoft/dion, Moonlight).
    Shapes: grad, buf (..., m, n), same dtype -> (..., m, n).
    """
    if style == "ema":
        buf.lerp_(grad, 1 - mu)
        return grad.lerp(buf, mu) if nesterov else buf
    buf.mul_(mu).add_(grad)
    return grad.add(buf, alpha=mu) if nesterov else buf


class Muon(Optimizer):
    """Muon (MomentUm Orthogonalized by Newton–Schulz) for 2-D parameters, one process.

    Per parameter W (m, n) with gradient G: momentum (``momentum_style``, ``nesterov``),
    O = newton_schulz(U), W ← W·(1 − lr·weight_decay) − lr·adjusted_lr_scale(m, n)·O.

    Defaults follow ``torch.optim.Muon`` (lr 1e-3, weight_decay 0.1, momentum 0.95, nesterov,
    Keller Jordan's coefficients, 5 steps, eps 1e-7, bf16 Newton–Schulz, "original" lr
    adjustment); with ``eps_mode="clamp"`` the update is bit-identical to torch's on CPU.
    microsoft/dion's Muon: ``momentum_style="classic", nesterov=False,
    coefficients="polar_express", adjust_lr="spectral_norm"`` (safety 1.02 and eps 1e-6 come
    from the schedule).

    Args: ``coefficients`` registry name or (T, 3) table; ``ns_steps`` steps (default from
    the schedule); ``safety``/``eps`` the normalization (default from the named schedule,
    else 1.0 / 1e-7); ``dtype`` the Newton–Schulz compute dtype.
    State: ``momentum_buffer`` (same shape and dtype as the parameter), as torch.optim.Muon.
    Source: Jordan et al. 2024 (Muon blog); Liu et al. arXiv 2502.16982; torch.optim.Muon.
    Raises: ValueError at construction for parameters that are not 2-D, bad hyperparameters
    or unknown options; at ``step`` for sparse, complex, mismatched or non-finite gradients,
    before any parameter or state changes.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        *,
        momentum_style: str = "ema",
        coefficients: CoefficientsLike = "jordan",
        ns_steps: int | None = None,
        safety: float | None = None,
        eps: float | None = None,
        eps_mode: str = "add",
        adjust_lr: str | None = "original",
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        check_hyper(lr, "lr")
        check_hyper(weight_decay, "weight_decay")
        check_hyper(momentum, "momentum", high=1.0)
        if momentum_style not in MOMENTUM_STYLES:
            raise ValueError(f"momentum_style: expected one of {MOMENTUM_STYLES}, got {momentum_style!r}")
        if adjust_lr not in ADJUST_LR_MODES:
            raise ValueError(f"adjust_lr: expected one of {ADJUST_LR_MODES}, got {adjust_lr!r}")
        if eps_mode not in EPS_MODES:
            raise ValueError(f"eps_mode: expected one of {EPS_MODES}, got {eps_mode!r}")
        if dtype not in COMPUTE_DTYPES:
            raise TypeError(f"dtype: expected one of {COMPUTE_DTYPES}, got {dtype}")
        named = COEFFICIENTS.get(coefficients) if isinstance(coefficients, str) else None
        safety = (named.safety if named else 1.0) if safety is None else safety
        eps = (named.eps if named else 1e-7) if eps is None else eps
        check_hyper(safety, "safety", low_open=True)
        check_hyper(eps, "eps")
        resolve_coefficients(coefficients, ns_steps)  # validates name / table / steps now
        defaults = dict(
            lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
            momentum_style=momentum_style, coefficients=coefficients, ns_steps=ns_steps,
            safety=safety, eps=eps, eps_mode=eps_mode, adjust_lr=adjust_lr, dtype=dtype,
        )
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if not p.is_floating_point():
                    raise TypeError(f"params: Muon expects floating-point parameters, got dtype {p.dtype}")
                if p.ndim != 2:
                    raise ValueError(
                        f"params: Muon expects 2-D (m, n) parameters; got shape {tuple(p.shape)}. "
                        "Give vectors, scalars and embeddings to AdamW/Lion."
                    )

    def _check_grads(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if g.is_sparse or torch.is_complex(g):
                    raise ValueError("grad: Muon expects dense real gradients")
                if g.shape != p.shape:
                    raise ValueError(f"grad: expected shape {tuple(p.shape)}, got {tuple(g.shape)}")
                check_finite(g, f"grad of parameter with shape {tuple(p.shape)}")
                buf = self.state.get(p, {}).get("momentum_buffer")
                if buf is not None and buf.shape != p.shape:
                    raise ValueError(f"momentum_buffer: expected shape {tuple(p.shape)}, got {tuple(buf.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        """One Muon step for every parameter with a gradient. Returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_grads()  # all checks before the first change
        for group in self.param_groups:
            lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                u = muon_momentum(p.grad, state["momentum_buffer"], mu=mu, nesterov=group["nesterov"],
                                  style=group["momentum_style"])
                o = newton_schulz(
                    u, group["coefficients"], steps=group["ns_steps"], safety=group["safety"],
                    eps=group["eps"], dtype=group["dtype"], eps_mode=group["eps_mode"], out_dtype=p.dtype,
                )
                scale = adjusted_lr_scale(group["adjust_lr"], p.shape[-2], p.shape[-1])
                p.mul_(1 - lr * wd)
                p.add_(o, alpha=-lr * scale)
        return loss
