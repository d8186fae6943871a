"""The ``ortho_baseline`` fixture keys each baseline by the full test id, anchored at the test file:
two same-named tests in different folders (or modules) get different baselines — a bfloat16 kernel's
test is never compared with a float32 kernel's baseline — and pytest run from another working
directory (or with another rootdir) finds the same files."""

from __future__ import annotations

from pathlib import Path

from ortho_verify.report.baseline import BASELINE_FOLDER, baseline_path_for_test, legacy_baseline_path
from tests.verify.test_docs_example import _pytest

#: A user's test: its report's one ratio comes from the environment (RATIO_<folder>), so a run can
#: make one folder's test regress and leave the other's alone.
TEST = '''
import os
from pathlib import Path

from ortho_verify.report.results import VerificationReport, measured


def test_kernel(ortho_baseline):
    ratio = float(os.environ["RATIO_" + Path(__file__).parent.name])
    ortho_baseline(VerificationReport("k", [measured("ns_vs_ns_map", "x", "d", ratio, 1.0)], {}))


class TestKernel:
    def test_kernel(self, ortho_baseline):
        ortho_baseline(VerificationReport("k", [measured("ns_vs_ns_map", "x", "d", 0.2, 1.0)], {}))
'''


#: Two test modules of one name in two folders need pytest's importlib import mode (or packages).
IMPORTLIB = "--import-mode=importlib"


def _project(root: Path) -> Path:
    for folder in ("float32", "bfloat16"):
        (root / "tests" / folder).mkdir(parents=True)
        (root / "tests" / folder / "test_kernel.py").write_text(TEST)
    return root


def test_the_path_is_the_test_id_beside_the_test_file(tmp_path):
    a = baseline_path_for_test(tmp_path / "tests" / "a" / "test_k.py", "test_x[float32-1]")
    b = baseline_path_for_test(tmp_path / "tests" / "b" / "test_k.py", "test_x[float32-1]")
    assert a == tmp_path / "tests" / "a" / BASELINE_FOLDER / "test_k" / "test_x_float32-1.json" and a != b
    assert baseline_path_for_test(tmp_path / "t" / "test_k.py", "TestK::test_x") != \
        baseline_path_for_test(tmp_path / "t" / "test_k.py", "test_x")
    given = baseline_path_for_test(tmp_path / "tests" / "a" / "test_k.py", "test_x", folder=tmp_path / "base",
                                   rootpath=tmp_path)
    assert given == tmp_path / "base" / "tests" / "a" / "test_k" / "test_x.json"


def test_same_named_tests_in_two_folders_and_any_working_directory(tmp_path):
    """No ini file: pytest's rootdir follows the working directory (the harder case)."""
    root = _project(tmp_path / "project")
    ratios = {"RATIO_float32": "0.2", "RATIO_bfloat16": "0.2"}
    written = _pytest(root, IMPORTLIB, "--ortho-update-baseline", env=ratios)
    assert written.returncode == 0 and "4 passed" in written.stdout, written.stdout + written.stderr
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.json"))
    assert files == [f"tests/{f}/ortho-baselines/test_kernel/{t}.json" for f in ("bfloat16", "float32")
                     for t in ("TestKernel_test_kernel", "test_kernel")], files
    # the bfloat16 folder's test regresses: it fails against its own baseline, the float32 one passes
    worse = _pytest(root, IMPORTLIB, env={**ratios, "RATIO_bfloat16": "0.5"})
    assert worse.returncode == 1 and "1 failed, 3 passed" in worse.stdout, worse.stdout
    assert "tests/bfloat16/test_kernel.py::test_kernel" in worse.stdout.replace("\\", "/")
    (root / "tests" / "bfloat16" / "ortho-baselines" / "test_kernel" / "test_kernel.json").unlink()
    # from tests/ (another working directory, and without an ini file another rootdir): the same files
    again = _pytest(root / "tests", IMPORTLIB, env=ratios)
    assert again.returncode == 1 and "1 failed, 3 passed" in again.stdout, again.stdout + again.stderr
    assert "bfloat16/test_kernel.py::test_kernel: run pytest --ortho-update-baseline" in again.stdout  # the deleted one
    assert len(list(root.rglob("*.json"))) == 3


def test_a_baseline_at_the_former_path_is_named_to_move(tmp_path):
    """A baseline written before baselines were keyed by the full test id
    (``<rootdir>/ortho-baselines/<test name>.json``) is not read: the test fails naming it and
    where it belongs, and after the move it is compared as before."""
    root = _project(tmp_path / "project")
    (root / "tests" / "bfloat16" / "test_kernel.py").unlink()
    (root / "pytest.ini").write_text("[pytest]\n")  # the rootdir: the project
    ratios = {"RATIO_float32": "0.2"}
    assert _pytest(root, IMPORTLIB, "--ortho-update-baseline", env=ratios).returncode == 0
    current = root / "tests" / "float32" / BASELINE_FOLDER / "test_kernel" / "test_kernel.json"
    legacy = legacy_baseline_path("test_kernel", rootpath=root)
    assert legacy == root / BASELINE_FOLDER / "test_kernel.json"
    legacy.parent.mkdir(exist_ok=True)
    current.rename(legacy)
    moved = _pytest(root, IMPORTLIB, env=ratios)
    assert moved.returncode == 1 and "1 failed, 1 passed" in moved.stdout, moved.stdout + moved.stderr
    assert f"move it there (git mv {legacy} {current})" in moved.stdout.replace("\n", ""), moved.stdout
    legacy.rename(current)
    assert _pytest(root, IMPORTLIB, env=ratios).returncode == 0
