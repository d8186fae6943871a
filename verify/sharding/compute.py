"""Judging a Muon whose Newton–Schulz runs below the parameter dtype (``check_sharded_optimizer``'s
``compute_dtype``): which compute dtype applies (``resolve_compute``), and, where it is bfloat16 /
float16, the rows comparing each step's orthogonalized update of a layout with one process's under
``ortho_verify.tolerances.sharded_compute_tolerance`` (``update_rows``)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from ..conventions import table_and_normalization
from ..report.results import measured
from .inputs import gradient, initial_weight, input_name
from .tensors import relative_difference

__all__ = ["COMPUTE_DTYPES", "ComputeModel", "resolve_compute", "update_rows"]

#: Values of ``compute_dtype``.
COMPUTE_DTYPES = ("float64", "float32", "bfloat16", "float16")
_LOW = ("bfloat16", "float16")


@dataclass(frozen=True)
class ComputeModel:
    """The compute dtype a check assumes and why; ``conventions`` the Muon model (momentum,
    schedule, lr scale, weight decay) that rebuilds each step's Newton–Schulz input and reads
    the update out of the weights, where the compute dtype is low."""

    dtype: str
    why: str
    conventions: object = None

    @property
    def low(self) -> bool:
        return self.dtype in _LOW


def _name(dtype, argument: str = "compute_dtype") -> str:
    text = str(dtype).removeprefix("torch.")
    if text not in COMPUTE_DTYPES:
        raise ValueError(f"{argument}: expected one of {list(COMPUTE_DTYPES)} or None, got {dtype!r}")
    return text


def resolve_compute(compute_dtype, conventions, optimizer_type, param_dtype: str) -> ComputeModel:
    """The compute dtype of a check: ``compute_dtype`` when given; else the ``ns_dtype`` of
    ``MuonConventions``; else bfloat16 for torch.optim.Muon (its shipped Newton–Schulz); else the
    parameter dtype. Low precision (bfloat16 / float16) needs a Muon model: the conventions given,
    torch.optim.Muon's (``TORCH_MUON``) for torch.optim.Muon, else ``MuonConventions()`` (EMA
    momentum, Nesterov, Keller Jordan's schedule). Raises: ValueError naming compute_dtype for an
    unknown dtype, or a low one with ``DionConventions``."""
    from ..conventions import TORCH_MUON, MuonConventions

    torch_muon = getattr(torch.optim, "Muon", None)
    is_torch_muon = torch_muon is not None and optimizer_type is not None and issubclass(optimizer_type, torch_muon)
    if compute_dtype is not None:
        name, why = _name(compute_dtype), "declared (compute_dtype)"
    elif isinstance(conventions, MuonConventions):
        name, why = _name(conventions.ns_dtype, "conventions.ns_dtype"), "the conventions' ns_dtype"
    elif is_torch_muon:
        name, why = "bfloat16", "torch.optim.Muon's Newton–Schulz runs in bfloat16"
    else:
        name, why = param_dtype, "the parameter dtype (no compute dtype declared)"
    if name not in _LOW or _rank(name) >= _rank(param_dtype):
        return ComputeModel(param_dtype if _rank(name) >= _rank(param_dtype) else name, why)
    if conventions is not None and not isinstance(conventions, MuonConventions):
        raise ValueError(f"compute_dtype: the {name} bound models Newton–Schulz (MuonConventions); "
                         f"got {type(conventions).__name__}")
    model = conventions if conventions is not None else (TORCH_MUON if is_torch_muon else MuonConventions())
    return ComputeModel(name, why, model)


def _rank(name: str) -> int:
    return {"float16": 0, "bfloat16": 0, "float32": 1, "float64": 2}[name]


def _hyper(conv, hyper: dict) -> tuple[float, float, float] | None:
    names = conv.hyperparameter_names
    if not all(names[k] in hyper for k in ("lr", "momentum", "weight_decay")):
        return None
    return float(hyper[names["lr"]]), float(hyper[names["momentum"]]), float(hyper[names["weight_decay"]])


@functools.lru_cache(maxsize=2048)
def _bound(u_bytes: bytes, shape: tuple, table_bytes: bytes, rows: int, dtype: str, world: int, param: str, eps: float,
           eps_mode: str, safety: float, us_bytes: bytes | None = None) -> tuple[float, float]:
    """``sharded_compute_tolerance`` memoized on its exact inputs: every layout of a check asks it for
    the same (matrix, step) inputs. ``us_bytes``: the sharded run's own input (an "l2" style), None
    where it is one process's."""
    from ..tolerances import sharded_compute_tolerance

    u = np.frombuffer(u_bytes, dtype=np.float64).reshape(shape).copy()
    u_s = None if us_bytes is None else np.frombuffer(us_bytes, dtype=np.float64).reshape(shape).copy()
    table = np.frombuffer(table_bytes, dtype=np.float64).reshape(rows, 3)
    return sharded_compute_tolerance(u, table, dtype, world, param, eps=eps, eps_mode=eps_mode, safety=safety,
                                     u_sharded=u_s)


def update_rows(plan, runs: list[dict], reference: dict, model: ComputeModel, world_size: int
                ) -> tuple[list, list[dict], bool]:
    """Rows "sharded_vs_one_process" per (shape, step) comparing the orthogonalized update
    O_t = (c·W_{t−1} − W_t)/(lr·s) read out of rank 0's weights and out of one process's (c the
    decay factor, s the lr scale, of ``model.conventions``), relative Frobenius, against
    ``sharded_compute_tolerance`` on the step's Newton–Schulz input U_t, rebuilt from the seeded
    gradients with the conventions' momentum. Under the "l2" style (G ← G + wd·W) each run's U_t
    takes wd times its own previous weight: one process's and rank 0's (two momentum chains), the
    second passed as the bound's ``u_sharded``. Returns (rows, disagreements, any failing)."""
    from ortho_ref.muon import decay_factor, lr_scale, momentum_update

    conv = model.conventions
    # the schedule's own safety and eps where the conventions leave them None (as check_optimizer)
    table, safety, eps = table_and_normalization(conv.coefficients, conv.ns_steps, conv.safety, conv.eps)
    tab = np.ascontiguousarray(table, dtype=np.float64)
    hp = _hyper(conv, reference["hyper"])
    name = plan.layout.name
    dt = getattr(torch, plan.dtype)
    rows, found, numeric = [], [], False
    for i, (label, shape) in enumerate(plan.shapes):
        inp = input_name(name, label, shape)
        if hp is None:
            rows.append(measured("sharded_vs_one_process", inp, f"update in {model.dtype}", math.inf, 0.0,
                                 f"param_groups[0] has none of {conv.hyperparameter_names}: set the conventions' "
                                 "hyperparameter_names to read the update out of the weights"))
            numeric = True
            continue
        lr, mu, wd = hp
        m, n = shape
        scale = lr_scale(conv.adjust_lr, m, n) * conv.extra_scale_factor
        c = decay_factor(conv.weight_decay_style, lr=lr, weight_decay=wd, scale=scale)
        seed = plan.seed(i)
        prev = [initial_weight(seed, shape, dt).double()] * 2
        l2 = conv.weight_decay_style == "l2"
        moms = [np.zeros(shape)] * (2 if l2 else 1)  # one process's [and the sharded run's] momentum
        worst, first_bad, bound_at = 0.0, None, 0.0
        for t in range(plan.steps):
            g = gradient(seed, t, 0, shape, dt).double().numpy()
            # the decay coupled into the gradient: each run's own previous weight (one process's first)
            seen = [g + wd * prev[1].numpy(), g + wd * prev[0].numpy()] if l2 else [g]
            us = []
            for k, gk in enumerate(seen):
                moms[k], uk = momentum_update(gk, moms[k], mu=mu, nesterov=conv.nesterov,
                                              momentum_style=conv.momentum_style, nesterov_form=conv.nesterov_form,
                                              bias_correction=conv.bias_correction, step=t + 1)
                us.append(np.ascontiguousarray(uk))
            u = us[0]
            u_s = us[1].tobytes() if l2 and not np.array_equal(us[0], us[1]) else None
            tol, sim = _bound(u.tobytes(), tuple(u.shape), tab.tobytes(), tab.shape[0], model.dtype, world_size,
                              plan.dtype, float(eps), conv.eps_mode, float(safety), u_s)
            w_s, w_1 = runs[0]["weights"][t][i], reference["weights"][t][i]
            o_s, o_1 = (c * prev[0] - w_s) / (lr * scale), (c * prev[1] - w_1) / (lr * scale)
            err = relative_difference(o_s, o_1)
            rows.append(measured("sharded_vs_one_process", inp,
                                 f"update O, step {t + 1}, {model.dtype} compute ({model.why})", err, tol,
                                 f"bound {tol:.2e} = C_NS·{sim:.2e} (the judge's {model.dtype} Newton–Schulz with "
                                 f"the inner sums split in 2..{world_size} rounded partial sums, against one "
                                 f"process's order" + (", plus at the sharded run's own L2 input" if u_s else "")
                                 + f") + the {plan.dtype} layout contract"))
            if not err <= tol and first_bad is None:
                first_bad, bound_at = t, tol
            worst = max(worst, err) if math.isfinite(err) else math.inf
            prev = [w_s, w_1]
        if first_bad is not None:
            numeric = True
            found.append({"layout": name, "shape": inp.split(" / ", 1)[1], "worst": worst, "bound": bound_at,
                          "step": first_bad + 1, "cause": ""})
    return rows, found, numeric
