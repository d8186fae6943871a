"""Reference Muon step (float64, one matrix, no batching)."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from . import muon_stages as stages
from ._validate import as_coefficients, as_like, as_matrix, check_scalar
from .coefficients import schedule
from .ns_map import ns_map
from .polar import polar

MOMENTUM_STYLES = ("ema", "classic")
#: Nesterov forms: "mix" (ema: U = (1−μ)G + μM_new, the lerp of torch.optim.Muon, Keller Jordan,
#: nanochat, optax; classic: U = G + μM_new, microsoft/dion, Moonlight) or "full_grad"
#: (U = G + μM_new whatever the momentum style: the gradient at full weight beside an EMA momentum).
NESTEROV_FORMS = ("mix", "full_grad")
#: Weight-decay styles: "decoupled" W(1 − lr·wd) with the unscaled lr (torch.optim.Muon,
#: microsoft/dion, Moonlight); "adjusted_lr" W(1 − lr·s·wd) with the update's lr multiplier s
#: (nanochat: lr·√max(1, m/n)·wd); "independent" W(1 − wd) (Emerging-Optimizers'
#: ``weight_decay_method="independent"``); "l2" G ← G + wd·W before the momentum (coupled L2 as
#: in optax / MLX / Emerging-Optimizers' "l2"; no decay of W after the step).
WEIGHT_DECAY_STYLES = ("decoupled", "adjusted_lr", "independent", "l2")
#: The last three are the Megatron / NVIDIA Emerging-Optimizers ``scale_mode`` names.
ADJUST_LR_MODES = ("original", "match_rms_adamw", "spectral_norm", None, "shape_scaling", "spectral", "unit_rms_norm")


def lr_scale(adjust_lr: str | None, m: int, n: int) -> float:
    """Factor multiplying lr for the orthogonalized update of an (m, n) = (fan_out, fan_in) weight.

    "original": √max(1, m/n) (Keller Jordan; torch.optim.Muon default);
    "match_rms_adamw": 0.2·√max(m, n) (Moonlight, Liu et al. arXiv 2502.16982);
    "spectral_norm": √(m/n) (microsoft/dion Muon; Dion paper); None: 1.
    Megatron / Emerging-Optimizers ``get_muon_scale_factor``: "shape_scaling" √max(1, m/n)
    (= "original"), "spectral" √max(m, n) (its default; 5 × "match_rms_adamw"),
    "unit_rms_norm" √(m/n) (= "spectral_norm").
    Raises: ValueError for an unknown mode.
    """
    if adjust_lr in ("original", "shape_scaling"):
        return math.sqrt(max(1.0, m / n))
    if adjust_lr == "match_rms_adamw":
        return 0.2 * math.sqrt(max(m, n))
    if adjust_lr in ("spectral_norm", "unit_rms_norm"):
        return math.sqrt(m / n)
    if adjust_lr == "spectral":
        return math.sqrt(max(m, n))
    if adjust_lr is None:
        return 1.0
    raise ValueError(f"adjust_lr: expected one of {ADJUST_LR_MODES}, got {adjust_lr!r}")


def check_step(step, bias_correction: bool) -> int | None:
    """The 1-based step index t of a bias-corrected momentum: ``step`` if it is an int ≥ 1 (None
    is taken without bias correction, where t is not used). Raises: ValueError naming ``step``
    for a missing step under ``bias_correction``, a non-int (a bool included) or one < 1."""
    if step is None:
        if bias_correction:
            raise ValueError("step: bias_correction=True needs the 1-based step index t (an int >= 1), got None")
        return None
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) or step < 1:
        raise ValueError(f"step: expected the 1-based step index t, an int >= 1, got {step!r}")
    return int(step)


def momentum_update(grad: np.ndarray, momentum: np.ndarray, *, mu: float, nesterov: bool,
                    momentum_style: str, nesterov_form: str = "mix", bias_correction: bool = False,
                    step: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The momentum of a Muon step: (M_new, U), U the matrix to orthogonalize.

    "ema": M ← μM + (1−μ)G, U = (1−μ)G + μM_new if nesterov else M_new (torch.optim.Muon, Keller
    Jordan, nanochat); "classic": M ← μM + G, U = G + μM_new if nesterov else M_new
    (microsoft/dion, Moonlight). ``nesterov_form="full_grad"``: U = G + μM_new for either style
    (the gradient at full weight beside an EMA momentum).

    ``bias_correction`` (the "ema" style, optax ``scale_by_muon`` / ``contrib.muon``): at the
    1-based step t = ``step`` the stored M_new stays uncorrected and the mixed matrix divides each
    term by its Adam-style debiasing factor, U = μ·M_new/(1−μ^(t+1)) + (1−μ)·G/(1−μ^t) with
    Nesterov ("mix"), U = M_new/(1−μ^t) without (optax 0.2.8 ``contrib/_muon.py``: the momentum
    term with count + 1, the gradient term with count, count the 1-based step). A zero initial
    momentum makes the corrected M_t/(1−μ^t) an unbiased average of the gradients.

    Shapes: grad, momentum (m, n) float64 (validated by the caller) -> two (m, n) float64.
    Raises: ValueError naming ``momentum_style`` or ``nesterov_form`` for an unknown value;
    ``bias_correction`` for the "classic" style or the "full_grad" form (no debiased form is
    defined there); ``step`` (``check_step``) for a missing or invalid step under bias correction;
    TypeError naming ``bias_correction`` for a non-bool.
    """
    if nesterov_form not in NESTEROV_FORMS:
        raise ValueError(f"nesterov_form: expected one of {NESTEROV_FORMS}, got {nesterov_form!r}")
    bias_correction = check_flag(bias_correction, "bias_correction")
    if momentum_style == "ema":
        m_new = mu * momentum + (1.0 - mu) * grad
        grad_weight = 1.0 if nesterov_form == "full_grad" else 1.0 - mu
    elif momentum_style == "classic":
        m_new = mu * momentum + grad
        grad_weight = 1.0
    else:
        raise ValueError(f"momentum_style: expected one of {MOMENTUM_STYLES}, got {momentum_style!r}")
    if bias_correction:
        check_bias_correction(momentum_style, nesterov, nesterov_form)
        t = check_step(step, True)
        if not nesterov:
            return m_new, m_new / (1.0 - mu ** t)
        return m_new, mu * m_new / (1.0 - mu ** (t + 1)) + grad_weight * grad / (1.0 - mu ** t)
    check_step(step, False)
    return m_new, (grad_weight * grad + mu * m_new if nesterov else m_new)


def check_bias_correction(momentum_style: str, nesterov: bool, nesterov_form: str) -> None:
    """ValueError naming ``bias_correction`` where no debiased momentum is defined: the "classic"
    style (M is a sum, not an average) and the "full_grad" Nesterov form."""
    if momentum_style != "ema":
        raise ValueError(f"bias_correction: defined for the 'ema' momentum style only (optax's EMA), "
                         f"got momentum_style={momentum_style!r}")
    if nesterov and nesterov_form != "mix":
        raise ValueError(f"bias_correction: defined for nesterov_form='mix' or no Nesterov, "
                         f"got nesterov_form={nesterov_form!r}")


def check_flag(value, name: str) -> bool:
    """``value`` if it is a bool (numpy's included); TypeError naming ``name`` otherwise (a string
    such as "False" is not taken as True)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {value!r}")
    return bool(value)


def decay_factor(style: str, *, lr: float, weight_decay: float, scale: float) -> float:
    """The factor W is multiplied by after a step under a weight-decay ``style``
    (``WEIGHT_DECAY_STYLES``): 1 − lr·wd ("decoupled"), 1 − lr·s·wd ("adjusted_lr", s the update's
    lr multiplier), 1 − wd ("independent"), 1 ("l2": the decay went into the gradient).
    Raises: ValueError naming ``weight_decay_style`` for an unknown style."""
    if style == "decoupled":
        return 1.0 - lr * weight_decay
    if style == "adjusted_lr":
        return 1.0 - lr * scale * weight_decay
    if style == "independent":
        return 1.0 - weight_decay
    if style == "l2":
        return 1.0
    raise ValueError(f"weight_decay_style: expected one of {WEIGHT_DECAY_STYLES}, got {style!r}")


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


def _checked_step_inputs(weight, grad, momentum, lr, mu, weight_decay, coefficients, adjust_lr, extra_scale_factor,
                         *, nesterov=True, cautious=False, nesterov_form="mix", weight_decay_style="decoupled"):
    """The validated float64 inputs of one Muon step (``muon_step`` / ``muon_pipeline_step``):
    (W, G, M, lr, μ, weight_decay, the (T, 3) table, s = lr_scale·extra_scale_factor); with
    ``weight_decay_style="l2"`` G is G + wd·W (the decay coupled into the gradient).
    Raises: TypeError naming ``nesterov`` / ``cautious_weight_decay`` for a non-bool; ValueError
    naming ``nesterov_form`` / ``weight_decay_style`` for an unknown value, or cautious weight
    decay with the "l2" style (it has no decay step to mask)."""
    check_flag(nesterov, "nesterov")
    check_flag(cautious, "cautious_weight_decay")
    if nesterov_form not in NESTEROV_FORMS:
        raise ValueError(f"nesterov_form: expected one of {NESTEROV_FORMS}, got {nesterov_form!r}")
    if weight_decay_style not in WEIGHT_DECAY_STYLES:
        raise ValueError(f"weight_decay_style: expected one of {WEIGHT_DECAY_STYLES}, got {weight_decay_style!r}")
    if cautious and weight_decay_style == "l2":
        raise ValueError("weight_decay_style: 'l2' couples the decay into the gradient; cautious_weight_decay "
                         "masks a decoupled decay step and cannot be combined with it")
    w = as_matrix(weight, "weight")
    g = as_like(grad, "grad", w.shape)
    m_old = as_like(momentum, "momentum", w.shape)
    lr = check_scalar(lr, "lr", low=0.0)
    mu = check_scalar(mu, "mu", low=0.0, high=1.0)
    weight_decay = check_scalar(weight_decay, "weight_decay", low=0.0)
    table = schedule("jordan") if coefficients is None else as_coefficients(coefficients)
    scale = lr_scale(adjust_lr, *w.shape) * check_scalar(extra_scale_factor, "extra_scale_factor", low=0.0,
                                                         low_open=True)
    if weight_decay_style == "l2" and weight_decay:
        g = g + weight_decay * w
    return w, g, m_old, lr, mu, weight_decay, table, scale


def _updated_weight(w: np.ndarray, o: np.ndarray, *, lr: float, weight_decay: float, scale: float,
                    cautious: bool, style: str = "decoupled") -> np.ndarray:
    """W·d − lr·s·O with d = ``decay_factor(style)`` (1 − lr·wd for "decoupled"), the decay masked
    to I(O⊙W ≥ 0) with ``cautious`` (Chen et al. 2025)."""
    decayed = w * decay_factor(style, lr=lr, weight_decay=weight_decay, scale=scale)
    if cautious:
        decayed = np.where(np.sign(o) * np.sign(w) >= 0, decayed, w)
    return decayed - (lr * scale) * o


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
    w, g, m_old, lr, mu, weight_decay, table, scale = _checked_step_inputs(
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
    w_new = _updated_weight(w, o, lr=lr, weight_decay=weight_decay, scale=scale, cautious=cautious_weight_decay,
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
    w, g, m_old, lr, mu, weight_decay, table, scale = _checked_step_inputs(
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
    w_new = _updated_weight(w, o, lr=lr, weight_decay=weight_decay, scale=scale, cautious=cautious_weight_decay,
                           style=weight_decay_style)
    return MuonPipelineStep(w_new, m_new, o, scale, u, o_ns, variance)
