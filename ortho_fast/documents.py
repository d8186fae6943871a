"""Where the user documentation is: the wheel ships ``docs/*.md`` as ``ortho_fast/docs/`` (package
data, pyproject.toml), so that an error message citing a document names a file the user has; a
source checkout or an editable install reads the repository's ``docs/``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DOCS_DIR", "doc_path", "doc_reference"]

_HERE = Path(__file__).resolve().parent
#: The folder of the documents: ``ortho_fast/docs`` in an installed wheel, else the checkout's ``docs/``.
DOCS_DIR = _HERE / "docs" if (_HERE / "docs").is_dir() else _HERE.parent / "docs"


def doc_path(name: str) -> Path:
    """The path of the document ``name`` ("compatibility.md") under ``DOCS_DIR``.
    Raises: ValueError naming ``name`` when it is not a document of the package."""
    path = DOCS_DIR / name
    if "/" in name or "\\" in name or not name.endswith(".md") or not path.is_file():
        raise ValueError(f"name: {name!r} is not a document of ortho-optim (expected one of "
                         f"{sorted(p.name for p in DOCS_DIR.glob('*.md'))})")
    return path


def doc_reference(name: str, section: str | None = None) -> str:
    """How a message cites a document: 'docs/compatibility.md, "Presets" (<its path here>)' — the
    name every page of the documentation uses, and the file on this machine."""
    where = f'docs/{name}, "{section}"' if section else f"docs/{name}"
    return f"{where} ({doc_path(name)})"
