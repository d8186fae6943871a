"""``ortho-verify``: check the fast Muon / Dion implementations against the exact oracle.

The default run trains a small byte-level GPT on the running Python's standard-library
sources (cached), captures real gradient matrices, adds synthetic matrices with prescribed
spectra, runs every check of ``verify.checks``, prints one table, writes ``report.json``
and ``report.md`` and exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from threadpoolctl import threadpool_limits

import ortho_fast
from verify import checks, data, report
from verify.spectra import synthetic_matrices

DTYPES = ("float64", "float32", "bfloat16")


def build_parser() -> argparse.ArgumentParser:
    """The ``ortho-verify`` command line (``--quick``, ``--out``, ``--cache-dir``, ``--seed``, ``--no-real``)."""
    parser = argparse.ArgumentParser(
        prog="ortho-verify",
        description="Check ortho_fast's Newton–Schulz, Muon and Dion against the exact oracle ortho_ref.",
    )
    parser.add_argument("--quick", action="store_true", help="fewer inputs (< 60 s on 2 CPU cores)")
    parser.add_argument("--out", type=Path, default=Path("ortho-verify-out"),
                        help="folder for report.json and report.md (default: ./ortho-verify-out)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="cache for the captured real gradients (default: $ORTHO_CACHE_DIR or ~/.cache/ortho)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the model, data order and synthetic inputs")
    parser.add_argument("--no-real", action="store_true", help="skip the real-gradient inputs (synthetic only)")
    return parser


def plan_jobs(cases, quick: bool) -> list[tuple[str, callable]]:
    """Every (label, thunk) to run, in report order."""
    jobs = [("coefficient registries", checks.check_coefficient_registries)]
    schedules = sorted(ortho_fast.COEFFICIENTS)
    for case in cases:
        for sched in schedules:
            for dtype in DTYPES:
                jobs.append((f"NS {sched}/{dtype} {case.name}",
                             lambda c=case, s=sched, d=dtype: checks.check_newton_schulz(c, s, d)))
    for case in cases:
        for cfg in checks.MUON_CONFIGS:
            for dtype in ("float64", "float32"):
                jobs.append((f"Muon {cfg}/{dtype} {case.name}",
                             lambda c=case, g=cfg, d=dtype: checks.check_muon(c, g, d)))
    rank_fractions = (1.0, 0.25) if quick else (1.0, 0.25, 1 / 16)
    for case in cases:
        for rf in rank_fractions:
            for dtype in ("float64", "float32"):
                jobs.append((f"Dion r={rf:g}/{dtype} {case.name}",
                             lambda c=case, f=rf, d=dtype: checks.check_dion(c, f, d)))
    for case in cases:
        jobs.append((f"torch.optim.Muon {case.name}", lambda c=case: checks.check_torch_muon(c)))
    return jobs


def main(argv: list[str] | None = None) -> int:
    """Run the checks; returns the exit code (0: every check passed, 1: a check failed)."""
    args = build_parser().parse_args(argv)
    # The oracle's SVDs are small (<= 512 x 1024): a single BLAS thread is faster than two
    # OpenBLAS threads competing with torch's pool (measured: 0.02 s vs 2.8 s per 256 x 512
    # SVD when a second process used the other core).
    with threadpool_limits(limits=1, user_api="blas"):
        return _run(args, argv)


def _run(args: argparse.Namespace, argv: list[str] | None) -> int:
    console = Console() if sys.stdout.isatty() else Console(width=200)
    started = time.perf_counter()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    cases = []
    progress_cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    train_info = None
    with Progress(*progress_cols, console=console, transient=True) as progress:
        if not args.no_real:
            task = progress.add_task("training the stdlib GPT (cached after the first run)", total=None)

            def on_step(step: int, total: int, loss: float) -> None:
                progress.update(task, total=total, completed=step,
                                description=f"training the stdlib GPT: loss {loss:.3f}")

            cases += data.real_gradients(quick=args.quick, cache_dir=args.cache_dir, seed=args.seed, progress=on_step)
            train_info = data.last_run_info()
            progress.remove_task(task)
        cases += synthetic_matrices(quick=args.quick, seed=args.seed)
        jobs = plan_jobs(cases, args.quick)
        task = progress.add_task("checks", total=len(jobs))
        results = []
        for label, job in jobs:
            progress.update(task, description=label[:60])
            results += job()
            progress.advance(task)

    report.print_table(results, console)
    elapsed = time.perf_counter() - started
    meta = {
        "command": " ".join(["ortho-verify", *(argv if argv is not None else sys.argv[1:])]),
        "quick": args.quick,
        "seed": args.seed,
        "inputs": len(cases),
        "real_inputs": sum(c.source == "real" for c in cases),
        "training": train_info,
        "elapsed_s": round(elapsed, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "machine": f"{platform.machine()} {platform.system()}, {torch.get_num_threads()} threads",
    }
    json_path, md_path = report.write_reports(results, args.out, meta)
    summ = report.summary(results)
    style = "green" if summ["failed"] == 0 else "bold red"
    console.print(f"[{style}]{summ['passed']} passed, {summ['failed']} failed[/] "
                  f"({len(cases)} inputs, {elapsed:.1f} s). Reports: {json_path}, {md_path}")
    return 0 if summ["failed"] == 0 else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
