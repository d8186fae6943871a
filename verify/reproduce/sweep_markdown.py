"""The size sweep's sections of ``docs/reproduction.md``: the trend rule, each claim's verdict at
each size with its trend, the rank as a fraction and as an absolute r, the cost per method, and
what the cache reused."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ortho_fast.functional.dion import dion_rank

from .claims import CLAIM_RULES
from .config import METHODS, METHODS_BY_KEY, RANK_FRACTIONS
from .statistics import mean_std_text, paired_difference, test_losses
from .trend import FLAT_MARGIN

__all__ = ["SWEEP_PLOTS", "render_sweep_sections", "trend_rule_text"]

#: The sweep's plots (in the report's folder), with their alt texts.
SWEEP_PLOTS = (("sizes/trends.png", "paired difference of each claim against model size"),
               ("sizes/rank.png", "Dion − Muon against the absolute rank r and the rank fraction r/d"))


def trend_rule_text() -> str:
    """The trend rule as the report states it (``ortho_verify.reproduce.trend``)."""
    return (
        "For each evaluation seed, the least-squares slope b of the paired difference against ln N (N the "
        "parameters in the matrices Muon / Dion train; the same seeds at every size, so the comparison stays "
        "paired); b̄ and *spread* are the mean and sample standard deviation of b over seeds, Δ = ln(N_max / N_min), "
        "σ the sign of the mean difference at the smallest size (the gap as first measured). **flat** if "
        f"(|b̄| + spread)·Δ ≤ δ_flat = {FLAT_MARGIN:.0%} of the reference level (Muon (Keller)'s mean test loss; "
        f"for claim {list(CLAIM_RULES).index('polar_express') + 1} Keller's mean distance to UVᵀ) averaged over sizes; "
        "else **shrinks** if σ·b̄ + spread < 0 (the gap moves towards zero); else **grows** if σ·b̄ − spread > 0; else "
        "**inconclusive** (also with fewer than 2 seeds finite at every size). Slopes are printed per doubling of N "
        "(b·ln 2).")


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _diff_cell(diff: Mapping) -> str:
    if not diff["finite"]:
        return "n/a"
    return f"{diff['mean']:+.4f}" + ("" if diff["spread"] is None else f" ± {diff['spread']:.4f}")


def _size_header(sizes: Sequence[Mapping]) -> str:
    return " | ".join(f"d {r['config']['d_model']} (N {r['parameters']['matrices']:,})" for r in sizes)


def _verdict_table(results: Mapping) -> list[str]:
    sizes = results["sizes"]
    lines = [f"| # | claim | {_size_header(sizes)} |", "|---|---|" + "---|" * len(sizes)]
    for i, claim in enumerate(results["claims"], 1):
        cells = []
        for r in sizes:
            c = next((c for c in r["claims"] if c["key"] == claim["key"]), None)
            cells.append("—" if c is None else f"{c['measured']}: **{c['verdict']}**")
        lines.append(f"| {i} | {claim['statement']} | " + " | ".join(cells) + " |")
    return lines


def _trend_table(results: Mapping) -> list[str]:
    sizes = results["sizes"]
    number = {c["key"]: i for i, c in enumerate(results["claims"], 1)}
    widths = ", ".join(str(r["config"]["d_model"]) for r in sizes)
    lines = [f"| paired difference | claim | mean at d_model {widths} | slope per doubling of N ± spread "
             "| change over the sweep | δ_flat | trend |",
             "|---|---|---|---|---|---|---|"]
    for t in results["trends"]:
        means = ", ".join("n/a" if m is None else f"{m:+.4f}" for m in t["means"])
        slope = "n/a" if t["slope"] is None else f"{t['per_doubling']:+.4f} ± {t['spread'] * np.log(2):.4f}"
        change = "n/a" if t["change_over_range"] is None else f"{t['change_over_range']:+.4f}"
        flat = "n/a" if not np.isfinite(t["flat_margin"] or np.nan) else f"{t['flat_margin']:.4f}"
        claim = str(number[t["claim"]]) if t["claim"] in number else "—"
        lines.append(f"| {t['label']} | {claim} | {means} | {slope} over {t['seeds']} seeds | {change} | {flat} | "
                     f"**{t['verdict']}** |")
    return lines


def _rank_table(results: Mapping) -> list[str]:
    lines = ["| method | d_model | r / d | r | Dion − Muon (Keller), paired | no EF − EF, paired |",
             "|---|---|---|---|---|---|"]
    for r in results["sizes"]:
        d = r["config"]["d_model"]
        muon = test_losses(r, "muon-jordan")
        for fraction, name in RANK_FRACTIONS:
            ef, noef = f"dion-{name}-ef", f"dion-{name}-noef"
            if ef not in r["evaluation"]:
                continue
            rank = dion_rank(d, d, fraction, 1)
            gap = paired_difference(test_losses(r, ef), muon)
            feedback = paired_difference(test_losses(r, noef), test_losses(r, ef))
            lines.append(f"| {METHODS_BY_KEY[ef].label} | {d} | {name} | {rank} | {_diff_cell(gap)} | "
                         f"{_diff_cell(feedback)} |")
    return lines


def _cost_table(results: Mapping) -> list[str]:
    cost = results["cost"]
    lines = ["| method | " + " | ".join(f"d {row['d_model']}: test loss | ms per step (× Muon)" for row in cost) + " |",
             "|---|" + "---|---|" * len(cost)]
    for m in METHODS:
        cells = []
        for row, r in zip(cost, results["sizes"]):
            s, ratio = row["seconds_per_step"].get(m.key), row["ratio_to_muon"].get(m.key)
            cells.append(mean_std_text(test_losses(r, m.key).values()) if m.key in r["evaluation"] else "—")
            cells.append("n/a" if s is None else f"{1e3 * s:.1f} (×{ratio:.2f})" if ratio else f"{1e3 * s:.1f}")
        lines.append(f"| {m.label} | " + " | ".join(cells) + " |")
    return lines


def _lr_table(results: Mapping) -> list[str]:
    sizes = results["sizes"]
    lines = [f"| method | best lr at {' | '.join(str(r['config']['d_model']) for r in sizes)} |",
             "|---|" + "---|" * len(sizes)]
    for m in METHODS:
        cells = []
        for r in sizes:
            lr = r["best_lr"].get(m.key)
            edge = " (edge)" if r["best_at_edge"].get(m.key) else ""
            cells.append("—" if lr is None else f"{lr:g}{edge}")
        lines.append(f"| {m.label} | " + " | ".join(cells) + " |")
    return lines


def render_sweep_sections(results: Mapping, plots: Sequence[str] = ()) -> list[str]:
    """The size sweep's sections (markdown lines) from ``run_size_sweep``'s results; ``plots``:
    the plot files written (relative to the markdown file), those of ``SWEEP_PLOTS`` are shown."""
    sizes, sweep, cache = results["sizes"], results["size_sweep"], results.get("cache") or {}
    shown = set(plots)
    shapes = "; ".join(f"d_model {r['config']['d_model']}: {_count(r['config']['n_layers'], 'layer')}, "
                       f"{_count(r['config']['n_heads'], 'head')}, {r['config']['steps']} steps, "
                       f"{r['parameters']['total']:,} parameters ({r['parameters']['matrices']:,} in the matrices)"
                       for r in sizes)
    smallest = sizes[0]["config"]["d_model"]
    lr_text = {
        "each": "every size sweeps its own learning rates (the grids of *Setup*, on its validation split)",
        "shared": f"the learning rates are swept at d_model {smallest} only and reused at the other sizes "
                  "(`--lr-sweep shared`); `--lr-sweep each` sweeps every size",
        "matrix-shared": f"every size sweeps AdamW's learning rate (it also trains the embeddings, LayerNorms and "
                         f"lm_head of every method), Muon's and Dion's are swept at d_model {smallest} and reused at "
                         "the other sizes (`--lr-sweep matrix-shared`: their √(m/n) lr scale is meant to transfer "
                         "across widths); `--lr-sweep each` sweeps every method at every size",
    }[sweep["lr_sweep"]]
    lines = [
        "## Model-size sweep",
        "",
        f"Every method at {len(sizes)} sizes ({shapes}); batch, context, schedule and seeds as in *Setup*; "
        f"{lr_text}. Each claim is judged at each size with the rules of *Decision rules* (paired over seeds: "
        "*lower* is reproduced if mean(d) − h > 0; *matches* / *stays close* if the run resolves δ and "
        "|mean(d)| + h ≤ δ, h = t_α·spread(d)/√n), then its paired difference is followed across sizes.",
        "",
        f"*Trend rule* (stated before any run, `ortho_verify.reproduce.trend`): {trend_rule_text()}",
        "",
        "### Verdict per size",
        "",
        *_verdict_table(results),
        "",
        "### Trend of each paired difference against model size",
        "",
        *_trend_table(results),
        "",
    ]
    for name, alt in SWEEP_PLOTS[:1]:
        if f"reproduction/{name}" in shown:
            lines += [f"![{alt}](reproduction/{name})", ""]
    lines += [
        "### Rank as a fraction and as an absolute r",
        "",
        "r = rank fraction × min(m, n) = fraction × d_model for every hidden matrix. The same r appears at two sizes "
        "at different fractions (and the same fraction at different r): if the gap to Muon follows r / d, the "
        "rows of one fraction agree across sizes; if it follows r, the rows of one r do.",
        "",
        *_rank_table(results),
        "",
    ]
    for name, alt in SWEEP_PLOTS[1:]:
        if f"reproduction/{name}" in shown:
            lines += [f"![{alt}](reproduction/{name})", ""]
    lines += [
        "### Cost per method",
        "",
        "Test loss (mean ± std over seeds) next to the wall time per training step (batch, forward, backward, "
        "optimizer step) and its ratio to Muon (Keller) at the same size: "
        + ("timed serially after the training runs (`ortho_verify.reproduce.cost.time_steps`: seed 0, each method "
           "at its best lr, 3 interleaved rounds of 8 steps after 2 warm-up steps, median)"
           if results["cost"] and results["cost"][0].get("source") == "serial" else
           "median over the evaluation runs, timed while other runs shared the machine")
        + f", {_count(results['environment']['torch_threads_per_job'], 'torch thread')}, on a CPU other processes "
        "share, so ratios are indicative. Dion's claim is loss per unit of compute *and communication*, and on one "
        "device there is no communication to save (see `docs/performance.md` for the distributed volumes).",
        "",
        *_cost_table(results),
        "",
        "### Learning rates per size",
        "",
        *_lr_table(results),
        "",
        f"Cache: {cache.get('hits', 0)} runs reused from `--cache` (training time when they ran: "
        f"{cache.get('cached_seconds', 0.0):.0f} s), {cache.get('misses', 0)} run now"
        f"{' (--resume)' if cache.get('resume') else ''}.",
        "",
        f"The sections below detail the largest size, d_model {sizes[-1]['config']['d_model']}.",
        "",
    ]
    return lines
