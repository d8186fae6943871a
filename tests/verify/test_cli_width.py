"""Every output of ``ortho-verify`` fits ``COLUMNS`` (80: a laptop terminal, a CI log pane; 120):
no line is wider, every check name appears whole on one line (it is what a reader searches for in
the docs), a number stays on the line of its unit ("8.2 s"), ``--help`` never breaks an option name
("--no-" / "real"), the progress bar keeps its count and times, and a typo is named once.

The default run is checked with ``--quick --no-real --no-plots --verbose`` (its output holds the
``--quick`` summary, the failures and the verdict, after the ``--verbose`` rows), printed at each
width from the test session's one ``--quick --no-real`` computation (``tests.quick_run``: the
checks' rows, phases and seconds as that run measured them); ``sharding`` runs
at world size 2 once, its rows drawn again at 120 columns; ``reproduce`` (about 30 s even with
``--quick``) is checked through its printer on constructed results."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from ortho_verify.cli import main as cli
from ortho_verify.cli.arguments import SuggestingParser
from ortho_verify.identify import cli as identify_cli
from ortho_verify.report.tables import wrap_words
from ortho_verify.reproduce import cli as reproduce_cli
from ortho_verify.sharding import cli as sharding_cli
from tests.quick_run import share_quick_collect
from tests.strategies import profile_examples

rich_console = pytest.importorskip("rich.console")

WIDTHS = [80, 120]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _lines(out: str) -> list[str]:
    return ANSI.sub("", out).replace("\r", "\n").split("\n")


def _assert_fits(out: str, width: int) -> list[str]:
    lines = _lines(out)
    too_wide = [line for line in lines if len(line) > width]
    assert not too_wide, f"{len(too_wide)} lines over {width} columns, the widest {max(map(len, too_wide))}"
    # a number and its unit on one line: no line ends in a number whose next line starts with a unit
    split = [(a, b) for a, b in zip(lines, lines[1:])
             if re.search(r"\d$", a.rstrip()) and re.match(r"\s*(s|ms|KB|MB|GB|%)\b", b)]
    assert not split, split
    return lines


def _whole_on_a_line(name: str, lines: list[str]) -> bool:
    pattern = re.compile(rf"(?<![\w/]){re.escape(name)}(?![\w/])")
    return any(pattern.search(line) for line in lines)


@pytest.mark.parametrize("width", WIDTHS)
def test_quick_and_verbose_fit_with_every_check_name_whole(width, tmp_path, monkeypatch, capsys, tmp_path_factory):
    monkeypatch.setenv("COLUMNS", str(width))
    share_quick_collect(monkeypatch, tmp_path_factory)
    code = cli.main(["--quick", "--no-real", "--no-plots", "--verbose", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]
    lines = _assert_fits(out, width)
    checks = json.loads((tmp_path / "report.json").read_text())["summary"]["by_check"]
    assert len(checks) > 20
    assert [name for name in checks if not _whole_on_a_line(name, lines)] == []
    assert "…" not in out
    verdict = [line for line in lines if line.startswith("PASSED")]
    assert verdict and re.search(r"\d s\b", "\n".join(lines[lines.index(verdict[0]):])), verdict


def test_sharding_fits_80_and_its_rows_fit_120(tmp_path):
    """The real command at world size 2 (its quickest: --quick, one dtype) at 80 columns, its rows
    drawn again at 120; every (optimizer, layout) on one line."""
    env = {**os.environ, "COLUMNS": "80"}
    run = subprocess.run([sys.executable, "-m", "ortho_verify", "sharding", "--world-size", "2", "--quick",
                          "--dtype", "float32", "--out", str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rows = json.loads((tmp_path / "sharding.json").read_text())["rows"]
    printed = {80: run.stdout}
    console = rich_console.Console(width=120, color_system=None)
    with console.capture() as captured:
        sharding_cli.print_table(rows, console)
    printed[120] = captured.get()
    for width, out in printed.items():
        lines = _assert_fits(out, width)
        missing = {(r["optimizer"], r["layout"]) for r in rows
                   if not any(r["optimizer"] in line and r["layout"] in line for line in lines)}
        assert missing == set(), (width, missing)
        assert "…" not in out


def _results(mode: str) -> dict:
    statement = ("Dion at rank fraction 1/4 with error feedback stays close to Muon at the same number of steps "
                 "on the held-out split of the corpus")
    claim = {"statement": statement, "verdict": "inconclusive", "reason": "the run resolves 0.0408 and the margin "
             "is 0.0781: more seeds are needed to decide", "measured": "Dion − Muon = +0.0007 ± 0.0061 over 2 seeds; "
             "elapsed 8.2 s", "power": "0.0408 (h 0.0274) vs δ 0.0781"}
    return {"mode": mode, "mode_reason": "--quick: tiny models and few steps", "claims": [claim, claim]}


@pytest.mark.parametrize("width", WIDTHS)
def test_reproduce_lines_fit(width, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", str(width))
    for mode in ("measurement", "study"):
        reproduce_cli.say("\n".join(reproduce_cli.verdict_lines(_results(mode))))
    reproduce_cli.say("  lr sweep, grid extension 1 [12/44] Dion r=1/4, no EF, lr 0.0025, seed 0: validation loss "
                      "4.5293 on the held-out windows of the corpus after the last step (12.5 s)")
    out = capsys.readouterr().out
    lines = _assert_fits(out, width)
    statement = _results("study")["claims"][0]["statement"]
    assert " ".join(out.split()).count(statement) == 4  # every word printed, in order
    assert _whole_on_a_line("(12.5 s)", lines)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("parser", [cli.build_parser, sharding_cli.build_parser, reproduce_cli.build_parser,
                                    identify_cli.build_parser], ids=["main", "sharding", "reproduce", "identify"])
def test_help_fits_and_keeps_option_names_whole(width, parser, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(width))
    text = parser().format_help()
    lines = _assert_fits(text, width)
    assert [line for line in lines if re.search(r"[\w-]-$", line)] == []  # "--no-" / "real"
    options = {s for action in parser()._actions for s in action.option_strings}
    mentioned = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", text))
    assert mentioned & options and not [o for o in mentioned & options if not _whole_on_a_line(o, lines)]


def test_a_typo_is_named_once(capsys):
    with pytest.raises(SystemExit) as err:
        cli.main(["--qick"])
    assert err.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.count("--qick") == 1 and "did you mean '--quick'?" in message, message
    parser = SuggestingParser(prog="p")
    parser.add_argument("--alpha", action="store_true")
    with pytest.raises(SystemExit):
        parser.parse_args(["--alpah", "--zzz"])
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.endswith("unrecognized arguments: --alpah (did you mean '--alpha'?) --zzz"), message


@pytest.mark.parametrize("width", WIDTHS)
def test_progress_bar_keeps_its_count_and_times(width):
    progress_mod = pytest.importorskip("rich.progress")
    from ortho_verify.report.terminal import progress_columns

    console = rich_console.Console(width=width, color_system=None)
    progress = progress_mod.Progress(*progress_columns(width), console=console, expand=True)
    progress.add_task("NS polar_express/float32/gram synthetic/well-conditioned/32x64 and a long tail", total=3000,
                      completed=1234)
    progress.add_task("training the byte-level GPT in a second process (cached after the first run)", total=None)
    with console.capture() as captured:
        console.print(progress.make_tasks_table(progress.tasks))
    lines = _assert_fits(captured.get(), width)
    assert "1234/3000" in lines[0] and re.search(r"\d:\d\d:\d\d", lines[0]), lines
    assert re.search(r"NS polar_express/float32/gram \S", lines[0]), lines  # the label keeps most of the line


@given(st.lists(st.sampled_from(["8.2", "s", "s;", "(6", "inputs,", "4.4", "KB", "a", "checks"]), min_size=1,
                max_size=40), st.integers(14, 60), st.integers(0, 6))
@settings(deadline=None, **profile_examples(1, floor=300))  # cheap: microseconds an example
def test_wrap_words_keeps_words_whole_and_numbers_with_units(words, width, indent):
    """Every word, and a number with its unit ("4.4 KB", "8.2 s;": 6), fits a line here (14 - 6 >= 7):
    none is broken, and a line never ends in a number whose unit starts the next."""
    text = " ".join(words)
    lines = wrap_words(text, width, indent)
    assert all(len(line) <= width for line in lines)
    assert all(line.startswith(" " * indent) for line in lines[1:])
    assert " ".join(" ".join(lines).split()) == text  # every word, in order
    assert [(a, b) for a, b in zip(lines, lines[1:]) if re.search(r"\d$", a) and re.match(r"\s*(s|KB)\b", b)] == []


def test_wrap_words_breaks_a_word_longer_than_the_line_after_a_slash():
    assert wrap_words("at synthetic/well-conditioned/32x64", 20) == ["at", "synthetic/", "well-conditioned/", "32x64"]
    assert wrap_words("took 8.2 s", 8) == ["took", "8.2 s"]
    with pytest.raises(ValueError, match="width"):
        wrap_words("a b", 4, indent=4)
