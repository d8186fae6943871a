"""The measurements behind ``identify_orthogonalizer``: run the probes, decide the compute precision,
the normalization's safety and eps, the form, the orientation and batch handling, each as an
``Evidence`` with its runner-up. ``ortho_verify.identify.kernel`` assembles them into a declaration.
docs/identification.md.
"""

from __future__ import annotations

import math

import numpy as np
import torch

import ortho_ref
from ortho_verify.checks.newton_schulz import compare_ns_output
from ortho_verify.checks.statistical import STATISTICAL_SPECS, compare_ns_statistics, statistical_batch
from ortho_verify.conventions import table_and_normalization
from ortho_verify.identify.probes import Probe, call_probe
from ortho_verify.identify.result import Evidence

__all__ = ["PRECISION_ORDER", "declared_table", "eps_evidence", "form_evidence", "precision_candidates",
           "probe_ratio", "safety_candidates"]

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
    worst, where = 0.0, None
    for probe, y in zip(probes, outputs):
        if y is None:
            continue
        rows = compare_ns_output(y, probe.matrix, table, safety=safety, eps=eps, eps_mode=decl.get("eps_mode", "add"),
                                 dtype=compute, input_name=probe.name, detail="", form=decl.get("form", "standard"),
                                 restarts=tuple(decl.get("restarts") or ()))
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


def eps_evidence(probes, outputs, decl, compute, table, safety, known_eps) -> tuple[Evidence, Evidence]:
    """(eps, eps_mode) from the tiny probes: for every (eps, mode) candidate — the eps values in use with the
    schedule (``known_eps``, its own first) and the one measured from the fitted normalizers (νⱼ − s‖Aⱼ‖_F for "add", νⱼ for "clamp"), each in both modes —
    the worst error / tolerance over the tiny probes; the first candidate that fits wins, the best other
    mode is the runner-up."""
    from ortho_verify.identify.kernel_fit import fit_normalizers

    usable = [(p, y) for p, y in zip(probes, outputs) if y is not None and np.all(np.isfinite(y))]
    measured = {"add": [], "clamp": []}
    for p, y in usable:
        from ortho_verify.identify.probes import read_map

        proj, _ = read_map(p, y)
        (nu,), _ = fit_normalizers([(p.sigma, proj, p.frobenius)], table, wide=True)
        excess = nu - safety * p.frobenius
        if excess > 0.02 * nu:  # the eps is a visible part of this probe's normalizer
            measured["add"].append(excess)
            measured["clamp"].append(nu)
    cands = []
    for mode in ("add", "clamp"):
        for e in list(known_eps) + ([_nice(float(np.median(measured[mode])))] if measured[mode] else []):
            if (e, mode) not in cands:
                cands.append((e, mode))
    for e, mode in list(cands[:1]):  # a decade either side of the first: the runner-up of the eps itself
        cands += [(e * 10, mode), (e / 10, mode)]
    if not usable:
        note = "no tiny probe gave a finite output: eps not measurable, the registered one kept"
        return (Evidence("eps", known_eps[0], math.nan, note=note), Evidence("eps_mode", "add", math.nan, note=note))
    pr = [p for p, _ in usable]
    ys = [y for _, y in usable]
    ratios = {c: probe_ratio(pr, ys, {**decl, "eps": c[0], "eps_mode": c[1]}, compute)[0] for c in cands}
    fitting = [c for c in cands if ratios[c] <= 1]
    best = fitting[0] if fitting else min(cands, key=lambda c: ratios[c])
    other_eps = [c for c in cands if c[0] != best[0]]
    other_mode = [c for c in cands if c[1] != best[1]]
    r_eps = min(other_eps, key=lambda c: ratios[c]) if other_eps else None
    r_mode = min(other_mode, key=lambda c: ratios[c]) if other_mode else None
    sizes = ", ".join(f"{p.frobenius:.0e}" for p in pr)
    eps_ev = Evidence("eps", best[0], ratios[best], None if r_eps is None else r_eps[0],
                      math.inf if r_eps is None else ratios[r_eps], 1.0,
                      f"worst error/tolerance on inputs of norm {sizes}")
    mode_ev = Evidence("eps_mode", best[1], ratios[best], None if r_mode is None else r_mode[1],
                       math.inf if r_mode is None else ratios[r_mode], 1.0,
                       "divide by s‖G‖_F + eps (add) or max(s‖G‖_F, eps) (clamp)")
    return eps_ev, mode_ev


def form_evidence(fn, decl, compute, in_dtype, seed, timeout_s, device, batched: bool) -> Evidence | None:
    """Standard or Gram form (and the restarts) from the judge's statistical row (``compare_ns_statistics``,
    the first batch of ``STATISTICAL_SPECS``): the standard form unless its row fails and a Gram model's
    (restarts ``GRAM_RESTARTS`` in order) holds and is ``GRAM_MARGIN`` times smaller. None when the compute
    precision has no statistical model (float64, TF32) or the batch could not be run."""
    if compute not in ("bfloat16", "float16", "float32") or in_dtype not in ("bfloat16", "float16", "float32"):
        return None
    lc, shape, norm, count = STATISTICAL_SPECS[0]
    batch = statistical_batch(lc, shape, norm, count, in_dtype, seed + 1000)
    x = torch.from_numpy(batch.matrices).to({"float32": torch.float32, "bfloat16": torch.bfloat16,
                                              "float16": torch.float16}[in_dtype])
    if batched:
        run = call_probe(fn, x, timeout_s, device)
        outs = run.output if run.status == "ok" else None
    else:
        runs = [call_probe(fn, xi, timeout_s, device) for xi in x]
        outs = np.stack([r.output for r in runs]) if all(r.status == "ok" for r in runs) else None
    if outs is None:
        return None
    table, safety, eps = declared_table(decl)

    def row(form, restarts=()):
        return compare_ns_statistics(outs, batch.matrices, table, safety=safety, eps=eps, dtype=compute,
                                     eps_mode=decl.get("eps_mode", "add"), input_name=batch.name, detail="",
                                     form=form, restarts=restarts).ratio

    standard = row("standard")
    if standard <= 1:
        return Evidence("form", "standard", standard, None, math.inf, 1.0,
                        f"statistical row (mean deviation over {count} matrices {shape[0]}x{shape[1]})")
    grams = [(r, row("gram", r)) for r in GRAM_RESTARTS]
    for restarts, ratio in grams:
        if ratio <= 1 and ratio * GRAM_MARGIN <= standard:
            return Evidence("form", ("gram", restarts), ratio, "standard", standard, 1.0,
                            f"statistical row over {count} matrices: the Gram rounding model fits, the standard one "
                            "does not")
    return Evidence("form", "standard", standard, ("gram", grams[0][0]), grams[0][1], 1.0,
                    f"statistical row over {count} matrices: no form's rounding model fits")

