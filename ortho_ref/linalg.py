"""Float64 singular value decomposition, the one factorization the oracle's matrix functions share.

``ortho_ref.polar``, ``ortho_ref.ns_map`` and ``ortho_ref.dion`` build on it; it imports nothing of
the oracle but the input validation (docs/design.md, "Layers and import rules").
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from ._validate import as_matrix

__all__ = ["svd", "thin_svd"]


def svd(a) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Thin SVD A = U diag(s) Vᵀ by LAPACK gesdd (gesvd if gesdd does not converge).

    Shapes: a (m, n) float -> U (m, k), s (k,) descending, Vt (k, n), float64, k = min(m, n).
    Source: LAPACK dgesdd / dgesvd through ``scipy.linalg.svd``.
    Raises: TypeError for non-float dtypes; ValueError if ``a`` is not 2-D, empty, or not finite.
    """
    return thin_svd(as_matrix(a, "a"))


def thin_svd(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``svd`` without the input validation, for a matrix already checked by ``_validate.as_matrix``.

    Shapes: a (m, n) float64, finite -> U (m, k), s (k,) descending, Vt (k, n), k = min(m, n).
    Raises: nothing of its own (LAPACK's errors for an unchecked input propagate).
    """
    try:
        return scipy.linalg.svd(a, full_matrices=False, lapack_driver="gesdd", check_finite=False)
    except np.linalg.LinAlgError:  # pragma: no cover - gesdd failure is rare
        return scipy.linalg.svd(a, full_matrices=False, lapack_driver="gesvd", check_finite=False)
