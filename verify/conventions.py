"""Conventions: what a Muon- or Dion-like optimizer computes, as the checks take it.

What a Muon- or Dion-like optimizer computes (``MuonConventions``, ``DionConventions``) and the
conventions of the optimizers the judge knows (``TORCH_MUON``, ``ORTHO_MUON``, ``DION``), with the
dtype and coefficient-table helpers that ``ortho_verify.api`` and ``ortho_verify.checks.optimizer_checks``
share (docs/design.md, "Muon", "Dion" and "Conventions").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

import ortho_ref
from ortho_ref import muon_stages

from . import tolerances as tol

__all__ = ["DION", "DION2", "Dion2Conventions", "DION_ORIENTATIONS", "DionConventions", "MuonConventions",
           "NORMUON", "ORTHO_MUON", "TORCH_MUON", "coarser_dtype", "dtype_name", "table_and_normalization"]

_NAMES = {torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def dtype_name(dtype, allowed=tuple(tol.UNIT_ROUNDOFF), argument: str = "dtype") -> str:
    """'float64' / 'float32' / 'bfloat16' / 'float16' for a torch dtype or such a name, if in
    ``allowed``; TypeError naming ``argument`` otherwise."""
    name = _NAMES.get(dtype, dtype)
    if name not in allowed:
        raise TypeError(f"{argument}: expected one of {sorted(allowed)} (torch dtype or name), got {dtype!r}")
    return name


def coarser_dtype(*names: str) -> str:
    """The dtype with the largest unit roundoff: the precision a chain of operations ends up with."""
    return max(names, key=tol.unit_roundoff)


def table_and_normalization(coefficients, steps, safety, eps) -> tuple[np.ndarray, float, float]:
    """(T, 3) float64 table and (safety, eps) of a schedule: a registry name's own defaults unless
    overridden; a (T, 3) table is truncated / extended to ``steps`` (its last row repeated), with
    safety 1 and eps 1e-7 by default.
    Raises: ValueError naming ``coefficients`` for an unknown name or a table not of shape (T, 3)."""
    if isinstance(coefficients, str):
        if coefficients not in ortho_ref.SCHEDULES:
            raise ValueError(f"coefficients: unknown schedule {coefficients!r}; known: {sorted(ortho_ref.SCHEDULES)}")
        sched = ortho_ref.SCHEDULES[coefficients]
        table = ortho_ref.schedule(coefficients, steps)
        return table, sched.safety if safety is None else safety, sched.eps if eps is None else eps
    table = np.asarray(coefficients, dtype=np.float64)
    if table.ndim != 2 or table.shape[1] != 3 or len(table) == 0:
        raise ValueError(f"coefficients: expected a schedule name or a (T, 3) table, got shape {table.shape}")
    if steps is not None:
        table = np.concatenate([table[:steps], np.repeat(table[-1:], max(0, steps - len(table)), axis=0)])
    return table, 1.0 if safety is None else safety, 1e-7 if eps is None else eps


#: Orientations of Dion's working matrix: "min_side" (the transpose when m < n, Q of shape
#: (min(m, n), r): microsoft/dion, ortho_fast, the paper's Algorithm 1) or "never_transpose"
#: (B as stored, Q of shape (n, r) for every matrix).
DION_ORIENTATIONS = ("min_side", "never_transpose")


def _choice(value, name: str, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name}: expected one of {tuple(choices)}, got {value!r}")


@dataclass(frozen=True)
class MuonConventions:
    """What a Muon-like optimizer computes, so that ``check_optimizer`` can build its reference.

    momentum_style: "ema" (M ← μM + (1−μ)G; torch.optim.Muon, Keller Jordan, nanochat) or
    "classic" (M ← μM + G; microsoft/dion, Moonlight); nesterov: U = mix of G and M as
    ``ortho_ref.muon_step``; coefficients: schedule name or (T, 3) table, ns_steps, safety, eps,
    eps_mode ("add": /(s‖U‖_F + eps), "clamp": /max(s‖U‖_F, eps) as torch.optim.Muon);
    adjust_lr: any mode of ``ortho_ref.muon.ADJUST_LR_MODES`` — "original" √max(1, m/n) |
    "match_rms_adamw" 0.2√max(m, n) | "spectral_norm" √(m/n) | None, and Megatron /
    Emerging-Optimizers' names "shape_scaling" (= "original"), "spectral" √max(m, n),
    "unit_rms_norm" (= "spectral_norm"); extra_scale_factor: a further constant factor on the
    update (Megatron's ``extra_scale_factor``; 0.2 with "spectral" is Moonlight's scale);
    the Muon pipeline stages (docs/math.md, "Muon pipeline stages"; ``ortho_ref.muon.muon_pipeline_step``):
    row_equilibration (MuonEq: False, True = "row", "column"), renormalize (Muon+: ‖O‖_F = √min(m, n)),
    normuon_beta2 (NorMuon's EMA, None: off) with normuon_eps, normuon_eps_mode ("add" √v + eps,
    microsoft/dion; "clamp" √max(v, eps), nanochat), normuon_dim ("row", "column", "by_shape") and
    normuon_state_key (the ``optimizer.state[p]`` key of its second moment, microsoft/dion's
    "variance_neuron"; None if it keeps none the judge can read);
    cautious_weight_decay: decay only where sign(O)·sign(W) ≥ 0 (Chen et al. 2025, arXiv
    2510.12402; nanochat); qk_clip_threshold / qk_clip_alpha: QK-clip of the attention
    projections after the step (MuonClip, Kimi K2 arXiv 2507.20534; ``ortho_ref.qk_clip``;
    None: none); ns_dtype: the dtype the Newton–Schulz iteration runs in;
    momentum_state_key: the ``optimizer.state[p]`` key of the momentum buffer (None if it has
    none: the reference then tracks its own); hyperparameter_names: constructor keyword for each
    of lr, momentum, weight_decay; extra_kwargs: further constructor keywords.
    nesterov_form: "mix" (the default: the lerp of each momentum style) or "full_grad"
    (U = G + μM_new beside an EMA momentum; ``ortho_ref.muon.NESTEROV_FORMS``);
    weight_decay_style: "decoupled" W ← W(1 − lr·wd) with the unscaled lr (torch, dion,
    Moonlight; the default), "adjusted_lr" W(1 − lr·s·wd) with the update's lr multiplier s
    (nanochat), "independent" W(1 − wd), "l2" G ← G + wd·W before the momentum
    (``ortho_ref.muon.WEIGHT_DECAY_STYLES``); bias_correction: the EMA momentum debiased as Adam's
    in the matrix that is orthogonalized, at the 1-based step t: U = μ·M_t/(1−μ^(t+1)) +
    (1−μ)·G_t/(1−μ^t) with Nesterov ("mix"), U = M_t/(1−μ^t) without, the stored M_t uncorrected
    (optax ``contrib.muon`` / ``scale_by_muon``; ``ortho_ref.muon.momentum_update``; only with
    momentum_style "ema" and, with Nesterov, nesterov_form "mix"); form / restarts: "standard" or Gram Newton–Schulz
    ("gram", with the steps before which R is recomputed), the same map with its own rounding model.
    momentum_state_key may be a tuple path into nested state dicts (``("muon", "momentum_buffer")``);
    a hyperparameter name may be a tuple entry (``{"momentum": "betas[0]"}``: the first entry of the
    ``betas`` keyword, the others from extra_kwargs or the signature's default).
    The names other libraries use for these options are tabled in docs/verification.md,
    "Conventions: names in other libraries".
    Raises: ValueError naming the field for an unknown momentum_style, eps_mode or adjust_lr, or
    extra_scale_factor <= 0; ValueError naming ``bias_correction`` for a non-bool or where it is not
    defined (the "classic" style, the "full_grad" form).
    """

    momentum_style: str = "ema"
    nesterov: bool = True
    coefficients: object = "jordan"
    ns_steps: int | None = None
    safety: float | None = None
    eps: float | None = None
    eps_mode: str = "add"
    adjust_lr: str | None = "original"
    ns_dtype: torch.dtype = torch.bfloat16
    momentum_state_key: str | None = "momentum_buffer"
    hyperparameter_names: dict = field(default_factory=lambda: {"lr": "lr", "momentum": "momentum",
                                                                "weight_decay": "weight_decay"})
    extra_kwargs: dict = field(default_factory=dict)
    extra_scale_factor: float = 1.0
    cautious_weight_decay: bool = False
    #: QK-clip after the step (Kimi K2, arXiv 2507.20534): τ (None: no QK-clip) and α.
    qk_clip_threshold: float | None = None
    qk_clip_alpha: float = 0.5
    row_equilibration: bool | str = False
    renormalize: bool = False
    normuon_beta2: float | None = None
    normuon_eps: float = 1e-8
    normuon_eps_mode: str = "add"
    normuon_dim: str = "row"
    normuon_state_key: str | None = "variance_neuron"
    nesterov_form: str = "mix"
    weight_decay_style: str = "decoupled"
    #: Adam-style debiasing of the EMA momentum in the Newton–Schulz input (optax ``contrib.muon``).
    bias_correction: bool = False
    #: The Newton–Schulz form: "standard" (X ← aX + (bA + cA²)X) or "gram" (Gram Newton–Schulz: the
    #: iteration on R = XXᵀ, Q accumulated, X = QX₀ at the end; Dao AI Lab's gram-newton-schulz) and,
    #: for "gram", the 0-based steps before which R is recomputed from X (``restarts``). Both compute
    #: the same map; the form sets the rounding model of the tolerances (docs/tolerances.md, "Gram
    #: Newton–Schulz").
    form: str = "standard"
    restarts: tuple = ()

    def __post_init__(self) -> None:
        _choice(self.form, "form", tol.NS_FORMS)
        if self.form == "standard" and tuple(self.restarts):
            raise ValueError(f"restarts: only Gram Newton-Schulz (form='gram') restarts, got {self.restarts!r}")
        if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in tuple(self.restarts)):
            raise ValueError(f"restarts: expected 0-based step indices (non-negative ints), got {self.restarts!r}")
        _choice(self.momentum_style, "momentum_style", ("ema", "classic"))
        _choice(self.nesterov_form, "nesterov_form", ortho_ref.muon.NESTEROV_FORMS)
        _choice(self.weight_decay_style, "weight_decay_style", ortho_ref.muon.WEIGHT_DECAY_STYLES)
        if not isinstance(self.bias_correction, (bool, np.bool_)):
            raise ValueError(f"bias_correction: expected a bool, got {self.bias_correction!r}")
        if self.bias_correction:  # ValueError naming bias_correction where no debiased form is defined
            ortho_ref.muon.check_bias_correction(self.momentum_style, self.nesterov, self.nesterov_form)
        if self.cautious_weight_decay and self.weight_decay_style == "l2":
            raise ValueError("weight_decay_style: 'l2' has no decay step for cautious_weight_decay to mask")
        if self.qk_clip_threshold is not None and not (0 < self.qk_clip_threshold < float("inf")):
            raise ValueError(f"qk_clip_threshold: expected None or a finite number > 0, got {self.qk_clip_threshold!r}")
        if not 0.0 <= self.qk_clip_alpha <= 1.0:
            raise ValueError(f"qk_clip_alpha: expected a number in [0, 1], got {self.qk_clip_alpha!r}")
        _choice(self.eps_mode, "eps_mode", ("add", "clamp"))
        _choice(self.adjust_lr, "adjust_lr", ortho_ref.muon.ADJUST_LR_MODES)
        if not self.extra_scale_factor > 0:
            raise ValueError(f"extra_scale_factor: expected > 0, got {self.extra_scale_factor!r}")
        muon_stages.equilibration_side(self.row_equilibration)  # ValueError naming row_equilibration
        if not isinstance(self.renormalize, bool):
            raise ValueError(f"renormalize: expected a bool, got {self.renormalize!r}")
        if self.normuon_beta2 is not None and not (isinstance(self.normuon_beta2, (int, float))
                                                   and 0.0 <= self.normuon_beta2 < 1.0):
            raise ValueError(f"normuon_beta2: expected None or a number in [0, 1), got {self.normuon_beta2!r}")
        if not (isinstance(self.normuon_eps, (int, float)) and self.normuon_eps >= 0):
            raise ValueError(f"normuon_eps: expected a number >= 0, got {self.normuon_eps!r}")
        _choice(self.normuon_eps_mode, "normuon_eps_mode", muon_stages.NORMUON_EPS_MODES)
        _choice(self.normuon_dim, "normuon_dim", muon_stages.NORMUON_DIMS)

    @property
    def has_stages(self) -> bool:
        """Whether any pipeline stage (MuonEq, Muon+, NorMuon) is declared."""
        return bool(muon_stages.equilibration_side(self.row_equilibration)) or self.renormalize or \
            self.normuon_beta2 is not None

    def stage_kwargs(self) -> dict:
        """The stage keywords of ``ortho_ref.muon.muon_pipeline_step`` these conventions declare."""
        return dict(row_equilibration=self.row_equilibration, renormalize=self.renormalize,
                    normuon_beta2=self.normuon_beta2, normuon_eps=self.normuon_eps,
                    normuon_eps_mode=self.normuon_eps_mode, normuon_dim=self.normuon_dim)


@dataclass(frozen=True)
class DionConventions:
    """What a Dion-like optimizer computes (Ahn et al., arXiv 2504.05295, Algorithm 1, as
    ``ortho_ref.dion_step``): error_feedback (M ← B − (1−μ)PRᵀ, else μPRᵀ), epsilon of the
    column normalization, power_iters; qr_method (``ortho_ref.QR_METHODS``: "householder",
    "cholesky_qr" = CholeskyQR2, "randomized_cholesky_qr" = microsoft/dion's "rcqr", whose
    sketches the reference draws itself: the tolerance then takes the reference's sketch) and
    right_factor ("column_norm" or Orth-Dion's "qr"); orthonormalize_dtype: the dtype Y = BQ, its
    QR and P are computed in when it differs from the state's (e.g. torch.float32 for float64
    parameters; None: the momentum's dtype); orientation: "min_side" (the transpose when m < n,
    Q (min(m, n), r)) or "never_transpose" (Q (n, r) for every matrix); the ``optimizer.state[p]``
    keys of the momentum (m, n) and the right factor Q; constructor keywords for lr, momentum (μ)
    and weight_decay, and extra_kwargs. The update is −lr·√(m/n)·PQᵀ with decoupled weight decay.
    Column signs of P and Q need no declaration: the comparison is gauge-invariant
    (docs/verification.md, "Gauge invariance").
    Raises: ValueError naming the field for an unknown qr_method, right_factor or orientation,
    or power_iters < 1.
    """

    error_feedback: bool = True
    epsilon: float = 1e-8
    power_iters: int = 1
    momentum_state_key: str = "momentum"
    q_state_key: str = "Q"
    hyperparameter_names: dict = field(default_factory=lambda: {"lr": "lr", "momentum": "mu",
                                                                "weight_decay": "weight_decay"})
    extra_kwargs: dict = field(default_factory=dict)
    qr_method: str = "householder"
    right_factor: str = "column_norm"
    orthonormalize_dtype: torch.dtype | None = None
    orientation: str = "min_side"

    def __post_init__(self) -> None:
        _choice(self.qr_method, "qr_method", ortho_ref.QR_METHODS)
        _choice(self.right_factor, "right_factor", ortho_ref.RIGHT_FACTORS)
        _choice(self.orientation, "orientation", DION_ORIENTATIONS)
        if not (isinstance(self.power_iters, int) and self.power_iters >= 1):
            raise ValueError(f"power_iters: expected an integer >= 1, got {self.power_iters!r}")
        if self.orthonormalize_dtype is not None:
            dtype_name(self.orthonormalize_dtype, argument="orthonormalize_dtype")


@dataclass(frozen=True)
class Dion2Conventions:
    """What a Dion2-like optimizer computes (microsoft/dion ``Dion2``, as ``ortho_ref.dion2.dion2_step``
    with "global" selection on one process): the Newton–Schulz schedule of the selected submatrix
    (``coefficients`` a registry name or (T, 3) rows, ``ns_steps``, ``safety`` None = the schedule's,
    ``epsilon`` added to s·‖B_S‖_F) and the dtype it runs in (``ns_dtype``: the tolerance takes the
    coarser of it and the parameters' dtype), ``adjust_lr`` ("spectral_norm" √(m/n), "rms_norm"
    0.2·√max(m, n), None), the ``optimizer.state[p]`` key of the momentum, and the constructor
    keywords for lr, fraction, ef_decay and weight_decay plus ``extra_kwargs``. Ties of the slice
    norms need no declaration: the check treats them as a gauge (docs/tolerances.md, "Dion2").
    Raises: ValueError naming ``adjust_lr`` for an unknown mode; TypeError naming ``ns_dtype`` for a
    dtype without a unit roundoff here.
    """

    coefficients: object = "polar_express"
    ns_steps: int | None = None
    safety: float | None = None
    epsilon: float = 1e-8
    adjust_lr: str | None = "spectral_norm"
    ns_dtype: torch.dtype = torch.bfloat16
    momentum_state_key: str = "momentum"
    hyperparameter_names: dict = field(default_factory=lambda: {"lr": "lr", "fraction": "fraction",
                                                                "ef_decay": "ef_decay", "weight_decay": "weight_decay"})
    extra_kwargs: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        _choice(self.adjust_lr, "adjust_lr", ("spectral_norm", "rms_norm", "match_rms_adamw", None))
        dtype_name(self.ns_dtype, argument="ns_dtype")


#: torch.optim.Muon's own conventions (defaults: EMA momentum, Nesterov, Keller Jordan's
#: coefficients, eps 1e-7 clamped, bf16 Newton–Schulz, adjust_lr_fn None = "original").
TORCH_MUON = MuonConventions(eps_mode="clamp")
#: ortho_fast.Muon's defaults: torch's, including the clamped normalization that
#: ``ortho_fast.default_eps_mode("jordan")`` resolves to.
ORTHO_MUON = MuonConventions(eps_mode="clamp")
#: microsoft/dion's NorMuon (and ``ortho_fast.NorMuon``'s defaults): classic momentum without Nesterov,
#: Polar Express, "spectral_norm", bf16 Newton–Schulz, the second moment per row with √v + 1e-8.
NORMUON = MuonConventions(momentum_style="classic", nesterov=False, coefficients="polar_express",
                          adjust_lr="spectral_norm", normuon_beta2=0.95,
                          hyperparameter_names={"lr": "lr", "momentum": "mu", "weight_decay": "weight_decay"})
#: ortho_fast.Dion and microsoft/dion's Dion (state keys "momentum" and "Q", μ keyword "mu").
DION = DionConventions()
#: ortho_fast.Dion2 and microsoft/dion's Dion2 (Polar Express with safety 1.02 on the bfloat16
#: submatrix, epsilon 1e-8, "spectral_norm", state key "momentum").
DION2 = Dion2Conventions()
