"""``python -m ortho_verify`` runs ``ortho-verify``."""

import sys

from ortho_verify.cli import main

sys.exit(main())
