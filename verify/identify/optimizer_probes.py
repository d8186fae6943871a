"""Probes of ``identify_optimizer``: a fresh optimizer built on a few small parameters and stepped with
designed gradients, its weights, state and gradients read back after every step.

Every probe builds its own optimizer (``Prober.run``), so no probe sees another's state. The
gradients are designed so that one field of the declaration is visible in the weights (docs/verification.md,
"Identifying an optimizer").
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import numpy as np
import torch

from ..checks.optimizer_steps import flat_state
from ..inputs.arrays import as_float64
from ..inputs.spectra import matrix_with_spectrum
from .optimizer_kwargs import constructor_kwargs, signature_defaults

__all__ = ["HYPERPARAMETER_CANDIDATES", "ProbeRun", "Prober", "hyperparameter_names", "spectrum_matrix"]

#: Constructor keywords tried for each hyperparameter, in order (the names in use in public Muon /
#: Dion implementations: torch, microsoft/dion, Keller Jordan, Emerging-Optimizers, Moonlight, nanochat).
HYPERPARAMETER_CANDIDATES = {
    "lr": ("lr", "learning_rate"),
    "momentum": ("momentum", "mu", "beta", "momentum_beta", "beta1"),
    "weight_decay": ("weight_decay", "wd", "weight_decay_rate"),
}


def hyperparameter_names(optimizer) -> tuple[dict, dict]:
    """({"lr": kw, "momentum": kw, "weight_decay": kw}, {keyword: default}) read from the signature:
    the first candidate of ``HYPERPARAMETER_CANDIDATES`` present, the momentum as ``"betas[0]"``
    when only a ``betas`` tuple is there; a keyword the signature lacks falls back to the first
    candidate when the signature takes ``**kwargs`` (a factory that forwards them).
    Raises: ValueError naming ``optimizer`` for a signature without a keyword for one of them."""
    defaults = signature_defaults(optimizer)
    target = getattr(optimizer, "func", optimizer)
    try:
        sig = inspect.signature(target.__init__ if inspect.isclass(target) else target)
        var_kw = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
    except (TypeError, ValueError):
        var_kw = True
    names = {}
    for key, candidates in HYPERPARAMETER_CANDIDATES.items():
        found = next((c for c in candidates if c in defaults), None)
        if found is None and key == "momentum" and isinstance(defaults.get("betas"), (tuple, list)):
            found = "betas[0]"
        if found is None and var_kw:
            found = candidates[0]
        if found is None:
            raise ValueError(f"optimizer: its signature {sorted(defaults)} has no keyword for {key!r} "
                             f"(tried {list(candidates)}); declare it in MuonConventions.hyperparameter_names")
        names[key] = found
    return names, defaults


def spectrum_matrix(shape, values, rng) -> np.ndarray:
    """An (m, n) float64 matrix with singular values ``values`` (padded with the last) and Haar vectors."""
    k = min(shape)
    s = np.resize(np.asarray(values, dtype=np.float64), k) if len(values) < k else np.asarray(values[:k], float)
    return matrix_with_spectrum(s, *shape, rng)


@dataclass
class ProbeRun:
    """What one probe saw: the weights before each step and after it (float64), the flat state
    (``optimizer_steps.flat_state``) after each step, the gradient objects after each step, and
    the exception raised (None if none)."""

    weights: list = field(default_factory=list)
    states: list = field(default_factory=list)
    grads_after: list = field(default_factory=list)
    aliased: list = field(default_factory=list)
    error: BaseException | None = None


class Prober:
    """Builds ``optimizer(params, **kwargs)`` on fresh parameters and steps it with given gradients.

    Parameters
    ----------
    optimizer : class or callable
        The optimizer under identification (a class or a factory).
    names : dict
        Constructor keywords of lr, momentum and weight_decay (``hyperparameter_names``).
    extra_kwargs : dict
        Further constructor keywords, held fixed.
    """

    def __init__(self, optimizer, names: dict, extra_kwargs: dict) -> None:
        self.optimizer, self.names, self.extra_kwargs = optimizer, names, dict(extra_kwargs)

    def build(self, params, *, lr: float, mu: float, wd: float):
        """The optimizer on ``params`` (raises what the constructor raises)."""
        kwargs = constructor_kwargs(self.optimizer, self.names, {"lr": lr, "momentum": mu, "weight_decay": wd},
                                    self.extra_kwargs)
        return self.optimizer(params, **kwargs)

    def run(self, weights, grads, *, lr: float, mu: float, wd: float, dtype=torch.float32) -> ProbeRun:
        """Step a fresh optimizer on parameters ``weights`` (list of (m, n) float64) with ``grads``
        (list over steps of lists over parameters); an exception ends the run and is kept."""
        params = [torch.nn.Parameter(torch.tensor(w, dtype=torch.float64).to(dtype)) for w in weights]
        out = ProbeRun(weights=[[as_float64(p) for p in params]])
        try:
            opt = self.build(params, lr=lr, mu=mu, wd=wd)
            for step_grads in grads:
                given = []
                for p, g in zip(params, step_grads):
                    p.grad = torch.tensor(g, dtype=torch.float64).to(dtype)
                    given.append(as_float64(p.grad))  # a copy: the step may write into p.grad
                opt.step()
                out.weights.append([as_float64(p) for p in params])
                out.states.append([flat_state(opt.state.get(p)) for p in params])
                out.grads_after.append([(p.grad, g) for p, g in zip(params, given)])
                out.aliased.append([_aliased(opt.state.get(p), p) for p in params])
        except Exception as err:  # noqa: BLE001 - the user's code; the caller decides what it means
            out.error = err
        return out


def _aliased(state, p) -> bool:
    ptrs = {p.untyped_storage().data_ptr()} | ({p.grad.untyped_storage().data_ptr()} if p.grad is not None else set())

    def walk(d):
        for v in (d or {}).values():
            if isinstance(v, torch.Tensor) and v.numel() and v.untyped_storage().data_ptr() in ptrs:
                return True
            if isinstance(v, dict) and walk(v):
                return True
        return False
    return walk(state)
