"""The Examples section of every public function and class of ``ortho_ref`` runs as a doctest.

Every name in ``ortho_ref.__all__`` that is a function or a class of ours has at least one example,
and each example prints what its docstring says (doctest's exact comparison of the printed output,
whitespace normalized); so does every example of a public name of an ``ortho_ref`` module (its
``__all__``), e.g. ``ortho_ref.qk_clip.qk_clip``. The examples use numpy and mpmath only; run in a
fresh interpreter they import no torch. A planted wrong output fails, for every object.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest

import ortho_ref
from tests.doctests import find_examples, run_examples


def _public_objects():
    for name in ortho_ref.__all__:
        obj = getattr(ortho_ref, name)
        if (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__.startswith("ortho_ref"):
            yield name, obj


PUBLIC = dict(_public_objects())


def _module_objects_with_examples():
    """Public functions and classes of ortho_ref's modules, beyond the package's names, that have examples."""
    seen = {id(obj) for obj in PUBLIC.values()}
    for info in pkgutil.iter_modules(ortho_ref.__path__):
        module = importlib.import_module(f"ortho_ref.{info.name}")
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            ours = inspect.isfunction(obj) or inspect.isclass(obj)
            if ours and id(obj) not in seen and ">>>" in (obj.__doc__ or ""):
                seen.add(id(obj))
                yield f"{info.name}.{name}", obj


MODULE_EXAMPLES = dict(_module_objects_with_examples())


def _doctests(name: str, obj) -> list[doctest.DocTest]:
    return find_examples(obj, f"ortho_ref.{name}")



def test_every_public_object_is_found():
    assert len(PUBLIC) >= 50, sorted(PUBLIC)
    assert {"ns_map", "polar", "dion_step", "muon_step", "DionStep"} <= set(PUBLIC)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_examplesrun_examples(name):
    tests = _doctests(name, PUBLIC[name])
    assert tests, f"ortho_ref.{name}: no Examples to run"
    results, report = run_examples(tests)
    assert results.attempted >= 1
    assert results.failed == 0, report


@pytest.mark.parametrize("name", sorted(MODULE_EXAMPLES))
def test_module_examplesrun_examples(name):
    results, report = run_examples(_doctests(name, MODULE_EXAMPLES[name]))
    assert results.attempted >= 1
    assert results.failed == 0, report


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_a_planted_wrong_output_fails(name):
    # the last example that prints something gets an output it does not print: the run must fail
    tests = _doctests(name, PUBLIC[name])
    printing = [ex for t in tests for ex in t.examples if ex.want.strip()]
    assert printing, f"ortho_ref.{name}: no example shows an output"
    printing[-1].want = "planted " + printing[-1].want
    results, report = run_examples(tests)
    assert results.failed == 1, report
    assert "planted" in report


def test_examples_import_no_torch():
    # a fresh interpreter: the test process itself may hold torch through other packages' plugins
    code = (
        "import doctest, sys, ortho_ref\n"
        "finder = doctest.DocTestFinder(recurse=False)\n"
        "runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)\n"
        "for name in ortho_ref.__all__:\n"
        "    for t in finder.find(getattr(ortho_ref, name), name, globs={}):\n"
        "        runner.run(t, out=lambda s: None)\n"
        "assert runner.summarize(verbose=False).failed == 0\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
