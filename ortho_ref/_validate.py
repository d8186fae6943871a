"""Input validation shared by the oracle's public functions (numpy only)."""

from __future__ import annotations

import numpy as np


def _asarray(a, name: str, expected: str, dtype=None) -> np.ndarray:
    """``np.asarray(a, dtype)`` whose failures name the argument and what was expected (numpy's own
    messages name neither): a ragged nested sequence, a torch bfloat16 tensor (numpy has no
    bfloat16), values that are not numbers.
    Raises: ValueError (ragged), TypeError (bfloat16 tensor, not convertible)."""
    if type(a).__module__.startswith("torch") and str(getattr(a, "dtype", "")) == "torch.bfloat16":
        raise TypeError(f"{name}: expected {expected}; got a torch.bfloat16 tensor, which numpy cannot hold: pass "
                        f"{name}.float() or {name}.double() (the oracle computes in float64)")
    try:
        return np.asarray(a, dtype=dtype)
    except ValueError as err:
        if "inhomogeneous" in str(err) or "sequence" in str(err):
            raise ValueError(f"{name}: expected {expected}; got a ragged nested sequence (rows of different "
                             "lengths)") from None
        raise ValueError(f"{name}: expected {expected}; numpy could not convert it ({err})") from None
    except TypeError as err:
        raise TypeError(f"{name}: expected {expected}; got {type(a).__name__}, which numpy could not convert "
                        f"({err})") from None


def as_matrix(a, name: str, *, allow_nonfinite: bool = False) -> np.ndarray:
    """Return ``a`` as a float64 (m, n) array, or raise a clear error.

    Shapes: a (m, n) with m, n >= 1 -> (m, n) float64 (a copy when the dtype changes).
    Raises: TypeError for integer, boolean, complex or object dtypes; ValueError when
    ``a`` is not 2-D, is empty, or (unless ``allow_nonfinite``) holds NaN or Inf.
    """
    arr = _asarray(a, name, "a real floating-point (m, n) array (float16/32/64)")
    if arr.dtype.kind not in "f":
        raise TypeError(
            f"{name}: expected a real floating-point array (float16/32/64), got dtype {arr.dtype}"
        )
    if arr.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D array of shape (m, n), got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name}: expected a non-empty (m, n) array with m, n >= 1, got shape {arr.shape}")
    arr = arr.astype(np.float64, copy=False)
    if not allow_nonfinite and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: contains NaN or Inf; expected finite values")
    return arr


def as_like(a, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Return ``a`` as a finite float64 array of exactly ``shape``, or raise.

    Raises: TypeError (non-float dtype), ValueError (wrong shape, NaN or Inf).
    """
    arr = _asarray(a, name, f"a real floating-point array of shape {tuple(shape)}")
    if arr.dtype.kind not in "f":
        raise TypeError(f"{name}: expected a real floating-point array, got dtype {arr.dtype}")
    if arr.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {arr.shape}")
    arr = arr.astype(np.float64, copy=False)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: contains NaN or Inf; expected finite values")
    return arr


def as_coefficients(coefficients, name: str = "coefficients") -> np.ndarray:
    """Return a Newton–Schulz coefficient table as a float64 (T, 3) array with T >= 1.

    Raises: ValueError when the table is not (T, 3), is empty, or is not finite.
    """
    table = _asarray(coefficients, name, "a (T, 3) table of (a, b, c) rows of real numbers", np.float64)
    if table.ndim == 1 and table.shape == (3,):
        table = table[None, :]
    if table.ndim != 2 or table.shape[1] != 3 or table.shape[0] < 1:
        raise ValueError(
            f"{name}: expected a (T, 3) table of (a, b, c) rows with T >= 1, got shape {table.shape}"
        )
    if not np.all(np.isfinite(table)):
        raise ValueError(f"{name}: contains NaN or Inf")
    return table


def check_scalar(value, name: str, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False) -> float:
    """Return ``value`` as a finite float within [low, high] (or (low, high] if low_open).

    Raises: ValueError naming the argument and the expected range.
    """
    if isinstance(value, (str, bytes)):  # float("1.0") would take it
        raise ValueError(f"{name}: expected a real number, got the string {value!r}")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a real number, got {value!r}") from None
    bad = not np.isfinite(x)
    if low is not None:
        bad = bad or (x <= low if low_open else x < low)
    if high is not None:
        bad = bad or x > high
    if bad:
        lo = "-inf" if low is None else f"{low}"
        hi = "inf" if high is None else f"{high}"
        bracket = "(" if low_open else "["
        raise ValueError(f"{name}: expected a finite value in {bracket}{lo}, {hi}], got {value!r}")
    return x


def check_choice(value, name: str, choices: tuple) -> None:
    """Raise ValueError naming ``name`` and the ``choices`` unless ``value`` is one of them."""
    if value not in choices:
        raise ValueError(f"{name}: expected one of {choices}, got {value!r}")
