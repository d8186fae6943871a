"""``python -m ortho_verify.sharding``: ``ortho-verify sharding``."""

import sys

from ortho_verify.sharding.cli import main

sys.exit(main())
