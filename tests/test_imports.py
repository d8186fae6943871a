"""The import rules of docs/design.md, "Layers and import rules", checked on the source by ``ast``.

Every module of ``ortho_ref/``, ``ortho_fast/`` and ``verify/`` (imported as ``ortho_verify``) is
parsed, imports inside functions included, and these rules hold:

- ``cycle``: no import cycle between modules of the project;
- ``private-import``: no private name (``_x``) imported from another module of the project, nor
  read as an attribute of one (``_validate._helper``); a public name of a private module of the
  same package (``from ._validate import check_finite``) is fine;
- ``private-use``: tests, benchmarks and scripts neither import a private name of the project nor
  read or patch an attribute ``_x`` of a project module (aliases such as
  ``import ortho_fast.dion as fast_dion`` are followed; ``monkeypatch.setattr(module, "_x", ...)``
  and ``mock.patch("ortho_fast.dion._x")`` count). A private is patched only through a documented
  seam: a public function whose docstring says it is a patch point;
- ``oracle-dependencies``: ``ortho_ref`` imports only numpy, scipy, mpmath and the standard library;
- ``product-independence``: ``ortho_fast`` imports neither ``ortho_ref`` nor ``ortho_verify``;
- ``judge-name``: nothing imports the folder name ``verify``: the judge is ``ortho_verify``.

Also: no ``.py`` file of the repository over 500 lines, and every package folder listed in
pyproject's ``packages``. Each rule has a test that it catches a violation planted in a synthetic
module tree. Messages name the file, the line and the rule.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
#: import name -> folder of each package of the project
PACKAGES = {"ortho_ref": "ortho_ref", "ortho_fast": "ortho_fast", "ortho_verify": "verify"}
#: folders whose code uses the packages from outside
CLIENTS = ("tests", "benchmarks", "scripts")
ORACLE_ALLOWED = {"numpy", "scipy", "mpmath", "ortho_ref"} | set(sys.stdlib_module_names)
MAX_LINES = 500
PATCHERS = {"setattr", "getattr", "delattr", "hasattr", "object"}  # monkeypatch.setattr, mock.patch.object, ...


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def project_modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` of the packages' folders."""
    modules = {}
    for name, folder in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = [name, *path.relative_to(root / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _imports(tree: ast.AST, module: str | None, is_package: bool, modules: dict):
    """(line, imported module, imported name or None, bound alias -> module) for every import,
    relative ones resolved; ``from p import m`` with m a module yields the module p.m."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                bound = {alias.asname: alias.name} if alias.asname else {top: top}
                yield node.lineno, alias.name, None, bound
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if module is None:
                    continue
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for alias in node.names:
                full = f"{target}.{alias.name}"
                if full in modules:
                    yield node.lineno, full, None, {alias.asname or alias.name: full}
                else:
                    yield node.lineno, target, alias.name, {}


def _attribute_chain(node: ast.Attribute) -> tuple[str, list[str]] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return (node.id, parts[::-1]) if isinstance(node, ast.Name) else None


def _private_attribute(module: str, attrs: list[str], modules: dict) -> tuple[str, str] | None:
    """The (module, _name) reached by following ``attrs`` from ``module`` through submodules."""
    for attr in attrs:
        if _private(attr):
            return module, attr
        if f"{module}.{attr}" not in modules:
            return None
        module = f"{module}.{attr}"
    return None


def _private_uses(tree: ast.AST, aliases: dict, modules: dict):
    """(line, detail) for every read or patch of a private attribute of a project module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "ctx", None), ast.Del):
            chain = _attribute_chain(node)
            if chain and chain[0] in aliases:
                hit = _private_attribute(aliases[chain[0]], chain[1], modules)
                if hit and len(chain[1]) == chain[1].index(hit[1]) + 1:  # report the full chain once
                    yield node.lineno, f"{hit[0]}.{hit[1]}"
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            args = node.args
            if name in PATCHERS and len(args) >= 2 and isinstance(args[1], ast.Constant) \
                    and isinstance(args[1].value, str) and _private(args[1].value):
                target = args[0]
                chain = (target.id, []) if isinstance(target, ast.Name) else (
                    _attribute_chain(target) if isinstance(target, ast.Attribute) else None)
                if chain and chain[0] in aliases:
                    mod = aliases[chain[0]]
                    for attr in chain[1]:
                        mod = f"{mod}.{attr}" if f"{mod}.{attr}" in modules else None
                        if mod is None:
                            break
                    if mod:
                        yield node.lineno, f"{mod}.{args[1].value} (patched by {name})"
            for arg in args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) \
                        and arg.value.split(".")[0] in PACKAGES and any(map(_private, arg.value.split(".")[1:])):
                    yield node.lineno, f"{arg.value} (patched by {name})"


def _sorted(problems: list[str]) -> list[str]:
    """Without repeats, by file and line."""
    def key(problem):
        file, line = problem.split(":")[:2]
        return file, int(line) if line.isdigit() else 0
    return sorted(dict.fromkeys(problems), key=key)


def _relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def check_packages(root: Path) -> list[str]:
    """Violations of every rule but ``private-use`` in the packages of ``root``."""
    modules = project_modules(root)
    problems, edges = [], {}
    for module, path in modules.items():
        rel, top = _relative(path, root), module.split(".")[0]
        tree = ast.parse(path.read_text(), filename=str(path))
        aliases = {}
        for line, target, name, bound in _imports(tree, module, path.name == "__init__.py", modules):
            aliases.update({k: v for k, v in bound.items() if v.split(".")[0] in PACKAGES})
            first = target.split(".")[0]
            if first == "verify":
                problems.append(f"{rel}:{line}: judge-name: imports `{target}`; the judge is `ortho_verify`")
            if top == "ortho_ref" and first not in ORACLE_ALLOWED:
                problems.append(f"{rel}:{line}: oracle-dependencies: ortho_ref imports `{target}` "
                                "(only numpy, scipy, mpmath and the standard library)")
            if top == "ortho_fast" and first in ("ortho_ref", "ortho_verify"):
                problems.append(f"{rel}:{line}: product-independence: ortho_fast imports `{target}`")
            if first not in PACKAGES:
                continue
            if target in modules and target != module:
                edges.setdefault(module, {}).setdefault(target, line)
            elif target not in modules and target.rsplit(".", 1)[0] in modules:
                edges.setdefault(module, {}).setdefault(target.rsplit(".", 1)[0], line)
            private_modules = [p for p in target.split(".")[1:] if _private(p)]
            if name is not None and _private(name) and target != module:
                problems.append(f"{rel}:{line}: private-import: `{name}` imported from `{target}`")
            elif private_modules and first != top:
                problems.append(f"{rel}:{line}: private-import: private module `{target}` of another package")
        for line, detail in _private_uses(tree, aliases, modules):
            if not detail.startswith(module + "._"):
                problems.append(f"{rel}:{line}: private-import: reads `{detail}` of another module")
    return _sorted(problems) + _cycles(edges, modules, root)


def _cycles(edges: dict, modules: dict, root: Path) -> list[str]:
    """One message per strongly connected component (Tarjan), naming a concrete cycle."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(modules) + 100))
    try:
        for v in sorted(modules):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    messages = []
    for component in found:
        start = min(component)
        path, seen, frontier = {start: [start]}, {start}, [start]
        cycle = None
        while frontier and cycle is None:  # breadth-first back to start inside the component
            nxt = []
            for v in frontier:
                for w in sorted(edges.get(v, {})):
                    if w == start:
                        cycle = path[v] + [start]
                        break
                    if w in component and w not in seen:
                        seen.add(w)
                        path[w] = path[v] + [w]
                        nxt.append(w)
                if cycle:
                    break
            frontier = nxt
        steps = [f"{_relative(modules[a], root)}:{edges[a][b]} imports {b}" for a, b in zip(cycle, cycle[1:])]
        messages.append(f"{_relative(modules[start], root)}:{edges[start][cycle[1]]}: cycle: "
                        + " -> ".join(cycle) + " (" + "; ".join(steps) + ")")
    return messages


def check_clients(root: Path) -> list[str]:
    """``private-use`` and ``judge-name`` in the tests, benchmarks and scripts of ``root``."""
    modules = project_modules(root)
    problems = []
    for folder in CLIENTS:
        for path in sorted((root / folder).rglob("*.py")):
            rel = _relative(path, root)
            tree = ast.parse(path.read_text(), filename=str(path))
            aliases = {}
            for line, target, name, bound in _imports(tree, None, False, modules):
                first = target.split(".")[0]
                if first == "verify":
                    problems.append(f"{rel}:{line}: judge-name: imports `{target}`; the judge is `ortho_verify`")
                if first not in PACKAGES:
                    continue
                aliases.update({k: v for k, v in bound.items() if v.split(".")[0] in PACKAGES})
                if name is not None and _private(name):
                    problems.append(f"{rel}:{line}: private-use: imports the private `{name}` from `{target}`")
                elif any(map(_private, target.split(".")[1:])):
                    problems.append(f"{rel}:{line}: private-use: imports from the private module `{target}`")
            for line, detail in _private_uses(tree, aliases, modules):
                problems.append(f"{rel}:{line}: private-use: reads or patches `{detail}`")
    return _sorted(problems)


def long_files(root: Path) -> list[str]:
    folders = [*PACKAGES.values(), *CLIENTS]
    return [f"{_relative(p, root)}:{MAX_LINES + 1}: file-length: {n} lines (at most {MAX_LINES}; split by subject)"
            for folder in folders for p in sorted((root / folder).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES]


def unlisted_packages(root: Path) -> list[str]:
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    data_only = {p for p, folder in config.get("package-dir", {}).items()  # e.g. docs/ shipped as ortho_fast/docs
                 if "." in p and not list((root / folder).glob("*.py"))}
    listed = set(config["packages"]) - data_only
    found = {".".join([name, *p.parent.relative_to(root / folder).parts])
             for name, folder in PACKAGES.items() for p in (root / folder).rglob("__init__.py")}
    return ([f"pyproject.toml: packages: `{p}` (a folder with __init__.py) is not listed"
             for p in sorted(found - listed)]
            + [f"pyproject.toml: packages: `{p}` is listed but has no __init__.py" for p in sorted(listed - found)])


def _report(problems: list[str]) -> str:
    return f"{len(problems)} violation(s):\n" + "\n".join(problems)


def test_packages_follow_the_import_rules():
    problems = check_packages(ROOT)
    assert not problems, _report(problems)


def test_tests_benchmarks_scripts_use_no_private_names():
    problems = check_clients(ROOT)
    assert not problems, _report(problems)


def test_no_file_over_500_lines():
    problems = long_files(ROOT)
    assert not problems, _report(problems)


def test_every_package_folder_is_listed_in_pyproject():
    problems = unlisted_packages(ROOT)
    assert not problems, _report(problems)


# ---- each rule catches a planted violation (synthetic module trees) --------------------------------

def _tree(root: Path, files: dict[str, str]) -> Path:
    for name in ("ortho_ref", "ortho_fast", "verify", "tests", "benchmarks", "scripts"):
        (root / name).mkdir(parents=True, exist_ok=True)
    for name in PACKAGES.values():
        (root / name / "__init__.py").touch()
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_rule_catches_a_cycle_through_a_function_level_import(tmp_path):
    root = _tree(tmp_path, {"ortho_ref/a.py": "from .b import g\n",
                            "ortho_ref/b.py": "def g():\n    from .a import f\n    return f\n"})
    problems = check_packages(root)
    assert len(problems) == 1 and "cycle" in problems[0] and "ortho_ref/a.py:1" in problems[0], problems
    assert "ortho_ref/b.py:2 imports ortho_ref.a" in problems[0]


def test_rule_catches_a_cycle_across_packages_and_through_a_package(tmp_path):
    root = _tree(tmp_path, {"verify/x.py": "import ortho_verify.y\n",
                            "verify/y.py": "from ortho_verify import x\n"})
    assert [p for p in check_packages(root) if ": cycle:" in p]


def test_rule_catches_a_private_import_but_not_a_public_name_of_a_private_module(tmp_path):
    root = _tree(tmp_path,
                 {"ortho_fast/_validate.py": "def check_finite(x):\n    return x\n\ndef _helper():\n    pass\n",
                            "ortho_fast/muon.py": "from ._validate import check_finite\nfrom . import _validate\n",
                            "ortho_fast/dion.py": "def f():\n    from .muon import _layout\n",
                            "ortho_fast/qr.py": "from . import _validate\n_validate._helper()\n"})
    problems = sorted(check_packages(root))
    assert len(problems) == 2, problems
    assert problems[0].startswith("ortho_fast/dion.py:2: private-import: `_layout`")
    assert problems[1].startswith("ortho_fast/qr.py:2: private-import: reads `ortho_fast._validate._helper`")


def test_rule_catches_a_private_module_of_another_package(tmp_path):
    root = _tree(tmp_path, {"ortho_fast/_state.py": "X = 1\n", "verify/checks.py": "from ortho_fast._state import X\n"})
    assert [p for p in check_packages(root) if p.startswith("verify/checks.py:1: private-import")]


def test_rule_catches_private_use_in_tests_benchmarks_and_scripts(tmp_path):
    root = _tree(tmp_path, {
        "ortho_fast/dion.py": "def _cholesky_solve():\n    pass\n",
        "tests/test_a.py": ("import ortho_fast.dion as fast_dion\n"
                            "def test(monkeypatch):\n"
                            "    monkeypatch.setattr(fast_dion, '_cholesky_solve', None)\n"
                            "    fast_dion._cholesky_solve()\n"),
        "tests/test_b.py": "from ortho_fast.dion import _cholesky_solve\n",
        "benchmarks/bench.py": "import ortho_fast\northo_fast.dion._cholesky_solve()\n",
        "scripts/s.py": "from unittest import mock\nmock.patch('ortho_fast.dion._cholesky_solve')\n",
        "tests/test_ok.py": "from ortho_fast import dion\nimport ortho_fast\ndion.__name__, ortho_fast.__version__\n",
    })
    problems = sorted(check_clients(root))
    assert [p.split(": private-use")[0] for p in problems] == [
        "benchmarks/bench.py:2", "scripts/s.py:2", "tests/test_a.py:3", "tests/test_a.py:4",
        "tests/test_b.py:1"], problems


def test_rule_catches_torch_or_a_third_party_in_the_oracle(tmp_path):
    root = _tree(tmp_path, {"ortho_ref/polar.py": "import numpy, scipy.linalg, mpmath, math\n"
                                                  "def f():\n    import torch\n    from rich import table\n"})
    problems = check_packages(root)
    assert [p.split(": oracle")[0] for p in problems] == ["ortho_ref/polar.py:3", "ortho_ref/polar.py:4"], problems


def test_rule_catches_the_product_importing_the_oracle_or_the_judge(tmp_path):
    root = _tree(tmp_path, {"ortho_fast/muon.py": "def f():\n    import ortho_ref\n",
                            "ortho_fast/dion.py": "from ortho_verify.checks import x\n",
                            "verify/checks.py": "import ortho_ref, ortho_fast\nx = 1\n"})
    problems = sorted(p for p in check_packages(root) if "product-independence" in p)
    assert [p.split(": product")[0] for p in problems] == ["ortho_fast/dion.py:1", "ortho_fast/muon.py:2"], problems


def test_rule_catches_an_import_of_the_folder_name_verify(tmp_path):
    root = _tree(tmp_path, {"verify/cli.py": "from verify.checks import run\n", "tests/test_x.py": "import verify\n"})
    assert [p.split(":")[0] for p in check_packages(root) + check_clients(root) if "judge-name" in p] == [
        "verify/cli.py", "tests/test_x.py"]


def test_rule_catches_a_long_file(tmp_path):
    root = _tree(tmp_path, {"tests/test_long.py": "x = 1\n" * (MAX_LINES + 1), "scripts/ok.py": "x = 1\n" * MAX_LINES})
    assert [p.split(":")[0] for p in long_files(root)] == ["tests/test_long.py"]


def test_rule_catches_an_unlisted_package(tmp_path):
    root = _tree(tmp_path, {"verify/sharding/__init__.py": "", "pyproject.toml":
                            '[tool.setuptools]\npackages = ["ortho_ref", "ortho_fast", "ortho_verify", '
                            '"ortho_fast.gone"]\n'})
    assert unlisted_packages(root) == [
        "pyproject.toml: packages: `ortho_verify.sharding` (a folder with __init__.py) is not listed",
        "pyproject.toml: packages: `ortho_fast.gone` is listed but has no __init__.py"]


def test_the_judge_lists_its_public_names():
    """``dir(ortho_verify)`` shows every name of ``__all__`` (lazily imported), and each resolves."""
    import ortho_verify

    assert set(ortho_verify.__all__) <= set(dir(ortho_verify))
    for name in ortho_verify.__all__:
        assert getattr(ortho_verify, name) is not None, name
