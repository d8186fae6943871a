"""Dion's shapes: the rank r, the working orientation and the shape of the right factor Q.

Functions of the global shape (m, n) only, so every sharding of a weight gets the same ones
(docs/design.md, "Dion"); ``ortho_ref.dion`` re-exports them.
"""

from __future__ import annotations

import math

from ._validate import check_scalar

__all__ = ["dion_rank", "dion_transposed", "q_shape"]


def dion_rank(m: int, n: int, rank_fraction: float = 1.0, rank_multiple_of: int = 1) -> int:
    """Dion's rank r = min(ceil_to_multiple(rank_multiple_of, rank_fraction·min(m, n)), m, n).

    Parameters
    ----------
    m : int
        Rows of the weight, >= 1.
    n : int
        Columns of the weight, >= 1.
    rank_fraction : float, default 1.0
        The fraction of min(m, n), in (0, 1].
    rank_multiple_of : int, default 1
        r is rounded up to a multiple of it (then capped at min(m, n)), >= 1.

    Returns
    -------
    int
        r, 1 <= r <= min(m, n).

    Raises
    ------
    ValueError
        If `m` or `n` < 1, `rank_fraction` is outside (0, 1], or `rank_multiple_of` is not an
        integer >= 1.

    References
    ----------
    microsoft/dion ``Dion`` (``rank_fraction``, ``rank_multiple_of``); OLMo-core ``DionConfig``.

    Examples
    --------
    >>> from ortho_ref import dion_rank
    >>> dion_rank(1024, 256, rank_fraction=0.25, rank_multiple_of=8), dion_rank(10, 7, 0.5)
    (64, 4)
    """
    if m < 1 or n < 1:
        raise ValueError(f"m, n: expected positive dimensions, got ({m}, {n})")
    rank_fraction = check_scalar(rank_fraction, "rank_fraction", low=0.0, high=1.0, low_open=True)
    if int(rank_multiple_of) != rank_multiple_of or rank_multiple_of < 1:
        raise ValueError(f"rank_multiple_of: expected an integer >= 1, got {rank_multiple_of!r}")
    k = int(rank_multiple_of)
    r = k * math.ceil(rank_fraction * min(m, n) / k)
    return max(1, min(r, m, n))


def dion_transposed(m: int, n: int) -> bool:
    """Whether Dion works on the transpose of an (m, n) weight: m < n.

    A function of the global shape only, never of the sharding, so every layout computes the same
    update (docs/design.md, "Dion").

    Parameters
    ----------
    m : int
        Rows of the weight.
    n : int
        Columns of the weight.

    Returns
    -------
    bool
        True if m < n.

    References
    ----------
    K. Ahn, B. Xu, N. Abreu, J. Langford, "Dion: Distributed Orthonormalized Updates",
    arXiv 2504.05295, 2025; microsoft/dion (which may also transpose for the sharding; this does not).

    Examples
    --------
    >>> from ortho_ref import dion_transposed
    >>> dion_transposed(4, 6), dion_transposed(6, 4)
    (True, False)
    """
    return m < n


def q_shape(m: int, n: int, r: int) -> tuple[int, int]:
    """Shape of Dion's right factor Q for an (m, n) weight at rank r: (min(m, n), r).

    Parameters
    ----------
    m : int
        Rows of the weight.
    n : int
        Columns of the weight.
    r : int
        The rank (``dion_rank``).

    Returns
    -------
    tuple of int
        (min(m, n), r): Q has a row per column of the weight in the working orientation.

    References
    ----------
    K. Ahn, B. Xu, N. Abreu, J. Langford, "Dion: Distributed Orthonormalized Updates",
    arXiv 2504.05295, 2025, Algorithm 1.

    Examples
    --------
    >>> from ortho_ref import q_shape
    >>> q_shape(4, 6, 2), q_shape(6, 4, 2)
    ((4, 2), (4, 2))
    """
    return (min(m, n), r)
