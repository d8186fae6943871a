"""The parts of a reference Muon step: lr multiplier, momentum, weight decay and the input checks.

``ortho_ref.muon`` composes them and re-exports the public names:
momentum (``momentum_update``, docs/math.md §4), the Newton–Schulz map, then the weight update
W·``decay_factor`` − lr·``lr_scale``·O.
"""

from __future__ import annotations

import math

import numpy as np

from ._validate import as_coefficients, as_like, as_matrix, check_scalar
from .coefficients import schedule

__all__ = [
    "ADJUST_LR_MODES", "MOMENTUM_STYLES", "NESTEROV_FORMS", "WEIGHT_DECAY_STYLES", "check_bias_correction",
    "check_flag", "check_step", "checked_step_inputs", "decay_factor", "lr_scale", "momentum_update",
    "updated_weight",
]

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
    """Factor s multiplying lr for the orthogonalized update of an (m, n) = (fan_out, fan_in) weight.

    ::

        "original", "shape_scaling"       √max(1, m/n)   Keller Jordan; torch.optim.Muon default
        "match_rms_adamw"                 0.2·√max(m, n)  Moonlight (Liu et al.); torch.optim.Muon
        "spectral_norm", "unit_rms_norm"  √(m/n)          microsoft/dion Muon
        "spectral"                        √max(m, n)      Megatron / Emerging-Optimizers default
        None                              1

    The last three names are Megatron / NVIDIA Emerging-Optimizers ``get_muon_scale_factor`` modes.

    Parameters
    ----------
    adjust_lr : str or None
        One of ``ADJUST_LR_MODES`` (above).
    m : int
        Rows of the weight (fan_out), >= 1.
    n : int
        Columns of the weight (fan_in), >= 1.

    Returns
    -------
    float
        s, dimensionless.

    Raises
    ------
    ValueError
        If `adjust_lr` is not a known mode.

    References
    ----------
    K. Jordan et al., "Muon", blog post, 2024, and KellerJordan/Muon ``muon.py``; J. Liu et al.,
    "Muon is Scalable for LLM Training", arXiv 2502.16982, 2025; ``torch.optim.Muon``
    (``adjust_lr_fn``); microsoft/dion ``muon.py`` (``adjust_lr``).

    Examples
    --------
    >>> from ortho_ref import lr_scale
    >>> lr_scale("original", 1024, 256), lr_scale("spectral_norm", 256, 1024), lr_scale(None, 3, 5)
    (2.0, 0.5, 1.0)
    >>> lr_scale("match_rms_adamw", 100, 25)
    2.0
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


def checked_step_inputs(weight, grad, momentum, lr, mu, weight_decay, coefficients, adjust_lr, extra_scale_factor,
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


def updated_weight(w: np.ndarray, o: np.ndarray, *, lr: float, weight_decay: float, scale: float,
                    cautious: bool, style: str = "decoupled") -> np.ndarray:
    """W·d − lr·s·O with d = ``decay_factor(style)`` (1 − lr·wd for "decoupled"), the decay masked
    to I(O⊙W ≥ 0) with ``cautious`` (Chen et al. 2025)."""
    decayed = w * decay_factor(style, lr=lr, weight_decay=weight_decay, scale=scale)
    if cautious:
        decayed = np.where(np.sign(o) * np.sign(w) >= 0, decayed, w)
    return decayed - (lr * scale) * o
