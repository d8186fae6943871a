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

from .. import tolerances as tol
from ..conventions import table_and_normalization

__all__ = ["SCALE_MODES", "fit_decay", "fit_eps", "fit_momentum_form", "fit_scale", "fit_schedule",
           "fit_schedule_directions", "ns_prediction",
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


#: Safety factors tried beside each schedule's own: the values in use (none, the Polar Express paper's
#: 1.01, its reference code's 1.02). A schedule found with another safety than its registered one is
#: reported as a difference, never as a pass.
SAFETY_CANDIDATES = (1.0, 1.01, 1.02)


def schedule_candidates() -> list[tuple[str, np.ndarray, float, float]]:
    """(name, (T, 3) table, safety, eps) of every registered schedule with its own defaults, then with
    each other safety of ``SAFETY_CANDIDATES`` (name "NAME@safety=S")."""
    out, variants = [], []
    for name in ortho_ref.SCHEDULES:
        table, safety, eps = table_and_normalization(name, None, None, None)
        out.append((name, table, safety, eps))
        variants += [(f"{name}@safety={s}", table, s, eps) for s in SAFETY_CANDIDATES if s != safety]
    return out + variants


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


def _directions(u, table, safety, eps):
    """(left vectors (m, k), right (n, k), f(σ̂) (k,), σ̂ (k,)) of one input under a schedule."""
    left, _, right_t = np.linalg.svd(u, full_matrices=False)
    sigma = ortho_ref.normalized_singular_values(u, safety=safety, eps=eps)
    return left, right_t.T, ortho_ref.ns_polynomial(sigma, table), sigma


def fit_schedule_directions(groups, shapes, declared_factor: float | None = None, dtype: str = "bfloat16") -> list:
    """Schedules ranked by the systematic part of the per-direction deviation, each with its own
    adjust_lr mode. For each shape, J inputs Uⱼ with the same spectrum: pⱼᵢ = uᵢⱼᵀOⱼvᵢⱼ (Uⱼ's exact
    triplets); the lr multiplier s per shape is fitted (least squares of p against f(σ̂)) only to pick
    the mode (``fit_scale``), and the deviations dᵢⱼ = pᵢⱼ/s − f(σ̂ᵢ) use the mode's s (c = 1 or the
    declared factor: a wrong table cannot hide in a free factor). Ranked by the RMS over directions of
    the mean over j (rounding averages out as 1/√J, a wrong map does not). Residual: max over
    directions of |mean_j dᵢⱼ| / τᵢ, τᵢ the per-direction tolerance of one matrix in ``dtype``
    (``tolerances.ns_singular_value_tolerances``). ``groups``: per shape a list of (U, O) pairs.
    Extra: {"rms", "worst": max_ij |dᵢⱼ| / τᵢ in float32 and bfloat16, "scales": fitted s per shape,
    "scale_ranking": ``fit_scale``'s list, "table", "safety", "eps"}."""
    ranked = []
    for name, table, safety, eps in schedule_candidates():
        projected, fitted = [], []
        for pairs in groups:
            rows = []
            for u, o in pairs:
                left, right, f, sigma = _directions(u, table, safety, eps)
                rows.append((np.einsum("pi,pq,qi->i", left, o, right), f, sigma, u.shape))
            projected.append(rows)
            fitted.append(sum(float(np.dot(p, f)) for p, f, _, _ in rows) / max(sum(float(np.dot(f, f))
                                                                                   for _, f, _, _ in rows), 1e-300))
        scale_ranking = fit_scale(shapes, fitted, declared=declared_factor)
        mode, c = scale_ranking[0][1], scale_ranking[0][2]["factor"]
        squares, count, ratio, worst = 0.0, 0, 0.0, {"float32": 0.0, "bfloat16": 0.0}
        for rows, shape in zip(projected, shapes):
            s = ortho_ref.muon.lr_scale(mode, *shape) * c
            devs = np.array([p / s - f for p, f, _, _ in rows])
            taus = {d: tol.ns_singular_value_tolerances(rows[0][2], table, rows[0][3], d) for d in worst}
            mean = devs.mean(axis=0)
            squares += float(np.sum(mean ** 2))
            count += mean.size
            ratio = max(ratio, float(np.max(np.abs(mean) / taus[dtype])))
            for d in worst:
                worst[d] = max(worst[d], float(np.max(np.abs(devs) / taus[d])))
        ranked.append((ratio, name, {"rms": math.sqrt(squares / count), "worst": worst, "scales": fitted,
                                     "scale_ranking": scale_ranking, "table": table, "safety": safety, "eps": eps}))
    return sorted(ranked, key=lambda r: r[2]["rms"])


def fit_scale(shapes, scales, declared: float | None = None) -> list:
    """adjust_lr modes ranked by the residual of s(shape) = c·mode(shape): c is 1, or ``declared``
    (the signature's ``extra_scale_factor`` default) — never a free fit, so a wrong table cannot hide
    in it; residual max relative deviation / ``SCALE_TOLERANCE``. Extra: {"factor": c, "fitted": the
    geometric-mean c that would fit best}."""
    c = 1.0 if declared is None else float(declared)
    ranked = []
    for rank, mode in enumerate(SCALE_MODES):
        ratios = np.array([s / ortho_ref.muon.lr_scale(mode, m, n) for (m, n), s in zip(shapes, scales)])
        if np.any(ratios <= 0):
            ranked.append((math.inf, mode, {"factor": c, "fitted": math.nan, "rank": (math.inf, rank)}))
            continue
        resid = float(np.max(np.abs(ratios / c - 1))) / SCALE_TOLERANCE
        ranked.append((resid, mode, {"factor": c, "fitted": float(np.exp(np.mean(np.log(ratios)))),
                                     "rank": (round(resid, 1), rank)}))
    return sorted(ranked, key=lambda r: r[2]["rank"])


def momentum_candidates(styles) -> list[tuple[str, dict]]:
    """(label, fields) of the momentum forms: per style, no Nesterov, the mix, and for EMA the
    full-gradient form U = G + μM_ema and the bias-corrected mix (optax ``contrib.muon``:
    U_t = μ·M_t/(1−μ^(t+1)) + (1−μ)·G_t/(1−μ^t), ``bias_correction``). The bias-corrected form without
    Nesterov, U_t = M_t/(1−μ^t), is left out: it is the plain EMA's direction, scaled, which the
    normalization removes (only eps could tell them apart)."""
    out = []
    for style in styles:
        out.append((f"{style}, no nesterov", dict(momentum_style=style, nesterov=False, nesterov_form="mix")))
        out.append((f"{style}, nesterov mix", dict(momentum_style=style, nesterov=True, nesterov_form="mix")))
        if style == "ema":
            out.append(("ema, nesterov full_grad (G + mu M)", dict(momentum_style=style, nesterov=True,
                                                                     nesterov_form="full_grad")))
            out.append(("ema, nesterov mix, bias-corrected", dict(momentum_style=style, nesterov=True,
                                                                    nesterov_form="mix", bias_correction=True)))
    return out


def ns_inputs(fields: dict, grads, mu: float, weight_grads=None) -> list[np.ndarray]:
    """The Newton–Schulz inputs U of each step from a zero momentum under the momentum ``fields``
    (``bias_correction`` with the 1-based step index of each); ``weight_grads``: an extra term added
    to each gradient (l2)."""
    m = np.zeros_like(grads[0])
    out = []
    for t, g in enumerate(grads):
        g = g if weight_grads is None else g + weight_grads[t]
        m, u = ortho_ref.muon.momentum_update(g, m, mu=mu, nesterov=fields["nesterov"],
                                              momentum_style=fields["momentum_style"],
                                              nesterov_form=fields["nesterov_form"],
                                              bias_correction=fields.get("bias_correction", False), step=t + 1)
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


def fit_eps(us, outputs, schedule, dtype: str, predict=None) -> list:
    """(eps, eps_mode) ranked by how well ns_map reproduces outputs of inputs whose norm is near eps,
    by the Frobenius error summed over the probes; residual: max over probes of ‖O − P‖_F /
    ns_tolerance. eps 0 (an exact normalization, or an eps far below the probes' norms) is one
    candidate, labelled "clamp". ``predict(i, eps, mode)``: the prediction of probe i when the step is
    more than ns_map (pipeline stages). Extra: {"eps", "eps_mode", "default", "error"}."""
    _, table, safety, default_eps = schedule
    ranked = []
    for eps in sorted({default_eps, 1e-6, 1e-7, 1e-8, 0.0}, reverse=True):
        for mode in ("add", "clamp") if eps else ("clamp",):
            ratio, err = 0.0, 0.0
            for i, (u, o) in enumerate(zip(us, outputs)):
                p = ns_prediction(u, table, safety, eps, mode) if predict is None else predict(i, eps, mode)
                e = float(np.linalg.norm(o - p))
                err += e
                ratio = max(ratio, e / max(_ns_tol(u, table, safety, max(eps, 1e-30), mode, dtype), 1e-300))
            ranked.append((ratio, (eps, mode), {"eps": eps, "eps_mode": mode, "default": eps == default_eps,
                                                "error": err}))
    return sorted(ranked, key=lambda r: r[2]["error"])


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
