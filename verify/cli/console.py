"""The ``ortho-verify`` command's entry point (``[project.scripts]``; ``python -m ortho_verify``):
installed without the extra ``verify``, one line naming it and exit 2 instead of a traceback."""

from __future__ import annotations

import sys

from ..optional import EXTRA, EXTRA_MODULES, INSTALL_HINT, missing_extra_modules

__all__ = ["console_main"]


def console_main(argv: list[str] | None = None) -> int:
    """Run ``ortho_verify.cli.main.main(argv)`` and return its exit code.

    Without the extra, prints one line to stderr naming it —
    ``ortho-verify needs the extra 'verify' (missing: threadpoolctl): pip install 'ortho-optim[verify]'`` —
    and returns 2 (a usage error: nothing was run).
    """
    missing = missing_extra_modules()
    if not missing:
        try:
            from .main import main
        except ModuleNotFoundError as err:  # a module of the extra that is found but does not import
            if (err.name or "").partition(".")[0] not in EXTRA_MODULES:
                raise
            missing = [(err.name or "").partition(".")[0]]
        else:
            return main(argv)
    print(f"ortho-verify needs the extra '{EXTRA}' (missing: {', '.join(missing)}): {INSTALL_HINT}", file=sys.stderr)
    return 2
