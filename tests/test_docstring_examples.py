"""The Examples section of every public function and class of ``ortho_fast`` and ``ortho_verify``
runs as a doctest (``ortho_ref``'s: tests/ortho_ref/test_docstring_examples.py).

Every function and class of ours in a package's ``__all__`` has at least one example, and each
example prints what its docstring says (doctest's exact comparison, whitespace normalized). Each
runs with empty globals: it imports what it uses, as a reader copying it would (an example that
leaned on its module's own imports failed this way). A planted wrong output fails.
"""

from __future__ import annotations

import doctest
import importlib
import inspect

import pytest

from tests.doctests import find_examples, run_examples

PACKAGES = ("ortho_fast", "ortho_verify")


def _public(package: str) -> dict:
    module = importlib.import_module(package)
    return {f"{package}.{name}": getattr(module, name) for name in module.__all__
            if (inspect.isfunction(getattr(module, name)) or inspect.isclass(getattr(module, name)))
            and getattr(module, name).__module__.startswith(package)}


PUBLIC = {k: v for package in PACKAGES for k, v in _public(package).items()}


def _doctests(name: str) -> list[doctest.DocTest]:
    return find_examples(PUBLIC[name], name)



def test_every_public_object_is_found():
    assert {"ortho_fast.Muon", "ortho_fast.newton_schulz", "ortho_verify.check_orthogonalizer",
            "ortho_verify.identify_optimizer"} <= set(PUBLIC)
    assert len(PUBLIC) >= 25, sorted(PUBLIC)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_examplesrun_examples(name):
    tests = _doctests(name)
    assert tests, f"{name}: no Examples to run"
    results, report = run_examples(tests)
    assert results.attempted >= 1
    assert results.failed == 0, report


@pytest.mark.parametrize("name", ["ortho_fast.newton_schulz", "ortho_fast.CoefficientSchedule",
                                  "ortho_verify.MuonConventions", "ortho_verify.ShardedReport"])
def test_a_planted_wrong_output_fails(name):
    # the last example that prints something gets an output it does not print: the run must fail
    tests = _doctests(name)
    printing = [ex for t in tests for ex in t.examples if ex.want.strip()]
    assert printing, f"{name}: no example shows an output"
    printing[-1].want = "planted " + printing[-1].want
    results, report = run_examples(tests)
    assert results.failed == 1 and "planted" in report, report
