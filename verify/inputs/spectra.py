"""Test matrices with prescribed singular values (numpy only).

A matrix ``A = U[:, :k] diag(s) V[:, :k]^T`` with Haar-distributed orthogonal
``U`` (m, m) and ``V`` (n, n) has singular values exactly ``s`` (up to rounding)
and singular vectors in general position, which makes it the standard input for
testing spectral algorithms such as Newton-Schulz iterations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["MatrixCase", "haar_orthogonal", "matrix_with_spectrum", "synthetic_matrices"]


@dataclass(frozen=True, eq=False)
class MatrixCase:
    """One named input matrix for the verification suite.

    Attributes:
        name: unique identifier, e.g. ``"synthetic/cond1e6/64x128"`` or
            ``"gpt/step100/blocks.0.attn.qkv.weight"``.
        matrix: float64 array of shape (m, n), PyTorch layout (fan_out, fan_in).
        source: ``"real"`` (captured from training) or ``"synthetic"``.
        description: one line saying how the matrix was made.

    Raises:
        ValueError: if ``matrix`` is not a 2-D float64 array or ``source`` is not
            ``"real"`` / ``"synthetic"``.
    """

    name: str
    matrix: np.ndarray
    source: str
    description: str

    def __post_init__(self) -> None:
        if not isinstance(self.matrix, np.ndarray) or self.matrix.ndim != 2 or self.matrix.dtype != np.float64:
            raise ValueError(f"MatrixCase {self.name!r}: matrix must be a 2-D float64 numpy array")
        if self.source not in ("real", "synthetic"):
            raise ValueError(f"MatrixCase {self.name!r}: source must be 'real' or 'synthetic', got {self.source!r}")


def haar_orthogonal(n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw an orthogonal matrix from the Haar measure on O(n).

    Takes ``Z = Q R`` (Householder QR of an n x n standard Gaussian matrix) and
    returns ``Q diag(sign(diag(R)))`` with sign(0) := +1; the sign fix makes the
    factorization unique and the result exactly Haar distributed.

    Source: F. Mezzadri, "How to generate random matrices from the classical
    compact groups", Notices of the AMS 54(5), 2007, section 5.

    Args:
        n: dimension, n >= 1.
        rng: numpy random generator (consumes n*n standard normals).

    Returns:
        float64 array of shape (n, n) with Q^T Q = I to rounding, O(n u).

    Raises:
        ValueError: if n < 1.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    signs = np.where(np.diag(r) < 0, -1.0, 1.0)
    return q * signs


def matrix_with_spectrum(singular_values, m: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Random (m, n) matrix with prescribed singular values.

    Returns ``U[:, :k] diag(s) V[:, :k]^T`` with ``U`` (m, m), ``V`` (n, n) Haar
    orthogonal (see :func:`haar_orthogonal`, drawn in that order from ``rng``) and
    ``k = len(s)``. The nonzero singular values of the result are the nonzero
    entries of ``s``; the remaining min(m, n) - k are zero (all up to rounding,
    about max(m, n) * 2**-53 * max(s) in absolute terms).

    Args:
        singular_values: 1-D array-like of k finite, non-negative values (any order).
        m: number of rows, m >= 1.
        n: number of columns, n >= 1.
        rng: numpy random generator.

    Returns:
        float64 array of shape (m, n).

    Raises:
        ValueError: naming the offending argument if m or n < 1, if
            ``singular_values`` is not 1-D, has a negative or non-finite entry,
            or has more than min(m, n) entries.
    """
    if m < 1 or n < 1:
        raise ValueError(f"m and n must be >= 1, got m={m}, n={n}")
    s = np.asarray(singular_values, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError(f"singular_values must be 1-D, got shape {s.shape}")
    if not np.all(np.isfinite(s)) or np.any(s < 0):
        raise ValueError("singular_values must be finite and non-negative")
    k = s.size
    if k > min(m, n):
        raise ValueError(f"len(singular_values)={k} exceeds min(m, n)={min(m, n)}")
    u = haar_orthogonal(m, rng)[:, :k]
    v = haar_orthogonal(n, rng)[:, :k]
    return (u * s) @ v.T


def _family_spectrum(family: str, m: int, n: int) -> tuple[np.ndarray, str]:
    """Singular values (length min(m, n), largest 1) and their one-line recipe."""
    p = min(m, n)
    if family == "well-conditioned":
        return np.linspace(1.0, 0.1, p), f"s = linspace(1, 0.1, {p}) (cond 10)"
    if family == "cond1e6":
        return np.geomspace(1.0, 1e-6, p), f"s = geomspace(1, 1e-6, {p}) (cond 1e6)"
    if family == "rank-deficient":
        r = p // 4
        s = np.concatenate([np.linspace(1.0, 0.1, r), np.zeros(p - r)])
        return s, f"s = linspace(1, 0.1, {r}) then {p - r} exact zeros (rank {r})"
    # tall, wide and square differ only in shape.
    return np.geomspace(1.0, 1e-3, p), f"s = geomspace(1, 1e-3, {p}) (cond 1e3)"


_QUICK_SHAPES = (
    ("well-conditioned", 32, 64),
    ("cond1e6", 64, 32),
    ("rank-deficient", 48, 48),
    ("tall", 96, 32),
    ("wide", 32, 96),
    ("square", 64, 64),
)
_EXTRA_SHAPES = (
    ("well-conditioned", 256, 512),
    ("cond1e6", 256, 256),
    ("rank-deficient", 128, 256),
    ("tall", 512, 128),
    ("wide", 128, 512),
    ("square", 256, 256),
)


def synthetic_matrices(*, quick: bool, seed: int = 0) -> list[MatrixCase]:
    """Synthetic test matrices with prescribed spectra, one or two per family.

    Families: ``well-conditioned`` (linear spectrum, cond 10), ``cond1e6``
    (geometric decay 1 -> 1e-6), ``rank-deficient`` (rank min(m, n)//4, other
    singular values exactly 0), and ``tall`` / ``wide`` / ``square`` (geometric
    decay 1 -> 1e-3). Largest singular value is 1 in every case. Built with
    :func:`matrix_with_spectrum` from one ``numpy.random.default_rng(seed)``,
    so the result is deterministic and the quick list is a prefix of the full one.

    Args:
        quick: if True only sizes 32..96 (6 matrices); if False additionally
            sizes up to 512 (12 matrices).
        seed: seed for ``numpy.random.default_rng``.

    Returns:
        list of :class:`MatrixCase` with source ``"synthetic"`` and names
        ``"synthetic/<family>/<m>x<n>"``; matrices are float64 (m, n).
    """
    rng = np.random.default_rng(seed)
    shapes = _QUICK_SHAPES if quick else _QUICK_SHAPES + _EXTRA_SHAPES
    cases = []
    for family, m, n in shapes:
        s, recipe = _family_spectrum(family, m, n)
        cases.append(
            MatrixCase(
                name=f"synthetic/{family}/{m}x{n}",
                matrix=matrix_with_spectrum(s, m, n, rng),
                source="synthetic",
                description=f"U diag(s) V^T, U, V Haar (Mezzadri 2007), {recipe}, seed {seed}",
            )
        )
    return cases
