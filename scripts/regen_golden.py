"""Regenerate the golden files of ``ortho_ref/golden/data`` (or a given directory), recording
in each sidecar the float64 oracle's tolerance from ``ortho_verify.checks.golden.golden_tolerances``.

Usage: ``python scripts/regen_golden.py [directory]`` (mpmath at 50 digits; it prints its time).
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ortho_ref.golden import DATA, generate  # noqa: E402
from ortho_verify.checks.golden import golden_tolerances  # noqa: E402


def main(argv: list[str]) -> None:
    target = Path(argv[0]) if argv else DATA
    start = time.perf_counter()
    paths = generate(target, tolerance=golden_tolerances)
    size = sum(p.stat().st_size for p in paths)
    print(f"wrote {len(paths)} files ({size / 1024:.0f} KiB) to {target} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
