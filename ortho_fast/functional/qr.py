"""Thin QR of a tall matrix for Dion's power iteration: Householder, CholeskyQR2 and randomized
CholeskyQR, written against ``WholeDim`` (how the rows are held) so that one code path serves one
process and every sharded layout (``ortho_fast.distributed.dion.ShardedDim``).

Also the deterministic random draws of Dion: per-parameter seeds, the sketch generator and the
Gaussian sketch (never the global RNG; drawn at the global size).
Source: Ahn et al., arXiv 2504.05295 (Dion); microsoft/dion ``orthogonalize``; Balabanov, arXiv
2210.09953 (randomized Cholesky QR); Fukaya et al. 2014 (CholeskyQR2).

Patch point (a documented seam for tests that plant bugs): the Cholesky methods look
``cholesky_solve`` up in this module at every call.
"""

from __future__ import annotations

import math

import torch

from ..validation import check_count

QR_METHODS = ("householder", "cholesky_qr", "randomized_cholesky_qr")
#: microsoft/dion's names for the same methods (its "cqr" is one CholeskyQR pass, not CholeskyQR2).
QR_METHOD_ALIASES = {"qr": "householder", "rcqr": "randomized_cholesky_qr"}
#: Sketch rows per column for the randomized CholeskyQR (microsoft/dion ``rcqr_oversample``).
RCQR_OVERSAMPLE = 1.25
#: CholeskyQR2 falls back to Householder when its first pass leaves ‖Y₁ᵀY₁ − I‖_F above this
#: (κ(Y) beyond about u^(-1/2)); same rule as ``ortho_ref.dion.CQR2_GRAM_DEVIATION``.
CQR2_GRAM_DEVIATION = 0.5

_LOW_PRECISION = (torch.bfloat16, torch.float16)


def sketch_rows(rank: int, oversample: float = RCQR_OVERSAMPLE) -> int:
    """Rows k = ceil(oversample·r) of the randomized CholeskyQR sketch (microsoft/dion rounds k
    up to a multiple of 128; we do not). Same as ``ortho_ref.sketch_rows``."""
    return math.ceil(oversample * rank)


def factor_dtype(dtype: torch.dtype) -> torch.dtype:
    """QR / Cholesky run in float32 for bfloat16 / float16 data (as microsoft/dion)."""
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def _splitmix(z: int) -> int:
    z = z & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFF


def seed_for(seed: int, index: int) -> int:
    """Deterministic 63-bit seed for parameter ``index`` (splitmix64-style mixing)."""
    return _splitmix(seed * 0x9E3779B97F4A7C15 + index + 1)


def sketch_generator(seed: int, index: int, step: int, device) -> torch.Generator:
    """Generator of the randomized-CholeskyQR sketches of parameter ``index`` at ``step`` (>= 1):
    seeded from (seed, index, step) only — never the global RNG — on ``device``. Each power
    iteration draws the next sketch from it. Same seed, index, step and device type: same bits.

    Source: this package's determinism rule (docs/design.md, "Conventions"); microsoft/dion draws its sketches
    from the global RNG, so its runs do not repeat bit for bit.
    Raises: ValueError naming ``step`` unless it is an int >= 1.
    """
    check_count(step, "step")
    return torch.Generator(device=device).manual_seed(seed_for(seed_for(seed, index), step))


def gaussian_sketch(generator: torch.Generator, k: int, rows: int, dtype: torch.dtype, device) -> torch.Tensor:
    """S (k, rows) with i.i.d. N(0, 1/k) entries from ``generator`` (microsoft/dion's scaling).

    Shapes: -> (k, rows) in ``dtype`` on ``device`` (the generator's device type).
    Source: microsoft/dion ``orthogonalize`` (rcqr: randn / √k); randomized Cholesky QR,
    Balabanov, arXiv 2210.09953.
    Raises: ValueError naming ``k`` / ``rows`` unless an int >= 1; TypeError naming
    ``generator`` for something that is not a torch.Generator.
    """
    check_count(k, "k")
    check_count(rows, "rows")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator: expected a torch.Generator, got {type(generator).__name__}")
    return torch.randn((k, rows), generator=generator, dtype=dtype, device=device) / math.sqrt(k)


def householder(y: torch.Tensor) -> torch.Tensor:
    """Q factor of the thin Householder QR of y (rows, r) with diag(R) >= 0 (sign(0) := +1);
    y's dtype. Source: torch.linalg.qr (LAPACK geqrf / orgqr), signs fixed as ``ortho_ref.orthonormalize``."""
    q, r = torch.linalg.qr(y, mode="reduced")
    return q * torch.where(torch.diagonal(r) < 0, -1.0, 1.0).to(q.dtype)


class WholeDim:
    """A matrix dimension this process holds whole: the one-process case of the interface the
    QR methods and the right factor are written against (``ortho_fast.distributed.dion`` has the
    sharded one). ``total`` is the dimension's global length, ``sum`` the sum over the ranks
    sharding it (here: nothing to add), ``all_finite`` whether every rank's block is finite
    (``needed=False``: a caller that does not depend on it; one process checks anyway),
    ``sketch`` this rank's columns of a sketch drawn at the global size, ``householder`` this
    rank's rows of the Householder Q factor of the whole matrix, ``column_norms`` the column
    2-norms of the whole matrix. No communication here."""

    @staticmethod
    def total(y: torch.Tensor) -> int:
        return y.shape[0]

    @staticmethod
    def sum(t: torch.Tensor, tag: str) -> torch.Tensor:
        return t

    @staticmethod
    def all_finite(p: torch.Tensor, needed: bool = True) -> torch.Tensor:
        return torch.isfinite(p).all()

    @staticmethod
    def sketch(s: torch.Tensor) -> torch.Tensor:
        return s

    @staticmethod
    def householder(y: torch.Tensor) -> torch.Tensor:
        return householder(y)

    @staticmethod
    def column_norms(rf: torch.Tensor) -> torch.Tensor:
        """‖rf[:, j]‖₂ per column, (1, r), without overflow: the squares of entries above
        1.8e19 overflow float32 (Dion then stored Q = 0 and never moved again), so each column
        is divided by a power of two 2^e ≥ max|column| first and the norm multiplied back —
        exact scaling, so the bits are those of the unscaled norm whenever it does not overflow
        or underflow."""
        amax = rf.abs().amax(dim=0, keepdim=True)
        scale = torch.ldexp(torch.ones_like(amax), torch.frexp(amax).exponent)  # 2^e > max|column|, 1 for 0
        return torch.linalg.vector_norm(rf / scale, dim=0, keepdim=True) * scale


WHOLE = WholeDim()


def cholesky_solve(y: torch.Tensor, gram: torch.Tensor, rows, ok: torch.Tensor | None = None,
                    needed: bool = True) -> torch.Tensor | None:
    """Y R⁻¹ with R = chol(gram) upper (one CholeskyQR pass; ``gram`` already summed over the
    ranks holding Y's rows); None if the factorization failed, the result is not finite, or the
    extra condition ``ok`` (a bool tensor) is False. One host sync."""
    r, info = torch.linalg.cholesky_ex(gram, upper=True)
    p = torch.linalg.solve_triangular(r, y, upper=True, left=False)
    good = (info == 0) & rows.all_finite(p, needed)
    return p if bool(good if ok is None else good & ok) else None


def cholesky_qr2(y: torch.Tensor, rows=WHOLE) -> torch.Tensor | None:
    # Distributed, neither pass needs its own finiteness vote: a non-finite P₁ makes the second
    # Gram non-finite on every rank, which fails the deviation test; a second pass that passes
    # it has ‖R₂⁻¹‖₂ <= √2 and |P₁| <= √(3/2), so P₂ is finite.
    p1 = cholesky_solve(y, rows.sum(y.mT @ y, "gram"), rows, needed=False)
    if p1 is None:
        return None
    gram = rows.sum(p1.mT @ p1, "gram")
    eye = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    return cholesky_solve(p1, gram, rows, torch.linalg.matrix_norm(gram - eye) <= CQR2_GRAM_DEVIATION, needed=False)


def randomized_cholesky_qr(y: torch.Tensor, generator: torch.Generator, oversample: float,
                            rows=WHOLE) -> torch.Tensor | None:
    total, r = rows.total(y), y.shape[1]
    k = sketch_rows(r, oversample)
    if k >= total:  # the sketch would not compress: factor Y itself (no draw)
        return None
    sketch = rows.sketch(gaussian_sketch(generator, k, total, y.dtype, y.device))
    r_s = torch.linalg.qr(rows.sum(sketch @ y, "sketch"), mode="r").R
    r_s = r_s * torch.where(torch.diagonal(r_s) < 0, -1.0, 1.0).to(r_s.dtype)[:, None]
    y1 = torch.linalg.solve_triangular(r_s, y, upper=True, left=False)
    return cholesky_solve(y1, rows.sum(y1.mT @ y1, "gram"), rows)


def orthonormalize_block(y: torch.Tensor, method: str, oversample: float, generator, rows=WHOLE) -> torch.Tensor:
    """``orthonormalize`` without the argument checks, on this rank's rows of Y (``rows``)."""
    yf = y.to(factor_dtype(y.dtype))
    p = None
    if method == "cholesky_qr":
        p = cholesky_qr2(yf, rows)
    elif method == "randomized_cholesky_qr":
        p = randomized_cholesky_qr(yf, generator, oversample, rows)
    return (rows.householder(yf) if p is None else p).to(y.dtype)


def orthonormalize(y: torch.Tensor, method: str = "householder", *, oversample: float = RCQR_OVERSAMPLE,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """Q factor P of the thin QR Y = P R with diag(R) > 0, by one of ``QR_METHODS``.

    ``householder`` (torch.linalg.qr, signs fixed, sign(0) := +1); ``cholesky_qr``
    (CholeskyQR2); ``randomized_cholesky_qr`` (Gaussian sketch of k = ceil(oversample·r) rows
    drawn from ``generator``, R_s from the QR of S Y, then one CholeskyQR pass on Y R_s⁻¹ —
    microsoft/dion ``orthogonalize``). The Cholesky methods fall back to Householder where
    they lose orthogonality (a failed Cholesky, a non-finite result, or for CholeskyQR2 a
    first pass with ‖Y₁ᵀY₁ − I‖_F > ``CQR2_GRAM_DEVIATION``); the randomized method factors Y
    directly when k >= rows. Each costs one or two host syncs. See ``ortho_ref.orthonormalize``.
    Shapes: y (rows, r), rows >= r -> P (rows, r) in y's dtype with PᵀP = I; bfloat16 / float16
    are factored in float32 (as microsoft/dion).
    Raises: ValueError for an unknown method or a y that is not (rows, r) with rows >= r;
    TypeError for the randomized method without a torch.Generator.
    """
    if method not in QR_METHODS:
        raise ValueError(f"method: expected one of {QR_METHODS}, got {method!r}")
    if y.ndim != 2 or y.shape[0] < y.shape[1]:
        raise ValueError(f"y: expected shape (rows, r) with rows >= r, got {tuple(y.shape)}")
    if method == "randomized_cholesky_qr" and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator: randomized_cholesky_qr needs a torch.Generator, got {type(generator).__name__}")
    return orthonormalize_block(y, method, oversample, generator)


