"""The API reference and the guides build with Sphinx, offline, every warning an error.

The build is the README's command (section "Development"), run as written with the output folder moved
into ``tmp_path``: ``python -m sphinx -b html -c docs/api -W --keep-going -j 1 docs build/docs/html``. The
configuration and the reference pages live in ``docs/api/`` (``docs/`` itself ships as ``ortho_fast.docs``,
and a ``conf.py`` there would ship as a module). Each reference page documents every name of its package's
``__all__``. The build can fail: a temporary project with the same configuration and planted faults (a broken
cross-reference, a broken link in a guide, unclosed emphasis, a section numpydoc does not know, a section with a
short underline) fails with a warning for each, and the same project without them builds clean, plain-text math
(``|x|``, ``(*batch, m, n)``) included.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("sphinx")
pytest.importorskip("numpydoc")
pytest.importorskip("myst_parser")

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "docs" / "api"
PACKAGES = ("ortho_fast", "ortho_ref", "ortho_verify")
TIMEOUT = 300


def _readme_command() -> list[str]:
    """The docs build command of the README, split as the shell would."""
    lines = [line.strip() for line in (ROOT / "README.md").read_text().splitlines() if "-m sphinx" in line]
    assert len(lines) == 1, f"README.md names the docs build once: {lines}"
    return shlex.split(lines[0].lstrip("$ "))


def _sphinx(args: list[str], *, cwd: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    command = _readme_command()
    assert command[:3] == ["python", "-m", "sphinx"] and {"-W", "--keep-going"} <= set(command), command
    out = tmp_path_factory.mktemp("docs") / "html"
    return _sphinx([*command[1:-1], str(out)], cwd=ROOT), out


def test_the_docs_build_without_a_warning(built):
    run, out = built
    messages = [line for line in run.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert run.returncode == 0 and not messages, "\n".join(messages) or run.stdout + run.stderr
    for guide in sorted((ROOT / "docs").glob("*.md")):
        assert (out / f"{guide.stem}.html").is_file(), guide.name


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_has_an_entry(built, package):
    run, out = built
    page = out / "api" / f"{package}.html"
    assert page.is_file(), run.stdout + run.stderr
    anchors = set(re.findall(r'id="([^"]+)"', page.read_text()))
    module = importlib.import_module(package)
    def anchor(name):  # a module in __all__ (ortho_ref.muon_stages) is an automodule entry
        obj = getattr(module, name)
        return f"module-{obj.__name__}" if inspect.ismodule(obj) else f"{package}.{name}"

    missing = [name for name in module.__all__ if anchor(name) not in anchors]
    assert not missing, f"{page.name} lacks {missing}"


PAGE = """\
Planted
=======

See :ref:`a-label-that-exists`.

.. _a-label-that-exists:

Target
------

.. autofunction:: planted.add_one

.. toctree::

   ../guide
"""

DOCSTRING = '''\
def add_one(x):
    """Add one to x of shape (*batch, m, n): |x + 1| ≤ |x| + 1.

    Parameters
    ----------
    x : float
        The input.

    Returns
    -------
    float
        ``x + 1``.

    Examples
    --------
    >>> add_one(1.0)
    2.0
    """
    return x + 1
'''

GUIDE = "# A guide\n\n## Its section\n\nSee [the section](#its-section) and [the page](api/index.rst).\n"

#: (what is planted, text replaced, replacement, what the build says)
PLANTS = [
    ("broken cross-reference", ":ref:`a-label-that-exists`", ":ref:`a-label-that-does-not-exist`",
     "undefined label"),
    ("broken link in a guide", "(#its-section)", "(#no-such-section)", "no-such-section"),
    ("unclosed emphasis", "The input.", "The *input.", "Inline emphasis start-string without end-string"),
    ("section numpydoc does not know", "    Examples\n    --------", "    Exemples\n    --------",
     "Unknown section Exemples"),
    ("section with a short underline", "    Returns\n    -------", "    Returns\n    ---",
     "potentially wrong underline length"),
]


def _project(root: Path, plants=()) -> Path:
    texts = {"api/index.rst": PAGE, "guide.md": GUIDE, "planted.py": DOCSTRING}
    for _, old, new, _ in plants:
        name = next(name for name, text in texts.items() if old in text)
        texts[name] = texts[name].replace(old, new)
    for name, text in texts.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


def _build_project(root: Path) -> subprocess.CompletedProcess:
    return _sphinx(["-m", "sphinx", "-b", "html", "-c", str(CONF), "-W", "--keep-going", "-j", "1", "-q",
                    str(root), str(root / "_out")], cwd=root, pythonpath=str(root))


def test_a_clean_page_builds_clean(tmp_path):
    """The control of the planted faults: the same project builds with no warning (``|x|`` and ``(*batch``
    in a docstring are text, not a substitution or emphasis)."""
    run = _build_project(_project(tmp_path))
    assert run.returncode == 0 and "WARNING" not in run.stderr, run.stderr


def test_planted_faults_fail_the_build(tmp_path):
    run = _build_project(_project(tmp_path, PLANTS))
    assert run.returncode != 0, run.stderr
    warnings = [line for line in run.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    for what, _, _, says in PLANTS:
        assert any(says in line for line in warnings), f"{what}: no warning with {says!r} in\n" + "\n".join(warnings)
