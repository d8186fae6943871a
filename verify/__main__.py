"""``python -m ortho_verify`` runs ``ortho-verify``."""

import sys

from .cli.console import console_main

sys.exit(console_main())
