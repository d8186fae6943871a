"""``ortho-verify sharding`` (also ``python -m ortho_verify.sharding``): the command line."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Sequence

import torch
import torch.distributed as dist

from ..cli.arguments import SuggestingParser, check_folder
from ..report.tables import print_words
from ..report.terminal import make_console
from .launch import run, under_torchrun
from .layouts import (
    DOCS_PATH,
    DOCS_WORLD_SIZES,
    DTYPES,
    MATRICES,
    QUICK_MATRICES,
    QUICK_STEPS,
    STEPS,
    TIMEOUT,
    layouts_for,
)
from .markdown import layouts_doc, markdown_report, print_table
from .user_cli import optimizer_main
from .workers import WorkerError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``ortho-verify sharding`` command line."""
    parser = SuggestingParser(
        prog="ortho-verify sharding",
        description="Check every distributed layout of Dion and Muon (DDP, FSDP, TP, HSDP and their combinations) "
                    "against the one-process optimizer on the full tensors, and count each step's communication "
                    "against the analytic volume. Starts gloo workers on CPU, or runs in-process under torchrun.")
    parser.add_argument("--world-size", type=int, nargs="+", default=[4], metavar="N",
                        help="world size(s) to run, each one launch (default: 4; ignored under torchrun)")
    parser.add_argument("--dtype", choices=DTYPES, action="append", help="dtype(s) to check (default: both)")
    parser.add_argument("--layout", action="append", metavar="NAME",
                        help="only layouts whose 'optimizer/name' contains NAME (repeatable)")
    parser.add_argument("--quick", action="store_true",
                        help=f"{len(QUICK_MATRICES)} matrices and {QUICK_STEPS} steps instead of "
                             f"{len(MATRICES)} and {STEPS}")
    parser.add_argument("--out", type=Path, default=Path("ortho-verify-out"),
                        help="folder for sharding.json and sharding.md (default: ./ortho-verify-out)")
    parser.add_argument("--write-docs", action="store_true",
                        help=f"also write docs/layouts.md; runs world sizes {' '.join(map(str, DOCS_WORLD_SIZES))} "
                             "besides those given (the page covers them all); not with --quick, --layout, --dtype, "
                             "nor under torchrun")
    parser.add_argument("--optimizer", metavar="MODULE:FACTORY",
                        help="check your own distributed optimizer instead: factory(params, layout) found by import "
                             "path (ortho_verify.check_sharded_optimizer; --world-size, --layout, --dtype, --timeout "
                             "apply; writes sharded_optimizer.json)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: forked gloo workers (default); cuda: one NCCL rank per GPU (needs --world-size "
                             "GPUs; under torchrun the launched ranks decide)")
    parser.add_argument("--shapes", metavar="MxN,...",
                        help="with --optimizer: the parameters' shapes, e.g. 16x8,16x8,32x16 (repeats allowed; "
                             "default: DEFAULT_SHARDED_SHAPES of ortho_verify.sharding.sharded_check)")
    parser.add_argument("--state-placement", choices=("replicated", "sharded", "owner"),
                        help="with --optimizer: where the optimizer keeps its state (default: recognized from what "
                             "the ranks hold)")
    parser.add_argument("--compute-dtype", choices=("float64", "float32", "bfloat16", "float16"), metavar="DTYPE",
                        help="with --optimizer: the dtype its Newton–Schulz runs in: float64, float32, bfloat16 or "
                             "float16 (default: the conventions', "
                             "bfloat16 for torch.optim.Muon, else the parameter dtype)")
    parser.add_argument("--hang-floor", type=_positive_seconds, default=5.0,
                        help="with --optimizer: the least seconds a layout's launch may take before it counts as "
                             "hung (the limit is 5x the slowest layout so far, at most --timeout; default 5)")
    parser.add_argument("--timeout", type=_positive_seconds, default=TIMEOUT,
                        help=f"seconds per launch before the workers are killed (default {TIMEOUT:g})")
    return parser


def _positive_seconds(text: str) -> float:
    """``--timeout``'s type: a finite number of seconds > 0 (argparse exits 2 naming the option
    otherwise, before any worker is launched)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds > 0, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks; returns 0 if every layout passed, 1 otherwise (2: bad arguments, from argparse)."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    if any(n < 1 for n in args.world_size):
        build_parser().error("--world-size: each N must be >= 1")
    if args.write_docs and (args.quick or args.layout or args.dtype):
        build_parser().error("--write-docs documents the full run: drop --quick, --layout and --dtype")
    if args.write_docs and under_torchrun():  # one launched world size, the page covers all of DOCS_WORLD_SIZES
        build_parser().error("--write-docs runs world sizes 1 2 4 8 as gloo workers: run it without torchrun")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.device == "cuda" and not under_torchrun() and gpus < max(args.world_size):
        build_parser().error(f"--device cuda runs one rank per GPU: --world-size {max(args.world_size)} needs "
                             f"{max(args.world_size)} GPUs, {gpus} available")
    check_folder(build_parser(), "--out", args.out)  # before any launch
    if args.shapes is not None:
        from .sharded_check import parse_shapes

        try:
            args.shapes = parse_shapes(args.shapes)
        except ValueError as err:
            build_parser().error(f"--shapes: {err}")
    dtypes = tuple(args.dtype or DTYPES)
    if args.optimizer:
        return optimizer_main(args, dtypes)
    started = time.perf_counter()
    console = make_console()  # COLUMNS, else the terminal's width, else 100
    rows, seconds = [], {}
    wanted = sorted(set(args.world_size) | set(DOCS_WORLD_SIZES if args.write_docs else ()))
    sizes = [None] if under_torchrun() else [n for n in wanted if layouts_for(n, args.layout)]
    if not sizes:
        build_parser().error(f"--layout: no layout matches {args.layout} at world sizes {args.world_size}")
    for n in sizes:
        begun = time.perf_counter()
        try:
            rows += run(n, dtypes=dtypes, quick=args.quick, layouts=args.layout, timeout=args.timeout,
                        device=args.device)
        except (TimeoutError, WorkerError, ValueError) as err:  # a hang, a rank that raised, no layout under torchrun
            console.print(f"[bold red]world size {n}: {type(err).__name__}: {err}[/]")
            return 1
        seconds[n or dist.get_world_size()] = round(time.perf_counter() - begun, 1)
    if under_torchrun() and dist.get_rank() != 0:
        return 0
    print_table(rows, console)
    elapsed = time.perf_counter() - started
    failed = [r for r in rows if r["status"] != "pass"]
    meta = {"command": " ".join(["ortho-verify sharding", *(argv if argv is not None else sys.argv[1:])]),
            "backend": dist.get_backend() if dist.is_initialized() else
            ("nccl (one spawned rank per GPU)" if args.device == "cuda" else "gloo (forked CPU workers)"),
            "matrices": QUICK_MATRICES if args.quick else MATRICES, "steps": QUICK_STEPS if args.quick else STEPS,
            "elapsed_s": round(elapsed, 1), "seconds_per_world_size": seconds, "python": platform.python_version(),
            "torch": torch.__version__,
            "machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs"}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sharding.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str))
    (args.out / "sharding.md").write_text(markdown_report(rows, meta))
    if args.write_docs:
        DOCS_PATH.write_text(layouts_doc(rows, meta))
    style = "bold red" if failed else "green"
    print_words(console, [(f"{len(rows) - len(failed)} of {len(rows)} layout checks passed", style),
                          (f" in {elapsed:.1f} s. Reports: {args.out / 'sharding.json'}, {args.out / 'sharding.md'}"
                           + (f", {DOCS_PATH}" if args.write_docs else ""), None)])
    return 1 if failed else 0
