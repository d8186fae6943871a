"""Diagnoses: the likely cause of a failed check, in words (``CheckResult.cause``).

Run only on failures, so a passing run pays nothing. Each function looks at what the failing
implementation produced and names the simplest explanation it can confirm numerically:
a map that goes negative (the update ascends), a divergence, an update off by a constant
factor (compared with the known lr scales), a momentum that matches another known form or
none, a state of an unexpected shape. docs/verification.md, "Diagnoses".
"""

from __future__ import annotations

import dataclasses

from ortho_verify.results import CheckResult

__all__ = ["with_cause"]


def with_cause(row: CheckResult, cause: str) -> CheckResult:
    """``row`` with its ``cause`` set (a copy; a passed row is returned unchanged)."""
    return row if row.passed else dataclasses.replace(row, cause=cause)
