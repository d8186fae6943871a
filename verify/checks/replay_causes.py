"""Causes of a failed Newton–Schulz comparison found by reading the output another way and judging
it again: a result reshaped instead of transposed back (the orientation of a tall or wide input not
undone), and errors that fit a coarser compute precision than the declared one. Each is a replay
with a yes/no answer, tried before the fits of ``ortho_verify.checks.diagnoses.ns_output_cause``
(docs/verification.md, "Diagnoses").
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

import ortho_ref

from .diagnoses import map_candidates

__all__ = ["COARSER_PRECISIONS", "RESHAPED_CAUSE", "STORED_PRECISION_CAUSE", "STORED_PRECISIONS",
           "precision_cause", "replay_cause", "reshaped_cause", "stored_precision"]

#: The output matches ns_map once read as the iteration's (n, m) result and transposed.
RESHAPED_CAUSE = ("the result of the transposed input is reshaped, not transposed, back to (m, n): read as the "
                  "(n, m) iteration result and transposed, the output matches ns_map (the orientation of a "
                  "{side} input is not undone)")
#: The output's entries are all values of a coarser dtype, and judged in it the output passes.
STORED_PRECISION_CAUSE = ("the kernel computes in {coarser} where {declared} is declared: every entry of the output "
                          "is a {coarser} value, judged as {coarser} the output passes, and no single coefficient, "
                          "scale or normalization change explains it")
#: Storage dtypes whose values ``precision_cause`` recognizes in an output, coarsest first.
STORED_PRECISIONS = ("bfloat16", "float16", "float32")
#: The precisions coarser than each declared one, finest first.
COARSER_PRECISIONS = {"float64": ("float32", "tf32", "float16", "bfloat16"),
                      "float32": ("tf32", "float16", "bfloat16"), "tf32": ("float16", "bfloat16"),
                      "float16": ("bfloat16",)}

#: A replay explains the output when it leaves at most this fraction of the declared reading's error.
EXPLAINS = 0.1


def reshaped_cause(fast: np.ndarray, reference: np.ndarray) -> str:
    """``RESHAPED_CAUSE`` when ``fast`` (m, n), m ≠ n, read as its (n, m) reshape transposed, is
    within ``EXPLAINS`` of its error against ``reference`` = ns_map(a); "" otherwise.
    Shapes: fast, reference (m, n) float64."""
    m, n = fast.shape
    if m == n or min(m, n) < 2:
        return ""
    base = float(np.linalg.norm(fast - reference))
    replay = float(np.linalg.norm(fast.reshape(n, m).T - reference))
    return RESHAPED_CAUSE.format(side="tall" if m > n else "wide") if replay <= EXPLAINS * base else ""


def _systematic_residual(deviation: np.ndarray, sigma_hat: np.ndarray, table) -> float:
    """‖d − g(ε*)‖₂ of the best one-parameter systematic change of ``map_candidates`` (output scale,
    normalization, one coefficient), ε fitted by least squares in [−0.2, 0.2]."""
    from scipy.optimize import minimize_scalar

    best = float(np.linalg.norm(deviation))
    for g in map_candidates(sigma_hat, table).values():
        res = minimize_scalar(lambda e: float(np.sum((deviation - g(e)) ** 2)), bounds=(-0.2, 0.2), method="bounded",
                              options={"xatol": 1e-9})
        best = min(best, float(np.sqrt(max(res.fun, 0.0))))
    return best


def stored_precision(fast: np.ndarray, declared: str) -> str:
    """The coarsest dtype of ``STORED_PRECISIONS``, coarser than ``declared``, of which every entry of
    ``fast`` is a value ("" if none, or fewer than 8 nonzero entries: too few to tell)."""
    if np.count_nonzero(fast) < 8:
        return ""
    for name in STORED_PRECISIONS:
        if name in COARSER_PRECISIONS.get(declared, ()):
            stored = torch.from_numpy(np.ascontiguousarray(fast)).to(getattr(torch, name)).double().numpy()
            if np.array_equal(stored, fast):
                return name
    return ""


def precision_cause(fast: np.ndarray, a: np.ndarray, table, *, safety: float, eps: float, eps_mode: str,
                    declared: str, tolerance: float, passes_as: Callable[[str], bool]) -> str:
    """The cause of errors that a coarser precision than ``declared`` explains, "" otherwise.

    Only when no single systematic change (``map_candidates``: output scale, normalization, one
    coefficient) explains the per-direction deviation uᵢᵀ fast vᵢ − f(σ̂ᵢ) to within the declared
    ``tolerance`` (a coefficient 1% off may pass when judged in bfloat16: the fit names it), on an
    input whose σ̂ spread over more than 1% (on a flat spectrum the fit cannot tell): then
    ``STORED_PRECISION_CAUSE`` when every entry of ``fast`` is a value of a coarser dtype
    (``stored_precision``) and the rows judged in it pass (``passes_as``). Passing in a coarser
    precision alone names nothing: its tolerance also admits small systematic errors, and a
    precision kept only inside the kernel (TF32 products) leaves no trace in the output's values.
    Shapes: fast, a (m, n) float64; table (T, 3)."""
    coarser = COARSER_PRECISIONS.get(declared, ())
    if not coarser or min(a.shape) < 2:
        return ""
    u, _, vt = ortho_ref.svd(a)
    sigma_hat = ortho_ref.normalized_singular_values(a, safety=safety, eps=eps, eps_mode=eps_mode)
    if float(np.ptp(sigma_hat)) <= 1e-2 * float(sigma_hat.max()):
        return ""
    k = len(sigma_hat)
    deviation = np.einsum("ij,ik,kj->j", u[:, :k], fast, vt[:k].T) - ortho_ref.ns_polynomial(sigma_hat, table)
    if _systematic_residual(deviation, sigma_hat, table) <= tolerance:
        return ""
    stored = stored_precision(fast, declared)
    return STORED_PRECISION_CAUSE.format(coarser=stored, declared=declared) if stored and passes_as(stored) else ""


def replay_cause(fast: np.ndarray, a: np.ndarray, table, *, safety: float, eps: float, eps_mode: str, declared: str,
                 tolerance: float, passes_as: Callable[[str], bool]) -> str:
    """``reshaped_cause``, else ``precision_cause``; "" when neither replay explains the output."""
    if not np.all(np.isfinite(fast)):
        return ""
    reference = ortho_ref.ns_map(a, table, safety=safety, eps=eps, eps_mode=eps_mode)
    return reshaped_cause(fast, reference) or precision_cause(
        fast, a, table, safety=safety, eps=eps, eps_mode=eps_mode, declared=declared, tolerance=tolerance,
        passes_as=passes_as)
