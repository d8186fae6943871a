"""Argument handling shared by the ``ortho-verify`` commands: typo suggestions and path checks.

Every command rejects a bad argument before any work, with a message that names it and exit
code 2 (argparse's usage error); 0 means every check passed, 1 a check failed or the run was
inconclusive (docs/verification.md, "The command line").
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import textwrap
from pathlib import Path

__all__ = ["EXIT_FAILED", "EXIT_PASSED", "EXIT_USAGE", "SuggestingParser", "WholeWordsFormatter", "check_folder",
           "check_output_file", "check_readable_file", "suggestion"]

EXIT_PASSED, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def suggestion(word: str, choices) -> str:
    """" (did you mean 'x'?)" for the closest of ``choices`` (``difflib.get_close_matches``,
    cutoff 0.6), else ""."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class WholeWordsFormatter(argparse.HelpFormatter):
    """``argparse.HelpFormatter`` that never breaks a word: lines break at spaces only, so an option
    name ("--no-real"), a path or a number with its unit ("14 s") stays on one line (argparse's
    default breaks after hyphens). The width is argparse's: ``COLUMNS`` (or the terminal's) minus 2."""

    def _split_lines(self, text, width):
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False) or [""]

    def _fill_text(self, text, width, indent):
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False,
                             break_long_words=False)


class SuggestingParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors suggest the closest subcommand, choice or
    option: "invalid choice: 'shardin' ... (did you mean 'sharding'?)", "unrecognized arguments:
    --quik (did you mean '--quick'?)" (each unknown word named once). Exit code 2, as argparse's.
    Its help wraps at whole words (``WholeWordsFormatter``, unless ``formatter_class`` is given)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", WholeWordsFormatter)
        super().__init__(*args, **kwargs)

    def _option_strings(self) -> list[str]:
        return [s for action in self._actions for s in action.option_strings]

    def error(self, message: str):
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            options = re.findall(r"'([^']*)'", choice.group(2)) or [c.strip() for c in choice.group(2).split(",")]
            message += suggestion(choice.group(1), options)
        unknown = re.match(r"unrecognized arguments: (.*)", message)
        if unknown:  # each unknown word once, followed by its suggestion if there is one
            message = "unrecognized arguments: " + " ".join(
                word + suggestion(word, self._option_strings() if word.startswith("-") else self._subcommands())
                for word in unknown.group(1).split())
        super().error(message)

    def _subcommands(self) -> list[str]:
        return [name for action in self._actions if isinstance(getattr(action, "choices", None), dict)
                for name in action.choices]


def check_folder(parser: argparse.ArgumentParser, option: str, path: Path | None) -> None:
    """Usage error (exit 2) naming ``option`` unless ``path`` is a writable folder or can be
    created as one; creates it. None passes."""
    if path is None:
        return
    if path.exists() and not path.is_dir():
        parser.error(f"{option} {path}: exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        parser.error(f"{option} {path}: cannot create the folder ({err.strerror or err})")
    if not os.access(path, os.W_OK | os.X_OK):
        parser.error(f"{option} {path}: the folder is not writable")


def check_output_file(parser: argparse.ArgumentParser, option: str, path: Path | None) -> None:
    """Usage error naming ``option`` unless ``path`` can be written: not a folder, its parent
    a folder that exists or can be created (created) and is writable. None passes."""
    if path is None:
        return
    if path.is_dir():
        parser.error(f"{option} {path}: is a folder, expected a file")
    check_folder(parser, f"{option} {path}: its folder", path.parent if str(path.parent) else Path("."))


def check_readable_file(parser: argparse.ArgumentParser, option: str, path: Path) -> None:
    """Usage error naming ``option`` unless ``path`` is a readable file."""
    if not path.is_file():
        parser.error(f"{option} {path}: {'is a folder' if path.is_dir() else 'no such file'}")
    if not os.access(path, os.R_OK):
        parser.error(f"{option} {path}: not readable")
