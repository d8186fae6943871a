"""Reports of ``ortho-verify``: one terminal table, ``report.json`` and ``report.md``."""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ortho_verify.checks import CheckResult, verdict


def _fmt(x: float) -> str:
    if math.isinf(x) or math.isnan(x):
        return str(x)
    return f"{x:.2e}" if x else "0"


def worst_per_group(results: list[CheckResult]) -> list[tuple[CheckResult, int, int]]:
    """(worst result, passed count, total) per (check, input), in first-seen order; a failure
    before a claim before a row that made no claim; "passed" counts rows with status "pass"."""
    groups: "OrderedDict[tuple[str, str], list[CheckResult]]" = OrderedDict()
    for r in results:
        groups.setdefault((r.check, r.input), []).append(r)
    return [(max(rs, key=lambda r: (not r.passed, r.claimed, r.ratio)), sum(r.status == "pass" for r in rs), len(rs))
            for rs in groups.values()]


def print_table(results: list[CheckResult], console: Console | None = None) -> None:
    """The verification table: one row per (check, input) with its worst case."""
    console = console or Console()
    table = Table(title="ortho-verify: fast implementations vs the exact oracle", show_lines=False)
    for col, just in (("check", "left"), ("input", "left"), ("worst case", "left"), ("error", "right"),
                      ("tolerance", "right"), ("error/tol", "right"), ("result", "center")):
        table.add_column(col, justify=just, overflow="fold")
    for worst, ok, total in worst_per_group(results):
        failed = not worst.passed
        shown = f"[bold red]FAIL {total - ok}/{total}[/]" if failed else f"[green]pass {ok}/{total}[/]" if ok else \
            f"[yellow]no claim {total}/{total}[/]"
        table.add_row(worst.check, worst.input, worst.detail, _fmt(worst.error), _fmt(worst.tolerance),
                      f"{worst.ratio:.3f}", shown)
    console.print(table)


def summary(results: list[CheckResult]) -> dict:
    """Counts (passed, failed, no_claim: rows that passed vacuously), the verdict
    (``ortho_verify.checks.verdict``) with its reasons, and per check the counts and the worst
    error/tolerance ratio of its claimed rows."""
    by_check: dict[str, dict] = {}
    for r in results:
        s = by_check.setdefault(r.check, {"total": 0, "passed": 0, "no_claim": 0, "worst_ratio": 0.0})
        s["total"] += 1
        s["passed"] += int(r.status == "pass")
        s["no_claim"] += int(r.status == "no claim")
        s["worst_ratio"] = max(s["worst_ratio"], r.ratio if r.claimed else 0.0)
    status, reasons = verdict(results)
    return {
        "total": len(results),
        "passed": sum(r.status == "pass" for r in results),
        "failed": sum(not r.passed for r in results),
        "no_claim": sum(r.status == "no claim" for r in results),
        "verdict": status,
        "inconclusive": reasons,
        "by_check": by_check,
    }


def error_feedback_table(results: list[CheckResult]) -> list[str]:
    """Markdown lines comparing Dion with and without error feedback, from the ``ef_bookkeeping``
    rows: per input, rank and dtype, the fraction of Σ G_t that no term accounts for (rounding
    with error feedback; the dropped gradient without it) and the largest fraction of B_t outside
    span P_t. Empty when there are no such rows."""
    rows: "OrderedDict[tuple, dict]" = OrderedDict()
    for r in results:
        if r.check == "ef_bookkeeping" and "lost_fraction" in r.extra:
            key = (r.input, r.extra["rank"], r.detail.split("/")[2] if r.detail.count("/") >= 2 else "")
            rows.setdefault(key, {})["on" if r.extra["error_feedback"] else "off"] = r.extra
    if not rows:
        return []
    lines = ["## Error feedback: on vs off", "",
             "Dion over T steps from M = 0: the part of the summed gradient that neither the momentum nor the "
             "applied steps account for, ‖Σ G − M_T − (1 − μ) Σ P Rᵀ‖ / ‖Σ G‖ (rounding with error feedback; "
             "what is lost without it), and ‖(I − PPᵀ)B‖ / ‖B‖ at the last step (what the step leaves outside its "
             "rank-r subspace; with error feedback B carries the earlier residual).", "",
             "| input | rank | dtype | lost, EF on | lost, EF off | outside span P at step T (on / off) |",
             "|---|---|---|---|---|---|"]
    for (inp, rank, dtype), modes in rows.items():
        on, off = modes.get("on", {}), modes.get("off", {})
        lines.append(f"| {inp} | {rank} | {dtype} | {_fmt(on.get('lost_fraction', math.nan))} | "
                     f"{_fmt(off.get('lost_fraction', math.nan))} | {_fmt(on.get('outside_fraction', math.nan))} / "
                     f"{_fmt(off.get('outside_fraction', math.nan))} |")
    return lines + [""]


def write_reports(results: list[CheckResult], out_dir: Path, meta: dict, plots=()) -> tuple[Path, Path]:
    """Write ``report.json`` (every result, summary, run metadata) and ``report.md`` (summary,
    the error-feedback comparison, the ``plots`` (paths relative to ``out_dir``) and every check)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summ = summary(results)
    json_path = out_dir / "report.json"
    json_path.write_text(json.dumps({"meta": meta, "summary": summ, "results": [r.as_dict() for r in results]},
                                    indent=2, default=str))
    lines = [
        "# ortho-verify report",
        "",
        f"{summ['passed']} of {summ['total']} checks passed, {summ['failed']} failed, {summ['no_claim']} made no claim "
        f"(passed vacuously: not compared, or a tolerance that cannot reject a wrong result). Verdict: "
        f"{summ['verdict']}.",
        "",
        *[f"- nothing compared — {why}" for why in summ["inconclusive"]],
        "## Run",
        "",
    ]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", "## Summary by check", "", "| check | passed | no claim | total | worst error/tolerance |",
              "|---|---|---|---|---|"]
    for name, s in summ["by_check"].items():
        lines.append(f"| {name} | {s['passed']} | {s['no_claim']} | {s['total']} | {s['worst_ratio']:.3f} |")
    lines += [""] + error_feedback_table(results)
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).as_posix()})" for p in plots] + [""]
    lines += ["## Every check", "",
              "| check | input | detail | error | tolerance | error/tol | result | note |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.check} | {r.input} | {r.detail} | {_fmt(r.error)} | {_fmt(r.tolerance)} | "
                     f"{r.ratio:.3f} | {r.status if r.passed else 'FAIL'} | {r.note} |")
    md_path = out_dir / "report.md"
    md_path.write_text("\n".join(lines) + "\n")
    return json_path, md_path
