"""verify: the judge — checks ortho_fast (or your implementation) against the oracle ortho_ref.

Public API (imported lazily, so ``import ortho_verify.tolerances`` stays light):
``check_orthogonalizer``, ``check_optimizer``, ``MuonConventions``, ``DionConventions``,
``TORCH_MUON``, ``ORTHO_MUON``, ``DION``, ``VerificationReport`` (from ``ortho_verify.api``);
``replay_example`` (from ``ortho_verify.replay``);
``check_sharded_optimizer``, ``ShardedReport`` (from ``ortho_verify.sharding.sharded_check``);
``Dion2Conventions``, ``DION2`` (from ``ortho_verify.conventions``), ``check_dion2_optimizer``
(from ``ortho_verify.checks.dion2``), ``identify_orthogonalizer`` and ``identify_optimizer`` (from
``ortho_verify.identify``).
"""

_API = ("check_orthogonalizer", "check_orthogonalizer_example", "check_optimizer", "MuonConventions",
        "DionConventions", "TORCH_MUON", "ORTHO_MUON", "DION", "VerificationReport", "default_examples",
        "check_sharded_optimizer", "ShardedReport", "Dion2Conventions", "DION2", "check_dion2_optimizer",
        "replay_example", "identify_orthogonalizer", "identify_optimizer")
#: Names of ``_API`` that live in ``ortho_verify.sharding.sharded_check`` (the distributed check).
_SHARDED = ("check_sharded_optimizer", "ShardedReport")
#: Names of ``_API`` that live elsewhere: name -> module, relative to this package.
_ELSEWHERE = {"Dion2Conventions": ".conventions", "DION2": ".conventions", "check_dion2_optimizer": ".checks.dion2",
              "identify_orthogonalizer": ".identify", "identify_optimizer": ".identify", "replay_example": ".replay"}

__all__ = list(_API)


def __getattr__(name):
    if name in _SHARDED:
        from .sharding import sharded_check

        return getattr(sharded_check, name)
    if name in _ELSEWHERE:
        import importlib

        return getattr(importlib.import_module(_ELSEWHERE[name], __name__), name)
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'ortho_verify' has no attribute {name!r}")


def __dir__():
    """The public names (``__all__``, imported lazily) beside the module's own: tab completion finds them."""
    return sorted(set(globals()) | set(__all__))
