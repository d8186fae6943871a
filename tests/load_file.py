"""Load a Python file that is not in a package (``benchmarks/``, ``scripts/``, a test's own folder)
as a module, as the tests of those files do."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

#: The repository root.
ROOT = Path(__file__).resolve().parents[1]


def load_file(path: Path | str, name: str, *, register: bool = False):
    """The module made by executing the file ``path`` under the name ``name`` (a new module at every
    call). ``register``: also put it in ``sys.modules`` first (a file whose dataclasses or pickles
    look their module up by name)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
