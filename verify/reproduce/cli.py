"""``ortho-verify reproduce`` (also ``python -m ortho_verify.reproduce``): the command line.

Writes under ``--out`` (default ``./ortho-verify-out``, as the other commands); ``--write-docs``
writes the repository's ``docs/reproduction.md`` instead (``DOCS_DIR``), never by default. Every
argument is checked before any work (exit 2 naming it, ``ortho_verify.cli.arguments``).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch

from ..cli.arguments import SuggestingParser, check_folder
from ..report.tables import print_plain
from ..report.terminal import terminal_width
from .claims import MEASURED
from .config import QUICK, ReproConfig
from .device_plan import DRY_RUN_SWEEP, GPU_SWEEP, estimate_plan, plan_lines
from .markdown import write_report
from .rejudge import load_results, rejudge
from .scaling import run_size_sweep
from .study import run_study
from .sweep_cli import add_sweep_arguments, cache_folder, sweep_from_arguments

__all__ = ["DOCS_DIR", "build_parser", "main", "verdict_lines"]

#: The repository's docs folder: ``--write-docs`` writes ``DOCS_DIR/reproduction.md`` and ``DOCS_DIR/reproduction/``.
DOCS_DIR = Path(__file__).resolve().parents[2] / "docs"


def build_parser() -> argparse.ArgumentParser:
    """The ``ortho-verify reproduce`` command line."""
    default = ReproConfig()
    parser = SuggestingParser(
        prog="ortho-verify reproduce",
        description="At several model widths (a size sweep; --single-size: one), train a small byte-level GPT on "
                    "the Python standard library's sources with AdamW, Muon "
                    "(Keller / Polar Express), NorMuon, Dion (rank 1, 1/4, 1/16, with and without error feedback) and "
                    "Dion2 (fraction 1/4), sweep "
                    "each method's learning rate, evaluate it on several seeds, and write OUT/reproduction.md "
                    "(verdict per claim with its numbers), OUT/reproduction/*.png and OUT/reproduction/results.json.")
    parser.add_argument("--out", type=Path, default=Path("ortho-verify-out"),
                        help="output folder (default: ./ortho-verify-out)")
    parser.add_argument("--write-docs", action="store_true",
                        help=f"write the repository's docs ({DOCS_DIR / 'reproduction.md'}) instead of --out; "
                             "the full run only (not with --quick, --scale, --steps or --seeds)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny models and few steps: a measurement of the code path that decides no claim (its "
                             "time is in the README)")
    parser.add_argument("--dry-run", action="store_true",
                        help="with --device cuda: print the GPU plan (sizes, steps, tokens, estimated time and "
                             "memory on one H100 / H200) and run it at tiny sizes on the CPU through the same code "
                             "path, as a measurement")
    parser.add_argument("--scale", type=int, default=1,
                        help="multiply d_model, heads, batch size, steps and held-out windows by this int (about "
                             "scale^4 the compute; for a GPU)")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"optimizer steps per run (default {default.steps} × scale)")
    parser.add_argument("--seeds", type=int, default=None,
                        help=f"number of evaluation seeds, 1..N (default {len(default.seeds)}); the lr sweep uses "
                             f"seed {default.sweep_seed}")
    parser.add_argument("--device", default="cpu",
                        help="torch device: cpu (default), cuda, cuda:1, ...; cuda without --sizes / --scale / "
                             "--quick / --single-size runs the GPU plan (ortho_verify.reproduce.device_plan)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads per job (default 1: the model is small, and two threads on "
                             "a 2-core machine that other processes use spin-wait)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="runs in parallel, each in its own process (default: 2 on a CPU with >= 2 cores, "
                             "else 1; results do not depend on it)")
    parser.add_argument("--no-plots", action="store_true",
                        help="do not write the PNG plots (the report links none; not with --write-docs)")
    parser.add_argument("--rejudge", type=Path, default=None, metavar="RESULTS_JSON",
                        help="run nothing: judge the claims and trends of a stored results.json again with the "
                             "current decision rules and rewrite its report (under --out, or the docs with "
                             "--write-docs), keeping its plots")
    add_sweep_arguments(parser)
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
    if args.write_docs and (args.quick or args.scale != 1 or args.steps is not None or args.seeds is not None
                            or args.no_plots):
        parser.error("--write-docs documents the full run: drop --quick, --scale, --steps, --seeds and --no-plots")
    check_folder(parser, "--write-docs: the docs folder" if args.write_docs else "--out",
                 DOCS_DIR if args.write_docs else args.out)
    try:
        device = torch.device(args.device)
    except RuntimeError as err:
        parser.error(f"--device {args.device!r}: {err}")
    if args.dry_run:
        if device.type != "cuda":
            parser.error(f"--dry-run: plans a GPU run; expected --device cuda, got --device {args.device}")
        if args.quick or args.write_docs or args.single_size or args.sizes or args.scale != 1:
            parser.error("--dry-run: the GPU plan's own sizes; drop --quick, --write-docs, --single-size, --sizes "
                         "and --scale")
        return QUICK
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


def _gpu_plan(args: argparse.Namespace) -> bool:
    """Whether the arguments ask for the GPU plan: --dry-run, or a CUDA device without another choice of sizes."""
    return args.dry_run or (torch.device(args.device).type == "cuda" and not (
        args.quick or args.single_size or args.sizes or args.scale != 1))


def say(text: str) -> None:
    """Print ``text`` at the terminal's width (``ortho_verify.report.terminal.terminal_width``) with
    ``ortho_verify.report.tables.print_plain``: words whole, numbers with their units, markdown table rows
    (the GPU plan) whole."""
    print_plain(text, terminal_width())


def verdict_lines(results: dict) -> list[str]:
    """The terminal's summary of the claims: a verdict per claim with the run's resolution and, when
    inconclusive, why; for a measurement run (``results["mode"]``) a header saying that no claim is
    decided and the measured differences only."""
    if results.get("mode") == "measurement":
        lines = [f"measurement run ({results.get('mode_reason', 'a measurement')}): no claim is decided; the paired "
                 "differences and the smallest differences this run resolves:"]
        return lines + [f"  {MEASURED}: {c['statement']}: {c['measured']}; resolution {c['power']}"
                        for c in results["claims"]]
    lines = []
    for claim in results["claims"]:
        why = f" — {claim['reason']}" if claim["verdict"] == "inconclusive" and claim.get("reason") else ""
        lines.append(f"  {claim['verdict']:>15}: {claim['statement']} [resolution {claim.get('power', '')}]{why}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the reproduction and write the report (under ``--out``, or the repository's docs with
    ``--write-docs``); returns 0 when the report was written (whatever the verdicts: a claim that
    does not reproduce is a result, not an error). Bad arguments and an unusable ``--out``:
    argparse's exit with code 2 and a message naming the option, before any work."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.rejudge is not None:
        return _rejudge(args, parser, argv)
    config = _config(args, parser)
    sweep = sweep_from_arguments(args, parser)
    device = args.device
    plan = None
    if _gpu_plan(args):
        plan = estimate_plan(GPU_SWEEP)
        sweep = GPU_SWEEP if not args.dry_run else DRY_RUN_SWEEP
        if args.steps is not None or args.seeds is not None:
            sweep = _override(sweep, args, parser)
        say("GPU plan (ortho_verify.reproduce.device_plan), estimated from FLOPs:")
        say("\n".join(plan_lines(plan)))
        if args.dry_run:
            device = "cpu"
            say("\ndry run: the plan at tiny sizes on the CPU, through the same code path")
    quick = args.quick or args.dry_run
    mode, reason = ("measurement", "--dry-run: the GPU plan at tiny sizes on the CPU" if args.dry_run else
                    "--quick: tiny models and few steps") if quick else ("study", "")
    jobs = args.jobs or (min(2, os.cpu_count() or 1) if torch.device(device).type == "cpu" else 1)

    def log(message: str) -> None:
        say(message)

    if sweep is None:
        results, points = run_study(config, device=device, jobs=jobs, threads=args.threads, log=log, mode=mode)
    else:
        results, points = run_size_sweep(sweep, device=device, jobs=jobs, threads=args.threads, log=log,
                                         cache=cache_folder(args), resume=args.resume, mode=mode)
    results["command"] = " ".join(["ortho-verify reproduce", *argv])
    results["mode_reason"] = reason
    if plan is not None:
        results["gpu_plan"] = plan
    path = write_report(results, points, DOCS_DIR if args.write_docs else args.out, plots=not args.no_plots)
    what = "results.json" if args.no_plots else "plots and results.json"
    say(f"\nwrote {path} ({what} in {path.parent / 'reproduction'}), "
        f"{results['wall_seconds']:.0f} s")
    say("\n".join(verdict_lines(results)))
    return 0


def _rejudge(args: argparse.Namespace, parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """``--rejudge``: the stored results judged again, the report rewritten next to its plots."""
    if args.quick or args.dry_run or args.scale != 1 or args.steps is not None or args.seeds is not None:
        parser.error("--rejudge: runs nothing; drop --quick, --dry-run, --scale, --steps and --seeds")
    out = DOCS_DIR if args.write_docs else args.out
    check_folder(parser, "--write-docs: the docs folder" if args.write_docs else "--out", out)
    try:
        stored = load_results(args.rejudge)
    except (OSError, ValueError) as err:
        parser.error(f"--rejudge {args.rejudge}: {err}")
    results = rejudge(stored, " ".join(["ortho-verify reproduce", *argv]))
    if Path(args.rejudge).resolve().parent != (Path(out) / "reproduction").resolve():
        say(f"note: {out / 'reproduction'} has no plots of this run unless they were copied there")
    path = write_report(results, {}, out, plots=False)
    say(f"wrote {path} (results.json in {path.parent / 'reproduction'})")
    say("\n".join(verdict_lines(results)))
    return 0


def _override(sweep, args: argparse.Namespace, parser: argparse.ArgumentParser):
    """The GPU plan's sweep with --steps / --seeds applied (exit 2 naming them for bad values)."""
    base = sweep.base
    try:
        if args.steps is not None:
            base = replace(base, steps=args.steps)
        if args.seeds is not None:
            base = replace(base, seeds=tuple(range(base.sweep_seed + 1, base.sweep_seed + 1 + args.seeds)))
        return replace(sweep, base=base, sizes=tuple(replace(s, steps=None) for s in sweep.sizes))
    except ValueError as err:
        parser.error(f"--steps / --seeds: {err}")
