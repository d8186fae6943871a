"""The judge from a plain checkout, without an install: ``PYTHONPATH=.:offline`` (the shim
``offline/ortho_verify``) with the editable install hidden (``python -S``: no site-packages .pth
files, so no editable finder; site-packages itself given on PYTHONPATH for torch and numpy)."""

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(code_or_args, tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "offline"), *site.getsitepackages()])
    args = [sys.executable, "-S", *code_or_args]
    return subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_ortho_verify_resolves_to_the_checkout_and_runs_a_check(tmp_path):
    code = ("import sys, ortho_verify, ortho_verify.cli.main; from ortho_verify import check_orthogonalizer; "
            "from ortho_verify.planted.bugs import newton_schulz_kernel; "
            "from ortho_verify.api import default_examples; "
            "assert not any('editable' in m for m in sys.modules), sorted(m for m in sys.modules if 'editable' in m); "
            "r = check_orthogonalizer(newton_schulz_kernel, examples=default_examples('float32')[:2], device='cpu'); "
            "print(ortho_verify.__file__, ortho_verify.cli.main.__file__, r.status)")
    run = _run(["-c", code], tmp_path)
    assert run.returncode == 0, run.stderr
    init, cli, status = run.stdout.split()
    assert Path(init) == ROOT / "verify" / "__init__.py" and Path(cli) == ROOT / "verify" / "cli" / "main.py"
    assert status == "passed"


@pytest.mark.slow  # a second interpreter start with torch: ~5 s alone, 20 s on a loaded 2-core machine
def test_cli_runs_from_the_checkout(tmp_path):
    """``python -m ortho_verify`` from the checkout: an unusable --device is its usage error (exit 2)."""
    bad = _run(["-m", "ortho_verify", "--device", "fakedev", "--no-real", "--out", str(tmp_path / "o")], tmp_path)
    assert bad.returncode == 2 and "--device" in bad.stderr, bad.stderr
