"""Identification: probe a Newton–Schulz kernel or a Muon / Dion optimizer with designed inputs,
recover what it computes as a declaration the judge takes, then judge it under that declaration
(docs/verification.md, "Identifying an implementation")."""

from .result import Evidence, Identification

__all__ = ["Evidence", "Identification"]
