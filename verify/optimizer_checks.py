"""``check_optimizer``: a Muon- or Dion-like optimizer checked step by step against the oracle
(``ortho_ref.muon_step`` / ``ortho_ref.dion_step``), from its own state before each step.

Public entry point: ``ortho_verify.check_optimizer`` (``ortho_verify.api`` re-exports it).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

import ortho_fast
import ortho_ref
from ortho_verify import error_feedback
from ortho_verify import tolerances as tol
from ortho_verify.arrays import as_float64 as _as_f64
from ortho_verify.checks.dion import dion_reference_rows, never_transposed_dion_step
from ortho_verify.checks.diagnoses import momentum_cause, momentum_form_candidates, with_cause
from ortho_verify.checks.newton_schulz import compare_ns_output
from ortho_verify.checks.optimizer_statistics import (MIN_STATISTICAL_MATRICES, STATISTICAL_MATRICES,
                                                      STATISTICAL_SHAPE, optimizer_mean_deviation, statistical_inputs)
from ortho_verify.devices import describe_device, device_label, resolve_device
from ortho_verify.conventions import (DION, ORTHO_MUON, TORCH_MUON, DionConventions, MuonConventions, coarser_dtype,
                                      dtype_name, table_and_normalization)
from ortho_verify.results import VerificationReport, accept_side_effects, measured, user_frame
from ortho_verify.spectra import matrix_with_spectrum

__all__ = ["DEFAULT_PARAM_DTYPES", "DEFAULT_SHAPES", "check_optimizer", "optimizer_inputs"]

#: Parameter shapes of ``check_optimizer``: tall, wide and square, each with a row count that
#: 4 does not divide (sharding bugs), small enough for a fast check.
DEFAULT_SHAPES = ((37, 16), (12, 29), (30, 30))

#: Parameter dtypes ``check_optimizer`` runs by default (``param_dtype=None``): float32, and
#: bfloat16, where optimizers commonly take another code path (in-place casts, buffers kept in
#: the parameter's dtype; e.g. a momentum buffer normalized in place only for bfloat16).
DEFAULT_PARAM_DTYPES = (torch.float32, torch.bfloat16)


def _default_conventions(optimizer):
    if optimizer is torch.optim.Muon:
        return TORCH_MUON
    if optimizer is ortho_fast.Muon:
        return ORTHO_MUON
    if optimizer is ortho_fast.Dion:
        return DION
    raise TypeError(f"conventions: required for {getattr(optimizer, '__name__', optimizer)!r} "
                    "(MuonConventions or DionConventions describing what it computes)")


def optimizer_inputs(shapes, steps: int, cond: float, seed: int) -> list[tuple[np.ndarray, list[np.ndarray]]]:
    """Per shape: initial weight N(0, 0.02²) and ``steps`` gradients with singular values
    geomspace(1, 1/cond) and Haar vectors (condition number ``cond``: bfloat16 tolerances stay sharp)."""
    rng = np.random.default_rng(seed)
    out = []
    for m, n in shapes:
        s = np.geomspace(1.0, 1.0 / cond, min(m, n))
        out.append((0.02 * rng.standard_normal((m, n)), [matrix_with_spectrum(s, m, n, rng) for _ in range(steps)]))
    return out


def _check_problem_arguments(shapes, cond) -> None:
    """``check_optimizer``'s ``shapes`` and ``cond``, before any work. Raises: ValueError naming the argument."""
    try:
        pairs = [tuple(s) for s in shapes]
    except TypeError:
        raise ValueError(f"shapes: expected a sequence of (m, n) pairs, got {shapes!r}") from None
    if not pairs:
        raise ValueError("shapes: expected at least one (m, n) pair, got none")
    for shape in pairs:
        if len(shape) != 2 or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 1 for d in shape):
            raise ValueError(f"shapes: expected (m, n) pairs of positive integers (one matrix parameter each), got "
                             f"{shape!r}")
    if isinstance(cond, bool) or not isinstance(cond, (int, float)) or not math.isfinite(cond) or cond < 1:
        raise ValueError(f"cond: expected a finite condition number >= 1 of the gradients, got {cond!r}")


def check_optimizer(optimizer, conventions=None, *, lr: float = 0.02, momentum: float = 0.95,
                    weight_decay: float = 0.1, steps: int = 3, param_dtype=None,
                    shapes=DEFAULT_SHAPES, cond: float = 10.0, seed: int = 0, allow_side_effects=(),
                    statistical_matrices: int | None = None, statistical_shape=None,
                    device=None) -> VerificationReport:
    """Check a Muon- or Dion-like optimizer step by step against the oracle.

    ``optimizer``: a class or factory called as ``optimizer(params, **{names[k]: v}, **extra_kwargs)``
    with the lr, momentum and weight_decay given here under the conventions' keyword names.
    ``conventions``: ``MuonConventions`` or ``DionConventions`` (default for torch.optim.Muon,
    ortho_fast.Muon and ortho_fast.Dion: ``TORCH_MUON``, ``ORTHO_MUON``, ``DION``).
    One parameter per shape in ``shapes``, ``steps`` steps with well-conditioned gradients
    (``cond``), in ``param_dtype`` (a torch dtype; default None: both ``DEFAULT_PARAM_DTYPES``,
    float32 and bfloat16, one run each, the bfloat16 rows' inputs named "... bfloat16 step t": an
    optimizer whose bfloat16 path differs, e.g. normalizes its momentum buffer in place, is
    exercised by default). After every step the gradient it was given must be unchanged
    (``gradient_unchanged``, tolerance 0: the algorithm reads G, it does not write it) and no state
    tensor may share storage with the parameter or its gradient (``state_not_aliased``); every
    buffer the conventions declare is compared with the oracle's (below). Each step is compared from the optimizer's own state before it:
    Muon: the update O = (W(1 − lr·wd) − W_new)/(lr·s) against ns_map(U) of ``ortho_ref.muon_step``
    (``compare_ns_output`` in the coarser of ns_dtype and param_dtype, with the weight's rounding
    as extra allowance; checks ``muon_update/...``) and the momentum buffer (``muon_momentum``);
    Dion (from step 2: Q_0 is the optimizer's own draw): weight, momentum and Q against
    ``ortho_ref.dion_step`` (``dion_vs_reference``, ``ortho_verify.tolerances.dion_variant_tolerances``
    with B, P, R in the momentum state's dtype, as microsoft/dion's mixed precision) where P is
    determined by B in that dtype — not with bfloat16 state (δ_P ≈ 0.9), where the step is left
    out and said so in the notes — and at every step the invariants that need no P
    (``ortho_verify.error_feedback.observed_step_rows``: ``dion_update_structure``,
    ``dion_momentum_split``).
    Kinds of failure (``ortho_verify.results.FAILURE_KINDS``, counted apart in ``report.kinds``
    and named in the verdict): "wrong math" (update, state), "side effect" (``gradient_unchanged``,
    ``state_not_aliased``), "unsupported": an exception from the optimizer (its constructor or a
    step) is not raised out of the check but becomes a failing ``optimizer_runs`` row naming the
    exception and the last traceback frame in the user's code (``ortho_verify.results.user_frame``);
    that dtype's run stops there and the other dtypes still run.
    ``allow_side_effects``: names of ``ortho_verify.results.SIDE_EFFECTS`` ("grad_mutated",
    "input_mutated", "state_aliased") accepted explicitly: their rows make no claim and say so.
    ``statistical_matrices``: J >= 8, or None (default: ``STATISTICAL_MATRICES`` where the coarser of
    the parameters' and the declared Newton–Schulz dtype is bfloat16 / float16 — with both default
    parameter dtypes in the bfloat16 run only — else none), adds J parameters of ``statistical_shape`` (default
    ``STATISTICAL_SHAPE``, tall) to the same optimizer and the row ``optimizer_mean_deviation``:
    the per-direction mean over the J matrices of the first step's measured update against the
    declared one (``ortho_verify.checks.statistical``, false alarm <= 1e-6 per row;
    docs/verification.md, "Statistical rows of check_optimizer"); 0 turns it off.
    ``device``: where the parameters live (torch device or name; default None: "cpu"); they are
    built on the CPU in float64, rounded to ``param_dtype`` and moved.
    Returns: ``VerificationReport`` (``status`` passed / failed / inconclusive); each failure
    carries the initial weight and gradients.
    Raises: TypeError without conventions for an unknown class or for a dtype outside float64 /
    float32 / bfloat16 / float16; ValueError for steps < 1 (Dion: < 2), lr <= 0, ``shapes`` not a
    non-empty sequence of (m, n) pairs of positive integers, ``cond`` not a finite number >= 1, an
    unknown name in ``allow_side_effects``, statistical_matrices outside {0} ∪ [8, ∞), a CUDA
    ``device`` without CUDA, or when the state lacks a declared key (after the first step).
    """
    _check_problem_arguments(shapes, cond)
    conventions = _default_conventions(optimizer) if conventions is None else conventions
    if not isinstance(conventions, (MuonConventions, DionConventions)):
        raise TypeError(f"conventions: expected MuonConventions or DionConventions, got {type(conventions).__name__}")
    first = 2 if isinstance(conventions, DionConventions) else 1  # Dion: Q_0 is observed after step 1
    if not isinstance(steps, int) or steps < first:
        raise ValueError(f"steps: expected an integer >= {first}, got {steps!r}")
    if not lr > 0:
        raise ValueError(f"lr: expected > 0 (the update is recovered by dividing by lr), got {lr!r}")
    dtypes = DEFAULT_PARAM_DTYPES if param_dtype is None else (param_dtype,)
    for dt in dtypes:
        dtype_name(dt, argument="param_dtype")  # TypeError before any work
    accept_side_effects([], allow_side_effects)  # ValueError naming allow_side_effects
    if statistical_matrices is not None and (isinstance(statistical_matrices, bool) or not isinstance(
            statistical_matrices, int) or (statistical_matrices != 0 and statistical_matrices < MIN_STATISTICAL_MATRICES)):
        raise ValueError(f"statistical_matrices: expected None, 0 or an integer >= {MIN_STATISTICAL_MATRICES}, "
                         f"got {statistical_matrices!r}")
    stat_shape = STATISTICAL_SHAPE if statistical_shape is None else tuple(statistical_shape)
    if len(stat_shape) != 2 or not all(isinstance(d, int) and d >= 2 for d in stat_shape):
        raise ValueError(f"statistical_shape: expected (m, n) with m, n >= 2, got {statistical_shape!r}")
    device = resolve_device(device)
    target = getattr(optimizer, "func", optimizer)  # functools.partial: the class it wraps
    subject = f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', type(target).__name__)}"
    report = VerificationReport(f"{subject} ({type(conventions).__name__})", [], {},
                                device_label(describe_device(device)))
    for dt in dtypes:
        suffix = "" if dt == torch.float32 or len(dtypes) == 1 else f" {dtype_name(dt)}"
        count = statistical_matrices
        if count is None:  # on where one step's window is wide: a bfloat16 / float16 step or kernel; with
            # both default dtypes only in the bfloat16 run (one row per call: it costs about 0.5 s)
            ns = dtype_name(getattr(conventions, "ns_dtype", dt), argument="conventions.ns_dtype")
            wide = coarser_dtype(ns, dtype_name(dt)) in ("bfloat16", "float16")
            count = STATISTICAL_MATRICES if isinstance(conventions, MuonConventions) and wide and not (
                len(dtypes) > 1 and dt == torch.float32) else 0
        results, inputs = _run(optimizer, conventions, lr=lr, momentum=momentum, weight_decay=weight_decay,
                               steps=steps, param_dtype=dt, shapes=shapes, cond=cond, seed=seed, suffix=suffix,
                               statistical=(count, stat_shape), device=device)
        report.results += accept_side_effects(results, allow_side_effects)
        report.inputs.update(inputs)
    return report


def _raised_row(err: BaseException, name: str, what: str):
    """The failing ``optimizer_runs`` row (kind "unsupported") for an exception from the user's code."""
    frame = user_frame(err)
    text = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
    row = measured("optimizer_runs", name, what, math.inf, 0.0, f"raised {text}" + (f" at {frame}" if frame else ""))
    row = with_cause(row, f"the optimizer raised {type(err).__name__} on this input" +
                     (f" ({frame})" if frame else "") + ": it does not take it")
    return dataclasses.replace(row, kind="unsupported", extra={"exception": type(err).__name__, "frame": frame})


def _run(optimizer, conventions, *, lr, momentum, weight_decay, steps, param_dtype, shapes, cond, seed, suffix,
         statistical=(0, None), device=torch.device("cpu")):
    """(rows, report inputs) of ``check_optimizer`` for one parameter dtype; ``suffix`` is added
    to the shape label of every input name. ``statistical``: (J, shape) of the statistical rows."""
    pdt = dtype_name(param_dtype, argument="param_dtype")
    inputs = optimizer_inputs(shapes, steps, cond, seed)
    count, stat_shape = statistical
    batch = statistical_inputs(stat_shape, count, cond, seed, pdt) if count and isinstance(
        conventions, MuonConventions) else None

    def placed(a):  # built on the CPU in float64, rounded to the dtype, then moved
        return torch.tensor(a, dtype=torch.float64).to(dtype=param_dtype).to(device)

    params = [torch.nn.Parameter(placed(w0)) for w0, _ in inputs]
    extra_params = [] if batch is None else [torch.nn.Parameter(placed(w0)) for w0 in batch.weights]
    names = conventions.hyperparameter_names
    labels = [f"{m}x{n}{suffix}" for m, n in shapes]
    try:
        opt = optimizer(params + extra_params,
                        **{names["lr"]: lr, names["momentum"]: momentum, names["weight_decay"]: weight_decay},
                        **conventions.extra_kwargs)
    except Exception as err:  # noqa: BLE001 - the user's code: reported as a row, not raised out of the check
        return [_raised_row(err, f"{labels[0]} step 1" if labels else f"constructor{suffix}",
                            f"optimizer(params, ...) in {pdt}")], {}
    report_inputs = {f"{label} step {t + 1}": ({"weight0": w0, **{f"grad{i + 1}": g for i, g in enumerate(gs)}},
                                               f"ortho_verify.api.optimizer_inputs({tuple(shapes)}, {steps}, {cond}, {seed})"
                                               "  # replay: ortho_verify.replay_example(optimizer, failure, "
                                               "conventions=...)")
                     for label, (w0, gs) in zip(labels, inputs) for t in range(steps)}
    step = _muon_step_rows if isinstance(conventions, MuonConventions) else _dion_step_rows
    stat_momenta = None if batch is None else np.zeros_like(batch.weights)
    tracked = [None] * len(params)
    results = []
    for t in range(steps):
        before = [(_as_f64(p), {k: _as_f64(v) for k, v in opt.state.get(p, {}).items() if isinstance(v, torch.Tensor)})
                  for p in params]
        grads = []
        for p, (_, gs) in zip(params, inputs):
            p.grad = placed(gs[t])
            grads.append(_as_f64(p.grad))
        stat_t = min(steps, len(batch.grads)) - 1 if batch is not None else -1
        if extra_params and t <= stat_t:
            stat_before = (np.stack([_as_f64(p) for p in extra_params]), _momenta(opt, extra_params, conventions,
                                                                                   stat_momenta))
        for j, p in enumerate(extra_params):
            p.grad = placed(batch.grads[t, j]) if t <= stat_t else None
        try:
            opt.step()
        except Exception as err:  # noqa: BLE001 - the user's code: reported as a row; this dtype's run stops
            results.append(_raised_row(err, f"{labels[0]} step {t + 1}" if labels else f"step {t + 1}{suffix}",
                                       f"optimizer.step() {t + 1} in {pdt}"))
            return results, report_inputs
        if extra_params and t < stat_t:  # the reference's momentum, for optimizers without a readable buffer
            stat_momenta = _reference_momenta(conventions, stat_before, batch.grads[t], lr=lr, mu=momentum,
                                              wd=weight_decay)
        elif extra_params and t == stat_t:
            results.append(_statistical_row(opt, extra_params, conventions, stat_before, batch, t, lr=lr, mu=momentum,
                                            wd=weight_decay, pdt=pdt, suffix=suffix))
            report_inputs[results[-1].input] = ({"weight0": batch.weights[0], "grad1": batch.grads[0, 0]},
                                                batch.provenance + "  # every matrix: [j] of its arrays")
        for i, p in enumerate(params):
            results += _buffer_rows(opt, p, grads[i], f"{labels[i]} step {t + 1}")
            rows, tracked[i] = step(opt, p, conventions, before[i], grads[i], tracked[i], t, lr=lr, mu=momentum,
                                    wd=weight_decay, pdt=pdt, name=f"{labels[i]} step {t + 1}")
            results += rows
    return results, report_inputs


def _momenta(opt, params, conv, tracked: np.ndarray) -> np.ndarray:
    """The momentum buffers of ``params`` before a step: the optimizer's own (float64) when the
    conventions name a key it keeps, else ``tracked`` (the reference's)."""
    key = conv.momentum_state_key
    if key and all(key in opt.state.get(p, {}) for p in params):
        return np.stack([_as_f64(opt.state[p][key]) for p in params])
    return tracked


def _reference_momenta(conv, before, grads, *, lr, mu, wd) -> np.ndarray:
    """The reference's momentum after a step of every statistical matrix."""
    weights, momenta = before
    return np.stack([ortho_ref.muon_step(w, g, m, lr=lr, mu=mu, nesterov=conv.nesterov,
                                         momentum_style=conv.momentum_style, weight_decay=wd).momentum
                     for w, g, m in zip(weights, grads, momenta)])


def _statistical_row(opt, params, conv, before, batch, t, *, lr, mu, wd, pdt, suffix):
    """``optimizer_mean_deviation`` of step ``t`` of the statistical parameters
    (``ortho_verify.checks.optimizer_statistics``); a row that makes no claim for conventions with
    pipeline stages or cautious weight decay (the per-direction model is of plain Muon)."""
    from ortho_verify.results import no_claim

    J, (m, n) = len(params), batch.weights.shape[-2:]
    name = f"statistical {J}x({m}x{n}){suffix} step {t + 1}"
    if conv.has_stages or conv.cautious_weight_decay:
        return no_claim("optimizer_mean_deviation", name, "update", "not compared: the statistical row models plain "
                        "Muon (no pipeline stages, no cautious weight decay)", extra={"supplementary": True})
    table, safety, eps = table_and_normalization(conv.coefficients, conv.ns_steps, conv.safety, conv.eps)
    ns_dt = coarser_dtype(dtype_name(conv.ns_dtype, argument="conventions.ns_dtype"), pdt)
    key = conv.momentum_state_key
    new_momenta = np.stack([_as_f64(opt.state[p][key]) for p in params]) if key and all(
        key in opt.state.get(p, {}) for p in params) else None
    if new_momenta is not None and new_momenta.shape != batch.weights.shape:
        new_momenta = None
    return optimizer_mean_deviation(conv, weights=before[0], momenta=before[1], grads=batch.grads[t],
                                    new_weights=np.stack([_as_f64(p) for p in params]), new_momenta=new_momenta,
                                    lr=lr, mu=mu, wd=wd, table=table, safety=safety, eps=eps, param_dtype=pdt,
                                    ns_dtype=ns_dt, input_name=name)


def _buffer_rows(opt, p, grad: np.ndarray, name: str) -> list:
    """``gradient_unchanged``: max |p.grad − G| after the step, G the gradient given (float64
    copy; tolerance 0: an optimizer that writes into the gradient, e.g. a Nesterov mix done with
    ``grad.lerp_``, corrupts what gradient accumulation and clipping see next). ``state_not_aliased``:
    the number of state tensors sharing storage with the parameter or its gradient (tolerance 0)."""
    after = p.grad
    err = math.inf if after is None or tuple(after.shape) != grad.shape else float(np.max(np.abs(_as_f64(after) - grad)))
    rows = [measured("gradient_unchanged", name, "p.grad after the step equals the gradient given", err, 0.0,
                     "p.grad was removed or reshaped" if math.isinf(err) else "")]
    ptrs = {p.untyped_storage().data_ptr()} | ({after.untyped_storage().data_ptr()} if after is not None else set())
    shared = sorted(k for k, v in opt.state.get(p, {}).items()
                    if isinstance(v, torch.Tensor) and v.numel() and v.untyped_storage().data_ptr() in ptrs)
    rows.append(measured("state_not_aliased", name, "no state tensor shares storage with p or p.grad",
                         float(len(shared)), 0.0, f"aliased: {shared}" if shared else ""))
    if not rows[0].passed:
        rows[0] = with_cause(rows[0], "the optimizer modified the gradient in place (not part of the algorithm)")
    return rows


def _state(opt, p, key: str) -> np.ndarray:
    state = opt.state.get(p, {})
    if key not in state:
        raise ValueError(f"conventions: optimizer.state[p] has no {key!r} (keys: {sorted(state)}); "
                         "set the conventions' state key")
    return _as_f64(state[key])


def _shape_row(name: str, key: str, value: np.ndarray, expected: tuple) -> list:
    """A failing ``optimizer_state`` row when a state buffer has an unexpected shape (empty if it
    has the expected one): the step is then not compared, and the check goes on."""
    if tuple(np.shape(value)) == tuple(expected):
        return []
    return [with_cause(measured("optimizer_state", name, f"state[{key!r}] shape", math.inf, 0.0,
                                f"state of an unexpected shape: {tuple(np.shape(value))}, expected {tuple(expected)}"),
                       f"state of an unexpected shape: state[{key!r}] is {tuple(np.shape(value))} where the declared "
                       f"conventions give {tuple(expected)} (another layout or orientation than declared)")]


def _muon_step_rows(opt, p, conv: MuonConventions, before, grad, tracked, t, *, lr, mu, wd, pdt, name):
    w_prev, state_prev = before
    key = conv.momentum_state_key
    m_prev = state_prev.get(key) if key else None
    if m_prev is None:
        m_prev = np.zeros_like(w_prev) if tracked is None else tracked
    if key:
        m_after = _state(opt, p, key)
        bad = _shape_row(name, key, m_after, w_prev.shape) + _shape_row(name, key, m_prev, w_prev.shape)
        if bad:
            return bad, None
    if conv.has_stages:  # MuonEq / Muon+ / NorMuon: the pipeline oracle (ortho_verify.checks.stages)
        from ortho_verify.checks.stages import StepInputs, stage_step_rows

        vkey = conv.normuon_state_key if conv.normuon_beta2 is not None else None
        v_prev = state_prev.get(vkey) if vkey else None
        if vkey and vkey not in opt.state.get(p, {}):
            return [with_cause(measured("optimizer_state", name, f"state[{vkey!r}]", math.inf, 0.0,
                                        "NorMuon's second moment is missing"),
                               f"no state[{vkey!r}]: NorMuon is declared (normuon_beta2 = {conv.normuon_beta2}) "
                               "but the optimizer keeps no second moment under that key (NorMuon not run, or "
                               "another state key)")], None
        after = (_as_f64(p), m_after if key else None, _state(opt, p, vkey) if vkey else None)
        return stage_step_rows(conv, StepInputs(w_prev, grad, m_prev, v_prev), after, lr=lr, mu=mu, wd=wd,
                               dtype=coarser_dtype(dtype_name(conv.ns_dtype, argument="conventions.ns_dtype"), pdt),
                               name=name)
    table, safety, eps = table_and_normalization(conv.coefficients, conv.ns_steps, conv.safety, conv.eps)
    ref = ortho_ref.muon_step(w_prev, grad, m_prev, lr=lr, mu=mu, nesterov=conv.nesterov,
                              momentum_style=conv.momentum_style, coefficients=table, safety=safety, eps=eps,
                              eps_mode=conv.eps_mode, adjust_lr=conv.adjust_lr, weight_decay=wd,
                              extra_scale_factor=conv.extra_scale_factor,
                              cautious_weight_decay=conv.cautious_weight_decay, nesterov_form=conv.nesterov_form,
                              weight_decay_style=conv.weight_decay_style)
    w_new = _as_f64(p)
    factor = ortho_ref.muon.decay_factor(conv.weight_decay_style, lr=lr, weight_decay=wd, scale=ref.lr_scale)
    step = lr * ref.lr_scale
    u = tol.unit_roundoff(pdt) + tol.U64
    ns_dt = coarser_dtype(dtype_name(conv.ns_dtype, argument="conventions.ns_dtype"), pdt)
    if conv.cautious_weight_decay:  # the reference's mask; entries where O_ref is within the NS tolerance of 0 may differ
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
                             detail=f"update (W(1-lr wd) - W_new)/(lr s), s = {ref.lr_scale:.4g}", extra=extra,
                             prefix="muon_update/", lr_shape=w_prev.shape)
    if not all(r.passed for r in rows) and np.all(np.isfinite(measured_update)):
        rows = [with_cause(r, _update_cause(conv, r, measured_update, ref.update, w_prev, grad, m_prev, lr=lr, mu=mu,
                                            wd=wd, table=table, safety=safety, eps=eps)) for r in rows]
    elif not np.all(np.isfinite(w_new)):
        rows = [with_cause(r, f"diverged at step {t + 1}: the weight has NaN or Inf") for r in rows]
    if key:
        m_tol = tol.momentum_tolerance(float(np.linalg.norm(grad)), float(np.linalg.norm(m_prev)), pdt)
        row = measured("muon_momentum", name, f"state[{key!r}]", np.linalg.norm(m_after - ref.momentum), m_tol)
        if not row.passed:
            row = with_cause(row, momentum_cause(m_after, grad, m_prev, mu=mu, declared=conv.momentum_style,
                                                 tolerance=m_tol))
        rows.append(row)
    return rows, ref.momentum


def _update_cause(conv: MuonConventions, row, measured_update, ref_update, w_prev, grad, m_prev, *, lr, mu, wd, table,
                  safety, eps) -> str:
    """One cause for a failing update, from a replay: each momentum form of
    ``momentum_form_candidates`` is run through the declared Newton–Schulz map and compared with
    the measured update; the form with the smallest residual is named when it explains the update
    (residual at most a tenth of the declared form's), else the row's own cause. Every row of a
    step gets the same answer (the replay does not depend on the row)."""
    base = float(np.linalg.norm(measured_update - ref_update))
    best = None
    for label, u in momentum_form_candidates(conv, grad, m_prev, mu=mu, table=table, safety=safety, eps=eps):
        alt = ortho_ref.ns_map(u, table, safety=safety, eps=eps, eps_mode=conv.eps_mode)
        resid = float(np.linalg.norm(measured_update - alt))
        if best is None or resid < best[0]:
            best = (resid, label)
    if best is not None and best[0] <= 0.1 * base:
        return (f"the update matches {best[1]} where nesterov={conv.nesterov}, momentum_style="
                f"{conv.momentum_style!r} is declared (replay residual {best[0] / max(base, 1e-300):.2g} of the "
                "declared form's)")
    return row.cause


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
        sketches = [ortho_ref.gaussian_sketch(np.random.default_rng(0), k, rows)] * conv.power_iters if k < rows else None
    return ortho_ref.dion_step(w_prev, grad, m_prev, q_prev, rng=rng, **opts), sketches


def _dion_step_rows(opt, p, conv: DionConventions, before, grad, tracked, t, *, lr, mu, wd, pdt, name):
    w_prev, state_prev = before
    m, n = w_prev.shape
    q_rows = n if conv.orientation == "never_transpose" else min(m, n)
    after = {key: _state(opt, p, key) for key in (conv.momentum_state_key, conv.q_state_key)}  # ValueError if absent
    bad = _shape_row(name, conv.momentum_state_key, after[conv.momentum_state_key], (m, n))
    bad += _shape_row(name, conv.q_state_key, after[conv.q_state_key], (q_rows, after[conv.q_state_key].shape[-1]))
    if bad or t == 0:  # Q_0 is the optimizer's own random draw: observable only after the first step
        return bad, None
    m_prev, q_prev = state_prev[conv.momentum_state_key], state_prev[conv.q_state_key]
    m_dt, q_dt = (dtype_name(opt.state[p][k].dtype, argument=f"optimizer.state[p][{k!r}]")
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
        lr=lr, mu=mu, weight_decay=wd, dtype=coarser_dtype(pdt, m_dt, q_dt), error_feedback=conv.error_feedback, note=note)
    return [r for r in rows if r.claimed] + invariants, None
