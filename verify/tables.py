"""Tables: the ones quoted in the docs, computed by the oracle (``python -m ortho_verify.tables``
prints them; docs/tolerances.md embeds the output verbatim and a test regenerates it, so the
numbers in the docs are the ones the code computes), and the layout of the terminal tables of
``ortho-verify`` (``print_fitted``: rich draws them; the column widths and where a cell breaks
are decided here, so that no word is broken at any width and no line ends in spaces).
"""

from __future__ import annotations

import re

import numpy as np

import ortho_ref
from ortho_verify.optional import require

#: The narrowest a wrapped text column gets (an elided cell keeps its first and last characters).
MIN_TEXT_WIDTH = 8
ELLIPSIS = "…"

BAND_INTERVAL = (1e-3, 1.0)


def schedule_table() -> str:
    """Markdown table: per schedule its steps, normalization, exact band of f on
    σ̂ ∈ [1e-3, 1], L_f = sup |f′| on [0, 1], Π a_t = f′(0), and the step gains G_t."""
    lines = [
        "| schedule | steps | safety | eps | band of f on [1e-3, 1] | L_f = sup\\|f′\\| on [0, 1] | Π a_t = f′(0) | "
        "gains G_0..G_T on [1e-3, 1] |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in sorted(ortho_ref.SCHEDULES):
        sched = ortho_ref.SCHEDULES[name]
        table = ortho_ref.schedule(name)
        lo, hi = ortho_ref.ns_band(table, *BAND_INTERVAL)
        lip = ortho_ref.ns_lipschitz(table)
        gains = ortho_ref.ns_step_gains(table, *BAND_INTERVAL)
        lines.append(
            f"| {name} | {len(table)} | {sched.safety:g} | {sched.eps:g} | [{lo:.4f}, {hi:.4f}] | {lip:.1f} | "
            f"{float(np.prod(table[:, 0])):.1f} | {', '.join(f'{g:.1f}' for g in gains)} |"
        )
    return "\n".join(lines)


def _split_long_word(word: str, width: int) -> list[str]:
    """``word`` (no spaces) in pieces of at most ``width`` characters: broken after path
    separators ('/') where possible, a piece that is still too long elided in the middle."""
    parts = re.findall(r"[^/]*/|[^/]+$", word) or [word]
    pieces: list[str] = []
    for part in parts:
        if pieces and len(pieces[-1]) + len(part) <= width:
            pieces[-1] += part
        else:
            pieces.append(part)
    def elided(p: str) -> str:
        if len(p) <= width:
            return p
        if width < 3:  # too narrow for "a…b"
            return p[:width]
        return p[:(width - 1) - (width - 1) // 2] + ELLIPSIS + p[len(p) - (width - 1) // 2:]

    return [elided(p) for p in pieces]


def wrap_cell(text: str, width: int) -> list[str]:
    """The lines of one table cell at most ``width`` characters wide, no word broken: lines
    break at spaces; a word longer than ``width`` breaks after a '/' (an input name such as
    "synthetic/well-conditioned/32x64"), and a piece still too long is shortened in the middle
    ("baseline…ssion"). Existing line breaks are kept; no line ends in a space.
    Raises: ValueError for ``width`` < 1."""
    if width < 1:
        raise ValueError(f"width: expected at least 1 column, got {width}")
    lines: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split():
            pieces = [word] if len(word) <= width else _split_long_word(word, width)
            for k, piece in enumerate(pieces):
                joined = line + ("" if k else " ") + piece
                if not line:
                    line = piece
                elif len(joined) <= width:
                    line = joined
                else:
                    lines.append(line)
                    line = piece
        lines.append(line)
    return lines


def _longest_word(text: str) -> int:
    """Length of the longest piece of ``text`` that ``wrap_cell`` cannot break without eliding
    (words, split after '/')."""
    return max((len(p) for w in text.split() for p in re.findall(r"[^/]*/|[^/]+$", w)), default=0)


def column_widths(cells: list[list[str]], available: int, fixed: set[int] = frozenset(),
                  keep: set[int] = frozenset()) -> list[int]:
    """Width of each column so that they add up to at most ``available``: a column's natural
    width (its longest line) when everything fits; else the widest text columns are narrowed one
    character at a time, first down to their longest unbreakable word (the cells wrap, nothing
    is elided); then the ``fixed`` columns (numbers, counts: never wrapped) down to their values'
    width (a header such as "error/tol" wraps at its '/'); then the text columns down to
    ``MIN_TEXT_WIDTH`` (long words are elided in the middle), the ``keep`` columns (the names a
    reader looks for: check, input) last. No column gets narrower than the longest unbreakable
    word of its header (``cells[0]``)."""
    n = len(cells[0])
    natural = [max(len(line) for row in cells for line in (row[j] or "").split("\n")) for j in range(n)]
    data = [max((len(line) for row in cells[1:] for line in (row[j] or "").split("\n")), default=0) for j in range(n)]
    header = [_longest_word(cells[0][j]) for j in range(n)]
    words = [max(_longest_word(row[j] or "") for row in cells) for j in range(n)]
    widths = list(natural)
    text_words = [min(natural[j], words[j]) for j in range(n)]
    fixed_data = [max(data[j], header[j]) for j in range(n)]
    narrowest = [min(natural[j], max(MIN_TEXT_WIDTH, header[j])) for j in range(n)]
    for floor in ([natural[j] if j in fixed else text_words[j] for j in range(n)],
                  [fixed_data[j] if j in fixed else text_words[j] for j in range(n)],
                  [fixed_data[j] if j in fixed else text_words[j] if j in keep else narrowest[j] for j in range(n)],
                  [fixed_data[j] if j in fixed else narrowest[j] for j in range(n)]):
        while sum(widths) > available:
            shrinkable = [j for j in range(n) if widths[j] > floor[j]]
            if not shrinkable:
                break
            widths[max(shrinkable, key=lambda j: widths[j])] -= 1
    return widths


def _rendered(console, renderable, strip: bool = True) -> list[str]:
    with console.capture() as captured:
        console.print(renderable)
    lines = captured.get().split("\n")
    # no trailing spaces, also before the closing escape codes of a styled line
    return [re.sub(r" +((?:\x1b\[[0-9;]*m)*)$", r"\1", line) for line in lines] if strip else lines


def print_fitted(console, make_table, headers: list[str], rows: list[list[str]], *, fixed: set[int] = frozenset(),
                 keep: set[int] = frozenset(), styles: list[str | None] | None = None) -> None:
    """Print a rich table whose cells never break inside a word, without trailing spaces.

    ``make_table(**overrides)``: a new empty ``rich.table.Table`` with its title and box;
    ``headers``: the column names (a header may hold a line break), each column's justification
    after a ":" ("pass:right"); ``rows``: the cells as plain text (no rich markup); ``fixed``:
    columns that keep their width (counts, numbers); ``keep``: columns shortened last
    (``column_widths``); ``styles``: a rich style per row or None. The widths fit the console's
    width (``column_widths``), every cell is wrapped by ``wrap_cell``, and rich draws the table.
    Raises: ImportError naming the extra ``verify`` when rich is not installed.
    """
    names = [h.rsplit(":", 1)[0] for h in headers]
    justify = [h.rsplit(":", 1)[1] if ":" in h else "left" for h in headers]
    probe = make_table(title=None, show_header=False)
    for name in names:
        probe.add_column("x", width=1, no_wrap=True)
    probe.add_row(*["x"] * len(names))
    wide = console.__class__(width=10_000, color_system=None)
    overhead = max(len(line) for line in _rendered(wide, probe, strip=False)) - len(names)
    widths = column_widths([names, *rows], max(len(names) * 3, console.width - overhead), set(fixed), set(keep))
    Text = require("rich.text", "ortho-verify's terminal table").Text

    table = make_table()
    for name, just, width in zip(names, justify, widths):
        table.add_column(Text("\n".join(wrap_cell(name, width))), justify=just, width=width, no_wrap=True,
                         overflow="ellipsis")
    for i, row in enumerate(rows):
        table.add_row(*[Text("\n".join(wrap_cell(cell, w))) for cell, w in zip(row, widths)],
                      style=(styles[i] if styles else None) or None)
    lines = _rendered(console, table)
    console.print(Text.from_ansi("\n".join(lines[:-1] if lines and not lines[-1] else lines)), soft_wrap=True)


if __name__ == "__main__":  # pragma: no cover
    print(schedule_table())
