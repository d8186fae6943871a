"""Run the Examples of docstrings as doctests, as the docstring-example tests of the three
packages do: whitespace normalized, each example with empty globals (it imports what it uses, as a
reader copying it would)."""

from __future__ import annotations

import doctest

OPTIONS = doctest.NORMALIZE_WHITESPACE
FINDER = doctest.DocTestFinder(recurse=False)


def find_examples(obj, name: str) -> list[doctest.DocTest]:
    """The doctests of ``obj``'s own docstring that hold an example, named ``name``."""
    return [t for t in FINDER.find(obj, name, globs={}) if t.examples]


def run_examples(tests: list[doctest.DocTest]) -> tuple[doctest.TestResults, str]:
    """Run ``tests``; (their results, doctest's report of every failure)."""
    out: list[str] = []
    runner = doctest.DocTestRunner(optionflags=OPTIONS)
    for test in tests:
        runner.run(test, out=out.append, clear_globs=True)
    return runner.summarize(verbose=False), "".join(out)
