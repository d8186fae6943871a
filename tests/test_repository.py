"""Repository contracts: the README's two commands, CI calling the test command, the README's
documentation list, and the import rules of docs/design.md, "Layers and import rules" (the oracle
never imports torch; the product never imports the oracle; every rule in detail: test_imports.py)."""

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands():
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_readme_has_exactly_two_setup_commands():
    cmds = _readme_commands()
    assert len(cmds) == 2
    assert "ortho-verify" in cmds[0] and "pytest" in cmds[1]
    assert all(c.startswith("python3 -m venv .venv") for c in cmds)


def test_readme_first_command_installs_the_judges_extra():
    assert "-e '.[verify]'" in _readme_commands()[0]


def test_readme_links_every_document():
    readme = (ROOT / "README.md").read_text()
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{doc.name})" in readme, doc.name


def test_design_has_the_sections_docstrings_cite():
    headings = re.findall(r"^## (.+)$", (ROOT / "docs" / "design.md").read_text(), re.M)
    assert headings == ["Layers and import rules", "Conventions", "Muon", "Dion", "Dion2",
                        "Distributed layouts and the layout contract", "Tolerances", "Real input",
                        "Systems our users come from"]


def test_ci_runs_the_readme_test_command():
    assert _readme_commands()[1] in (ROOT / ".ci" / "run").read_text().splitlines()


def test_oracle_never_imports_torch():
    code = "import sys, ortho_ref; ortho_ref.ns_map([[1.0, 2.0], [3.0, 4.0]], [[1.5, -0.5, 0.0]]); " \
           "sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_fast_side_never_imports_the_oracle():
    offenders = [p.name for p in (ROOT / "ortho_fast").rglob("*.py") if "ortho_ref" in _imported_modules(p)]
    assert offenders == []


def test_oracle_imports_only_numpy_scipy_mpmath():
    """numpy, scipy, mpmath and the standard library — never torch or another third party."""
    allowed = {"numpy", "scipy", "mpmath"} | set(sys.stdlib_module_names)
    for path in (ROOT / "ortho_ref").rglob("*.py"):
        assert _imported_modules(path) <= allowed, path.name


def test_nothing_cites_a_design_file_outside_the_repository():
    """Docstrings, comments and docs cite docs/design.md, never the design file outside the repository."""
    stale = re.compile(r"\bDESIGN(\.md|'s)?\b")
    files = [p for folder in ("ortho_ref", "ortho_fast", "verify", "tests", "benchmarks", "scripts")
             for p in (ROOT / folder).rglob("*.py")] + sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in files if p != Path(__file__).resolve()
            for i, line in enumerate(p.read_text().splitlines(), 1) if stale.search(line)]
    assert not hits, "cite docs/design.md instead: " + ", ".join(hits)


def test_the_distribution_name_is_used_everywhere():
    """The name on the package index is ``ortho-optim`` (``ortho`` is another project's): pyproject,
    the extras' self-reference, CITATION.cff and every install command of the docs, the messages and
    the tests use it; the import names stay ortho_fast, ortho_ref, ortho_verify."""
    from ortho_verify.optional import DISTRIBUTION, INSTALL_HINT

    text = (ROOT / "pyproject.toml").read_text()
    assert DISTRIBUTION == "ortho-optim" and f'name = "{DISTRIBUTION}"' in text and f'"{DISTRIBUTION}[verify]"' in text
    assert INSTALL_HINT == "pip install 'ortho-optim[verify]'"
    assert 'title: "ortho-optim"' in (ROOT / "CITATION.cff").read_text()
    wrong = re.compile(r"pip install '?ortho(\[|\s|'|$)|distribution\(\"ortho\"\)")
    files = [ROOT / "README.md", ROOT / "CITATION.cff", *sorted((ROOT / "docs").glob("*.md"))] + [
        p for folder in ("ortho_fast", "ortho_ref", "verify", "tests", "benchmarks", "scripts")
        for p in (ROOT / folder).rglob("*.py") if p != Path(__file__).resolve()]
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1)
            if wrong.search(line)]
    assert not hits, hits
    assert "pip install 'ortho-optim[verify]'" in (ROOT / "docs" / "verification.md").read_text()


#: Words about how the work was organized, not about the code (built from parts, so that this file
#: does not match itself): an issue number, a pending marker, a former version, a past habit, a
#: history of the text (a "History" heading, "added after", "before this", "was N, now M"), a halt of the work.
PROCESS_WORDS = re.compile("|".join([r"\b" + "iss" + r"ue\s+#?\d+", "(?-i:PEND" + "ING)", "earlier " + "version",
                                     r"\bused " + r"to\b(?! (?:rebuild|build|make|read|run|compute))",
                                     "this " + "session", "session " + "had", "(?-i:Hist" + "ory:)",
                                     r"\b(?:was|were) " + r"added after\b", "before this " + "change",
                                     r"\bwhen (?:these|this|it|they)(?: \w+)? (?:was|were) " + r"added\b",
                                     r"\bwas [-+]?\d[\d.e×x-]*, " + r"now\b",
                                     r"\bwork " + r"stop\b", r"\bstopped " + r"here\b"]), re.IGNORECASE)


def test_no_process_words_in_tracked_files():
    """What a user or maintainer reads says what the code does, not how its work was organized."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for name in files:
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".toml", ".txt", ".cfg", ".cff", ".in", ""} or not path.is_file():
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if PROCESS_WORDS.search(line):
                hits.append(f"{name}:{i}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)


def test_no_machine_path_in_what_ships():
    """The packages, the docs and the data they read name no folder of the machine that wrote them
    (a measurement's temporary folder, a checkout, a home directory)."""
    pattern = re.compile(r"/(?:work|root|tmp)/[A-Za-z_.]|/home/(?!me/)[A-Za-z_.]")
    files = subprocess.run(["git", "ls-files", "ortho_fast", "ortho_ref", "verify", "docs", "README.md", "scripts",
                            "benchmarks"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hits = [f"{name}:{i}" for name in files if (ROOT / name).suffix in {".py", ".md", ".json", ".txt"}
            for i, line in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1)
            if pattern.search(line)]
    assert not hits, hits
