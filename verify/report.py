"""Reports of ``ortho-verify``: one terminal table (rich), ``report.json`` and ``report.md``.

The file writers and the summary live with the result types in ``ortho_verify.results`` and
are re-exported here; rich is imported only when a table is printed.
"""

from __future__ import annotations

from ortho_verify.optional import require
from ortho_verify.results import (CheckResult, error_feedback_table, format_number, summary, worst_per_group,
                                  write_reports)

__all__ = ["error_feedback_table", "print_table", "summary", "worst_per_group", "write_reports"]


def print_table(results: list[CheckResult], console=None) -> None:
    """The verification table: one row per (check, input) with its worst case.

    ``console``: a ``rich.console.Console`` (default: a new one on stdout).
    Raises: ImportError naming the extra ``verify`` when rich is not installed.
    """
    table_mod = require("rich.table", "ortho-verify's terminal table")
    console = console or require("rich.console", "ortho-verify's terminal table").Console()
    table = table_mod.Table(title="ortho-verify: fast implementations vs the exact oracle", show_lines=False)
    for col, just in (("check", "left"), ("input", "left"), ("worst case", "left"), ("error", "right"),
                      ("tolerance", "right"), ("error/tol", "right"), ("result", "center")):
        table.add_column(col, justify=just, overflow="fold")
    for worst, ok, total in worst_per_group(results):
        failed = not worst.passed
        shown = f"[bold red]FAIL {total - ok}/{total}[/]" if failed else f"[green]pass {ok}/{total}[/]" if ok else \
            f"[yellow]no claim {total}/{total}[/]"
        table.add_row(worst.check, worst.input, worst.detail, format_number(worst.error),
                      format_number(worst.tolerance), f"{worst.ratio:.3f}", shown)
    console.print(table)
