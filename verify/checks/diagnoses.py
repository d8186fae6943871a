"""Diagnoses: the likely cause of a failed check, in words (``CheckResult.cause``).

Run only on failures, so a passing run pays nothing. Each function looks at what the failing
implementation produced and names the simplest explanation it can confirm numerically:
a map that goes negative (the update ascends), a divergence, an update off by a constant
factor (compared with the known lr scales), a momentum that matches another known form or
none, a state of an unexpected shape. docs/verification.md, "Diagnoses".
"""

from __future__ import annotations

import dataclasses

import numpy as np

import ortho_ref
from ortho_verify.results import CheckResult

__all__ = ["momentum_cause", "ns_output_cause", "scale_cause", "with_cause"]


def with_cause(row: CheckResult, cause: str) -> CheckResult:
    """``row`` with its ``cause`` set and prepended to its note (so every summary shows it; a
    copy; a passed row or an empty cause returns the row unchanged)."""
    if row.passed or not cause or cause == row.cause:
        return row
    note = row.note.removeprefix(f"cause: {row.cause}").removeprefix("; ") if row.cause else row.note
    return dataclasses.replace(row, cause=cause, note=f"cause: {cause}" + (f"; {note}" if note else ""))


def _intervals(x: np.ndarray, mask: np.ndarray) -> str:
    """'[a, b]' of the values of ``x`` where ``mask`` holds (the hull; ``x`` any order)."""
    sel = x[mask]
    return f"[{sel.min():.3g}, {sel.max():.3g}]"


def ns_output_cause(fast: np.ndarray, a: np.ndarray, table, *, safety: float, eps: float, eps_mode: str,
                    tolerance: float, lr_shape: tuple[int, int] | None = None) -> str:
    """The likely cause of a failed Newton–Schulz comparison of ``fast`` with ns_map(``a``).

    In order: NaN / Inf in the output (the iteration diverged: a coefficient of the wrong sign,
    a missing normalization); the declared map f itself negative on part of [σ̂_min, σ̂_max] (the
    reference ascends there: the schedule, e.g. a table cycled past its length, is wrong); the
    computed map uᵢᵀ fast vᵢ negative beyond ``tolerance`` on some σ̂ (the update ascends
    along those directions); the output a constant multiple s of ns_map(a) (to within
    ``tolerance``: a scale bug; with ``lr_shape`` = (m, n) s is compared with the ratios of the
    known lr scales of ``ortho_ref.lr_scale``). "" when none applies.
    Shapes: fast, a (m, n) float64; table (T, 3).
    """
    if not np.all(np.isfinite(fast)):
        return ("output has NaN or Inf: the iteration diverged (a coefficient of the wrong sign, e.g. b > 0, or an "
                "input not normalized)")
    u, s, vt = ortho_ref.svd(a)
    sigma_hat = ortho_ref.normalized_singular_values(a, safety=safety, eps=eps, eps_mode=eps_mode)
    f = ortho_ref.ns_polynomial(sigma_hat, table)
    grid = np.geomspace(max(float(sigma_hat.min()), 1e-3), max(float(sigma_hat.max()), 1e-3), 200)
    declared = ortho_ref.ns_polynomial(grid, table)
    if np.any(declared < 0):
        return (f"the declared map f is negative on sigma_hat in {_intervals(grid, declared < 0)}: a step with it "
                "ascends (the coefficient table is wrong, e.g. cycled past its length)")
    k = len(sigma_hat)
    projected = np.einsum("ij,ik,kj->j", u[:, :k], fast, vt[:k].T)
    negative = projected < -tolerance
    if np.any(negative):
        return (f"map negative on sigma_hat in {_intervals(sigma_hat, negative)}: the update ascends along "
                f"{int(negative.sum())} of {k} directions (e.g. a coefficient table cycled past its length)")
    ref = ortho_ref.ns_map(a, table, safety=safety, eps=eps, eps_mode=eps_mode)
    return scale_cause(fast, ref, tolerance, lr_shape)


def scale_cause(fast: np.ndarray, ref: np.ndarray, tolerance: float, lr_shape: tuple[int, int] | None = None) -> str:
    """"off by a constant factor s" when ‖fast − s·ref‖_F ≤ max(tolerance, 1e-3‖ref‖_F) for the
    least-squares s = ⟨fast, ref⟩/⟨ref, ref⟩ ≠ 1, naming the pair of lr scales (``ortho_ref.lr_scale``
    modes, with 0.2 and 5 for Moonlight's / Megatron's factor) whose ratio on ``lr_shape`` = (m, n)
    is within 1% of s; "" otherwise."""
    denom = float(np.sum(ref * ref))
    if denom == 0:
        return ""
    s = float(np.sum(fast * ref)) / denom
    if abs(s - 1) < 1e-3 or np.linalg.norm(fast - s * ref) > max(tolerance, 1e-3 * np.sqrt(denom)):
        return ""
    text = f"update off by a constant factor s = {s:.4g}"
    if lr_shape is not None:
        m, n = lr_shape
        names = [mode for mode in ortho_ref.muon.ADJUST_LR_MODES if mode is not None]
        scales = {str(mode): ortho_ref.lr_scale(mode, m, n) for mode in names} | {"None": 1.0}
        matches = sorted({(used == "None" or declared == "None", f"{used} where {declared} is declared")
                          for used, a in scales.items() for declared, b in scales.items()
                          if used != declared and abs(a / b / s - 1) < 0.01})
        text += f" on a {m}x{n} matrix" + (": matches the lr scale " + " or ".join(t for _, t in matches[:4]) if matches else
                                           ": no ratio of known lr scales (" + ", ".join(scales) + ") explains it")
    return text


def momentum_cause(fast: np.ndarray, grad: np.ndarray, previous: np.ndarray, *, mu: float, declared: str,
                   tolerance: float) -> str:
    """Which known momentum form the buffer ``fast`` matches (to ``tolerance``), when it is not
    the ``declared`` one: "ema" μM + (1−μ)G, "classic" μM + G, "gradient only" G, the buffer not
    updated, or the right form normalized in place to unit Frobenius norm; otherwise that it
    differs from every known form (with its norm against the expected one)."""
    forms = {"ema": mu * previous + (1 - mu) * grad, "classic": mu * previous + grad, "gradient only": grad,
             "not updated": previous}
    expected = forms[declared]
    for name, value in forms.items():
        if name != declared and np.linalg.norm(fast - value) <= tolerance:
            return f"momentum matches the {name} form, not the declared {declared!r}"
    norm = float(np.linalg.norm(expected))
    if norm > 0 and np.linalg.norm(fast - expected / norm) <= max(tolerance, 1e-3):
        return (f"momentum normalized in place: the stored buffer has norm {np.linalg.norm(fast):.3g} instead of "
                f"{norm:.3g} (the {declared} form divided by its norm)")
    return (f"momentum differs from every known momentum form (ema, classic, gradient only, not updated, normalized); "
            f"norm {np.linalg.norm(fast):.3g}, expected {norm:.3g}")
