"""``ruff check`` on the whole repository finds nothing (the rules: pyproject's ``[tool.ruff]``).

ruff is a development dependency (requirements-dev.txt, the ``test`` extra); without it the tests
skip and say so. The check reads the repository's own configuration, and a planted file in a copy
of that configuration shows it can fail: a line one character over ``line-length`` is E501, one at
the limit passes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120


def ruff_binary() -> str:
    """Path of the ruff executable of the installed ``ruff`` package; skips when it is not installed."""
    ruff = pytest.importorskip("ruff", reason="ruff is not installed (pip install -r requirements-dev.txt)")
    from ruff.__main__ import find_ruff_bin

    try:
        return find_ruff_bin()
    except FileNotFoundError:
        pass
    # a package reached through a .pth of another environment keeps its executable in that environment's bin/
    exe = "ruff.exe" if os.name == "nt" else "ruff"
    prefix = Path(ruff.__file__).resolve().parents[4]  # <prefix>/lib/pythonX.Y/site-packages/ruff/__init__.py
    for candidate in (prefix / "bin" / exe, prefix / "Scripts" / exe, shutil.which(exe)):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    pytest.fail(f"the ruff package is installed at {ruff.__file__} but its executable {exe!r} was not found")


def ruff_check(root: Path) -> tuple[int, str]:
    """Return code and findings (one a line, ``path:line:col: CODE message``) of ``ruff check`` on ``root``."""
    done = subprocess.run([ruff_binary(), "check", "--no-cache", "--output-format", "concise", "."],
                          cwd=root, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode in (0, 1), f"ruff failed to run (exit {done.returncode}):\n{done.stderr}"
    return done.returncode, done.stdout + done.stderr


def test_ruff_check_finds_nothing():
    code, output = ruff_check(ROOT)
    assert code == 0, f"ruff check found problems (fix them, or `ruff check --fix` for imports):\n{output}"


def _line_length() -> int:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["line-length"]


@pytest.mark.parametrize("over", [0, 1])
def test_ruff_check_fails_on_a_planted_long_line(tmp_path, over):
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    width = _line_length() + over
    prefix = "x = "
    (tmp_path / "planted.py").write_text(prefix + repr("a" * (width - len(prefix) - 2)) + "\n")
    assert len((tmp_path / "planted.py").read_text().splitlines()[0]) == width
    code, output = ruff_check(tmp_path)
    if over:
        assert code == 1 and "planted.py:1:" in output and "E501" in output, output
    else:
        assert code == 0, output
