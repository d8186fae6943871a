"""``python -m ortho_ref.golden [directory]``: regenerate the golden files (outputs at 50 digits).

The oracle does not import ``ortho_verify``, so the sidecars' tolerance values stay null here;
``python scripts/regen_golden.py`` writes the same data with the tolerances recorded.
"""

import sys

from . import DATA, generate

if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else DATA
    for path in generate(target):
        print(path)
