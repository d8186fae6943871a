"""A compiled optimizer step (``torch.compile``) against the eager step of the same optimizer."""

from __future__ import annotations

from .sharded import sharded_tolerance

__all__ = ["compiled_tolerance"]


def compiled_tolerance(dtype) -> float:
    """Relative Frobenius bound ‖X_compiled − X_eager‖_F / ‖X_eager‖_F for the weights and state
    of a Muon, Dion or hybrid step compiled with ``torch.compile`` (any backend) against the eager
    step on the same inputs.

    Derivation: the compiled graph runs the same algorithm in the same precision; inductor may
    reorder the terms of a reduction (the Frobenius norm, a matmul's inner sums) and fuse
    elementwise operations (which rounds intermediates at most once instead of once per
    operation). So X_compiled and X_eager are two computed values of one exact step X, and
    ‖X_compiled − X_eager‖ ≤ ‖X_compiled − X‖ + ‖X_eager − X‖: two forward errors of the same
    algorithm in the same precision — the situation of a sharded step against one process,
    whose derivation (``sharded_tolerance``: ≲ 2c·√d·u times the conditioning factors of the
    step) applies term for term. Hence the same contract: float64 1e-12, float32 1e-5.
    Raises: ValueError for a dtype other than float64 / float32 (bfloat16 Newton–Schulz is
    checked against the oracle, not bit for bit).
    """
    return sharded_tolerance(dtype)
