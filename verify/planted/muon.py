"""Muon optimizers written by us, correct and with optimizer-level planted errors, for the power
table and the false alarms of ``check_optimizer``'s statistical row and for its kinds of failure
(docs/verification.md, "Statistical rows of check_optimizer", "Kinds of failure"):

- ``TorchStyleMuon``: torch.optim.Muon's algorithm (EMA momentum, Nesterov by ``lerp``, bf16
  Newton–Schulz with X/max(‖X‖_F, eps), lr·√max(1, m/n), decoupled weight decay), written here,
  with switches that plant one error each (``PLANTS``);
- ``JordanStyleMuon``: Keller Jordan's single-device Muon as published (X/(‖X‖_F + eps), the same
  momentum), written here; ``grad_in_place=True`` mixes with ``p.grad.lerp_`` (his form: a right
  update, an overwritten gradient);
- ``inplace_kernel``: a Newton–Schulz kernel that divides a bfloat16 input in place (torch's
  private kernel's form);
- ``RejectsBfloat16Muon``: raises TypeError on bfloat16 parameters (NVIDIA Emerging-Optimizers'
  Muon's behaviour).

Sources: torch.optim.Muon (torch 2.9+); Keller Jordan, github.com/KellerJordan/Muon; microsoft/dion
``normuon.py`` (the per-row rescale). None of their code is copied: each is rewritten from the
published algorithm.
"""

from __future__ import annotations

import functools
import math

import torch

import ortho_ref

from ..conventions import MuonConventions

__all__ = ["JORDAN_CONVENTIONS", "JordanStyleMuon", "PLANTS", "POLAR_CONVENTIONS", "RejectsBfloat16Muon",
           "TORCH_STYLE_CONVENTIONS", "TorchStyleMuon", "inplace_kernel"]


def _scale(mode: str, m: int, n: int) -> float:
    if mode == "original":
        return math.sqrt(max(1.0, m / n))
    if mode == "match_rms_adamw":
        return 0.2 * math.sqrt(max(m, n))
    if mode == "spectral_norm":
        return math.sqrt(m / n)
    raise ValueError(f"adjust_lr: unknown {mode!r}")


def _newton_schulz(g: torch.Tensor, table, *, safety: float, eps: float, eps_mode: str, dtype: torch.dtype,
                   in_place: bool = False) -> torch.Tensor:
    """X₀ = G/(s‖G‖_F + eps) ("add") or G/max(s‖G‖_F, eps) ("clamp") on the wide side, then
    X ← aX + (bA + cA·A)X per row (a, b, c) of ``table``, in ``dtype``. ``in_place``: the division
    is done with ``div_`` on ``g.to(dtype)``, which is ``g`` itself when ``g`` already has ``dtype``."""
    x = g.to(dtype)
    norm = torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True) * safety  # per matrix of a batch
    denom = norm + eps if eps_mode == "add" else norm.clamp(min=eps)
    x = x.div_(denom) if in_place else x / denom
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    for a, b, c in table:
        gram = x @ x.mT
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.mT if tall else x


def inplace_kernel(g: torch.Tensor) -> torch.Tensor:
    """A jordan Newton–Schulz kernel (bfloat16, eps clamped) whose normalization divides
    ``g.bfloat16()`` in place: the caller's bfloat16 input is modified (a side effect), the
    output is right. Shapes: (..., m, n) -> (..., m, n) bfloat16 (each matrix normalized alone)."""
    return _newton_schulz(g, ortho_ref.schedule("jordan"), safety=1.0, eps=1e-7, eps_mode="clamp",
                          dtype=torch.bfloat16, in_place=True)


#: The planted optimizer-level errors of ``TorchStyleMuon`` (keyword -> value) with what each
#: plants, checked against ``TORCH_STYLE_CONVENTIONS`` (``POLAR_CONVENTIONS`` for "safety").
PLANTS = {
    "NorMuon as Muon": ({"normuon": True}, "a per-row rescale after Newton–Schulz (NorMuon's, β₂ = 0.95, "
                                           "norm restored) where plain Muon is declared"),
    "safety 1.01 for 1.02": ({"coefficients": "polar_express", "safety": 1.01, "eps": 1e-6},
                             "polar_express with safety 1.01 where its 1.02 is declared"),
    "eps added, clamp declared": ({"eps_mode": "add"}, "X/(‖X‖ + 1e-7) where X/max(‖X‖, 1e-7) is declared"),
    "lr scale match_rms_adamw for original": ({"adjust_lr": "match_rms_adamw"},
                                              "0.2·√max(m, n) where √max(1, m/n) is declared (2% on 40×24)"),
    "Nesterov as g + mu*buf": ({"nesterov_form": "add"}, "U = G + μ·M where U = lerp(G, M, μ) is declared"),
    "coefficient b off by 1%": ({"coefficients": ((3.4445, -4.7750 * 1.01, 2.0315),) * 5},
                                "b = −4.82 instead of −4.775 in every step"),
    "weight decay applied twice": ({"decay_plant": "twice"}, "W(1 − lr·wd)² where W(1 − lr·wd) is declared"),
    "weight decay with the adjusted lr": ({"decay_plant": "adjusted_lr"},
                                          "W(1 − lr·s·wd), s = √max(1, m/n), where W(1 − lr·wd) is declared"),
    "weight decay coupled into the gradient": ({"decay_plant": "l2"},
                                               "G + wd·W before the momentum where W(1 − lr·wd) is declared"),
}


class TorchStyleMuon(torch.optim.Optimizer):
    """torch.optim.Muon's algorithm, written by us: M ← lerp(M, G, 1 − μ), U = lerp(G, M, μ)
    (Nesterov), O = NS(U) in ``ns_dtype`` (``coefficients`` a registry name or (T, 3) rows, with
    ``safety``, ``eps``, ``eps_mode``), W ← W(1 − lr·wd) − lr·scale(adjust_lr)·O.

    Planted-error switches (``PLANTS``): ``normuon`` (NorMuon's per-row rescale of O, norm restored),
    ``nesterov_form="add"`` (U = G + μM), ``grad_in_place`` (the mix written into p.grad with
    ``lerp_``), ``decay_plant`` ("twice": W(1 − lr·wd)²; "adjusted_lr": W(1 − lr·s·wd); "l2":
    G + wd·W before the momentum, no decoupled decay). State: ``momentum_buffer`` (and
    ``variance_neuron`` with ``normuon``).
    Raises: ValueError for parameters that are not 2-D."""

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, weight_decay: float = 0.1, *,
                 coefficients="jordan", safety: float | None = None, eps: float | None = None, eps_mode: str = "clamp",
                 adjust_lr: str = "original", ns_dtype: torch.dtype = torch.bfloat16, normuon: bool = False,
                 nesterov_form: str = "lerp", grad_in_place: bool = False, decay_plant: str | None = None) -> None:
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))
        if any(p.ndim != 2 for group in self.param_groups for p in group["params"]):
            raise ValueError("params: expected 2-D (m, n) parameters")
        if isinstance(coefficients, str):
            sched = ortho_ref.SCHEDULES[coefficients]
            table = ortho_ref.schedule(coefficients)
            safety = sched.safety if safety is None else safety
            eps = sched.eps if eps is None else eps
        else:
            table = coefficients
        self.table = [tuple(float(c) for c in row) for row in table]
        self.safety, self.eps, self.eps_mode = 1.0 if safety is None else safety, 1e-7 if eps is None else eps, eps_mode
        self.adjust_lr, self.ns_dtype, self.normuon = adjust_lr, ns_dtype, normuon
        self.nesterov_form, self.grad_in_place = nesterov_form, grad_in_place
        if decay_plant not in (None, "twice", "adjusted_lr", "l2"):
            raise ValueError(f"decay_plant: expected None, 'twice', 'adjusted_lr' or 'l2', got {decay_plant!r}")
        self.decay_plant = decay_plant

    @torch.no_grad()
    def step(self, closure=None):
        """One step for every parameter with a gradient."""
        for group in self.param_groups:
            lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                grad = p.grad + wd * p if self.decay_plant == "l2" else p.grad
                buf = state.setdefault("momentum_buffer", torch.zeros_like(p))
                buf.lerp_(grad, 1 - mu)
                if self.nesterov_form == "add":
                    u = grad + mu * buf
                else:
                    u = p.grad.lerp_(buf, mu) if self.grad_in_place else grad.lerp(buf, mu)
                o = _newton_schulz(u, self.table, safety=self.safety, eps=self.eps, eps_mode=self.eps_mode,
                                   dtype=self.ns_dtype).to(p.dtype)
                if self.normuon:  # NorMuon's per-row second moment (β₂ = 0.95, √v + 1e-8), norm restored
                    v = state.setdefault("variance_neuron", torch.zeros(p.shape[0], 1, dtype=torch.float32))
                    of = o.float()
                    v.mul_(0.95).add_(of.square().mean(dim=1, keepdim=True), alpha=0.05)
                    scaled = of / (v.sqrt() + 1e-8)
                    o = (scaled * (of.norm() / scaled.norm().clamp(min=1e-30))).to(p.dtype)
                scale = _scale(self.adjust_lr, *p.shape)
                if self.decay_plant != "l2":
                    p.mul_(1 - lr * (scale if self.decay_plant == "adjusted_lr" else 1.0) * wd)
                if self.decay_plant == "twice":
                    p.mul_(1 - lr * wd)
                p.add_(o, alpha=-lr * scale)


class JordanStyleMuon(torch.optim.Optimizer):
    """Keller Jordan's single-device Muon as published, written by us: M ← lerp(M, G, 1 − β),
    U = lerp(G, M, β), X₀ = U.bfloat16()/(‖·‖_F + 1e-7), five jordan steps on the wide side,
    W ← W(1 − lr·wd) − lr·√max(1, m/n)·O. ``grad_in_place``: the mix computed with
    ``p.grad.lerp_`` as in his code (the gradient is overwritten; the update is right).
    State: ``momentum_buffer``."""

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, weight_decay: float = 0.1, *,
                 grad_in_place: bool = False) -> None:
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))
        self.grad_in_place = grad_in_place

    @torch.no_grad()
    def step(self, closure=None):
        """One step for every parameter with a gradient."""
        a, b, c = 3.4445, -4.7750, 2.0315
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.lerp_(p.grad, 1 - group["momentum"])
                g = p.grad.lerp_(buf, group["momentum"]) if self.grad_in_place else \
                    p.grad.lerp(buf, group["momentum"])
                x = g.bfloat16()
                if g.size(-2) > g.size(-1):
                    x = x.mT
                x = x / (x.norm() + 1e-7)
                for _ in range(5):
                    gram = x @ x.mT
                    x = a * x + (b * gram + c * gram @ gram) @ x
                if g.size(-2) > g.size(-1):
                    x = x.mT
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(x.to(p.dtype), alpha=-group["lr"] * max(1, p.size(-2) / p.size(-1)) ** 0.5)


class RejectsBfloat16Muon(TorchStyleMuon):
    """``TorchStyleMuon`` whose step raises TypeError on a bfloat16 parameter (a Muon that only
    takes float32 parameters)."""

    @torch.no_grad()
    def step(self, closure=None):
        """Raises TypeError for bfloat16 parameters, else ``TorchStyleMuon.step``."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype == torch.bfloat16:
                    raise TypeError(f"expected float32 parameters, got {p.dtype}")
        return super().step(closure)


#: The conventions the correct optimizers above declare: torch.optim.Muon's (``TORCH_MUON``),
#: Keller Jordan's (eps added), polar_express with its own safety and eps (the "safety" plant).
TORCH_STYLE_CONVENTIONS = MuonConventions(eps_mode="clamp")
JORDAN_CONVENTIONS = MuonConventions(eps_mode="add")
POLAR_CONVENTIONS = MuonConventions(eps_mode="clamp", coefficients="polar_express")


def planted(name: str):
    """(optimizer factory, conventions) of the plant ``name`` of ``PLANTS``."""
    kwargs, _ = PLANTS[name]
    conv = POLAR_CONVENTIONS if "safety" in kwargs else TORCH_STYLE_CONVENTIONS
    return functools.partial(TorchStyleMuon, **kwargs), conv
