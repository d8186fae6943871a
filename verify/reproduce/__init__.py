"""Research reproduction: the papers' claims on Muon, NorMuon, Dion, Dion2 and Polar Express, re-measured on real text.

``ortho-verify reproduce`` (or ``python -m ortho_verify.reproduce``) trains the byte-level GPT of
``ortho_verify.inputs.data`` on the running Python's standard-library sources, split by file into train,
validation and test (``ortho_verify.inputs.data.stdlib_split``), with AdamW, Muon (Keller Jordan's and the
Polar Express coefficients), NorMuon, Dion at rank fractions 1, 1/4 and 1/16 with and without error
feedback, and Dion2 at fraction 1/4. Protocol:

1. learning-rate sweep on the sweep seed, judged on the validation split (AdamW first: its best
   lr also trains the non-matrix parameters of every Muon / Dion run); a best lr at the edge of
   its grid extends the grid by one point in that direction (``lr_extensions`` rounds);
2. each method at its own best lr on the evaluation seeds (never the sweep seed), judged on the
   test split; equal steps and batches for every method, and for a given seed the same
   initialization and the same batches (paired comparisons);
3. the singular-value map of Newton–Schulz on the raw gradients of the Muon (Keller) runs;
4. each claim is a pure function of the results (``evaluate_claims``) with a stated decision
   rule, and ``docs/reproduction.md`` with its plots and ``results.json`` is written from them.

5. by default all of this at several model widths (``scaling.run_size_sweep``): each claim judged at
   each size, and the trend of its paired difference against model size (``trend``), with the
   cost per step of each method; every run cached per (method and its code, size, seed, lr)
   (``cache``), so that ``--resume`` reruns only what changed.

6. every verdict carries its power: a claim is decided only when the run's paired spread over seeds can
   resolve it (``statistics``: one-sided paired t bounds, the resolution at power 0.8), else it is
   inconclusive with the reason; ``--quick`` and ``--dry-run`` are measurement runs that decide nothing;
   ``--device cuda`` runs the GPU plan (``device_plan``: a ladder up to the GPT-2-small shape, its time
   and memory estimated from FLOPs; ``--dry-run`` prints it and runs it at tiny sizes on the CPU).

Modules: ``config`` (methods, ``ReproConfig``, lr schedule, trend series), ``training`` (one run),
``pool`` (parallel runs), ``cache`` (run cache), ``sweep`` (lr sweep), ``spectral`` (singular-value
map), ``study`` (``run_study``), ``scaling`` (the size sweep), ``trend`` (the trend rule),
``statistics`` (paired differences, verdicts), ``claims``, ``plots`` / ``sweep_plots``, ``markdown`` /
``sweep_markdown`` (``docs/reproduction.md``, ``results.json``), ``cli`` / ``sweep_cli``, ``device_plan`` (the
GPU plan and its estimate), ``rejudge`` (a stored run judged again). Every public name is importable from
``ortho_verify.reproduce``; the methods' optimizer options come from ``ortho_verify.registry``.

Sources: Jordan et al., "Muon" (2024 blog); Liu et al., arXiv 2502.16982 (Moonlight); Ahn et
al., arXiv 2504.05295 (Dion); Amsel et al., arXiv 2505.16932 (Polar Express); Li et al., arXiv
2510.05491 (NorMuon); Ahn, Amsel, Langford, arXiv 2512.16928 (Dion2).
"""

from .cache import (
    CACHE_FORMAT,
    CachedRunner,
    RunCache,
    code_files,
    default_cache_dir,
    method_fingerprint,
    method_fingerprints,
    run_key,
)
from .claims import (
    CLAIM_RULES,
    CLAIMS,
    MEASURED,
    PUBLISHED,
    Claim,
    claim_dion2_quarter_close,
    claim_dion_full_rank_matches_muon,
    claim_dion_quarter_rank_close,
    claim_error_feedback_needed,
    claim_muon_beats_adamw,
    claim_normuon_beats_muon,
    claim_polar_express_more_accurate,
    evaluate_claims,
)
from .cli import build_parser, main, verdict_lines
from .config import (
    CLOSE_MARGIN,
    FAMILIES,
    FLAT_REFERENCE,
    MATCH_MARGIN,
    METHODS,
    METHODS_BY_KEY,
    MUON_LR_CONVENTIONS,
    NS_DTYPES,
    QUICK,
    RANK_FRACTIONS,
    RESULTS_FORMAT,
    SV_DTYPES,
    SV_SCHEDULES,
    TREND_SERIES,
    UNAVAILABLE_METHODS,
    VERDICTS,
    Method,
    ReproConfig,
    TrendSeries,
    gpt_config,
    lr_multiplier,
    method_options,
    missing_options,
)
from .device_plan import (
    DRY_RUN_SWEEP,
    GPU_METHODS,
    GPU_SWEEP,
    dry_run_sweep,
    estimate_plan,
    plan_lines,
    plan_parameter_counts,
)
from .markdown import render_markdown, write_report
from .plots import write_plots
from .pool import Runner, init_worker
from .rejudge import load_results, rejudge
from .scaling import (
    DEFAULT_SWEEP,
    LR_SWEEP_MODES,
    QUICK_SWEEP,
    ModelSize,
    SizeSweep,
    cost_table,
    parameter_counts,
    run_size_sweep,
    series_differences,
    size_trends,
)
from .spectral import singular_value_study
from .statistics import (
    ALPHA,
    POWER,
    decide_lower,
    decide_within,
    difference_text,
    lower_verdict,
    mean_std_text,
    paired_difference,
    resolution,
    rule_derivation_lines,
    test_losses,
    within_verdict,
)
from .study import MODES, cpu_model, environment, run_study, study_methods
from .sweep import best_learning_rate, sweep_learning_rates
from .sweep_markdown import SWEEP_PLOTS, render_sweep_sections, trend_rule_text
from .sweep_plots import write_sweep_plots
from .training import build_optimizer, corpus, heldout_loss, train_run
from .trend import FLAT_MARGIN, TRENDS, seed_slopes, trend_verdict

__all__ = [
    "CLAIMS", "CLOSE_MARGIN", "Claim", "MATCH_MARGIN", "METHODS", "Method", "QUICK", "ReproConfig", "VERDICTS",
    "best_learning_rate", "build_optimizer", "build_parser", "claim_dion_full_rank_matches_muon",
    "claim_dion_quarter_rank_close", "claim_error_feedback_needed", "claim_muon_beats_adamw",
    "claim_polar_express_more_accurate", "environment", "evaluate_claims", "lower_verdict", "lr_multiplier", "main",
    "paired_difference", "render_markdown", "run_study", "singular_value_study", "train_run", "within_verdict",
    "write_plots", "write_report",
    # also public since the split into a package
    "METHODS_BY_KEY", "MUON_LR_CONVENTIONS", "NS_DTYPES", "RANK_FRACTIONS", "RESULTS_FORMAT", "Runner", "SV_DTYPES",
    "SV_SCHEDULES", "corpus", "cpu_model", "difference_text", "gpt_config", "heldout_loss", "init_worker",
    "mean_std_text", "method_options", "sweep_learning_rates", "test_losses",
    # the model-size sweep
    "CACHE_FORMAT", "CachedRunner", "DEFAULT_SWEEP", "FLAT_MARGIN", "FLAT_REFERENCE", "LR_SWEEP_MODES", "ModelSize",
    "QUICK_SWEEP", "RunCache", "SWEEP_PLOTS", "SizeSweep", "TRENDS", "TREND_SERIES", "TrendSeries", "code_files",
    "cost_table", "default_cache_dir", "method_fingerprint", "method_fingerprints", "parameter_counts",
    "render_sweep_sections", "run_key", "run_size_sweep", "seed_slopes", "series_differences", "size_trends",
    "trend_rule_text", "trend_verdict", "write_sweep_plots",
    # NorMuon and Dion2
    "CLAIM_RULES", "FAMILIES", "UNAVAILABLE_METHODS", "claim_dion2_quarter_close", "claim_normuon_beats_muon",
    "missing_options",
    # verdicts with their power, measurement runs, the GPU plan
    "ALPHA", "DRY_RUN_SWEEP", "GPU_METHODS", "GPU_SWEEP", "MEASURED", "MODES", "POWER", "PUBLISHED", "decide_lower",
    "decide_within", "dry_run_sweep", "estimate_plan", "plan_lines", "plan_parameter_counts", "resolution",
    "rule_derivation_lines", "study_methods", "verdict_lines", "load_results", "rejudge",
]
