"""The model-size sweep of ``ortho-verify reproduce``: the whole protocol (``run_study``) at each of
several widths, every claim judged at each size, and the trend of each claim's paired difference
against model size (``ortho_verify.reproduce.trend``).

Sources: Ahn et al., arXiv 2504.05295 (Dion: low-rank Dion's gap to Muon shrinks as models grow);
Jordan et al. 2024; Amsel et al., arXiv 2505.16932.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

import ortho_fast

from ..inputs.data import build_model
from .cache import CachedRunner, RunCache
from .config import FLAT_REFERENCE, QUICK, TREND_SERIES, ReproConfig, TrendSeries, gpt_config
from .cost import time_steps
from .pool import Runner
from .statistics import test_losses
from .study import MODES, environment, run_study, study_methods
from .trend import FLAT_MARGIN, trend_verdict

__all__ = ["DEFAULT_SWEEP", "LR_SWEEP_MODES", "ModelSize", "QUICK_SWEEP", "SizeSweep", "cost_table",
           "parameter_counts", "run_size_sweep", "series_differences", "size_trends"]

#: "each": every size sweeps its own lrs; "shared": the smallest size sweeps, the others reuse its lrs;
#: "matrix-shared": every size sweeps AdamW (which also trains the embeddings, norms and lm_head),
#: Muon's and Dion's lrs come from the smallest size (their √(m/n) lr scale is meant to transfer across widths).
LR_SWEEP_MODES = ("each", "shared", "matrix-shared")


@dataclass(frozen=True)
class ModelSize:
    """One model of the sweep: ``d_model``, ``n_layers``, ``n_heads`` of ``ortho_verify.inputs.data``'s GPT,
    ``steps`` (None: the base configuration's)."""

    d_model: int
    n_layers: int
    n_heads: int
    steps: int | None = None

    def apply(self, base: ReproConfig) -> ReproConfig:
        """``base`` at this size. Raises: ValueError as ``ReproConfig``."""
        return replace(base, d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
                       steps=base.steps if self.steps is None else self.steps)


@dataclass(frozen=True)
class SizeSweep:
    """The sweep: ``base`` (everything but the model size: batch, schedule, seeds, grids) at each of
    ``sizes`` (at least 2, strictly increasing d_model), ``lr_sweep`` one of ``LR_SWEEP_MODES``,
    ``methods`` the keys of the methods run (``study.study_methods``; () every method).
    Raises: ValueError naming the field."""

    base: ReproConfig
    sizes: tuple[ModelSize, ...]
    lr_sweep: str = "each"
    methods: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.sizes) < 2:
            raise ValueError(f"sizes: expected at least 2 model sizes, got {len(self.sizes)}")
        widths = [s.d_model for s in self.sizes]
        if widths != sorted(set(widths)):
            raise ValueError(f"sizes: expected strictly increasing d_model, got {widths}")
        if self.lr_sweep not in LR_SWEEP_MODES:
            raise ValueError(f"lr_sweep: expected one of {LR_SWEEP_MODES}, got {self.lr_sweep!r}")
        study_methods(self.methods)
        self.configs()  # each size is a valid ReproConfig

    def configs(self) -> list[ReproConfig]:
        """The ``ReproConfig`` of each size, smallest first."""
        return [s.apply(self.base) for s in self.sizes]

    def scaled(self, k: int) -> "SizeSweep":
        """Every size's ``ReproConfig.scaled(k)`` (widths, heads, batch, steps, windows × k)."""
        base = self.base.scaled(k)
        return replace(self, base=base, sizes=tuple(
            ModelSize(s.d_model * k, s.n_layers, s.n_heads * k, None if s.steps is None else s.steps * k)
            for s in self.sizes))


#: The default sweep: widths 32, 64, 128 (head size 16, 2 layers; 16× the matrix parameters from the
#: smallest to the largest), 150 steps each with the held-out loss at 4 points of the evaluation runs,
#: every size with its own lr sweep (the winners move by a factor 2 between d_model 32 and 64) extended up
#: to twice beyond a winning edge (low-rank Dion won at the low edge of a grid starting at 0.01, so the Dion /
#: Dion2 grid now starts at 0.0025). With 9 methods it took 14 min on 2 shared CPU cores; NorMuon, Dion2 and the
#: two lower Dion grid points add about half as many runs again (the report records the wall time).
DEFAULT_SWEEP = SizeSweep(replace(ReproConfig(), steps=150, curve_points=4, lr_extensions=2),
                          (ModelSize(32, 2, 2), ModelSize(64, 2, 4), ModelSize(128, 2, 8)))
#: ``--quick``: three tiny widths of ``QUICK``, the lr sweep shared (run at the smallest); a measurement run.
QUICK_SWEEP = SizeSweep(QUICK, (ModelSize(8, 1, 2), ModelSize(16, 1, 2), ModelSize(QUICK.d_model, 1, 2)),
                        lr_sweep="shared")


def parameter_counts(config: ReproConfig) -> dict:
    """{"total": parameters of the model, "matrices": those Muon / Dion train} at ``config``'s size."""
    model = build_model(gpt_config(config), torch.Generator().manual_seed(0))
    groups = ortho_fast.param_groups(model, algorithm="muon", lm_head_lr_scale=None)
    matrices = sum(p.numel() for g in groups if g["algorithm"] == "muon" for p in g["params"])
    return {"total": sum(p.numel() for p in model.parameters()), "matrices": matrices}


def series_differences(results: Mapping, series: TrendSeries) -> dict[int, float | None]:
    """Seed -> the series' paired difference (``series.worse`` − ``series.better``) at one size:
    test losses, or for ``series.kind`` "spectral" the distance to UVᵀ of the two schedules in
    the training's Newton–Schulz dtype. Seeds missing on either side are left out."""
    if series.kind == "spectral":
        spectral = results.get("spectral") or {}
        dtype = results.get("config", {}).get("ns_dtype", "bfloat16")
        try:
            a, b = (dict(zip(spectral["seeds"], spectral["schedules"][k][dtype]["rms_by_seed"]))
                    for k in (series.worse, series.better))
        except KeyError:
            return {}
    else:
        a, b = test_losses(results, series.worse), test_losses(results, series.better)
    return {s: None if a[s] is None or b[s] is None else a[s] - b[s] for s in sorted(set(a) & set(b))}


def _reference_level(results: Mapping, series: TrendSeries) -> float | None:
    if series.kind == "spectral":
        spectral = results.get("spectral") or {}
        dtype = results.get("config", {}).get("ns_dtype", "bfloat16")
        try:
            return float(np.mean(spectral["schedules"][series.worse][dtype]["rms_by_seed"]))
        except KeyError:
            return None
    v = [x for x in test_losses(results, FLAT_REFERENCE).values() if x is not None]
    return float(np.mean(v)) if v else None


def size_trends(sizes: list[Mapping]) -> list[dict]:
    """The trend of every ``TREND_SERIES`` over the per-size results ``sizes`` (each with
    ``parameters``): ``trend_verdict`` against the matrix-parameter count, flat margin
    ``FLAT_MARGIN`` × the reference level (Muon (Keller)'s mean test loss, or Keller's mean
    distance to UVᵀ) averaged over sizes; with the series' fields and per-size differences."""
    out = []
    counts = [r["parameters"]["matrices"] for r in sizes]
    for series in TREND_SERIES:
        diffs = [series_differences(r, series) for r in sizes]
        levels = [x for x in (_reference_level(r, series) for r in sizes) if x is not None]
        margin = FLAT_MARGIN * float(np.mean(levels)) if levels else float("nan")
        verdict = trend_verdict(counts, diffs, margin)
        out.append({**asdict(series), **verdict, "sizes": counts,
                    "differences": [{str(k): v for k, v in d.items()} for d in diffs]})
    return out


def cost_table(sizes: list[Mapping]) -> list[dict]:
    """Per size and method: seconds per training step — ``step_cost`` (timed serially,
    ``ortho_verify.reproduce.cost.time_steps``) when the size has it, else the median of the
    evaluation runs' ``step_seconds`` (timed while other runs share the machine) — and its ratio
    to Muon (Keller)'s at the same size (None if not measured); ``source`` says which."""
    rows = []
    for r in sizes:
        medians = {}
        for key, e in r["evaluation"].items():
            v = [x for x in e.get("step_seconds", []) if x is not None]
            medians[key] = float(np.median(v)) if v else None
        serial = r.get("step_cost")
        if serial:
            medians = {k: serial.get(k) for k in r["evaluation"]}
        muon = medians.get("muon-jordan")
        rows.append({"d_model": r["config"]["d_model"], "seconds_per_step": medians,
                     "source": "serial" if serial else "evaluation runs",
                     "ratio_to_muon": {k: None if v is None or not muon else v / muon for k, v in medians.items()}})
    return rows


def run_size_sweep(sweep: SizeSweep, *, device: str = "cpu", jobs: int = 1, threads: int = 1,
                   log: Callable[[str], None] = print, cache: Path | None = None, resume: bool = False,
                   mode: str = "study") -> tuple[dict, dict]:
    """Run ``run_study`` at each size of ``sweep`` (smallest first) and judge the trends.

    ``cache``: a folder for ``RunCache`` (None: no cache); ``resume``: reuse the cached runs whose
    key matches (``ortho_verify.reproduce.cache``), else every run is recomputed (and stored).
    Returns (results, singular-value points of the largest size). ``results`` is the largest
    size's ``run_study`` results (so every single-size reader works on it) plus ``sizes`` (each
    size's results with ``parameters``), ``trends`` (``size_trends``), ``cost``
    (``cost_table``), ``size_sweep`` (the sweep's configuration), ``cache`` {"folder", "hits",
    "misses", "cached_seconds"}, and ``wall_seconds`` / ``run_seconds`` of the whole sweep.
    ``mode``: as ``run_study``'s; a "measurement" sweep judges no trend either (verdict "measured").
    Raises: ValueError for jobs or threads < 1 or an unknown mode."""
    if jobs < 1 or threads < 1:
        raise ValueError(f"jobs, threads: expected >= 1, got {jobs}, {threads}")
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    start = time.perf_counter()
    env = environment(device, threads, jobs)
    per_size, points, shared = [], {}, None
    hits = misses = 0
    cached_seconds = run_seconds = 0.0
    for config in sweep.configs():
        log(f"== d_model {config.d_model}, {config.n_layers} layers, {config.n_heads} heads, {config.steps} steps ==")
        runner = Runner(config, device, jobs, threads, log)
        if cache is not None:
            runner = CachedRunner(runner, RunCache(cache), reuse=resume)
        try:
            results, points = run_study(config, device=device, jobs=jobs, threads=threads, log=log, runner=runner,
                                        shared_sweep=shared, sweep_adamw=sweep.lr_sweep == "matrix-shared",
                                        methods=sweep.methods, mode=mode)
        finally:
            runner.close()
        if cache is not None:
            hits, misses, cached_seconds = (hits + runner.hits, misses + runner.misses,
                                            cached_seconds + runner.cached_seconds)
        run_seconds += results["run_seconds"]
        log(f"cost per step at d_model {config.d_model} (serial, methods interleaved)")
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            # rounds of a third of a run's steps, at most 8 (a short measurement run times a short cost too)
            results["step_cost"] = time_steps(config, results["best_lr"], results["scalar_lr"], device=device,
                                              steps=max(1, min(8, config.steps // 3)))
        finally:
            torch.set_num_threads(previous)
        results["parameters"] = parameter_counts(config)
        results.pop("environment", None)
        per_size.append(results)
        if sweep.lr_sweep != "each" and shared is None:
            shared = results
    out = dict(per_size[-1])
    out["environment"] = env
    out["sizes"] = per_size
    out["trends"] = size_trends(per_size)
    if mode == "measurement":
        for t in out["trends"]:
            t["verdict"] = "measured"
    out["cost"] = cost_table(per_size)
    out["size_sweep"] = {"base": asdict(sweep.base), "sizes": [asdict(s) for s in sweep.sizes],
                         "lr_sweep": sweep.lr_sweep, "methods": list(sweep.methods)}
    folder = None if cache is None else str(cache).replace(str(Path.home()), "~", 1)  # no machine path
    out["cache"] = {"folder": folder, "resume": resume, "hits": hits, "misses": misses,
                    "cached_seconds": cached_seconds}
    out["run_seconds"] = run_seconds
    out["wall_seconds"] = time.perf_counter() - start
    return out, points
