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
    """Result of ``muon_step``: the new state, the update and what was orthogonalized, all float64.

    Parameters
    ----------
    weight : (m, n) float64 ndarray
        W after the step.
    momentum : (m, n) float64 ndarray
        M_new, the momentum after the step.
    update : (m, n) float64 ndarray
        O, the orthogonalized update before the learning rate.
    lr_scale : float
        s = ``lr_scale(adjust_lr, m, n)``·extra_scale_factor, the multiplier of lr applied to O.
    ns_input : (m, n) float64 ndarray
        U, the momentum-mixed matrix that was orthogonalized.

    See Also
    --------
    muon_step : The step that returns it.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import muon_step
    >>> muon_step(np.eye(2), np.eye(2), np.zeros((2, 2)), lr=0.1)._fields
    ('weight', 'momentum', 'update', 'lr_scale', 'ns_input')
    """

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
    """One reference Muon step on an (m, n) weight, in float64.

    ::

        M_new = μM + (1 − μ)G ("ema")  or  μM + G ("classic")
        U     = (1 − μ)G + μM_new ("ema", Nesterov)  or  G + μM_new ("classic", Nesterov)  or  M_new
        O     = ns_map(U, coefficients)  (or the polar factor of U, orthogonalizer="polar")
        W     ← W·(1 − ηλ) − η·s·O,   s = lr_scale(adjust_lr, m, n)·extra_scale_factor

    The weight decay uses the unscaled lr (torch.optim.Muon, microsoft/dion, Moonlight); the
    options below change each line (docs/math.md, §4.1). The inputs are not modified.

    Parameters
    ----------
    weight : (m, n) array_like of float
        W before the step, in PyTorch's (fan_out, fan_in) layout; finite.
    grad : (m, n) array_like of float
        The gradient G; finite.
    momentum : (m, n) array_like of float
        The momentum M before the step (zeros for fresh state), in gradient units.
    lr : float
        The learning rate η, >= 0.
    mu : float, default 0.95
        The momentum coefficient μ, in [0, 1].
    nesterov : bool, default True
        Orthogonalize the Nesterov mix (below) instead of M_new.
    momentum_style : {"ema", "classic"}, default "ema"
        "ema": M ← μM + (1 − μ)G (torch.optim.Muon, Keller Jordan, nanochat); "classic":
        M ← μM + G (microsoft/dion, Moonlight).
    coefficients : (T, 3) array_like of float, optional
        Newton–Schulz rows (a_t, b_t, c_t). Default None: ``schedule("jordan")``, 5 steps.
    safety : float, default 1.0
        Newton–Schulz normalization X₀ = U / (safety·‖U‖_F + eps), as ``ns_map``; > 0.
    eps : float, default 1e-7
        As ``ns_map``, in gradient units; >= 0.
    eps_mode : {"add", "clamp"}, default "add"
        As ``ns_map`` ("clamp": torch.optim.Muon's max(‖U‖_F, eps)).
    adjust_lr : str or None, default "original"
        The lr multiplier's mode, ``lr_scale``.
    weight_decay : float, default 0.0
        The decay coefficient λ, >= 0.
    orthogonalizer : {"newton_schulz", "polar"}, default "newton_schulz"
        O = ``ns_map(U, ...)`` or the exact polar factor ``polar(U)`` (0 for U = 0).
    extra_scale_factor : float, default 1.0
        Multiplies ``lr_scale`` (Megatron / Emerging-Optimizers); > 0.
    cautious_weight_decay : bool, default False
        Decay only the entries where the final update and W (before the step) agree in sign:
        W ← W − ηλ·I(O⊙W >= 0)⊙W − ηs·O (Chen et al., arXiv 2510.12402; nanochat).
    nesterov_form : {"mix", "full_grad"}, default "mix"
        "mix": U = (1 − μ)G + μM_new for "ema", G + μM_new for "classic"; "full_grad":
        U = G + μM_new for either style.
    weight_decay_style : {"decoupled", "adjusted_lr", "independent", "l2"}, default "decoupled"
        W·(1 − ηλ) (torch.optim.Muon, microsoft/dion, Moonlight); W·(1 − ηsλ) (nanochat);
        W·(1 − λ); or G ← G + λW before the momentum and no decay step (coupled L2).
    bias_correction : bool, default False
        The debiased EMA mix of optax ``contrib.muon``: U = μM_new/(1 − μ^(t+1)) + (1 − μ)G/(1 − μ^t)
        (M_new/(1 − μ^t) without Nesterov); "ema" style and "mix" form only. The returned momentum
        stays uncorrected.
    step : int, optional
        The 1-based step index t, >= 1; required with `bias_correction`, unused otherwise.

    Returns
    -------
    MuonStep
        ``(weight, momentum, update, lr_scale, ns_input)``.

    Raises
    ------
    TypeError
        If an array has a non-float dtype, or `nesterov`, `cautious_weight_decay` or
        `bias_correction` is not a bool.
    ValueError
        If an array is not 2-D, is empty or holds NaN or Inf; a shape differs from `weight`'s;
        `lr` or `weight_decay` < 0; `mu` is outside [0, 1]; `extra_scale_factor` <= 0; an option
        string is unknown; `cautious_weight_decay` is combined with the "l2" style; or, naming
        `bias_correction` / `step`, bias correction is asked for the "classic" style or the
        "full_grad" form or without a valid `step`.

    References
    ----------
    K. Jordan et al., "Muon: An optimizer for hidden layers in neural networks", blog post, 2024,
    and KellerJordan/Muon ``muon.py`` (``muon_update``); J. Liu et al., "Muon is Scalable for LLM
    Training", arXiv 2502.16982, 2025; ``torch.optim.Muon``; microsoft/dion ``muon.py``.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import muon_step, ns_map, schedule
    >>> w, g = np.random.default_rng(0).standard_normal((2, 4, 3))
    >>> out = muon_step(w, g, np.zeros((4, 3)), lr=0.02)
    >>> bool(np.allclose(out.ns_input, 0.05 * g + 0.95 * out.momentum))  # ema, Nesterov
    True
    >>> bool(np.allclose(out.update, ns_map(out.ns_input, schedule("jordan"))))
    True
    >>> round(out.lr_scale, 4), bool(np.allclose(out.weight, w - 0.02 * out.lr_scale * out.update))
    (1.1547, True)
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
    """Result of ``muon_pipeline_step``: ``MuonStep``'s fields and the stages' intermediates.

    Parameters
    ----------
    weight : (m, n) float64 ndarray
        W after the step.
    momentum : (m, n) float64 ndarray
        M_new, the momentum after the step.
    update : (m, n) float64 ndarray
        O, the final update after every stage, before the learning rate.
    lr_scale : float
        s = ``lr_scale(adjust_lr, m, n)``·extra_scale_factor.
    ns_input : (m, n) float64 ndarray
        The matrix Newton–Schulz received (after MuonEq).
    ns_output : (m, n) float64 ndarray
        The Newton–Schulz output, before Muon+ and NorMuon.
    variance : (m, 1) or (1, n) float64 ndarray or None
        NorMuon's second moment after the step; None without NorMuon.

    See Also
    --------
    muon_pipeline_step : The step that returns it.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref.muon import muon_pipeline_step
    >>> muon_pipeline_step(np.eye(2), np.eye(2), np.zeros((2, 2)), lr=0.1)._fields[-2:]
    ('ns_output', 'variance')
    """

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
    """One reference Muon step with the pipeline stages around Newton–Schulz, in nanochat's order.

    ::

        momentum → MuonEq (row_equilibration) → ns_map → Muon+ (renormalize)
                 → NorMuon (normuon_beta2) → W ← W·(1 − ηλ) − η·s·O

    Each stage is a function of ``ortho_ref.muon_stages`` (docs/math.md, §4.3); with every stage off
    the result is ``muon_step``'s. Cautious weight decay masks with the final O.

    Parameters
    ----------
    weight : (m, n) array_like of float
        W before the step, in PyTorch's (fan_out, fan_in) layout; finite.
    grad : (m, n) array_like of float
        The gradient G; finite.
    momentum : (m, n) array_like of float
        The momentum M before the step (zeros for fresh state), in gradient units.
    lr : float
        The learning rate η, >= 0.
    mu : float, default 0.95
        The momentum coefficient μ, in [0, 1].
    nesterov : bool, default True
        Orthogonalize the Nesterov mix (below) instead of M_new.
    momentum_style : {"ema", "classic"}, default "ema"
        "ema": M ← μM + (1 − μ)G (torch.optim.Muon, Keller Jordan, nanochat); "classic":
        M ← μM + G (microsoft/dion, Moonlight).
    coefficients : (T, 3) array_like of float, optional
        Newton–Schulz rows (a_t, b_t, c_t). Default None: ``schedule("jordan")``, 5 steps.
    safety : float, default 1.0
        Newton–Schulz normalization X₀ = U / (safety·‖U‖_F + eps), as ``ns_map``; > 0.
    eps : float, default 1e-7
        As ``ns_map``, in gradient units; >= 0.
    eps_mode : {"add", "clamp"}, default "add"
        As ``ns_map`` ("clamp": torch.optim.Muon's max(‖U‖_F, eps)).
    adjust_lr : str or None, default "original"
        The lr multiplier's mode, ``lr_scale``.
    weight_decay : float, default 0.0
        The decay coefficient λ, >= 0.
    extra_scale_factor : float, default 1.0
        Multiplies ``lr_scale`` (Megatron / Emerging-Optimizers); > 0.
    cautious_weight_decay : bool, default False
        Decay only the entries where the final update and W (before the step) agree in sign:
        W ← W − ηλ·I(O⊙W >= 0)⊙W − ηs·O (Chen et al., arXiv 2510.12402; nanochat).
    nesterov_form : {"mix", "full_grad"}, default "mix"
        "mix": U = (1 − μ)G + μM_new for "ema", G + μM_new for "classic"; "full_grad":
        U = G + μM_new for either style.
    weight_decay_style : {"decoupled", "adjusted_lr", "independent", "l2"}, default "decoupled"
        W·(1 − ηλ) (torch.optim.Muon, microsoft/dion, Moonlight); W·(1 − ηsλ) (nanochat);
        W·(1 − λ); or G ← G + λW before the momentum and no decay step (coupled L2).
    bias_correction : bool, default False
        The debiased EMA mix of optax ``contrib.muon``: U = μM_new/(1 − μ^(t+1)) + (1 − μ)G/(1 − μ^t)
        (M_new/(1 − μ^t) without Nesterov); "ema" style and "mix" form only. The returned momentum
        stays uncorrected.
    step : int, optional
        The 1-based step index t, >= 1; required with `bias_correction`, unused otherwise.
    row_equilibration : bool or {"row", "column"}, default False
        MuonEq before Newton–Schulz: each row (column) of U rescaled to the RMS row (column) norm;
        True means "row".
    renormalize : bool, default False
        Muon+ after Newton–Schulz: O ← O·√min(m, n) / max(‖O‖_F, 1e-6).
    normuon_beta2 : float, optional
        NorMuon's β₂ in [0, 1); default None: no NorMuon.
    normuon_variance : (m, 1) or (1, n) array_like of float, optional
        NorMuon's second moment before the step (shape ``muon_stages.normuon_variance_shape``);
        default None: zeros.
    normuon_eps : float, default 1e-8
        NorMuon's ε, >= 0.
    normuon_eps_mode : {"add", "clamp"}, default "add"
        O / (√v + ε) (microsoft/dion, the paper) or O / √max(v, ε) (nanochat).
    normuon_dim : {"row", "column", "by_shape"}, default "row"
        One statistic per row (the paper, microsoft/dion), per column, or per row when m >= n and
        per column otherwise (nanochat).

    Returns
    -------
    MuonPipelineStep
        ``(weight, momentum, update, lr_scale, ns_input, ns_output, variance)``.

    Raises
    ------
    TypeError
        If an array has a non-float dtype, or `nesterov`, `cautious_weight_decay`,
        `bias_correction` or `renormalize` is not a bool.
    ValueError
        If an array is not 2-D, is empty or holds NaN or Inf; a shape differs from `weight`'s;
        `lr` or `weight_decay` < 0; `mu` is outside [0, 1]; `extra_scale_factor` <= 0; an option
        string is unknown; `cautious_weight_decay` is combined with the "l2" style; or, naming
        `bias_correction` / `step`, bias correction is asked for the "classic" style or the
        "full_grad" form or without a valid `step`; or, naming the argument, for a
        `row_equilibration`, `normuon_eps_mode` or `normuon_dim` that is unknown, `normuon_beta2`
        outside [0, 1), `normuon_eps` < 0, or `normuon_variance` of the wrong shape.

    References
    ----------
    A. Karpathy, nanochat ``nanochat/optim.py`` (``muon_step_fused``: the order); D. Chang et al.,
    "MuonEq", arXiv 2603.28254, 2026; "Muon+", arXiv 2602.21545, 2026; Z. Li et al., "NorMuon",
    arXiv 2510.05491, 2025, and microsoft/dion ``dion/normuon.py``.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import muon_step
    >>> from ortho_ref.muon import muon_pipeline_step
    >>> w, g = np.random.default_rng(0).standard_normal((2, 4, 3))
    >>> plain = muon_pipeline_step(w, g, np.zeros((4, 3)), lr=0.02)
    >>> bool(np.allclose(plain.weight, muon_step(w, g, np.zeros((4, 3)), lr=0.02).weight))
    True
    >>> out = muon_pipeline_step(w, g, np.zeros((4, 3)), lr=0.02, renormalize=True, normuon_beta2=0.95)
    >>> out.variance.shape, bool(np.isclose(np.linalg.norm(out.update), np.sqrt(3)))
    ((4, 1), True)
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
