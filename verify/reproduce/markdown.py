"""``docs/reproduction.md`` and ``results.json`` of ``ortho-verify reproduce``: the verdicts, the
results table, the claims, the singular-value map, the setup and the reproducibility notes."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

import ortho_fast
from ortho_fast.functional.dion import dion_rank

from ..inputs.data import build_model
from .claims import CLAIM_RULES
from .config import (
    CLOSE_MARGIN,
    MATCH_MARGIN,
    METHODS,
    METHODS_BY_KEY,
    RANK_FRACTIONS,
    SV_SCHEDULES,
    UNAVAILABLE_METHODS,
    ReproConfig,
    gpt_config,
)
from .device_plan import GPU_SWEEP, estimate_plan, plan_lines
from .plots import write_plots
from .statistics import mean_std_text, paired_difference, rule_derivation_lines, test_losses
from .sweep_markdown import render_sweep_sections
from .sweep_plots import write_sweep_plots

__all__ = ["render_markdown", "write_report"]


def _fmt_lr_sweep(results: Mapping, key: str) -> str:
    best = results["best_lr"][key]
    cells = []
    for p in sorted(results["sweep"][key], key=lambda p: p["lr"]):
        text = f"{p['lr']:g}: " + ("diverged" if p["validation_loss"] is None else f"{p['validation_loss']:.3f}")
        cells.append(f"**{text}**" if p["lr"] == best else text)
    return ", ".join(cells) + (" (edge)" if results["best_at_edge"][key] else "")


def _results_table(results: Mapping) -> list[str]:
    n = len(results["seeds"]["evaluation"])
    lines = [f"| method | lr sweep: validation loss at seed {results['seeds']['sweep']} (best in bold) | "
             f"test loss, mean ± std over {n} seeds | per seed | − AdamW (paired) | − Muon (Keller) (paired) |",
             "|---|---|---|---|---|---|"]
    for m in METHODS:
        if m.key not in results["evaluation"]:
            continue
        losses = test_losses(results, m.key)
        per_seed = ", ".join("diverged" if v is None else f"{v:.3f}" for v in losses.values())
        diffs = []
        for ref in ("adamw", "muon-jordan"):
            d = paired_difference(losses, test_losses(results, ref))
            diffs.append("—" if m.key == ref else "n/a" if not d["finite"] else
                         f"{d['mean']:+.4f}" + ("" if d["spread"] is None else f" ± {d['spread']:.4f}"))
        lines.append(f"| {m.label} | {_fmt_lr_sweep(results, m.key)} | {mean_std_text(losses.values())} | {per_seed} | "
                     f"{diffs[0]} | {diffs[1]} |")
    return lines


def _spectral_section(results: Mapping) -> list[str]:
    s = results["spectral"]
    if not s:
        why = ("`capture_points` is 0 (no gradient recorded)" if results["config"].get("capture_points", 1) == 0 else
               "every Muon (Keller) evaluation run diverged at its first step")
        return [f"No gradient was captured: {why}.", ""]
    lines = [
        f"{s['gradients']} raw gradients per seed (the Muon (Keller) evaluation runs at steps {s['steps']}: "
        f"{', '.join(s['names'])}) are orthogonalized by 5 Newton–Schulz steps of each schedule. "
        "For G = U Σ Vᵀ, the exact result is U f(σ̂) Vᵀ with σ̂ the singular values of the normalized G and f the "
        "composed step polynomial (`ortho_ref.ns_polynomial`); the measured points are uᵢᵀ X vᵢ of the computed X "
        "(`ortho_fast.newton_schulz`). Orthogonalization error: the distance of X to the polar factor U Vᵀ of G. "
        f"{s['below_band_fraction']:.1%} of the directions have σ̂ < 1e-3, below the interval Polar Express is "
        "designed for.",
        "",
        "| schedule (5 steps) | X₀ | computed | ‖X − UVᵀ‖_F/√k, mean ± std over seeds | "
        "worst \\|uᵢᵀXvᵢ − 1\\| on σ̂ᵢ ∈ [1e-3, 1] |",
        "|---|---|---|---|---|",
    ]
    for name in SV_SCHEDULES:
        e = s["schedules"][name]
        norm = ("" if e["safety"] == 1 else f"{e['safety']:g}·") + "‖G‖_F"
        x0 = f"G / ({norm} + {e['eps']:g})" if e["eps_mode"] == "add" else f"G / max({norm}, {e['eps']:g})"
        for kind in (k for k in e if isinstance(e[k], dict)):  # "exact", then the dtypes computed
            how = "exact map f(σ̂)" if kind == "exact" else kind
            lines.append(f"| {name} | {x0} | {how} | {mean_std_text(e[kind]['rms_by_seed'])} | "
                         f"{e[kind]['worst_in_band']:.3f} |")
    return lines + [""]


def _setup(results: Mapping) -> list[str]:
    c, corpus, config = results["config"], results["corpus"], _config_of(results)
    params = _parameter_counts(config)
    return [
        f"- **Data**: {corpus['source']}: the files are dealt into train / validation / test, one file in "
        f"{corpus['heldout_every']} to validation and one to test ({corpus['files']['train']} / "
        f"{corpus['files']['validation']} / {corpus['files']['test']} files, {corpus['bytes']['train']:,} / "
        f"{corpus['bytes']['validation']:,} / {corpus['bytes']['test']:,} bytes), so held-out text is never part of a "
        "training file. Tokens are bytes (vocabulary 256).",
        "- **Model**: the byte-level GPT-2-style decoder of `ortho_verify.inputs.data` (pre-norm blocks, fused qkv, "
        f"4× GELU MLP, untied lm_head): d_model {c['d_model']}, {_plural(c['n_layers'], 'layer')}, "
        f"{_plural(c['n_heads'], 'head')}, context {c['context']} bytes; {params}.",
        f"- **Training**: {c['steps']} steps of {c['batch_size']} random windows ({c['batch_size'] * c['context']} "
        "bytes) per step, the same for every method; for a given seed every method starts from the same weights "
        "and sees the same batches, so methods are compared per seed (paired). Every learning rate (matrix and "
        f"AdamW) follows the same schedule: linear warm-up over {_plural(config.warmup_steps(), 'step')}, then "
        f"cosine decay to {c['final_lr_fraction']:g} × the peak at the last step "
        "(`ortho_verify.reproduce.lr_multiplier`). Weight decay 0 for every method (the runs are short; decay would "
        "couple differently to each method's lr convention), so AdamW here is Adam with decoupled (zero) decay.",
        f"- **Optimizers**: as Muon and Dion are used in practice, only the hidden matrices (attention qkv and "
        "output projection, MLP fc and projection) are trained by Muon / Dion; the embeddings, LayerNorms and "
        "lm_head are trained by AdamW at the AdamW baseline's best learning rate "
        f"({results['scalar_lr']:g}), so that methods differ only in the optimizer of the matrices. AdamW: betas "
        f"{tuple(c['betas'])}, eps {c['adamw_eps']:g}. Muon: EMA momentum {c['momentum']} with Nesterov and 5 "
        f"Newton–Schulz steps in {c['ns_dtype']} (torch.optim.Muon's defaults) with Keller's coefficients "
        "(X₀ = U / max(‖U‖_F, 1e-7), U the Nesterov momentum) or Polar Express's (X₀ = U / (1.02‖U‖_F + 1e-6)); "
        f"lr scaled by {_MUON_LR_TEXT[config.muon_adjust_lr]}. Dion: Ahn et al. Algorithm 1 "
        f"(`ortho_fast`), μ {c['momentum']}, Householder QR, one power iteration, column-normalized Q, lr scaled by "
        f"√(m/n), rank r = rank fraction × min(m, n) ({_ranks(config)}); without error feedback M ← μ P Rᵀ instead of "
        "M ← B − (1 − μ) P Rᵀ."
        + _new_methods_text(c),
        f"- **Learning rates**: grids AdamW {list(c['adamw_lrs'])}, Muon / NorMuon {list(c['muon_lrs'])}, Dion / Dion2 "
        f"{list(c['dion_lrs'])}; each grid is extended by a factor {c['lr_factor']:g} beyond an edge that wins "
        f"(at most {_plural(c['lr_extensions'], 'time')}). The best lr of each method is chosen on the **validation** "
        f"split with the sweep seed {results['seeds']['sweep']}; the table reports the **test** split on the other "
        f"seeds {results['seeds']['evaluation']}, so neither the seed nor the text that chose the lr is the one "
        "reported.",
        f"- **Held-out loss**: mean next-byte cross-entropy in nats per byte over {c['eval_windows']} evenly spaced "
        f"windows of {c['context']} bytes of the split (ln 256 = 5.545 is chance).",
    ]


def _new_methods_text(c: Mapping) -> str:
    """The Setup's sentences on NorMuon and Dion2 (those of ``METHODS``), and the registry's methods
    this installation could not run (``UNAVAILABLE_METHODS``)."""
    text = ""
    normuon, dion2 = METHODS_BY_KEY.get("normuon"), METHODS_BY_KEY.get("dion2-1/4")
    if normuon is not None:
        text += (f" NorMuon (Li et al., arXiv 2510.05491; microsoft/dion's `normuon.py`): Muon with Polar Express "
                 f"as above, then each row (neuron) of the orthogonalized update O divided by √v + 1e-8, v the "
                 f"EMA (β₂ {normuon.normuon_beta2:g}) of the row's mean square of O, and the result rescaled to ‖O‖_F; "
                 "lr scaled as Muon's.")
    if dion2 is not None:
        text += (f" Dion2 (Ahn, Amsel, Langford, arXiv 2512.16928; microsoft/dion's `dion2.py`): the momentum buffer "
                 f"M ← M + G (no μ), the fraction {dion2.fraction:g} of the rows (m ≤ n) or columns (m > n) of M with "
                 f"the largest L1 norm selected, orthogonalized alone by 5 Polar Express steps in {c['ns_dtype']}, the "
                 f"update applied to those slices only and the selected slices of M decayed by ef_decay "
                 f"{dion2.ef_decay:g}; lr scaled by √(m/n) as Dion's.")
    if UNAVAILABLE_METHODS:
        text += " Not run (the installed `ortho_fast` lacks their options): " + ", ".join(
            f"{key} ({', '.join(options)})" for key, options in UNAVAILABLE_METHODS.items()) + "."
    return text


def _rule_numbers(rule: str) -> str:
    return ", ".join(str(i) for i, r in enumerate(CLAIM_RULES.values(), 1) if r == rule)


_MUON_LR_TEXT = {
    "spectral_norm": "√(m/n) per (m, n) matrix, Dion's convention (microsoft/dion's Muon), so that Muon and Dion "
                     "differ only in how they orthogonalize (torch.optim.Muon's √max(1, m/n) would give the MLP "
                     "output projection, d × 4d, twice Dion's step relative to the lr)",
    "original": "√max(1, m/n) per (m, n) matrix (torch.optim.Muon, Keller Jordan; Dion's √(m/n) gives the MLP "
                "output projection, d × 4d, half Muon's step relative to the lr)",
}


def _config_of(results: Mapping) -> ReproConfig:
    return ReproConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in results["config"].items()})


def _ranks(config: ReproConfig) -> str:
    side = config.d_model  # min(m, n) of every hidden matrix: (3d, d), (d, d), (4d, d), (d, 4d)
    return ", ".join(f"{name}: r = {dion_rank(side, side, f, 1)}" for f, name in RANK_FRACTIONS)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _parameter_counts(config: ReproConfig) -> str:
    model = build_model(gpt_config(config), torch.Generator().manual_seed(0))
    groups = ortho_fast.param_groups(model, algorithm="muon", lm_head_lr_scale=None)
    counts = {g["algorithm"]: sum(p.numel() for p in g["params"]) for g in groups}
    total = sum(p.numel() for p in model.parameters())
    return f"{total:,} parameters, {counts.get('muon', 0):,} of them in the matrices that Muon / Dion train"


def _reproducibility(results: Mapping) -> list[str]:
    env = results["environment"]
    load = env.get("load_average_at_start")
    load_text = "" if load is None else \
        f"; load average at start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1 / 5 / 15 min)"
    return [
        f"- Command: `{results.get('command', 'ortho-verify reproduce')}`; wall time {results['wall_seconds']:.0f} s "
        f"({results['run_seconds']:.0f} s of training summed over the runs; {_plural(env['jobs'], 'parallel job')} "
        f"of {_plural(env['torch_threads_per_job'], 'torch thread')}){load_text}.",
        f"- Seeds: learning-rate sweep {results['seeds']['sweep']}, evaluation {results['seeds']['evaluation']}; every "
        "random draw (initialization, batches, Dion's Q₀) comes from a `torch.Generator` seeded with the run's seed; "
        "`torch.use_deterministic_algorithms(True)` (warn only).",
        f"- Versions: Python {env['python'].split()[0]}, torch {env['torch']}"
        f"{', CUDA ' + env['cuda'] if env.get('cuda') else ''}, numpy {env['numpy']}, scipy "
        f"{env['scipy']}, matplotlib {env['matplotlib']}; git commit {env['git_commit'] or 'unknown'}"
        f"{' with uncommitted changes' if env.get('git_uncommitted_changes') else ''}.",
        f"- Hardware: {env['platform']}; {env['cpu']}, {env['cpu_count']} CPUs ({env['cpus_available']} available); "
        f"device {env['device']} ({env['device_name']}). Started {env['started_utc']}.",
        "- Configuration (`ortho_verify.reproduce.ReproConfig`; `results.json` holds it with every number of this "
        "page):",
        "",
        "```json",
        json.dumps(results["config"], sort_keys=True),
        "```",
    ]


def _sizes_text(results: Mapping) -> str:
    sizes = results.get("sizes")
    if not sizes:
        return ""
    return f" at each of {len(sizes)} model sizes (d_model {', '.join(str(r['config']['d_model']) for r in sizes)})"


def render_markdown(results: Mapping, plots: Sequence[str] = ()) -> str:
    """``docs/reproduction.md`` from a study's results: verdicts, results table, plots (names in
    ``plots``, relative to the markdown file), claims with their numbers and decision rules,
    the singular-value map, the setup and what is needed to rerun it; for a size sweep's
    results (``run_size_sweep``: ``sizes``), first the sweep's sections
    (``render_sweep_sections``), then the largest size in detail."""
    claims = results["claims"]
    shown = set(plots)

    def image(name: str, alt: str) -> list[str]:
        return [f"![{alt}]({name})", ""] if name in shown else []

    folder = "reproduction"
    lines = [
        "# Reproduction: Muon, NorMuon, Dion, Dion2 and Polar Express on real text",
        "",
        *_rejudged_lines(results),
        f"Generated by `{results.get('command', 'ortho-verify reproduce')}` — do not edit by hand: rerun it to "
        "regenerate this page, its plots and the raw numbers (`reproduction/results.json`). "
        f"{len(results['evaluation'])} methods × ({len(results['seeds']['evaluation'])} evaluation seeds + a "
        f"learning-rate sweep){_sizes_text(results)} on {results['environment']['device']} in "
        f"{results['wall_seconds'] / 60:.1f} min. "
        "Scale matters: these are small models trained for a short time, and a claim that does not reproduce here "
        "may still hold at the papers' scale (see *Running at scale on one GPU*).",
        "",
        *_measurement_banner(results),
        *(render_sweep_sections(results, plots) if results.get("sizes") else []),
        "## Verdicts" + (f" at d_model {results['config']['d_model']}" if results.get("sizes") else ""),
        "",
        f"Each claim with the published evidence it is compared with (and the scale it was made at), the paired "
        f"difference measured here, the run's *resolution* — the smallest difference its rule can decide at these "
        f"{len(results['seeds']['evaluation'])} seeds and {results['config']['steps']} steps, from the measured "
        "spread (*Decision rules*) — and the verdict.",
        "",
        "| # | claim | published evidence (scale) | measured | resolution | verdict |",
        "|---|---|---|---|---|---|",
        *(f"| {i} | {c['statement']} | {c.get('published') or c['source']} | {c['measured']} | {c.get('power', '')} "
          f"| **{c['verdict']}**{_reason_cell(c)} |" for i, c in enumerate(claims, 1)),
        "",
        "## Held-out loss per method",
        "",
        *_results_table(results),
        "",
        *image(f"{folder}/loss_curves.png", "held-out loss curves"),
        *image(f"{folder}/test_loss.png", "final held-out loss per seed"),
        *image(f"{folder}/lr_sweep.png", "learning-rate sweep"),
        "## Claims",
        "",
    ]
    for i, c in enumerate(claims, 1):
        lines += [f"{i}. **{c['statement']}** ({c['source']}). {c['sentence']} *Rule:* {c['rule']}.", ""]
    lines += [
        "## Singular-value map on the model's gradients",
        "",
        *_spectral_section(results),
        *image(f"{folder}/sv_map_jordan.png", "singular-value map, Keller's coefficients"),
        *image(f"{folder}/sv_map_polar_express.png", "singular-value map, Polar Express"),
        "## Setup",
        "",
        *_setup(results),
        "",
        "## Decision rules",
        "",
        f"*Lower*: claims {_rule_numbers('lower')}; *within δ*: claims {_rule_numbers('within')}, δ = "
        f"{MATCH_MARGIN:.1%} (matches) / {CLOSE_MARGIN:.1%} (stays close) of the reference's mean test loss, fixed "
        "in `ortho_verify.reproduce` (`MATCH_MARGIN`, `CLOSE_MARGIN`) before any run; the numbers are printed so "
        "that a reader can apply another margin. Derivation (`ortho_verify.reproduce.statistics`):",
        "",
        *rule_derivation_lines(),
        "",
        *_gpu_section(results),
        "## Reproducibility",
        "",
        *_reproducibility(results),
        "",
    ]
    return "\n".join(lines)


def _rejudged_lines(results: Mapping) -> list[str]:
    r = results.get("rejudged")
    if not r:
        return []
    return [f"Verdicts, trends and rules re-judged by `{r['command']}` on {r['date']} from the stored results of the "
            "run described below, with the decision rules of this page (no training run repeated: the losses, "
            "curves and plots are that run's).", ""]


def _reason_cell(claim: Mapping) -> str:
    return f" ({claim['reason']})" if claim["verdict"] == "inconclusive" and claim.get("reason") else ""


def _measurement_banner(results: Mapping) -> list[str]:
    if results.get("mode") != "measurement":
        return []
    return [f"**Measurement run** ({results.get('mode_reason') or 'a measurement'}): it decides no claim. Every "
            "verdict below reads *measured*: the paired differences and the run's resolution are reported as "
            "measurements of the code path, not as evidence for or against the papers.", ""]


def _gpu_section(results: Mapping) -> list[str]:
    plan = results.get("gpu_plan") or estimate_plan(GPU_SWEEP)
    return ["## Running at scale on one GPU", "",
            "`ortho-verify reproduce --device cuda` runs the GPU plan (`ortho_verify.reproduce.device_plan`): "
            "Muon vs AdamW, Dion r = 1/4 with error feedback, Dion2 f = 1/4 and NorMuon vs Muon at a size ladder "
            "up to the GPT-2-small shape (12 layers, d_model 768, 12 heads; with a byte vocabulary 86 M "
            "parameters instead of GPT-2's 124 M, whose 50,257-token embedding holds 38.6 M), on this page's "
            "corpus, under bf16 autocast, each claim judged per size and its trend across sizes with the rules "
            "above. `ortho-verify reproduce --device cuda --dry-run` prints this plan and runs it at tiny sizes on "
            "the CPU (a measurement run). The estimate, from FLOPs (training 6·N·tokens plus attention, the "
            "optimizer's Newton–Schulz / Dion products and the held-out evaluations) before any run:", "",
            *plan_lines(plan), ""]


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_report(results: dict, points: Mapping, out: Path, *, plots: bool = True) -> Path:
    """Write ``out/reproduction.md``, ``out/reproduction/*.png`` and ``out/reproduction/results.json``
    (non-finite numbers as null). ``plots`` False keeps the PNGs already in ``out/reproduction``
    (``--rejudge``: the singular-value points are not in results.json; ``--no-plots``) and links
    those that exist.
    Returns the markdown's path. Raises: OSError if ``out`` cannot be written."""
    out = Path(out)
    folder = out / "reproduction"
    folder.mkdir(parents=True, exist_ok=True)
    if plots:
        written = [f"reproduction/{p.name}" for p in write_plots(results, points, folder)]
        written += [f"reproduction/sizes/{p.name}" for p in write_sweep_plots(results, folder / "sizes")]
    else:
        written = sorted(p.relative_to(out).as_posix() for p in folder.rglob("*.png"))
    plots = written
    (folder / "results.json").write_text(json.dumps(_json_safe(results), indent=1) + "\n")
    path = out / "reproduction.md"
    path.write_text(render_markdown(results, plots))
    return path
