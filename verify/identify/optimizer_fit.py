"""Candidate scoring of ``identify_optimizer``: each field's candidates replayed through the float64
oracle (``ortho_ref.ns_map``, ``ortho_ref.muon.momentum_update``, ``decay_factor``) and ranked by
their residual against what the probe measured.

Every function returns a list of (residual, candidate, extra) sorted best first, the residual in units
of its tolerance where one is derived (``ortho_verify.tolerances``), so that the first entry is the
value, the second the runner-up and a value fits when its residual is at most 1.
"""

from __future__ import annotations

import math

import numpy as np

import ortho_ref
from ortho_verify import tolerances as tol
from ortho_verify.conventions import table_and_normalization

__all__ = ["SCALE_MODES", "fit_decay", "fit_eps", "fit_momentum_form", "fit_scale", "fit_schedule", "ns_prediction",
           "ns_tolerance_of",
           "schedule_candidates"]

#: adjust_lr modes tried, canonical names first (an alias with the same values is never preferred:
#: "shape_scaling" = "original", "unit_rms_norm" = "spectral_norm"; "spectral" = 5 × "match_rms_adamw").
SCALE_MODES = ("original", "spectral_norm", "match_rms_adamw", None, "spectral")

#: Relative error of a scale fit that still counts as the mode (a constant factor beyond it is an
#: ``extra_scale_factor``): the bfloat16 Newton–Schulz output's norm is within a few u = 2⁻⁸ of the
#: map's, so 2 % separates a rounding from a different mode (the modes' ratios on the probe shapes differ
#: by ≥ 18 %).
SCALE_TOLERANCE = 0.02


def schedule_candidates() -> list[tuple[str, np.ndarray, float, float]]:
    """(name, (T, 3) table, safety, eps) of every registered schedule with its own defaults."""
    out = []
    for name in ortho_ref.SCHEDULES:
        table, safety, eps = table_and_normalization(name, None, None, None)
        out.append((name, table, safety, eps))
    return out


def ns_prediction(u: np.ndarray, table, safety: float, eps: float, eps_mode: str = "add") -> np.ndarray:
    """``ortho_ref.ns_map`` of one (m, n) float64 input: the float64 Newton–Schulz output."""
    return ortho_ref.ns_map(u, table, safety=safety, eps=eps, eps_mode=eps_mode)


def _ns_tol(u, table, safety, eps, eps_mode, dtype) -> float:
    sigma = ortho_ref.normalized_singular_values(u, safety=safety, eps=eps, eps_mode=eps_mode)
    return tol.ns_tolerance(sigma, table, u.shape, dtype)


def fit_schedule(inputs, outputs, dtype: str = "bfloat16") -> list:
    """Schedules ranked by how well s·ns_map(U) reproduces the measured outputs, s fitted per shape
    (least squares): residual max over shapes of ‖O − s·P‖_F / (s·ns_tolerance in ``dtype``).
    Extra: {"scales": per-shape s, "errors": per-shape ‖O/s − P‖_F, "table", "safety", "eps"}."""
    ranked = []
    for name, table, safety, eps in schedule_candidates():
        scales, errors, ratios = [], [], []
        for u, o in zip(inputs, outputs):
            p = ns_prediction(u, table, safety, eps)
            s = float(np.vdot(o, p) / max(np.vdot(p, p), 1e-300))
            err = float(np.linalg.norm(o / s - p)) if s else math.inf
            scales.append(s)
            errors.append(err)
            ratios.append(err / _ns_tol(u, table, safety, eps, "add", dtype))
        ranked.append((max(ratios), name, {"scales": scales, "errors": errors, "table": table, "safety": safety,
                                           "eps": eps}))
    return sorted(ranked, key=lambda r: r[0])


def ns_dtype_of(inputs, errors, table, safety, eps) -> list:
    """Compute dtypes ranked finest first among those whose ``ns_tolerance`` covers every error
    (residual: max error / tolerance); float32 then bfloat16."""
    out = []
    for dtype in ("float32", "bfloat16"):
        ratio = max(e / _ns_tol(u, table, safety, eps, "add", dtype) for u, e in zip(inputs, errors))
        out.append((ratio, dtype, {}))
    fits = [r for r in out if r[0] <= 1]
    return fits + [r for r in out if r[0] > 1] if fits else sorted(out, key=lambda r: r[0])


def fit_scale(shapes, scales) -> list:
    """adjust_lr modes ranked by the residual of s(shape) = c·mode(shape), c fitted (geometric mean):
    max relative deviation / ``SCALE_TOLERANCE``; ties (equal residuals) go to c nearest 1.
    Extra: {"factor": c}."""
    ranked = []
    for rank, mode in enumerate(SCALE_MODES):
        ratios = np.array([s / ortho_ref.muon.lr_scale(mode, m, n) for (m, n), s in zip(shapes, scales)])
        if np.any(ratios <= 0):
            ranked.append((math.inf, mode, {"factor": math.nan}))
            continue
        c = float(np.exp(np.mean(np.log(ratios))))
        snapped = 1.0 if abs(c - 1) <= SCALE_TOLERANCE else float(f"{c:.3g}")
        resid = float(np.max(np.abs(ratios / snapped - 1))) / SCALE_TOLERANCE
        ranked.append((resid, mode, {"factor": snapped, "rank": (round(resid, 1), abs(math.log(snapped)), rank)}))
    return sorted(ranked, key=lambda r: r[2].get("rank", (math.inf,)))


def momentum_candidates(styles) -> list[tuple[str, dict]]:
    """(label, fields) of the momentum forms: per style, no Nesterov, the mix, and for EMA the
    full-gradient form U = G + μM_ema."""
    out = []
    for style in styles:
        out.append((f"{style}, no nesterov", dict(momentum_style=style, nesterov=False, nesterov_form="mix")))
        out.append((f"{style}, nesterov mix", dict(momentum_style=style, nesterov=True, nesterov_form="mix")))
        if style == "ema":
            out.append(("ema, nesterov full_grad (G + mu M)", dict(momentum_style=style, nesterov=True,
                                                                     nesterov_form="full_grad")))
    return out


def ns_inputs(fields: dict, grads, mu: float, weight_grads=None) -> list[np.ndarray]:
    """The Newton–Schulz inputs U of each step from a zero momentum under the momentum ``fields``;
    ``weight_grads``: an extra term added to each gradient (l2)."""
    m = np.zeros_like(grads[0])
    out = []
    for t, g in enumerate(grads):
        g = g if weight_grads is None else g + weight_grads[t]
        m, u = ortho_ref.muon.momentum_update(g, m, mu=mu, nesterov=fields["nesterov"],
                                              momentum_style=fields["momentum_style"],
                                              nesterov_form=fields["nesterov_form"])
        out.append(u)
    return out


def fit_momentum_form(grads, measured_last, styles, mu: float, schedule, dtype: str) -> list:
    """Momentum forms ranked by how well ns_map of their last-step U reproduces ``measured_last``
    (the last step's update divided by lr·s), ranked by ‖O − P‖_F; residual ‖O − P‖_F / ns_tolerance.
    Extra: the fields and "error" ‖O − P‖_F."""
    _, table, safety, eps = schedule
    ranked = []
    for label, fields in momentum_candidates(styles):
        u = ns_inputs(fields, grads, mu)[-1]
        p = ns_prediction(u, table, safety, eps)
        err = float(np.linalg.norm(measured_last - p))
        ranked.append((err / _ns_tol(u, table, safety, eps, "add", dtype), label, {**fields, "error": err}))
    return sorted(ranked, key=lambda r: r[2]["error"])


def fit_eps(us, outputs, schedule, dtype: str) -> list:
    """(eps, eps_mode) ranked by how well ns_map reproduces outputs of inputs whose norm is near eps:
    residual max over probes of ‖O − P‖_F / ns_tolerance. Extra: {"eps", "eps_mode"}."""
    _, table, safety, default_eps = schedule
    ranked = []
    for eps in sorted({default_eps, 1e-6, 1e-7, 1e-8}, reverse=True):
        for mode in ("add", "clamp"):
            ratio = 0.0
            for u, o in zip(us, outputs):
                p = ns_prediction(u, table, safety, eps, mode)
                ratio = max(ratio, float(np.linalg.norm(o - p)) / max(_ns_tol(u, table, safety, eps, mode, dtype),
                                                                      1e-300))
            ranked.append((ratio, (eps, mode), {"eps": eps, "eps_mode": mode, "default": eps == default_eps}))
    return sorted(ranked, key=lambda r: (round(r[0], 2), not r[2]["default"]))


def fit_decay(w0, w1, *, lr: float, wd: float, scale: float, l2, dtype: str) -> list:
    """Weight-decay styles ranked by ‖W1 − prediction‖_F / tolerance after a zero-gradient step: W0·d
    for the decoupled styles (``weight_decay_tolerance``), for "l2" ``l2`` = (W0 − lr·s·ns_map(U(wd·W0)),
    lr·s·ns_tolerance of that U), the tolerance then adding the Newton–Schulz one. Extra: {"factor": d}."""
    bound = tol.weight_decay_tolerance(float(np.linalg.norm(w0)), dtype)
    ranked = []
    for style in ortho_ref.muon.WEIGHT_DECAY_STYLES:
        d = ortho_ref.muon.decay_factor(style, lr=lr, weight_decay=wd, scale=scale)
        pred, extra = l2 if style == "l2" else (d * w0, 0.0)
        err = float(np.linalg.norm(w1 - pred))
        ranked.append((err / (bound + extra), style, {"factor": d, "error": err}))
    return sorted(ranked, key=lambda r: r[2]["error"])


def ns_tolerance_of(u, schedule, dtype: str, eps_mode: str = "add") -> float:
    """``tolerances.ns_tolerance`` of the input ``u`` under ``schedule`` = (name, table, safety, eps)."""
    _, table, safety, eps = schedule
    return _ns_tol(u, table, safety, eps, eps_mode, dtype)
