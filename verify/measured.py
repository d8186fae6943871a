"""Timings of ``ortho-verify`` and the test suite, measured by ``python scripts/timings.py --write-docs``
(generated: do not edit; ``ortho-verify --help`` quotes them)."""

TIMINGS: dict = {}
