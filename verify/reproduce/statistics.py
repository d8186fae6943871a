"""Decision rules of ``ortho-verify reproduce``: paired differences over seeds, the one-sided paired t
bound that decides a claim only when the run can resolve it, the run's resolution (the smallest
difference it can decide), and the texts the claims and the report print.

Derivation (also written into ``docs/reproduction.md`` by ``rule_derivation_lines``). Per evaluation
seed s the two methods start from the same weights and see the same batches, so their paired
difference d_s = L_worse,s − L_better,s cancels the noise the seeds share. Model: d_1, ..., d_n
independent, mean Δ (the claim's quantity), standard deviation σ; the mean d̄ over n seeds has standard
error se = s/√n (s the sample standard deviation, ddof 1), and (d̄ − Δ)/se follows Student's t with
ν = n − 1 degrees of freedom (exactly for normal d_s; the usual approximation otherwise). With the
one-sided quantile t_α = t_{1−α, ν}, the bound h = t_α · se gives Δ > d̄ − h and Δ < d̄ + h, each
with confidence 1 − α.

- *Lower* ("the better method reaches a lower loss"; Δ > 0 claimed): reproduced if d̄ − h > 0,
  not reproduced if d̄ + h < 0 (the opposite resolved), else inconclusive: a one-sided paired t
  test each way, at most α of wrongly decided claims when Δ = 0.
- *Within δ* ("matches", "stays close"; |Δ| ≤ δ claimed): two one-sided tests (TOST, Schuirmann
  1987): reproduced if |d̄| + h ≤ δ (the interval d̄ ± h inside ±δ), not reproduced if |d̄| − h > δ
  (entirely outside), else inconclusive.
- *Resolution* (power 1 − β, the smallest true difference the run decides with that probability, σ
  estimated by s): (t_α + t_β)·se for the sign (t_β = t_{1−β, ν}), (t_α + t_{β/2})·se for the
  equivalence at Δ = 0 (both one-sided tests must pass). A within-δ claim is judged equivalent only
  when its resolution is at most δ: with a coarser resolution even equal methods would fail to show
  equivalence most of the time, and the verdict would say more about the seeds than about the claim.
  "Not reproduced" (|d̄| − h > δ) stands at any resolution: the run separated the pair from δ itself.
- *Assay sensitivity* (ICH E10, 2000, on equivalence trials): an equivalence is claimed
  only if the same run separates a pair known to differ by more than δ — AdamW against the reference
  Muon, the gap every orthogonalized optimizer paper reports: its lower bound (AdamW − reference) − h
  must exceed δ. A run too short or too noisy to tell those apart shows every pair "equivalent"; its
  equivalence verdicts are inconclusive. A "not reproduced" needs no such control: the run separated
  the pair itself by more than δ.

With n = 1 there is no spread: every claim is inconclusive. ``ALPHA`` and ``POWER`` are fixed before
any run; the numbers are reported so that a reader can apply other levels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache

import numpy as np
from scipy import stats

__all__ = ["ALPHA", "POWER", "decide_lower", "decide_within", "difference_text", "lower_verdict", "mean_std_text",
           "paired_difference", "resolution", "rule_derivation_lines", "sensitivity", "t_quantile", "test_losses",
           "within_verdict"]

#: One-sided error level of each bound: at most 5 % of claims with Δ = 0 are decided "lower" by chance.
ALPHA = 0.05
#: Power of the stated resolution: a true difference of the resolution is decided with probability 0.8.
POWER = 0.8


@lru_cache(maxsize=256)
def t_quantile(p: float, n: int) -> float:
    """The ``p`` quantile of Student's t with n − 1 degrees of freedom (``scipy.stats.t.ppf``).
    Raises: ValueError for n < 2 or p outside (0, 1)."""
    if n < 2 or not 0 < p < 1:
        raise ValueError(f"n, p: expected n >= 2 and 0 < p < 1, got {n}, {p}")
    return float(stats.t.ppf(p, n - 1))


def paired_difference(a: Mapping[int, float | None], b: Mapping[int, float | None]) -> dict:
    """Per-seed differences a_s − b_s over the seeds both have: {"mean", "spread" (sample
    standard deviation, ddof 1; None for one seed), "n", "finite", "half_width" (h = t_{1−α, n−1}·
    spread/√n, None for one seed)}. A missing (None) or non-finite value makes ``finite`` False and
    mean / spread None."""
    seeds = sorted(set(a) & set(b))
    values = [a[s] for s in seeds] + [b[s] for s in seeds]
    if not seeds or any(v is None or not math.isfinite(v) for v in values):
        return {"mean": None, "spread": None, "n": len(seeds), "finite": False, "half_width": None}
    d = np.array([a[s] - b[s] for s in seeds])
    spread = float(d.std(ddof=1)) if len(d) > 1 else None
    half = None if spread is None else t_quantile(1 - ALPHA, len(d)) * spread / math.sqrt(len(d))
    return {"mean": float(d.mean()), "spread": spread, "n": len(d), "finite": True, "half_width": half}


def resolution(spread: float, n: int, rule: str) -> float:
    """The smallest true difference that ``rule`` ("lower" or "within") decides with probability
    ``POWER`` at level ``ALPHA`` from n seeds whose paired differences have this ``spread``:
    (t_{1−α} + t_{POWER})·spread/√n for "lower", (t_{1−α} + t_{(1+POWER)/2})·spread/√n for "within"
    (the module docstring's derivation). Raises: ValueError for n < 2 or another rule."""
    if rule not in ("lower", "within"):
        raise ValueError(f"rule: expected 'lower' or 'within', got {rule!r}")
    beta = t_quantile(POWER if rule == "lower" else (1 + POWER) / 2, n)
    return (t_quantile(1 - ALPHA, n) + beta) * spread / math.sqrt(n)


def _half(diff: Mapping) -> float:
    h = diff.get("half_width")
    return t_quantile(1 - ALPHA, diff["n"]) * diff["spread"] / math.sqrt(diff["n"]) if h is None else h


def _missing(diff: Mapping) -> str:
    return "not run in this study" if diff["n"] == 0 else "a run diverged"


def _undecided(diff: Mapping) -> dict | None:
    """The inconclusive result of a rule when ``diff`` has no finite mean or no spread to bound it
    (a run missing or diverged, one seed); None when the rule can be applied."""
    out = {"verdict": "inconclusive", "reason": "", "half_width": None, "resolution": None}
    if not diff["finite"]:
        return {**out, "reason": _missing(diff)}
    if diff["spread"] is None:
        return {**out, "reason": "one seed: no spread to bound the difference"}
    return None


def decide_lower(diff: Mapping) -> dict:
    """The *lower* rule on ``paired_difference(worse, better)``: {"verdict", "reason", "half_width",
    "resolution"} (the last two None without a spread). ``reason`` says why a claim is inconclusive
    (one seed, a diverged or missing run, or the sign not resolved, with seeds, |d̄| and h)."""
    undecided = _undecided(diff)
    if undecided is not None:
        return undecided
    h = _half(diff)
    out = {"verdict": "inconclusive", "reason": "", "half_width": h,
           "resolution": resolution(diff["spread"], diff["n"], "lower")}
    if diff["mean"] - h > 0:
        return {**out, "verdict": "reproduced"}
    if diff["mean"] + h < 0:
        return {**out, "verdict": "not reproduced"}
    return {**out, "reason": f"the sign is not resolved: |mean| {abs(diff['mean']):.4f} ≤ h {h:.4f} with "
                             f"{diff['n']} seeds (resolution {out['resolution']:.4f})"}


def decide_within(diff: Mapping, margin: float) -> dict:
    """The *within δ* rule (TOST with the run's resolution as gate) on a ``paired_difference``,
    δ = ``margin``: {"verdict", "reason", "half_width", "resolution"}. "not reproduced" if
    |mean| − h > δ; otherwise inconclusive unless the resolution is at most δ, then "reproduced" if
    |mean| + h <= δ. Raises: ValueError if margin <= 0 or is not finite."""
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin > 0):
        raise ValueError(f"margin: expected a finite value > 0, got {margin!r}")
    undecided = _undecided(diff)
    if undecided is not None:
        return undecided
    h = _half(diff)
    res = resolution(diff["spread"], diff["n"], "within")
    out = {"verdict": "inconclusive", "reason": "", "half_width": h, "resolution": res}
    if abs(diff["mean"]) - h > margin:  # the run separated the pair itself by more than δ
        return {**out, "verdict": "not reproduced"}
    if res > margin:
        return {**out, "reason": f"the run cannot resolve δ: resolution {res:.4f} > δ {margin:.4f} with "
                                 f"{diff['n']} seeds (spread {diff['spread']:.4f})"}
    if abs(diff["mean"]) + h <= margin:
        return {**out, "verdict": "reproduced"}
    return {**out, "reason": f"the interval |mean| ± h = {abs(diff['mean']):.4f} ± {h:.4f} straddles δ {margin:.4f}"}


def sensitivity(control: Mapping, margin: float) -> tuple[bool, str]:
    """Assay sensitivity (module docstring): whether the run separates a pair known to differ,
    ``control`` = ``paired_difference(worse, better)``, by more than ``margin``: mean − h > margin.
    Returns (separated, the reason when not)."""
    if not control["finite"] or control["spread"] is None:
        return False, "no sensitivity control: AdamW or the reference " + (
            "not run or diverged" if not control["finite"] else "measured on one seed")
    low = control["mean"] - _half(control)
    if low > margin:
        return True, ""
    return False, (f"no assay sensitivity: AdamW − reference ≥ {low:.4f} (mean − h), not beyond δ {margin:.4f}: "
                   "this run does not separate methods known to differ")


def lower_verdict(diff: Mapping) -> str:
    """The verdict of ``decide_lower``: "reproduced" if mean − h > 0, "not reproduced" if
    mean + h < 0, else (or with fewer than 2 seeds or a diverged run) "inconclusive"."""
    return decide_lower(diff)["verdict"]


def within_verdict(diff: Mapping, margin: float) -> str:
    """The verdict of ``decide_within``: "reproduced" if |mean| + h <= margin and the resolution
    is at most margin, "not reproduced" if |mean| − h > margin, else "inconclusive".
    Raises: ValueError if margin <= 0."""
    return decide_within(diff, margin)["verdict"]


def rule_derivation_lines() -> list[str]:
    """The decision rules and their derivation as markdown list items (``docs/reproduction.md``),
    with the quantiles at 2, 3 and 5 seeds."""
    rows = []
    for n in (2, 3, 5):
        ta = t_quantile(1 - ALPHA, n)
        rows.append(f"n = {n}: t_α = {ta:.3f}, h = {ta / math.sqrt(n):.2f}·s, resolution "
                    f"{resolution(1.0, n, 'lower'):.2f}·s (lower) / {resolution(1.0, n, 'within'):.2f}·s (within)")
    return [
        "- Every comparison is paired: per evaluation seed s, d_s = the difference of the two methods' results "
        "(same initialization, same batches, so the noise the seeds share cancels). Model: d_s independent with "
        "mean Δ (the claim's quantity) and standard deviation σ; with n seeds, mean d̄, sample standard deviation "
        "s (*spread*, ddof 1) and se = s/√n, (d̄ − Δ)/se is Student's t with n − 1 degrees of freedom (exact for "
        "normal d_s). With t_α the one-sided 1 − α quantile, h = t_α·se bounds Δ from each side with confidence "
        f"1 − α, α = {ALPHA:g} (`ortho_verify.reproduce.statistics.ALPHA`).",
        "- *Lower*: reproduced if d̄ − h > 0, not reproduced if d̄ + h < 0 (the opposite resolved), else "
        "inconclusive: a one-sided paired t test each way, so equal methods are decided either way in at most "
        f"{ALPHA:.0%} of runs.",
        "- *Within δ* (matches / stays close): two one-sided tests (Schuirmann 1987): reproduced if |d̄| + h ≤ δ, "
        "not reproduced if |d̄| − h > δ, else inconclusive; an equivalence (reproduced) only when the run's "
        "resolution is at most δ.",
        f"- *Resolution* (power {POWER:.0%}, σ estimated by s): the smallest true difference the rule decides "
        f"with probability {POWER:g}: (t_α + t_β)·se for the sign, t_β the {POWER:g} quantile; (t_α + t_β/2)·se "
        f"for the equivalence at Δ = 0, t_β/2 the {(1 + POWER) / 2:g} quantile. It is printed with every verdict; "
        "a within-δ claim whose resolution exceeds δ is inconclusive (\"the run cannot resolve δ\") unless the "
        "pair is separated from δ outright (|d̄| − h > δ): with that spread even equal methods would fail to show "
        "equivalence most of the time. " + "; ".join(rows) + ".",
        "- *Assay sensitivity* (ICH E10, 2000): an equivalence (within δ) is claimed only if the same run separates "
        "AdamW from the reference Muon by more than δ (mean − h of AdamW − reference > δ); a run too short or too "
        "noisy to tell apart methods known to differ shows every pair equivalent, so its equivalence verdicts are "
        "inconclusive. \"Not reproduced\" needs no control: the run separated the pair itself by more than δ.",
        "- With one evaluation seed every claim is inconclusive (no spread); a diverged or missing evaluation run "
        "makes the claims on its method inconclusive. A measurement run (`--quick`, `--dry-run`) decides no claim "
        "at all: it prints the differences and their resolution only.",
    ]


def test_losses(results: Mapping, key: str) -> dict[int, float | None]:
    """Seed -> test loss (None if diverged) of method ``key`` in ``results["evaluation"]``; {} if absent."""
    e = results.get("evaluation", {}).get(key)
    return {} if e is None else dict(zip(e["seeds"], e["test_loss"]))


def mean_std_text(values) -> str:
    """"mean ± std" (ddof 1) of the losses, one value alone, "not run" for none, or "diverged" if
    any is None / non-finite."""
    values = list(values)
    if not values:
        return "not run"
    v = [x for x in values if x is not None and math.isfinite(x)]
    if len(v) < len(values):
        return "diverged"
    return f"{np.mean(v):.3f} ± {np.std(v, ddof=1):.3f}" if len(v) > 1 else f"{v[0]:.3f}"


def difference_text(diff: Mapping) -> str:
    """A ``paired_difference`` as text: "+mean ± spread over n seeds (h ...)" (or why it was not measured)."""
    if not diff["finite"]:
        return "not measured (" + _missing(diff) + ")"
    if diff["spread"] is None:
        return f"{diff['mean']:+.4f} (one seed: no spread)"
    return f"{diff['mean']:+.4f} ± {diff['spread']:.4f} over {diff['n']} seeds"
