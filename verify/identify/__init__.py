"""Identification: probe a Newton–Schulz kernel or a Muon / Dion optimizer with designed inputs,
recover what it computes as a declaration the judge takes, then judge it under that declaration
(docs/identification.md).

``identify_orthogonalizer`` (``ortho_verify.identify.kernel``); ``identify_optimizer``
(``ortho_verify.identify.optimizer``, imported when first used).
"""

from .result import Evidence, Identification

__all__ = ["Evidence", "Identification", "identify_optimizer", "identify_orthogonalizer"]


def __getattr__(name):
    if name == "identify_orthogonalizer":
        from .kernel import identify_orthogonalizer

        return identify_orthogonalizer
    if name == "identify_optimizer":
        from .optimizer import identify_optimizer

        return identify_optimizer
    raise AttributeError(f"module 'ortho_verify.identify' has no attribute {name!r}")
