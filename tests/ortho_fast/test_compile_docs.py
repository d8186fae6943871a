"""Every code block of the docs that compiles a step runs as documented and prints nothing but
dynamo's one log line for any ``torch.optim.Optimizer`` ("Profiler record function ... will be
ignored", torch.optim.Muon's too): no graph-break or recompile warning, no scheduler warning. A block
the suite's pytest-codeblocks runs is covered there; one it skips (compiling is slow) runs here, in
a fresh process, as a user pastes it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

codeblocks = pytest.importorskip("pytest_codeblocks")

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: What dynamo logs once when it traces ``torch.optim.Optimizer.profile_hook_step`` (torch 2.13).
DYNAMO_PROFILER_LINE = "Profiler record function <class 'torch.autograd.profiler.record_function'> will be ignored"


def _compile_blocks():
    return [(f"{path.relative_to(ROOT)}:{block.lineno}", block) for path in DOCS
            for block in codeblocks.extract_from_file(path)
            if block.syntax == "python" and "torch.compile" in block.code]


def test_every_compile_block_is_run():
    """Each block that compiles runs in the suite (no mark) or here (its skip reason names this file)."""
    blocks = _compile_blocks()
    assert blocks
    for where, block in blocks:
        assert not block.marks or any("test_compile_docs.py" in mark for mark in block.marks), where


def test_the_documented_compile_names_only_methods_that_exist():
    """``X.init_state()`` in the docs names a class that has it (``Dion2`` has none)."""
    import re

    import ortho_fast

    for path in DOCS:
        for cls in re.findall(r"`([A-Z]\w*)\.init_state\(\)`", path.read_text()):
            assert hasattr(getattr(ortho_fast, cls, None), "init_state"), (path.name, cls)


@pytest.mark.parametrize("where, block", [b for b in _compile_blocks() if b[1].marks], ids=lambda x: str(x)[:40])
def test_a_skipped_compile_block_runs_and_prints_nothing_else(where, block, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(block.code)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, (where, run.stderr[-2000:])
    lines = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    assert all(DYNAMO_PROFILER_LINE in line for line in lines), (where, lines[:10])
