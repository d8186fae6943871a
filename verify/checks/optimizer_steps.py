"""One step of ``check_optimizer`` compared with the oracle: the Muon update and momentum
(``ortho_ref.muon_step`` / the pipeline oracle), the Dion step (``ortho_ref.dion_step``), the
weight decay isolated by a zero gradient (``muon_weight_decay``) and the buffer rows
(``gradient_unchanged``, ``gradient_kept``, ``state_not_aliased``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

import ortho_ref

from .. import tolerances as tol
from ..conventions import DionConventions, MuonConventions, coarser_dtype, dtype_name, table_and_normalization
from ..inputs.arrays import as_float64 as _as_f64
from ..report.results import measured, no_claim
from . import error_feedback
from .diagnoses import momentum_cause, momentum_form_candidates, with_cause
from .dion import dion_reference_rows, never_transposed_dion_step
from .newton_schulz import compare_ns_output

__all__ = ["DECAY_PROBE_SHAPE", "buffer_rows", "decay_probe_rows", "dion_step_rows", "flat_state", "has_state",
           "muon_step_rows", "state_value"]

#: Shape of the parameter that isolates the weight decay (``decay_probe_rows``): tall with m/n = 4,
#: so the update's lr multiplier s is far from 1 for every adjust_lr mode but None (original and
#: spectral_norm 2, match_rms_adamw 1.39, spectral 6.9) and decay with s·lr differs from lr.
DECAY_PROBE_SHAPE = (48, 12)


def _state_array(v: torch.Tensor) -> np.ndarray:
    """A state tensor as float64, leading singleton dimensions of a stack of one matrix dropped
    ((1, m, n) -> (m, n): nanochat keeps its buffers stacked per shape group)."""
    a = _as_f64(v)
    while a.ndim > 2 and a.shape[0] == 1:
        a = a[0]
    return a


def flat_state(state) -> dict:
    """The tensors of ``optimizer.state[p]`` as float64 arrays (``_state_array``), by key: a top-level
    key as itself, a key inside nested dicts as the tuple of keys on its path (e.g.
    ``("muon", "momentum_buffer")``)."""
    out = {}

    def walk(d, path):
        for k, v in d.items():
            if isinstance(v, torch.Tensor):
                out[path + (k,) if path else k] = _state_array(v)
            elif isinstance(v, dict):
                walk(v, path + (k,))
    walk(state or {}, ())
    return out


def _lookup(state, key):
    path = key if isinstance(key, tuple) else (key,)
    node = state
    for k in path:
        if not isinstance(node, dict) or k not in node:
            return None
        node = node[k]
    return node if isinstance(node, torch.Tensor) else None


def has_state(opt, p, key) -> bool:
    """Whether ``opt.state[p]`` holds a tensor at ``key`` (a key, or a tuple path into nested dicts)."""
    return _lookup(opt.state.get(p, {}), key) is not None


def state_value(opt, p, key) -> np.ndarray:
    """``opt.state[p]`` at ``key`` (a key or a tuple path) as a float64 array.
    Raises: ValueError naming the conventions' state key when it is absent."""
    value = _lookup(opt.state.get(p, {}), key)
    if value is None:
        keys = sorted(map(str, flat_state(opt.state.get(p, {}))))
        raise ValueError(f"conventions: optimizer.state[p] has no {key!r} (keys: {keys}); set the conventions' "
                         "state key")
    return _state_array(value)


def _tensors(state, path=()):
    for k, v in (state or {}).items():
        if isinstance(v, torch.Tensor):
            yield path + (k,), v
        elif isinstance(v, dict):
            yield from _tensors(v, path + (k,))


def buffer_rows(opt, p, grad: np.ndarray, name: str) -> list:
    """``gradient_unchanged``: max |p.grad − G| after the step, G the gradient given (float64
    copy; tolerance 0: an optimizer that writes into the gradient, e.g. a Nesterov mix done with
    ``grad.lerp_``, corrupts what gradient accumulation and clipping see next). ``gradient_kept``:
    whether p.grad is still there (an optimizer that consumes the gradient, ``p.grad = None``, is
    reported by this row, kind "side effect", not as an in-place write; accepted by
    ``allow_side_effects={"grad_consumed"}``). ``state_not_aliased``: the number of state tensors
    (nested dicts included) sharing storage with the parameter or its gradient (tolerance 0)."""
    after = p.grad
    if after is None:
        rows = [no_claim("gradient_unchanged", name, "p.grad after the step equals the gradient given",
                         "not compared: p.grad was removed (row gradient_kept)", extra={"supplementary": True}),
                with_cause(measured("gradient_kept", name, "p.grad is not None after the step", 1.0, 0.0,
                                    "p.grad is None after the step"),
                           "the optimizer consumed the gradient (p.grad set to None in its step); accept it with "
                           "allow_side_effects={'grad_consumed'}")]
        rows[1] = dataclasses.replace(rows[1], kind="side effect")
    else:
        err = math.inf if tuple(after.shape) != grad.shape else float(np.max(np.abs(_as_f64(after) - grad)))
        rows = [measured("gradient_unchanged", name, "p.grad after the step equals the gradient given", err, 0.0,
                         "p.grad was reshaped" if math.isinf(err) else "")]
        if not rows[0].passed:
            rows[0] = with_cause(rows[0], "the optimizer modified the gradient in place (not part of the algorithm)")
    ptrs = {p.untyped_storage().data_ptr()} | ({after.untyped_storage().data_ptr()} if after is not None else set())
    shared = sorted("/".join(map(str, k)) for k, v in _tensors(opt.state.get(p, {}))
                    if v.numel() and v.untyped_storage().data_ptr() in ptrs)
    rows.append(measured("state_not_aliased", name, "no state tensor shares storage with p or p.grad",
                         float(len(shared)), 0.0, f"aliased: {shared}" if shared else ""))
    return rows


def decay_probe_rows(opt, p, conv: MuonConventions, before, *, lr: float, wd: float, pdt: str, name: str) -> list:
    """``muon_weight_decay`` of one step of the decay probe: a parameter given a zero gradient from a
    zero momentum, so the Newton–Schulz input is 0 and the step is the decay alone (declared style
    other than "l2"): error ‖W_new − d·W‖_F against ``tolerances.weight_decay_tolerance``, d =
    ``ortho_ref.muon.decay_factor`` of the declared style with the probe's lr multiplier. The row
    claims only where its power ``tolerances.weight_decay_power`` (the smallest decay error it
    detects, in units of lr·wd) is at most ``WEIGHT_DECAY_POWER_LIMIT`` (float32 / float64
    parameters; not bfloat16, whose rounding is larger than a decay of lr·wd = 0.2 %). With the
    "l2" style the decay enters the Newton–Schulz input: the probe's step is then compared as any
    other (``muon_step_rows``: U = wd·W mixed by the momentum)."""
    w_prev, _ = before
    power = tol.weight_decay_power(lr, wd, pdt)
    detail = f"W_new = d W after a zero gradient (decay alone; power {power:.2g} of lr*wd)"
    if power > tol.WEIGHT_DECAY_POWER_LIMIT:
        return [no_claim("muon_weight_decay", name, detail,
                         f"not compared: in {pdt} the row detects only decay errors of {power:.2g} x lr*wd "
                         f"(limit {tol.WEIGHT_DECAY_POWER_LIMIT}); the float32 run judges the decay",
                         extra={"supplementary": True})]
    scale = ortho_ref.muon.lr_scale(conv.adjust_lr, *w_prev.shape) * conv.extra_scale_factor
    factor = ortho_ref.muon.decay_factor(conv.weight_decay_style, lr=lr, weight_decay=wd, scale=scale)
    w_new = _as_f64(p)
    norm = float(np.linalg.norm(w_prev))
    err = float(np.linalg.norm(w_new - factor * w_prev)) if np.all(np.isfinite(w_new)) else math.inf
    row = measured("muon_weight_decay", name, detail, err, tol.weight_decay_tolerance(norm, pdt),
                   f"declared {conv.weight_decay_style!r}: d = {factor:.6g}")
    if row.passed:
        return [row]
    if not np.all(np.isfinite(w_new)):
        return [with_cause(row, "a zero gradient gives NaN or Inf (Newton-Schulz of a zero matrix divides by 0)")]
    found = float(np.vdot(w_new, w_prev) / max(norm ** 2, 1e-300))
    resid = float(np.linalg.norm(w_new - found * w_prev)) / max(norm, 1e-300)
    if resid > 4 * (tol.unit_roundoff(pdt) + tol.U64) * 4:
        return [with_cause(row, f"with a zero gradient the step is not a decay of W (the weight moves off W by "
                                f"{resid:.2g} of |W|): the decay is coupled into the gradient (l2) or the step "
                                "moves W without a gradient")]
    styles = {s: ortho_ref.muon.decay_factor(s, lr=lr, weight_decay=wd, scale=scale)
              for s in ortho_ref.muon.WEIGHT_DECAY_STYLES}
    near = min(styles, key=lambda s: abs(styles[s] - found))
    units = (1 - found) / (lr * wd) if lr * wd else math.inf
    what = (f"the weight_decay_style {near!r} (d = {styles[near]:.6g})" if abs(styles[near] - found) <= 4 * (
        tol.unit_roundoff(pdt) + tol.U64) else "no weight_decay_style")
    return [with_cause(row, f"the weight decay is wrong: with a zero gradient W is multiplied by {found:.6g} = "
                            f"1 - {units:.3g} lr*wd where the declared {conv.weight_decay_style!r} gives {factor:.6g}; "
                            f"it matches {what}")]


def _shape_row(name: str, key: str, value: np.ndarray, expected: tuple) -> list:
    """A failing ``optimizer_state`` row when a state buffer has an unexpected shape (empty if it
    has the expected one): the step is then not compared, and the check goes on."""
    if tuple(np.shape(value)) == tuple(expected):
        return []
    return [with_cause(measured("optimizer_state", name, f"state[{key!r}] shape", math.inf, 0.0,
                                f"state of an unexpected shape: {tuple(np.shape(value))}, expected {tuple(expected)}"),
                       f"state of an unexpected shape: state[{key!r}] is {tuple(np.shape(value))} where the declared "
                       f"conventions give {tuple(expected)} (another layout or orientation than declared)")]


#: The decayed weight the update is read against, per ``weight_decay_style`` (``ortho_ref.muon.decay_factor``).
DECAYED_WEIGHT = {"decoupled": "W(1-lr wd)", "adjusted_lr": "W(1-lr s wd)", "independent": "W(1-wd)",
                  "l2": "W (wd W in the gradient)"}


def muon_step_rows(opt, p, conv: MuonConventions, before, grad, tracked, t, *, lr, mu, wd, pdt, name):
    w_prev, state_prev = before
    key = conv.momentum_state_key
    m_prev = state_prev.get(key) if key else None
    if m_prev is None:
        m_prev = np.zeros_like(w_prev) if tracked is None else tracked
    if key:
        m_after = state_value(opt, p, key)
        bad = _shape_row(name, key, m_after, w_prev.shape) + _shape_row(name, key, m_prev, w_prev.shape)
        if bad:
            return bad, None
    if conv.has_stages:  # MuonEq / Muon+ / NorMuon: the pipeline oracle (ortho_verify.checks.stages)
        from .stages import StepInputs, stage_step_rows

        vkey = conv.normuon_state_key if conv.normuon_beta2 is not None else None
        v_prev = state_prev.get(vkey) if vkey else None
        if vkey and not has_state(opt, p, vkey):
            return [with_cause(measured("optimizer_state", name, f"state[{vkey!r}]", math.inf, 0.0,
                                        "NorMuon's second moment is missing"),
                               f"no state[{vkey!r}]: NorMuon is declared (normuon_beta2 = {conv.normuon_beta2}) "
                               "but the optimizer keeps no second moment under that key (NorMuon not run, or "
                               "another state key)")], None
        after = (_as_f64(p), m_after if key else None, state_value(opt, p, vkey) if vkey else None)
        return stage_step_rows(conv, StepInputs(w_prev, grad, m_prev, v_prev), after, lr=lr, mu=mu, wd=wd,
                               dtype=coarser_dtype(dtype_name(conv.ns_dtype, argument="conventions.ns_dtype"), pdt),
                               name=name, step=t + 1)
    table, safety, eps = table_and_normalization(conv.coefficients, conv.ns_steps, conv.safety, conv.eps)
    ref = ortho_ref.muon_step(w_prev, grad, m_prev, lr=lr, mu=mu, nesterov=conv.nesterov,
                              momentum_style=conv.momentum_style, coefficients=table, safety=safety, eps=eps,
                              eps_mode=conv.eps_mode, adjust_lr=conv.adjust_lr, weight_decay=wd,
                              extra_scale_factor=conv.extra_scale_factor,
                              cautious_weight_decay=conv.cautious_weight_decay, nesterov_form=conv.nesterov_form,
                              weight_decay_style=conv.weight_decay_style, bias_correction=conv.bias_correction,
                              step=t + 1)
    w_new = _as_f64(p)
    factor = ortho_ref.muon.decay_factor(conv.weight_decay_style, lr=lr, weight_decay=wd, scale=ref.lr_scale)
    step = lr * ref.lr_scale
    u = tol.unit_roundoff(pdt) + tol.U64
    ns_dt = coarser_dtype(dtype_name(conv.ns_dtype, argument="conventions.ns_dtype"), pdt)
    # cautious: the reference's mask; entries where O_ref is within the NS tolerance of 0 may differ
    if conv.cautious_weight_decay:
        decayed = w_prev - (1 - factor) * np.where(ref.update * w_prev >= 0, w_prev, 0.0)
        sigma_hat = ortho_ref.normalized_singular_values(ref.ns_input, safety=safety, eps=eps, eps_mode=conv.eps_mode)
        ns_tol = tol.ns_tolerance(sigma_hat, table, w_prev.shape, ns_dt)
        ambiguous = tol.cautious_weight_decay_tolerance(w_prev, ref.update, ns_tol, lr, wd) / step
    else:
        decayed, ambiguous = w_prev * factor, 0.0
    measured_update = (decayed - w_new) / step
    extra = 4 * u * (float(np.linalg.norm(w_prev)) + step * float(np.linalg.norm(ref.update))) / step + ambiguous
    rows = compare_ns_output(measured_update, ref.ns_input, table, safety=safety, eps=eps, eps_mode=conv.eps_mode,
                             dtype=ns_dt, input_name=name,
                             detail=f"update ({DECAYED_WEIGHT[conv.weight_decay_style]} - W_new)/(lr s), "
                                    f"s = {ref.lr_scale:.4g}", extra=extra,
                             prefix="muon_update/", lr_shape=w_prev.shape, form=conv.form,
                             restarts=tuple(conv.restarts))
    if not all(r.passed for r in rows) and np.all(np.isfinite(measured_update)):
        rows = [with_cause(r, _update_cause(conv, r, measured_update, ref.update, w_prev, grad, m_prev, t + 1,
                                            lr=lr, mu=mu, wd=wd, table=table, safety=safety, eps=eps))
                for r in rows]
    elif not np.all(np.isfinite(w_new)):
        rows = [with_cause(r, f"diverged at step {t + 1}: the weight has NaN or Inf") for r in rows]
    if key:
        g_seen = grad + wd * w_prev if conv.weight_decay_style == "l2" else grad  # the gradient the momentum takes
        m_tol = tol.momentum_tolerance(float(np.linalg.norm(g_seen)), float(np.linalg.norm(m_prev)), pdt)
        row = measured("muon_momentum", name, f"state[{key!r}]", np.linalg.norm(m_after - ref.momentum), m_tol)
        if not row.passed:
            row = with_cause(row, momentum_cause(m_after, g_seen, m_prev, mu=mu, declared=conv.momentum_style,
                                                 tolerance=m_tol))
        rows.append(row)
    return rows, ref.momentum


def _update_cause(conv: MuonConventions, row, measured_update, ref_update, w_prev, grad, m_prev, step, *, lr, mu, wd,
                  table, safety, eps) -> str:
    """One cause for a failing update, from a replay: each momentum form of
    ``momentum_form_candidates`` (at the 1-based ``step``, from the gradient the momentum takes:
    with the L2 term of a declared "l2" style) is run through the declared Newton–Schulz map and compared with
    the measured update; the form with the smallest residual is named when it explains the update
    (residual at most a tenth of the declared form's), else the row's own cause. Every row of a
    step gets the same answer (the replay does not depend on the row)."""
    base = float(np.linalg.norm(measured_update - ref_update))
    best = None
    g_seen = grad + wd * w_prev if conv.weight_decay_style == "l2" else grad
    for label, u in momentum_form_candidates(conv, g_seen, m_prev, mu=mu, table=table, safety=safety, eps=eps,
                                             step=step):
        alt = ortho_ref.ns_map(u, table, safety=safety, eps=eps, eps_mode=conv.eps_mode)
        resid = float(np.linalg.norm(measured_update - alt))
        if best is None or resid < best[0]:
            best = (resid, label)
    if best is not None and best[0] <= 0.1 * base:
        return (f"the update matches {best[1]} where nesterov={conv.nesterov}, momentum_style="
                f"{conv.momentum_style!r}{_declared_extras(conv)} is declared (replay residual "
                f"{best[0] / max(base, 1e-300):.2g} of the declared form's)")
    return row.cause


def _declared_extras(conv: MuonConventions) -> str:
    """The declared momentum conventions beyond Nesterov and the style, for a cause's wording."""
    extras = [f"nesterov_form={conv.nesterov_form!r}"] if conv.nesterov and conv.nesterov_form != "mix" else []
    extras += ["bias_correction=True"] if conv.bias_correction else []
    return "".join(f", {e}" for e in extras)


def _dion_reference(conv: DionConventions, w_prev, grad, m_prev, q_prev, *, lr, mu, wd):
    """The oracle's step for the declared conventions (orientation, QR method, right factor)."""
    opts = dict(lr=lr, mu=mu, weight_decay=wd, epsilon=conv.epsilon, power_iters=conv.power_iters,
                error_feedback=conv.error_feedback, qr_method=conv.qr_method, right_factor=conv.right_factor)
    m, n = w_prev.shape
    if conv.orientation == "never_transpose" and m < n:
        return never_transposed_dion_step(w_prev, grad, m_prev, q_prev, **opts), None
    rng = np.random.default_rng(0) if conv.qr_method == "randomized_cholesky_qr" else None
    sketches = None
    if rng is not None:  # the reference's own sketch, redrawn for the tolerance's κ(Y R_s⁻¹)
        k = ortho_ref.sketch_rows(q_prev.shape[1])
        rows = max(m, n)
        sketches = ([ortho_ref.gaussian_sketch(np.random.default_rng(0), k, rows)] * conv.power_iters if k < rows
                    else None)
    return ortho_ref.dion_step(w_prev, grad, m_prev, q_prev, rng=rng, **opts), sketches


def dion_step_rows(opt, p, conv: DionConventions, before, grad, tracked, t, *, lr, mu, wd, pdt, name):
    w_prev, state_prev = before
    m, n = w_prev.shape
    q_rows = n if conv.orientation == "never_transpose" else min(m, n)
    # ValueError if a key is absent
    after = {key: state_value(opt, p, key) for key in (conv.momentum_state_key, conv.q_state_key)}
    bad = _shape_row(name, conv.momentum_state_key, after[conv.momentum_state_key], (m, n))
    bad += _shape_row(name, conv.q_state_key, after[conv.q_state_key], (q_rows, after[conv.q_state_key].shape[-1]))
    if bad or t == 0:  # Q_0 is the optimizer's own random draw: observable only after the first step
        return bad, None
    m_prev, q_prev = state_prev[conv.momentum_state_key], state_prev[conv.q_state_key]
    m_dt, q_dt = (dtype_name(_lookup(opt.state[p], k).dtype, argument=f"optimizer.state[p][{k!r}]")
                  for k in (conv.momentum_state_key, conv.q_state_key))
    if conv.orthonormalize_dtype is not None:  # Y, its QR and P in that dtype: the coarser of it and the state's
        m_dt = coarser_dtype(m_dt, dtype_name(conv.orthonormalize_dtype, argument="conventions.orthonormalize_dtype"))
    ref, sketches = _dion_reference(conv, w_prev, grad, m_prev, q_prev, lr=lr, mu=mu, wd=wd)
    # B, P, R in the momentum's dtype (microsoft/dion's mixed precision): float32 state with
    # bfloat16 parameters keeps P determined; bfloat16 state does not (δ_P ≈ 0.9).
    bounds = tol.dion_variant_tolerances(ref, q_prev, lr=lr, mu=mu, weight=w_prev, dtype=m_dt, param_dtype=pdt,
                                         q_dtype=q_dt, error_feedback=conv.error_feedback, epsilon=conv.epsilon,
                                         power_iters=conv.power_iters, grad_norm=float(np.linalg.norm(grad)),
                                         qr_method=conv.qr_method, right_factor=conv.right_factor, sketches=sketches)
    w_new, m_new, q_new = _as_f64(p), after[conv.momentum_state_key], after[conv.q_state_key]
    detail = f"rank {q_prev.shape[1]}/{min(w_prev.shape)}/{pdt}" + (f" state {m_dt}" if m_dt != pdt else "")
    rows = dion_reference_rows(name, detail, ref, q_prev, w_prev, lr=lr, mu=mu, dtype=m_dt, bounds=bounds,
                               error_feedback=conv.error_feedback, weight=w_new, momentum=m_new, Q=q_new)
    # A comparison that was not made is said in the invariant rows' notes, not as a row of its own:
    # the invariants below are the evidence for such a step.
    note = "" if rows[0].claimed else f"reference not compared: {rows[0].note}"
    if conv.orientation == "never_transpose" and m < n:  # the invariants assume the min-side orientation
        return [r for r in rows if r.claimed], None
    invariants = error_feedback.observed_step_rows(
        name, detail, weight=w_prev, weight_new=w_new, momentum=m_prev, grad=grad, momentum_new=m_new, q_new=q_new,
        lr=lr, mu=mu, weight_decay=wd, dtype=coarser_dtype(pdt, m_dt, q_dt), error_feedback=conv.error_feedback,
        note=note)
    return [r for r in rows if r.claimed] + invariants, None
