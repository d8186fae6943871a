"""Research reproduction: the papers' claims on Muon, Dion and Polar Express, re-measured on real text.

``ortho-verify reproduce`` (or ``python -m ortho_verify.reproduce``) trains the byte-level GPT of
``ortho_verify.data`` on the running Python's standard-library sources, split by file into train,
validation and test (``ortho_verify.data.stdlib_split``), with AdamW, Muon (Keller Jordan's and the
Polar Express coefficients) and Dion at rank fractions 1, 1/4 and 1/16 with and without error
feedback. Protocol:

1. learning-rate sweep on the sweep seed, judged on the validation split (AdamW first: its best
   lr also trains the non-matrix parameters of every Muon / Dion run); a best lr at the edge of
   its grid extends the grid by one point in that direction (``lr_extensions`` rounds);
2. each method at its own best lr on the evaluation seeds (never the sweep seed), judged on the
   test split; equal steps and batches for every method, and for a given seed the same
   initialization and the same batches (paired comparisons);
3. the singular-value map of Newton–Schulz on the raw gradients of the Muon (Keller) runs;
4. each claim is a pure function of the results (``evaluate_claims``) with a stated decision
   rule, and ``docs/reproduction.md`` with its plots and ``results.json`` is written from them.

Sources: Jordan et al., "Muon" (2024 blog); Liu et al., arXiv 2502.16982 (Moonlight); Ahn et
al., arXiv 2504.05295 (Dion); Amsel et al., arXiv 2505.16932 (Polar Express).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import multiprocessing
import os
import platform
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from threadpoolctl import threadpool_limits

import ortho_fast
import ortho_ref
from ortho_verify.data import VOCAB_SIZE, GPTConfig, _build_model, stdlib_split
from ortho_verify.tables import BAND_INTERVAL

__all__ = [
    "CLAIMS", "CLOSE_MARGIN", "Claim", "MATCH_MARGIN", "METHODS", "Method", "QUICK", "ReproConfig", "VERDICTS",
    "best_learning_rate", "build_optimizer", "build_parser", "claim_dion_full_rank_matches_muon",
    "claim_dion_quarter_rank_close", "claim_error_feedback_needed", "claim_muon_beats_adamw",
    "claim_polar_express_more_accurate", "environment", "evaluate_claims", "lower_verdict", "lr_multiplier", "main",
    "paired_difference", "render_markdown", "run_study", "singular_value_study", "train_run", "within_verdict",
    "write_plots", "write_report",
]

RESULTS_FORMAT = 1
VERDICTS = ("reproduced", "not reproduced", "inconclusive")
#: "Matches": the paired difference ± its seed spread lies within ±1 % of the reference's loss.
MATCH_MARGIN = 0.01
#: "Stays close": the same, within ±2.5 % (a looser claim than "matches").
CLOSE_MARGIN = 0.025
SV_SCHEDULES = ("jordan", "polar_express")
SV_DTYPES = ("float32", "bfloat16")
NS_DTYPES = ("bfloat16", "float16", "float32", "float64")
#: Muon's per-matrix lr scale (``ortho_fast.adjusted_lr_scale``): "spectral_norm" √(m/n), Dion's own
#: convention (microsoft/dion's Muon), so that Muon and Dion differ only in how they orthogonalize;
#: "original" √max(1, m/n) (torch.optim.Muon, Keller Jordan), which gives an (m, n) matrix with m < n
#: √(n/m) times Dion's step.
MUON_LR_CONVENTIONS = ("spectral_norm", "original")


# ---------------------------------------------------------------------------------------
# What is trained
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Method:
    """One optimizer of the study. ``family`` "adamw" trains every parameter with AdamW;
    "muon" / "dion" train the hidden matrices (attention qkv / proj, MLP fc / proj) with Muon
    (``coefficients`` a schedule of ``ortho_fast.COEFFICIENTS``) or Dion (``rank_fraction``,
    ``error_feedback``) and the rest (embeddings, LayerNorms, lm_head) with AdamW."""

    key: str
    label: str
    family: str
    coefficients: str | None = None
    rank_fraction: float | None = None
    error_feedback: bool | None = None


_RANKS = ((1.0, "1"), (0.25, "1/4"), (0.0625, "1/16"))
METHODS: tuple[Method, ...] = (
    Method("adamw", "AdamW", "adamw"),
    Method("muon-jordan", "Muon (Keller)", "muon", coefficients="jordan"),
    Method("muon-polar_express", "Muon (Polar Express)", "muon", coefficients="polar_express"),
    *(Method(f"dion-{name}-{'ef' if ef else 'noef'}", f"Dion r={name}, {'EF' if ef else 'no EF'}", "dion",
             rank_fraction=fraction, error_feedback=ef)
      for fraction, name in _RANKS for ef in (True, False)),
)
_BY_KEY = {m.key: m for m in METHODS}


def _check_grid(name: str, grid) -> None:
    if not grid or any(not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0) for v in grid):
        raise ValueError(f"{name}: expected a non-empty tuple of positive learning rates, got {grid!r}")
    if list(grid) != sorted(set(grid)):
        raise ValueError(f"{name}: expected increasing learning rates, got {grid!r}")


@dataclass(frozen=True)
class ReproConfig:
    """Sizes, schedule, seeds and learning-rate grids of the reproduction.

    Model (``ortho_verify.data``'s GPT): ``d_model``, ``n_layers``, ``n_heads``, ``context`` (bytes).
    Training: ``steps`` optimizer steps of ``batch_size`` random windows of the train split,
    every lr on the schedule of ``lr_multiplier``: linear warm-up over ``warmup_fraction`` of the
    steps, then cosine decay to ``final_lr_fraction`` of the peak (the same for every method).
    Held-out loss (nats per byte): mean next-byte cross-entropy over ``eval_windows`` evenly
    spaced windows of the validation (sweep) or test (evaluation) split, recorded at
    ``curve_points`` + 1 evenly spaced steps (step 0 included) of the evaluation runs.
    ``heldout_every``: one file in k validation, one test (``ortho_verify.data.stdlib_split``).
    Seeds: ``sweep_seed`` for the lr sweep, ``seeds`` for the evaluation (disjoint).
    Grids: ``adamw_lrs``, ``muon_lrs`` (scaled per matrix by ``muon_adjust_lr``, one of
    ``MUON_LR_CONVENTIONS``; default Dion's √(m/n)), ``dion_lrs`` (Dion's √(m/n));
    ``lr_extensions`` rounds that extend a grid by a factor ``lr_factor`` beyond an edge that
    won. AdamW: ``betas``, ``adamw_eps``; Muon / Dion momentum ``momentum``; Newton–Schulz
    compute dtype ``ns_dtype``; weight decay 0 everywhere.
    ``capture_points`` steps (1, ..., steps) at which the Muon (Keller) runs record gradients.

    Raises: ValueError naming the field for a non-positive size, d_model not divisible by
    n_heads, an empty / unsorted / non-positive grid, no evaluation seed, the sweep seed among
    the evaluation seeds, a momentum outside [0, 1), lr_factor <= 1, a warm-up or final lr
    fraction outside [0, 1) / (0, 1], or an unknown ns_dtype / muon_adjust_lr.
    """

    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    context: int = 64
    batch_size: int = 16
    steps: int = 600
    curve_points: int = 12
    eval_windows: int = 512
    heldout_every: int = 10
    sweep_seed: int = 0
    seeds: tuple[int, ...] = (1, 2, 3)
    adamw_lrs: tuple[float, ...] = (1e-3, 2e-3, 4e-3)
    muon_lrs: tuple[float, ...] = (0.01, 0.02, 0.04)
    dion_lrs: tuple[float, ...] = (0.01, 0.02, 0.04)
    lr_extensions: int = 1
    lr_factor: float = 2.0
    warmup_fraction: float = 0.05
    final_lr_fraction: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    adamw_eps: float = 1e-8
    momentum: float = 0.95
    muon_adjust_lr: str = "spectral_norm"
    ns_dtype: str = "bfloat16"
    capture_points: int = 3

    def __post_init__(self) -> None:
        for name in ("d_model", "n_layers", "n_heads", "context", "batch_size", "steps", "curve_points",
                     "eval_windows", "capture_points"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads: {self.n_heads} does not divide d_model {self.d_model}")
        if isinstance(self.lr_extensions, bool) or not isinstance(self.lr_extensions, int) or self.lr_extensions < 0:
            raise ValueError(f"lr_extensions: expected an int >= 0, got {self.lr_extensions!r}")
        for name in ("adamw_lrs", "muon_lrs", "dion_lrs"):
            _check_grid(name, getattr(self, name))
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: expected distinct evaluation seeds, got {self.seeds!r}")
        if self.sweep_seed in self.seeds:
            raise ValueError(f"seeds: the sweep seed {self.sweep_seed} must not be an evaluation seed "
                             "(the lr is chosen on it)")
        if not (0.0 <= self.momentum < 1.0) or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"momentum, betas: expected values in [0, 1), got {self.momentum!r}, {self.betas!r}")
        if not self.lr_factor > 1.0:
            raise ValueError(f"lr_factor: expected > 1, got {self.lr_factor!r}")
        if not (0.0 <= self.warmup_fraction < 1.0) or not (0.0 < self.final_lr_fraction <= 1.0):
            raise ValueError(f"warmup_fraction, final_lr_fraction: expected [0, 1) and (0, 1], got "
                             f"{self.warmup_fraction!r}, {self.final_lr_fraction!r}")
        if self.ns_dtype not in NS_DTYPES:
            raise ValueError(f"ns_dtype: expected one of {NS_DTYPES}, got {self.ns_dtype!r}")
        if self.muon_adjust_lr not in MUON_LR_CONVENTIONS:
            raise ValueError(f"muon_adjust_lr: expected one of {MUON_LR_CONVENTIONS}, got {self.muon_adjust_lr!r}")

    def scaled(self, k: int) -> "ReproConfig":
        """This configuration with d_model, n_heads (head size kept), batch_size, steps and
        eval_windows multiplied by ``k`` (an int >= 1; about k⁴ times the compute)."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"scale: expected an int >= 1, got {k!r}")
        return replace(self, d_model=self.d_model * k, n_heads=self.n_heads * k, batch_size=self.batch_size * k,
                       steps=self.steps * k, eval_windows=self.eval_windows * k)

    def grid(self, family: str) -> tuple[float, ...]:
        """The initial lr grid of a method family ("adamw", "muon", "dion")."""
        return {"adamw": self.adamw_lrs, "muon": self.muon_lrs, "dion": self.dion_lrs}[family]

    def capture_steps(self) -> tuple[int, ...]:
        """Steps at which the Muon (Keller) evaluation runs record gradients: 1 to ``steps``,
        ``capture_points`` of them evenly spaced."""
        return tuple(sorted({int(round(s)) for s in np.linspace(1, self.steps, self.capture_points)}))

    def warmup_steps(self) -> int:
        """Steps of linear warm-up: ``warmup_fraction`` × steps rounded, at least 1 if the
        fraction is positive."""
        return max(1, round(self.warmup_fraction * self.steps)) if self.warmup_fraction > 0 else 0

    def curve_steps(self) -> tuple[int, ...]:
        """Steps at which the evaluation runs record the held-out loss (0 = initialization)."""
        return tuple(sorted({int(round(s)) for s in np.linspace(0, self.steps, self.curve_points + 1)}))


#: The --quick configuration: a seconds-long smoke run with every method and every code path.
QUICK = ReproConfig(d_model=32, n_layers=1, n_heads=2, context=32, batch_size=8, steps=24, curve_points=4,
                    eval_windows=32, seeds=(1, 2), capture_points=2)


def lr_multiplier(index: int, config: ReproConfig) -> float:
    """Multiplier of the peak lr at 0-based step ``index`` (step ``index`` + 1 of ``config.steps``):
    (index + 1) / W for index < W = ``config.warmup_steps()``, then
    r + (1 − r)·(1 + cos(π·(index − W) / (steps − W − 1)))/2 with r = ``final_lr_fraction``, so
    the first step after the warm-up runs at the peak and the last at r × peak. Linear warm-up
    and cosine decay as nanoGPT's and Moonlight's (Liu et al., arXiv 2502.16982) AdamW and Muon
    runs."""
    warmup = config.warmup_steps()
    if index < warmup:
        return (index + 1) / warmup
    span = config.steps - warmup - 1
    progress = min(1.0, (index - warmup) / span) if span > 0 else 1.0
    r = config.final_lr_fraction
    return r + (1 - r) * 0.5 * (1 + math.cos(math.pi * progress))


def _gpt_config(config: ReproConfig) -> GPTConfig:
    return GPTConfig(d_model=config.d_model, n_layers=config.n_layers, n_heads=config.n_heads, context=config.context,
                     batch_size=config.batch_size, steps=config.steps, capture_steps=(config.steps,))


def build_optimizer(method: Method, model: torch.nn.Module, lr: float, scalar_lr: float, config: ReproConfig,
                    seed: int) -> torch.optim.Optimizer:
    """The optimizer of ``method`` for ``model``.

    "adamw": ``torch.optim.AdamW`` at ``lr`` on every parameter. "muon" / "dion":
    ``ortho_fast.HybridOptimizer`` over ``ortho_fast.param_groups`` — the hidden matrices on
    Muon (torch.optim.Muon's defaults: EMA momentum ``config.momentum`` with Nesterov, 5 steps of
    ``method.coefficients`` with its own normalization, computed in ``config.ns_dtype``; lr
    scaled per matrix by ``config.muon_adjust_lr``) or Dion (Ahn et al. Algorithm 1:
    μ = ``config.momentum``, Householder QR, one power iteration, column-normalized Q, lr scaled
    by √(m/n), Q0 from ``seed``), at ``lr``; embeddings, LayerNorms and lm_head on AdamW at ``scalar_lr``. AdamW
    everywhere with ``config.betas``, ``config.adamw_eps``; weight decay 0 for every parameter.
    Raises: what ``param_groups`` / ``HybridOptimizer`` raise for bad options.
    """
    if method.family == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=lr, betas=config.betas, eps=config.adamw_eps, weight_decay=0.0)
    if method.family == "muon":
        options = dict(momentum=config.momentum, nesterov=True, coefficients=method.coefficients,
                       adjust_lr=config.muon_adjust_lr, dtype=getattr(torch, config.ns_dtype))
    else:
        options = dict(mu=config.momentum, rank_fraction=method.rank_fraction, error_feedback=method.error_feedback,
                       qr_method="householder")
    groups = ortho_fast.param_groups(
        model, algorithm=method.family, lr=lr, weight_decay=0.0, scalar_lr=scalar_lr, scalar_weight_decay=0.0,
        lm_head_lr_scale=None, matrix_options=options, scalar_options={"betas": config.betas, "eps": config.adamw_eps})
    return ortho_fast.HybridOptimizer(groups, seed=seed)


@lru_cache(maxsize=2)
def _corpus(heldout_every: int) -> dict:
    """uint8 tensors of the three splits and their file counts (read once per process)."""
    split = stdlib_split(heldout_every)
    tensors = {name: torch.frombuffer(bytearray(getattr(split, name)), dtype=torch.uint8)
               for name in ("train", "validation", "test")}
    return {"tensors": tensors, "files": dict(zip(("train", "validation", "test"), split.files))}


@torch.no_grad()
def _heldout_loss(model: torch.nn.Module, data: torch.Tensor, config: ReproConfig, device: torch.device) -> float:
    """Mean next-byte cross-entropy (nats) over ``config.eval_windows`` evenly spaced windows."""
    if len(data) < config.context + 2:
        raise ValueError(f"held-out split has {len(data)} bytes, need at least context + 2 = {config.context + 2}")
    starts = torch.linspace(0, len(data) - config.context - 1, config.eval_windows).long()
    window = torch.arange(config.context + 1)
    total = 0.0
    for chunk_starts in starts.split(4 * config.batch_size):
        chunk = data[chunk_starts[:, None] + window].long().to(device)
        logits = model(chunk[:, :-1])
        total += F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), chunk[:, 1:].reshape(-1), reduction="sum").item()
    return total / (config.eval_windows * config.context)


def _grads_finite(params) -> bool:
    return all(bool(torch.isfinite(p.grad).all()) for p in params if p.grad is not None)


def train_run(config: ReproConfig, method_key: str, lr: float, seed: int, *, scalar_lr: float | None = None,
              split: str = "test", curve: bool = True, capture: bool = False, device: str = "cpu") -> dict:
    """Train one model with one method at one lr and seed; return its losses.

    The initialization and the batches come from one ``torch.Generator`` seeded with ``seed``
    (``ortho_verify.data._build_model``, then ``batch_size`` uniform window starts per step), so two
    methods with the same seed see the same initial weights and the same batches; the global
    RNG is not used. A non-finite training loss, gradient or held-out loss stops the run:
    ``diverged``.

    Args: ``method_key`` a key of ``METHODS``; ``scalar_lr`` the AdamW lr of the non-matrix
    parameters of Muon / Dion (default ``lr``); ``split`` "validation" or "test" (held-out
    split judged); ``curve``: record the held-out loss at ``config.curve_steps()`` (else only at
    the end); ``capture``: record the gradients of the Muon / Dion matrices at
    ``config.capture_steps()``; ``device`` a torch device string.
    Returns: dict with ``method``, ``lr``, ``scalar_lr``, ``seed``, ``split``, ``loss`` (final
    held-out loss in nats per byte, None if diverged), ``curve_steps`` / ``curve`` (held-out
    loss, None after a divergence), ``train_curve`` (mean training loss over each curve
    interval), ``diverged``, ``seconds``, and with ``capture`` ``gradients``: a list of
    (parameter name, step, float32 (m, n) array).
    Raises: KeyError for an unknown method, ValueError for an unknown split.
    """
    method = _BY_KEY[method_key]
    if split not in ("validation", "test"):
        raise ValueError(f"split: expected 'validation' or 'test', got {split!r}")
    start = time.perf_counter()
    corpus = _corpus(config.heldout_every)["tensors"]
    train, heldout = corpus["train"], corpus[split]
    dev = torch.device(device)
    generator = torch.Generator().manual_seed(seed)
    model = _build_model(_gpt_config(config), generator).to(dev)
    optimizer = build_optimizer(method, model, lr, lr if scalar_lr is None else scalar_lr, config, seed)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda index: lr_multiplier(index, config))
    matrices = [(name, p) for g in optimizer.param_groups if g.get("algorithm") in ("muon", "dion")
                for name, p in zip(g["param_names"], g["params"])]
    params = list(model.parameters())
    curve_steps = config.curve_steps() if curve else (config.steps,)
    captures = set(config.capture_steps()) if capture else set()
    window = torch.arange(config.context + 1)
    curve_losses, train_curve, gradients, interval = [], [], [], []
    diverged = False
    if 0 in curve_steps:
        curve_losses.append(_heldout_loss(model, heldout, config, dev))
    for step in range(1, config.steps + 1):
        starts = torch.randint(0, len(train) - config.context, (config.batch_size, 1), generator=generator)
        chunk = train[starts + window].long().to(dev)
        loss = F.cross_entropy(model(chunk[:, :-1]).reshape(-1, VOCAB_SIZE), chunk[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        value = loss.item()
        if not math.isfinite(value) or not _grads_finite(params):
            diverged = True
            break
        interval.append(value)
        if step in captures:
            gradients += [(name, step, p.grad.detach().float().cpu().numpy().copy()) for name, p in matrices]
        optimizer.step()
        scheduler.step()
        if step in curve_steps:
            heldout_loss = _heldout_loss(model, heldout, config, dev)
            if not math.isfinite(heldout_loss):  # this step's update made the weights non-finite
                diverged = True
                break
            curve_losses.append(heldout_loss)
            train_curve.append(float(np.mean(interval)))
            interval = []
    if diverged:
        curve_losses += [None] * (len(curve_steps) - len(curve_losses))
        train_curve += [None] * (len(curve_steps) - (0 in curve_steps) - len(train_curve))
    result = dict(method=method_key, lr=lr, scalar_lr=lr if scalar_lr is None else scalar_lr, seed=seed, split=split,
                  loss=curve_losses[-1], curve_steps=list(curve_steps), curve=curve_losses, train_curve=train_curve,
                  diverged=diverged, seconds=time.perf_counter() - start)
    if capture:
        result["gradients"] = gradients
    return result


# ---------------------------------------------------------------------------------------
# The protocol: sweep, evaluation, singular-value map
# ---------------------------------------------------------------------------------------


def _init_worker(threads: int) -> None:
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)


def _execute(job: tuple[ReproConfig, dict]) -> dict:
    config, kwargs = job
    return train_run(config, **kwargs)


class _Runner:
    """Runs ``train_run`` jobs in this process (jobs = 1) or in ``jobs`` spawned processes, each
    with ``threads`` torch threads; results come back in the order of the jobs. ``seconds``: the
    training time of every run so far, summed."""

    def __init__(self, config: ReproConfig, device: str, jobs: int, threads: int, log: Callable[[str], None]):
        self.config, self.device, self.log = config, device, log
        self.pool = None
        self.seconds = 0.0
        if jobs > 1:
            self.pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_init_worker, initargs=(threads,))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()

    def map(self, phase: str, jobs: list[dict]) -> list[dict]:
        jobs = [dict(job, device=self.device) for job in jobs]
        out: list[dict | None] = [None] * len(jobs)

        def done(i: int, result: dict) -> None:
            out[i] = result
            self.seconds += result["seconds"]
            count = sum(r is not None for r in out)
            loss = "diverged" if result["diverged"] else f"{result['loss']:.4f}"
            self.log(f"  {phase} [{count}/{len(jobs)}] {_BY_KEY[result['method']].label}, lr {result['lr']:g}, "
                     f"seed {result['seed']}: {result['split']} loss {loss} ({result['seconds']:.1f} s)")

        if self.pool is None:
            for i, job in enumerate(jobs):
                done(i, _execute((self.config, job)))
        else:
            futures = {self.pool.submit(_execute, (self.config, job)): i for i, job in enumerate(jobs)}
            for future in as_completed(futures):
                done(futures[future], future.result())
        return out  # type: ignore[return-value]


def _loss_key(loss: float | None) -> float:
    return math.inf if loss is None or not math.isfinite(loss) else loss


def _sweep(runner: _Runner, methods: Sequence[Method], scalar_lr: float | None, sweep: dict) -> None:
    """Fill ``sweep[key]`` = [{"lr", "validation_loss"}] for each method, extending a grid
    whose best lr lies on an edge (``config.lr_extensions`` rounds; a grid whose every lr
    diverged is extended downwards)."""
    config = runner.config
    pending = [(m, lr) for m in methods for lr in config.grid(m.family)]
    for round_ in range(config.lr_extensions + 1):
        phase = "lr sweep" if round_ == 0 else f"lr sweep, grid extension {round_}"
        results = runner.map(phase, [dict(method_key=m.key, lr=lr, seed=config.sweep_seed, scalar_lr=scalar_lr,
                                          split="validation", curve=False) for m, lr in pending])
        for (m, lr), r in zip(pending, results):
            sweep.setdefault(m.key, []).append({"lr": lr, "validation_loss": r["loss"]})
        pending = []
        for m in methods if round_ < config.lr_extensions else ():
            best, edge = best_learning_rate(sweep[m.key])
            lrs = [p["lr"] for p in sweep[m.key]]
            if edge:
                pending.append((m, best / config.lr_factor if best == min(lrs) else best * config.lr_factor))
        if not pending:
            break


def best_learning_rate(points: list[dict]) -> tuple[float, bool]:
    """(lr with the lowest validation loss — the smallest such lr on a tie, diverged runs
    counting as +inf —, whether it lies on an edge of the swept grid).
    Raises: ValueError for an empty sweep."""
    if not points:
        raise ValueError("points: empty learning-rate sweep")
    points = sorted(points, key=lambda p: p["lr"])
    best = min(points, key=lambda p: _loss_key(p["validation_loss"]))
    return best["lr"], len(points) > 1 and best in (points[0], points[-1])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git(*args: str) -> str | None:
    """Output of a git command in this package's checkout, None outside one."""
    try:
        out = subprocess.run(["git", *args], cwd=Path(__file__).resolve().parent, capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def environment(device: str, threads: int, jobs: int) -> dict:
    """Versions and hardware of this run: python, torch (and the CUDA it was built with, None for
    a CPU build), numpy, scipy, matplotlib, platform, CPU model and counts, device (and GPU
    name), threads, jobs, load average, git commit and whether the checkout had uncommitted
    changes."""
    import scipy

    try:
        import matplotlib
        mpl = matplotlib.__version__
    except ImportError:
        mpl = None
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    dev = torch.device(device)
    return {
        "python": sys.version, "torch": torch.__version__, "cuda": torch.version.cuda, "numpy": np.__version__,
        "scipy": scipy.__version__, "matplotlib": mpl, "platform": platform.platform(), "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(), "cpus_available": affinity, "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else _cpu_model(),
        "torch_threads_per_job": threads, "jobs": jobs, "deterministic_algorithms": True,
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "git_commit": _git("rev-parse", "HEAD") or None,
        "git_uncommitted_changes": None if (status := _git("status", "--porcelain")) is None else bool(status),
        "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def singular_value_study(gradients: Mapping[int, list], ns_dtypes: Sequence[str] = SV_DTYPES,
                         device: str = "cpu") -> tuple[dict, dict]:
    """The Newton–Schulz singular-value map of ``SV_SCHEDULES`` on real gradients.

    For each gradient G (float32 (m, n); ``gradients``: seed -> [(name, step, G)]) and schedule
    (5 steps, with the normalization ``ortho_fast.Muon`` uses for it: X₀ = G / (s‖G‖_F + eps),
    clamped for "jordan"): σ̂ = singular values of the normalized G (float64 SVD), the exact map
    f(σ̂) (``ortho_ref.ns_polynomial``), and X = ``ortho_fast.newton_schulz(G)`` computed in each
    of ``ns_dtypes`` on ``device``. Per "exact" and per dtype: ``rms`` = ‖X − U Vᵀ‖_F / √k, the
    distance to the polar factor of G (exact: ‖f(σ̂) − 1‖₂ / √k), averaged over the gradients
    of each seed; ``worst_in_band`` = max |uᵢᵀ X vᵢ − 1| (exact: |f(σ̂ᵢ) − 1|) over the
    directions with σ̂ᵢ in ``ortho_verify.tables.BAND_INTERVAL`` [1e-3, 1], over all gradients.

    Returns: (stats, points). stats = {"seeds", "gradients" (count per seed), "names",
    "steps", "below_band_fraction" (σ̂ < 1e-3), "schedules": {schedule: {"safety", "eps",
    "eps_mode", "steps", kind: {"rms_by_seed", "rms_mean", "worst_in_band"}}}} with kind in
    ("exact", *ns_dtypes); points = {(schedule, dtype): [(σ̂, uᵢᵀ X vᵢ)]} for
    ``ortho_verify.plots.singular_value_map``.
    Source: Amsel et al., arXiv 2505.16932, Sec. 2 (NS as a polynomial of the singular values).
    Raises: ValueError for no gradients.
    """
    seeds = sorted(gradients)
    if not seeds or not all(gradients[s] for s in seeds):
        raise ValueError("gradients: expected at least one gradient per seed")
    lo, hi = BAND_INTERVAL
    stats: dict = {"seeds": seeds, "gradients": len(gradients[seeds[0]]),
                   "names": sorted({n for s in seeds for n, _, _ in gradients[s]}),
                   "steps": sorted({st for s in seeds for _, st, _ in gradients[s]}), "schedules": {}}
    points: dict = {}
    below = total = 0
    for name in SV_SCHEDULES:
        sched = ortho_fast.COEFFICIENTS[name]
        eps_mode = ortho_fast.default_eps_mode(name)
        table = ortho_ref.schedule(name)
        kinds = ("exact", *ns_dtypes)
        rms = {k: {s: [] for s in seeds} for k in kinds}
        worst = dict.fromkeys(kinds, 0.0)
        for seed in seeds:
            for _, _, g in gradients[seed]:
                a = g.astype(np.float64)
                u, _, vt = ortho_ref.svd(a)
                sigma = ortho_ref.normalized_singular_values(a, safety=sched.safety, eps=sched.eps, eps_mode=eps_mode)
                band = (sigma >= lo) & (sigma <= hi)
                if name == SV_SCHEDULES[0]:
                    below, total = below + int((sigma < lo).sum()), total + len(sigma)
                f = ortho_ref.ns_polynomial(sigma, table)
                rms["exact"][seed].append(float(np.linalg.norm(f - 1) / math.sqrt(len(f))))
                worst["exact"] = max(worst["exact"], float(np.abs(f[band] - 1).max(initial=0.0)))
                for dtype in ns_dtypes:
                    x = ortho_fast.newton_schulz(torch.from_numpy(g).to(device), name, safety=sched.safety,
                                                 eps=sched.eps, eps_mode=eps_mode, dtype=getattr(torch, dtype))
                    x = x.to(torch.float64).cpu().numpy()
                    projected = np.einsum("ij,ik,kj->j", u, x, vt.T)
                    points.setdefault((name, dtype), []).append((sigma, projected))
                    rms[dtype][seed].append(float(np.linalg.norm(x - u @ vt) / math.sqrt(len(sigma))))
                    worst[dtype] = max(worst[dtype], float(np.abs(projected[band] - 1).max(initial=0.0)))
        entry = {"safety": sched.safety, "eps": sched.eps, "eps_mode": eps_mode, "steps": len(table)}
        for k in kinds:
            by_seed = [float(np.mean(rms[k][s])) for s in seeds]
            entry[k] = {"rms_by_seed": by_seed, "rms_mean": float(np.mean(by_seed)), "worst_in_band": worst[k]}
        stats["schedules"][name] = entry
    stats["below_band_fraction"] = below / total
    return stats, points


def run_study(config: ReproConfig, *, device: str = "cpu", jobs: int = 1, threads: int = 1,
              log: Callable[[str], None] = print) -> tuple[dict, dict]:
    """Run the whole protocol (module docstring) and return (results, singular-value points).

    ``results`` is JSON-serializable: ``config``, ``methods``, ``corpus``, ``environment``,
    ``seeds``, ``sweep`` {key: [{"lr", "validation_loss"}]}, ``best_lr``, ``best_at_edge``,
    ``scalar_lr`` (AdamW's best lr, used for the non-matrix parameters of Muon / Dion),
    ``evaluation`` {key: {"lr", "seeds", "test_loss", "curve_steps", "curves", "train_curves",
    "diverged", "seconds"}}, ``spectral`` (``singular_value_study`` in ``SV_DTYPES`` and
    ``config.ns_dtype``; None if every Muon (Keller) evaluation run diverged before its first
    gradient), ``claims``
    (``evaluate_claims``), ``wall_seconds``, ``run_seconds``. ``points`` feed the
    singular-value map plots. Deterministic given the configuration, device and threads.
    Raises: ValueError for jobs or threads < 1.
    """
    if jobs < 1 or threads < 1:
        raise ValueError(f"jobs, threads: expected >= 1, got {jobs}, {threads}")
    start = time.perf_counter()
    if torch.device(device).type == "cuda":  # deterministic cuBLAS (read when CUDA initializes; jobs inherit it)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    env = environment(device, threads, jobs)
    previous = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    _init_worker(threads)
    runner = _Runner(config, device, jobs, threads, log)
    # One BLAS thread for the oracle's SVDs, as ortho_verify.cli: two OpenBLAS threads on a 2-core machine that
    # other processes use made this study's SVDs take minutes instead of seconds.
    blas = threadpool_limits(limits=1, user_api="blas")
    try:
        sweep: dict = {}
        log(f"AdamW lr sweep on the validation split (seed {config.sweep_seed})")
        _sweep(runner, METHODS[:1], None, sweep)
        scalar_lr, _ = best_learning_rate(sweep["adamw"])
        log(f"Muon / Dion lr sweeps (non-matrix parameters on AdamW at its best lr {scalar_lr:g})")
        _sweep(runner, METHODS[1:], scalar_lr, sweep)
        best = {m.key: best_learning_rate(sweep[m.key]) for m in METHODS}
        log(f"evaluation at each method's best lr on seeds {list(config.seeds)} (test split)")
        jobs_ = [dict(method_key=m.key, lr=best[m.key][0], seed=s, scalar_lr=scalar_lr, split="test",
                      capture=m.key == "muon-jordan") for m in METHODS for s in config.seeds]
        runs = runner.map("evaluation", jobs_)
        runner.close()
        evaluation: dict = {}
        gradients = {}
        for r in runs:
            e = evaluation.setdefault(r["method"], {"lr": r["lr"], "seeds": [], "test_loss": [],
                                                    "curve_steps": r["curve_steps"], "curves": [], "train_curves": [],
                                                    "diverged": [], "seconds": []})
            for key, value in (("seeds", r["seed"]), ("test_loss", r["loss"]), ("curves", r["curve"]),
                               ("train_curves", r["train_curve"]), ("diverged", r["diverged"]),
                               ("seconds", r["seconds"])):
                e[key].append(value)
            if r.get("gradients"):  # none from a run that diverged at step 1
                gradients[r["seed"]] = r["gradients"]
        log("singular-value map of Newton–Schulz on the captured gradients")
        sv_dtypes = tuple(dict.fromkeys((*SV_DTYPES, config.ns_dtype)))  # claim 5 reads the training's dtype
        spectral, points = singular_value_study(gradients, sv_dtypes, device) if gradients else (None, {})
    finally:
        runner.close()
        blas.restore_original_limits()
        torch.set_num_threads(previous[0])
        torch.use_deterministic_algorithms(previous[1])
    split = _corpus(config.heldout_every)
    results = {
        "format": RESULTS_FORMAT,
        "config": asdict(config),
        "methods": [asdict(m) for m in METHODS],
        "corpus": {"source": "standard-library .py files of the running Python (ortho_verify.data.stdlib_split)",
                   "heldout_every": config.heldout_every, "files": split["files"],
                   "bytes": {k: len(v) for k, v in split["tensors"].items()}},
        "environment": env,
        "seeds": {"sweep": config.sweep_seed, "evaluation": list(config.seeds)},
        "sweep": sweep,
        "best_lr": {k: v[0] for k, v in best.items()},
        "best_at_edge": {k: v[1] for k, v in best.items()},
        "scalar_lr": scalar_lr,
        "evaluation": evaluation,
        "spectral": spectral,
        "run_seconds": runner.seconds,
    }
    results["claims"] = [asdict(c) for c in evaluate_claims(results)]
    results["wall_seconds"] = time.perf_counter() - start
    return results, points


# ---------------------------------------------------------------------------------------
# Claims: pure functions of the results
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """One claim of the literature, judged on the results.

    ``key``, ``statement`` (what the paper says), ``source``, ``rule`` (the decision rule),
    ``verdict`` (one of ``VERDICTS``), ``numbers`` (the measured values behind it),
    ``sentence`` (the verdict with its numbers, as the report prints it) and ``measured`` (the
    deciding difference in one line, for the verdict table)."""

    key: str
    statement: str
    source: str
    rule: str
    verdict: str
    numbers: dict
    sentence: str
    measured: str = ""


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


def _losses(results: Mapping, key: str) -> dict[int, float | None]:
    e = results.get("evaluation", {}).get(key)
    return {} if e is None else dict(zip(e["seeds"], e["test_loss"]))


def _mean_std(values) -> str:
    v = [x for x in values if x is not None and math.isfinite(x)]
    if len(v) < len(list(values)) or not v:
        return "diverged"
    return f"{np.mean(v):.3f} ± {np.std(v, ddof=1):.3f}" if len(v) > 1 else f"{v[0]:.3f}"


def _diff_text(diff: Mapping) -> str:
    if not diff["finite"]:
        return "not measured (a run is missing or diverged)"
    if diff["spread"] is None:
        return f"{diff['mean']:+.4f} (one seed: no spread)"
    return f"{diff['mean']:+.4f} ± {diff['spread']:.4f} over {diff['n']} seeds"


def _summary(results: Mapping, key: str) -> str:
    return f"{_BY_KEY[key].label} {_mean_std(_losses(results, key).values())}"


def _compare(results: Mapping, worse: str, better: str) -> tuple[dict, dict]:
    diff = paired_difference(_losses(results, worse), _losses(results, better))
    numbers = {worse: list(_losses(results, worse).values()), better: list(_losses(results, better).values()),
               "difference": diff}
    return diff, numbers


_OUTCOME = {"reproduced": "Reproduced", "not reproduced": "Not reproduced", "inconclusive": "Inconclusive"}


def _lower_rule(difference: str) -> str:
    return (f"d = {difference} per seed; reproduced if mean(d) − spread(d) > 0, not reproduced if "
            "mean(d) + spread(d) < 0, else inconclusive")


def claim_muon_beats_adamw(results: Mapping) -> Claim:
    """Jordan et al. / Liu et al.: Muon (Keller's coefficients) reaches a lower held-out loss
    than AdamW at equal steps. Rule: ``lower_verdict`` on AdamW − Muon per seed."""
    diff, numbers = _compare(results, "adamw", "muon-jordan")
    pe, _ = _compare(results, "adamw", "muon-polar_express")
    numbers["difference_polar_express"] = pe
    verdict = lower_verdict(diff)
    sentence = (f"{_OUTCOME[verdict]}: held-out loss {_summary(results, 'muon-jordan')} vs "
                f"{_summary(results, 'adamw')} nats/byte; AdamW − Muon = {_diff_text(diff)} (with Polar Express: "
                f"{_diff_text(pe)}).")
    return Claim("muon_vs_adamw", "Muon reaches a lower held-out loss than AdamW at equal steps",
                 "Jordan et al. 2024 (Muon blog); Liu et al., arXiv 2502.16982",
                 _lower_rule("test loss of AdamW − Muon (Keller)"), verdict, numbers, sentence,
                 f"AdamW − Muon = {_diff_text(diff)}")


def _within_claim(results: Mapping, key: str, margin: float, statement: str, claim_key: str) -> Claim:
    diff, numbers = _compare(results, key, "muon-jordan")
    muon = [v for v in _losses(results, "muon-jordan").values() if v is not None and math.isfinite(v)]
    delta = margin * float(np.mean(muon)) if muon else math.nan
    verdict = within_verdict(diff, delta) if muon else "inconclusive"
    numbers.update(margin_relative=margin, margin=delta)
    sentence = (f"{_OUTCOME[verdict]}: {_summary(results, key)} vs {_summary(results, 'muon-jordan')} nats/byte; "
                f"Dion − Muon = {_diff_text(diff)}, margin ±{delta:.3f} ({margin:.1%} of Muon's loss).")
    rule = (f"d = test loss of {_BY_KEY[key].label} − Muon (Keller) per seed, δ = {margin:.1%} of Muon's mean loss; "
            "reproduced if |mean(d)| + spread(d) ≤ δ, not reproduced if |mean(d)| − spread(d) > δ, else inconclusive")
    return Claim(claim_key, statement, "Ahn et al., arXiv 2504.05295", rule, verdict, numbers, sentence,
                 f"Dion − Muon = {_diff_text(diff)}; δ = {delta:.3f}")


def claim_dion_full_rank_matches_muon(results: Mapping) -> Claim:
    """Ahn et al.: Dion at full rank matches Muon. Rule: ``within_verdict`` of Dion (r = 1,
    error feedback) − Muon (Keller) with margin ``MATCH_MARGIN`` × Muon's mean loss."""
    return _within_claim(results, "dion-1-ef", MATCH_MARGIN, "Dion at full rank matches Muon", "dion_full_rank")


def claim_dion_quarter_rank_close(results: Mapping) -> Claim:
    """Ahn et al.: Dion at rank 1/4 with error feedback stays close to Muon. Rule:
    ``within_verdict`` with margin ``CLOSE_MARGIN`` × Muon's mean loss."""
    return _within_claim(results, "dion-1/4-ef", CLOSE_MARGIN,
                         "Dion at rank fraction 1/4 with error feedback stays close to Muon", "dion_quarter_rank")


def claim_error_feedback_needed(results: Mapping) -> Claim:
    """Ahn et al.: without error feedback, low-rank Dion degrades. Rule: ``lower_verdict`` of
    (no EF) − (EF) at rank fractions 1/4 and 1/16; reproduced if at both, not reproduced if
    not reproduced at either, else inconclusive. At full rank P Rᵀ = B, so the two variants
    are the same algorithm: their difference is reported as a consistency check."""
    parts, verdicts = {}, []
    for name in ("1/4", "1/16"):
        diff, numbers = _compare(results, f"dion-{name}-noef", f"dion-{name}-ef")
        parts[name] = numbers
        verdicts.append(lower_verdict(diff))
    verdict = ("reproduced" if all(v == "reproduced" for v in verdicts) else
               "not reproduced" if "not reproduced" in verdicts else "inconclusive")
    full, _ = _compare(results, "dion-1-noef", "dion-1-ef")
    numbers = {"rank_1/4": parts["1/4"], "rank_1/16": parts["1/16"], "verdicts": dict(zip(("1/4", "1/16"), verdicts)),
               "full_rank_difference": full}
    text = "; ".join(f"rank {n}: no EF − EF = {_diff_text(parts[n]['difference'])} ({v})"
                     for n, v in zip(("1/4", "1/16"), verdicts))
    sentence = (f"{_OUTCOME[verdict]}: {text}. At full rank the two variants are the same algorithm in exact "
                f"arithmetic (P Rᵀ = B): there no EF − EF = {_diff_text(full)}, the noise floor that rounding, "
                "amplified over the run, puts under every comparison.")
    rule = (_lower_rule("test loss without − with error feedback") + ", at rank 1/4 and at rank 1/16; reproduced "
            "if reproduced at both, not reproduced if not reproduced at either, else inconclusive")
    measured = "; ".join(f"r {n}: {_diff_text(parts[n]['difference'])}" for n in ("1/4", "1/16"))
    return Claim("error_feedback", "Without error feedback, low-rank Dion degrades", "Ahn et al., arXiv 2504.05295",
                 rule, verdict, numbers, sentence, f"no EF − EF at {measured}")


def claim_polar_express_more_accurate(results: Mapping) -> Claim:
    """Amsel et al.: Polar Express coefficients orthogonalize more accurately than Keller's at
    the same number of steps (5). Measured on the model's gradients: per seed, the mean over the
    captured gradients of ‖NS(G) − U Vᵀ‖_F / √k in the training's Newton–Schulz dtype;
    rule ``lower_verdict`` on Keller − Polar Express."""
    spectral = results.get("spectral") or {}
    dtype = results.get("config", {}).get("ns_dtype", "bfloat16")
    schedules = spectral.get("schedules", {})
    if not all(s in schedules and dtype in schedules[s] for s in SV_SCHEDULES):
        diff = {"mean": None, "spread": None, "n": 0, "finite": False}
        numbers: dict = {"difference": diff}
    else:
        seeds = spectral["seeds"]
        jordan, pe = (dict(zip(seeds, schedules[s][dtype]["rms_by_seed"])) for s in SV_SCHEDULES)
        diff = paired_difference(jordan, pe)
        numbers = {"dtype": dtype, "difference": diff,
                   **{s: {k: schedules[s][k] for k in schedules[s] if isinstance(schedules[s][k], dict)}
                      for s in SV_SCHEDULES}}
    verdict = lower_verdict(diff)
    if diff["finite"]:
        j, p = (schedules[s] for s in SV_SCHEDULES)
        detail = (f"distance to the polar factor ‖NS(G) − UVᵀ‖_F/√k, {dtype}, mean over {spectral['gradients']} "
                  f"gradients per seed: Keller {_mean_std(j[dtype]['rms_by_seed'])}, Polar Express "
                  f"{_mean_std(p[dtype]['rms_by_seed'])}; Keller − Polar Express = {_diff_text(diff)}; worst "
                  f"|σ − 1| on σ̂ ∈ [1e-3, 1]: Keller {j[dtype]['worst_in_band']:.3f} (exact map "
                  f"{j['exact']['worst_in_band']:.3f}), Polar Express {p[dtype]['worst_in_band']:.3f} (exact "
                  f"{p['exact']['worst_in_band']:.3f})")
    else:
        detail = "no gradients were measured"
    return Claim("polar_express", "Polar Express coefficients orthogonalize more accurately than Keller's at the "
                 "same number of steps", "Amsel et al., arXiv 2505.16932",
                 _lower_rule(f"‖NS(G) − UVᵀ‖_F/√k of Keller − Polar Express ({dtype}, mean over a seed's gradients)"),
                 verdict, numbers, f"{_OUTCOME[verdict]}: {detail}.",
                 f"Keller − Polar Express = {_diff_text(diff)} ({dtype}, distance to UVᵀ)")


CLAIMS = (claim_muon_beats_adamw, claim_dion_full_rank_matches_muon, claim_dion_quarter_rank_close,
          claim_error_feedback_needed, claim_polar_express_more_accurate)


def evaluate_claims(results: Mapping) -> list[Claim]:
    """Every claim of ``CLAIMS`` judged on ``results`` (as ``run_study`` returns them, or a
    synthetic dict with ``evaluation`` {key: {"seeds", "test_loss"}}, ``spectral`` and
    ``config.ns_dtype``); a method missing from the results makes its claims inconclusive."""
    return [claim(results) for claim in CLAIMS]


# ---------------------------------------------------------------------------------------
# Report: plots, markdown, results.json
# ---------------------------------------------------------------------------------------

#: Loss-curve panels: the optimizers side by side, then Dion's rank and error feedback.
_PANELS = (("adamw", "muon-jordan", "muon-polar_express", "dion-1-ef"),
           ("muon-jordan", "dion-1-ef", "dion-1/4-ef", "dion-1/4-noef", "dion-1/16-ef", "dion-1/16-noef"))


def _style(key: str) -> dict:
    import matplotlib

    color = matplotlib.colormaps["tab10"](list(_BY_KEY).index(key) % 10)
    return {"color": color, "ls": "--" if key.endswith("-noef") else "-"}


def _array(rows) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=float)


def _plot_curves(results: Mapping, path: Path) -> Path:
    from ortho_verify.plots import _pyplot

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    tops, bottoms = [], []
    for ax, keys in zip(axes, _PANELS):
        for key in keys:
            e = results["evaluation"].get(key)
            if not e:
                continue
            steps, curves = np.array(e["curve_steps"]), _array(e["curves"])
            mean = np.nanmean(curves, axis=0)
            ax.plot(steps, mean, lw=1.4, label=f"{_BY_KEY[key].label} (lr {e['lr']:g})", **_style(key))
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
    from ortho_verify.plots import _pyplot

    plt = _pyplot()
    keys = [m.key for m in METHODS if m.key in results["evaluation"]]
    fig, ax = plt.subplots(figsize=(7, 0.32 * len(keys) + 1.2))
    for i, key in enumerate(keys):
        losses = np.array([np.nan if v is None else v for v in results["evaluation"][key]["test_loss"]], float)
        ax.scatter(losses, np.full(len(losses), i), s=16, alpha=0.7, color=_style(key)["color"], linewidths=0)
        ax.plot([np.nanmean(losses)] * 2, [i - 0.3, i + 0.3], color="black", lw=1.2)
    ax.set_yticks(range(len(keys)), [_BY_KEY[k].label for k in keys], fontsize=8)
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlabel("held-out (test) loss at the last step, nats/byte (dots: seeds, bar: mean)")
    fig.subplots_adjust(left=0.25, right=0.98, bottom=0.9 / fig.get_figheight(), top=1 - 0.15 / fig.get_figheight())
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _plot_sweep(results: Mapping, path: Path) -> Path:
    from ortho_verify.plots import _pyplot

    plt = _pyplot()
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
    ``lr_sweep.png`` and ``sv_map_<schedule>.png`` (``ortho_verify.plots.singular_value_map``).
    Returns the written paths; [] if matplotlib is not installed."""
    try:
        from ortho_verify.plots import _pyplot, singular_value_map

        _pyplot()
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
        losses = _losses(results, m.key)
        per_seed = ", ".join("diverged" if v is None else f"{v:.3f}" for v in losses.values())
        diffs = []
        for ref in ("adamw", "muon-jordan"):
            d = paired_difference(losses, _losses(results, ref))
            diffs.append("—" if m.key == ref else "n/a" if not d["finite"] else
                         f"{d['mean']:+.4f}" + ("" if d["spread"] is None else f" ± {d['spread']:.4f}"))
        lines.append(f"| {m.label} | {_fmt_lr_sweep(results, m.key)} | {_mean_std(losses.values())} | {per_seed} | "
                     f"{diffs[0]} | {diffs[1]} |")
    return lines


def _spectral_section(results: Mapping) -> list[str]:
    s = results["spectral"]
    if not s:
        return ["No gradient was captured: every Muon (Keller) evaluation run diverged at its first step.", ""]
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
            lines.append(f"| {name} | {x0} | {how} | {_mean_std(e[kind]['rms_by_seed'])} | "
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
        f"- **Model**: the byte-level GPT-2-style decoder of `ortho_verify.data` (pre-norm blocks, fused qkv, 4× GELU MLP, "
        f"untied lm_head): d_model {c['d_model']}, {_plural(c['n_layers'], 'layer')}, "
        f"{_plural(c['n_heads'], 'head')}, context {c['context']} bytes; {params}.",
        f"- **Training**: {c['steps']} steps of {c['batch_size']} random windows ({c['batch_size'] * c['context']} "
        "bytes) per step, the same for every method; for a given seed every method starts from the same weights "
        "and sees the same batches, so methods are compared per seed (paired). Every learning rate (matrix and "
        f"AdamW) follows the same schedule: linear warm-up over {_plural(config.warmup_steps(), 'step')}, then "
        f"cosine decay to {c['final_lr_fraction']:g} × the peak at the last step (`ortho_verify.reproduce.lr_multiplier`). "
        "Weight decay 0 for every method (the runs are short; decay would couple differently to each method's lr "
        "convention), so AdamW here is Adam with decoupled (zero) decay.",
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
        "M ← B − (1 − μ) P Rᵀ.",
        f"- **Learning rates**: grids AdamW {list(c['adamw_lrs'])}, Muon {list(c['muon_lrs'])}, Dion "
        f"{list(c['dion_lrs'])}; each grid is extended by a factor {c['lr_factor']:g} beyond an edge that wins "
        f"(at most {_plural(c['lr_extensions'], 'time')}). The best lr of each method is chosen on the **validation** "
        f"split with the sweep seed {results['seeds']['sweep']}; the table reports the **test** split on the other "
        f"seeds {results['seeds']['evaluation']}, so neither the seed nor the text that chose the lr is the one "
        "reported.",
        f"- **Held-out loss**: mean next-byte cross-entropy in nats per byte over {c['eval_windows']} evenly spaced "
        f"windows of {c['context']} bytes of the split (ln 256 = 5.545 is chance).",
    ]


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
    return ", ".join(f"{name}: r = {ortho_fast.dion_rank(side, side, f, 1)}" for f, name in _RANKS)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _parameter_counts(config: ReproConfig) -> str:
    model = _build_model(_gpt_config(config), torch.Generator().manual_seed(0))
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
        "- Configuration (`ortho_verify.reproduce.ReproConfig`; `results.json` holds it with every number of this page):",
        "",
        "```json",
        json.dumps(results["config"], sort_keys=True),
        "```",
    ]


def render_markdown(results: Mapping, plots: Sequence[str] = ()) -> str:
    """``docs/reproduction.md`` from a study's results: verdicts, results table, plots (names in
    ``plots``, relative to the markdown file), claims with their numbers and decision rules,
    the singular-value map, the setup and what is needed to rerun it."""
    claims = results["claims"]
    shown = set(plots)

    def image(name: str, alt: str) -> list[str]:
        return [f"![{alt}]({name})", ""] if name in shown else []

    folder = "reproduction"
    lines = [
        "# Reproduction: Muon, Dion and Polar Express on real text",
        "",
        f"Generated by `{results.get('command', 'ortho-verify reproduce')}` — do not edit by hand: rerun it to "
        "regenerate this page, its plots and the raw numbers (`reproduction/results.json`). "
        f"{len(results['evaluation'])} methods × ({len(results['seeds']['evaluation'])} evaluation seeds + a "
        f"learning-rate sweep) on {results['environment']['device']} in {results['wall_seconds'] / 60:.1f} min. "
        "Scale matters: this is a small model trained for a short time, and a claim that does not reproduce here "
        "may still hold at the papers' scale (`--scale`, `--device cuda`).",
        "",
        "## Verdicts",
        "",
        "| # | claim | source | measured | verdict |",
        "|---|---|---|---|---|",
        *(f"| {i} | {c['statement']} | {c['source']} | {c['measured']} | **{c['verdict']}** |"
          for i, c in enumerate(claims, 1)),
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
        "- Every comparison is paired: per evaluation seed, the difference of the two methods' test losses (same "
        "initialization, same batches); *spread* is the sample standard deviation of those differences over seeds.",
        "- *Lower* (claims 1, 4, 5): the claimed improvement d must exceed its spread: mean(d) − spread(d) > 0 is "
        "reproduced, mean(d) + spread(d) < 0 (the opposite resolved) is not reproduced, anything between is "
        "inconclusive. With 3 seeds this is a one-sided paired t statistic above √3 ≈ 1.7.",
        f"- *Matches* / *stays close* (claims 2, 3; equivalence): the interval mean(d) ± spread(d) must lie within "
        f"±δ, δ = {MATCH_MARGIN:.1%} / {CLOSE_MARGIN:.1%} of Muon's mean test loss (reproduced); entirely outside "
        "it: not reproduced; otherwise inconclusive. The margins are fixed in `ortho_verify.reproduce` (`MATCH_MARGIN`, "
        "`CLOSE_MARGIN`) before any run; the numbers are printed so that a reader can apply another margin.",
        "- With one evaluation seed every claim is inconclusive (no spread); a diverged evaluation run makes the "
        "claims on its method inconclusive.",
        "",
        "## Reproducibility",
        "",
        *_reproducibility(results),
        "",
    ]
    return "\n".join(lines)


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_report(results: dict, points: Mapping, out: Path) -> Path:
    """Write ``out/reproduction.md``, ``out/reproduction/*.png`` and ``out/reproduction/results.json``
    (non-finite numbers as null). Returns the markdown's path. Raises: OSError if ``out``
    cannot be written."""
    out = Path(out)
    folder = out / "reproduction"
    folder.mkdir(parents=True, exist_ok=True)
    plots = [f"reproduction/{p.name}" for p in write_plots(results, points, folder)]
    (folder / "results.json").write_text(json.dumps(_json_safe(results), indent=1) + "\n")
    path = out / "reproduction.md"
    path.write_text(render_markdown(results, plots))
    return path


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The ``ortho-verify reproduce`` command line."""
    default = ReproConfig()
    parser = argparse.ArgumentParser(
        prog="ortho-verify reproduce",
        description="Train a small byte-level GPT on the Python standard library's sources with AdamW, Muon "
                    "(Keller / Polar Express) and Dion (rank 1, 1/4, 1/16, with and without error feedback), sweep "
                    "each method's learning rate, evaluate it on several seeds, and write OUT/reproduction.md "
                    "(verdict per claim with its numbers), OUT/reproduction/*.png and OUT/reproduction/results.json.")
    parser.add_argument("--out", type=Path, default=Path("docs"), help="output folder (default: ./docs)")
    parser.add_argument("--quick", action="store_true", help="tiny model and few steps: a smoke run of seconds")
    parser.add_argument("--scale", type=int, default=1,
                        help="multiply d_model, heads, batch size, steps and held-out windows by this int (about "
                             "scale^4 the compute; for a GPU)")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"optimizer steps per run (default {default.steps} × scale)")
    parser.add_argument("--seeds", type=int, default=None,
                        help=f"number of evaluation seeds, 1..N (default {len(default.seeds)}); the lr sweep uses "
                             f"seed {default.sweep_seed}")
    parser.add_argument("--device", default="cpu", help="torch device: cpu (default), cuda, cuda:1, ...")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads per job (default 1: the model is small, and two threads on "
                             "a 2-core machine that other processes use spin-wait)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="runs in parallel, each in its own process (default: 2 on a CPU with >= 2 cores, "
                             "else 1; results do not depend on it)")
    return parser


def _config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> ReproConfig:
    for name in ("scale", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    for name in ("steps", "seeds", "jobs"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.quick and args.scale != 1:
        parser.error("--quick and --scale: choose one")
    try:
        device = torch.device(args.device)
    except RuntimeError as err:
        parser.error(f"--device {args.device!r}: {err}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available in this torch build / machine")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        parser.error(f"--device {args.device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    config = QUICK if args.quick else ReproConfig().scaled(args.scale)
    changes = {}
    if args.steps is not None:
        changes["steps"] = args.steps
    if args.seeds is not None:
        changes["seeds"] = tuple(range(config.sweep_seed + 1, config.sweep_seed + 1 + args.seeds))
    try:
        return replace(config, **changes)
    except ValueError as err:
        parser.error(str(err))


def main(argv: list[str] | None = None) -> int:
    """Run the reproduction and write the report; returns 0 when the report was written
    (whatever the verdicts: a claim that does not reproduce is a result, not an error).
    Bad arguments: argparse's exit with code 2 and a message naming the option."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    config = _config(args, parser)
    jobs = args.jobs or (min(2, os.cpu_count() or 1) if torch.device(args.device).type == "cpu" else 1)

    def log(message: str) -> None:
        print(message, flush=True)

    results, points = run_study(config, device=args.device, jobs=jobs, threads=args.threads, log=log)
    results["command"] = " ".join(["ortho-verify reproduce", *argv])
    path = write_report(results, points, args.out)
    print(f"\nwrote {path} (plots and results.json in {path.parent / 'reproduction'}), "
          f"{results['wall_seconds']:.0f} s")
    for claim in results["claims"]:
        print(f"  {claim['verdict']:>15}: {claim['statement']}")
    return 0


if __name__ == "__main__":
    from ortho_verify.reproduce import main as _main  # the importable module, so spawned jobs unpickle its functions

    sys.exit(_main())
