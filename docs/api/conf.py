"""Sphinx configuration of the API reference and the guides (not shipped: ``docs/`` ships as ``ortho_fast.docs``,
whose files are the guides ``docs/*.md``; this folder is no package).

Build, from the repository root (offline, every warning an error; tests/test_api_reference.py runs it)::

    python -m sphinx -b html -c docs/api -W --keep-going -j 1 docs build/docs/html

The source folder is ``docs/`` (the guides, read by myst-parser); the configuration and the reference pages
(``docs/api/*.rst``) live here. A reference page lists a package with ``.. ortho-all:: PACKAGE``: one
autosummary table and one autodoc entry per name of the package's ``__all__``, read when the page is built,
so the pages follow the code.
"""

from __future__ import annotations

import importlib
import inspect
import re
import warnings

from docutils.statemachine import StringList
from numpydoc.docscrape import NumpyDocString
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.parsing import nested_parse_to_nodes

project = "ortho"
author = "ortho developers"
root_doc = "api/index"  # the source folder is docs/ (the guides); the root page lives beside this file
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",  # the guides' $...$ math (myst's dollarmath); a script link, nothing fetched at build time
    "numpydoc",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
# docs/reproduction/ holds the figures and data docs/reproduction.md shows; no page of its own
exclude_patterns = ["reproduction/**"]

# myst-parser: the guides are GitHub-flavoured markdown with $...$ math; headings get anchors so that
# [text](file.md#heading) links resolve (and a wrong anchor is a warning)
myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 4

# autodoc / autosummary: nothing is generated into the source tree; the pages are built from __all__
autosummary_generate = False
autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "none"  # the numpydoc Parameters sections carry the types, shapes and dtypes
autodoc_preserve_defaults = True  # a default shows as written (e.g. ``TORCH_MUON``), not as its repr

# numpydoc renders the sections; tests/test_docstrings.py (numpydoc.validate) is the checker, so numpydoc's
# own validation stays off here: the build fails on what does not render, the checker on what is missing
numpydoc_validation_checks: set[str] = set()
numpydoc_show_class_members = False  # the methods are autodoc entries (:members:), not a generated table
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False  # types stay text: torch / numpy types would need intersphinx (network)

# no suppress_warnings: every warning category fails the build (-W)

html_theme = "alabaster"
html_static_path: list[str] = []
html_copy_source = False
html_show_sourcelink = False


def _entry(package: str, name: str, obj: object) -> list[str]:
    target = f"{package}.{name}"
    if inspect.ismodule(obj):
        return [f".. automodule:: {obj.__name__}", "   :members:", ""]
    if inspect.isclass(obj):
        return [f".. autoclass:: {target}", "   :members:", ""]
    if callable(obj):
        return [f".. autofunction:: {target}", ""]
    return [f".. autodata:: {target}", ""]


class AllNames(SphinxDirective):
    """``.. ortho-all:: PACKAGE``: a summary table and an autodoc entry for each name of ``PACKAGE.__all__``."""

    required_arguments = 1

    def run(self):
        package = self.arguments[0]
        module = importlib.import_module(package)
        names = list(module.__all__)
        lines = [".. autosummary::", ""] + [f"   {package}.{name}" for name in names] + [""]
        for name in names:
            lines += _entry(package, name, getattr(module, name))
        source, _ = self.get_source_info()
        content = StringList(lines, source=f"{source} (ortho-all {package})")
        return nested_parse_to_nodes(self.state, content)


logger = logging.getLogger(__name__)


def _numpydoc_complaints(app, what, name, obj, options, lines):
    """numpydoc reports a section it does not know (``Example`` for ``Examples``, ``Return``) as a Python
    ``UserWarning`` and leaves the section out of the page; here it is a Sphinx warning, so the build fails."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        NumpyDocString("\n".join(lines))
    for complaint in caught:
        logger.warning("%s: %s", name, complaint.message, type="numpydoc", subtype="docstring")


#: Inline literals and interpreted text (``code``, `name`, :math:`...`): markup-free already.
_VERBATIM = re.compile(r"(``.*?``|`[^`]*`)")
#: A star that opens a shape's batch dimensions, ``(*batch, m, n)`` or ``[*shape]``: text, not emphasis.
_SHAPE_STAR = re.compile(r"(?<=[(\[])\*(?=[A-Za-z_])")


def _text(part: str) -> str:
    return _SHAPE_STAR.sub(r"\\*", part.replace("|", r"\|"))


def _plain_text_math(app, what, name, obj, options, lines):
    """Docstrings write plain-text math where reStructuredText reads markup: ``|x|`` (an absolute value) as a
    substitution, ``(*batch, m, n)`` (a shape) as the start of emphasis; the build would stop on "Undefined
    substitution referenced" / "Inline emphasis start-string without end-string". No docstring of these
    packages uses a substitution, nor emphasis right after a parenthesis, so in running text those bars and
    stars are escaped; doctest lines, inline literals and the indented body of a ``::`` block (literal block,
    ``.. math::``) are left as written.
    """
    block = None  # indentation of the line that opened a ``::`` block
    for i, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if block is not None and (not line.strip() or indent > block):
            continue
        block = indent if line.rstrip().endswith("::") else None
        if ("|" in line or "*" in line) and not line.lstrip().startswith((">>>", "...")):
            parts = _VERBATIM.split(line)
            lines[i] = "".join(p if k % 2 else _text(p) for k, p in enumerate(parts))


def setup(app):
    app.add_directive("ortho-all", AllNames)
    app.connect("autodoc-process-docstring", _numpydoc_complaints, priority=400)  # before numpydoc (500)
    app.connect("autodoc-process-docstring", _plain_text_math, priority=600)  # after numpydoc's rendering (500)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
