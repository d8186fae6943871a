"""PNG plots of ``ortho-verify`` (matplotlib, Agg backend): the singular-value map of each
coefficient schedule and the distribution of error/tolerance per check.

matplotlib (the extra ``verify``) is imported when a plot is drawn (``ortho_verify.optional.pyplot``),
not with this module."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np

import ortho_ref

from ..optional import pyplot, require
from ..tolerances import BASELINE_FLOOR
from .results import CheckResult
from .tables import BAND_INTERVAL

__all__ = ["ratio_distribution", "singular_value_map", "write_plots"]

#: Ratios below this are drawn at it (a bitwise check has ratio 0).
RATIO_FLOOR = 1e-8
#: Measured points drawn per dtype and schedule (evenly subsampled beyond it).
MAX_POINTS = 4000
_DTYPE_STYLE = {"float64": ("tab:blue", "o"), "float32": ("tab:green", "s"), "bfloat16": ("tab:red", "^")}


def _pyplot():
    return pyplot("ortho-verify's plots")


def _plain_log_ticks(axis) -> None:
    """Decade ticks labelled "1e-06" (``LogFormatter``), no minor ticks: the default mathtext labels
    and minor ticks were half of the plots' time (a second of CPU per ``ortho-verify`` run)."""
    ticker = require("matplotlib.ticker", "ortho-verify's plots")
    axis.set_major_formatter(ticker.LogFormatter(labelOnlyBase=True))
    axis.set_minor_locator(ticker.NullLocator())


def singular_value_map(schedule: str, points: dict, path: Path) -> Path:
    """Input σ̂ (log axis) vs output singular value for one schedule: the exact map f (line),
    the exact band of f on σ̂ ∈ [1e-3, 1] (``ortho_ref.ns_band``, shaded), and the measured
    points uᵢᵀ X_fast vᵢ per compute dtype. ``points``: dtype -> list of (σ̂, measured) arrays.
    Returns ``path``."""
    plt = _pyplot()
    table = ortho_ref.schedule(schedule)
    lo, hi = ortho_ref.ns_band(table, *BAND_INTERVAL)
    x = np.geomspace(1e-6, 1.0, 2000)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.axhspan(lo, hi, color="0.85", label=f"exact band on [1e-3, 1]: [{lo:.3f}, {hi:.3f}]")
    ax.plot(x, ortho_ref.ns_polynomial(x, table), color="black", lw=1.2, label="exact f(σ̂)")
    for dtype, pairs in points.items():
        if not pairs:
            continue
        sig = np.concatenate([p[0] for p in pairs])
        out = np.concatenate([p[1] for p in pairs])
        keep = np.flatnonzero(sig > 0)
        keep = keep[np.linspace(0, len(keep) - 1, min(len(keep), MAX_POINTS)).astype(int)] if len(keep) else keep
        color, marker = _DTYPE_STYLE.get(dtype, ("tab:gray", "."))
        ax.scatter(sig[keep], out[keep], s=6, alpha=0.5, color=color, marker=marker, label=f"measured, {dtype}",
                   linewidths=0)
    ax.set_xscale("log")
    _plain_log_ticks(ax.xaxis)
    ax.set_xlim(1e-6, 1.05)
    ax.set_xlabel("input σ̂ = σ / (safety·‖G‖_F + eps)")
    ax.set_ylabel("output singular value")
    ax.set_title(f"Newton–Schulz singular-value map: {schedule} ({len(table)} steps)")
    ax.legend(loc="upper left", fontsize=8)
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.13, top=0.92)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def ratio_distribution(results: list[CheckResult], path: Path) -> Path:
    """One row per check: every error/tolerance ratio (log axis, jittered), the failure line at 1
    and the baseline floor 0.1. Ratios of 0 (bitwise checks) are drawn at ``RATIO_FLOOR``, ratios
    above 20 (and inf) at 20. Rows that made no claim (``CheckResult.claimed``) are left out."""
    plt = _pyplot()
    groups: "OrderedDict[str, list[float]]" = OrderedDict()
    for r in results:
        if r.claimed:
            groups.setdefault(r.check, []).append(r.ratio)
    fig, ax = plt.subplots(figsize=(8, 0.38 * len(groups) + 1.4))
    rng = np.random.default_rng(0)
    for i, (check, ratios) in enumerate(groups.items()):
        v = np.clip(np.nan_to_num(np.array(ratios), posinf=20.0), RATIO_FLOOR, 20.0)
        ax.scatter(v, i + rng.uniform(-0.25, 0.25, len(v)), s=5, alpha=0.4,
                   color=np.where(np.array(ratios) > 1, "tab:red", "tab:blue"), linewidths=0)
        ax.plot([np.median(v)] * 2, [i - 0.35, i + 0.35], color="black", lw=1.5)
    ax.axvline(1.0, color="tab:red", lw=1, label="error = tolerance (fail above)")
    ax.axvline(BASELINE_FLOOR, color="tab:orange", lw=1, ls="--", label="baseline floor")
    ax.set_yticks(range(len(groups)), [f"{c} ({len(v)})" for c, v in groups.items()], fontsize=8)
    ax.set_xscale("log")
    _plain_log_ticks(ax.xaxis)
    ax.set_xlim(RATIO_FLOOR / 2, 30)
    ax.invert_yaxis()
    ax.set_xlabel(f"error / tolerance (0 drawn at {RATIO_FLOOR:g}; black: median)")
    ax.legend(loc="lower right", fontsize=8)
    fig.subplots_adjust(left=0.36, right=0.97, bottom=1.0 / fig.get_figheight(), top=1 - 0.3 / fig.get_figheight())
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_plots(results: list[CheckResult], sv_points: dict, out_dir: Path) -> list[Path]:
    """Write ``plots/ratios.png`` and ``plots/sv_map_<schedule>.png`` under ``out_dir``.

    ``sv_points``: (schedule, dtype) -> list of (σ̂, uᵢᵀ X_fast vᵢ) from ``check_newton_schulz``.
    Returns the written paths (relative to ``out_dir``); [] if matplotlib is not installed.
    """
    try:
        _pyplot()
    except ImportError:
        return []
    folder = Path(out_dir) / "plots"
    folder.mkdir(parents=True, exist_ok=True)
    paths = [ratio_distribution(results, folder / "ratios.png")] if results else []
    by_schedule: dict[str, dict] = {}
    for (schedule, dtype), pairs in sv_points.items():
        by_schedule.setdefault(schedule, {})[dtype] = pairs
    for schedule in sorted(by_schedule):
        paths.append(singular_value_map(schedule, by_schedule[schedule], folder / f"sv_map_{schedule}.png"))
    return [p.relative_to(out_dir) for p in paths]
