"""Without the extra ``jax``: ortho_verify and ortho_verify.frameworks import, the torch checks run,
and the JAX entry points raise an ImportError naming the extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import ortho_verify.frameworks as frameworks

ROOT = Path(__file__).resolve().parents[2]
EXTRA = "pip install 'ortho-optim[jax]'"


def _missing(monkeypatch, *names: str) -> None:
    """Make ``import name`` (and its submodules already loaded) fail in this process."""
    for name in names:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.setitem(sys.modules, loaded, None)
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize("missing", ["jax", "optax"])
def test_entry_points_name_the_extra(monkeypatch, missing):
    _missing(monkeypatch, missing)
    if missing == "jax":
        with pytest.raises(ImportError, match=r"jax_kernel needs jax: pip install 'ortho-optim\[jax\]'") as err:
            frameworks.jax_kernel(abs)
        assert isinstance(err.value.__cause__, ImportError)
    with pytest.raises(ImportError, match=rf"optax_optimizer needs {missing}: pip install 'ortho-optim\[jax\]'"):
        frameworks.optax_optimizer(abs)


def test_torch_checks_run_without_jax():
    code = ("import sys\nsys.modules['jax'] = None\nsys.modules['jaxlib'] = None\nsys.modules['optax'] = None\n"
            "import functools, torch\nimport ortho_verify, ortho_verify.frameworks\n"
            "from ortho_verify.planted.bugs import newton_schulz_kernel\n"
            "r = ortho_verify.check_orthogonalizer(newton_schulz_kernel, shapes=[(9, 5)], statistical=False)\n"
            "assert r.passed, r.summary()\n"
            "r = ortho_verify.check_optimizer(torch.optim.Muon, steps=1, param_dtype=torch.float32, shapes=[(9, 5)],\n"
            "                                 statistical_matrices=0)\n"
            "assert r.passed, r.summary()\n"
            "try:\n    ortho_verify.frameworks.jax_kernel(abs)\nexcept ImportError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert EXTRA in done.stdout
