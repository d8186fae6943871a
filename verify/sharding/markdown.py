"""Reports of ``ortho-verify sharding``: the terminal table (rich), sharding.md and docs/layouts.md
(its text is the package data file ``layouts_template.md``)."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Sequence

from ..optional import require
from ..report.tables import print_fitted
from ..tolerances import sharded_tolerance
from .layouts import DION_OPTIONS, DTYPES, MUON_OPTIONS

__all__ = ["HEADERS", "TEMPLATE", "layouts_doc", "markdown_report", "markdown_tables", "print_table", "table_rows"]

#: The package data file holding docs/layouts.md's text before the tables (``str.format`` fields:
#: matrices, steps, dion, muon).
TEMPLATE = "layouts_template.md"


def _fmt(x: float) -> str:
    return "0" if x == 0 else f"{x:.1e}"


def _comm_cells(row: dict) -> tuple[str, str, str]:
    c = row["comm"]
    return str(c["numel"]), "—" if c["analytic"] is None else str(c["analytic"]), c["verdict"]


HEADERS = ("N", "optimizer", "layout", "mesh", "dtype", "check", "worst rel. diff", "bound", "result",
           "elements/step", "analytic", "comm")


def table_rows(rows: Sequence[dict]) -> list[tuple[str, ...]]:
    """One tuple of ``HEADERS`` cells per report row."""
    out = []
    for r in rows:
        mesh = "×".join(map(str, r["mesh"])) if r["mesh"] else "—"
        dims = f" ({', '.join(r['dims'])})" if r["dims"] else ""
        result = r["status"] + (" (bitwise)" if r["bitwise"] else "")
        out.append((str(r["world_size"]), r["optimizer"], r["layout"], mesh + dims, r["dtype"], r["check"],
                    _fmt(r["worst"]), _fmt(r["bound"]), result, *_comm_cells(r)))
    return out


def print_table(rows: Sequence[dict], console=None) -> None:
    """The rich table of ``table_rows`` (failures in red), or at a width too narrow for its 12
    columns one record per row ("dion  DDP", then "N: 2; mesh: 2 (dp); ...": ``print_fitted``)."""
    Table = require("rich.table", "ortho-verify sharding's terminal table").Table
    console = console or require("rich.console", "ortho-verify sharding's terminal table").Console()
    numbers = ("worst rel. diff", "bound", "N")
    print_fitted(console, functools.partial(Table, title="ortho-verify sharding: every layout against one process"),
                 [f"{h}:right" if h in numbers else h for h in HEADERS], [list(c) for c in table_rows(rows)],
                 fixed={i for i, h in enumerate(HEADERS) if h in numbers}, keep={1, 2}, name_columns=(1, 2),
                 styles=[None if r["status"] == "pass" else "bold red" for r in rows])


def _merged(rows: Sequence[dict]) -> dict[tuple, list[dict]]:
    """Rows grouped by (world size, optimizer, layout), in report order (one group: its dtypes)."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault((r["world_size"], r["optimizer"], r["layout"]), []).append(r)
    return out


def markdown_tables(rows: Sequence[dict]) -> list[str]:
    """Markdown lines: per world size one table (a line per layout, its dtypes side by side), and
    for the largest world size the communication of each matrix against its formula."""
    dtypes = [d for d in DTYPES if any(r["dtype"] == d for r in rows)]
    groups = _merged(rows)
    lines = []
    for world in sorted({key[0] for key in groups}):
        lines += [f"### World size {world}", "",
                  "| optimizer | layout | mesh (dims) | placements | check | " + " | ".join(
                      f"{d} rel. diff (≤ {_fmt(sharded_tolerance(d))})" for d in dtypes)
                  + " | result | elements/step | analytic | bytes/step (" + dtypes[0] + ") | comm |",
                  "|" + "---|" * (10 + len(dtypes))]
        for (w, opt, name), group in groups.items():
            if w != world:
                continue
            first, by_dtype = group[0], {r["dtype"]: r for r in group}
            mesh = "×".join(map(str, first["mesh"])) + f" ({', '.join(first['dims'])})" if first["mesh"] else "—"
            result = "pass" if all(r["status"] == "pass" for r in group) else "**FAIL**"
            result += " (bitwise)" if all(r["bitwise"] for r in group) else ""
            diffs = [_fmt(by_dtype[d]["worst"]) if d in by_dtype else "—" for d in dtypes]
            numel, analytic, verdict = _comm_cells(first)
            lines.append(f"| {opt} | {name} | {mesh} | {', '.join(first['placements'] or ['plain'])} | "
                         f"{first['check']} | {' | '.join(diffs)} | {result} | {numel} | {analytic} | "
                         f"{first['comm']['bytes']} | {verdict} |")
        lines.append("")
    world = max(key[0] for key in groups)
    shapes = [tuple(m["shape"]) for m in rows[0]["comm"]["matrices"]]
    lines += [f"### Communication per matrix at world size {world} (measured / analytic elements)", "",
              "| optimizer | layout | " + " | ".join(f"{m}×{n}" for m, n in shapes) + " |",
              "|" + "---|" * (2 + len(shapes))]
    for (w, opt, name), group in groups.items():
        if w == world:
            cells = [f"{m['numel']} / {m['analytic']}" + ("" if m["verdict"] == "exact" else f" ({m['verdict']})")
                     for m in group[0]["comm"]["matrices"]]
            lines.append(f"| {opt} | {name} | " + " | ".join(cells) + " |")
    return lines + [""]


def markdown_report(rows: Sequence[dict], meta: dict) -> str:
    """Markdown: the run's metadata and ``markdown_tables``."""
    return "\n".join(["# ortho-verify sharding report", "", *[f"- {k}: {v}" for k, v in meta.items()], "",
                      *markdown_tables(rows)])


def layouts_doc(rows: Sequence[dict], meta: dict) -> str:
    """docs/layouts.md: what is checked, how each layout computes and communicates, the byte
    convention, and the run's tables (``markdown_tables``)."""
    head = resources.files(__package__).joinpath(TEMPLATE).read_text(encoding="utf-8").format(
                       matrices=", ".join(f"{m}×{n}" for m, n in meta["matrices"]), steps=meta["steps"],
                       dion=", ".join(f"{k}={v}" for k, v in DION_OPTIONS.items()),
                       muon=", ".join(f"{k}={v}" for k, v in MUON_OPTIONS.items()))
    return head + "\n".join([*[f"- {k}: {v}" for k, v in meta.items()], "", *markdown_tables(rows)])

