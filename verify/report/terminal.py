"""Terminal output of ``ortho-verify`` (rich) and the report writers.

The default output is a summary: one row per check (rows passed / failed / made no claim,
counted apart; worst error/tolerance and where), then the failing (check, input) pairs only,
then the verdict and where the full report is; ``--verbose`` adds ``print_table`` (worst case of
every check and input). The file writers and the summary live with the result types in
``ortho_verify.report.results`` and are re-exported here; rich is imported only when something is printed.
"""

from __future__ import annotations

import functools
import shutil

from ..optional import require
from .results import (
    CheckResult,
    error_feedback_table,
    failure_kind,
    format_number,
    format_worst_ratio,
    summary,
    worst_per_group,
    write_reports,
)
from .tables import print_fitted

__all__ = ["FAILURES_SHOWN", "error_feedback_table", "make_console", "print_failures", "print_summary", "print_table",
           "progress_columns", "summary", "terminal_width", "worst_per_group", "write_reports"]

#: Failing (check, input) pairs printed on the terminal; the rest are in report.md.
FAILURES_SHOWN = 20
#: Width when the output is not a terminal and ``COLUMNS`` is not set.
DEFAULT_WIDTH = 100


def terminal_width() -> int:
    """Columns for the tables: ``COLUMNS`` if set, else the terminal's width, else ``DEFAULT_WIDTH``
    (``shutil.get_terminal_size``, which reads ``COLUMNS`` first)."""
    return max(40, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)


def make_console():
    """A ``rich.console.Console`` on stdout of width ``terminal_width()``.
    Raises: ImportError naming the extra ``verify`` when rich is not installed."""
    return require("rich.console", "ortho-verify's terminal output").Console(width=terminal_width())


def progress_columns(width: int) -> tuple:
    """The progress bar's ``rich.progress`` columns for a console ``width`` columns wide (drawn with
    ``expand=True``): the label takes the width left and is cut with "…" (the bar is transient), the
    bar gets a sixth of the width (5 to 30 columns), the count and the times never wrap.
    Raises: ImportError naming the extra ``verify`` when rich is not installed."""
    rp = require("rich.progress", "ortho-verify's progress bar")
    Column = require("rich.table", "ortho-verify's progress bar").Column
    return (rp.TextColumn("{task.description}", table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis")),
            rp.BarColumn(bar_width=None, table_column=Column(width=max(5, min(30, width // 6)))),
            *(c(table_column=Column(no_wrap=True)) for c in (rp.MofNCompleteColumn, rp.TimeElapsedColumn,
                                                             rp.TimeRemainingColumn)))


def _counts(ok: int, total: int, failed: int) -> str:
    return f"{ok}/{total}" + (f", {failed} failed" if failed else "")


def print_table(results: list[CheckResult], console=None) -> None:
    """The full table (``--verbose``): one row per (check, input) with its worst case; "result"
    counts rows that passed, failed and made no claim apart.

    ``console``: a ``rich.console.Console`` (default: ``make_console()``).
    Raises: ImportError naming the extra ``verify`` when rich is not installed.
    """
    table_mod = require("rich.table", "ortho-verify's terminal table")
    console = console or make_console()
    box = require("rich.box", "ortho-verify's terminal table")
    table = functools.partial(table_mod.Table, title="ortho-verify: worst case per check and input",
                              box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    groups: dict[tuple[str, str], list[CheckResult]] = {}
    for r in results:
        groups.setdefault((r.check, r.input), []).append(r)
    rows, styles = [], []
    for worst, ok, total in worst_per_group(results):
        group = groups[(worst.check, worst.input)]
        failed = sum(not r.passed for r in group)
        vacuous = total - ok - failed
        shown = f"FAIL {failed} of {total}" if failed else f"pass {ok} of {total}" if ok else f"no claim ({total})"
        if vacuous and ok:
            shown += f" +{vacuous} no claim"
        rows.append([worst.check, worst.input, worst.detail, format_number(worst.error),
                     format_number(worst.tolerance), f"{worst.ratio:.3f}", shown])
        styles.append("bold red" if failed else None if ok else "yellow")
    print_fitted(console, table, ["check", "input", "worst case", "error:right", "tolerance:right", "error/tol:right",
                                  "result"], rows, fixed={3, 4, 5, 6}, keep={0, 1}, whole={0}, styles=styles,
                 name_columns=(0, 1))


def print_summary(results: list[CheckResult], console=None, seconds: dict | None = None) -> dict:
    """One row per check: rows that passed, failed and made no claim (counted apart), the worst
    error/tolerance of its claimed rows ("exact" for a passing check whose claims all have tolerance 0)
    and the input where it occurred, and with ``seconds`` (check -> wall seconds the run spent on it) a
    column "s"; returns ``summary(results, seconds)``.
    Raises: ImportError naming the extra ``verify`` when rich is not installed."""
    table_mod = require("rich.table", "ortho-verify's terminal table")
    console = console or make_console()
    summ = summary(results, seconds)
    box = require("rich.box", "ortho-verify's terminal table")
    table = functools.partial(table_mod.Table, title="ortho-verify: fast implementations vs the exact oracle, "
                              "one row per check", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    rows, styles = [], []
    for name, s in summ["by_check"].items():
        styles.append("bold red" if s["failed"] else "yellow" if not s["passed"] else None)
        where = s["worst"]["input"] if s["worst"] else "—"
        timing = [f"{s['seconds']:.1f}"] if seconds else []
        rows.append([name, str(s["passed"]), str(s["failed"]), str(s["no_claim"]), format_worst_ratio(s),
                     where, *timing])
    print_fitted(console, table, ["check", "pass:right", "fail:right", "no\nclaim:right", "worst\nerror/tol:right",
                                  "worst input", *(["s:right"] if seconds else [])], rows,
                 fixed={1, 2, 3, 4, 6} if seconds else {1, 2, 3, 4}, keep={0, 5}, whole={0}, styles=styles,
                 under=(5, 0))
    return summ


def print_failures(results: list[CheckResult], console=None, limit: int = FAILURES_SHOWN) -> int:
    """The failing (check, input) pairs only, worst row first (at most ``limit``; a last line counts
    the rest); returns how many pairs failed. Prints nothing when none did."""
    table_mod = require("rich.table", "ortho-verify's terminal table")
    console = console or make_console()
    failed = sorted((w for w, _, _ in worst_per_group(results) if not w.passed), key=lambda r: -r.ratio)
    if not failed:
        return 0
    box = require("rich.box", "ortho-verify's terminal table")
    kinds: dict[str, int] = {}
    for r in failed:
        kinds[failure_kind(r)] = kinds.get(failure_kind(r), 0) + 1
    by_kind = ", ".join(f"{kind} {n}" for kind, n in kinds.items())
    table = functools.partial(table_mod.Table, title=f"failed: {len(failed)} (check, input) pairs ({by_kind})",
                              title_style="bold red", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    rows = [[r.check, r.input, r.detail, format_number(r.error), format_number(r.tolerance), f"{r.ratio:.3g}", r.note]
            for r in failed[:limit]]
    print_fitted(console, table, ["check", "input", "worst case", "error:right", "tolerance:right", "error/tol:right",
                                  "note"], rows, fixed={3, 4, 5}, keep={0, 1}, whole={0}, name_columns=(0, 1))
    if len(failed) > limit:
        console.print(f"[bold red]... and {len(failed) - limit} more failed pairs (report.md, \"Failures\")[/]")
    return len(failed)
