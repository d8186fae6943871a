"""The result of an identification: the declaration found, the evidence for each field, and the
report of the judge under that declaration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Evidence:
    """What one probe measured for one field of a declaration.

    Parameters
    ----------
    field : str
        The declaration's field (``"coefficients"``, ``"eps_mode"``, ``"momentum_style"``, ...).
    value : Any
        The value found.
    measured : float
        The probe's discrepancy for ``value`` (a relative error, or error / tolerance).
    runner_up : Any
        The next candidate (None when there was only one).
    runner_up_measured : float
        The probe's discrepancy for ``runner_up`` (inf when there was none).
    tolerance : float
        What a correct implementation of ``value`` stays below (derived, from
        ``ortho_verify.tolerances``).
    note : str
        How it was measured, in a sentence.
    """

    field: str
    value: Any
    measured: float
    runner_up: Any = None
    runner_up_measured: float = float("inf")
    tolerance: float = float("nan")
    note: str = ""

    @property
    def fits(self) -> bool:
        """Whether ``value`` reproduced the probe within ``tolerance`` (NaN tolerance: no claim)."""
        return not self.tolerance == self.tolerance or self.measured <= self.tolerance

    @property
    def margin(self) -> float:
        """How many times larger the runner-up's discrepancy is than the value's (inf: no
        runner-up, or the value reproduced the probe exactly)."""
        if self.measured == 0:
            return float("inf")
        return self.runner_up_measured / self.measured

    def line(self) -> str:
        """One line: field, value, its discrepancy, and the runner-up's."""
        text = f"{self.field} = {self.value!r}: {self.measured:.3g}"
        if self.tolerance == self.tolerance:
            text += f" (tolerance {self.tolerance:.3g})"
        if self.runner_up is not None:
            text += f"; next {self.runner_up!r}: {self.runner_up_measured:.3g}"
        return text + (f" — {self.note}" if self.note else "")


@dataclass
class Identification:
    """What ``identify_orthogonalizer`` / ``identify_optimizer`` found.

    Parameters
    ----------
    kind : str
        ``"orthogonalizer"``, ``"muon"``, ``"dion"`` or ``"dion2"``.
    fits : bool
        Whether a declaration in the convention space reproduces every probe within its derived
        tolerance.
    declaration : Any
        The keyword arguments of ``check_orthogonalizer`` (a dict), or a ``MuonConventions`` /
        ``DionConventions`` / ``Dion2Conventions``; the closest one when nothing fits.
    snippet : str
        Python a user can paste to run the judge under ``declaration``.
    evidence : list of Evidence
        One entry per field, with its measured value and its margin to the next candidate.
    report : VerificationReport or None
        The judge's report under ``declaration`` (None when ``judge=False``).
    differences : list of str
        Where the implementation departs from every known declaration (e.g. ``"c x1.01 of
        jordan"``); empty when it matches one.
    """

    kind: str
    fits: bool
    declaration: Any
    snippet: str
    evidence: list[Evidence] = field(default_factory=list)
    report: Any = None
    differences: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """The verdict: a declaration fits, it is a known one (no ``differences``) and the judge
        passed under it. A fitted table alone is never a pass."""
        return self.fits and not self.differences and self.report is not None and bool(self.report.passed)

    def summary(self) -> str:
        """A few lines: the verdict, the declaration, the evidence, the differences."""
        verdict = "PASSED" if self.passed else "FAILED"
        lines = [f"{verdict}: {self.kind} identified" + ("" if self.fits else " (no declaration fits)")]
        lines += [f"  {e.line()}" for e in self.evidence]
        lines += [f"  differs: {d}" for d in self.differences]
        if self.report is not None and not self.report.passed:
            cause = getattr(self.report, "cause", "")
            lines.append(f"  judge: {cause or 'failed'}")
        lines.append("declaration:")
        lines += [f"  {line}" for line in self.snippet.splitlines()]
        return "\n".join(lines)
