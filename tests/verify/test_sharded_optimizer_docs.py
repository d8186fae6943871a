"""docs/verification.md, "Distributed optimizers": its two examples run as written (every layout
at 4 ranks, so behind ``slow``) and the numbers it quotes are the ones the check measures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "verification.md"


def _example(name: str) -> str:
    blocks = re.findall(r"```python\n(# " + re.escape(name) + r"\n.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1, name
    return blocks[0]


def test_section_exists_with_both_examples():
    text = DOC.read_text()
    assert "## Distributed optimizers: every mesh layout against one process" in text
    assert "check_sharded_optimizer(factory, DionConventions(), world_size=4)" in _example("sharded_dion_example.py")
    assert "replicate_mesh=layout.replicate_mesh" in _example("sharded_dion_example.py")
    assert "distributed_mesh=layout.shard_mesh" in _example("sharded_muon_example.py")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sharded_muon_example.py", "sharded_dion_example.py"])
def test_examples_run_as_written(name, capsys):
    exec(compile(_example(name), name, "exec"), {"__name__": "__main__"})
    if name == "sharded_dion_example.py":
        out = capsys.readouterr().out
        quoted = re.search(r"```\n(FSDP Shard\(0\) / 16x8#0: .*?)\n\.\.\.", DOC.read_text(), re.S).group(1)
        assert " ".join(quoted.split()) in " ".join(out.split())
