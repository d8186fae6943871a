"""The terminal tables of ``ortho-verify`` (the CI log): at 80, 100 and 120 columns no line is wider
than the terminal, none ends in a space, and no word is broken: a long input name wraps after a
'/' ("synthetic/" + "well-conditioned/32x64"), a check name stays whole, and a table too wide for
its words moves a column under the name or prints one record per row."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, strategies as st

from ortho_verify.report import terminal as report
from ortho_verify.report.results import measured, no_claim
from ortho_verify.report.tables import ELLIPSIS, column_widths, wrap_cell

rich_console = pytest.importorskip("rich.console")

RESULTS = [
    measured("baseline_regression", "synthetic/well-conditioned/32x64", "step 3 weight relative Frobenius", 0.5, 0.1,
             note="ratio grew from 0.01 to 0.5: beyond max(2 x baseline, 0.1) on the worst key "
                  "synthetic/well-conditioned/32x64"),
    measured("ns_vs_ns_map", "real/gpt-step-300/blocks.0.attn.qkv.weight", "polar_express/bfloat16/gram", 0.3, 1.0),
    measured("muon_update/ns_projected_singular_values", "37x16 step 1", "float32", 0.1, 1.0),
    measured("dion_vs_reference", "synthetic/rank-deficient/48x24", "householder/float32/step 2 Q", 2.5, 1.0,
             note="update off by a constant factor s = 1.414 on a 48x24 matrix: spectral_norm where original is "
                  "declared"),
    no_claim("ns_projected_singular_values", "synthetic/condition-1e6/tall-64x16", "bfloat16/jordan",
             "tolerance admits the zero matrix"),
]


def _printed(width: int) -> str:
    console = rich_console.Console(width=width, color_system=None)
    with console.capture() as captured:
        report.print_summary(RESULTS, console)
        report.print_failures(RESULTS, console)
        report.print_table(RESULTS, console)
    return captured.get()


def _unbroken(piece: str, out: str) -> bool:
    """``piece`` appears whole, or shortened in the middle (its first and last characters around "…")."""
    if piece in out:
        return True
    return any(line_piece.startswith(piece[:1]) and line_piece.endswith(piece[-1:]) and ELLIPSIS in line_piece
               and piece.startswith(line_piece.split(ELLIPSIS)[0]) and piece.endswith(line_piece.split(ELLIPSIS)[1])
               for line_piece in out.split())


@pytest.mark.parametrize("width", [80, 100, 120])
def test_no_word_broken_no_line_too_wide_no_trailing_space(width):
    out = _printed(width)
    lines = out.splitlines()
    assert all(len(line) <= width for line in lines), max(map(len, lines))
    assert not [line for line in lines if line != line.rstrip()]
    cells = [text for r in RESULTS for text in (r.check, r.input, r.detail, r.note if not r.passed else "")]
    pieces = {p for text in cells for word in text.split() for p in re.findall(r"[^/]*/|[^/]+$", word)}
    assert [p for p in pieces if not _unbroken(p, out)] == []
    for broken in ("baseline_regre\n", "well-condit\n", "synthetic/wel\n"):
        assert broken not in out.replace(" ", "")


@pytest.mark.parametrize("width", [80, 100, 120])
def test_every_check_name_appears_whole_on_one_line(width):
    """A check name is what a reader searches for in the docs: on one line, whole (never split at
    '/'); an input name wraps after a '/' at most; nothing is elided."""
    lines = _printed(width).splitlines()
    for r in RESULTS:
        assert any(re.search(rf"(?<![\w/]){re.escape(r.check)}(?![\w/])", line) for line in lines), r.check
        assert all(any(p in line for line in lines) for p in re.findall(r"[^/]*/|[^/]+$", r.input)), r.input
    assert ELLIPSIS not in "".join(lines)


@given(st.lists(st.text(alphabet="ab/_-. ", min_size=1, max_size=30), min_size=1, max_size=4).map(" ".join),
       st.integers(1, 40))
def test_wrap_cell_keeps_every_word_whole_or_elides_it(text, width):
    lines = wrap_cell(text, width)
    assert all(len(line) <= width and line == line.strip() for line in lines)
    pieces = [p for word in text.split() for p in re.findall(r"[^/]*/|[^/]+$", word)]
    if all(len(p) <= width for p in pieces):  # nothing elided: the lines are the words, split at spaces and '/'
        assert "".join("".join(lines).split()) == "".join(text.split())
        assert ELLIPSIS not in "".join(lines)


def test_column_widths_fit_and_keep_fixed_columns():
    cells = [["check", "error"], ["baseline_regression", "5.00e-01"], ["x", "1.00e+00"]]
    assert column_widths(cells, 100, {1}) == [19, 8]
    assert column_widths(cells, 20, {1}) == [12, 8]  # the text column gives way, the number keeps its width
    assert column_widths([["note"], ["a prose note of words"]], 10) == [10]  # prose wraps, nothing elided
