"""Shared plumbing for the benchmarks: side-by-side timing and a printed table.

Timing uses ``torch.utils.benchmark.Timer.blocked_autorange`` (warm-up, then blocks of
runs until ``min_run_time`` seconds; the median per-run time is reported). Every ratio is
computed from two timings taken in the same process, one right after the other, so a
machine's speed cancels out of it.
"""

from __future__ import annotations

import argparse
import platform

import torch
from rich.console import Console
from rich.table import Table
from torch.utils.benchmark import Timer


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--min-run-time", type=float, default=1.0, help="seconds per timing (default 1.0)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    p.add_argument("--quick", action="store_true", help="smallest sizes only (a smoke run)")
    return p


def setup(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)


def median_seconds(fn, min_run_time: float) -> float:
    """Median seconds per call of ``fn()`` (torch.utils.benchmark blocked_autorange)."""
    fn()  # warm-up outside the measurement (allocations, lazy init)
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())  # Timer's default is 1
    return timer.blocked_autorange(min_run_time=min_run_time).median


def machine(threads: bool = True) -> str:
    """torch version, processor and (``threads``) the current intra-op thread count."""
    text = f"torch {torch.__version__}, {platform.processor() or platform.machine()}"
    return f"{text}, {torch.get_num_threads()} threads" if threads else text


def print_table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    table = Table(title=title, caption=machine())
    for c in columns:
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(*r)
    Console().print(table)


def print_markdown(columns: list[str], rows: list[list[str]], footer: str) -> None:
    """A markdown table (for docs/performance.md) and a footer line naming the machine (the
    threads are a column of the table: a run may measure several counts)."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print(f"\n{machine(threads=False)}; {footer}")
