"""Tolerances of the Muon pipeline stages: MuonEq, Muon+ renormalization, NorMuon (docs/tolerances.md,
"Muon pipeline stages").

A fast Muon step with stages against ``ortho_ref.muon.muon_pipeline_step``: the Newton–Schulz
error ε₀ (``ns_tolerance`` at the reference's Newton–Schulz input, after MuonEq) is carried through
each stage by its first-order perturbation bound, and each stage adds its own rounding in the
dtype it computes in (float32 for bfloat16 / float32 parameters, float64 for float64: ``u_s``).
Every factor is derived below; none was tuned.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .roundoff import C_NS, U64, UNIT_ROUNDOFF, unit_roundoff

__all__ = ["StageTolerances", "equilibration_error", "normuon_amplification", "scaled_product_update_bound",
           "scaling_error",
           "stage_dtype_roundoff", "stage_tolerances"]


def stage_dtype_roundoff(dtype) -> float:
    """u_s + u64: the stages compute in float32 for bfloat16 / float16 / float32, float64 for float64
    (``ortho_fast.functional.muon_stages.stage_dtype``), plus the float64 oracle's own rounding."""
    return min(unit_roundoff(dtype), UNIT_ROUNDOFF["float32"]) + U64


def scaled_product_update_bound(w_abs, product_abs, dtype="float32"):
    """Per entry, the distance from the exact W + α·O·f allowed to an update computed in ``dtype``
    (the stacked step's Muon+ / NorMuon update, ``ortho_fast.functional.muon_stages``):

        u·|W| + 5u·|α·O·f|,   u = unit_roundoff(dtype)

    Derivation: the update in rounds casts α to ``dtype``, forms Ô = O·f, then α·Ô (three relative
    roundings of the product: (1 + u)³ − 1 ≤ 3u(1 + u)), and the sum rounds once more, at most
    u·(|W| + |α·Ô|(1 + 3u(1 + u))): in all u·|W| + 4u(1 + u)²·|α·O·f| < u·|W| + 5u·|α·O·f| (u ≤ 2⁻¹¹).
    The fused ``_foreach_addcmul_`` rounds fewer times (α, α·O, the fused multiply-add) and is within
    it too. ``w_abs``, ``product_abs``: |W| and |α·O·f| (exact, float64), numpy arrays or tensors;
    returns the same kind."""
    u = unit_roundoff(dtype)
    return u * w_abs + 5 * u * product_abs


def scaling_error(count: int, dtype) -> float:
    """Relative error of x·(c / ‖y‖₂) with ‖y‖₂ a norm of ``count`` numbers, computed in the stage dtype.

        (C_NS·√count + 4)·(u_s + u64)

    Derivation: the sum of ``count`` squares has relative error ≤ C_NS·√count·u_s (Higham & Mary's
    probabilistic bound, as ``matmul_roundoff``), the square root halves it and adds u_s; the
    division and the product add 2u_s, and the floor or clamp none (it is exact)."""
    return (C_NS * math.sqrt(count) + 4) * stage_dtype_roundoff(dtype)


def equilibration_error(shape: tuple[int, int], dtype, side: str = "row") -> float:
    """Relative error δ of every entry of the equilibrated matrix Ũ = D·U computed in the stage dtype.

        δ = (C_NS·(√ℓ + √(mn)) + 6)·(u_s + u64),  ℓ = n for rows (m for columns)

    Derivation. Entry (i, j) is u_ij·t/‖u_i‖: the row norm is a sum of ℓ squares (relative error ≤
    C_NS·√ℓ·u_s, Higham & Mary's probabilistic bound as in ``matmul_roundoff``, halved by the
    square root, which adds u_s), the target t = ‖U‖_F/√m a sum of mn squares (C_NS·√(mn)·u_s,
    the square root and the division by √m 2u_s), then the quotient and the product 2u_s. So
    ‖ΔŨ‖_F ≤ δ‖Ũ‖_F. (The target's error is one factor common to every row, which Newton–Schulz's
    Frobenius normalization removes in the whole step; the stage compared alone sees it.)
    """
    m, n = shape
    length = n if side == "row" else m
    return (C_NS * (math.sqrt(length) + math.sqrt(m * n)) + 6) * stage_dtype_roundoff(dtype)


def normuon_amplification(update: np.ndarray, variance: np.ndarray, *, eps: float, eps_mode: str) -> float:
    """A = 1 + 2‖O‖_F / (‖Y‖_F · d_min): first-order gain of NorMuon's output with respect to its input O.

    Derivation. Per neuron i (a row, or a column), Y_i = O_i / d_i with d_i = √v_i + eps (or
    √max(v_i, eps)), v_i = β₂v_i⁻ + (1 − β₂)‖O_i‖²/ℓ ≥ (1 − β₂)‖O_i‖²/ℓ. A change ΔO_i changes
    v_i by (1 − β₂)·2‖O_i‖‖ΔO_i‖/ℓ to first order, so Δd_i/d_i ≤ Δv_i/(2v_i) ≤ ‖ΔO_i‖/‖O_i‖, and
    ‖ΔY_i‖ ≤ ‖ΔO_i‖/d_i + ‖Y_i‖·‖ΔO_i‖/‖O_i‖ = 2‖ΔO_i‖/d_i. The output Z = Y·‖O‖/‖Y‖ changes by
    (‖O‖/‖Y‖)(I − ŶŶᵀ)ΔY + Ŷ·Δ‖O‖, at most (‖O‖/‖Y‖)·2‖ΔO‖/d_min + ‖ΔO‖. ‖Y‖ ≥ ‖O‖/d_max, so
    A ≤ 1 + 2·d_max/d_min: NorMuon is as well conditioned as its denominators are alike.
    Shapes: update (m, n) the stage's input O (float64, the reference's); variance its new second
    moment (m, 1) or (1, n) (the reference's).
    """
    o = np.asarray(update, dtype=np.float64)
    v = np.asarray(variance, dtype=np.float64)
    d = np.sqrt(v) + eps if eps_mode == "add" else np.sqrt(np.maximum(v, eps))
    y = o / d
    norm_y, norm_o = float(np.linalg.norm(y)), float(np.linalg.norm(o))
    if norm_y == 0.0 or norm_o == 0.0:
        return 1.0
    return 1.0 + 2.0 * norm_o / (norm_y * float(d.min()))


class StageTolerances(NamedTuple):
    """``stage_tolerances``' result: Frobenius tolerances of the final update O (before lr) and of
    NorMuon's new second moment (0.0 without NorMuon), and the amplification of the Newton–Schulz
    error through the stages (the ratio of the update tolerance to ε₀ without the stages' own roundings)."""

    update: float
    variance: float
    gain: float


def stage_tolerances(ns_tol: float, *, shape: tuple[int, int], dtype, ns_gain: float, ns_output: np.ndarray,
                     renormalized: np.ndarray | None = None, equilibration: str | None = None,
                     normuon_input: np.ndarray | None = None, variance: np.ndarray | None = None,
                     normuon_beta2: float | None = None, normuon_eps: float = 1e-8, normuon_eps_mode: str = "add",
                     normuon_rows: bool = True, state_dtype=None) -> StageTolerances:
    """Frobenius tolerances of a fast step's stages against the reference's (``muon_pipeline_step``).

    ε₀ = ``ns_tol`` (``ns_tolerance`` at the σ̂ of the reference's Newton–Schulz input, after MuonEq);
    then, in the pipeline's order:

    - MuonEq (before Newton–Schulz): its relative error δ (``equilibration_error``) perturbs the
      Newton–Schulz input; the normalized input X₀ = Ũ/(s‖Ũ‖_F + eps) moves by ≤ 2δ‖X₀‖_F ≤ 2δ
      (s ≥ 1: the direction and the norm each move by ≤ δ), and the output by at most
      G₀·2δ, G₀ = ``ns_gain`` the first-order gain of the whole map (``gains_and_sizes``' G_0):
      ε₀ ← ε₀ + 2·G₀·δ.
    - Muon+ (``renormalized`` the reference's output of it): Z = O·c/‖O‖_F, c = √min(m, n), moves
      by (c/‖O‖_F)(I − ÔÔᵀ)ΔO ≤ (c/‖O‖_F)·ε to first order; the factor 2 covers the second-order
      term while ε ≤ ‖O‖_F/2 (beyond that no bound is claimed: the tolerance then exceeds ‖Z‖_F = c
      anyway). Its own rounding: ‖O‖_F is a sum of mn squares (C_NS·√(mn)·u_s relative), then a
      division and a product (2u_s): c·(C_NS·√(mn) + 4)(u_s + u64).
    - NorMuon (``normuon_input`` O and ``variance`` v the reference's): ε ← 2·A·ε with A =
      ``normuon_amplification`` (first order; 2 for the second order as above), plus its own
      rounding 2·(C_NS(√ℓ + √(mn)) + 12)(u_s + u64)·‖O‖_F: a relative change ≤ η of every Y_i
      moves Z by ≤ 2η‖O‖_F (the renormalization removes the common part), a common relative
      change δ by δ‖O‖_F. ortho_fast forms Z = O·f from the neurons' norms r_i (a sum of ℓ
      squares: (C_NS√ℓ/2 + 1)u_s after the square root): the mean squares r_i²/ℓ, the EMA (3u_s),
      the square root, eps and reciprocal give each 1/d_i ≤ (C_NS√ℓ/2 + 6.5)u_s ≤ (C_NS√ℓ + 6)u_s,
      with the products f_i = d_i⁻¹·ratio and O_i·f_i η ≤ (C_NS√ℓ + 8)u_s; the common part is the
      ratio ‖r‖₂/‖r ⊘ d‖₂ (each a sum of m squares of rounded r_i: ≤ (C_NS√(mn)/2 + 4.5)u_s, as
      √ℓ + √m ≤ √(mn) + 1) and its division: 2η + δ ≤ (2C_NS√ℓ + C_NS√(mn) + 26)u_s, within
      the bound (C_NS√(mn) ≥ 2).
      The second moment: ‖Δv‖₂ ≤ (1 − β₂)(2·max_i ‖O_i‖·ε + ε²)/ℓ (its first and second order in
      the input error ε of NorMuon, exact since v is quadratic) + (C_NS√ℓ + 5)(u_s + u64)‖v‖₂ +
      u_state‖v‖₂ (stored in ``state_dtype``, the parameter's).

    Shapes: ns_output, renormalized, normuon_input (m, n) float64; variance (m, 1) or (1, n).
    """
    us = stage_dtype_roundoff(dtype)
    m, n = shape
    eps_total = ns_tol
    gain = 1.0
    if equilibration is not None:
        eps_total += 2.0 * ns_gain * equilibration_error(shape, dtype, equilibration)
    if renormalized is not None:
        norm_o = float(np.linalg.norm(ns_output))
        c = math.sqrt(min(m, n))
        factor = 2.0 * c / norm_o if norm_o > 0 else math.inf
        eps_total = factor * eps_total + c * scaling_error(m * n, dtype)
        gain *= factor
    var_tol = 0.0
    if normuon_beta2 is not None:
        o = np.asarray(normuon_input, dtype=np.float64)
        v = np.asarray(variance, dtype=np.float64)
        length = n if normuon_rows else m
        amp = 2.0 * normuon_amplification(o, v, eps=normuon_eps, eps_mode=normuon_eps_mode)
        norms = np.linalg.norm(o, axis=1 if normuon_rows else 0)
        eps_in = eps_total
        eps_total = (amp * eps_in
                     + 2.0 * (C_NS * (math.sqrt(length) + math.sqrt(m * n)) + 12) * us * float(np.linalg.norm(o)))
        gain *= amp
        u_state = unit_roundoff(state_dtype if state_dtype is not None else dtype)
        v_norm = float(np.linalg.norm(v))
        var_tol = ((1.0 - normuon_beta2) * (2.0 * float(norms.max()) * eps_in + eps_in ** 2) / length
                   + ((C_NS * math.sqrt(length) + 5) * us + u_state) * v_norm)
    return StageTolerances(eps_total, var_tol, gain)
