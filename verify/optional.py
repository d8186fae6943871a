"""The judge's optional dependencies: matplotlib (plots), rich (terminal tables) and hypothesis
(strategies), installed with the extra ``verify`` (``pip install 'ortho[verify]'``).

Every import of them in ``ortho_verify`` goes through ``require`` (or ``pyplot``), at the
place of use, so that ``import ortho_verify.tolerances`` and ``import ortho_verify.registry``
need none of them and a missing one gives an ImportError that names the extra.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXTRA", "INSTALL_HINT", "require", "pyplot"]

#: The extra of the ``ortho`` distribution that installs the judge's optional dependencies.
EXTRA = "verify"
INSTALL_HINT = f"pip install 'ortho[{EXTRA}]'"


def require(module: str, what: str) -> ModuleType:
    """Import ``module`` (e.g. "rich.console", "hypothesis.strategies") and return it.

    ``what``: the feature that needs it, for the message (e.g. "ortho-verify's terminal table").
    Raises: ImportError "<what> needs <package>: pip install 'ortho[verify]'" (the package is the
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
