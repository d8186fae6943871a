"""Batched Newton–Schulz (``ortho_fast.newton_schulz``): this module's names live in
``ortho_fast.functional.newton_schulz`` (the functional core); they stay importable from here."""

from .functional.newton_schulz import (
    COMPUTE_DTYPES,
    EPS_MODES,
    MATMUL_PRECISIONS,
    newton_schulz,
    newton_schulz_resolved,
    resolve_coefficients,
    resolve_compute_dtype,
)

__all__ = ["COMPUTE_DTYPES", "EPS_MODES", "MATMUL_PRECISIONS", "newton_schulz", "newton_schulz_resolved",
           "resolve_coefficients", "resolve_compute_dtype"]
