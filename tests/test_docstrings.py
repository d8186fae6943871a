"""The public API's docstrings are in numpydoc sections, checked by numpydoc's own validator.

Every function and class named in ``__all__`` of ``ortho_fast``, ``ortho_ref`` and ``ortho_verify``
passes ``numpydoc.validate`` on the codes in ``API_CODES`` (a summary on one line; every parameter
documented with a type and a description, in signature order, and none that does not exist; Returns or
Yields when the object returns or yields; an Examples section), and so does every public method a
public class defines itself, on ``METHOD_CODES`` (the same without Examples). A class docstring is at
most ``CLASS_LINES`` lines: longer explanations belong in ``docs/``.

Codes left out, and why: GL01 (numpydoc's own house style puts the summary on the line after the
quotes; this project puts it on the first line, as PEP 257 and torch do), SS02 to SS05 and PR05, PR06,
PR08, PR09, RT02, RT04, RT05 (capitals, full stops and verb mood: wording, not structure), ES01 (a
one-line rule needs no extended summary), SA01 to SA04 (See Also is optional).
"""

from __future__ import annotations

import importlib
import inspect

import numpydoc.validate
import pytest

PACKAGES = ("ortho_fast", "ortho_ref", "ortho_verify")

#: Structure codes every public method passes (numpydoc.validate.ERROR_MSGS has their wording).
METHOD_CODES = frozenset({
    "GL02", "GL03", "GL05", "GL06", "GL07", "GL08", "GL10",
    "SS01", "SS06",
    "PR01", "PR02", "PR03", "PR04", "PR07", "PR10",
    "RT01", "RT03", "YD01",
})
#: Codes every function and class in a package's ``__all__`` passes: the method codes and an example.
API_CODES = METHOD_CODES | {"EX01"}
#: The longest class docstring, in lines (``inspect.getdoc``).
CLASS_LINES = 60


def _defined_in_packages(obj) -> bool:
    return (getattr(obj, "__module__", "") or "").split(".")[0] in PACKAGES


def _api_objects():
    """(qualified name, object, codes) for every public function, class and public method."""
    seen = set()
    for package in PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            obj = getattr(module, name)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)) or not _defined_in_packages(obj):
                continue  # constants (documented where they are defined) and re-exports of other libraries
            qualified = f"{obj.__module__}.{obj.__qualname__}"
            if qualified in seen:
                continue
            seen.add(qualified)
            yield pytest.param(qualified, obj, API_CODES, id=f"{package}.{name}")
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if attr.startswith("_") or not inspect.isfunction(member):
                        continue
                    yield pytest.param(f"{qualified}.{attr}", member, METHOD_CODES, id=f"{package}.{name}.{attr}")


API_OBJECTS = list(_api_objects())


def test_public_names_are_found():
    # the checker must see the whole public API: every package contributes, none silently skipped
    packages = {param.id.split(".")[0] for param in API_OBJECTS}
    assert packages == set(PACKAGES), packages


@pytest.mark.parametrize(("qualified", "obj", "codes"), API_OBJECTS)
def test_numpydoc_sections(qualified, obj, codes):
    result = numpydoc.validate.validate(qualified)
    errors = [f"{code}: {message}" for code, message in result["errors"] if code in codes]
    assert not errors, f"{qualified} ({result['file']}:{result['file_line']}):\n  " + "\n  ".join(errors)


@pytest.mark.parametrize(("qualified", "obj", "codes"), [p for p in API_OBJECTS if inspect.isclass(p.values[1])])
def test_class_docstring_length(qualified, obj, codes):
    lines = len(inspect.getdoc(obj).splitlines()) if obj.__doc__ else 0
    assert lines <= CLASS_LINES, f"{qualified}: {lines} lines (at most {CLASS_LINES}; essays go in docs/)"


def test_checker_catches_a_missing_parameter():
    # the validator must be able to fail: a function whose docstring omits a parameter gets PR01
    result = numpydoc.validate.validate("tests.test_docstrings._undocumented_parameter")
    assert "PR01" in {code for code, _ in result["errors"]}


def _undocumented_parameter(x, y):
    """Add two numbers.

    Parameters
    ----------
    x : float
        The first.

    Returns
    -------
    float
        The sum.
    """
    return x + y
