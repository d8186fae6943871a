"""The protocol of ``ortho-verify reproduce`` (``run_study``): sweep, evaluation, singular-value map,
claims; and the environment it records."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from ..optional import require
from .claims import evaluate_claims
from .config import METHODS, RESULTS_FORMAT, SV_DTYPES, Method, ReproConfig
from .pool import Runner, init_worker
from .spectral import singular_value_study
from .sweep import best_learning_rate, sweep_learning_rates
from .training import corpus

__all__ = ["MODES", "cpu_model", "environment", "run_study", "study_methods"]

#: "study": the claims are decided; "measurement" (``--quick``, ``--dry-run``): differences are measured, none decided.
MODES = ("study", "measurement")


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo, else ``platform``)."""
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
        mpl = require("matplotlib", "the reproduction's plots").__version__
    except ImportError:
        mpl = None
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    dev = torch.device(device)
    return {
        "python": sys.version, "torch": torch.__version__, "cuda": torch.version.cuda, "numpy": np.__version__,
        "scipy": scipy.__version__, "matplotlib": mpl, "platform": platform.platform(), "cpu": cpu_model(),
        "cpu_count": os.cpu_count(), "cpus_available": affinity, "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_model(),
        "torch_threads_per_job": threads, "jobs": jobs, "deterministic_algorithms": True,
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "git_commit": _git("rev-parse", "HEAD") or None,
        "git_uncommitted_changes": None if (status := _git("status", "--porcelain")) is None else bool(status),
        "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def study_methods(keys: Sequence[str] = ()) -> tuple[Method, ...]:
    """The methods a study runs, in ``METHODS`` order: all of them for empty ``keys``, else those of
    ``keys`` (AdamW must be among them: its best lr trains the non-matrix parameters of the others).
    Raises: ValueError naming an unknown key, or without "adamw"."""
    if not keys:
        return METHODS
    known = {m.key for m in METHODS}
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise ValueError(f"methods: unknown or unavailable {unknown}; expected keys of {sorted(known)}")
    if "adamw" not in keys:
        raise ValueError("methods: expected 'adamw' among them (its best lr trains the non-matrix parameters)")
    return tuple(m for m in METHODS if m.key in keys)


def run_study(config: ReproConfig, *, device: str = "cpu", jobs: int = 1, threads: int = 1,
              log: Callable[[str], None] = print, runner=None, shared_sweep: Mapping | None = None,
              sweep_adamw: bool = False, methods: Sequence[str] = (), mode: str = "study") -> tuple[dict, dict]:
    """Run the whole protocol (module docstring) and return (results, singular-value points).

    ``results`` is JSON-serializable: ``config``, ``methods``, ``corpus``, ``environment``,
    ``seeds``, ``sweep`` {key: [{"lr", "validation_loss"}]}, ``best_lr``, ``best_at_edge``,
    ``scalar_lr`` (AdamW's best lr, used for the non-matrix parameters of Muon / Dion),
    ``evaluation`` {key: {"lr", "seeds", "test_loss", "curve_steps", "curves", "train_curves",
    "diverged", "seconds", "step_seconds"}}, ``lr_source`` (None, or the d_model whose sweep was
    reused), ``spectral`` (``singular_value_study`` in ``SV_DTYPES`` and
    ``config.ns_dtype``; None if every Muon (Keller) evaluation run diverged before its first
    gradient), ``claims``
    (``evaluate_claims``), ``wall_seconds``, ``run_seconds``. ``points`` feed the
    singular-value map plots. Deterministic given the configuration, device and threads.
    ``runner``: run the training through this object instead of a new ``Runner`` (anything with
    ``config``, ``map(phase, jobs)`` and ``seconds``, e.g. a ``CachedRunner``; the caller closes
    it). ``shared_sweep``: the results of another study (another model size) whose lr sweep,
    best lrs and AdamW lr this one reuses instead of sweeping; with ``sweep_adamw`` only Muon's and
    Dion's are reused, AdamW's (which also trains the non-matrix parameters) is swept here.
    ``methods``: the keys of the methods to run (``study_methods``; default every method of ``METHODS``).
    ``mode``: "study" (claims decided) or "measurement" (``--quick``, ``--dry-run``: no claim is
    decided, every verdict ``claims.MEASURED``); recorded as ``results["mode"]``.
    Raises: ValueError for jobs or threads < 1, an unknown mode, or as ``study_methods``.
    """
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if jobs < 1 or threads < 1:
        raise ValueError(f"jobs, threads: expected >= 1, got {jobs}, {threads}")
    chosen = study_methods(methods)
    start = time.perf_counter()
    if torch.device(device).type == "cuda":  # deterministic cuBLAS (read when CUDA initializes; jobs inherit it)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    env = environment(device, threads, jobs)
    previous = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    init_worker(threads)
    own_runner = runner is None
    runner = Runner(config, device, jobs, threads, log) if own_runner else runner
    seconds_before = runner.seconds
    # One BLAS thread for the oracle's SVDs, as ortho_verify.cli.main: two OpenBLAS threads on a 2-core machine that
    # other processes use made this study's SVDs take minutes instead of seconds.
    blas = threadpool_limits(limits=1, user_api="blas")
    try:
        sweep: dict = {}
        if shared_sweep is None or sweep_adamw:
            log(f"AdamW lr sweep on the validation split (seed {config.sweep_seed})")
            sweep_learning_rates(runner, chosen[:1], None, sweep)
            scalar_lr, _ = best_learning_rate(sweep["adamw"])
        if shared_sweep is None:
            log(f"Muon / Dion lr sweeps (non-matrix parameters on AdamW at its best lr {scalar_lr:g})")
            sweep_learning_rates(runner, chosen[1:], scalar_lr, sweep)
        else:
            reused = [m.key for m in chosen if m.key not in sweep]
            sweep.update({k: shared_sweep["sweep"][k] for k in reused})
            scalar_lr = scalar_lr if sweep_adamw else shared_sweep["scalar_lr"]
            log(f"lr sweep of d_model {shared_sweep['config']['d_model']} reused for {', '.join(reused)}")
        best = {m.key: best_learning_rate(sweep[m.key]) for m in chosen}
        log(f"evaluation at each method's best lr on seeds {list(config.seeds)} (test split)")
        capture = config.capture_points > 0
        jobs_ = [dict(method_key=m.key, lr=best[m.key][0], seed=s, scalar_lr=scalar_lr, split="test",
                      capture=capture and m.key == "muon-jordan") for m in chosen for s in config.seeds]
        runs = runner.map("evaluation", jobs_)
        if own_runner:
            runner.close()
        evaluation: dict = {}
        gradients = {}
        for r in runs:
            e = evaluation.setdefault(r["method"], {"lr": r["lr"], "seeds": [], "test_loss": [],
                                                    "curve_steps": r["curve_steps"], "curves": [], "train_curves": [],
                                                    "diverged": [], "seconds": [], "step_seconds": []})
            for key, value in (("seeds", r["seed"]), ("test_loss", r["loss"]), ("curves", r["curve"]),
                               ("train_curves", r["train_curve"]), ("diverged", r["diverged"]),
                               ("seconds", r["seconds"]), ("step_seconds", r.get("step_seconds"))):
                e[key].append(value)
            if r.get("gradients"):  # none from a run that diverged at step 1
                gradients[r["seed"]] = r["gradients"]
        if gradients:
            log("singular-value map of Newton–Schulz on the captured gradients")
        sv_dtypes = tuple(dict.fromkeys((*SV_DTYPES, config.ns_dtype)))  # claim 5 reads the training's dtype
        spectral, points = singular_value_study(gradients, sv_dtypes, device) if gradients else (None, {})
    finally:
        if own_runner:
            runner.close()
        blas.restore_original_limits()
        torch.set_num_threads(previous[0])
        torch.use_deterministic_algorithms(previous[1])
    split = corpus(config.heldout_every)
    results = {
        "format": RESULTS_FORMAT,
        "config": asdict(config),
        "methods": [asdict(m) for m in chosen],
        "corpus": {"source": "standard-library .py files of the running Python (ortho_verify.inputs.data.stdlib_split)",
                   "heldout_every": config.heldout_every, "files": split["files"],
                   "bytes": {k: len(v) for k, v in split["tensors"].items()}},
        "environment": env,
        "seeds": {"sweep": config.sweep_seed, "evaluation": list(config.seeds)},
        "sweep": sweep,
        "best_lr": {k: v[0] for k, v in best.items()},
        "best_at_edge": {k: v[1] for k, v in best.items()},
        "scalar_lr": scalar_lr,
        "lr_source": None if shared_sweep is None else shared_sweep["config"]["d_model"],
        "lr_reused": [] if shared_sweep is None else [m.key for m in chosen
                                                      if not (sweep_adamw and m.family == "adamw")],
        "evaluation": evaluation,
        "spectral": spectral,
        "run_seconds": runner.seconds - seconds_before,
    }
    results["mode"] = mode
    results["claims"] = [asdict(c) for c in evaluate_claims(results)]
    results["wall_seconds"] = time.perf_counter() - start
    return results, points
