"""The measurements behind ``identify_orthogonalizer``: run the probes, decide the compute precision,
the normalization's safety and eps, the form, the orientation and batch handling, each as an
``Evidence`` with its runner-up. ``ortho_verify.identify.kernel`` assembles them into a declaration.
docs/identification.md.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..checks.newton_schulz import compare_ns_output
from ..checks.statistical import STATISTICAL_SPECS, compare_ns_statistics, statistical_batch
from ..conventions import table_and_normalization
from ..inputs.arrays import TORCH_DTYPES
from .probes import Probe, call_probe
from .result import Evidence

__all__ = ["PRECISION_ORDER", "declared_table", "eps_evidence", "form_evidence", "precision_candidates",
           "probe_ratio", "safety_candidates", "statistical_outputs", "statistical_ratio"]

#: Compute precisions, most precise first (``ortho_verify.tolerances.COMPUTE_PRECISIONS``).
PRECISION_ORDER = ("float64", "float32", "tf32", "float16", "bfloat16")
#: Gram restarts tried, in order, when the standard form's rounding statistics do not fit: Dao AI Lab's
#: gram-newton-schulz (before the third step), ortho_fast's float16 kernel (before steps 3 and 5), none.
GRAM_RESTARTS = ((2,), (2, 4), ())
#: The Gram form is declared only when its statistical row is this many times smaller than the
#: standard form's (a systematic error, e.g. a coefficient off, shifts both alike; rounding of a
#: different form does not).
GRAM_MARGIN = 2.0


def declared_table(decl: dict):
    """(table, safety, eps) of a declaration dict (``table_and_normalization``)."""
    return table_and_normalization(decl.get("coefficients", "jordan"), decl.get("steps"), decl.get("safety"),
                                   decl.get("eps"))


def probe_ratio(probes: list[Probe], outputs: list[np.ndarray], decl: dict, compute: str):
    """(worst error / tolerance, the worst row) of ``compare_ns_output`` over the probes under the
    declaration ``decl`` and compute precision ``compute`` (inf for a failed exact row)."""
    table, safety, eps = declared_table(decl)
    restarts = tuple(decl.get("restarts") or ())
    if any(not 0 < i < len(table) for i in restarts):  # declared restarts past a measured step count: no fit
        return math.inf, None
    worst, where = 0.0, None
    for probe, y in zip(probes, outputs):
        if y is None:
            continue
        with np.errstate(all="ignore"):  # a candidate far off the kernel overflows its own model: a large ratio
            rows = compare_ns_output(y, probe.matrix, table, safety=safety, eps=eps,
                                     eps_mode=decl.get("eps_mode", "add"), dtype=compute, input_name=probe.name,
                                     detail="", form=decl.get("form", "standard"), restarts=restarts)
        for r in rows:
            ratio = r.ratio if (r.claimed or not r.passed) else 0.0
            if ratio > worst or where is None:
                worst, where = max(worst, ratio), r
    return worst, where


def _representable(y: np.ndarray, dtype: torch.dtype) -> bool:
    t = torch.from_numpy(y)
    finite = torch.isfinite(t)
    if not bool(finite.all()):
        return False
    if dtype == torch.float16 and float(t.abs().max()) > 65504:
        return False
    return bool(torch.equal(t.to(dtype).double(), t))


def precision_candidates(runs, in_dtype: str) -> tuple[list[str], str]:
    """The compute precisions to try, most precise first, and why: a kernel whose every output entry
    is a bfloat16 (float16) number, or that returns a bfloat16 (float16) tensor, ended its computation
    in that dtype; otherwise float32 / TF32 (float64 first on float64 inputs), then the 16-bit ones."""
    outs = [r.output for r in runs if r.output is not None]
    dtypes = {r.out_dtype for r in runs if r.output is not None}
    for name, dt in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        if dtypes == {dt} or (outs and all(_representable(y, dt) for y in outs) and in_dtype != name):
            return [name], f"every output entry is a {name} number (returned {', '.join(map(str, dtypes))})"
    if in_dtype in ("bfloat16", "float16"):
        return [in_dtype] + [p for p in PRECISION_ORDER[1:] if p != in_dtype], f"{in_dtype} inputs"
    return list(PRECISION_ORDER), "outputs are not all 16-bit numbers"


def choose_precision(probes, outputs, decl, candidates) -> Evidence:
    """The most precise of ``candidates`` whose rounding model reproduces the probes (``probe_ratio`` ≤ 1);
    the next more precise one is the runner-up (with its larger ratio). None fits: the one with the smallest
    ratio."""
    ratios = {p: probe_ratio(probes, outputs, decl, p)[0] for p in candidates}
    fitting = [p for p in candidates if ratios[p] <= 1]
    value = fitting[0] if fitting else min(candidates, key=lambda p: ratios[p])
    i = candidates.index(value)
    runner = candidates[i - 1] if i > 0 else (candidates[i + 1] if i + 1 < len(candidates) else None)
    return Evidence("compute_dtype", value, ratios[value], runner, ratios.get(runner, math.inf), 1.0,
                    "the most precise rounding model that reproduces the probes")


def safety_candidates(measured: float, registered: float) -> list[float]:
    """Values of the safety factor to try, in order: the registered schedule's, the measured one
    rounded to 2 and 3 decimals, and as measured; then its neighbours ±0.01 (the runner-up)."""
    out = []
    base = round(measured, 2)
    for v in (registered, base, round(measured, 3), measured, round(base + 0.01, 2), round(base - 0.01, 2)):
        if v > 0 and v not in out:
            out.append(v)
    return out


def _nice(x: float) -> float:
    """``x`` rounded to one significant digit when that is within 5%, else to two."""
    if x <= 0:
        return x
    one = float(f"{x:.0e}")
    return one if abs(one / x - 1) <= 0.05 else float(f"{x:.1e}")


def _nu_prediction(norm: float, safety: float, eps: float, mode: str) -> float:
    return safety * norm + eps if mode == "add" else max(safety * norm, eps)


def eps_evidence(probes, outputs, decl, compute, table, safety, known_eps) -> tuple[Evidence, Evidence]:
    """(eps, eps_mode) from the tiny probes. Each probe's normalizer νⱼ is fitted (``fit_normalizers``, all
    directions); the candidates are the eps values in use with the schedule (``known_eps``, its own first),
    the one measured (νⱼ − s‖Aⱼ‖_F where it is visible, for "add"; νⱼ there, for "clamp") and a decade either
    side, each in both modes. A candidate's discrepancy is maxⱼ |log(ν_pred,j / νⱼ)|; the chosen one has the
    smallest among those whose rows reproduce the probes (``probe_ratio`` ≤ 1: the judge's own tolerance,
    which in bfloat16 cannot tell a 10× eps apart in the directions it moves), the runner-up the next."""
    from .kernel_fit import fit_normalizers
    from .probes import read_map

    usable = [(p, y) for p, y in zip(probes, outputs) if y is not None and np.all(np.isfinite(y))]
    if not usable:
        note = "no tiny probe gave a finite output: eps not measurable, the known one kept"
        return (Evidence("eps", known_eps[0], math.nan, note=note), Evidence("eps_mode", "add", math.nan, note=note))
    nus, measured = [], {"add": [], "clamp": []}
    for p, y in usable:
        (nu,), _ = fit_normalizers([(p.sigma, read_map(p, y)[0], p.frobenius)], table, wide=True)
        nus.append(nu)
        excess = nu - safety * p.frobenius
        if excess > 0.02 * nu:  # the eps is a visible part of this probe's normalizer
            measured["add"].append(excess)
            measured["clamp"].append(nu)
    values = list(known_eps) + [_nice(float(np.median(v))) for v in measured.values() if v]
    cands = []
    for e in values + [v * f for v in values[:1] for f in (10.0, 0.1)]:
        for mode in ("add", "clamp"):
            if (e, mode) not in cands:
                cands.append((e, mode))
    norms = [p.frobenius for p, _ in usable]
    score = {c: max(abs(math.log(_nu_prediction(n, safety, *c) / nu)) for n, nu in zip(norms, nus)) for c in cands}
    pr, ys = [p for p, _ in usable], [y for _, y in usable]
    ratios = {c: probe_ratio(pr, ys, {**decl, "eps": c[0], "eps_mode": c[1]}, compute)[0] for c in cands}
    fitting = [c for c in cands if ratios[c] <= 1] or cands
    best = min(fitting, key=lambda c: score[c])
    other_eps = [c for c in cands if c[0] != best[0]]
    other_mode = [c for c in cands if c[1] != best[1] and c[0] == best[0]]
    r_eps = min(other_eps, key=lambda c: score[c]) if other_eps else None
    r_mode = min(other_mode, key=lambda c: score[c]) if other_mode else None
    sizes = ", ".join(f"{n:.0e}" for n in norms)
    how = (f"max |log(predicted / fitted normalizer)| over inputs of norm {sizes}; the probes' worst "
           f"error/tolerance under it {ratios[best]:.3g}")
    eps_ev = Evidence("eps", best[0], score[best], None if r_eps is None else r_eps[0],
                      math.inf if r_eps is None else score[r_eps], note=how)
    mode_ev = Evidence("eps_mode", best[1], score[best], None if r_mode is None else r_mode[1],
                       math.inf if r_mode is None else score[r_mode],
                       note="divide by s‖G‖_F + eps (add) or max(s‖G‖_F, eps) (clamp); " + how.split(";")[0])
    return eps_ev, mode_ev


def statistical_outputs(fn, compute, in_dtype, seed, timeout_s, device, batched: bool):
    """(batch, outputs (J, m, n) float64) of the judge's first statistical batch (``STATISTICAL_SPECS``, the
    seed ``check_orthogonalizer`` gives it), or None when the compute precision has no statistical model
    (float64, TF32) or the kernel did not run on it."""
    if compute not in ("bfloat16", "float16", "float32") or in_dtype not in ("bfloat16", "float16", "float32"):
        return None
    lc, shape, norm, count = STATISTICAL_SPECS[0]
    batch = statistical_batch(lc, shape, norm, count, in_dtype, seed + 1000)
    x = torch.from_numpy(batch.matrices).to(TORCH_DTYPES[in_dtype])
    if batched:
        run = call_probe(fn, x, timeout_s, device)
        outs = run.output if run.status == "ok" else None
    else:
        runs = [call_probe(fn, xi, timeout_s, device) for xi in x]
        outs = np.stack([r.output for r in runs]) if all(r.status == "ok" for r in runs) else None
    return None if outs is None else (batch, outs)


def statistical_ratio(stat, decl, compute, form: str = "standard", restarts=()) -> float:
    """The statistical row's error / tolerance (``compare_ns_statistics``) of ``statistical_outputs`` under
    ``decl``."""
    batch, outs = stat
    table, safety, eps = declared_table(decl)
    with np.errstate(all="ignore"):  # a candidate far off the kernel overflows its own model: a large ratio
        return compare_ns_statistics(outs, batch.matrices, table, safety=safety, eps=eps, dtype=compute,
                                     eps_mode=decl.get("eps_mode", "add"), input_name=batch.name, detail="",
                                     form=form, restarts=restarts).ratio


def form_evidence(stat, decl, compute) -> Evidence | None:
    """Standard or Gram form (and the restarts) from the judge's statistical row on ``stat``
    (``statistical_outputs``): the standard form unless its row fails and a Gram model's (restarts
    ``GRAM_RESTARTS`` in order) holds and is ``GRAM_MARGIN`` times smaller. None without ``stat``."""
    if stat is None:
        return None
    count, (m, n) = len(stat[1]), stat[1].shape[-2:]
    standard = statistical_ratio(stat, decl, compute)
    if standard <= 1:
        return Evidence("form", "standard", standard, None, math.inf, 1.0,
                        f"statistical row (mean deviation over {count} matrices {m}x{n})")
    steps = len(declared_table(decl)[0])
    grams = [(r, statistical_ratio(stat, decl, compute, "gram", r)) for r in GRAM_RESTARTS if all(i < steps for i in r)]
    for restarts, ratio in grams:
        if ratio <= 1 and ratio * GRAM_MARGIN <= standard:
            return Evidence("form", ("gram", restarts), ratio, "standard", standard, 1.0,
                            f"statistical row over {count} matrices: the Gram rounding model fits, the standard one "
                            "does not")
    return Evidence("form", "standard", standard, ("gram", grams[0][0]), grams[0][1], 1.0,
                    f"statistical row over {count} matrices: no form's rounding model fits")
