"""``identify_orthogonalizer``: recover what a Newton–Schulz kernel computes from designed inputs alone,
as the keyword arguments of ``check_orthogonalizer``, then judge it under them.
docs/identification.md.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..checks.kernel_calls import DEFAULT_TIMEOUT_S
from ..inputs.arrays import TORCH_DTYPES
from .kernel_fit import closest_variant, fit_normalizers, fit_schedules, normalization_spread
from .kernel_probe import (
    choose_precision,
    eps_evidence,
    form_evidence,
    precision_candidates,
    probe_ratio,
    safety_candidates,
    statistical_outputs,
    statistical_ratio,
)
from .known import KNOWN_NORMALIZATIONS, known_normalization, known_schedule
from .probes import MAIN_SHAPE, Probe, call_probe, main_probes, read_map, tiny_probes
from .result import Evidence, Identification
from .snippet import declaration_snippet

__all__ = ["DECLARABLE", "identify_orthogonalizer"]

#: Keyword arguments of ``check_orthogonalizer`` a caller may pin (``identify_orthogonalizer(**declared)``).
DECLARABLE = ("coefficients", "steps", "safety", "eps", "eps_mode", "dtype", "compute_dtype", "form", "restarts",
              "batched", "max_batch_dims", "allow_side_effects")


def _input_dtype(declared: dict) -> str:
    """The probes' dtype: the declared ``dtype`` (float32 by default; "high" / "tf32" take float32)."""
    from ..conventions import dtype_name
    from ..inputs.examples import DTYPES

    dtype = declared.get("dtype", torch.float32)
    return "float32" if isinstance(dtype, str) and dtype in ("high", "tf32") else dtype_name(dtype, DTYPES)


def _pinned_compute(declared: dict) -> str | None:
    from ..api import compute_name

    if "compute_dtype" in declared or "dtype" in declared:
        return compute_name(declared.get("dtype", torch.float32), declared.get("compute_dtype"))
    return None


def _not_a_kernel(fn, probe: Probe, run) -> ValueError:
    name = getattr(fn, "__name__", type(fn).__name__)
    return ValueError(f"fn: {name} is not a Newton–Schulz kernel: probed with a {probe.dtype} tensor of shape "
                      f"{probe.matrix.shape} (a (..., m, n) input), it {run.what}; expected a tensor of the same shape")


def _schedule_evidence(fits, best, fit_ratio) -> Evidence:
    runner = next((f for f in fits if f.name != best.name), None)
    note = "rms of y - f(sigma / nu) over the probes' directions, nu fitted per probe"
    return Evidence("coefficients", best.name if best.name else "table", best.rms,
                    None if runner is None else runner.label, math.inf if runner is None else runner.rms,
                    note=note + f"; {best.label}: worst error/tolerance {fit_ratio:.3g}")


def _orientation_and_batches(fn, probes, outputs, decl, compute, timeout_s, device):
    """(rows of evidence, differences, batched, max_batch_dims): the tall transpose and a square crop of the
    first probe, the probes stacked (3, m, n) and (2, 2, m, n)."""
    evidence, diffs = [], []
    p0 = probes[0]
    tall = p0.transposed(f"tall {MAIN_SHAPE[1]}x{MAIN_SHAPE[0]}")
    square = Probe(f"square {MAIN_SHAPE[0]}x{MAIN_SHAPE[0]}", p0.matrix[:, :MAIN_SHAPE[0]].copy(), p0.dtype)
    wide_ratio = probe_ratio(probes, outputs, decl, compute)[0]
    ratios = {}
    for p in (tall, square):
        run = call_probe(fn, p.tensor(), timeout_s, device)
        if run.status != "ok":
            diffs.append(f"{p.name} input: {run.what} (wide inputs run)")
            ratios[p.name] = math.inf
            continue
        ratios[p.name] = probe_ratio([p], [run.output], decl, compute)[0]
        _, off = read_map(p, run.output)
        if not ratios[p.name] <= 1 and wide_ratio <= 1:
            what = "tall (m > n)" if p is tall else "square"
            diffs.append(f"{what} inputs fail ({ratios[p.name]:.3g}x tolerance) where wide inputs fit "
                         f"({wide_ratio:.3g}x)" + (f": the output is not a function of the singular values "
                                                   f"(off-diagonal part {off:.2g}; e.g. transposed for the iteration "
                                                   "and reshaped back)" if off > 0.5 or off != off else ""))
    evidence.append(Evidence("orientation", "tall, wide and square", max(ratios.values()), None, math.inf, 1.0,
                             "worst error/tolerance on the tall transpose and a square crop of a probe"))
    batched, max_batch_dims = True, None
    batch_ev = []
    stack = np.stack([p.matrix for p in probes])
    for shape in ((3,), (2, 2)):
        mats = stack if shape == (3,) else np.stack([stack[0], stack[1], stack[2], stack[0]]).reshape(2, 2, *MAIN_SHAPE)
        x = torch.from_numpy(mats).to(TORCH_DTYPES[p0.dtype])
        run = call_probe(fn, x, timeout_s, device)
        dims = len(shape)
        if run.status != "ok":
            if dims == 1:
                batched = False
            else:
                max_batch_dims = 1
            batch_ev.append(Evidence("batch", f"at most {dims - 1} batch dim{'s' if dims != 2 else ''}", math.nan,
                                     note=f"a {tuple(x.shape)} input {run.what}"))
            break
        flat_in = mats.reshape(-1, *MAIN_SHAPE)
        flat_out = run.output.reshape(-1, *MAIN_SHAPE)
        parts = [Probe(f"batch {tuple(x.shape)}[{j}]", a, p0.dtype) for j, a in enumerate(flat_in)]
        ratio = probe_ratio(parts, list(flat_out), decl, compute)[0]
        batch_ev.append(Evidence("batch", f"{dims} batch dim{'s' if dims > 1 else ''}", ratio, None, math.inf, 1.0,
                                 f"each matrix of a {tuple(x.shape)} input against its own map"))
        if not ratio <= 1 and wide_ratio <= 1:
            diffs.append(f"batched {tuple(x.shape)} inputs fail ({ratio:.3g}x tolerance) where single matrices fit: "
                         "the matrices of a batch are not independent (e.g. one norm over the whole batch)")
            break
    if batch_ev:  # one line: the deepest batch that ran, or the first that did not
        evidence.append(batch_ev[-1] if batch_ev[-1].measured == batch_ev[-1].measured or len(batch_ev) == 1
                        else Evidence("batch", batch_ev[-1].value, batch_ev[0].measured, note=batch_ev[-1].note))
    return evidence, diffs, batched, max_batch_dims


def identify_orthogonalizer(fn, *, judge: bool = True, seed: int = 0, device=None,
                            timeout_s: float | None = DEFAULT_TIMEOUT_S, **declared) -> Identification:
    """Identify what a Newton–Schulz kernel computes from designed inputs, then judge it.

    The kernel is called on probes with prescribed spectra (``ortho_verify.identify.probes``): three wide
    24 x 40 matrices at ‖G‖_F = 64, twelve at ‖G‖_F from 1e-5 to 1e-30, a tall and a square one, batches of
    them, and the judge's first statistical batch. From the singular values of its outputs it recovers the
    scalar map (which registered schedule, how many steps), the normalization (Frobenius, spectral or max;
    safety; eps and whether it is added or clamped), the compute precision (float64, float32, TF32, float16,
    bfloat16), the form (standard or Gram, with restarts), and how tall, square and batched inputs are
    handled; then runs ``check_orthogonalizer`` under that declaration. docs/identification.md.

    Parameters
    ----------
    fn : callable
        Maps a (..., m, n) tensor to its Newton–Schulz result of the same shape.
    judge : bool, default True
        Run ``check_orthogonalizer`` under the declaration found (``Identification.report``).
    seed : int, default 0
        Seed of the probes' singular vectors (and of the judge's inputs).
    device : str or torch.device, optional
        Where ``fn`` runs (inputs are made on the CPU and moved there).
    timeout_s : float or None, default ``DEFAULT_TIMEOUT_S``
        Seconds one call of ``fn`` may take.
    **declared
        Fields of the declaration the caller knows (any of ``DECLARABLE``, as ``check_orthogonalizer``
        takes them, e.g. ``dtype=torch.float32``, which also fixes the compute precision unless
        ``compute_dtype`` is given). They are used as given; where the measurement disagrees, the
        disagreement is a difference and the verdict fails.

    Returns
    -------
    Identification
        ``declaration`` (a dict of ``check_orthogonalizer`` keyword arguments), ``snippet``, ``evidence``
        (one entry per field with its runner-up), ``differences`` (non-empty when the kernel departs from
        every registered schedule or from ``declared``: never a pass), ``fits`` and ``report``.

    Raises
    ------
    TypeError
        If ``fn`` is not callable, or a declared dtype is not one the judge takes.
    ValueError
        If ``declared`` names an argument outside ``DECLARABLE``, or ``fn`` is not a kernel: it raised,
        hung, or returned something other than a floating tensor of its input's shape on a 2-D probe (the
        message names the probe and what came back).

    Examples
    --------
    >>> from ortho_verify import identify_orthogonalizer
    >>> import functools, torch, ortho_fast
    >>> found = identify_orthogonalizer(functools.partial(ortho_fast.newton_schulz, dtype=torch.float32))
    >>> found.declaration["coefficients"], found.passed
    ('jordan', True)
    """
    if not callable(fn):
        raise TypeError(f"fn: expected a callable mapping a (..., m, n) tensor to its Newton–Schulz result, got "
                        f"{type(fn).__name__}")
    unknown = sorted(set(declared) - set(DECLARABLE))
    if unknown:
        raise ValueError(f"declared: unknown {unknown}; expected keyword arguments of check_orthogonalizer among "
                         f"{list(DECLARABLE)}")
    in_dtype = _input_dtype(declared)
    pinned_compute = _pinned_compute(declared)
    probes = main_probes(in_dtype, seed)
    runs = [call_probe(fn, p.tensor(), timeout_s, device) for p in probes]
    if runs[0].status != "ok":
        raise _not_a_kernel(fn, probes[0], runs[0])
    kept = [(p, r.output) for p, r in zip(probes, runs) if r.status == "ok"]
    probes, outputs = [p for p, _ in kept], [y for _, y in kept]
    evidence, diffs = [], []
    maps = [(p.sigma, read_map(p, y)[0], p.frobenius) for p, y in kept]
    finite = [(p, m) for p, m in zip(probes, maps) if np.all(np.isfinite(m[1]))]
    off = max(read_map(p, y)[1] for p, y in kept)
    fits = fit_schedules(maps)
    best = fits[0]
    sched = known_schedule(best.name)
    # a one-coefficient change that explains the map 4x better is systematic (rounding is not): the normalizer,
    # precision, eps and form are then measured under the changed table, so that none of them absorbs the change
    # (looked for only when the registered schedule does not fit under the most precise candidate precision)
    candidates, why = precision_candidates(runs, in_dtype)
    variant = None
    for attempt in range(2):
        table = best.table if variant is None else variant.table
        nus = fit_normalizers([m for _, m in finite], table)[0] if finite else ()
        trial_evidence, trial_diffs = [], []
        norm, measured_safety = _normalization(trial_evidence, trial_diffs, nus, [p for p, _ in finite])
        decl = {"coefficients": _coefficients(sched, table, variant)}
        if variant is None and sched.registered and best.steps != sched.default_steps:
            decl["steps"] = best.steps
        near = abs(measured_safety / sched.safety - 1) < 2e-3
        decl.update(safety=sched.safety if near else round(measured_safety, 3), eps=sched.eps, eps_mode="add")
        decl.update({k: declared[k] for k in ("coefficients", "steps", "safety", "eps", "eps_mode") if k in declared})
        # compute precision: the most precise rounding model that reproduces the probes
        precision = choose_precision(probes, outputs, decl, candidates)
        if attempt or "coefficients" in declared or precision.fits and precision.value in (candidates[0], in_dtype):
            break
        variant = closest_variant(maps, best)
        if variant is None:
            break
    evidence += trial_evidence
    diffs += trial_diffs
    compute = pinned_compute or precision.value  # declared; every measurement below uses the measured one
    seen = precision.value
    evidence.append(Evidence("compute_dtype", precision.value, precision.measured, precision.runner_up,
                             precision.runner_up_measured, 1.0, f"{why}; {precision.note}"))
    if pinned_compute and pinned_compute != precision.value:
        diffs.append(f"compute precision: declared {pinned_compute}, measured {precision.value} (worst error/"
                     f"tolerance {precision.measured:.3g} under {precision.value})")
    if "safety" not in declared and norm == "frobenius":
        decl["safety"] = _safety(evidence, probes, outputs, decl, seen, measured_safety, sched)
    fit_ratio = probe_ratio(probes, outputs, decl, seen)[0]
    evidence.insert(0, _schedule_evidence(fits, best, fit_ratio))
    _schedule_differences(diffs, declared, best, sched, variant, fit_ratio, off)
    # eps and its mode, from the tiny probes (float16 only down to ‖G‖_F = 1e-5: below, its entries are subnormal)
    tiny = tiny_probes(in_dtype, seed, 1e-5 if "float16" in (in_dtype, seen) else 0.0)
    tiny_out = [r.output if r.status == "ok" else None for r in (call_probe(fn, p.tensor(), timeout_s, device)
                                                                  for p in tiny)]
    for ev in eps_evidence(tiny, tiny_out, decl, seen, table, decl["safety"], _known_eps(sched)):
        evidence.append(ev)
        if ev.field in declared:
            if ev.value != declared[ev.field] and ev.measured == ev.measured:
                diffs.append(f"{ev.field}: declared {declared[ev.field]!r}, measured {ev.value!r}")
        else:
            decl[ev.field] = ev.value
    if not ({"safety", "eps", "eps_mode"} & set(declared)) and norm == "frobenius" and \
            not known_normalization(best.name, decl["safety"], decl["eps"], decl["eps_mode"]):
        known = [(sched.safety, sched.eps, "add")] + list(KNOWN_NORMALIZATIONS.get(best.name, {}))
        found = f"safety {decl['safety']:g}, eps {decl['eps']:g} ({decl['eps_mode']})"
        diffs.append(f"normalization: {found} is not one in use with {best.name} (known: "
                     + "; ".join(f"safety {a:g}, eps {b:g} ({c})" for a, b, c in known)
                     + "); declare safety= / eps= / eps_mode= if meant")
    decl["dtype"] = declared.get("dtype", TORCH_DTYPES[in_dtype])
    if compute != in_dtype and "compute_dtype" not in declared:
        decl["compute_dtype"] = "high" if compute == "tf32" else TORCH_DTYPES[compute]
    elif "compute_dtype" in declared:
        decl["compute_dtype"] = declared["compute_dtype"]
    batch_ev, batch_diffs, batched, max_batch_dims = _orientation_and_batches(fn, probes, outputs, decl, seen,
                                                                               timeout_s, device)
    stat = statistical_outputs(fn, seen, in_dtype, seed, timeout_s, device,
                               batched if "batched" not in declared else declared["batched"])
    if stat is not None and seen in ("bfloat16", "float16") and "safety" not in declared and norm == "frobenius":
        _refine_safety(evidence, stat, decl, seen, sched)
    _form(evidence, diffs, decl, declared, form_evidence(stat, decl, seen))
    evidence += batch_ev
    diffs += batch_diffs
    if "batched" in declared or not batched:
        decl["batched"] = declared.get("batched", batched)
    if "max_batch_dims" in declared or max_batch_dims is not None:
        decl["max_batch_dims"] = declared.get("max_batch_dims", max_batch_dims)
    mutated = [r for r in runs if r.mutated]
    evidence.append(Evidence("allow_side_effects", ("input_mutated",) if mutated else (), math.nan,
                             note=f"writes into its input on {len(mutated)} of {len(runs)} probes" if mutated else
                             "leaves its input unchanged"))
    if "allow_side_effects" in declared:
        decl["allow_side_effects"] = tuple(declared["allow_side_effects"])
    elif mutated:  # a side effect, found and declared (accepted in the report, shown in the evidence)
        decl["allow_side_effects"] = ("input_mutated",)
    fitted = fit_ratio <= 1 and norm == "frobenius"
    if variant is not None:  # judged under the closest known schedule: the changed table is not a pass
        decl["coefficients"] = _coefficients(sched, best.table, None)
    if "steps" not in declared:  # judged at the known step count: another one is a difference, named above
        decl.pop("steps", None)
    report = None
    if judge:
        from ..api import check_orthogonalizer

        report = check_orthogonalizer(fn, seed=seed, device=device, timeout_s=timeout_s, **decl)
    return Identification("orthogonalizer", fitted, decl, declaration_snippet(fn, decl), evidence, report, diffs)


def _normalization(evidence, diffs, nus, probes) -> tuple[str, float]:
    """(the norm the fitted normalizers follow, the measured safety νⱼ / ‖Aⱼ‖_F), with its evidence."""
    if not nus:
        evidence.append(Evidence("normalization", "frobenius", math.nan, note="no finite output: not measurable"))
        return "frobenius", 1.0
    spread = normalization_spread(nus, probes)
    ranked = sorted(spread, key=lambda k: spread[k][0])
    norm, runner = ranked[0], ranked[1]
    evidence.append(Evidence("normalization", norm, spread[norm][0], runner, spread[runner][0],
                             note="spread (max/min - 1) over the probes of the fitted normalizer / the norm"))
    if norm != "frobenius":
        diffs.append(f"normalized by the {norm} norm ({'sigma_max' if norm == 'spectral' else 'max |G_ij|'}), not "
                     f"the Frobenius norm: no declaration of the judge divides by it (spread {spread[norm][0]:.2g} vs "
                     f"{spread['frobenius'][0]:.2g} for Frobenius)")
    return norm, spread["frobenius"][1]


def _coefficients(sched, table, variant):
    """The declaration's ``coefficients``: a registered schedule's name, else the rows (a known table, or the
    changed table of ``variant``)."""
    if sched.registered and variant is None:
        return sched.name
    return [tuple(float(v) for v in row) for row in table]


def _known_eps(sched) -> list[float]:
    """The schedule's own eps, then the others in use with it (``KNOWN_NORMALIZATIONS``)."""
    out = [sched.eps]
    for _, eps, _ in KNOWN_NORMALIZATIONS.get(sched.name, {}):
        if eps not in out:
            out.append(eps)
    return out


def _safety(evidence, probes, outputs, decl, compute, measured: float, sched) -> float:
    """The first of ``safety_candidates`` that reproduces the main probes, with its evidence: the schedule's
    own, those in use with it (``KNOWN_NORMALIZATIONS``), then the measured one rounded."""
    options = []
    for s in [sched.safety] + [k[0] for k in KNOWN_NORMALIZATIONS.get(sched.name, {})]:
        if abs(measured / s - 1) < 5e-3 and s not in options:
            options.append(s)
    n_known = len(options)
    options += [s for s in safety_candidates(measured, sched.safety) if s not in options]
    ratios = {s: probe_ratio(probes, outputs, {**decl, "safety": s}, compute)[0] for s in options}
    known = [s for s in options[:n_known] if ratios[s] <= 1]  # the known ones that fit: the nearest to measured
    rest = [s for s in options[n_known:] if ratios[s] <= 1]  # else the measured one, rounded as little as fits
    chosen = min(known, key=lambda s: abs(math.log(s / measured))) if known else rest[0] if rest else decl["safety"]
    others = sorted((s for s in options if abs(s - chosen) >= 5e-3), key=lambda s: ratios[s])
    evidence.append(Evidence("safety", chosen, ratios.get(chosen, math.nan), others[0] if others else None,
                             ratios[others[0]] if others else math.inf, 1.0,
                             f"measured {measured:.6g} (fitted normalizer / ‖G‖_F)"))
    return chosen


def _refine_safety(evidence, stat, decl, compute, sched) -> None:
    """16-bit precision blurs the probes' safety (bfloat16 rounding biases a map by a percent): among the known
    safeties of the schedule and the one chosen, the statistical row (the judge's mean deviation over many
    matrices) decides — the smallest error / tolerance, when it fits."""
    options = [decl["safety"]] + [s for s in [sched.safety] + [k[0] for k in KNOWN_NORMALIZATIONS.get(sched.name, {})]
                                  if s != decl["safety"]]
    options = list(dict.fromkeys(options))
    if len(options) < 2:
        return
    ratios = {s: statistical_ratio(stat, {**decl, "safety": s}, compute) for s in options}
    best = min(options, key=lambda s: ratios[s])
    if ratios[best] <= 1 and best != decl["safety"]:
        decl["safety"] = best
    chosen = decl["safety"]
    runner = min((s for s in options if s != chosen), key=lambda s: ratios[s])
    probe_line = next((i for i, e in enumerate(evidence) if e.field == "safety"), None)
    refined = Evidence("safety", chosen, ratios[chosen], runner, ratios[runner], 1.0,
                       "statistical row (mean deviation over many matrices) under each known safety"
                       + (f"; {evidence[probe_line].note}" if probe_line is not None else ""))
    if probe_line is None:
        evidence.append(refined)
    else:
        evidence[probe_line] = refined


def _schedule_differences(diffs, declared, best, sched, variant, fit_ratio, off) -> None:
    """The schedule's differences: a changed table, no fit, or a step count other than the known one."""
    if variant is not None:
        diffs.append(f"no registered schedule reproduces the map; closest {best.label}, changed: {variant.what} "
                     f"(rms {variant.rms:.2g} vs {best.rms:.2g}; declare coefficients=<your table> if meant)")
    elif not fit_ratio <= 1:
        diffs.append(f"no registered schedule reproduces the map: closest {best.label} at {fit_ratio:.3g}x tolerance; "
                     f"the part of the output off the input's singular directions is {off:.2g} of ‖Y‖_F"
                     + (" (NaN or Inf in the output)" if off != off else ""))
    elif best.steps != sched.default_steps and "steps" not in declared and "coefficients" not in declared:
        diffs.append(f"{best.steps} steps of {best.name}, registered with {sched.default_steps} (declare "
                     f"steps={best.steps} if meant)")
    if isinstance(declared.get("coefficients"), str) and declared["coefficients"] != best.name:
        diffs.append(f"coefficients: declared {declared['coefficients']!r}, measured {best.label}")


def _form(evidence, diffs, decl, declared, form) -> None:
    """Record the form evidence and set ``decl``'s form / restarts (declared ones win)."""
    if "form" in declared:
        decl["form"] = declared["form"]
        if declared.get("restarts") is not None:
            decl["restarts"] = tuple(declared["restarts"])
    if form is None:
        return
    evidence.append(form)
    if form.value == "standard":
        if declared.get("form") == "gram" and form.runner_up is not None and form.measured <= 1:
            diffs.append(f"form: declared 'gram', measured the standard form ({form.measured:.3g}x tolerance)")
        return
    if "form" not in declared:
        decl["form"], decl["restarts"] = "gram", tuple(form.value[1])
    elif declared["form"] != "gram":
        diffs.append(f"form: declared {declared['form']!r}, measured Gram restarts {list(form.value[1])}")
