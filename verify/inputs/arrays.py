"""Moving arrays between the fast side (torch) and the oracle (float64 numpy), and the
deterministic auxiliary arrays of a check input.

Lower than every check module (``ortho_verify.checks``, ``ortho_verify.checks.error_feedback``,
``ortho_verify.api``), which all use it.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

from .spectra import MatrixCase

__all__ = ["TORCH_DTYPES", "as_float64", "case_array", "case_rng", "rounded"]

#: Compute dtypes of the checks by name.
TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16,
                "float16": torch.float16}


def as_float64(t: torch.Tensor) -> np.ndarray:
    """A float64 numpy copy on the CPU (never sharing memory with ``t``: ``.double().numpy()``
    of a float64 tensor would, and a later in-place update would change the copy)."""
    return t.detach().to(device="cpu", dtype=torch.float64, copy=True).numpy()


def rounded(a: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """``a`` rounded once to ``dtype`` and back to float64 (same shape)."""
    return as_float64(torch.tensor(a, dtype=dtype))


def case_rng(case: MatrixCase, salt: str) -> np.random.Generator:
    """Deterministic generator for the auxiliary arrays of a case (weights, momenta, Q0),
    seeded by the CRC-32 of "<case name>/<salt>"."""
    return np.random.default_rng(zlib.crc32(f"{case.name}/{salt}".encode()))


def case_array(case: MatrixCase, salt: str, shape, scale: float) -> np.ndarray:
    """N(0, scale²) float64 array of ``shape`` from ``case_rng(case, salt)``."""
    return case_rng(case, salt).standard_normal(shape) * scale
