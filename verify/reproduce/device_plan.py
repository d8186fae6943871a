"""The GPU plan of ``ortho-verify reproduce --device cuda``: a size ladder up to the GPT-2-small shape
(12 layers, d_model 768, 12 heads: the modded-nanogpt / NanoGPT speedrun model) for the claims most in
question — Dion r = 1/4 with error feedback, Dion2 f = 1/4, NorMuon vs Muon — and Muon vs AdamW, with
2 seeds, and its cost estimated from FLOPs before any run (``estimate_plan``).

The estimate. Per training step of a model with N parameters in matrix products (the blocks' matrices
and lm_head), L layers, width d and T = batch × context tokens: 6·N·T for the forward and backward
passes plus 6·L·context·d·T for attention's score and value products (Kaplan et al. 2020, arXiv
2001.08361, Table 1: forward 2N + 2·L·context·d per token, backward twice that), at the bfloat16 rate
(the forward runs under bf16 autocast, ``training.autocast``). The optimizer's own products per step and
matrix (m ≤ n its sides): Muon and NorMuon 5·(4m²n + 2m³) (5 Newton–Schulz steps), in bfloat16; Dion2 the same on its
selected f·m rows; Dion 8·m·n·r + 2·m·r² (B·Q, Bᵀ·P, P·Rᵀ
into the error feedback, P·Qᵀ into the weights, and the Householder QR of the (m, r) block), in float32;
AdamW none counted (a few elementwise passes). Each held-out evaluation costs 2·N·W + 2·L·context·d·W
for W = windows × context tokens. Seconds = FLOPs / (``UTILIZATION`` × rate) + a launch cost per step
(``STEP_OVERHEAD_S`` + ``LAYER_OVERHEAD_S`` per layer), the rates ``BF16_FLOPS`` and ``FP32_FLOPS``
measured on one H100 (dense 8192³ GEMMs, 2026-11-26, torch 2.11+cu130); an H200 has the same tensor
cores and more memory bandwidth. ``UTILIZATION`` and the launch costs are assumptions, stated as such in
every printed estimate: eager PyTorch at width 768 reaches a fraction of an 8192³ GEMM's rate, and each
step launches on the order of a hundred small kernels per layer (the launch-bound regime of the
optimizer step at these widths).

Memory (peak, one run): float32 weights and gradients (8 bytes per parameter), the optimizer state
(AdamW 8 bytes per parameter it trains; Muon / NorMuon / Dion / Dion2 a float32 momentum per matrix
entry), the bf16 weight copies autocast keeps (2 bytes per matrix parameter), and the activations kept
for the backward pass, 34·context·batch·d bytes per layer (Korthikanti et al. 2022, arXiv 2205.05198,
Eq. 1 without its attention-score term, which the fused scaled-dot-product attention does not store),
plus the float32 logits and their gradient.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ortho_fast.functional.dion import dion_rank

from .config import METHODS_BY_KEY, ReproConfig
from .scaling import ModelSize, SizeSweep
from .study import study_methods
from .training import corpus

__all__ = ["BF16_FLOPS", "BUDGET_SECONDS", "DRY_RUN_SWEEP", "FP32_FLOPS", "GPU_METHODS", "GPU_SWEEP",
           "LAYER_OVERHEAD_S", "STEP_OVERHEAD_S", "UTILIZATION", "dry_run_sweep", "estimate_plan", "model_shapes",
           "optimizer_flops", "plan_lines", "plan_parameter_counts", "run_seconds"]

#: Dense bf16 GEMM rate of one H100 (8192³, measured 2026-11-26 with torch 2.11+cu130), FLOP/s.
BF16_FLOPS = 801e12
#: Dense float32 GEMM rate of one H100 without TF32 (same measurement), FLOP/s.
FP32_FLOPS = 51e12
#: Assumed fraction of those rates that eager PyTorch reaches at the plan's widths (768 and below).
UTILIZATION = 0.25
#: Assumed fixed cost per training step (batch transfer, loss, schedule), seconds.
STEP_OVERHEAD_S = 0.003
#: Assumed launch cost per layer and training step (its forward, backward and optimizer kernels), seconds.
LAYER_OVERHEAD_S = 0.0012
#: The largest size's estimated time must stay within this (10 minutes on one H100 / H200).
BUDGET_SECONDS = 600.0

#: The methods of the GPU plan: Muon vs AdamW, Dion r = 1/4 with error feedback and Dion2 f = 1/4 against
#: their Muon references, NorMuon against Muon (Polar Express); those this ``ortho_fast`` cannot run are left out.
GPU_METHODS = tuple(k for k in ("adamw", "muon-jordan", "muon-polar_express", "normuon", "dion-1/4-ef", "dion2-1/4")
                    if k in METHODS_BY_KEY)

#: The GPU ladder: widths 128, 384, 768 with 2, 6, 12 layers and head size 64 (the last is GPT-2 small's
#: shape with a byte vocabulary; 216× the matrix parameters of the first), 1024-byte context, 32 windows per
#: step, the same steps at every size (so tokens per parameter fall with size), 2 evaluation seeds; learning
#: rates of Muon / Dion / Dion2 swept at the smallest size and reused (their √(m/n) scale is meant to transfer
#: across widths), AdamW's swept at every size; no gradient capture (``ReproConfig.capture_points``).
GPU_SWEEP = SizeSweep(
    replace(ReproConfig(), context=1024, batch_size=32, steps=300, curve_points=4, eval_windows=256, seeds=(1, 2),
            lr_extensions=1, capture_points=0),
    (ModelSize(128, 2, 2), ModelSize(384, 6, 6), ModelSize(768, 12, 12)), lr_sweep="matrix-shared",
    methods=GPU_METHODS)


def dry_run_sweep(sweep: SizeSweep = GPU_SWEEP) -> SizeSweep:
    """``sweep`` at tiny sizes for a CPU dry run through the same code path: the same methods, seeds,
    lr-sweep mode and layer counts at widths 8, 16, 24 (…, one per size), 2 heads, context 16, 4
    windows per step, 4 steps, 8 held-out windows, one lr per grid and no extension."""
    base = replace(sweep.base, context=16, batch_size=4, steps=4, curve_points=1, eval_windows=8, lr_extensions=0,
                   adamw_lrs=sweep.base.adamw_lrs[1:2], muon_lrs=sweep.base.muon_lrs[1:2],
                   dion_lrs=sweep.base.dion_lrs[2:3])
    sizes = tuple(ModelSize(8 * (i + 1), min(2, s.n_layers), 2) for i, s in enumerate(sweep.sizes))
    return replace(sweep, base=base, sizes=sizes)


#: ``dry_run_sweep(GPU_SWEEP)``.
DRY_RUN_SWEEP = dry_run_sweep(GPU_SWEEP)


def model_shapes(config: ReproConfig) -> list[tuple[int, int]]:
    """(m, n) of every matrix Muon / Dion train in ``ortho_verify.inputs.data``'s GPT at ``config``'s size:
    per layer attention qkv (3d, d) and projection (d, d), MLP fc (4d, d) and projection (d, 4d)."""
    d = config.d_model
    return [shape for _ in range(config.n_layers) for shape in ((3 * d, d), (d, d), (4 * d, d), (d, 4 * d))]


def plan_parameter_counts(config: ReproConfig) -> dict:
    """{"total", "matrices"} of ``ortho_verify.inputs.data``'s GPT at ``config``'s size, counted from its shapes
    (``scaling.parameter_counts`` builds the model; this does not, so an 86 M-parameter plan costs
    nothing): embeddings 256·d + context·d, per layer 12·d² in matrices and two LayerNorms (4·d), the
    final LayerNorm 2·d and lm_head 256·d."""
    d, layers = config.d_model, config.n_layers
    matrices = 12 * layers * d * d
    return {"total": 256 * d + config.context * d + matrices + 4 * d * layers + 2 * d + 256 * d, "matrices": matrices}


def optimizer_flops(key: str, shapes: list[tuple[int, int]]) -> tuple[float, float]:
    """(bf16 FLOPs, float32 FLOPs) of one optimizer step of method ``key`` (module docstring)."""
    method = METHODS_BY_KEY[key]
    bf16 = fp32 = 0.0
    for shape in shapes:
        m, n = sorted(shape)
        if method.family == "muon":
            bf16 += 5 * (4 * m * m * n + 2 * m ** 3)
        elif method.family == "dion2":
            k = max(1, math.ceil(method.fraction * m))
            bf16 += 5 * (4 * k * k * n + 2 * k ** 3)
        elif method.family == "dion":
            r = dion_rank(m, n, method.rank_fraction, 1)
            fp32 += 8 * m * n * r + 2 * m * r * r
    return bf16, fp32


def run_seconds(config: ReproConfig, key: str, *, evaluations: int, matmul: int) -> tuple[float, float]:
    """(seconds, FLOPs) of one run of method ``key`` at ``config``'s size (module docstring)."""
    tokens = config.batch_size * config.context
    attention = 6 * config.n_layers * config.context * config.d_model
    train = (6 * matmul + attention) * tokens * config.steps
    evaluate = (2 * matmul + attention / 3) * config.eval_windows * config.context * evaluations
    bf16, fp32 = optimizer_flops(key, model_shapes(config))
    seconds = ((train + evaluate + bf16 * config.steps) / (UTILIZATION * BF16_FLOPS)
               + fp32 * config.steps / (UTILIZATION * FP32_FLOPS)
               + (STEP_OVERHEAD_S + LAYER_OVERHEAD_S * config.n_layers) * config.steps)
    return seconds, train + evaluate + (bf16 + fp32) * config.steps


def _memory_bytes(config: ReproConfig, counts: dict) -> int:
    total, matrices = counts["total"], counts["matrices"]
    state = 8 * total  # AdamW on everything: the largest state of the plan's methods
    activations = 34 * config.context * config.batch_size * config.d_model * config.n_layers
    logits = 3 * 4 * config.batch_size * config.context * 256
    return 8 * total + state + 2 * matrices + activations + logits


def estimate_plan(sweep: SizeSweep = GPU_SWEEP) -> dict:
    """The cost of ``sweep`` on one H100 / H200, per size and in all, before any run.

    Returns: {"sizes": [{"d_model", "n_layers", "n_heads", "steps", "parameters", "matrix_parameters",
    "tokens_per_run", "tokens_per_parameter", "corpus_passes" (tokens per run / bytes of this Python's
    standard-library train split, ``training.corpus``), "sweep_runs", "evaluation_runs", "flops",
    "seconds", "memory_bytes"}], "seconds" (all sizes),
    "largest_seconds", "budget_seconds", "within_budget", "methods", "seeds", "assumptions" (text)}.
    Sweep runs count each method's initial lr grid once per size that sweeps it (``lr_sweep``) plus
    ``lr_extensions`` extra points, the worst case; evaluation runs are methods × seeds; the serial cost
    timing of each method (``cost.time_steps``: 2 + 3 × min(8, steps // 3) steps) is included.
    """
    methods = [m.key for m in study_methods(sweep.methods)]
    train_bytes = len(corpus(sweep.base.heldout_every)["tensors"]["train"])
    rows, total = [], 0.0
    for index, config in enumerate(sweep.configs()):
        counts = plan_parameter_counts(config)
        matmul = counts["matrices"] + 256 * config.d_model  # the blocks' matrices and lm_head
        sweeps_here = {"each": methods, "shared": methods if index == 0 else [],
                       "matrix-shared": methods if index == 0 else ["adamw"]}[sweep.lr_sweep]
        seconds = flops = 0.0
        runs = 0
        for key in sweeps_here:
            n = len(config.grid(METHODS_BY_KEY[key].family)) + config.lr_extensions
            s, f = run_seconds(config, key, evaluations=1, matmul=matmul)
            seconds, flops, runs = seconds + n * s, flops + n * f, runs + n
        timed = replace(config, steps=2 + 3 * max(1, min(8, config.steps // 3)))  # scaling.run_size_sweep's cost
        for key in methods:
            s, f = run_seconds(config, key, evaluations=config.curve_points + 1, matmul=matmul)
            seconds, flops = seconds + len(config.seeds) * s, flops + len(config.seeds) * f
            s, f = run_seconds(timed, key, evaluations=0, matmul=matmul)
            seconds, flops = seconds + s, flops + f
        tokens = config.steps * config.batch_size * config.context
        rows.append({"d_model": config.d_model, "n_layers": config.n_layers, "n_heads": config.n_heads,
                     "steps": config.steps, "parameters": counts["total"], "matrix_parameters": counts["matrices"],
                     "tokens_per_run": tokens, "tokens_per_parameter": tokens / counts["total"],
                     "corpus_passes": tokens / train_bytes,
                     "sweep_runs": runs, "evaluation_runs": len(methods) * len(config.seeds), "flops": flops,
                     "seconds": seconds, "memory_bytes": _memory_bytes(config, counts)})
        total += seconds
    return {"sizes": rows, "seconds": total, "largest_seconds": rows[-1]["seconds"], "budget_seconds": BUDGET_SECONDS,
            "within_budget": rows[-1]["seconds"] <= BUDGET_SECONDS, "methods": methods,
            "seeds": list(sweep.base.seeds), "lr_sweep": sweep.lr_sweep,
            "assumptions": f"{UTILIZATION:.0%} of the H100's measured GEMM rates (bf16 {BF16_FLOPS / 1e12:.0f}, "
                           f"float32 {FP32_FLOPS / 1e12:.0f} TFLOP/s) and launches of {STEP_OVERHEAD_S * 1e3:g} ms + "
                           f"{LAYER_OVERHEAD_S * 1e3:g} ms per layer per step, both assumed, not measured"}


def plan_lines(estimate: dict) -> list[str]:
    """The estimate as markdown lines (a table per size, then the totals), printed by ``--dry-run``
    and written into the report."""
    lines = ["| d_model | layers | heads | parameters (in matrices) | steps | tokens per run | tokens per parameter | "
             "passes over the train split | runs (lr sweep + evaluation) | FLOPs | estimated time | "
             "estimated peak memory per run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in estimate["sizes"]:
        lines.append(f"| {r['d_model']} | {r['n_layers']} | {r['n_heads']} | {r['parameters'] / 1e6:.1f} M "
                     f"({r['matrix_parameters'] / 1e6:.1f} M) | {r['steps']} | {r['tokens_per_run'] / 1e6:.1f} M | "
                     f"{r['tokens_per_parameter']:.2f} | {r['corpus_passes']:.2f} | "
                     f"{r['sweep_runs']} + {r['evaluation_runs']} | "
                     f"{r['flops']:.2e} | {r['seconds'] / 60:.1f} min | {r['memory_bytes'] / 2**30:.1f} GiB |")
    verdict = "within" if estimate["within_budget"] else "over"
    lines += ["", f"Methods {', '.join(estimate['methods'])}; seeds {estimate['seeds']}; lr sweep "
              f"`{estimate['lr_sweep']}`. Estimated {estimate['largest_seconds'] / 60:.1f} min at the largest size "
              f"({verdict} the {estimate['budget_seconds'] / 60:.0f} min budget on one H100 / H200), "
              f"{estimate['seconds'] / 60:.1f} min for the whole ladder; assumptions: {estimate['assumptions']}."]
    return lines
