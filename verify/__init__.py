"""verify: the judge — checks ortho_fast (or your implementation) against the oracle ortho_ref.

Public API (imported lazily, so ``import ortho_verify.tolerances`` stays light):
``check_orthogonalizer``, ``check_optimizer``, ``MuonConventions``, ``DionConventions``,
``TORCH_MUON``, ``ORTHO_MUON``, ``DION``, ``VerificationReport`` (from ``ortho_verify.api``).
"""

_API = ("check_orthogonalizer", "check_orthogonalizer_example", "check_optimizer", "MuonConventions",
        "DionConventions", "TORCH_MUON", "ORTHO_MUON", "DION", "VerificationReport", "default_examples")

__all__ = list(_API)


def __getattr__(name):
    if name in _API:
        from ortho_verify import api

        return getattr(api, name)
    raise AttributeError(f"module 'ortho_verify' has no attribute {name!r}")
