"""Fitting a Newton–Schulz kernel's scalar map: which schedule, how many steps, which normalizer.

Inputs are the maps read from probes (``ortho_verify.identify.probes.read_map``): per probe j the
singular values σⱼ of its input and the measured yⱼ ≈ f(σⱼ / νⱼ). For every registered schedule and
step count the normalizer νⱼ of each probe is fitted (one scalar, log-grid then bounded refinement);
the schedules are ranked by the residual sum of squares. Where no registered schedule reproduces
the map, ``closest_variant`` names the closest one and its difference: one coefficient scaled in
every step ("c ×1.0049 of jordan") or in one step. numpy / scipy only. docs/identification.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import ortho_ref

__all__ = ["MAX_STEPS", "MapFit", "NORMALIZATIONS", "Variant", "closest_variant", "fit_normalizers", "fit_schedules",
           "normalization_spread"]

#: Largest step count tried for a registered schedule (its tail row repeated past its table).
MAX_STEPS = 10
#: Normalizations a kernel may divide its input by: name -> the matrix norm νⱼ is proportional to.
NORMALIZATIONS = ("frobenius", "spectral", "max")
#: The fitted normalizer νⱼ relative to ‖Aⱼ‖_F lies in [1/GRID_RANGE, GRID_RANGE].
GRID_RANGE = 100.0


def _table(name: str, steps: int) -> np.ndarray:
    from .known import known_schedule

    return known_schedule(name).table(steps)


def _fit_one(sigma: np.ndarray, y: np.ndarray, table: np.ndarray, scale: float, span: float = GRID_RANGE,
             points: int = 1201) -> tuple[float, float]:
    """(ν, rss) minimizing Σᵢ (yᵢ − f(σᵢ/ν))² over ν ∈ scale·[1/span, span]: a log grid of ``points``
    points (0.77% apart by default: the saturated directions of an oscillating map make the cost
    non-convex in ν, with local minima a few percent apart), then a bounded refinement between the best
    point's neighbours."""
    from scipy.optimize import minimize_scalar

    logs = np.linspace(-np.log(span), np.log(span), points)
    nus = scale * np.exp(logs)
    with np.errstate(over="ignore", invalid="ignore"):
        pred = ortho_ref.ns_polynomial(sigma[None, :] / nus[:, None], table)
        rss = np.sum((pred - y[None, :]) ** 2, axis=1)
    rss = np.where(np.isfinite(rss), rss, np.inf)
    i = int(np.argmin(rss))
    lo, hi = logs[max(i - 1, 0)], logs[min(i + 1, len(logs) - 1)]

    def cost(t):
        with np.errstate(over="ignore", invalid="ignore"):
            r = float(np.sum((ortho_ref.ns_polynomial(sigma / (scale * np.exp(t)), table) - y) ** 2))
        return r if np.isfinite(r) else 1e300

    res = minimize_scalar(cost, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10})
    best = (float(res.fun), float(scale * np.exp(res.x)))
    if rss[i] < best[0]:
        best = (float(rss[i]), float(nus[i]))
    return best[1], best[0]


@dataclass(frozen=True)
class MapFit:
    """One schedule fitted to the probes: ``name`` (registered) and ``steps``, the table, the fitted
    normalizer per probe ``nus`` and the residual ``rms`` (root mean square of yᵢ − f(σᵢ/νⱼ) over every
    direction of every probe)."""

    name: str
    steps: int
    table: np.ndarray
    nus: tuple[float, ...]
    rms: float

    @property
    def label(self) -> str:
        return f"{self.name} x{self.steps}"


def fit_normalizers(maps, table, near=None, wide: bool = False) -> tuple[tuple[float, ...], float]:
    """(νⱼ per probe, rms) of ``table`` over ``maps`` (a list of (σ (k,), y (k,), ‖A‖_F)); with ``near``
    (νⱼ per probe) only within a factor 1.2 of those; ``wide``: νⱼ from 10⁻²‖Aⱼ‖_F up to 10³⁰‖Aⱼ‖_F (an eps far
    above a tiny input's norm)."""
    nus, rss, count = [], 0.0, 0
    for j, (sigma, y, fro) in enumerate(maps):
        if near is not None:
            nu, r = _fit_one(sigma, y, table, near[j], 1.2, 9)
        elif wide:
            nu, r = _fit_one(sigma, y, table, fro * 1e14, 1e16, 8001)
        else:
            nu, r = _fit_one(sigma, y, table, fro)
        nus.append(nu)
        rss += r
        count += len(y)
    return tuple(nus), float(np.sqrt(rss / max(count, 1)))


def fit_schedules(maps, names=None, max_steps: int = MAX_STEPS) -> list[MapFit]:
    """Every known schedule (``ortho_verify.identify.known.schedule_names``, or ``names``) at 1 … ``max_steps``
    steps fitted to ``maps`` (list of (σ, y, ‖A‖_F)), best (smallest rms) first. Maps with NaN are left out; with none
    left every fit has rms inf."""
    usable = [m for m in maps if np.all(np.isfinite(m[1]))]
    out = []
    from .known import schedule_names

    for name in names or schedule_names():
        for steps in range(1, max_steps + 1):
            table = _table(name, steps)
            if not usable:
                out.append(MapFit(name, steps, table, (), float("inf")))
                continue
            nus, rms = fit_normalizers(usable, table)
            out.append(MapFit(name, steps, table, nus, rms))
    return sorted(out, key=lambda f: f.rms)


def normalization_spread(nus, probes) -> dict[str, tuple[float, float]]:
    """Per normalization of ``NORMALIZATIONS``: (spread, mean ratio) of νⱼ / ‖Aⱼ‖ over the probes, where
    ‖·‖ is that normalization's norm and the spread is max / min − 1 (0 when the kernel divides by
    exactly that norm times a constant safety)."""
    out = {}
    for name, attr in zip(NORMALIZATIONS, ("frobenius", "spectral", "max_abs")):
        r = np.array([nu / getattr(p, attr) for nu, p in zip(nus, probes)])
        out[name] = (float(r.max() / r.min() - 1), float(np.mean(r)))
    return out


@dataclass(frozen=True)
class Variant:
    """A registered schedule changed in one way that reproduces the map better: ``what`` in words
    ("c x1.0049 of jordan", "b of step 2 x0.98 of polar_express"), the changed ``table`` and ``rms``."""

    what: str
    table: np.ndarray
    rms: float


def closest_variant(maps, fit: MapFit) -> Variant | None:
    """The one-parameter change of ``fit``'s table that reproduces ``maps`` best: one coefficient (a, b
    or c) scaled by 1 + ε in every step, or in one step only; None when none improves the rms by 4×
    (the map is then not a small change of this schedule)."""
    from scipy.optimize import minimize_scalar

    usable = [m for m in maps if np.all(np.isfinite(m[1]))]
    if not usable:
        return None
    candidates = [(f"{'abc'[j]}", None, j) for j in range(3)]
    candidates += [(f"{'abc'[j]} of step {t + 1}", t, j) for t in range(len(fit.table)) for j in range(3)
                   if fit.table[t, j] != 0]
    best = None
    for label, step, j in candidates:
        def changed(e, step=step, j=j):
            t = fit.table.copy()
            if step is None:
                t[:, j] *= 1 + e
            else:
                t[step, j] *= 1 + e
            return t

        res = minimize_scalar(lambda e: fit_normalizers(usable, changed(e), fit.nus)[1], bounds=(-0.3, 0.3),
                              method="bounded", options={"xatol": 1e-6})
        rms = float(res.fun)
        if best is None or rms < best.rms:
            best = Variant(f"{label} x{1 + float(res.x):.4g} of {fit.label}",
                           changed(float(res.x)), rms)
    return best if best is not None and best.rms * 4 <= fit.rms else None
