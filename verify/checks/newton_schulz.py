"""Newton–Schulz checks of ``ortho-verify``: the coefficient registries and ``ortho_fast.newton_schulz``
against the oracle's ``ns_map`` and exact band (Amsel et al., arXiv 2505.16932, Sec. 2).

Inputs are float64 numpy matrices (``ortho_verify.inputs.spectra.MatrixCase``); the fast side runs in
the dtype under test; tolerances from ``ortho_verify.tolerances``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

import ortho_fast
import ortho_ref

from .. import tolerances as tol
from ..inputs.arrays import TORCH_DTYPES
from ..inputs.spectra import MatrixCase
from ..report.results import CheckResult, measured
from .diagnoses import ns_output_cause, with_cause
from .replay_causes import replay_cause

__all__ = ["SHARP_SINGULAR_VALUE_TOLERANCE", "case_svd", "check_coefficient_registries", "check_newton_schulz",
           "compare_ns_output"]

#: A per-direction tolerance below this (a tenth of the band's typical width) counts as a
#: sharp check in the report's notes; it changes no verdict.
SHARP_SINGULAR_VALUE_TOLERANCE = 0.1


def check_coefficient_registries() -> list[CheckResult]:
    """``ortho_fast.COEFFICIENTS`` vs the oracle's independent transcription, bit for bit,
    for the default step count and for 3 steps past it (the tail rule)."""
    out = []
    names = sorted(set(ortho_fast.COEFFICIENTS) | set(ortho_ref.SCHEDULES))
    for name in names:
        if name not in ortho_fast.COEFFICIENTS or name not in ortho_ref.SCHEDULES:
            out.append(measured("coefficient_registry", name, "present on both sides", math.inf,
                               tol.COEFFICIENT_REGISTRY_TOLERANCE, "missing on one side"))
            continue
        fast, ref = ortho_fast.COEFFICIENTS[name], ortho_ref.SCHEDULES[name]
        err = 0.0
        for steps in (fast.default_steps, fast.default_steps + 3):
            err = max(err, float(np.max(np.abs(np.array(fast.table(steps)) - ortho_ref.schedule(name, steps)))))
        err = max(err, abs(fast.safety - ref.safety), abs(fast.eps - ref.eps),
                  float(fast.default_steps != ref.default_steps) * math.inf)
        out.append(measured("coefficient_registry", name, "tables, tail, normalization", err,
                           tol.COEFFICIENT_REGISTRY_TOLERANCE))
    return out


def _envelope_row(check: str, input_name: str, detail: str, values: np.ndarray, exact_low, exact_high,
                  taus: np.ndarray, informative: bool, note: str) -> CheckResult:
    """``values`` (any order) against per-direction intervals: the exact value of direction i
    lies in [a_i, b_i] (``exact_low``, ``exact_high``: arrays or scalars) and the computed one
    within τᵢ of it; the pairing is unknown. Order statistics are monotone (x_i ∈ [l_i, h_i] for
    every i implies sort(x)_k ∈ [sort(l)_k, sort(h)_k]), so the k-th smallest value v_k must lie in
    [sort(a − τ)_k, sort(b + τ)_k]: error = its excursion outside [sort(a)_k, sort(b)_k], tolerance =
    the envelope's widening on that side; the row reports the k with the largest ratio."""
    a, b = np.broadcast_to(exact_low, taus.shape), np.broadcast_to(exact_high, taus.shape)
    v, lo, hi = np.sort(values), np.sort(a), np.sort(b)
    below, above = lo - np.sort(a - taus), np.sort(b + taus) - hi
    error = np.maximum(0.0, np.maximum(lo - v, v - hi))
    bound = np.where(v < lo, below, above)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(bound > 0, error / bound, np.where(error > 0, np.inf, 0.0))
    k = int(np.argmax(ratios))
    return measured(check, input_name, detail, error[k], bound[k],
                    f"k = {k + 1} of {len(v)} (ascending): {v[k]:.3f}, exact in [{lo[k]:.3f}, {hi[k]:.3f}], allowed "
                    f"[{lo[k] - below[k]:.3f}, {hi[k] + above[k]:.3f}]" + (f"; {note}" if note else ""),
                    informative=informative)


def compare_ns_output(fast: np.ndarray, a: np.ndarray, table, *, safety: float, eps: float, dtype: str,
                      input_name: str, detail: str, eps_mode: str = "add", extra: float = 0.0, svd=None,
                      record: list | None = None, prefix: str = "",
                      lr_shape: tuple[int, int] | None = None, form: str = "standard",
                      restarts=()) -> list[CheckResult]:
    """Judge a computed Newton–Schulz result ``fast`` of the input ``a`` against the oracle.

    float32/float64: (a) ‖fast − ns_map(a)‖_F ≤ ``ns_tolerance`` + ``extra``; (b) spread: every
    singular value of ``fast`` lies in the exact band of f over [σ̂_min, σ̂_max] widened by that
    tolerance (error: the largest excursion outside the band).
    bfloat16, with the per-direction tolerances τᵢ of ``ns_singular_value_tolerances`` (+ ``extra``):
    (a) the sorted singular values of ``fast`` within the order-statistic envelope of the
    intervals f(σ̂ᵢ) ± τᵢ (``_envelope_row``), and per direction uᵢᵀ fast vᵢ against f(σ̂ᵢ) within
    τᵢ (``ns_projected_singular_values``); (b) spread: the sorted singular values within the
    envelope of [lo − τᵢ, hi + τᵢ] (band [lo, hi]). A bfloat16 row whose intervals all contain
    0 (f(σ̂ᵢ) ≤ τᵢ for every i; band: lo ≤ τᵢ) admits the zero output: it makes no claim
    (``CheckResult.claimed``) unless it fails.

    Shapes: fast, a (m, n) float64; table (T, 3). ``dtype`` names the compute dtype the
    tolerances are for; ``extra`` an absolute Frobenius allowance for errors made outside
    the Newton–Schulz iteration (e.g. the weight update around it); ``svd`` an optional
    precomputed ``ortho_ref.svd(a)``; ``record``: if a list, (σ̂, uᵢᵀ fast vᵢ) is appended
    (the points of the singular-value map); ``prefix`` is prepended to the check names.
    Returns: CheckResult rows ``ns_vs_ns_map``, ``ns_projected_singular_values`` (bfloat16)
    and ``spread_in_band``; a non-finite or mis-shaped ``fast`` fails both with error inf.
    Failed rows carry a ``cause`` (``ortho_verify.checks.replay_causes.replay_cause``: a result reshaped
    instead of transposed back, or a coarser precision than declared; else
    ``ortho_verify.checks.diagnoses.ns_output_cause``; ``lr_shape``
    (m, n) when ``fast`` is an update recovered by dividing by an lr scale, to name a scale mix-up).
    ``dtype`` may also be "float16" and "tf32" (judged per direction, as bfloat16: ``PER_DIRECTION``).
    ``form="gram"`` with ``restarts`` (0-based steps before which R is recomputed): the kernel is
    Gram Newton–Schulz, judged with ``ns_gram_singular_value_tolerances`` (low precision) or
    ``ns_gram_tolerance`` (float32 / float64).
    """
    rows = _compare_rows(fast, a, table, safety=safety, eps=eps, dtype=dtype, input_name=input_name, detail=detail,
                         eps_mode=eps_mode, extra=extra, svd=svd, record=record, prefix=prefix, form=form,
                         restarts=restarts)
    if all(r.passed for r in rows) or fast.shape != a.shape:
        return rows
    tolerance = rows[0].tolerance if math.isfinite(rows[0].tolerance) else 0.0

    def passes_as(coarser: str) -> bool:  # the same rows judged in a coarser precision (replay_cause)
        return all(r.passed for r in _compare_rows(fast, a, table, safety=safety, eps=eps, dtype=coarser,
                                                   input_name=input_name, detail=detail, eps_mode=eps_mode,
                                                   extra=extra, svd=svd, record=None, prefix=prefix, form=form,
                                                   restarts=restarts))

    cause = replay_cause(fast, a, table, safety=safety, eps=eps, eps_mode=eps_mode, declared=dtype,
                         tolerance=tolerance, passes_as=passes_as) or \
        ns_output_cause(fast, a, table, safety=safety, eps=eps, eps_mode=eps_mode, tolerance=tolerance,
                        lr_shape=lr_shape)
    return [with_cause(r, cause) for r in rows]


#: Compute precisions judged per singular direction (``compare_ns_output``'s low-precision rows).
PER_DIRECTION = tol.PER_DIRECTION_PRECISIONS


def _compare_rows(fast, a, table, *, safety, eps, dtype, input_name, detail, eps_mode, extra, svd, record, prefix,
                  form="standard", restarts=()):
    """The rows of ``compare_ns_output`` before diagnosis."""
    names = [prefix + "ns_vs_ns_map", prefix + "spread_in_band"]
    if fast.shape != a.shape or not np.all(np.isfinite(fast)):
        why = f"output shape {fast.shape} != input shape {a.shape}" if fast.shape != a.shape else \
            "output has NaN or Inf"
        return [measured(name, input_name, detail, math.inf, 0.0, why) for name in names]
    sigma_hat = ortho_ref.normalized_singular_values(a, safety=safety, eps=eps, eps_mode=eps_mode)
    f_sigma = ortho_ref.ns_polynomial(sigma_hat, table)  # exact output singular values, per direction
    sv_fast = np.sort(ortho_ref.singular_values(fast))
    lo, hi = ortho_ref.ns_band(table, float(sigma_hat.min()), float(sigma_hat.max()) * (1 + 1e-12) + 1e-300)
    band = f"band [{lo:.3f}, {hi:.3f}], measured [{sv_fast.min():.3f}, {sv_fast.max():.3f}]"
    projected = None
    per_direction = dtype in PER_DIRECTION
    if per_direction or record is not None:
        u_a, _, vt_a = ortho_ref.svd(a) if svd is None else svd
        projected = np.einsum("ij,ik,kj->j", u_a, fast, vt_a.T, optimize=True)  # BLAS, not a triple loop
        if record is not None:
            record.append((sigma_hat, projected))
    if not per_direction:
        ref = ortho_ref.ns_map(a, table, safety=safety, eps=eps, eps_mode=eps_mode)
        # Spread in float32/float64: σᵢ(ns_map) = f(σ̂ᵢ) lies in the band, and by Weyl each σᵢ moves
        # by at most ‖X_fast − X_ref‖₂ ≤ ‖·‖_F ≤ ns_tolerance, which counts the cancelling step terms
        # (the first-order singular-value model does not: a 1 × 1 float32 input exceeded it by 2%).
        sv_tol = (tol.ns_gram_tolerance(sigma_hat, table, a.shape, dtype, restarts) if form == "gram" else
                  tol.ns_tolerance(sigma_hat, table, a.shape, dtype)) + extra
        weak = "; tolerance exceeds the band's upper edge" if sv_tol >= hi else ""
        excursion = max(0.0, lo - float(sv_fast.min()), float(sv_fast.max()) - hi)
        return [measured(names[0], input_name, detail + " (Frobenius)", np.linalg.norm(fast - ref), sv_tol),
                measured(names[1], input_name, detail, excursion, sv_tol, band + weak)]
    taus = (tol.ns_gram_singular_value_tolerances(sigma_hat, table, a.shape, dtype, restarts) if form == "gram" else
            tol.ns_singular_value_tolerances(sigma_hat, table, a.shape, dtype)) + extra
    resolved = f_sigma > taus  # directions whose interval f ± τ excludes 0
    vacuous = "no claim: every direction's tolerance admits 0 (f(sigma_i) <= tau_i), too ill-conditioned " \
              f"or too small for {dtype}"
    ratios = np.abs(projected - f_sigma) / taus
    i = int(np.argmax(ratios))
    sharp = int(np.sum(taus < SHARP_SINGULAR_VALUE_TOLERANCE))
    return [
        _envelope_row(names[0], input_name, detail + " (singular values)", sv_fast, f_sigma, f_sigma, taus,
                      bool(resolved.any()), "" if resolved.any() else vacuous),
        measured(prefix + "ns_projected_singular_values", input_name, f"{detail} (worst direction)",
                 abs(projected[i] - f_sigma[i]), taus[i],
                 f"direction {i + 1}; {int(resolved.sum())} of {len(taus)} directions resolved (f > tau), {sharp} "
                 f"with tau < {SHARP_SINGULAR_VALUE_TOLERANCE}" + ("" if resolved.any() else f"; {vacuous}"),
                 informative=bool(resolved.any())),
        _envelope_row(names[1], input_name, detail, sv_fast, lo, hi, taus, bool(np.any(lo > taus)),
                      band + ("" if np.any(lo > taus) else "; no claim: the band widened by tau reaches 0")),
    ]


@functools.lru_cache(maxsize=2)
def case_svd(case: MatrixCase):
    """``ortho_ref.svd`` of a case's matrix, kept for the case's next checks (same input,
    several schedules and dtypes)."""
    return ortho_ref.svd(case.matrix)


def kernel_suffix(gram: bool | None) -> str:
    """The row-detail suffix naming ``newton_schulz``'s ``gram`` setting: "" (automatic), "/gram", "/plain"."""
    return "" if gram is None else "/gram" if gram else "/plain"


def check_newton_schulz(case: MatrixCase, schedule: str, dtype: str, record: list | None = None,
                        gram: bool | None = None, device=None) -> list[CheckResult]:
    """(a) ``newton_schulz`` vs ``ns_map`` and (b) the singular-value spread vs the exact band
    (``compare_ns_output``), for a registered schedule computed in ``dtype``.

    ``record``: optional list receiving (σ̂, uᵢᵀ X_fast vᵢ) for the singular-value map.
    ``gram``: ``newton_schulz``'s setting (None: its automatic choice; True / False name the
    kernel in the row's detail: "/gram", "/plain"). In float16 (``dtype="float16"``, float64 inputs)
    ``gram=True`` is judged as what it is, a Gram kernel (``form="gram"``) with ortho_fast's restarts
    (``ortho_fast.functional.newton_schulz.gram_restarts``); in float32 / float64 with the standard
    form's Frobenius tolerance, which it meets. ``device``: where ``newton_schulz`` runs (the
    float64 input is moved there, the result back; None: the CPU).
    """
    from ortho_fast.functional.newton_schulz import gram_restarts

    a = case.matrix
    # The reference uses the oracle's own transcription of the schedule; the fast side is
    # called by name, so a wrong entry in either registry shows up here too.
    sched = ortho_ref.SCHEDULES[schedule]
    table = ortho_ref.schedule(schedule)
    fast = ortho_fast.newton_schulz(
        torch.from_numpy(a).to(device or "cpu"), schedule, safety=sched.safety, eps=sched.eps,
        dtype=TORCH_DTYPES.get(dtype) or getattr(torch, dtype), gram=gram).cpu().to(torch.float64).numpy()
    gram_form = bool(gram) and dtype in PER_DIRECTION
    needs_svd = dtype in PER_DIRECTION or record is not None
    return compare_ns_output(fast, a, table, safety=sched.safety, eps=sched.eps, dtype=dtype,
                             input_name=case.name, detail=f"{schedule}/{dtype}{kernel_suffix(gram)}",
                             svd=case_svd(case) if needs_svd else None, record=record,
                             form="gram" if gram_form else "standard",
                             restarts=gram_restarts(len(table)) if gram_form else ())
