"""The extra ``jax`` (jax, jaxlib, optax): imported where used, through ``require``, so that
``ortho_verify`` and ``ortho_verify.frameworks`` import without it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXTRA", "INSTALL_HINT", "require"]

#: The extra of the distribution that installs jax, jaxlib and optax (pyproject.toml).
EXTRA = "jax"
INSTALL_HINT = f"pip install 'ortho-optim[{EXTRA}]'"


def require(module: str, what: str) -> ModuleType:
    """Import ``module`` ("jax", "jax.numpy", "optax", ...) for the feature ``what``.

    Parameters
    ----------
    module : str
        The module to import.
    what : str
        The entry point that needs it, for the message.

    Returns
    -------
    module
        The imported module.

    Raises
    ------
    ImportError
        "<what> needs <package>: pip install 'ortho-optim[jax]'" when it cannot be imported (the
        original error is its cause).
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"{what} needs {module.partition('.')[0]}: {INSTALL_HINT}") from err
