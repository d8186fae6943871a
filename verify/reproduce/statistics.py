"""Decision rules of ``ortho-verify reproduce``: paired differences over seeds and the verdicts
"lower" and "within a margin", with the texts the claims and the report print."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

__all__ = ["difference_text", "lower_verdict", "mean_std_text", "paired_difference", "test_losses", "within_verdict"]


def paired_difference(a: Mapping[int, float | None], b: Mapping[int, float | None]) -> dict:
    """Per-seed differences a_s − b_s over the seeds both have: {"mean", "spread" (sample
    standard deviation, ddof 1; None for one seed), "n", "finite"}. A missing (None) or
    non-finite value makes ``finite`` False and mean / spread None."""
    seeds = sorted(set(a) & set(b))
    values = [a[s] for s in seeds] + [b[s] for s in seeds]
    if not seeds or any(v is None or not math.isfinite(v) for v in values):
        return {"mean": None, "spread": None, "n": len(seeds), "finite": False}
    d = np.array([a[s] - b[s] for s in seeds])
    return {"mean": float(d.mean()), "spread": float(d.std(ddof=1)) if len(d) > 1 else None, "n": len(d),
            "finite": True}


def lower_verdict(diff: Mapping) -> str:
    """Verdict on "the second is lower than the first", from ``paired_difference(first, second)``:
    reproduced if mean − spread > 0, not reproduced if mean + spread < 0 (the opposite is
    resolved), inconclusive otherwise or with fewer than 2 seeds or a diverged run."""
    if not diff["finite"] or diff["spread"] is None:
        return "inconclusive"
    if diff["mean"] - diff["spread"] > 0:
        return "reproduced"
    return "not reproduced" if diff["mean"] + diff["spread"] < 0 else "inconclusive"


def within_verdict(diff: Mapping, margin: float) -> str:
    """Verdict on "the two match within ``margin``" (an equivalence claim): reproduced if
    |mean| + spread <= margin, not reproduced if |mean| − spread > margin, inconclusive
    otherwise or with fewer than 2 seeds or a diverged run. Raises: ValueError if margin <= 0."""
    if not margin > 0:
        raise ValueError(f"margin: expected > 0, got {margin!r}")
    if not diff["finite"] or diff["spread"] is None:
        return "inconclusive"
    if abs(diff["mean"]) + diff["spread"] <= margin:
        return "reproduced"
    return "not reproduced" if abs(diff["mean"]) - diff["spread"] > margin else "inconclusive"


def test_losses(results: Mapping, key: str) -> dict[int, float | None]:
    """Seed -> test loss (None if diverged) of method ``key`` in ``results["evaluation"]``; {} if absent."""
    e = results.get("evaluation", {}).get(key)
    return {} if e is None else dict(zip(e["seeds"], e["test_loss"]))


def mean_std_text(values) -> str:
    """"mean ± std" (ddof 1) of the losses, one value alone, or "diverged" if any is None / non-finite."""
    v = [x for x in values if x is not None and math.isfinite(x)]
    if len(v) < len(list(values)) or not v:
        return "diverged"
    return f"{np.mean(v):.3f} ± {np.std(v, ddof=1):.3f}" if len(v) > 1 else f"{v[0]:.3f}"


def difference_text(diff: Mapping) -> str:
    """A ``paired_difference`` as text: "+mean ± spread over n seeds" (or why it was not measured)."""
    if not diff["finite"]:
        return "not measured (a run is missing or diverged)"
    if diff["spread"] is None:
        return f"{diff['mean']:+.4f} (one seed: no spread)"
    return f"{diff['mean']:+.4f} ± {diff['spread']:.4f} over {diff['n']} seeds"
