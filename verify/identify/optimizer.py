"""``identify_optimizer``: what a Muon-like optimizer computes, recovered from probes with designed
gradients, as a ``MuonConventions`` the judge takes; then the judge under it (docs/verification.md,
"Identifying an optimizer")."""

from __future__ import annotations

import math

import numpy as np
import torch

import ortho_ref

from ..conventions import MuonConventions
from . import optimizer_fit as fit
from .optimizer_probes import Prober, hyperparameter_names, spectrum_matrix
from .result import Evidence, Identification

__all__ = ["PROBE_LR", "PROBE_MOMENTUM", "PROBE_SHAPES", "identify_optimizer"]

#: Shapes of the scale probe: tall, wide, square (every adjust_lr mode differs on at least one).
PROBE_SHAPES = ((32, 12), (12, 32), (16, 16))
#: lr of the probes: large enough that lr·s·O stands well above the float32 rounding of W.
PROBE_LR = 0.05
#: μ of the probes: away from the usual 0.9–0.95 and from 1/2 (where 1 − μ = μ), so the forms' mixing
#: weights differ by factors: the G₁ share of U₂ after G₁, G₂ is μ = 0.8 without Nesterov,
#: μ²/(1 + μ) = 0.36 mixed, μ²(1−μ)/(1 + μ − μ²) = 0.11 with the full gradient; the EMA buffer is
#: 0.2·G₁ after one step, the classic one G₁.
PROBE_MOMENTUM = 0.8
_DTYPE = torch.float32


def _probe_error(err: BaseException, what: str) -> ValueError:
    return ValueError(f"optimizer: probed {what}; it raised {type(err).__name__}: {str(err).strip()[:200]} — "
                      "expected a torch.optim-like optimizer (a class or factory called as optimizer(params, "
                      "lr=..., momentum=..., weight_decay=...) with a step())")


def _check_is_optimizer(prober: Prober) -> None:
    p = torch.nn.Parameter(torch.zeros(8, 4))
    what = f"optimizer([Parameter 8x4 float32], **{prober.names})"
    try:
        opt = prober.build([p], lr=PROBE_LR, mu=PROBE_MOMENTUM, wd=0.0)
    except Exception as err:  # noqa: BLE001
        raise _probe_error(err, what) from err
    if not callable(getattr(opt, "step", None)) or not hasattr(opt, "state"):
        raise ValueError(f"optimizer: probed {what}; it returned {type(opt).__name__!s} without step() and state — "
                         "expected a torch.optim-like optimizer")


def _evidence(field, ranked, note, *, tolerance=1.0, value=None) -> Evidence:
    best = ranked[0]
    runner = ranked[1] if len(ranked) > 1 else None
    return Evidence(field, best[1] if value is None else value, float(best[0]),
                    None if runner is None else runner[1], math.inf if runner is None else float(runner[0]),
                    tolerance, note)


#: Matrices per probe shape in the schedule probe: the per-direction mean over J = 8 has 1/√8 of one
#: matrix's rounding, enough to rank the registered schedules (their maps differ by ≥ 0.05 in f(σ̂)
#: on the probe's spectrum, one bfloat16 matrix's rounding is ≈ 0.02 per direction).
SCHEDULE_PROBE_MATRICES = 8


def _schedule_probe(prober, rng, evidence, differences, scale_default):
    shapes = [s for s in PROBE_SHAPES for _ in range(SCHEDULE_PROBE_MATRICES)]
    grads = [spectrum_matrix(s, np.geomspace(1.0, 1e-2, min(s)), rng) for s in shapes]
    run = prober.run([np.zeros(s) for s in shapes], [grads], lr=PROBE_LR, mu=PROBE_MOMENTUM, wd=0.0)
    if run.error is not None:
        raise _probe_error(run.error, f"one step on zero weights {list(PROBE_SHAPES)} in float32")
    outputs = [-w / PROBE_LR for w in run.weights[1]]
    if not all(np.all(np.isfinite(o)) for o in outputs):
        raise ValueError("optimizer: probed one step on zero weights; the weights came back with NaN or Inf")
    if all(float(np.linalg.norm(o)) == 0 for o in outputs):
        raise ValueError("optimizer: probed one step with a gradient; the weights did not move (not an optimizer "
                         f"of its parameters, or lr is not the keyword {prober.names['lr']!r})")
    groups = [list(zip(grads[i * SCHEDULE_PROBE_MATRICES:(i + 1) * SCHEDULE_PROBE_MATRICES],
                       outputs[i * SCHEDULE_PROBE_MATRICES:(i + 1) * SCHEDULE_PROBE_MATRICES]))
              for i in range(len(PROBE_SHAPES))]
    ranked = fit.fit_schedule_directions(groups, PROBE_SHAPES, declared_factor=scale_default)
    best = ranked[0]
    scales, per_shape = best[2]["scale_ranking"], best[2]["scales"]
    evidence.append(_evidence("adjust_lr", scales, f"lr multiplier s per shape {list(PROBE_SHAPES)} = "
                              f"{[round(float(s), 4) for s in per_shape]} (under {best[1]!r}); deviation / "
                              f"{fit.SCALE_TOLERANCE}"))
    if scales[0][0] > 1:
        differences.append(f"the update's scale {[round(float(s), 4) for s in per_shape]} on {list(PROBE_SHAPES)} "
                           f"matches no adjust_lr mode (closest {scales[0][1]!r} x {scales[0][2]['fitted']:.3g})")
    evidence.append(Evidence("coefficients", best[1], best[2]["rms"], ranked[1][1], ranked[1][2]["rms"], math.nan,
                             f"RMS over directions of the mean over {SCHEDULE_PROBE_MATRICES} matrices of "
                             "u_i^T (O/s) v_i - f(sigma_i); worst direction / bfloat16 tolerance "
                             f"{best[0]:.3g}"))
    if best[0] > 1:
        differences.append(f"the Newton-Schulz output matches no registered schedule: closest {best[1]!r} leaves "
                           f"{best[0]:.3g} of its bfloat16 per-direction tolerance")
    worst = best[2]["worst"]
    dtype = "float32" if worst["float32"] <= 1 else "bfloat16"
    evidence.append(Evidence("ns_dtype", dtype, worst[dtype], "bfloat16" if dtype == "float32" else "float32",
                             worst["bfloat16" if dtype == "float32" else "float32"], 1.0,
                             "the finest dtype whose per-direction tolerance covers every matrix's deviation"))
    side = {"grad_consumed": any(g is None for g, _ in run.grads_after[0]),
            "grad_mutated": any(g is not None and not np.array_equal(g.detach().double().numpy(), given)
                                for g, given in run.grads_after[0]),
            "state_aliased": any(run.aliased[0])}
    schedule = (best[1].split("@")[0], best[2]["table"], best[2]["safety"], best[2]["eps"])
    return schedule, dtype, scales[0], side, (grads, outputs, shapes)


def _momentum_probe(prober, rng, schedule, scale_fn, dtype, evidence, differences):
    shape = (24, 16)
    g1 = spectrum_matrix(shape, np.geomspace(1.0, 1e-1, min(shape)), rng)
    g2 = spectrum_matrix(shape, np.geomspace(1.0, 1e-1, min(shape)), rng)
    run = prober.run([np.zeros(shape)], [[g1], [g2]], lr=PROBE_LR, mu=PROBE_MOMENTUM, wd=0.0)
    if run.error is not None:
        raise _probe_error(run.error, "two steps on a 24x16 parameter")
    s = scale_fn(*shape)
    # the momentum buffer: a state tensor of the parameter's shape proportional to G1 after step 1
    key, style, coef = None, None, math.nan
    for k, v in run.states[0][0].items():
        if v.shape != shape or not np.any(v):
            continue
        c = float(np.vdot(v, g1) / np.vdot(g1, g1))
        if np.linalg.norm(v - c * g1) <= 1e-3 * np.linalg.norm(v) and (key is None or "mom" in str(k)):
            key, coef = k, c
    if key is not None:
        style = min(("ema", "classic"), key=lambda st: abs(coef - (1 - PROBE_MOMENTUM if st == "ema" else 1.0)))
        evidence.append(Evidence("momentum_state_key", key, 0.0, note=f"state tensor = {coef:.4g} G1 after step 1"))
        expected = {"ema": 1 - PROBE_MOMENTUM, "classic": 1.0}
        other = "classic" if style == "ema" else "ema"
        evidence.append(Evidence("momentum_style", style, abs(coef - expected[style]), other,
                                 abs(coef - expected[other]), 1e-3,
                                 f"M1 = {coef:.4g} G1 (ema: 1 - mu = {1 - PROBE_MOMENTUM:.2g}, classic: 1)"))
    measured = -(run.weights[2][0] - run.weights[1][0]) / (PROBE_LR * s)
    ranked = fit.fit_momentum_form([g1, g2], measured, [style] if style else ["ema"], PROBE_MOMENTUM, schedule, dtype)
    evidence.append(_evidence("nesterov", ranked, "step 2 after G1, G2 (independent, cond 10): ns_map of each form's "
                              "U2 vs the update; error / ns_tolerance (bfloat16)"))
    if ranked[0][0] > 1:
        differences.append(f"the momentum matches no known form: closest {ranked[0][1]} leaves {ranked[0][0]:.3g} of "
                           "its tolerance")
    if style is None:
        evidence.append(Evidence("momentum_style", "ema", 0.0, note="no momentum buffer of the parameter's shape in "
                                 "the state: EMA and classic give the same update (U differs by the factor 1 - mu)"))
    stages = _normuon_stage(run.states[0][0], g1, shape, schedule, ranked[0][2], evidence)
    return key, style or "ema", ranked[0][2], stages


def _stage_fallback(first_step, schedule, eps_mode, form, evidence, differences, declared_factor):
    """When plain Muon leaves the first step unexplained (a difference from the schedule probe), the
    pipeline stages (``optimizer_stages.fit_stages``): adopted when their relative error is below half
    of plain Muon's; the schedule probe's differences are then replaced by the stages' evidence.
    Returns (schedule, mode, factor, stage fields) or None."""
    from . import optimizer_stages as st

    probe_diffs = [d for d in differences if d.startswith(("the update's scale", "the Newton-Schulz output",
                                                           "ns_dtype", "coefficients"))]
    if not probe_diffs:
        return None
    grads, outputs, shapes_of = first_step
    candidates = [schedule] + [c for c in fit.schedule_candidates() if c[0] != schedule[0] or c[2] != schedule[2]]
    err, combo, best, scales, plain = st.fit_stages(grads, outputs, shapes_of, list(PROBE_SHAPES), candidates,
                                                    eps_mode, form, PROBE_MOMENTUM, declared_factor)
    if combo == (False, False, None) or not err < 0.5 * plain:
        return None
    for d in probe_diffs:
        differences.remove(d)
    evidence[:] = [e for e in evidence if e.field not in ("coefficients", "adjust_lr", "ns_dtype")]  # plain Muon's
    name = best[0].split("@")[0]
    evidence.append(Evidence("stages", st.stage_fields(combo), err, "plain Muon", plain, math.nan,
                             "first step replayed through muon_pipeline_step per combination (scale per shape "
                             "fitted); relative Frobenius error"))
    evidence.append(Evidence("coefficients", name, err, note=f"under the stages, safety {best[2]}, the mode's scale"))
    evidence.append(_evidence("adjust_lr", scales, "lr multiplier per shape under the stages"))
    if scales[0][0] > 1:
        differences.append(f"the update's scale under the stages matches no adjust_lr mode (closest "
                           f"{scales[0][1]!r} x {scales[0][2]['fitted']:.3g})")
    return (name, best[1], best[2], best[3]), scales[0][1], scales[0][2]["factor"], st.stage_fields(combo)


def _normuon_stage(state: dict, g1, shape, schedule, form, evidence) -> dict:
    """NorMuon's second moment, if the state has one: a nonzero tensor of shape (m, 1) ("row") or
    (1, n) ("column") after step 1, whose value is (1 − β₂)·mean(O²) along the other side (O the
    Newton–Schulz output of U₁): β₂ read from it. {} when there is none."""
    m, n = shape
    for key, v in state.items():
        dims = {(m, 1): "row", (1, n): "column", (m,): "row"}.get(tuple(v.shape))
        if dims is None or not np.any(v):
            continue
        u1 = fit.ns_inputs(form, [g1], PROBE_MOMENTUM)[0]
        o = fit.ns_prediction(u1, *schedule[1:])
        mean = np.mean(o ** 2, axis=1 if dims == "row" else 0).reshape(v.shape)
        beta2 = round(float(1 - np.median(v / mean)), 2)  # two decimals: the bfloat16 O is known to ~1 %
        evidence.append(Evidence("normuon_beta2", beta2, 0.0, note=f"state[{key!r}] {tuple(v.shape)} = "
                                 f"(1 - beta2) mean(O^2) per {dims} after step 1"))
        return dict(normuon_beta2=beta2, normuon_state_key=key, normuon_dim=dims)
    return {}


def _eps_probe(prober, rng, schedule, scale_fn, form, dtype, evidence, stage_fields=None):
    """(eps or None for the schedule's own, eps_mode, the momentum form): one step with ‖U‖_F = 1e-7 and
    1e-8 under ``form``. An EMA form without Nesterov is also fitted bias-corrected (U₁ = M₁/(1−μ) = G,
    1/(1−μ) times the plain U₁: only the normalization's eps sees the factor) and taken when the plain
    form leaves more than its tolerance and the bias-corrected one does not."""
    shape = (16, 24)
    g = spectrum_matrix(shape, np.ones(16), rng)  # σ̂ = 1/4 each: eps moves every direction of f(σ̂) alike
    unit = fit.ns_inputs(form, [g], PROBE_MOMENTUM)[0]
    k = float(np.linalg.norm(unit) / np.linalg.norm(g))
    us, outs = [], []
    for target in (1e-7, 1e-8):
        grad = g * (target / (k * np.linalg.norm(g)))
        run = prober.run([np.zeros(shape)], [[grad]], lr=PROBE_LR, mu=PROBE_MOMENTUM, wd=0.0)
        if run.error is not None or not np.all(np.isfinite(run.weights[-1][0])):
            evidence.append(Evidence("eps_mode", "clamp", math.inf, note="a gradient of norm ~1e-7 raised or gave "
                                     "NaN: eps not identified"))
            return None, "clamp", form
        us.append(fit.ns_inputs(form, [grad], PROBE_MOMENTUM)[0])
        outs.append(-run.weights[1][0] / (PROBE_LR * scale_fn(*shape)))
    predict = None
    if stage_fields:  # the pipeline's own normalizations (MuonEq's row floor, Muon+) at these norms
        grads = [u / (k * 1.0) for u in us]  # the gradient of each probe (U = k G from a zero state)

        def predict(i, eps, mode):
            fields = {key: v for key, v in stage_fields.items() if key in ("row_equilibration", "renormalize",
                                                                         "normuon_dim")}
            dim = fields.pop("normuon_dim", None)
            return ortho_ref.muon.muon_pipeline_step(
                np.zeros(shape), grads[i], np.zeros(shape), lr=1.0, mu=PROBE_MOMENTUM, nesterov=form["nesterov"],
                momentum_style=form.get("momentum_style", "ema"), nesterov_form=form["nesterov_form"],
                bias_correction=form.get("bias_correction", False), step=1, coefficients=schedule[1],
                safety=schedule[2], eps=eps, eps_mode=mode, adjust_lr=None,
                normuon_beta2=None if dim is None else 0.9, normuon_dim=dim or "row", **fields).update
    ranked = fit.fit_eps(us, outs, schedule, dtype, predict=predict)
    if form.get("momentum_style", "ema") == "ema" and not form["nesterov"] and not stage_fields:
        corrected = {**form, "nesterov_form": "mix", "bias_correction": True}
        grads = [u / k for u in us]  # U = k G from a zero state
        alt = fit.fit_eps([fit.ns_inputs(corrected, [g_], PROBE_MOMENTUM)[0] for g_ in grads], outs, schedule, dtype)
        use = ranked[0][0] > 1 >= alt[0][0]
        evidence.append(Evidence("bias_correction", use, (alt if use else ranked)[0][0], not use,
                                 (ranked if use else alt)[0][0], 1.0,
                                 "without Nesterov U_1 = M_1/(1 - mu) = G bias-corrected, (1 - mu) G plain: the eps "
                                 "probe's best (eps, mode) under each; error / ns_tolerance"))
        if use:
            form, ranked = corrected, alt
    evidence.append(_evidence("eps_mode", ranked, "one step with ‖U‖_F = 1e-7 and 1e-8: ns_map with each (eps, "
                              "mode) vs the update; error / ns_tolerance"))
    eps, mode = ranked[0][1]
    return (None if ranked[0][2]["default"] else eps), mode, form


def _decay_probe(prober, rng, schedule, scale_fn, form, dtype, evidence, differences):
    shape, wd = (48, 12), 0.1
    w0 = rng.standard_normal(shape)
    run = prober.run([w0], [[np.zeros(shape)]], lr=PROBE_LR, mu=PROBE_MOMENTUM, wd=wd)
    if run.error is not None:
        raise _probe_error(run.error, "one step with a zero gradient and weight_decay 0.1")
    w0, w1 = run.weights[0][0], run.weights[1][0]
    s = scale_fn(*shape)
    u = fit.ns_inputs(form, [np.zeros(shape)], PROBE_MOMENTUM, weight_grads=[wd * w0])[0]
    l2 = (w0 - PROBE_LR * s * fit.ns_prediction(u, *schedule[1:]), PROBE_LR * s * fit.ns_tolerance_of(u, schedule,
                                                                                                   dtype))
    ranked = fit.fit_decay(w0, w1, lr=PROBE_LR, wd=wd, scale=s, l2=l2, dtype="float32")
    found = float(np.vdot(w1, w0) / np.vdot(w0, w0))
    evidence.append(_evidence("weight_decay_style", ranked, f"one step with a zero gradient: W1 = {found:.6g} W0 "
                              f"(lr {PROBE_LR}, wd {wd}, s {s:.4g}); error / weight_decay_tolerance"))
    if ranked[0][0] > 1:
        units = (1 - found) / (PROBE_LR * wd)
        differences.append(f"the weight decay matches no weight_decay_style: W is multiplied by {found:.6g} = "
                           f"1 - {units:.3g} lr*wd with a zero gradient (closest {ranked[0][1]!r}: "
                           f"{ranked[0][2]['factor']:.6g})")
    return ranked[0][1]


def _cautious_probe(prober, rng, schedule, scale_fn, style, evidence) -> bool:
    shape, wd = (48, 12), 0.5
    w0 = rng.standard_normal(shape)
    g = spectrum_matrix(shape, np.geomspace(1.0, 1e-1, 12), rng)
    run = prober.run([w0], [[g]], lr=PROBE_LR, mu=PROBE_MOMENTUM, wd=wd)
    if run.error is not None:
        return False
    w0, w1 = run.weights[0][0], run.weights[1][0]
    s = scale_fn(*shape)
    d = ortho_ref.muon.decay_factor(style, lr=PROBE_LR, weight_decay=wd, scale=s)
    o = fit.ns_prediction(g, *schedule[1:])
    plain = d * w0 - PROBE_LR * s * o
    cautious = np.where(o * w0 >= 0, d * w0, w0) - PROBE_LR * s * o
    opposite = o * w0 < 0
    r_plain = float(np.linalg.norm((w1 - plain)[opposite]))
    r_cautious = float(np.linalg.norm((w1 - cautious)[opposite]))
    gap = (1 - d) * float(np.linalg.norm(w0[opposite]))  # what the mask changes on those entries
    found = r_cautious < r_plain
    evidence.append(Evidence("cautious_weight_decay", found, min(r_plain, r_cautious) / max(gap, 1e-300),
                             not found, max(r_plain, r_cautious) / max(gap, 1e-300), 0.5,
                             "entries where sign(O) != sign(W): residual of each form / the decay there"))
    return found


def _dtypes(prober, rng) -> tuple:
    shape = (16, 24)
    g = spectrum_matrix(shape, np.geomspace(1.0, 1e-1, 16), rng)
    run = prober.run([np.zeros(shape)], [[g]], lr=PROBE_LR, mu=PROBE_MOMENTUM, wd=0.0, dtype=torch.bfloat16)
    return ("float32",) if run.error is not None else ("float32", "bfloat16")


def _dion_family(optimizer, prober, defaults, kwargs, rng, evidence, differences, *, judge, seed):
    """The Identification of a Dion2 (its signature) or Dion (a right factor Q in its state after a step)
    optimizer; None for anything else."""
    from . import optimizer_dion as dion

    if dion.is_dion2(defaults):
        from ..devices import describe_device, device_label
        from ..report.results import VerificationReport

        conv, rows = dion.identify_dion2(optimizer, defaults, kwargs, evidence, differences, seed=seed)
        report = VerificationReport(f"{_name(optimizer)} (Dion2Conventions)", rows, {},
                                    device_label(describe_device(torch.device("cpu")))) if judge else None
        snippet = ("import torch\nfrom ortho_verify import check_dion2_optimizer\nfrom ortho_verify.conventions import "
                   f"Dion2Conventions\n# optimizer = {_name(optimizer)}\nconventions = {conv!r}\n"
                   "rows = check_dion2_optimizer(optimizer, conventions)")
        return Identification("dion2", all(e.fits for e in evidence) and not differences, conv, snippet, evidence,
                               report, differences)
    shape = (24, 16)
    run = prober.run([np.zeros(shape)], [[spectrum_matrix(shape, np.geomspace(1.0, 1e-1, 16), rng)]], lr=PROBE_LR,
                     mu=PROBE_MOMENTUM, wd=0.0)
    if run.error is not None or dion.dion_q_key(run.states[0][0], shape) is None:
        return None
    conv = dion.identify_dion(prober, defaults, rng, evidence, differences)
    report = None
    if judge:
        from ..checks.optimizer_checks import check_optimizer
        report = check_optimizer(optimizer, conv, seed=seed)
    snippet = ("import torch\nfrom ortho_verify import check_optimizer\nfrom ortho_verify.conventions import "
               f"DionConventions\n# optimizer = {_name(optimizer)}\nconventions = {conv!r}\n"
               "report = check_optimizer(optimizer, conventions)\nprint(report.summary())")
    return Identification("dion", all(e.fits for e in evidence) and not differences, conv, snippet, evidence, report,
                          differences)


def _name(optimizer) -> str:
    target = getattr(optimizer, "func", optimizer)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', type(target).__name__)}"


def snippet_for(optimizer, conv: MuonConventions, check_kwargs: dict, side_effects=()) -> str:
    """Python a user can paste: the declaration and the ``check_optimizer`` call; the side effects seen
    as a comment with the ``allow_side_effects`` that accepts them (never accepted for the user)."""
    target = getattr(optimizer, "func", optimizer)
    name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', type(target).__name__)}"
    default = MuonConventions()
    fields = {f: getattr(conv, f) for f in conv.__dataclass_fields__ if getattr(conv, f) != getattr(default, f)}
    body = ", ".join(f"{k}={v!r}" for k, v in fields.items()).replace("torch.", "torch.")
    extra = "".join(f", {k}={v!r}" for k, v in check_kwargs.items())
    note = (f"# side effects seen: {sorted(side_effects)}; to accept them add "
            f"allow_side_effects={set(side_effects)!r}\n") if side_effects else ""
    return ("import torch\nfrom ortho_verify import check_optimizer\nfrom ortho_verify.conventions import "
            f"MuonConventions\n# optimizer = {name}\nconventions = MuonConventions({body})\n{note}"
            f"report = check_optimizer(optimizer, conventions{extra})\nprint(report.summary())")


def identify_optimizer(optimizer, *, judge: bool = True, seed: int = 0, **kwargs) -> Identification:
    """Identify what a Muon-like optimizer computes from designed probes, then judge it.

    Parameters
    ----------
    optimizer : class or callable
        A torch.optim-like optimizer class, or a factory called as ``optimizer(params, **hyperparameters)``
        (``functools.partial`` included) returning an object with ``step()`` and ``state``.
    judge : bool
        Run ``check_optimizer`` under the declaration found (default True).
    seed : int
        Seed of the probes' random matrices.
    **kwargs
        Constructor keywords held fixed in every probe and in the declaration (``extra_kwargs``).

    Returns
    -------
    Identification
        ``declaration`` a ``MuonConventions`` (the closest one when nothing fits), ``evidence`` one entry
        per field (value, its error / tolerance, the runner-up's), ``differences`` where it departs
        from every declaration, ``report`` the judge's ``VerificationReport`` (None with ``judge=False``).

    Raises
    ------
    ValueError
        Naming ``judge`` (not a bool) or ``seed`` (not a non-negative int); naming ``optimizer``, what was
        probed and what came back, for something not callable or a callable that is not an
        optimizer (its constructor or first step raises, no ``step()``, weights that do not move) or
        whose signature has no keyword for lr, momentum or weight_decay.

    Examples
    --------
    >>> from ortho_verify import identify_optimizer
    >>> import torch
    >>> found = identify_optimizer(torch.optim.Muon)  # doctest: +SKIP
    >>> found.declaration.eps_mode, found.passed  # doctest: +SKIP
    ('clamp', True)
    """
    if not isinstance(judge, bool):
        raise ValueError(f"judge: expected a bool, got {judge!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: expected a non-negative int, got {seed!r}")
    if not callable(optimizer):
        raise ValueError(f"optimizer: expected a class or a factory (a callable taking params and keyword "
                         f"hyperparameters), got {type(optimizer).__name__}")
    names, defaults = hyperparameter_names(optimizer)
    prober = Prober(optimizer, names, kwargs)
    _check_is_optimizer(prober)
    rng = np.random.default_rng(seed)
    evidence: list[Evidence] = [Evidence("hyperparameter_names", names, 0.0, note="from the signature")]
    differences: list[str] = []
    other = _dion_family(optimizer, prober, defaults, kwargs, rng, evidence, differences, judge=judge, seed=seed)
    if other is not None:
        return other
    scale_default = defaults.get("extra_scale_factor")
    schedule, dtype, scale, side, first_step = _schedule_probe(prober, rng, evidence, differences,
                                                   scale_default if isinstance(scale_default, (int, float)) else None)
    mode, factor = scale[1], scale[2]["factor"]

    def scale_fn(m, n):
        return ortho_ref.muon.lr_scale(mode, m, n) * factor

    key, style, form, stages = _momentum_probe(prober, rng, schedule, scale_fn, dtype, evidence, differences)
    staged = _stage_fallback(first_step, schedule, "add", form, evidence, differences,
                             scale_default if isinstance(scale_default, (int, float)) else None)
    stage_fields = None
    if staged is not None:
        schedule, mode, factor, stage_fields = staged
        stages = {**stages, **stage_fields}  # the side from the replay (by_shape), beta2 and key from the state
    eps, eps_mode, form = _eps_probe(prober, rng, schedule, scale_fn, form, dtype, evidence, stage_fields)
    decay = _decay_probe(prober, rng, schedule, scale_fn, form, dtype, evidence, differences)
    cautious = decay != "l2" and _cautious_probe(prober, rng, schedule, scale_fn, decay, evidence)
    dtypes = _dtypes(prober, rng)
    evidence.append(Evidence("param_dtypes", dtypes, 0.0, note="a bfloat16 step " +
                             ("ran" if "bfloat16" in dtypes else "raised")))
    allowed = sorted(k for k, v in side.items() if v)
    evidence.append(Evidence("side_effects", tuple(allowed), 0.0, note="p.grad and state after a step (not accepted: "
                             "the judge's verdict names them; the snippet says how to accept them)"))
    conv = MuonConventions(momentum_style=style, nesterov=form["nesterov"], nesterov_form=form["nesterov_form"],
                           bias_correction=form.get("bias_correction", False),
                           coefficients=schedule[0], eps=eps, eps_mode=eps_mode, adjust_lr=mode,
                           safety=None if schedule[2] == ortho_ref.SCHEDULES[schedule[0]].safety else schedule[2],
                           extra_scale_factor=factor, ns_dtype=getattr(torch, dtype), momentum_state_key=key,
                           hyperparameter_names=names, extra_kwargs=dict(kwargs), weight_decay_style=decay,
                           cautious_weight_decay=cautious, **stages)
    check_kwargs = {}
    if dtypes == ("float32",):
        check_kwargs["param_dtype"] = torch.float32
    for e in evidence:
        if not e.fits and not any(d.startswith(e.field) or e.field in d for d in differences):
            differences.append(f"{e.field}: the closest value {e.value!r} leaves {e.measured:.3g} of its tolerance "
                               f"{e.tolerance:.3g} ({e.note})")
    fits = all(e.fits for e in evidence) and not differences
    report = None
    if judge:
        from ..checks.optimizer_checks import check_optimizer
        report = check_optimizer(optimizer, conv, seed=seed, **check_kwargs)
    return Identification("muon", fits, conv, snippet_for(optimizer, conv, check_kwargs, allowed), evidence, report,
                          differences)
