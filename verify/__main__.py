"""``python -m verify`` runs ``ortho-verify``."""

import sys

from verify.cli import main

sys.exit(main())
