"""Tables: the ones quoted in the docs, computed by the oracle (``python -m ortho_verify.report.tables``
prints them; docs/tolerances.md embeds the output verbatim and a test regenerates it, so the
numbers in the docs are the ones the code computes), and the layout of the terminal tables of
``ortho-verify`` (``print_fitted``: rich draws them; the column widths and where a cell breaks
are decided here, so that no word is broken at any width and no line ends in spaces).
"""

from __future__ import annotations

import re

import numpy as np

import ortho_ref

from ..optional import require

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


def _split_long_word(word: str, width: int, whole: bool = False) -> list[str]:
    """``word`` (no spaces) in pieces of at most ``width`` characters: broken after path
    separators ('/') where possible (not when ``whole``), a piece that is still too long elided in
    the middle."""
    parts = [word] if whole else re.findall(r"[^/]*/|[^/]+$", word) or [word]
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


def wrap_cell(text: str, width: int, whole: bool = False) -> list[str]:
    """The lines of one table cell at most ``width`` characters wide, no word broken: lines
    break at spaces; a word longer than ``width`` breaks after a '/' (an input name such as
    "synthetic/well-conditioned/32x64"), and a piece still too long is shortened in the middle
    ("baseline…ssion"). Existing line breaks are kept; no line ends in a space.
    ``whole``: a word is not split at '/' (a check name); one longer than ``width`` is elided.
    Raises: ValueError for ``width`` < 1."""
    if width < 1:
        raise ValueError(f"width: expected at least 1 column, got {width}")
    lines: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split():
            pieces = [word] if len(word) <= width else _split_long_word(word, width, whole)
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


def _longest_word(text: str, whole: bool = False) -> int:
    """Length of the longest piece of ``text`` that ``wrap_cell`` cannot break without eliding
    (words, split after '/' unless ``whole``: a check name is never split)."""
    if whole:
        return max((len(w) for w in text.split()), default=0)
    return max((len(p) for w in text.split() for p in re.findall(r"[^/]*/|[^/]+$", w)), default=0)


def column_widths(cells: list[list[str]], available: int, fixed: set[int] = frozenset(),
                  keep: set[int] = frozenset(), whole: set[int] = frozenset()) -> list[int]:
    """Width of each column so that they add up to at most ``available``: a column's natural
    width (its longest line) when everything fits; else the widest text columns are narrowed one
    character at a time, first down to their longest unbreakable word (the cells wrap, nothing
    is elided); then the ``fixed`` columns (numbers, counts: never wrapped) down to their values'
    width (a header such as "error/tol" wraps at its '/'); then the text columns down to
    ``MIN_TEXT_WIDTH`` (long words are elided in the middle), the ``keep`` columns (the names a
    reader looks for: check, input) last; the words of the ``whole`` columns (check names) are
    not split at '/'. No column gets narrower
    than the longest unbreakable word of its header (``cells[0]``). ``print_fitted`` lays a table
    out only when no word is elided (``floor_widths``)."""
    n = len(cells[0])
    natural = [max(len(line) for row in cells for line in (row[j] or "").split("\n")) for j in range(n)]
    data = [max((len(line) for row in cells[1:] for line in (row[j] or "").split("\n")), default=0) for j in range(n)]
    header = [_longest_word(cells[0][j]) for j in range(n)]
    words = [max(_longest_word(row[j] or "", j in whole) for row in cells) for j in range(n)]
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


def floor_widths(cells: list[list[str]], fixed: set[int] = frozenset(), whole: set[int] = frozenset()) -> list[int]:
    """The narrowest each column can be with no word elided: a ``fixed`` column (numbers) its
    values' width (its header wraps at spaces and '/'), a ``whole`` column (check names) its longest
    word, any other column its longest word after splitting at '/' (``wrap_cell``)."""
    out = []
    for j in range(len(cells[0])):
        if j in fixed:
            data = [len(line) for row in cells[1:] for line in (row[j] or "").split("\n")]
            out.append(max([_longest_word(cells[0][j]), *data]))
        else:
            out.append(max(_longest_word(row[j] or "", j in whole) for row in cells))
    return out


#: A number (``4.7``, ``(6``, ``1e-3``) and the unit after it ("4.7 s", "512 KB") stay on one line.
_NUMBER = re.compile(r"[(\[]?[-+]?\d[\d.,]*(?:e[-+]?\d+)?")
_UNIT = re.compile(r"(?:s|ms|µs|min|h|B|KB|MB|GB|KiB|MiB|GiB|%|x|×)[,;:.)\]]*")


def _glued(text: str, i: int) -> bool:
    """Whether the space at ``text[i]`` joins a number to its unit."""
    before, after = re.search(r"\S*$", text[:i]).group(), re.match(r"\S*", text[i + 1:]).group()
    return bool(_NUMBER.fullmatch(before) and _UNIT.fullmatch(after))


def line_spans(text: str, width: int, indent: int = 0) -> list[tuple[int, int, bool]]:
    """(start, end, continued) of each line of ``text`` wrapped at ``width`` columns: lines break
    at spaces (the space is dropped) but never between a number and its unit ("8.2 s"); a word
    longer than a line breaks after a '/' where it can, else at the line's end; line breaks in
    ``text`` are kept. A continued line (not a paragraph's first) is ``indent`` columns narrower.
    Raises: ValueError for a line narrower than 1 column."""
    if width - indent < 1:
        raise ValueError(f"width: expected at least {indent + 1} columns, got {width}")
    spans, offset = [], 0
    for paragraph in text.split("\n"):
        breaks = [m.start() for m in re.finditer(" ", paragraph) if not _glued(paragraph, m.start())]
        start, room = 0, width
        while len(paragraph) - start > room:
            fits = [b for b in breaks if start < b <= start + room]
            if fits:
                end, after = fits[-1], fits[-1] + 1
            else:
                slash = paragraph.rfind("/", start, start + room)
                end = after = slash + 1 if slash >= start else start + room
            spans.append((offset + start, offset + end, room < width))
            start, room = after, width - indent
        spans.append((offset + start, offset + len(paragraph), room < width))
        offset += len(paragraph) + 1
    return spans


def wrap_words(text: str, width: int, indent: int = 0) -> list[str]:
    """``text`` in lines of at most ``width`` characters (``line_spans``): words whole, a number
    with its unit, continued lines indented by ``indent`` spaces."""
    return [" " * indent * cont + text[a:b] for a, b, cont in line_spans(text, width, indent)]


def print_plain(text: str, width: int) -> None:
    """Print ``text`` to stdout wrapped at ``width`` columns (``wrap_words``): a continued line is
    indented 4 columns past its line's own indent (kept up to half the width); a markdown table row
    ("| ... |") is printed whole, since a row cut in two reads as two rows."""
    for paragraph in text.split("\n"):
        if paragraph.startswith("|"):
            print(paragraph, flush=True)
            continue
        lead = len(paragraph) - len(paragraph.lstrip(" "))
        lead = lead if lead + 5 <= width // 2 else 0
        print("\n".join(" " * lead + line for line in wrap_words(paragraph.lstrip(" "), width - lead, 4)), flush=True)


def print_words(console, segments: list[tuple[str, str | None]], indent: int = 0) -> None:
    """Print ``segments`` ((text, rich style or None) pairs, plain text) wrapped at the console's
    width by ``line_spans`` (rich's wrapping would split "8.2 s"), continued lines indented by
    ``indent`` spaces.
    Raises: ImportError naming the extra ``verify`` when rich is not installed."""
    Text = require("rich.text", "ortho-verify's terminal output").Text
    text = "".join(t for t, _ in segments)
    bounds, at = [], 0
    for t, _ in segments:
        bounds.append((at, at + len(t)))
        at += len(t)
    out = Text()
    for k, (a, b, cont) in enumerate(line_spans(text, console.width, indent)):
        if k:
            out.append("\n")
        out.append(" " * indent * cont)
        for (t, style), (s0, s1) in zip(segments, bounds):
            if max(a, s0) < min(b, s1):
                out.append(text[max(a, s0):min(b, s1)], style=style)
    console.print(out, soft_wrap=True)


def _rendered(console, renderable, strip: bool = True) -> list[str]:
    with console.capture() as captured:
        console.print(renderable)
    lines = captured.get().split("\n")
    # no trailing spaces, also before the closing escape codes of a styled line
    return [re.sub(r" +((?:\x1b\[[0-9;]*m)*)$", r"\1", line) for line in lines] if strip else lines


def _overhead(console, make_table, n: int) -> int:
    """Columns the table's borders and padding take with ``n`` columns."""
    probe = make_table(title=None, show_header=False)
    for _ in range(n):
        probe.add_column("x", width=1, no_wrap=True)
    probe.add_row(*["x"] * n)
    wide = console.__class__(width=10_000, color_system=None)
    return max(len(line) for line in _rendered(wide, probe, strip=False)) - n


def _print_table(console, make_table, names, justify, rows, fixed, keep, whole, styles) -> None:
    Text = require("rich.text", "ortho-verify's terminal table").Text
    available = console.width - _overhead(console, make_table, len(names))
    widths = column_widths([names, *rows], max(len(names) * 3, available), set(fixed), set(keep), set(whole))
    table = make_table()
    for name, just, width in zip(names, justify, widths):
        table.add_column(Text("\n".join(wrap_cell(name, width))), justify=just, width=width, no_wrap=True,
                         overflow="fold")
    for i, row in enumerate(rows):
        cells = [Text("\n".join(wrap_cell(cell, w, j in whole))) for j, (cell, w) in enumerate(zip(row, widths))]
        table.add_row(*cells, style=(styles[i] if styles else None) or None)
    lines = _rendered(console, table)
    console.print(Text.from_ansi("\n".join(lines[:-1] if lines and not lines[-1] else lines)), soft_wrap=True)


def _print_records(console, table, names, rows, name_columns, styles) -> None:
    """Each row as a block: its ``name_columns`` on the first line, then "header: value" items
    separated by "; ", indented, wrapped at whole items where they fit (``wrap_cell`` inside one);
    ``table``'s title first, in its style, after an empty line (as rich draws a table's title)."""
    Text = require("rich.text", "ortho-verify's terminal table").Text
    width, indent = console.width, 4
    if table.title:
        console.print()
        print_words(console, [(str(table.title), table.title_style or "italic")])
    for i, row in enumerate(rows):
        style = (styles[i] if styles else None) or None
        head = " — ".join(row[j] for j in name_columns if row[j])
        lines = wrap_cell(head, width, whole=True)
        items = [f"{' '.join(names[j].split())}: {' '.join(cell.split())}" for j, cell in enumerate(row)
                 if j not in name_columns and cell]
        avail, current = width - indent, ""
        body = []
        for item in items:
            if current and len(current) + 2 + len(item) <= avail:
                current += "; " + item
                continue
            if current:
                body.append(current)
            pieces = [item] if len(item) <= avail else wrap_words(item, avail)
            body += pieces[:-1]
            current = pieces[-1]
        if current:
            body.append(current)
        console.print(Text("\n".join(lines + [" " * indent + b for b in body]), style=style or ""), soft_wrap=True)


def print_fitted(console, make_table, headers: list[str], rows: list[list[str]], *, fixed: set[int] = frozenset(),
                 keep: set[int] = frozenset(), whole: set[int] = frozenset(), styles: list[str | None] | None = None,
                 under: tuple[int, int] | None = None, name_columns: tuple[int, ...] | None = None) -> str:
    """Print rows as a rich table whose cells never break inside a word, without trailing spaces,
    or, where the table cannot fit the console's width with every word whole, as records.

    ``make_table(**overrides)``: a new empty ``rich.table.Table`` with its title and box;
    ``headers``: the column names (a header may hold a line break), each column's justification
    after a ":" ("pass:right"); ``rows``: the cells as plain text (no rich markup); ``fixed``:
    columns that keep their width (counts, numbers); ``keep``: names (a check, an input), shortened
    last (``column_widths``); ``whole``: columns whose words are never split, not even at '/' (check
    names, searched for in the docs); ``styles``: a rich style per row or None.
    The widths fit the console's width (``column_widths``), every cell is wrapped by ``wrap_cell``,
    and rich draws the table. When the narrowest table with no word elided (``floor_widths``) is
    wider than the console: with ``under = (j, k)`` column ``j`` moves into column ``k``'s cell as a
    second line "header: value", and if that is still too wide each row is printed as a record
    (``name_columns``, default the first ``keep`` column, on one line, then "header: value" items).
    Returns the layout used: "table", "under" or "records".
    Raises: ImportError naming the extra ``verify`` when rich is not installed.
    """
    names = [h.rsplit(":", 1)[0] for h in headers]
    justify = [h.rsplit(":", 1)[1] if ":" in h else "left" for h in headers]
    fixed, keep, whole = set(fixed), set(keep), set(whole)

    def fits(names_, rows_, fixed_, whole_) -> bool:
        available = console.width - _overhead(console, make_table, len(names_))
        return sum(floor_widths([names_, *rows_], fixed_, whole_)) <= available

    if fits(names, rows, fixed, whole):
        _print_table(console, make_table, names, justify, rows, fixed, keep, whole, styles)
        return "table"
    if under is not None:
        j, k = under

        def drop(seq):
            return [x for m, x in enumerate(seq) if m != j]

        def shift(cols):
            return {m - (m > j) for m in cols if m != j}

        names2 = drop(names)
        names2[k - (k > j)] = f"{names[k]}\n{names[j]}"
        rows2 = []
        for row in rows:
            row2 = drop(row)
            row2[k - (k > j)] = f"{row[k]}\n{names[j]}: {row[j]}" if row[j] else row[k]
            rows2.append(row2)
        if fits(names2, rows2, shift(fixed), shift(whole)):
            _print_table(console, make_table, names2, drop(justify), rows2, shift(fixed), shift(keep), shift(whole),
                         styles)
            return "under"
    columns = name_columns if name_columns is not None else (min(keep) if keep else 0,)
    _print_records(console, make_table(), names, rows, columns, styles)
    return "records"


if __name__ == "__main__":  # pragma: no cover
    print(schedule_table())
