"""``ortho-verify``: check the fast Muon / Dion implementations against the exact oracle.

The default run trains a small byte-level GPT on the pinned corpus (``ortho_verify.inputs.corpus``;
cached), captures real gradient matrices, adds synthetic matrices with prescribed spectra, runs
every check of ``ortho_verify.checks``, the error-feedback checks of ``ortho_verify.checks.error_feedback``
and the oracle's golden files (``ortho_verify.checks.golden``), prints a summary (one row per check, then
the failing rows; ``--verbose``: every check and input), writes ``report.json`` (schema
``ortho_verify.report.results.REPORT_SCHEMA_VERSION``), ``report.md``, PNG plots and optionally JUnit XML,
prints GitHub Actions annotations when ``GITHUB_ACTIONS=true``, optionally compares with a
baseline, and exits 0 when every check passed, 1 when a check failed or the run was inconclusive
(a check made no claim on any of its inputs; rows that made no claim are counted apart), 2 on a
usage error (``ortho_verify.cli.arguments``). Subcommands: ``sharding``, ``reproduce``, ``identify``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_limits

import ortho_fast

from .. import checks, presets, registry
from ..checks import error_feedback
from ..checks.newton_schulz import kernel_suffix
from ..checks.qk_clip import qk_clip_jobs
from ..checks.stages import stage_jobs
from ..checks.statistical import CLI_QUICK_STATISTICAL_SCHEDULES, CLI_STATISTICAL_MATRICES, check_ns_statistics
from ..devices import describe_device, resolve_device
from ..inputs import data
from ..inputs.corpus import corpus_identity
from ..inputs.spectra import synthetic_matrices
from ..optional import require
from ..report import annotations, baseline, junit, plots, terminal as report
from ..report.results import REPORT_SCHEMA_VERSION, CheckResult
from ..report.tables import print_words
from ..tolerances import BASELINE_FLOOR, BASELINE_GROWTH
from . import measured
from .arguments import EXIT_FAILED, EXIT_PASSED, SuggestingParser, check_folder, check_output_file, check_readable_file

DTYPES = ("float64", "float32", "bfloat16")
EF_DTYPES = ("float64", "float32")
EF_RANK_FRACTION = 0.25
#: Compute dtype of the Muon layout checks (QKV split, banks): they test the indexing, which
#: float32's tolerance already pins down (a block mixed up is off by O(1)).
LAYOUT_DTYPE = "float32"
#: (variant, parameter dtype, state dtype or None) of the Dion variant checks, at one rank fraction:
#: every variant in float64, and bfloat16 parameters with float32 momentum and Q (mixed precision)
#: (``ortho_verify.registry.DION_VARIANT_RUNS``).
DION_VARIANT_RUNS = registry.DION_VARIANT_RUNS
DION_VARIANT_RANK_FRACTION = 0.25
#: Phases shorter than this are left out of the verdict line's time breakdown (all are in report.json).
PHASE_SHOWN_S = 0.5
#: Largest ``--seed`` (torch and numpy seeds are unsigned 64-bit; the synthetic inputs add offsets).
MAX_SEED = 2**63 - 1


#: ``ortho-verify NAME ...`` runs ``main(argv)`` of the module (its own --help).
SUBCOMMANDS = {"sharding": "ortho_verify.sharding", "reproduce": "ortho_verify.reproduce",
               "identify": "ortho_verify.identify.cli"}
SUBCOMMAND_HELP = {"sharding": "distributed layouts of Dion and Muon equal to one process ('ortho-verify sharding "
                               "--help')",
                   "reproduce": "the papers' claims re-measured on real text ('ortho-verify reproduce --help')",
                   "identify": "what a kernel or optimizer computes, with no declaration, then judged "
                               "('ortho-verify identify --help')"}


def measured_text(what: str) -> str:
    """The measured cost that ``--help`` quotes, from ``ortho_verify.cli.measured`` (written by
    ``python scripts/timings.py --write-docs``): "quick" -> the ``--quick`` run's wall time, "threads" ->
    ``--quick`` with 1 and 2 threads. "not measured" when the measurement lacks it."""
    c = measured.TIMINGS.get("commands", {})
    where = f"{measured.TIMINGS.get('cores')} CPU cores, {measured.TIMINGS.get('date')}"
    try:
        if what == "quick":
            return (f"{c['quick']['wall_s']:.0f} s with the gradients cached, {c['quick_first']['wall_s']:.0f} s the "
                    f"first time, on {where}")
        return (f"--quick took {c['quick']['wall_s']:.0f} s with 1 thread, {c['quick_threads2']['wall_s']:.0f} s "
                f"with 2, on {where}")
    except KeyError:
        return "not measured"


def build_parser() -> argparse.ArgumentParser:
    """The ``ortho-verify`` command line: the default run's options and the ``SUBCOMMANDS``
    (listed for usage and typo suggestions; each parses its own arguments)."""
    parser = SuggestingParser(
        prog="ortho-verify",
        description="Check ortho_fast's Newton–Schulz, Muon and Dion against the exact oracle ortho_ref.",
        epilog="Exit codes: 0 every check passed; 1 a check failed, a baseline regressed, or the run was "
               "inconclusive (a check made no claim on any input, or the baseline's inputs differ); 2 usage error.",
    )
    parser.add_argument("--quick", action="store_true", help=f"fewer inputs ({measured_text('quick')})")
    parser.add_argument("--out", type=Path, default=Path("ortho-verify-out"),
                        help="folder for report.json, report.md and plots/ (default: ./ortho-verify-out)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="cache for the captured real gradients (default: $ORTHO_CACHE_DIR or ~/.cache/ortho)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed for the model, data order and synthetic inputs (0 <= SEED < 2^63; default 0)")
    parser.add_argument("--no-real", action="store_true", help="skip the real-gradient inputs (synthetic only)")
    parser.add_argument("--no-plots", action="store_true", help="do not write the PNG plots")
    parser.add_argument("--verbose", action="store_true",
                        help="also print the worst case of every check and input (hundreds of rows)")
    parser.add_argument("--all-rows", action="store_true",
                        help="write every row to report.json ('results') and report.md (large: megabytes)")
    parser.add_argument("--junit-xml", type=Path, default=None, metavar="FILE",
                        help="write JUnit XML to FILE: one test case per check and input")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: the matrices are small, and threads that wait "
                             f"for a core other processes use slow the run down: {measured_text('threads')})")
    parser.add_argument("--device", default="cpu", metavar="DEVICE",
                        help="where ortho_fast's Newton–Schulz kernels run: cpu (default), cuda, cuda:1, ... (inputs "
                             "are made on the CPU in float64 and moved; the oracle stays on the CPU; the report "
                             "names the device, its name and the torch / CUDA versions)")
    parser.add_argument("--baseline", type=Path, default=None, metavar="FILE",
                        help="compare every check's error/tolerance with FILE and fail when one regresses: "
                             f"ratio > max({BASELINE_GROWTH:g} x its baseline ratio, {BASELINE_FLOOR:g}); also fails "
                             "when a golden file of the oracle changed, or when a check of the baseline is missing "
                             "from a run of the same mode (--quick, --no-real, --seed); inconclusive (exit 1) when "
                             "the baseline was recorded on another real-gradient corpus")
    parser.add_argument("--update-baseline", action="store_true",
                        help="write the run's ratios to the --baseline FILE instead of comparing (only if every "
                             "check passed)")
    commands = parser.add_subparsers(dest="command", title="subcommands", metavar="{sharding,reproduce,identify}")
    for name, text in SUBCOMMAND_HELP.items():
        commands.add_parser(name, help=text, add_help=False)
    return parser


def validate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict | None:
    """Reject every bad argument and unusable path before any work (usage error, exit 2, naming
    the option); creates the output folders. Returns the loaded baseline when comparing, else None."""
    if args.command is not None:
        parser.error(f"the subcommand {args.command!r} must come first: ortho-verify {args.command} ...")
    if args.update_baseline and args.baseline is None:
        parser.error("--update-baseline needs --baseline FILE")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if not 0 <= args.seed <= MAX_SEED:
        parser.error(f"--seed must be in [0, 2^63 - 1], got {args.seed}")
    try:
        args.device = str(resolve_device(args.device, "--device"))
    except ValueError as err:
        parser.error(str(err))
    check_folder(parser, "--out", args.out)
    if not args.no_real:
        check_folder(parser, "--cache-dir", args.cache_dir)
    check_output_file(parser, "--junit-xml", args.junit_xml)
    if args.baseline is None:
        return None
    if args.update_baseline:
        check_output_file(parser, "--baseline", args.baseline)
        return None
    check_readable_file(parser, "--baseline", args.baseline)
    try:
        return baseline.load(args.baseline)
    except (OSError, ValueError) as err:
        parser.error(f"--baseline: {err}")


def error_feedback_inputs(cases) -> list:
    """Inputs of the error-feedback checks: the gapped synthetic matrices of
    ``error_feedback.error_feedback_matrices`` and, of the real gradients, those of the quick set
    (last capture step, one matrix per kind of layer)."""
    real = [c for c in cases if c.source == "real"]
    if real:
        last = max(int(c.name.split("/")[1].removeprefix("step")) for c in real)
        real = [c for c in real if c.name.startswith(f"gpt/step{last}/")
                and c.name.split("/", 2)[2] in data.QUICK_PARAMS]
    return error_feedback.error_feedback_matrices() + real


def _golden_job():
    """The golden-file check of ``ortho_verify.checks.golden`` if that module is installed, else None; an
    exception while reading the files becomes one failed row (the run goes on)."""
    try:
        from ..checks import golden
    except ImportError:
        return None

    def run() -> list[CheckResult]:
        try:
            return golden.check_golden_files()
        except Exception as err:  # reported, not raised: the other checks still run
            return [checks.measured("golden", "ortho_ref/golden", "read the golden files", float("inf"), 0.0,
                                    f"{type(err).__name__}: {err}")]

    return run


#: Compute dtypes whose Newton–Schulz rows run both kernels (``gram=False`` and ``gram=True``).
GRAM_CLI_DTYPES = ("float32", "float64")
#: float16 Gram Newton–Schulz rows (``gram=True, dtype=torch.float16``, judged with the Gram form and
#: ortho_fast's restarts) on the inputs whose small side is at most this: the synthetic ones of
#: ``--quick`` (its real gradients are left out for time: about 1 s of its checks) and, in the default
#: run, the real gradients and the tall / wide / rank-deficient 128-wide synthetic inputs. The 256-wide inputs are left
#: out for time (float16 products on a CPU and the output's SVD: 30 s more on one core with them,
#: measured; the float16 rounding model does not depend on the size).
GRAM_FLOAT16_MAX_SIDE = 128


def plan_jobs(cases, quick: bool, sv_points: dict | None = None, device=None) -> list[tuple[str, callable]]:
    """Every (label, thunk) to run, in report order. ``sv_points``: optional dict that the
    Newton–Schulz checks fill with (schedule, dtype) -> [(σ̂, uᵢᵀ X_fast vᵢ)] for the plots.
    ``device``: where the Newton–Schulz rows (per input and statistical) run ``ortho_fast``'s kernels
    (None or "cpu": the CPU; the other checks run on the CPU)."""
    dev = None if device in (None, "cpu") else device
    jobs = [("coefficient registries", checks.check_coefficient_registries)]
    golden = _golden_job()
    if golden is not None:
        jobs.append(("golden files of the oracle", golden))
    schedules = sorted(ortho_fast.COEFFICIENTS)
    for case in cases:
        for sched in schedules:
            for dtype in DTYPES:
                rec = None if sv_points is None else sv_points.setdefault((sched, dtype), [])
                # float32 / float64: both kernels on every input (the default picks Gram Newton–Schulz from
                # aspect ratio 2, so each would otherwise be judged on part of the inputs only)
                for gram in (False, True) if dtype in GRAM_CLI_DTYPES else (None,):
                    jobs.append((f"NS {sched}/{dtype}{kernel_suffix(gram)} {case.name}",
                                 lambda c=case, s=sched, d=dtype, r=rec, g=gram: checks.check_newton_schulz(
                                     c, s, d, r, g, device=dev)))
                    rec = None  # the singular-value map plots one kernel per (schedule, dtype)
            # float16 Gram Newton–Schulz (``gram=True, dtype=torch.float16``), judged as a Gram kernel
            if min(case.matrix.shape) <= GRAM_FLOAT16_MAX_SIDE and not (quick and case.source == "real"):
                jobs.append((f"NS {sched}/float16/gram {case.name}",
                             lambda c=case, s=sched: checks.check_newton_schulz(c, s, "float16", None, True,
                                                                                device=dev)))
    count = CLI_STATISTICAL_MATRICES["quick" if quick else "default"]
    for sched in CLI_QUICK_STATISTICAL_SCHEDULES if quick else schedules:  # mean deviation over many matrices
        jobs.append((f"NS statistics {sched}/bfloat16",
                     lambda s=sched: check_ns_statistics(s, "bfloat16", count, device=dev)))
        jobs.append((f"NS statistics {sched}/float32/gram",  # where a Gram kernel's restarts show (docs/math.md §2.2a)
                     lambda s=sched: check_ns_statistics(s, "float32", count, gram=True, device=dev)))
        jobs.append((f"NS statistics {sched}/float16/gram",  # judged with the Gram rounding model and our restarts
                     lambda s=sched: check_ns_statistics(s, "float16", count, gram=True, device=dev)))
    for case in cases:
        for cfg in checks.MUON_CONFIGS:
            for dtype in ("float64", "float32"):
                jobs.append((f"Muon {cfg}/{dtype} {case.name}",
                             lambda c=case, g=cfg, d=dtype: checks.check_muon(c, g, d)))
        jobs.append((f"Muon layouts/{LAYOUT_DTYPE} {case.name}",
                     lambda c=case: checks.check_muon_layouts(c, LAYOUT_DTYPE)))
    rank_fractions = (1.0, 0.25) if quick else (1.0, 0.25, 1 / 16)
    for case in cases:
        for rf in rank_fractions:
            for dtype in ("float64", "float32"):
                jobs.append((f"Dion r={rf:g}/{dtype} {case.name}",
                             lambda c=case, f=rf, d=dtype: checks.check_dion(c, f, d)))
        for variant, dtype, sdt in DION_VARIANT_RUNS:
            jobs.append((f"Dion {variant}/{dtype}{' state ' + sdt if sdt else ''} {case.name}",
                         lambda c=case, v=variant, d=dtype, s=sdt: checks.check_dion(c, DION_VARIANT_RANK_FRACTION,
                                                                                    d, v, s)))
    for case in cases:
        for cfg, dtype in registry.DION2_RUNS:
            jobs.append((f"Dion2 {cfg}/{dtype} {case.name}",
                         lambda c=case, g=cfg, d=dtype: checks.check_dion2(c, g, d)))
    for case in error_feedback_inputs(cases):
        for dtype in EF_DTYPES:
            for on in (True, False):
                jobs.append((f"error feedback {'on' if on else 'off'}/{dtype} {case.name}",
                             lambda c=case, d=dtype, e=on: error_feedback.check_error_feedback(
                                 c, EF_RANK_FRACTION, d, error_feedback=e)))
            jobs.append((f"subspace iteration/{dtype} {case.name}",
                         lambda c=case, d=dtype: error_feedback.check_subspace_convergence(c, EF_RANK_FRACTION, d)))
            jobs.append((f"full-rank polar/{dtype} {case.name}",
                         lambda c=case, d=dtype: error_feedback.check_full_rank_polar(c, d)))
    for case in cases:
        jobs.append((f"torch.optim.Muon {case.name}", lambda c=case: checks.check_torch_muon(c)))
    jobs += stage_jobs(cases) + qk_clip_jobs(cases) + presets.preset_jobs()
    return jobs


def main(argv: list[str] | None = None) -> int:
    """Run the checks; returns the exit code: 0 every check passed, 1 a check failed or the run
    was inconclusive (``ortho_verify.report.results.verdict``), 2 a usage error (raised as SystemExit(2)
    by argparse, before any work)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:  # ortho-verify sharding ... / ortho-verify reproduce ...
        module = importlib.import_module(SUBCOMMANDS[argv[0]])
        return module.main(argv[1:])
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command is None and unknown:
        parser.parse_args(argv)  # the usage error of argparse, with suggestions
    stored = validate(args, parser)
    # The oracle's SVDs are small (<= 512 x 1024): a single BLAS thread is faster than two
    # OpenBLAS threads competing with torch's pool (measured: 0.02 s vs 2.8 s per 256 x 512
    # SVD when a second process used the other core).
    previous = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            return _run(args, argv, stored)
    finally:
        torch.set_num_threads(previous)


def attribute_seconds(seconds: dict, rows: list, elapsed: float) -> None:
    """Add a job's wall time ``elapsed`` to ``seconds`` (check name -> seconds), shared among the
    checks of its ``rows`` in proportion to their row counts (a job that returned nothing is not
    counted), so the per-check seconds of a run add up to the time of its checks."""
    for row in rows:
        seconds[row.check] = seconds.get(row.check, 0.0) + elapsed / len(rows)


def phase_text(phases: dict) -> str:
    """": real gradients 14.1 s, checks 29.0 s, plots 2.2 s": the phases of at least ``PHASE_SHOWN_S``
    seconds, for the verdict line (every phase is in report.json's meta.phases_s; every check's
    seconds in report.md's summary and report.json's summary.by_check.*.seconds)."""
    shown = [f"{k} {v:.1f} s" for k, v in phases.items() if v >= PHASE_SHOWN_S]
    return ": " + ", ".join(shown) if shown else ""


def _run_jobs(jobs, progress, task, per_check: dict, done: dict | None = None) -> list:
    """Run ``jobs`` in order with the progress bar's ``task``; a label already in ``done`` (label ->
    (rows, seconds), from an earlier plan) takes its rows instead of running again. The seconds of
    each job go to ``per_check`` (``attribute_seconds``). Returns the rows in plan order."""
    results = []
    for label, job in jobs:
        progress.update(task, description=label[:60])
        if done is not None and label in done:
            rows, seconds = done.pop(label)
        else:
            begun = time.perf_counter()
            rows = job()
            seconds = time.perf_counter() - begun
        attribute_seconds(per_check, rows, seconds)
        results += rows
        progress.advance(task)
    return results


def _unique_labels(jobs) -> set:
    labels = [label for label, _ in jobs]
    return {label for label in labels if labels.count(label) == 1}


def collect(args: argparse.Namespace, console, sv_points: dict, timing: dict
             ) -> tuple[list, list, dict | None]:
    """Inputs, results and the training metadata, with a progress bar on the terminal (``console``:
    a ``rich.console.Console``). Fills ``timing``: "phases" (wall seconds of "real gradients",
    "synthetic inputs", "checks") and "checks" (wall seconds per check, ``attribute_seconds``).

    A first run (no gradient cache) trains the GPT in a second process (``data.capture_in_background``)
    while this one runs the jobs that need no real gradient (the plan of the synthetic inputs alone);
    the full plan then takes their rows by label, so the report is the same as a run in plan order."""
    progress_cols = report.progress_columns(console.width)
    train_info = None
    phases, per_check = timing.setdefault("phases", {}), timing.setdefault("checks", {})
    record = None if args.no_plots else sv_points
    # the device only when it is not the CPU: plan_jobs(cases, quick, sv_points) stays the CPU run's call
    on_device = () if args.device == "cpu" else (args.device,)
    started = time.perf_counter()
    background = None if args.no_real else data.capture_in_background(cache_dir=args.cache_dir, seed=args.seed,
                                                                           quick=args.quick)
    synthetic = synthetic_matrices(quick=args.quick, seed=args.seed)
    phases["synthetic inputs"] = time.perf_counter() - started
    done: dict = {}
    checks_s = 0.0
    Progress = require("rich.progress", "ortho-verify's progress bar").Progress
    with Progress(*progress_cols, console=console, transient=True, expand=True) as progress:
        cases = []
        if background is not None:
            early = plan_jobs(synthetic, args.quick, record, *on_device)
            keep = _unique_labels(early)
            task = progress.add_task("checks", total=len(early))
            training = progress.add_task("training the byte-level GPT in a second process (cached after the first "
                                         "run)", total=None)
            begun = time.perf_counter()
            for label, job in early:
                progress.update(task, description=label[:60])
                t0 = time.perf_counter()
                rows = job()
                if label in keep:
                    done[label] = (rows, time.perf_counter() - t0)
                progress.advance(task)
            checks_s += time.perf_counter() - begun
            background.join()
            progress.remove_task(task)
            progress.remove_task(training)
        if not args.no_real:
            task = progress.add_task("training the byte-level GPT on the pinned corpus (cached after the first run)",
                                     total=None)

            def on_step(step: int, total: int, loss: float) -> None:
                progress.update(task, total=total, completed=step,
                                description=f"training the byte-level GPT: loss {loss:.3f}")

            cases += data.real_gradients(quick=args.quick, cache_dir=args.cache_dir, seed=args.seed, progress=on_step)
            train_info = data.last_run_info()
            if background is not None and background.exitcode == 0:  # trained now, by the second process
                train_info.update(from_cache=False, trained_in_background=True)
            progress.remove_task(task)
            phases["real gradients" + (" (second process, beside the checks)" if background is not None else "")] = \
                time.perf_counter() - started
        cases += synthetic
        begun = time.perf_counter()
        jobs = plan_jobs(cases, args.quick, record, *on_device)
        keep = _unique_labels(jobs)
        done = {label: v for label, v in done.items() if label in keep}
        task = progress.add_task("checks", total=len(jobs))
        results = _run_jobs(jobs, progress, task, per_check, done)
        phases["checks"] = checks_s + time.perf_counter() - begun
    return cases, results, train_info


def _run(args: argparse.Namespace, argv: list[str], stored: dict | None) -> int:
    console = report.make_console()
    started = time.perf_counter()
    sv_points: dict = {}
    timing: dict = {}
    cases, results, train_info = collect(args, console, sv_points, timing)
    mode = {"quick": args.quick, "real_inputs_used": not args.no_real, "seed": args.seed}
    real_names = sorted({c.name for c in cases if c.source == "real"})
    inputs = {"corpus": (train_info or {}).get("corpus", corpus_identity()) if real_names else None,
              "real_inputs": real_names}
    if stored is not None:
        begun = time.perf_counter()
        results += baseline.compare(results, stored, mode, inputs=inputs, real_inputs=real_names)
        timing["phases"]["baseline"] = time.perf_counter() - begun
    begun = time.perf_counter()
    plot_paths = [] if args.no_plots else plots.write_plots(results, sv_points, args.out)
    timing["phases"]["plots"] = time.perf_counter() - begun
    elapsed = time.perf_counter() - started
    meta = {
        "command": " ".join(["ortho-verify", *argv]),
        "quick": args.quick,
        "seed": args.seed,
        "inputs": len(cases),
        "real_inputs": len(real_names),
        "corpus": inputs["corpus"],
        "training": train_info,
        "elapsed_s": round(elapsed, 1),
        "phases_s": {k: round(v, 2) for k, v in timing["phases"].items()},
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "machine": f"{platform.machine()} {platform.system()}, {torch.get_num_threads()} torch threads",
        # where ortho_fast's Newton–Schulz rows ran (the other checks and the oracle: the CPU)
        "device": describe_device(args.device),
    }
    if stored is not None:
        meta["baseline"] = str(args.baseline)
    json_path, md_path = report.write_reports(results, args.out, meta, plot_paths, all_rows=args.all_rows,
                                              seconds=timing["checks"])
    if args.verbose:
        report.print_table(results, console)
    summ = report.print_summary(results, console)
    report.print_failures(results, console)
    if args.junit_xml is not None:
        junit.write_junit_xml(results, args.junit_xml, elapsed_s=elapsed)
    if annotations.in_github_actions(os.environ):
        for line in annotations.github_annotations(results, str(md_path)):
            print(line, flush=True)
    style = "green" if summ["verdict"] == "passed" else "bold red"
    device = meta["device"]
    where = device["device"] + (f" {device['name']}, CUDA {device['cuda']}" if device["cuda"] and
                                device["device"] != "cpu" else "")
    print_words(console, [(f"{summ['verdict'].upper()}: {summ['passed']} passed, {summ['failed']} failed", style),
                          (f", {summ['no_claim']} made no claim ({len(cases)} inputs, {elapsed:.1f} "
                           f"s{phase_text(timing['phases'])}; Newton–Schulz on {where})", None)])
    if summ["failed"]:  # the kinds of failure, counted apart
        console.print("[bold red]failures by kind: " + ", ".join(f"{k} {n}" for k, n in summ["kinds"].items()) + "[/]")
    for why in summ["inconclusive"]:
        console.print(f"[bold red]inconclusive: nothing compared — {why}[/]")
    written = [json_path, md_path] + ([args.junit_xml] if args.junit_xml is not None else [])
    print_words(console, [(f"Full report (schema {REPORT_SCHEMA_VERSION}): {', '.join(map(str, written))}", None)])
    if args.update_baseline:
        try:
            path = baseline.write(args.baseline, results, mode, inputs=inputs)
        except ValueError as err:
            console.print(f"[bold red]baseline not written: {err}[/]")
            return EXIT_FAILED
        console.print(f"baseline written: {path} ({len(results)} checks)")
    return EXIT_PASSED if summ["verdict"] == "passed" else EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
