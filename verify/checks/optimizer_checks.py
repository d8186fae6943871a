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

from ..conventions import (
    DION,
    ORTHO_MUON,
    TORCH_MUON,
    DionConventions,
    MuonConventions,
    coarser_dtype,
    dtype_name,
    table_and_normalization,
)
from ..devices import describe_device, device_label, resolve_device
from ..identify.optimizer_kwargs import constructor_kwargs, split_name
from ..inputs.arrays import as_float64 as _as_f64
from ..inputs.spectra import matrix_with_spectrum
from ..report.results import VerificationReport, accept_side_effects, measured, user_frame
from .diagnoses import with_cause
from .kernel_calls import check_seed
from .optimizer_statistics import (
    MIN_STATISTICAL_MATRICES,
    STATISTICAL_MATRICES,
    STATISTICAL_SHAPE,
    optimizer_mean_deviation,
    statistical_inputs,
)
from .optimizer_steps import (
    DECAY_PROBE_SHAPE,
    buffer_rows,
    decay_probe_rows,
    dion_step_rows,
    flat_state,
    has_state,
    muon_step_rows,
    state_value,
)

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


def _check_hyperparameters(lr, momentum, weight_decay, conventions) -> None:
    """``check_optimizer``'s lr, momentum and weight_decay, before any work: finite numbers with lr > 0,
    0 <= momentum < 1, weight_decay >= 0; and the conventions' hyperparameter names (a keyword or a
    tuple entry such as "betas[0]"). Raises: ValueError naming the argument."""
    for name, value in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not math.isfinite(value):
            raise ValueError(f"{name}: expected a finite number, got {value!r}")
    if not lr > 0:
        raise ValueError(f"lr: expected > 0 (the update is recovered by dividing by lr), got {lr!r}")
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum: expected a number in [0, 1) (the momentum coefficient mu), got {momentum!r}")
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay: expected a number >= 0, got {weight_decay!r}")
    names = conventions.hyperparameter_names
    for key in ("lr", "momentum", "weight_decay"):
        if key not in names:
            raise ValueError(f"hyperparameter_names: expected a constructor keyword for {key!r}, got {names!r}")
        split_name(names[key])


def _check_problem_arguments(shapes, cond) -> None:
    """``check_optimizer``'s ``shapes`` and ``cond``, before any work. Raises: ValueError naming the argument."""
    try:
        pairs = [tuple(s) for s in shapes]
    except TypeError:
        raise ValueError(f"shapes: expected a sequence of (m, n) pairs, got {shapes!r}") from None
    if not pairs:
        raise ValueError("shapes: expected at least one (m, n) pair, got none")
    for shape in pairs:
        if len(shape) != 2 or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 1
                                      for d in shape):
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

    The optimizer steps one parameter per shape ``steps`` times on seeded gradients; each step is recomputed
    by ``ortho_ref`` from the optimizer's own state before it. Muon: the update O = (d(W) − W_new)/(lr·s)
    against ns_map(U) and the momentum buffer; Dion (from step 2): weight, momentum and Q against
    ``ortho_ref.dion_step``. Side effects (a written gradient, aliased state) are rows of their own; an
    exception is a failed ``optimizer_runs`` row. The rows in detail: docs/checks.md, "check_optimizer".

    Parameters
    ----------
    optimizer : type or callable
        Called as ``optimizer(params, **{names[k]: v}, **extra_kwargs)`` with the conventions' keyword names.
    conventions : MuonConventions or DionConventions, optional
        What it computes (default for torch.optim.Muon, ortho_fast.Muon, ortho_fast.Dion: their own).
    lr : float, default 0.02
        Learning rate (> 0).
    momentum : float, default 0.95
        Momentum μ, in [0, 1).
    weight_decay : float, default 0.1
        Weight decay (≥ 0), applied as the conventions' ``weight_decay_style``.
    steps : int, default 3
        Steps per run (Muon ≥ 1, Dion ≥ 2: Q₀ is the optimizer's own draw).
    param_dtype : torch.dtype, optional
        The parameters' dtype (default: one run in float32, one in bfloat16).
    shapes : sequence of (m, n) tuple of int, default DEFAULT_SHAPES
        One matrix parameter per shape.
    cond : float, default 10.0
        Condition number (≥ 1) of the gradients.
    seed : int, default 0
        Seed of the weights and gradients.
    allow_side_effects : iterable of str, default ()
        Side effects accepted explicitly (``ortho_verify.kinds.SIDE_EFFECTS``, "grad_consumed").
    statistical_matrices : int, optional
        J ≥ 8 extra matrices for the row ``optimizer_mean_deviation`` (default: in bfloat16 / float16 only; 0: off).
    statistical_shape : tuple of int, optional
        Their shape (m, n) (default ``STATISTICAL_SHAPE``).
    device : str or torch.device, optional
        Where the parameters live (default CPU).

    Returns
    -------
    VerificationReport
        ``status`` "passed", "failed" or "inconclusive"; each failure carries the initial weight and gradients.

    Raises
    ------
    TypeError
        Without conventions for an unknown class, or for a dtype outside float64 / float32 / bfloat16 / float16.
    ValueError
        Naming the argument: steps, lr, momentum, weight_decay, a hyperparameter name, shapes, cond,
        allow_side_effects, statistical_matrices or device out of range, or a declared state key missing.

    References
    ----------
    Jordan et al. 2024, "Muon"; torch.optim.Muon; Ahn et al. 2025, "Dion", arXiv 2504.05295, Algorithm 1;
    docs/math.md, "4. Muon" and "5. Dion".

    Examples
    --------
    >>> from ortho_verify import TORCH_MUON, check_optimizer
    >>> import torch
    >>> check_optimizer(torch.optim.Muon, TORCH_MUON, shapes=[(8, 4)], steps=2).status
    'passed'
    """
    _check_problem_arguments(shapes, cond)
    check_seed(seed)
    conventions = _default_conventions(optimizer) if conventions is None else conventions
    if not isinstance(conventions, (MuonConventions, DionConventions)):
        raise TypeError(f"conventions: expected MuonConventions or DionConventions, got {type(conventions).__name__}")
    first = 2 if isinstance(conventions, DionConventions) else 1  # Dion: Q_0 is observed after step 1
    if not isinstance(steps, int) or steps < first:
        raise ValueError(f"steps: expected an integer >= {first}, got {steps!r}")
    _check_hyperparameters(lr, momentum, weight_decay, conventions)
    dtypes = DEFAULT_PARAM_DTYPES if param_dtype is None else (param_dtype,)
    for dt in dtypes:
        dtype_name(dt, argument="param_dtype")  # TypeError before any work
    allowed = set(allow_side_effects or ())
    accept_side_effects([], allowed)  # ValueError naming allow_side_effects
    if statistical_matrices is not None and (
            isinstance(statistical_matrices, bool) or not isinstance(statistical_matrices, int)
            or (statistical_matrices != 0 and statistical_matrices < MIN_STATISTICAL_MATRICES)):
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
        report.results += accept_side_effects(results, allowed)
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


def _raising_parameter(err: BaseException, labelled: dict) -> str | None:
    """The label of the parameter being stepped when ``err`` was raised: the innermost traceback frame
    with a local variable that is one of the parameters (``labelled``: id -> label); None if no frame
    has one (e.g. a step that works on all parameters at once)."""
    found, tb = None, err.__traceback__
    while tb is not None:
        for value in tb.tb_frame.f_locals.values():
            if isinstance(value, torch.Tensor) and id(value) in labelled:
                found = labelled[id(value)]
                break
        tb = tb.tb_next
    return found


def _run(optimizer, conventions, *, lr, momentum, weight_decay, steps, param_dtype, shapes, cond, seed, suffix,
         statistical=(0, None), device=torch.device("cpu")):
    """(rows, report inputs) of ``check_optimizer`` for one parameter dtype; ``suffix`` is added
    to the shape label of every input name. ``statistical``: (J, shape) of the statistical rows.
    Muon also steps the decay probe, a ``DECAY_PROBE_SHAPE`` parameter
    with N(0, 1) entries and a zero gradient (``optimizer_steps.decay_probe_rows``). Every parameter
    has a gradient at every step (the statistical ones keep their last one after their step)."""
    pdt = dtype_name(param_dtype, argument="param_dtype")
    inputs = optimizer_inputs(shapes, steps, cond, seed)
    count, stat_shape = statistical
    muon = isinstance(conventions, MuonConventions)
    batch = statistical_inputs(stat_shape, count, cond, seed, pdt) if count and muon else None

    def placed(a):  # built on the CPU in float64, rounded to the dtype, then moved
        return torch.tensor(a, dtype=torch.float64).to(dtype=param_dtype).to(device)

    params = [torch.nn.Parameter(placed(w0)) for w0, _ in inputs]
    extra_params = [] if batch is None else [torch.nn.Parameter(placed(w0)) for w0 in batch.weights]
    probe_w0 = np.random.default_rng(seed + 1).standard_normal(DECAY_PROBE_SHAPE)
    probe = [torch.nn.Parameter(placed(probe_w0))] if muon else []
    labels = [f"{m}x{n}{suffix}" for m, n in shapes]
    probe_label = "decay probe {}x{}{}".format(*DECAY_PROBE_SHAPE, suffix)
    labelled = {id(p): label for p, label in zip(params, labels)}
    labelled.update({id(p): f"statistical[{j}] {p.shape[0]}x{p.shape[1]}{suffix}" for j, p in enumerate(extra_params)})
    labelled.update({id(p): probe_label for p in probe})
    try:
        opt = optimizer(params + extra_params + probe, **constructor_kwargs(
            optimizer, conventions.hyperparameter_names, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay},
            conventions.extra_kwargs))
    except Exception as err:  # noqa: BLE001 - the user's code: reported as a row, not raised out of the check
        return [_raised_row(err, f"{labels[0]} step 1" if labels else f"constructor{suffix}",
                            f"optimizer(params, ...) in {pdt}")], {}
    report_inputs = {f"{label} step {t + 1}": ({"weight0": w0, **{f"grad{i + 1}": g for i, g in enumerate(gs)}},
                                               f"ortho_verify.api.optimizer_inputs({tuple(shapes)}, {steps}, "
                                               f"{cond}, {seed})"
                                               "  # replay: ortho_verify.replay_example(optimizer, failure, "
                                               "conventions=...)")
                     for label, (w0, gs) in zip(labels, inputs) for t in range(steps)}
    step = muon_step_rows if muon else dion_step_rows
    stat_momenta = None if batch is None else np.zeros_like(batch.weights)
    tracked = [None] * (len(params) + len(probe))
    results = []
    for t in range(steps):
        before = [(_as_f64(p), flat_state(opt.state.get(p))) for p in params + probe]
        grads = []
        for p, (_, gs) in zip(params, inputs):
            p.grad = placed(gs[t])
            grads.append(_as_f64(p.grad))
        for p in probe:
            p.grad = torch.zeros_like(p)
            grads.append(np.zeros(DECAY_PROBE_SHAPE))
        stat_t = min(steps, len(batch.grads)) - 1 if batch is not None else -1
        if extra_params and t <= stat_t:
            stat_before = (np.stack([_as_f64(p) for p in extra_params]), _momenta(opt, extra_params, conventions,
                                                                                   stat_momenta))
        for j, p in enumerate(extra_params):  # after their step, the statistical parameters keep a gradient
            p.grad = placed(batch.grads[min(t, stat_t), j])
        try:
            opt.step()
        except Exception as err:  # noqa: BLE001 - the user's code: reported as a row; this dtype's run stops
            who = _raising_parameter(err, labelled)
            results.append(_raised_row(err, f"{who} step {t + 1}" if who else f"step {t + 1}{suffix}",
                                       f"optimizer.step() {t + 1} in {pdt}" +
                                       ("" if who else " (the parameter being stepped was not identified)")))
            return results, report_inputs
        if extra_params and t < stat_t:  # the reference's momentum, for optimizers without a readable buffer
            stat_momenta = _reference_momenta(conventions, stat_before, batch.grads[t], lr=lr, mu=momentum,
                                              wd=weight_decay, step=t + 1)
        elif extra_params and t == stat_t:
            results.append(_statistical_row(opt, extra_params, conventions, stat_before, batch, t, lr=lr, mu=momentum,
                                            wd=weight_decay, pdt=pdt, suffix=suffix))
            report_inputs[results[-1].input] = ({"weight0": batch.weights[0], "grad1": batch.grads[0, 0]},
                                                batch.provenance + "  # every matrix: [j] of its arrays")
        for i, p in enumerate(params + probe):
            name = f"{labels[i]} step {t + 1}" if i < len(params) else f"{probe_label} step {t + 1}"
            results += buffer_rows(opt, p, grads[i], name)
            if i < len(params) or conventions.weight_decay_style == "l2":
                rows, tracked[i] = step(opt, p, conventions, before[i], grads[i], tracked[i], t, lr=lr, mu=momentum,
                                        wd=weight_decay, pdt=pdt, name=name)
            else:
                rows = decay_probe_rows(opt, p, conventions, before[i], lr=lr, wd=weight_decay, pdt=pdt, name=name)
            results += rows
        if probe and t == 0:
            report_inputs[f"{probe_label} step 1"] = ({"weight0": probe_w0, "grad1": np.zeros(DECAY_PROBE_SHAPE)},
                                                      f"np.random.default_rng({seed + 1}).standard_normal"
                                                      f"({DECAY_PROBE_SHAPE}); zero gradient at every step")
    return results, report_inputs


def _momenta(opt, params, conv, tracked: np.ndarray) -> np.ndarray:
    """The momentum buffers of ``params`` before a step: the optimizer's own (float64) when the
    conventions name a key it keeps, else ``tracked`` (the reference's)."""
    key = conv.momentum_state_key
    if key and all(has_state(opt, p, key) for p in params):
        return np.stack([state_value(opt, p, key) for p in params])
    return tracked


def _reference_momenta(conv, before, grads, *, lr, mu, wd, step) -> np.ndarray:
    """The reference's momentum after the 1-based step ``step`` of every statistical matrix (the
    declared momentum style, Nesterov form, bias correction and weight-decay style: "l2" puts wd·W
    into the gradient)."""
    weights, momenta = before
    return np.stack([ortho_ref.muon_step(w, g, m, lr=lr, mu=mu, nesterov=conv.nesterov,
                                         momentum_style=conv.momentum_style, weight_decay=wd,
                                         nesterov_form=conv.nesterov_form, bias_correction=conv.bias_correction,
                                         step=step, weight_decay_style=conv.weight_decay_style).momentum
                     for w, g, m in zip(weights, grads, momenta)])


def _statistical_row(opt, params, conv, before, batch, t, *, lr, mu, wd, pdt, suffix):
    """``optimizer_mean_deviation`` of step ``t`` of the statistical parameters
    (``ortho_verify.checks.optimizer_statistics``); a row that makes no claim for conventions with
    pipeline stages or cautious weight decay (the per-direction model is of plain Muon)."""
    from ..report.results import no_claim

    J, (m, n) = len(params), batch.weights.shape[-2:]
    name = f"statistical {J}x({m}x{n}){suffix} step {t + 1}"
    if conv.has_stages or conv.cautious_weight_decay or conv.form != "standard":
        return no_claim("optimizer_mean_deviation", name, "update", "not compared: the statistical row models plain "
                        "Muon (standard Newton-Schulz form, no pipeline stages, no cautious weight decay)",
                        extra={"supplementary": True})
    table, safety, eps = table_and_normalization(conv.coefficients, conv.ns_steps, conv.safety, conv.eps)
    ns_dt = coarser_dtype(dtype_name(conv.ns_dtype, argument="conventions.ns_dtype"), pdt)
    key = conv.momentum_state_key
    new_momenta = np.stack([state_value(opt, p, key) for p in params]) if key and all(
        has_state(opt, p, key) for p in params) else None
    if new_momenta is not None and new_momenta.shape != batch.weights.shape:
        new_momenta = None
    return optimizer_mean_deviation(conv, weights=before[0], momenta=before[1], grads=batch.grads[t],
                                    new_weights=np.stack([_as_f64(p) for p in params]), new_momenta=new_momenta,
                                    lr=lr, mu=mu, wd=wd, table=table, safety=safety, eps=eps, param_dtype=pdt,
                                    ns_dtype=ns_dt, input_name=name, step_index=t + 1)
