"""``ortho-verify reproduce`` (also ``python -m ortho_verify.reproduce``): the command line.

Writes under ``--out`` (default ``./ortho-verify-out``, as the other commands); ``--write-docs``
writes the repository's ``docs/reproduction.md`` instead (``DOCS_DIR``), never by default. Every
argument is checked before any work (exit 2 naming it, ``ortho_verify.arguments``).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch

from ortho_verify.arguments import SuggestingParser, check_folder
from ortho_verify.reproduce.config import QUICK, ReproConfig
from ortho_verify.reproduce.markdown import write_report
from ortho_verify.reproduce.scaling import run_size_sweep
from ortho_verify.reproduce.study import run_study
from ortho_verify.reproduce.sweep_cli import add_sweep_arguments, cache_folder, sweep_from_arguments

__all__ = ["DOCS_DIR", "build_parser", "main"]

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
    if args.write_docs and (args.quick or args.scale != 1 or args.steps is not None or args.seeds is not None):
        parser.error("--write-docs documents the full run: drop --quick, --scale, --steps and --seeds")
    check_folder(parser, "--write-docs: the docs folder" if args.write_docs else "--out",
                 DOCS_DIR if args.write_docs else args.out)
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
    """Run the reproduction and write the report (under ``--out``, or the repository's docs with
    ``--write-docs``); returns 0 when the report was written (whatever the verdicts: a claim that
    does not reproduce is a result, not an error). Bad arguments and an unusable ``--out``:
    argparse's exit with code 2 and a message naming the option, before any work."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    config = _config(args, parser)
    sweep = sweep_from_arguments(args, parser)
    jobs = args.jobs or (min(2, os.cpu_count() or 1) if torch.device(args.device).type == "cpu" else 1)

    def log(message: str) -> None:
        print(message, flush=True)

    if sweep is None:
        results, points = run_study(config, device=args.device, jobs=jobs, threads=args.threads, log=log)
    else:
        results, points = run_size_sweep(sweep, device=args.device, jobs=jobs, threads=args.threads, log=log,
                                         cache=cache_folder(args), resume=args.resume)
    results["command"] = " ".join(["ortho-verify reproduce", *argv])
    path = write_report(results, points, DOCS_DIR if args.write_docs else args.out)
    print(f"\nwrote {path} (plots and results.json in {path.parent / 'reproduction'}), "
          f"{results['wall_seconds']:.0f} s")
    for claim in results["claims"]:
        print(f"  {claim['verdict']:>15}: {claim['statement']}")
    return 0
