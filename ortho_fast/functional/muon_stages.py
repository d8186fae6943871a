"""The Muon pipeline stages around Newton–Schulz, batched over (..., m, n).

nanochat's Muon step (``nanochat/optim.py``, ``muon_step_fused``) runs, per matrix:

    momentum -> MuonEq equilibration -> Newton–Schulz -> Muon+ renormalization -> NorMuon -> update

``equilibrate`` (MuonEq, arXiv 2603.28254), ``renormalize`` (Muon+, arXiv 2602.21545) and
``normuon_normalize`` (NorMuon, Li et al. arXiv 2510.05491; microsoft/dion ``dion/normuon.py``)
are those stages as functions of tensors; ``pre_orthogonalize`` / ``post_orthogonalize`` apply the
ones a param group switches on to its list of matrices (one call each in the group step).
Every stage computes in float32 or wider (``stage_dtype``): nanochat reads its bf16 matrices
``.float()`` for these norms; bf16 squares would lose the small rows. Equations and the
differences between the papers and the implementations: docs/math.md, "Muon pipeline stages".

Patch points (documented seams for tests that plant bugs): ``pre_orthogonalize`` /
``post_orthogonalize`` are looked up in this module at every group step (``ortho_fast.groups.muon``,
``ortho_fast.distributed.muon``), and they look up ``equilibrate``, ``renormalize`` and
``normuon_normalize`` here at every call, so ``monkeypatch.setattr(ortho_fast.functional.muon_stages,
"normuon_normalize", ...)`` reaches every Muon step run afterwards.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

#: MuonEq sides: "row" rescales rows (nanochat, the paper), "column" rescales columns.
EQUILIBRATION_SIDES = ("row", "column")
#: NorMuon's statistic: "row" one per row = output neuron (the paper; microsoft/dion, state (m, 1));
#: "column" one per column; "by_shape" per row when m >= n, else per column (nanochat).
NORMUON_DIMS = ("row", "column", "by_shape")
#: NorMuon's division: "add" O / (√v + eps) (microsoft/dion); "clamp" O / √max(v, eps) (nanochat).
NORMUON_EPS_MODES = ("add", "clamp")
#: The floor nanochat puts under a row norm (MuonEq) and under ‖O‖_F (Muon+).
NORM_FLOOR = 1e-6


def stage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the stages compute in: float64 for float64 input, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def equilibration_side(value) -> str | None:
    """The side a ``row_equilibration`` option means: False/None -> None, True -> "row", "row" /
    "column" as given. Raises: ValueError naming ``row_equilibration`` otherwise."""
    if value is None or value is False:
        return None
    if value is True:
        return "row"
    if isinstance(value, str) and value in EQUILIBRATION_SIDES:
        return value
    raise ValueError(f"row_equilibration: expected a bool or one of {EQUILIBRATION_SIDES}, got {value!r}")


def equilibrate(x: torch.Tensor, side: str = "row", *, floor: float = NORM_FLOOR) -> torch.Tensor:
    """MuonEq: each row x_i ← x_i · t / max(‖x_i‖₂, floor) with t = ‖X‖_F / √m (the root-mean-square
    row norm, so ‖X‖_F is kept); ``side="column"`` the same on columns. Out of place (the input
    may be the momentum buffer itself).

    Shapes: x (..., m, n) floating -> (..., m, n) in ``stage_dtype(x.dtype)``, per matrix.
    Source: MuonEq (arXiv 2603.28254); nanochat ``muon_step_fused`` (rows, norms in float32, floor 1e-6).
    Raises: ValueError naming ``side``.
    """
    if side not in EQUILIBRATION_SIDES:
        raise ValueError(f"side: expected one of {EQUILIBRATION_SIDES}, got {side!r}")
    w = x.to(stage_dtype(x.dtype))
    dim, count = (-1, w.shape[-2]) if side == "row" else (-2, w.shape[-1])
    norms = torch.linalg.vector_norm(w, dim=dim, keepdim=True)
    target = torch.linalg.vector_norm(w, dim=(-2, -1), keepdim=True) / math.sqrt(count)
    return w * (target / norms.clamp_min(floor))


def renormalize(o: torch.Tensor, *, floor: float = NORM_FLOOR) -> torch.Tensor:
    """Muon+: O ← O · √min(m, n) / max(‖O‖_F, floor), per matrix.

    Shapes: o (..., m, n) floating -> (..., m, n) in ``stage_dtype(o.dtype)``.
    Source: Muon+ (arXiv 2602.21545); nanochat ``muon_step_fused`` (floor 1e-6).
    """
    w = o.to(stage_dtype(o.dtype))
    target = math.sqrt(min(w.shape[-2], w.shape[-1]))
    return w * (target / torch.linalg.vector_norm(w, dim=(-2, -1), keepdim=True).clamp_min(floor))


def normuon_side(m: int, n: int, dim: str = "row") -> str:
    """"row" or "column": where NorMuon keeps its statistic for an (m, n) matrix ("by_shape":
    "row" when m >= n, nanochat's ``red_dim = -1 if m >= n else -2``).
    Raises: ValueError naming ``normuon_dim``."""
    if dim not in NORMUON_DIMS:
        raise ValueError(f"normuon_dim: expected one of {NORMUON_DIMS}, got {dim!r}")
    if dim == "by_shape":
        return "row" if m >= n else "column"
    return dim


def normuon_variance_shape(shape: Sequence[int], dim: str = "row") -> tuple[int, ...]:
    """Shape of NorMuon's second moment for matrices of ``shape`` (..., m, n): (..., m, 1) per
    row (microsoft/dion's ``param[..., 0:1]``), (..., 1, n) per column."""
    *batch, m, n = shape
    return (*batch, m, 1) if normuon_side(m, n, dim) == "row" else (*batch, 1, n)


def normuon_normalize(o: torch.Tensor, variance: torch.Tensor, *, beta2: float, eps: float = 1e-8,
                      eps_mode: str = "add", dim: str = "row") -> torch.Tensor:
    """NorMuon: v ← β₂v + (1 − β₂)·mean(O⊙O) per neuron (in place in ``variance``), Ô = O ⊘ d(v),
    returned as Ô·‖O‖_F/‖Ô‖_F per matrix (a zero Ô stays zero).

    d(v) = √v + eps ("add", microsoft/dion) or √max(v, eps) ("clamp", nanochat's
    ``rsqrt(clamp_min(v, 1e-10))``); no bias correction (neither implementation has one). The
    mean squares, the EMA (in the variance's dtype's ``stage_dtype``, stored back in its own
    dtype) and the norms are computed in ``stage_dtype``.
    Shapes: o (..., m, n); variance ``normuon_variance_shape(o.shape, dim)`` -> (..., m, n) in
    ``stage_dtype(o.dtype)``.
    Source: Li et al. arXiv 2510.05491; microsoft/dion ``_normuon_normalization_core``; nanochat
    ``muon_step_fused``. Raises: nothing (the group layer validates the options and the state).
    """
    w = o.to(stage_dtype(o.dtype), copy=True)  # scaled in place below (one O-sized buffer, not three)
    red = -1 if normuon_side(w.shape[-2], w.shape[-1], dim) == "row" else -2
    mean_square = w.square().mean(dim=red, keepdim=True)
    v = variance.to(stage_dtype(variance.dtype)).lerp(mean_square.to(stage_dtype(variance.dtype)), 1 - beta2)
    variance.copy_(v)
    v = v.to(w.dtype)
    scale = 1.0 / (v.sqrt() + eps) if eps_mode == "add" else v.clamp_min(eps).rsqrt()
    norm_w = torch.linalg.vector_norm(w, dim=(-2, -1), keepdim=True)
    y = w.mul_(scale)
    norm_y = torch.linalg.vector_norm(y, dim=(-2, -1), keepdim=True)
    return y.mul_(norm_w / norm_y.clamp_min(torch.finfo(w.dtype).tiny))


def pre_orthogonalize(mats: Sequence[torch.Tensor], *, equilibration: str | None) -> list[torch.Tensor]:
    """The stages before Newton–Schulz on a group's matrices: MuonEq with ``equilibration`` (a
    side, or None: the matrices unchanged, no copy)."""
    if equilibration is None:
        return list(mats)
    return [equilibrate(x, equilibration) for x in mats]


def post_orthogonalize(outs: Sequence[torch.Tensor], variances: Sequence[torch.Tensor] | None, *,
                       renormalize_norm: bool, beta2: float | None, eps: float, eps_mode: str,
                       dim: str) -> list[torch.Tensor]:
    """The stages after Newton–Schulz on one parameter's matrices, in nanochat's order: Muon+
    (``renormalize_norm``), then NorMuon (``beta2`` not None; ``variances[j]`` the second
    moment of matrix j, updated in place). Nothing switched on: the outputs unchanged."""
    result = [renormalize(o) for o in outs] if renormalize_norm else list(outs)
    if beta2 is not None:
        result = [normuon_normalize(o, v, beta2=beta2, eps=eps, eps_mode=eps_mode, dim=dim)
                  for o, v in zip(result, variances)]
    return result
