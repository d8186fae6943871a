"""Plots of ``ortho-verify reproduce`` (matplotlib, the extra ``verify``, imported when drawing):
loss curves, final losses per seed, the lr sweep and the singular-value maps."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..optional import pyplot, require
from ..report.plots import singular_value_map
from .config import METHODS, METHODS_BY_KEY, SV_DTYPES, SV_SCHEDULES

__all__ = ["write_plots"]

_WHAT = "ortho-verify reproduce's plots"

#: Loss-curve panels: the optimizers side by side (NorMuon, Dion2 with them), then Dion's rank and error
#: feedback. A method not in ``METHODS`` (not run) is skipped.
_PANELS = (("adamw", "muon-jordan", "muon-polar_express", "normuon", "dion-1-ef", "dion2-1/4"),
           ("muon-jordan", "dion-1-ef", "dion-1/4-ef", "dion-1/4-noef", "dion-1/16-ef", "dion-1/16-noef"))


def _style(key: str) -> dict:
    index = list(METHODS_BY_KEY).index(key)  # tab10 up to 10 methods, else tab20 (one colour per method)
    color = require("matplotlib", _WHAT).colormaps["tab10" if len(METHODS_BY_KEY) <= 10 else "tab20"](index % 20)
    return {"color": color, "ls": "--" if key.endswith("-noef") else "-"}


def _array(rows) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=float)


def _plot_curves(results: Mapping, path: Path) -> Path:
    plt = pyplot(_WHAT)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    tops, bottoms = [], []
    for ax, keys in zip(axes, _PANELS):
        for key in keys:
            e = results["evaluation"].get(key)
            if not e:
                continue
            steps, curves = np.array(e["curve_steps"]), _array(e["curves"])
            mean = np.nanmean(curves, axis=0)
            ax.plot(steps, mean, lw=1.4, label=f"{METHODS_BY_KEY[key].label} (lr {e['lr']:g})", **_style(key))
            ax.fill_between(steps, np.nanmin(curves, axis=0), np.nanmax(curves, axis=0), alpha=0.15,
                            color=_style(key)["color"])
            late = steps >= 0.25 * steps[-1]
            if np.isfinite(mean[late]).any():  # a method diverged on every seed has no curve to frame
                tops.append(np.nanmax(mean[late]))
                bottoms.append(np.nanmin(curves))
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if tops:
        span = max(tops) - min(bottoms)
        axes[0].set_ylim(min(bottoms) - 0.05 * span, max(tops) + 0.05 * span)
    axes[0].set_ylabel("held-out (test) loss, nats/byte")
    fig.suptitle(f"Held-out loss: mean over seeds {results['seeds']['evaluation']}, band = min–max", fontsize=10)
    fig.subplots_adjust(left=0.07, right=0.99, bottom=0.12, top=0.91, wspace=0.05)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _plot_test_loss(results: Mapping, path: Path) -> Path:
    plt = pyplot(_WHAT)
    keys = [m.key for m in METHODS if m.key in results["evaluation"]]
    fig, ax = plt.subplots(figsize=(7, 0.32 * len(keys) + 1.2))
    for i, key in enumerate(keys):
        losses = np.array([np.nan if v is None else v for v in results["evaluation"][key]["test_loss"]], float)
        ax.scatter(losses, np.full(len(losses), i), s=16, alpha=0.7, color=_style(key)["color"], linewidths=0)
        ax.plot([np.nanmean(losses)] * 2, [i - 0.3, i + 0.3], color="black", lw=1.2)
    ax.set_yticks(range(len(keys)), [METHODS_BY_KEY[k].label for k in keys], fontsize=8)
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlabel("held-out (test) loss at the last step, nats/byte (dots: seeds, bar: mean)")
    fig.subplots_adjust(left=0.25, right=0.98, bottom=0.9 / fig.get_figheight(), top=1 - 0.15 / fig.get_figheight())
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _plot_sweep(results: Mapping, path: Path) -> Path:
    plt = pyplot(_WHAT)
    fig, ax = plt.subplots(figsize=(7, 4))
    for m in METHODS:
        points = sorted(results["sweep"].get(m.key, []), key=lambda p: p["lr"])
        if not points:
            continue
        lrs = [p["lr"] for p in points]
        ax.plot(lrs, [np.nan if p["validation_loss"] is None else p["validation_loss"] for p in points], marker="o",
                ms=3, lw=1, label=m.label, **_style(m.key))
        best = results["best_lr"][m.key]
        ax.scatter([best], [next(p["validation_loss"] for p in points if p["lr"] == best)], s=60, facecolors="none",
                   edgecolors=_style(m.key)["color"])
    ax.set_xscale("log")
    ax.set_xlabel("learning rate (matrix lr for Muon / Dion)")
    ax.set_ylabel(f"validation loss, seed {results['seeds']['sweep']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.subplots_adjust(left=0.12, right=0.98, bottom=0.12, top=0.97)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_plots(results: Mapping, points: Mapping, folder: Path) -> list[Path]:
    """PNG plots of a study into ``folder``: ``loss_curves.png``, ``test_loss.png``,
    ``lr_sweep.png`` and ``sv_map_<schedule>.png`` (``ortho_verify.report.plots.singular_value_map``).
    Returns the written paths; [] if matplotlib is not installed."""
    try:
        pyplot(_WHAT)
    except ImportError:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # a method diverged on every seed: an all-NaN mean, drawn as nothing
        warnings.simplefilter("ignore", RuntimeWarning)
        paths = [_plot_curves(results, folder / "loss_curves.png"),
                 _plot_test_loss(results, folder / "test_loss.png"), _plot_sweep(results, folder / "lr_sweep.png")]
    for schedule in SV_SCHEDULES:
        pairs = {dtype: points.get((schedule, dtype), []) for dtype in SV_DTYPES}
        paths.append(singular_value_map(schedule, pairs, folder / f"sv_map_{schedule}.png"))
    return paths
