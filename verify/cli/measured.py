"""Timings of ``ortho-verify`` and the test suite (``TIMINGS``), read from ``timings.json`` beside
this module, which ``python scripts/timings.py --write-docs`` writes from its measurement
(``ortho-verify --help`` quotes them)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["TIMINGS"]

#: The measurement: date, cores, load, Python, and per command its argv, wall and CPU seconds.
TIMINGS: dict = json.loads(Path(__file__).with_name("timings.json").read_text(encoding="utf-8"))
