"""The judge's optional dependencies (matplotlib, rich, hypothesis), imported at the place of use.

The judge's optional dependencies: matplotlib (plots), rich (terminal tables) and hypothesis
(strategies), installed with the extra ``verify`` (``pip install 'ortho-optim[verify]'``).

Every import of them in ``ortho_verify`` goes through ``require`` (or ``pyplot``), at the
place of use, so that ``import ortho_verify.tolerances`` and ``import ortho_verify.registry``
need none of them and a missing one gives an ImportError that names the extra.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

__all__ = ["DISTRIBUTION", "EXTRA", "EXTRA_MODULES", "INSTALL_HINT", "missing_extra_modules", "require", "pyplot"]

#: The distribution's name on the package index (its import names are ortho_fast, ortho_ref, ortho_verify).
DISTRIBUTION = "ortho-optim"
#: The extra of the distribution that installs the judge's optional dependencies.
EXTRA = "verify"
#: The top-level modules the extra installs (pyproject.toml, ``[project.optional-dependencies] verify``).
EXTRA_MODULES = ("hypothesis", "rich", "threadpoolctl", "matplotlib")
INSTALL_HINT = f"pip install '{DISTRIBUTION}[{EXTRA}]'"


def require(module: str, what: str) -> ModuleType:
    """Import ``module`` (e.g. "rich.console", "hypothesis.strategies") and return it.

    ``what``: the feature that needs it, for the message (e.g. "ortho-verify's terminal table").
    Raises: ImportError "<what> needs <package>: pip install 'ortho-optim[verify]'" (the package is the
    top-level name of ``module``) when it cannot be imported; the original error is its cause.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        package = module.partition(".")[0]
        raise ImportError(f"{what} needs {package}: {INSTALL_HINT}") from err


def pyplot(what: str = "plotting"):
    """``matplotlib.pyplot`` with the non-interactive Agg backend (PNG files, no display).

    Raises: ImportError naming the extra (``require``) when matplotlib is missing.
    """
    matplotlib = require("matplotlib", what)
    matplotlib.use("Agg")
    return require("matplotlib.pyplot", what)


def missing_extra_modules() -> list[str]:
    """The modules of ``EXTRA_MODULES`` that cannot be found (a finder that raises counts as missing)."""
    missing = []
    for name in EXTRA_MODULES:
        try:
            found = sys.modules[name] if name in sys.modules else importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        if found is None:
            missing.append(name)
    return missing

