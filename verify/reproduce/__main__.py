"""``python -m ortho_verify.reproduce``: ``ortho-verify reproduce``. Spawned jobs unpickle their
functions from the importable modules (``ortho_verify.reproduce.pool``), not from ``__main__``."""

import sys

from .cli import main

sys.exit(main())
