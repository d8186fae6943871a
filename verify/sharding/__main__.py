"""``python -m ortho_verify.sharding``: ``ortho-verify sharding``."""

import sys

from .cli import main

sys.exit(main())
