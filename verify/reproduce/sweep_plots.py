"""Plots of the size sweep (matplotlib, imported when drawing): each trend series' paired difference
against model size, and Dion's gap to Muon against the absolute rank r and the rank fraction r/d."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ortho_fast.functional.dion import dion_rank

from ..optional import pyplot
from .config import RANK_FRACTIONS
from .statistics import paired_difference, test_losses

__all__ = ["write_sweep_plots"]

_WHAT = "ortho-verify reproduce's plots"


def _plot_trends(results: Mapping, path: Path) -> Path:
    plt = pyplot(_WHAT)
    trends = results["trends"]
    cols = 4
    rows = -(-len(trends) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 2.9 * rows), squeeze=False)
    for ax, t in zip(axes.flat, trends):
        n = np.array(t["sizes"], float)
        per_seed = {}
        for i, d in enumerate(t["differences"]):
            for seed, v in d.items():
                per_seed.setdefault(seed, [np.nan] * len(n))[i] = np.nan if v is None else v
        for seed, values in per_seed.items():
            ax.plot(n, values, marker=".", lw=0.7, alpha=0.5, color="grey")
        means = np.array([np.nan if m is None else m for m in t["means"]], float)
        ax.plot(n, means, marker="o", lw=1.6, color="C0", label="mean over seeds")
        if t["slope"] is not None and np.isfinite(means).all():
            x = np.log(n)
            fit = means.mean() + t["slope"] * (x - x.mean())
            ax.plot(n, fit, ls="--", color="C3", lw=1, label=f"slope/doubling {t['per_doubling']:+.4f}")
        ax.axhline(0, color="black", lw=0.6)
        if not np.isfinite(means).any():  # a method not run (or diverged at every size): nothing to draw
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes, fontsize=8)
        ax.set_xlim(n.min() / 1.3, n.max() * 1.3)  # positive limits for the log axis even without data
        ax.set_xscale("log")
        ax.set_title(f"{t['label']}\ntrend: {t['verdict']}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(trends):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("parameters in the Muon / Dion matrices", fontsize=7)
    fig.suptitle("Paired difference (worse − better, per seed in grey) against model size", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _plot_rank(results: Mapping, path: Path) -> Path:
    plt = pyplot(_WHAT)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for i, r in enumerate(results["sizes"]):
        d = r["config"]["d_model"]
        muon = test_losses(r, "muon-jordan")
        ranks, fractions, gaps, spreads = [], [], [], []
        for fraction, name in RANK_FRACTIONS:
            gap = paired_difference(test_losses(r, f"dion-{name}-ef"), muon)
            if gap["finite"]:
                ranks.append(dion_rank(d, d, fraction, 1))
                fractions.append(fraction)
                gaps.append(gap["mean"])
                spreads.append(gap["spread"] or 0.0)
        for ax, x in zip(axes, (ranks, fractions)):
            ax.errorbar(x, gaps, yerr=spreads, marker="o", capsize=3, color=f"C{i}", label=f"d_model {d}")
    for ax, label in zip(axes, ("absolute rank r", "rank fraction r / d")):
        ax.set_xscale("log", base=2)
        ax.axhline(0, color="black", lw=0.6)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("Dion (EF) − Muon (Keller), test loss, paired")
    fig.suptitle("Dion's gap to Muon: does it follow r or r / d? (bars: spread over seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def write_sweep_plots(results: Mapping, folder: Path) -> list[Path]:
    """PNG plots of a size sweep into ``folder`` (``trends.png``, ``rank.png``); [] without
    matplotlib or without ``results["sizes"]``."""
    if not results.get("sizes"):
        return []
    try:
        pyplot(_WHAT)
    except ImportError:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return [_plot_trends(results, folder / "trends.png"), _plot_rank(results, folder / "rank.png")]
