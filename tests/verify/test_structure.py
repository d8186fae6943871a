"""The judge's own layout: imports go one way (no cycle between ``ortho_verify`` modules, imports
inside functions included), no private name is imported from another module of the project,
the tests reach ``ortho_verify`` through public names only, and no file is over 500 lines."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: import name -> folder of each package of the project.
PACKAGES = {"ortho_ref": ROOT / "ortho_ref", "ortho_fast": ROOT / "ortho_fast", "ortho_verify": ROOT / "verify"}
MAX_LINES = 500


def _modules(package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of ``package``."""
    folder = PACKAGES[package]
    out = {}
    for path in sorted(folder.rglob("*.py")):
        parts = [package, *path.relative_to(folder).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(module: str, path: Path) -> list[tuple[str, str | None]]:
    """(imported module, imported name or None) of every import in the file, at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            out += [(target, alias.name) for alias in node.names]
    return out


def _graph() -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """Edges between ``ortho_verify`` modules, and every (module, source, private name) import of a
    private name from another module of the project."""
    mods = _modules("ortho_verify")
    project = {m for p in PACKAGES for m in _modules(p)}
    edges: dict[str, set[str]] = {m: set() for m in mods}
    private = []
    for mod, path in mods.items():
        for target, name in _imports(mod, path):
            full = f"{target}.{name}" if name else target
            if full in mods:
                edges[mod].add(full)
            elif target in mods:
                edges[mod].add(target)
            if name and name.startswith("_") and target.split(".")[0] in PACKAGES and target != mod \
                    and (target in project or target.split(".")[0] in PACKAGES):
                private.append((mod, target, name))
    return edges, private


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_judge_modules():
    edges, _ = _graph()
    assert _cycles(edges) == []


def test_the_cycle_finder_finds_a_planted_cycle():
    edges, _ = _graph()
    edges = {k: set(v) for k, v in edges.items()}
    edges["ortho_verify.results"].add("ortho_verify.report")  # report imports results: a circle
    assert ["ortho_verify.report", "ortho_verify.results"] in _cycles(edges)


def test_no_private_name_imported_from_another_module():
    _, private = _graph()
    assert private == []


def _root(node) -> str | None:
    """The name at the root of ``a.b.c`` (None for anything else)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _private_uses_in_tests() -> list[tuple[str, int, str]]:
    """(file, line, "alias._name") for every private attribute of an ``ortho_verify`` module that
    a tests/verify file reads."""
    out = []
    for path in sorted((ROOT / "tests" / "verify").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ortho_verify":
                aliases |= {a.asname or a.name for a in node.names}
            elif isinstance(node, ast.Import):
                aliases |= {a.asname for a in node.names if a.asname and a.name.startswith("ortho_verify")}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                    and node.attr.startswith("_") and not node.attr.startswith("__"):
                out.append((path.name, node.lineno, f"{node.value.id}.{node.attr}"))
            # monkeypatch.setattr(<judge module>, "_name", ...): a private patched without a seam
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "setattr" \
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                    and str(node.args[1].value).startswith("_") and _root(node.args[0]) in aliases:
                out.append((path.name, node.lineno, f"setattr(..., {node.args[1].value!r})"))
    return out


def test_tests_use_public_names_of_the_judge():
    """Tests reach ortho_verify through public names and documented patch points only."""
    assert _private_uses_in_tests() == []


@pytest.mark.parametrize("folder", ["verify", "tests/verify"])
def test_no_file_over_500_lines(folder):
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / folder).rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


def test_sharding_runs_as_a_module():
    run = subprocess.run([sys.executable, "-m", "ortho_verify.sharding", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and "--world-size" in run.stdout


def test_layouts_template_is_package_data():
    """docs/layouts.md's text is read from the installed package (importlib.resources), and the
    page in the repository starts with it (the tables follow)."""
    from ortho_verify import sharding
    from ortho_verify.sharding import markdown

    meta = {"matrices": sharding.MATRICES, "steps": sharding.STEPS}
    text = resources.files("ortho_verify.sharding").joinpath(markdown.TEMPLATE).read_text(encoding="utf-8")
    page = sharding.DOCS_PATH.read_text(encoding="utf-8")
    filled = text.format(matrices=", ".join(f"{m}×{n}" for m, n in meta["matrices"]), steps=meta["steps"],
                         dion=", ".join(f"{k}={v}" for k, v in sharding.DION_OPTIONS.items()),
                         muon=", ".join(f"{k}={v}" for k, v in sharding.MUON_OPTIONS.items()))
    assert page.startswith(filled)
