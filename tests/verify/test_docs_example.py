"""docs/verification.md's copy-paste examples run as a user's own test files, in a fresh pytest
process with the installed plugin (entry point ``pytest11``): profiles, fixtures, the 10-line test."""

import os
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = '''
import os
from hypothesis import settings

def test_profile():
    assert settings.get_current_profile_name() == os.environ["EXPECTED_PROFILE"]
    assert settings().deadline is None
'''


def _doc_test_files() -> dict[str, str]:
    """``# test_x.py`` python blocks of the doc, joined per file name (``(continued)`` appends)."""
    files: dict[str, str] = {}
    for block in re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "verification.md").read_text(), re.S):
        head = re.match(r"# (test_\w+\.py)( \(continued\))?\n", block)
        if head:
            files[head.group(1)] = files.get(head.group(1), "") + "\n" + block
    return files


def _pytest(folder: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    plugin_installed = any(e.value == "ortho_verify.pytest_plugin" for e in entry_points(group="pytest11"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, str(folder)]
    if not plugin_installed:  # running from a checkout that was not pip-installed
        cmd[3:3] = ["-p", "ortho_verify.pytest_plugin"]
    return subprocess.run(cmd, cwd=folder, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, text=True, timeout=600)


def test_pyproject_declares_the_plugin():
    text = (ROOT / "pyproject.toml").read_text()
    assert '[project.entry-points.pytest11]\northo_verify = "ortho_verify.pytest_plugin"' in text


def test_docs_examples_pass_as_a_users_tests(tmp_path):
    files = _doc_test_files()
    assert set(files) == {"test_my_kernel.py", "test_my_optimizer.py"}
    for name, code in {**files, "test_profile_probe.py": PROBE}.items():
        (tmp_path / name).write_text(code)
    # the option wins over the environment variable
    run = _pytest(tmp_path, "--hypothesis-profile", "ortho-dev",
                  env={"ORTHO_HYPOTHESIS_PROFILE": "deep", "EXPECTED_PROFILE": "ortho-dev"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "6 passed" in run.stdout, run.stdout


def test_profile_from_environment_variable(tmp_path):
    (tmp_path / "test_profile_probe.py").write_text(PROBE + '''
def test_ci_is_derandomized():
    assert settings().derandomize and settings().max_examples == 100
''')
    run = _pytest(tmp_path, env={"ORTHO_HYPOTHESIS_PROFILE": "ci", "EXPECTED_PROFILE": "ortho-ci"})
    assert run.returncode == 0 and "2 passed" in run.stdout, run.stdout + run.stderr
    bad = _pytest(tmp_path, env={"ORTHO_HYPOTHESIS_PROFILE": "nonesuch", "EXPECTED_PROFILE": "x"})
    assert bad.returncode != 0 and "nonesuch" in bad.stdout + bad.stderr
