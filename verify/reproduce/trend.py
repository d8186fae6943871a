"""The trend rule of ``ortho-verify reproduce``'s model-size sweep: does a claim's paired
difference shrink, grow or stay flat as the model grows?

For each evaluation seed s (the same seeds at every size, so the comparison stays paired), the
least-squares slope b_s of the paired difference d_s(N) against ln N (N the model's parameter
count) over the sizes; b̄ = mean of b_s, spread = their sample standard deviation (ddof 1).
Orientation: σ = the sign of the mean difference at the smallest size (the gap as first
measured; + if it is 0). With Δ = ln(N_max / N_min) and a flat margin δ (in the difference's
units):

- **flat** if (|b̄| + spread) · Δ ≤ δ: the whole slope interval changes the difference by at most δ
  over the swept sizes;
- else **shrinks** if σ·b̄ + spread < 0 (the gap moves towards zero, resolved beyond its spread);
- else **grows** if σ·b̄ − spread > 0;
- else **inconclusive** — also with fewer than 2 sizes, fewer than 2 seeds finite at every size,
  or δ not positive and finite.

A one-spread rule (b̄ ± one sample standard deviation of the per-seed slopes): looser than the per-size
verdicts' one-sided t bound (``ortho_verify.reproduce.statistics``; with n seeds a threshold of √n on the
slopes' t statistic instead of t_{1−α, n−1}), kept as it was stated before the sweeps were run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["FLAT_MARGIN", "TRENDS", "seed_slopes", "trend_verdict"]

TRENDS = ("shrinks", "grows", "flat", "inconclusive")
#: "Flat": the slope interval changes the difference by at most this fraction of the reference
#: level (Muon's mean loss, or Keller's mean distance to UVᵀ) over the swept sizes.
FLAT_MARGIN = 0.01


def seed_slopes(sizes: Sequence[float], differences: Sequence[Mapping[int, float | None]]) -> dict[int, float]:
    """{seed: least-squares slope of d_s against ln(size)} over the seeds whose difference is
    finite at every size. ``differences[i]`` maps seed -> paired difference at ``sizes[i]``.
    Raises: ValueError if the lengths differ or a size is not positive."""
    if len(sizes) != len(differences):
        raise ValueError(f"sizes, differences: expected equal lengths, got {len(sizes)} and {len(differences)}")
    if any(not (isinstance(n, (int, float)) and n > 0) for n in sizes):
        raise ValueError(f"sizes: expected positive model sizes, got {list(sizes)!r}")
    if len(sizes) < 2:
        return {}
    x = np.log(np.asarray(sizes, dtype=float))
    x = x - x.mean()
    if not np.any(x):
        return {}
    seeds = set(differences[0]).intersection(*differences[1:])
    out = {}
    for s in sorted(seeds):
        y = [d[s] for d in differences]
        if all(v is not None and math.isfinite(v) for v in y):
            out[s] = float(np.dot(x, np.asarray(y, dtype=float)) / np.dot(x, x))
    return out


def trend_verdict(sizes: Sequence[float], differences: Sequence[Mapping[int, float | None]],
                  flat_margin: float) -> dict:
    """The trend of a paired difference over model sizes (module docstring's rule).

    Args: ``sizes`` parameter counts N (one per size, any order), ``differences`` seed ->
    paired difference at each size, ``flat_margin`` δ in the difference's units.
    Returns: {"verdict" (one of ``TRENDS``), "slope" (b̄ per unit of ln N, None if not
    measured), "spread", "seeds", "per_doubling" (b̄ · ln 2), "change_over_range" (b̄ · Δ),
    "orientation" (σ), "flat_margin", "means" (mean difference per size, None if not finite)}.
    Raises: ValueError as ``seed_slopes``."""
    slopes = seed_slopes(sizes, differences)
    means = []
    for d in differences:
        v = list(d.values())
        means.append(float(np.mean(v)) if v and all(x is not None and math.isfinite(x) for x in v) else None)
    out = {"verdict": "inconclusive", "slope": None, "spread": None, "seeds": len(slopes), "per_doubling": None,
           "change_over_range": None, "orientation": None, "flat_margin": flat_margin, "means": means}
    if len(slopes) < 2 or not (isinstance(flat_margin, (int, float)) and math.isfinite(flat_margin)
                               and flat_margin > 0):
        return out
    b = np.array(list(slopes.values()))
    mean, spread = float(b.mean()), float(b.std(ddof=1))
    smallest = int(np.argmin(sizes))
    first = float(np.mean([differences[smallest][s] for s in slopes]))
    sign = -1.0 if first < 0 else 1.0
    span = math.log(max(sizes) / min(sizes))
    out.update(slope=mean, spread=spread, per_doubling=mean * math.log(2), change_over_range=mean * span,
               orientation=sign)
    if (abs(mean) + spread) * span <= flat_margin:
        out["verdict"] = "flat"
    elif sign * mean + spread < 0:
        out["verdict"] = "shrinks"
    elif sign * mean - spread > 0:
        out["verdict"] = "grows"
    return out
