"""Reference Muon step (float64, one matrix, no batching), with and without the pipeline stages."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import muon_stages as stages
from ._validate import as_like, check_scalar
from .muon_parts import (  # noqa: F401  (re-exported: the parts of a Muon step)
    ADJUST_LR_MODES,
    MOMENTUM_STYLES,
    NESTEROV_FORMS,
    WEIGHT_DECAY_STYLES,
    check_bias_correction,
    check_flag,
    check_step,
    checked_step_inputs,
    decay_factor,
    lr_scale,
    momentum_update,
    updated_weight,
)
from .ns_map import ns_map
from .polar import polar


class MuonStep(NamedTuple):
    """Result of ``muon_step``: new weight (m, n), new momentum (m, n), the orthogonalized
    update O (m, n) before lr, the lr multiplier applied to it (``lr_scale`` of the mode times
    ``extra_scale_factor``), and ``ns_input`` U (m, n), the momentum-mixed matrix that was
    orthogonalized."""

    weight: np.ndarray
    momentum: np.ndarray
    update: np.ndarray
    lr_scale: float
    ns_input: np.ndarray


def muon_step(
    weight,
    grad,
    momentum,
    *,
    lr: float,
    mu: float = 0.95,
    nesterov: bool = True,
    momentum_style: str = "ema",
    coefficients=None,
    safety: float = 1.0,
    eps: float = 1e-7,
    eps_mode: str = "add",
    adjust_lr: str | None = "original",
    weight_decay: float = 0.0,
    orthogonalizer: str = "newton_schulz",
    extra_scale_factor: float = 1.0,
    cautious_weight_decay: bool = False,
    nesterov_form: str = "mix",
    weight_decay_style: str = "decoupled",
    bias_correction: bool = False,
    step: int | None = None,
) -> MuonStep:
    """One reference Muon step on an (m, n) weight.

    Momentum: "ema" M ← μM + (1−μ)G, nesterov U = (1−μ)G + μM_new (torch.optim.Muon,
    Keller Jordan, nanochat); "classic" M ← μM + G, nesterov U = G + μM_new (microsoft/dion,
    Moonlight). Without nesterov U = M_new. Then O = ns_map(U, coefficients) (or the exact
    polar factor with ``orthogonalizer="polar"``) and
    W ← W·(1 − lr·weight_decay) − lr·s·O with s = lr_scale(adjust_lr, m, n)·extra_scale_factor
    (decoupled weight decay with the unscaled lr, as torch.optim.Muon, microsoft/dion and
    Moonlight; ``extra_scale_factor`` as Megatron / Emerging-Optimizers). With
    ``cautious_weight_decay`` the decay applies only to entries where the update and the weight
    have the same sign, W ← W − lr·wd·I(O⊙W ≥ 0)⊙W − lr·s·O, with W the weight before the step
    (Chen et al. 2025, "Cautious Weight Decay", arXiv 2510.12402, Eq. (CWD):
    x ← x − η(u + λ·I(u⊙x ≥ 0)⊙x); u = s·O has the sign of O since s > 0; zero entries decay,
    as the ≥; nanochat uses the same mask, (g·p) ≥ 0).

    ``nesterov_form`` ("mix" | "full_grad", ``NESTEROV_FORMS``) picks the Nesterov mix;
    ``weight_decay_style`` (``WEIGHT_DECAY_STYLES``, ``decay_factor``) the decay: "decoupled" as
    above, "adjusted_lr" W(1 − lr·s·wd) (nanochat), "independent" W(1 − wd), "l2" G ← G + wd·W
    before the momentum and no decay step.

    ``bias_correction`` (EMA momentum, as optax ``contrib.muon``; ``momentum_update``): U divides
    the momentum term by 1−μ^(t+1) and the gradient term by 1−μ^t (without Nesterov U =
    M_new/(1−μ^t)), t = ``step`` the 1-based step index, required then; the returned momentum is
    the uncorrected M_new, the state such an optimizer stores.

    Shapes: weight, grad, momentum (m, n) float -> MuonStep of float64 arrays.
    ``coefficients``: (T, 3) table; default the ``jordan`` schedule, 5 steps.
    Source: Jordan et al. (Muon blog, 2024); Liu et al. arXiv 2502.16982; torch.optim.Muon.
    Raises: TypeError / ValueError for non-float, non-2-D, empty or non-finite arrays, shape
    mismatches, lr < 0, mu outside [0, 1), weight_decay < 0, extra_scale_factor <= 0,
    unknown option strings; ValueError naming ``bias_correction`` for the "classic" style or the
    "full_grad" form, ``step`` for a missing or non-positive step under bias correction.
    """
    w, g, m_old, lr, mu, weight_decay, table, scale = checked_step_inputs(
        weight, grad, momentum, lr, mu, weight_decay, coefficients, adjust_lr, extra_scale_factor,
        nesterov=nesterov, cautious=cautious_weight_decay, nesterov_form=nesterov_form,
        weight_decay_style=weight_decay_style)
    if orthogonalizer not in ("newton_schulz", "polar"):
        raise ValueError(f"orthogonalizer: expected 'newton_schulz' or 'polar', got {orthogonalizer!r}")

    m_new, u = momentum_update(g, m_old, mu=mu, nesterov=nesterov, momentum_style=momentum_style,
                               nesterov_form=nesterov_form, bias_correction=bias_correction, step=step)
    if orthogonalizer == "polar":
        o = polar(u) if np.any(u) else np.zeros_like(u)
    else:
        o = ns_map(u, table, safety=safety, eps=eps, eps_mode=eps_mode)
    w_new = updated_weight(w, o, lr=lr, weight_decay=weight_decay, scale=scale, cautious=cautious_weight_decay,
                           style=weight_decay_style)
    return MuonStep(w_new, m_new, o, scale, u)


class MuonPipelineStep(NamedTuple):
    """Result of ``muon_pipeline_step``: the fields of ``MuonStep`` (``update`` is the final
    update after every stage, ``ns_input`` the matrix Newton–Schulz received, after MuonEq),
    ``ns_output`` the Newton–Schulz output before the post-orthogonalization stages, and
    ``variance`` NorMuon's new second moment ((m, 1) or (1, n); None without NorMuon)."""

    weight: np.ndarray
    momentum: np.ndarray
    update: np.ndarray
    lr_scale: float
    ns_input: np.ndarray
    ns_output: np.ndarray
    variance: np.ndarray | None


def muon_pipeline_step(
    weight,
    grad,
    momentum,
    *,
    lr: float,
    mu: float = 0.95,
    nesterov: bool = True,
    momentum_style: str = "ema",
    coefficients=None,
    safety: float = 1.0,
    eps: float = 1e-7,
    eps_mode: str = "add",
    adjust_lr: str | None = "original",
    weight_decay: float = 0.0,
    extra_scale_factor: float = 1.0,
    cautious_weight_decay: bool = False,
    nesterov_form: str = "mix",
    weight_decay_style: str = "decoupled",
    bias_correction: bool = False,
    step: int | None = None,
    row_equilibration: bool | str = False,
    renormalize: bool = False,
    normuon_beta2: float | None = None,
    normuon_variance=None,
    normuon_eps: float = 1e-8,
    normuon_eps_mode: str = "add",
    normuon_dim: str = "row",
) -> MuonPipelineStep:
    """One reference Muon step with the pipeline stages, in nanochat's order:
    momentum → MuonEq (``row_equilibration``) → ns_map → Muon+ (``renormalize``) → NorMuon
    (``normuon_beta2`` not None) → W ← W·(1 − lr·wd) − lr·s·O (or cautious weight decay, masked
    by the final O), s = lr_scale(adjust_lr, m, n)·extra_scale_factor.

    Every stage off gives ``muon_step``'s result. The stages are ``ortho_ref.muon_stages``'
    functions; ``normuon_variance`` is NorMuon's second moment before the step (None: zeros of
    ``normuon_variance_shape``).
    Shapes: weight, grad, momentum (m, n) float -> MuonPipelineStep of float64 arrays.
    Source: docs/math.md, "Muon pipeline stages"; nanochat ``muon_step_fused`` (the order);
    MuonEq arXiv 2603.28254; Muon+ arXiv 2602.21545; NorMuon arXiv 2510.05491.
    Raises: what ``muon_step`` raises; ValueError naming ``row_equilibration``, ``normuon_dim``,
    ``normuon_beta2`` (outside [0, 1)), ``normuon_eps`` / ``normuon_eps_mode``, or
    ``normuon_variance`` of the wrong shape; TypeError for a non-bool ``renormalize``.
    ``bias_correction`` / ``step``: the debiased momentum mix of ``muon_step`` (optax).
    """
    w, g, m_old, lr, mu, weight_decay, table, scale = checked_step_inputs(
        weight, grad, momentum, lr, mu, weight_decay, coefficients, adjust_lr, extra_scale_factor,
        nesterov=nesterov, cautious=cautious_weight_decay, nesterov_form=nesterov_form,
        weight_decay_style=weight_decay_style)
    side = stages.equilibration_side(row_equilibration)
    if not isinstance(renormalize, bool):
        raise TypeError(f"renormalize: expected a bool, got {renormalize!r}")
    variance = None
    if normuon_beta2 is not None:
        if check_scalar(normuon_beta2, "normuon_beta2", low=0.0, high=1.0) >= 1.0:
            raise ValueError(f"normuon_beta2: expected a value in [0, 1) or None, got {normuon_beta2!r}")
        check_scalar(normuon_eps, "normuon_eps", low=0.0)
        if normuon_eps_mode not in stages.NORMUON_EPS_MODES:
            raise ValueError(f"normuon_eps_mode: expected one of {stages.NORMUON_EPS_MODES}, got "
                             f"{normuon_eps_mode!r}")
        shape = stages.normuon_variance_shape(*w.shape, normuon_dim)
        variance = np.zeros(shape) if normuon_variance is None else as_like(normuon_variance, "normuon_variance",
                                                                             shape)

    m_new, u = momentum_update(g, m_old, mu=mu, nesterov=nesterov, momentum_style=momentum_style,
                               nesterov_form=nesterov_form, bias_correction=bias_correction, step=step)
    if side is not None:
        u = stages.equilibrate(u, side)
    o_ns = ns_map(u, table, safety=safety, eps=eps, eps_mode=eps_mode)
    o = stages.renormalize(o_ns) if renormalize else o_ns
    if variance is not None:
        o, variance = stages.normuon_normalize(o, variance, beta2=normuon_beta2, eps=normuon_eps,
                                               eps_mode=normuon_eps_mode, dim=normuon_dim)
    w_new = updated_weight(w, o, lr=lr, weight_decay=weight_decay, scale=scale, cautious=cautious_weight_decay,
                           style=weight_decay_style)
    return MuonPipelineStep(w_new, m_new, o, scale, u, o_ns, variance)
