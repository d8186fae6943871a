"""Muon pipeline stages in ``identify_optimizer``: MuonEq (``row_equilibration``), Muon+
(``renormalize``) and NorMuon's side (``normuon_dim``) recovered from the first step of the schedule
probe, by replaying each combination through ``ortho_ref.muon.muon_pipeline_step``.

At the first step from a zero state NorMuon's β₂ cancels (the rescale restores the norm), so the
step shows the side it normalizes but not β₂; β₂ is read from the state (``optimizer._normuon_stage``).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

import ortho_ref

from . import optimizer_fit as fit

__all__ = ["STAGE_COMBINATIONS", "fit_stages", "stage_fields"]

#: (row_equilibration, renormalize, normuon_dim or None) tried; all off is plain Muon.
STAGE_COMBINATIONS = tuple(itertools.product((False, True, "column"), (False, True),
                                             (None, "row", "column", "by_shape")))


def stage_fields(combo) -> dict:
    """The MuonConventions fields of a combination (NorMuon's β₂ left to the state)."""
    eq, renorm, dim = combo
    out = dict(row_equilibration=eq, renormalize=renorm)
    if dim is not None:
        out.update(normuon_dim=dim)
    return out


def _predictions(grads, combo, schedule, eps_mode, form, mu):
    _, table, safety, eps = schedule
    eq, renorm, dim = combo
    out = []
    for g in grads:
        step = ortho_ref.muon.muon_pipeline_step(
            np.zeros_like(g), g, np.zeros_like(g), lr=1.0, mu=mu, nesterov=form["nesterov"],
            momentum_style=form.get("momentum_style", "ema"), nesterov_form=form["nesterov_form"], coefficients=table,
            bias_correction=form.get("bias_correction", False), step=1,
            safety=safety, eps=eps, eps_mode=eps_mode, adjust_lr=None, row_equilibration=eq, renormalize=renorm,
            normuon_beta2=None if dim is None else 0.9, normuon_dim=dim or "row")
        out.append(step.update)
    return out


def _scaled_error(outputs, preds, shapes_of, shapes, scales=None):
    """(relative Frobenius error, per-shape s): s fitted per shape (least squares) unless given."""
    num = den = 0.0
    fitted = []
    for i, shape in enumerate(shapes):
        idx = [j for j, s in enumerate(shapes_of) if s == shape]
        s = scales[i] if scales is not None else sum(float(np.vdot(outputs[j], preds[j])) for j in idx) / max(
            sum(float(np.vdot(preds[j], preds[j])) for j in idx), 1e-300)
        fitted.append(s)
        num += sum(float(np.linalg.norm(outputs[j] - s * preds[j]) ** 2) for j in idx)
        den += sum(float(np.linalg.norm(outputs[j]) ** 2) for j in idx)
    return math.sqrt(num / max(den, 1e-300)), fitted


def fit_stages(grads, outputs, shapes_of, shapes, schedules, eps_mode, form, mu, declared_factor=None):
    """The stage combination, schedule and adjust_lr mode that best reproduce the first step.

    ``grads`` / ``outputs`` (the update −W₁/lr) per matrix, ``shapes_of`` each one's shape, ``shapes``
    the distinct shapes; ``schedules``: candidates (name, table, safety, eps), the first the plain
    identification's. The combination is ranked with a free scale per shape under the first schedule;
    the mode is read from that scale (``fit_scale``, c = 1 or ``declared_factor``), then the schedules
    are ranked under the combination with the mode's scale fixed. Returns (relative error of the best,
    combination, schedule, scale ranking, relative error of plain Muon under the same procedure)."""
    ranked = []
    for combo in STAGE_COMBINATIONS:
        err, fitted = _scaled_error(outputs, _predictions(grads, combo, schedules[0], eps_mode, form, mu), shapes_of,
                                    shapes)
        ranked.append((err, combo, fitted))
    ranked.sort(key=lambda r: r[0])
    plain = next(r for r in ranked if r[1] == (False, False, None))
    _, combo, fitted = ranked[0]
    scales = fit.fit_scale(shapes, fitted, declared=declared_factor)
    mode, c = scales[0][1], scales[0][2]["factor"]
    fixed = [ortho_ref.muon.lr_scale(mode, *sh) * c for sh in shapes]
    best = None
    for schedule in schedules:
        err, _ = _scaled_error(outputs, _predictions(grads, combo, schedule, eps_mode, form, mu), shapes_of, shapes,
                               fixed)
        if best is None or err < best[0]:
            best = (err, schedule)
    return best[0], combo, best[1], scales, plain[0]
