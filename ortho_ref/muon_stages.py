"""Reference stages of the Muon pipeline around Newton–Schulz (float64, one matrix, no torch).

The pipeline of a Muon step, in nanochat's order (``nanochat/optim.py``, ``muon_step_fused``):

    momentum -> MuonEq equilibration -> Newton–Schulz -> Muon+ renormalization -> NorMuon -> update

Each stage is a closed-form map of one (m, n) matrix, written here from the papers' definitions
(docs/math.md, "Muon pipeline stages"), independently of ``ortho_fast``:

- ``equilibrate`` (MuonEq, arXiv 2603.28254; nanochat): every row (or column) rescaled to the
  root-mean-square row norm ‖U‖_F/√m, so ‖U‖_F is unchanged and the spectrum entering
  Newton–Schulz is better conditioned.
- ``renormalize`` (Muon+, arXiv 2602.21545; nanochat): ‖O‖_F set to √min(m, n), the Frobenius
  norm of an exactly semi-orthogonal matrix.
- ``normuon_normalize`` (NorMuon, Li et al. arXiv 2510.05491; microsoft/dion ``dion/normuon.py``;
  nanochat): a per-neuron EMA of the mean square of O, O divided by its square root, then scaled
  back to ‖O‖_F.

``muon_pipeline_step`` (in ``ortho_ref.muon``) composes them with the reference momentum and
``ns_map``. ``equilibrate_mp``, ``renormalize_mp`` and ``normuon_normalize_mp`` are the mpmath
tier of each stage (closed forms without cancellation: ``digits`` + ``GUARD_DIGITS`` working digits).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import mpmath
import numpy as np

from ._validate import as_like, as_matrix, check_scalar
from .mp import GUARD_DIGITS, as_mp_input

#: MuonEq sides: "row" rescales rows (nanochat, the paper), "column" rescales columns.
EQUILIBRATION_SIDES = ("row", "column")
#: NorMuon's statistic: "row" one per row = output neuron (the paper; microsoft/dion, state (m, 1));
#: "column" one per column; "by_shape" per row when m >= n, per column when m < n (nanochat).
NORMUON_DIMS = ("row", "column", "by_shape")
#: NorMuon's division: "add" O / (√v + eps) (microsoft/dion, the paper); "clamp" O / √max(v, eps) (nanochat).
NORMUON_EPS_MODES = ("add", "clamp")
#: The floor nanochat puts under a row norm (MuonEq) and under ‖O‖_F (Muon+).
NORM_FLOOR = 1e-6


def equilibration_side(value) -> str | None:
    """The MuonEq side a ``row_equilibration`` option means: False/None -> None, True -> "row",
    "row" / "column" as given. Raises: ValueError naming ``row_equilibration`` otherwise."""
    if value is None or value is False:
        return None
    if value is True:
        return "row"
    if isinstance(value, str) and value in EQUILIBRATION_SIDES:
        return value
    raise ValueError(f"row_equilibration: expected a bool or one of {EQUILIBRATION_SIDES}, got {value!r}")


def equilibrate(u, side: str = "row", *, floor: float = NORM_FLOOR) -> np.ndarray:
    """MuonEq equilibration: each row u_i ← u_i · t / max(‖u_i‖₂, floor), t = ‖U‖_F / √m.

    t is the root-mean-square row norm, so for rows all above ``floor`` ‖U‖_F is unchanged
    (the arithmetic-mean row norm would differ by one scalar factor, which Newton–Schulz's
    Frobenius normalization removes up to its eps). ``side="column"`` applies the same to Uᵀ.
    Shapes: u (m, n) float -> (m, n) float64.
    Source: MuonEq (arXiv 2603.28254); nanochat ``muon_step_fused`` (rows, floor 1e-6).
    Raises: ValueError for a bad ``side`` or a non-2-D / non-finite ``u``.
    """
    x = as_matrix(u, "u")
    if side not in EQUILIBRATION_SIDES:
        raise ValueError(f"side: expected one of {EQUILIBRATION_SIDES}, got {side!r}")
    if side == "column":
        return equilibrate(x.T, "row", floor=floor).T
    row_norms = np.sqrt(np.einsum("ij,ij->i", x, x))
    target = math.sqrt(float(np.sum(row_norms ** 2)) / x.shape[0])
    return x * (target / np.maximum(row_norms, floor))[:, None]


def renormalize(o, *, floor: float = NORM_FLOOR) -> np.ndarray:
    """Muon+ renormalization: O ← O · √min(m, n) / max(‖O‖_F, floor).

    Shapes: o (m, n) float -> (m, n) float64.
    Source: Muon+ (arXiv 2602.21545); nanochat ``muon_step_fused`` (floor 1e-6).
    Raises: ValueError for a non-2-D / non-finite ``o``.
    """
    x = as_matrix(o, "o")
    return x * (math.sqrt(min(x.shape)) / max(float(np.linalg.norm(x)), floor))


def normuon_side(m: int, n: int, dim: str = "row") -> str:
    """Whether NorMuon keeps one statistic per "row" or per "column" of an (m, n) matrix.

    "row" / "column" as given; "by_shape": "row" when m >= n, else "column" (nanochat:
    ``red_dim = -1 if m >= n else -2``). Raises: ValueError naming ``normuon_dim``."""
    if dim not in NORMUON_DIMS:
        raise ValueError(f"normuon_dim: expected one of {NORMUON_DIMS}, got {dim!r}")
    if dim == "by_shape":
        return "row" if m >= n else "column"
    return dim


def normuon_variance_shape(m: int, n: int, dim: str = "row") -> tuple[int, int]:
    """Shape of NorMuon's second moment for an (m, n) matrix: (m, 1) per row, (1, n) per column."""
    return (m, 1) if normuon_side(m, n, dim) == "row" else (1, n)


class NorMuonResult(NamedTuple):
    """``normuon_normalize``'s result: the rescaled update (m, n) and the new second moment."""

    update: np.ndarray
    variance: np.ndarray


def normuon_normalize(o, variance, *, beta2: float, eps: float = 1e-8, eps_mode: str = "add",
                      dim: str = "row") -> NorMuonResult:
    """NorMuon: v ← β₂·v + (1 − β₂)·mean(O⊙O) per neuron, Ô = O ⊘ d(v), Ô ← Ô·‖O‖_F/‖Ô‖_F.

    mean over the columns for a per-row statistic (over the rows per column); d(v) = √v + eps
    ("add") or √max(v, eps) ("clamp"). No bias correction (neither implementation has one). A zero
    Ô gives a zero update.
    Shapes: o (m, n) float; variance (m, 1) or (1, n) (``normuon_variance_shape``) float ->
    NorMuonResult of float64 arrays of the same shapes.
    Source: Li et al. arXiv 2510.05491 (NorMuon; per-neuron second moment); microsoft/dion
    ``dion/normuon.py`` (``_normuon_normalization_core``: rows, √v + 1e-8, norm restored);
    nanochat ``muon_step_fused`` (row or column by shape, rsqrt(max(v, 1e-10)), norm restored).
    Raises: ValueError for a bad ``dim`` / ``eps_mode``, ``beta2`` outside [0, 1), ``eps`` < 0,
    a variance of the wrong shape, non-finite input.
    """
    x = as_matrix(o, "o")
    side = normuon_side(*x.shape, dim)
    v = as_like(variance, "variance", normuon_variance_shape(*x.shape, dim))
    beta2 = check_scalar(beta2, "beta2", low=0.0, high=1.0)
    if beta2 >= 1.0:
        raise ValueError(f"beta2: expected a value in [0, 1), got {beta2!r}")
    eps = check_scalar(eps, "eps", low=0.0)
    if eps_mode not in NORMUON_EPS_MODES:
        raise ValueError(f"eps_mode: expected one of {NORMUON_EPS_MODES}, got {eps_mode!r}")
    squares = x * x
    mean_square = squares.sum(axis=1, keepdims=True) / x.shape[1] if side == "row" else \
        squares.sum(axis=0, keepdims=True) / x.shape[0]
    v_new = beta2 * v + (1.0 - beta2) * mean_square
    denominator = np.sqrt(v_new) + eps if eps_mode == "add" else np.sqrt(np.maximum(v_new, eps))
    y = x / denominator
    norm_y = float(np.linalg.norm(y))
    if norm_y == 0.0:
        return NorMuonResult(np.zeros_like(x), v_new)
    return NorMuonResult(y * (float(np.linalg.norm(x)) / norm_y), v_new)


# ---------------------------------------------------------------------------------------------
# The mpmath tier: the same stages at ``digits`` decimal digits
# ---------------------------------------------------------------------------------------------

def _mp_matrix(a, digits, name: str) -> tuple[list[list], int]:
    arr, d = as_mp_input(a, digits, name)
    return [[mpmath.mpf(x) for x in row] for row in arr.tolist()], d


def _mp_norm(values) -> "mpmath.mpf":
    return mpmath.sqrt(mpmath.fsum(x * x for x in values))


def equilibrate_mp(u, side: str = "row", *, digits, floor: float = NORM_FLOOR) -> np.ndarray:
    """``equilibrate`` exact to ``digits`` digits (mpmath; the float64 input taken exactly).

    Shapes: u (m, n) float, m, n <= ``ortho_ref.mp.MAX_DIM`` -> (m, n) object array of mpmath.mpf.
    Precision: digits + ``GUARD_DIGITS`` working digits suffice: sums of squares, square roots,
    products and quotients of positive numbers lose no digits (no cancellation).
    Raises: as ``ortho_ref.mp.as_mp_input``; ValueError for a bad ``side``.
    """
    if side not in EQUILIBRATION_SIDES:
        raise ValueError(f"side: expected one of {EQUILIBRATION_SIDES}, got {side!r}")
    if side == "column":
        return equilibrate_mp(np.asarray(u, dtype=np.float64).T, "row", digits=digits, floor=floor).T
    rows, d = _mp_matrix(u, digits, "u")
    with mpmath.workdps(d + GUARD_DIGITS):
        norms = [_mp_norm(r) for r in rows]
        target = mpmath.sqrt(mpmath.fsum(x * x for x in norms) / len(rows))
        out = [[x * (target / max(nr, mpmath.mpf(floor))) for x in r] for r, nr in zip(rows, norms)]
    return np.array(out, dtype=object)


def renormalize_mp(o, *, digits, floor: float = NORM_FLOOR) -> np.ndarray:
    """``renormalize`` exact to ``digits`` digits (mpmath; no cancellation, digits + GUARD_DIGITS).

    Shapes: o (m, n) float, m, n <= MAX_DIM -> (m, n) object array of mpmath.mpf.
    Raises: as ``ortho_ref.mp.as_mp_input``.
    """
    rows, d = _mp_matrix(o, digits, "o")
    with mpmath.workdps(d + GUARD_DIGITS):
        scale = mpmath.sqrt(min(len(rows), len(rows[0]))) / max(_mp_norm(x for r in rows for x in r),
                                                                  mpmath.mpf(floor))
        out = [[x * scale for x in r] for r in rows]
    return np.array(out, dtype=object)


def normuon_normalize_mp(o, variance, *, beta2: float, eps: float = 1e-8, eps_mode: str = "add", dim: str = "row",
                         digits) -> NorMuonResult:
    """``normuon_normalize`` exact to ``digits`` digits (mpmath; every float64 input taken exactly;
    no cancellation: β₂v + (1 − β₂)·mean square adds positive numbers, digits + GUARD_DIGITS).

    Shapes: o (m, n) float, m, n <= MAX_DIM; variance (m, 1) or (1, n) -> NorMuonResult of object
    arrays of mpmath.mpf. Raises: as ``normuon_normalize`` and ``ortho_ref.mp.as_mp_input``.
    """
    x = as_matrix(o, "o")
    normuon_normalize(x, variance, beta2=beta2, eps=eps, eps_mode=eps_mode, dim=dim)  # the same checks, float64
    transpose = normuon_side(*x.shape, dim) == "column"
    rows, d = _mp_matrix(x.T if transpose else x, digits, "o")
    v_in = np.asarray(variance, dtype=np.float64).reshape(-1).tolist()
    with mpmath.workdps(d + GUARD_DIGITS):
        b2, e = mpmath.mpf(beta2), mpmath.mpf(eps)
        v = [b2 * mpmath.mpf(vi) + (1 - b2) * mpmath.fsum(y * y for y in r) / len(r) for vi, r in zip(v_in, rows)]
        den = [mpmath.sqrt(vi) + e if eps_mode == "add" else mpmath.sqrt(max(vi, e)) for vi in v]
        y = [[z / di for z in r] for r, di in zip(rows, den)]
        norm_y = _mp_norm(z for r in y for z in r)
        ratio = _mp_norm(z for r in rows for z in r) / norm_y if norm_y != 0 else mpmath.mpf(0)
        out = np.array([[z * ratio for z in r] for r in y], dtype=object)
    v_out = np.array(v, dtype=object).reshape(normuon_variance_shape(*x.shape, dim))
    return NorMuonResult(out.T if transpose else out, v_out)
