"""The documentation runs: every code block of README.md and docs/*.md is a test of the suite
(pytest-codeblocks, enabled in pyproject.toml), and a block that cannot run in CI says why with
the plugin's own mark; docs/verification.md's kernel test passes as pasted, under hypothesis's
default deadline; user docs and messages carry no notes of the development process."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

codeblocks = pytest.importorskip("pytest_codeblocks")

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = ("python", "sh", "bash")  # the block languages pytest-codeblocks executes


def _blocks():
    return [(path, block) for path in DOCS for block in codeblocks.extract_from_file(path)
            if block.syntax in RUN]


def test_the_suite_runs_the_docs_code_blocks():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert {"README.md", "docs"} <= set(options["testpaths"]) and "--codeblocks" in options["addopts"].split()
    assert sum(block.syntax == "python" for _, block in _blocks()) >= 8


def test_every_block_runs_or_says_why_not():
    """A block runs (no mark) or carries ``pytest.mark.skip(reason=...)`` with a reason; nothing else."""
    for path, block in _blocks():
        where = f"{path.relative_to(ROOT)}:{block.lineno}"
        for mark in block.marks:
            found = re.fullmatch(r'pytest\.mark\.skip\(reason="([^"]{20,})"\)', mark)
            assert found, f"{where}: {mark!r} — use <!--pytest.mark.skip(reason=\"why it cannot run in CI\")-->"
        if block.syntax != "python":
            assert block.marks, f"{where}: a shell block runs shell commands in CI; mark it skip with the reason"


def test_the_kernel_test_of_the_docs_passes_as_pasted(tmp_path):
    """docs/verification.md's test_my_kernel.py (both blocks), as a user pastes it, with hypothesis's
    default settings (deadline 200 ms) but 3 examples: an example compares with the oracle in
    ~0.1-1 s, so without ``settings(deadline=None)`` it fails with DeadlineExceeded."""
    files: dict[str, str] = {}
    for block in re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "verification.md").read_text(), re.S):
        head = re.match(r"# (test_my_kernel\.py)( \(continued\))?\n", block)
        if head:
            files[head.group(1)] = files.get(head.group(1), "") + "\n" + block
    (tmp_path / "test_my_kernel.py").write_text(files["test_my_kernel.py"])
    (tmp_path / "conftest.py").write_text("from hypothesis import settings\n\n"
                                          "settings.register_profile('few', max_examples=3)\n"
                                          "settings.load_profile('few')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("ORTHO_HYPOTHESIS_PROFILE", "CI")}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "properties",
                          str(tmp_path)], cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout + run.stderr


#: Notes of the development process that do not belong in user documentation or messages.
PROCESS_NOTES = re.compile(r"\bissue \d+|\bthis issue\b|\bthe issue\b|\bpart [AB]\b|\b(this|last|previous|earlier) "
                           r"round\b|\bround of\b", re.I)


def test_no_process_notes_in_the_user_docs():
    hits = [f"{path.relative_to(ROOT)}:{i}: {line.strip()[:80]}" for path in DOCS if path.name != "tolerances.md"
            for i, line in enumerate(path.read_text().splitlines(), 1) if PROCESS_NOTES.search(line)]
    assert not hits, "\n".join(hits)


def _messages(path: Path) -> list[tuple[int, str]]:
    """(line, text) of the string constants of ``path`` that are not docstrings or comments."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_messages_cite_documents_through_doc_reference():
    """A message that cites a document of docs/ names the file the user has (``ortho_fast.documents
    .doc_reference``: the wheel ships docs/*.md as ortho_fast/docs/), never a bare repository path."""
    from ortho_fast.documents import DOCS_DIR, doc_reference

    bare = [f"{path.relative_to(ROOT)}:{line}" for folder in ("ortho_fast", "ortho_ref")
            for path in (ROOT / folder).rglob("*.py") if path.name != "documents.py"
            for line, text in _messages(path) if "docs/" in text]
    assert not bare, bare
    cited = doc_reference("compatibility.md", "Presets")
    assert cited.startswith('docs/compatibility.md, "Presets" (') and Path(cited.split("(", 1)[1][:-1]).is_file()
    assert DOCS_DIR.is_dir()
    with pytest.raises(ValueError, match="name: 'nonesuch.md' is not a document"):
        doc_reference("nonesuch.md")
