"""Arbitrary-precision tier of the oracle (mpmath): polar factor and Newton–Schulz map.

``ortho_ref.polar(a, digits=d)`` and ``ortho_ref.ns_map(a, table, digits=d)`` land here. The
input is the float64 matrix as given (every float64 is an mpf exactly), and so are the
coefficients, safety and eps: the result is the exact value of the function at those
float64 numbers (e.g. the float64 nearest 3.4445, not the decimal 3.4445).

Return type: a numpy ``object`` array of ``mpmath.mpf`` of the float64 function's shape.
Its entries carry the working precision they were computed at; arithmetic on them runs at
mpmath's *current* precision (15 digits unless set), so use ``mpmath.workdps`` for further
high-precision work, ``to_float64`` to round, and ``to_hi_lo`` for a float64 double-double.

Precision. The work runs inside ``mpmath.workdps(W)`` (the global precision is never
changed) with W = digits + GUARD_DIGITS + the decimal digits the computation can lose:
log10 of the condition number (polar) or of the Newton–Schulz gains (ns_map). mpmath's SVD
(``mpmath.svd_r``: Householder bidiagonalization and implicit QR) is backward stable at
W digits, so the result is within 10^-digits·scale of the exact value in every entry
(scale 1 for the polar factor, max(1, max|f|) for ns_map); GUARD_DIGITS = 10 covers the
size-dependent constants (≤ 10⁵ for n ≤ 64) with a margin of 10⁵.

Speed. mpmath is pure Python unless gmpy2 is installed, which it then uses automatically
(``mpmath.libmp.BACKEND == "gmpy"``; the environment variable MPMATH_NOGMPY=1 turns it off).
Measured on one core: 64 × 64 polar at 50 digits ≈ 9 s (python backend), ≈ 6 s (gmpy2);
16 × 16 SVD at 1000 digits 1.3 s (python), 0.3 s (gmpy2); 64 × 64 at 1000 digits ≈ 90 s
(python). Hence the limits MAX_DIM and MAX_DIGITS, checked before any work.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np

from ._validate import as_matrix
from .ns_bands import ns_step_gains, ns_step_magnitudes
from .ns_polynomials import check_ns_options

#: Fewer digits than float64 carries: use the float64 functions instead.
MIN_DIGITS = 16
#: 64 × 64 at 1000 digits takes about 1.5 minutes with the pure-Python backend.
MAX_DIGITS = 1000
#: Largest m or n: a 64 × 64 polar at 50 digits takes about 9 s (128 × 128 would take ~70 s).
MAX_DIM = 64
#: Extra working digits beyond ``digits`` and the condition-number digits (see module docstring).
GUARD_DIGITS = 10
#: float64 singular values resolve σ_k/σ_1 only down to about this (backward error ~u·σ_1).
FLOAT64_RESOLVED = 1e-12


def check_digits(digits) -> int:
    """Return ``digits`` as an int in [MIN_DIGITS, MAX_DIGITS], or raise.

    Raises: TypeError for a non-integer (bool included); ValueError below MIN_DIGITS (use
    the float64 path, ``digits=None``) or above MAX_DIGITS (quoting the limit).
    """
    if isinstance(digits, bool) or not isinstance(digits, (int, np.integer)):
        raise TypeError(f"digits: expected an integer number of decimal digits, got {digits!r}")
    d = int(digits)
    if d < MIN_DIGITS:
        raise ValueError(f"digits: expected >= {MIN_DIGITS}, got {d}; for float64 accuracy call with digits=None "
                         "(the float64 path)")
    if d > MAX_DIGITS:
        raise ValueError(f"digits: expected <= MAX_DIGITS = {MAX_DIGITS} (a 64 x 64 SVD at 1000 digits takes about "
                         f"1.5 minutes), got {d}")
    return d


def as_mp_input(a, digits, name: str = "a") -> tuple[np.ndarray, int]:
    """Validate ``digits`` and the matrix ``a`` (called ``name`` in errors) for the mpmath tier:
    (float64 (m, n) array, digits).

    Raises: as ``check_digits``; as ``ortho_ref.polar`` for ``a``; ValueError if m or n
    exceeds MAX_DIM (quoting the limit).
    """
    d = check_digits(digits)
    arr = as_matrix(a, name)
    if max(arr.shape) > MAX_DIM:
        raise ValueError(f"{name}: the mpmath tier accepts m, n <= MAX_DIM = {MAX_DIM} (a 64 x 64 polar at 50 digits "
                         f"takes about 9 s), got shape {arr.shape}")
    return arr, d


def _svd(arr: np.ndarray) -> tuple[np.ndarray, list, np.ndarray]:
    """Thin SVD by ``mpmath.svd_r`` at the current precision: U (m, k), s (k,) descending,
    Vt (k, n) as object arrays / list of mpf."""
    u, s, vt = mpmath.svd_r(mpmath.matrix(arr.tolist()))
    return np.array(u.tolist(), dtype=object), [s[i] for i in range(s.rows)], np.array(vt.tolist(), dtype=object)


def digits_lost(ratio) -> int:
    """Decimal digits an amplification factor costs: ceil(log10(ratio)) for ratio > 1, else 0.

    Shapes: ratio a float or an mpf of any size -> int.
    """
    return int(mpmath.ceil(mpmath.log10(ratio))) if ratio > 1 else 0


def polar(a, digits) -> np.ndarray:
    """Polar factor U Vᵀ of A = U Σ Vᵀ, exact to ``digits`` decimal digits.

    Shapes: a (m, n) float, m, n <= MAX_DIM -> (m, n) object array of mpmath.mpf.
    Precision: singular values below σ₁·10^-(digits + GUARD_DIGITS) are treated as zero and
    the result is the partial isometry U_r V_rᵀ on the others (for a full-rank float64 input
    that is the polar factor itself; an exactly rank-deficient input has no unique polar
    factor, and this is the reference value of docs/math.md §1). The working precision is
    digits + GUARD_DIGITS + log10(σ₁/σ_r): first estimated from the float64 singular values,
    raised (and the SVD repeated) if the mpmath singular values show more digits are lost.
    Every entry is then within 10^-digits of the exact partial isometry.
    Source: Higham, Functions of Matrices (2008), Thm. 8.1; mpmath.svd_r.
    Raises: as ``as_mp_input``.
    """
    arr, d = as_mp_input(a, digits)
    s64 = np.linalg.svd(arr, compute_uv=False)
    # float64 resolves σ₁/σ_k only up to ~1e12; beyond, guess 20 digits (re-checked below)
    ratio = s64[0] / s64[-1] if s64[-1] > FLOAT64_RESOLVED * s64[0] else 1e20
    work = d + GUARD_DIGITS + max(GUARD_DIGITS, digits_lost(ratio))
    while True:
        with mpmath.workdps(work):
            u, s, vt = _svd(arr)
            threshold = s[0] * mpmath.mpf(10) ** -(d + GUARD_DIGITS)
            r = sum(1 for x in s if x > threshold)
            if r == 0:
                return np.full(arr.shape, mpmath.mpf(0), dtype=object)
            need = d + GUARD_DIGITS + digits_lost(s[0] / s[r - 1])
            if need <= work:
                return u[:, :r] @ vt[:r, :]
        work = need


def ns_map(a, coefficients, *, safety: float, eps: float, eps_mode: str, digits) -> np.ndarray:
    """U f(Σ / normalizer(‖A‖_F)) Vᵀ (see ``ortho_ref.ns_map``), exact to ``digits`` digits.

    Shapes: a (m, n) float, m, n <= MAX_DIM -> (m, n) object array of mpmath.mpf;
    coefficients (T, 3) float64 (validated by the caller).
    Precision: working digits = digits + GUARD_DIGITS + log10(G₀ + Σ_t G_t·S_t), the first-order
    gains and term sizes of the schedule (``ns_step_gains``, ``ns_step_magnitudes``, exact sups)
    over σ̂ ∈ [0, 1/safety], the largest range a normalized input can have (there G₀ =
    ``ns_lipschitz(table, 0, 1/safety)``). Every entry is then within 10^-digits·max(1, max|f|)
    of the exact value.
    Source: Amsel et al. 2025 (arXiv 2505.16932), Sec. 2; mpmath.svd_r.
    Raises: as ``as_mp_input``; ValueError as ``ortho_ref.ns_map`` for the table, safety <= 0,
    eps < 0 or an unknown eps_mode; ValueError if the gains overflow float64 (the schedule is
    unusable at any precision this tier allows).
    """
    arr, d = as_mp_input(a, digits)
    table, safety, eps = check_ns_options(coefficients, safety, eps, eps_mode)
    hi = 1.0 / safety
    gains = ns_step_gains(table, 0.0, hi)
    amplification = float(gains[0] + np.dot(gains[1:], ns_step_magnitudes(table, 0.0, hi)))
    if not math.isfinite(amplification):
        raise ValueError("coefficients: the schedule's first-order gains overflow float64 on [0, 1/safety]")
    work = d + GUARD_DIGITS + digits_lost(amplification)
    with mpmath.workdps(work):
        u, s, vt = _svd(arr)
        norm = mpmath.sqrt(mpmath.fsum(mpmath.mpf(x) ** 2 for x in arr.ravel().tolist()))
        scaled = mpmath.mpf(safety) * norm
        denom = scaled + mpmath.mpf(eps) if eps_mode == "add" else max(scaled, mpmath.mpf(eps))
        if denom == 0:
            return np.full(arr.shape, mpmath.mpf(0), dtype=object)
        fs = []
        for x in s:
            y = x / denom
            for a_t, b_t, c_t in table.tolist():
                y2 = y * y
                y = y * (mpmath.mpf(a_t) + y2 * (mpmath.mpf(b_t) + mpmath.mpf(c_t) * y2))
            fs.append(y)
        return (u * np.array(fs, dtype=object)) @ vt


def to_float64(x) -> np.ndarray:
    """Round each entry of an mpmath array to the nearest float64.

    Parameters
    ----------
    x : array_like of mpmath.mpf, shape (...)
        An object array of ``mpmath.mpf`` (as the ``digits=`` tier returns) or of numbers.

    Returns
    -------
    float64 ndarray, shape (...)
        ``float(v)`` of each entry: rounded to 53 bits in mpmath's rounding mode (to nearest unless
        changed), exact for an mpf of at most 53 bits in the normal range.

    References
    ----------
    F. Johansson et al., mpmath: a Python library for arbitrary-precision floating-point
    arithmetic, https://mpmath.org (``mpf.__float__``, ``libmp.to_float``).

    Examples
    --------
    >>> import mpmath
    >>> import numpy as np
    >>> from ortho_ref import to_float64
    >>> with mpmath.workdps(30):
    ...     x = np.array([mpmath.mpf(1) / 3, mpmath.sqrt(2)], dtype=object)
    >>> to_float64(x).tolist() == [1 / 3, 2 ** 0.5]
    True
    """
    arr = np.asarray(x, dtype=object)
    return np.array([float(v) for v in arr.ravel()], dtype=np.float64).reshape(arr.shape)


def to_hi_lo(x) -> tuple[np.ndarray, np.ndarray]:
    """Double-double split of mpmath values: hi = fl(x), lo = fl(x − hi).

    x − hi is formed exactly (``mpmath.fsub(exact=True)``) and rounded once, so hi + lo equals x to
    about 2⁻¹⁰⁶|x| (about 32 decimal digits).

    Parameters
    ----------
    x : array_like of mpmath.mpf, shape (...)
        An object array of ``mpmath.mpf``.

    Returns
    -------
    hi : float64 ndarray, shape (...)
        The nearest float64 to each entry.
    lo : float64 ndarray, shape (...)
        The nearest float64 to the remainder x − hi.

    References
    ----------
    T. J. Dekker, "A floating-point technique for extending the available precision", Numer. Math.
    18, 1971.

    Examples
    --------
    >>> import mpmath
    >>> import numpy as np
    >>> from ortho_ref import from_hi_lo, to_hi_lo
    >>> with mpmath.workdps(40):
    ...     x = np.array([mpmath.mpf(1) / 3], dtype=object)
    ...     hi, lo = to_hi_lo(x)
    ...     error = abs(from_hi_lo(hi, lo)[0] - x[0])
    >>> bool(hi[0] == 1 / 3), bool(0 < abs(lo[0]) < 1e-16), bool(error < mpmath.mpf(2) ** -105)
    (True, True, True)
    """
    arr = np.asarray(x, dtype=object)
    hi = to_float64(arr)
    lo = [float(mpmath.fsub(v, h, exact=True)) for v, h in zip(arr.ravel(), hi.ravel().tolist())]
    return hi, np.array(lo, dtype=np.float64).reshape(arr.shape)


def from_hi_lo(hi, lo) -> np.ndarray:
    """The exact sums hi + lo of float64 pairs, as mpmath numbers.

    The inverse of ``to_hi_lo`` up to its 2⁻¹⁰⁶ rounding; each sum is formed exactly
    (``mpmath.fadd(exact=True)``).

    Parameters
    ----------
    hi : array_like of float, shape (...)
        The leading parts.
    lo : array_like of float, shape (...)
        The trailing parts, of the shape of `hi`.

    Returns
    -------
    object ndarray of mpmath.mpf, shape (...)
        hi + lo exactly.

    Raises
    ------
    ValueError
        If `hi` and `lo` have different shapes.

    References
    ----------
    T. J. Dekker, "A floating-point technique for extending the available precision", Numer. Math.
    18, 1971.

    Examples
    --------
    >>> import mpmath
    >>> from ortho_ref import from_hi_lo
    >>> x = from_hi_lo([1.0], [2.0 ** -80])
    >>> x[0] - 1 == mpmath.mpf(2) ** -80  # the sum holds both parts
    True
    >>> float(x[0]) == 1.0
    True
    """
    hi, lo = np.asarray(hi, dtype=np.float64), np.asarray(lo, dtype=np.float64)
    if hi.shape != lo.shape:
        raise ValueError(f"hi, lo: expected equal shapes, got {hi.shape} and {lo.shape}")
    out = [mpmath.fadd(h, lo_, exact=True) for h, lo_ in zip(hi.ravel().tolist(), lo.ravel().tolist())]
    return np.array(out, dtype=object).reshape(hi.shape)
