"""The judge's layout, checked on the source by ``ast``: rooms a reader can name from the tree.

``verify/`` (imported as ``ortho_verify``) groups its modules by role into subpackages (``checks``,
``inputs``, ``report``, ``cli``, ``planted``, ``sharding``, ``reproduce``, ``identify``,
``frameworks``, ``tolerances``); its root keeps the public entry points. These rules hold:

- ``root-size``: at most ``MAX_ROOT_MODULES`` ``.py`` files at ``verify/``'s root (``__init__.py``
  and ``__main__.py`` counted);
- ``absolute-self-import``: no module of the judge imports ``ortho_verify`` by its absolute name
  (``from ..checks import x``, ``from .results import y``), so that the structure is visible in
  the imports; ``ortho_fast`` and ``ortho_ref`` stay absolute;
- ``root-docstring``: every root module opens with a docstring whose first line is a one-line
  summary (the whole docstring, or followed by a blank line).

Each rule has a test that it catches a violation planted in a synthetic tree. Messages name the
file, the line and the rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The folder of the judge (import name ``ortho_verify``).
JUDGE = "verify"
#: At most this many modules at the judge's root: the public entry points, the rest in subpackages.
MAX_ROOT_MODULES = 15


def root_size(root: Path) -> list[str]:
    """``root-size``: one message if ``verify/`` holds more than ``MAX_ROOT_MODULES`` ``.py`` files."""
    modules = sorted(p.name for p in (root / JUDGE).glob("*.py"))
    if len(modules) <= MAX_ROOT_MODULES:
        return []
    return [f"{JUDGE}/: root-size: {len(modules)} modules at the root (at most {MAX_ROOT_MODULES}; "
            f"group them by role into subpackages): {', '.join(modules)}"]


def absolute_self_imports(root: Path) -> list[str]:
    """``absolute-self-import``: every ``import ortho_verify...`` / ``from ortho_verify... import``
    in a module of the judge, imports inside functions included."""
    problems = []
    for path in sorted((root / JUDGE).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                if name.split(".")[0] == "ortho_verify":
                    problems.append(f"{rel}:{node.lineno}: absolute-self-import: imports `{name}`; "
                                    "inside the judge import it relatively (`from .x import y`)")
    return problems


def root_docstrings(root: Path) -> list[str]:
    """``root-docstring``: every root module of the judge without a one-line summary."""
    problems = []
    for path in sorted((root / JUDGE).glob("*.py")):
        rel = path.relative_to(root).as_posix()
        doc = ast.get_docstring(ast.parse(path.read_text(), filename=str(path)), clean=False)
        lines = (doc or "").splitlines()
        if not lines or not lines[0].strip():
            problems.append(f"{rel}:1: root-docstring: no module docstring opening with a summary line")
        elif len(lines) > 1 and lines[1].strip():
            problems.append(f"{rel}:1: root-docstring: the summary runs over its first line "
                            "(one line, then a blank line, then the rest)")
    return problems


def _report(problems: list[str]) -> str:
    return f"{len(problems)} violation(s):\n" + "\n".join(problems)


def test_the_judge_root_holds_at_most_15_modules():
    problems = root_size(ROOT)
    assert not problems, _report(problems)


def test_the_judge_imports_itself_relatively():
    problems = absolute_self_imports(ROOT)
    assert not problems, _report(problems)


def test_every_root_module_of_the_judge_opens_with_a_one_line_summary():
    problems = root_docstrings(ROOT)
    assert not problems, _report(problems)


# ---- each rule catches a planted violation (synthetic trees) ----------------------------------------

def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_rule_catches_a_crowded_root(tmp_path):
    ok = {f"{JUDGE}/m{i}.py": '"""M."""\n' for i in range(MAX_ROOT_MODULES)}
    assert root_size(_tree(tmp_path, ok)) == []
    problems = root_size(_tree(tmp_path, {f"{JUDGE}/one_more.py": '"""M."""\n',
                                          f"{JUDGE}/room/inside.py": '"""Not at the root."""\n'}))
    assert len(problems) == 1 and f"{MAX_ROOT_MODULES + 1} modules" in problems[0], problems


def test_rule_catches_absolute_self_imports_but_not_relative_or_other_packages(tmp_path):
    root = _tree(tmp_path, {
        f"{JUDGE}/__init__.py": '"""J."""\n',
        f"{JUDGE}/a.py": '"""A."""\nfrom ortho_verify.b import x\nimport ortho_fast\nfrom ortho_ref import mp\n',
        f"{JUDGE}/room/c.py": ('"""C.\n\n>>> from ortho_verify import check_optimizer\n"""\n'
                               "from ..a import y\nfrom . import d\n\n\ndef f():\n    import ortho_verify.a\n"
                               "    from ortho_verify import api\n"),
    })
    problems = absolute_self_imports(root)
    assert [p.split(": absolute")[0] for p in problems] == [f"{JUDGE}/a.py:2", f"{JUDGE}/room/c.py:10",
                                                           f"{JUDGE}/room/c.py:11"], problems


def test_rule_catches_a_missing_or_run_on_summary(tmp_path):
    root = _tree(tmp_path, {
        f"{JUDGE}/good.py": '"""One line.\n\nMore text.\n"""\n',
        f"{JUDGE}/single.py": '"""One line only."""\n',
        f"{JUDGE}/none.py": "x = 1\n",
        f"{JUDGE}/run_on.py": '"""A summary that\nruns over two lines.\n"""\n',
        f"{JUDGE}/blank.py": '"""\nSummary on the second line.\n"""\n',
        f"{JUDGE}/room/deep.py": "x = 1\n",
    })
    problems = root_docstrings(root)
    assert [p.split(":")[0] for p in problems] == [f"{JUDGE}/blank.py", f"{JUDGE}/none.py", f"{JUDGE}/run_on.py"]
    assert "runs over its first line" in problems[2]
