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

    The reference step is ``ortho_ref.muon.muon_pipeline_step``: momentum M and Nesterov input U from the
    gradient G, O = NS(U) (+ the declared stages), W ← d(W) − lr·s·O with the adjust_lr scale s and the decay d.
    Every option, with the names other libraries use: docs/checks.md, "MuonConventions".

    Parameters
    ----------
    momentum_style : {"ema", "classic"}, default "ema"
        "ema" M ← μM + (1−μ)G (torch.optim.Muon, Keller Jordan); "classic" M ← μM + G (microsoft/dion).
    nesterov : bool, default True
        Nesterov's U from G and the new M (the form: ``nesterov_form``).
    coefficients, ns_steps : str or (T, 3) sequence of float, int, default "jordan", None
        The Newton–Schulz schedule (``ortho_ref.SCHEDULES`` name or rows) and its step count (None: its own).
    safety, eps, eps_mode : float, float, {"add", "clamp"}, default None, None, "add"
        Normalization U / (safety·‖U‖_F + eps), or / max(safety·‖U‖_F, eps); None: the schedule's.
    adjust_lr : str or None, default "original"
        The lr scale s (``ortho_ref.muon.ADJUST_LR_MODES``; "original" √max(1, m/n)).
    ns_dtype : torch.dtype, default torch.bfloat16
        The dtype the Newton–Schulz iteration runs in.
    momentum_state_key : str, tuple of str or None, default "momentum_buffer"
        The ``optimizer.state[p]`` key (or path) of the momentum (None: the reference keeps its own).
    hyperparameter_names, extra_kwargs : dict, dict
        Constructor keywords of lr, momentum, weight_decay (``"betas[0]"``: a tuple entry); more keywords.
    extra_scale_factor : float, default 1.0
        A further constant factor on the update (Megatron's ``extra_scale_factor``).
    cautious_weight_decay : bool, default False
        Decay only where sign(O)·sign(W) ≥ 0 (Chen et al. 2025, arXiv 2510.12402).
    qk_clip_threshold, qk_clip_alpha : float or None, float, default None, 0.5
        QK-clip of attention projections after the step (MuonClip): τ (None: off) and α.
    row_equilibration, renormalize : bool or {"row", "column"}, bool, default False, False
        The MuonEq stage before Newton–Schulz; Muon+'s ‖O‖_F = √min(m, n) after it.
    normuon_beta2, normuon_eps, normuon_eps_mode : float or None, float, {"add", "clamp"}, default None, 1e-8, "add"
        NorMuon's second-moment EMA (None: off), its eps, and √v + eps or √max(v, eps).
    normuon_dim, normuon_state_key : {"row", "column", "by_shape"}, str or None, default "row", "variance_neuron"
        The axis of NorMuon's second moment and its ``optimizer.state[p]`` key (None: not read).
    nesterov_form : {"mix", "full_grad"}, default "mix"
        U as the lerp of G and M, or U = G + μM beside an EMA momentum (``ortho_ref.muon.NESTEROV_FORMS``).
    weight_decay_style : str, default "decoupled"
        The decay d(W) (``ortho_ref.muon.WEIGHT_DECAY_STYLES``: W(1 − lr·wd), "adjusted_lr", "independent", "l2").
    bias_correction : bool, default False
        U from the EMA momentum debiased as Adam's at the 1-based step (optax ``contrib.muon``).
    form, restarts : {"standard", "gram"}, tuple of int, default "standard", ()
        Gram Newton–Schulz and its 0-based restart steps: the same map, its own rounding model.

    Raises
    ------
    ValueError
        Naming the field, for a value outside its choices or range, or ``bias_correction`` where undefined.

    References
    ----------
    Jordan et al. 2024, "Muon" (kellerjordan.github.io/posts/muon); torch.optim.Muon; docs/math.md, "Muon".

    Examples
    --------
    >>> from ortho_verify import MuonConventions
    >>> MuonConventions(momentum_style="classic", nesterov=False, adjust_lr="spectral_norm").eps_mode
    'add'
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
        """The stage keywords of ``ortho_ref.muon.muon_pipeline_step`` these conventions declare.

        Returns
        -------
        dict
            ``row_equilibration``, ``renormalize``, ``normuon_beta2``, ``normuon_eps``, ``normuon_eps_mode`` and
            ``normuon_dim``, as the fields.
        """
        return dict(row_equilibration=self.row_equilibration, renormalize=self.renormalize,
                    normuon_beta2=self.normuon_beta2, normuon_eps=self.normuon_eps,
                    normuon_eps_mode=self.normuon_eps_mode, normuon_dim=self.normuon_dim)


@dataclass(frozen=True)
class DionConventions:
    """What a Dion-like optimizer computes, so that ``check_optimizer`` can build its reference.

    The reference is ``ortho_ref.dion_step`` (Ahn et al., Algorithm 1): B = M + G; P = orth(BQ); R = BᵀP;
    M ← B − (1−μ)PRᵀ; Q ← R with normalized columns; W ← (1 − lr·wd)W − lr·√(m/n)·PQᵀ. Column signs of P and Q
    need no declaration (docs/verification.md, "Gauge invariance"); details: docs/checks.md, "DionConventions".

    Parameters
    ----------
    error_feedback : bool, default True
        M ← B − (1−μ)PRᵀ; False: M ← μPRᵀ (the rank-r residual is discarded).
    epsilon : float, default 1e-8
        Added to each column norm of R.
    power_iters : int, default 1
        Power iterations per step (≥ 1).
    momentum_state_key, q_state_key : str, default "momentum", "Q"
        The ``optimizer.state[p]`` keys of the momentum (m, n) and the right factor Q.
    hyperparameter_names : dict, default {"lr": "lr", "momentum": "mu", "weight_decay": "weight_decay"}
        Constructor keywords of lr, μ and weight decay.
    extra_kwargs : dict, default {}
        Further constructor keywords.
    qr_method : str, default "householder"
        ``ortho_ref.QR_METHODS``: "householder", "cholesky_qr" (CholeskyQR2), "randomized_cholesky_qr".
    right_factor : {"column_norm", "qr"}, default "column_norm"
        Q from R by column normalization, or Orth-Dion's Q = orth(R).
    orthonormalize_dtype : torch.dtype, optional
        The dtype of Y = BQ, its QR and P when it differs from the state's (None: the momentum's).
    orientation : {"min_side", "never_transpose"}, default "min_side"
        "min_side": Bᵀ when m < n, Q (min(m, n), r); "never_transpose": Q (n, r) for every matrix.

    Raises
    ------
    ValueError
        Naming the field, for an unknown qr_method, right_factor or orientation, or power_iters < 1.

    References
    ----------
    Ahn, Xu, Abreu, Langford 2025, "Dion", arXiv 2504.05295, Algorithm 1; microsoft/dion ``dion_simple.py``.

    Examples
    --------
    >>> from ortho_verify import DionConventions
    >>> DionConventions(qr_method="cholesky_qr").hyperparameter_names["momentum"]
    'mu'
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
    """What a Dion2-like optimizer computes, so that ``check_dion2_optimizer`` can build its reference.

    The reference is ``ortho_ref.dion2.dion2_step`` with "global" selection on one process: the fraction of
    slices of B = M + G with the largest norms is orthogonalized by Newton–Schulz and applied, the momentum of
    the selected slices decays by ef_decay. Ties of the slice norms are a gauge (docs/tolerances.md, "Dion2").

    Parameters
    ----------
    coefficients : str or (T, 3) sequence of float, default "polar_express"
        The Newton–Schulz schedule of the selected submatrix.
    ns_steps : int, optional
        Its step count (None: the schedule's).
    safety : float, optional
        Divides the Frobenius-normalized submatrix (None: the schedule's).
    epsilon : float, default 1e-8
        Added to safety·‖B_S‖_F.
    adjust_lr : {"spectral_norm", "rms_norm", "match_rms_adamw", None}, default "spectral_norm"
        The lr scale: √(m/n), or 0.2·√max(m, n) ("rms_norm" = "match_rms_adamw"), or none.
    ns_dtype : torch.dtype, default torch.bfloat16
        The Newton–Schulz dtype; the tolerance takes the coarser of it and the parameters' dtype.
    momentum_state_key : str, default "momentum"
        The ``optimizer.state[p]`` key of the momentum.
    hyperparameter_names : dict
        Constructor keywords of lr, fraction, ef_decay and weight_decay (default: those names).
    extra_kwargs : dict, default {}
        Further constructor keywords.

    Raises
    ------
    ValueError
        Naming ``adjust_lr``, for an unknown mode.
    TypeError
        Naming ``ns_dtype``, for a dtype without a unit roundoff here.

    References
    ----------
    microsoft/dion ``dion/dion2.py`` (class ``Dion2``); docs/math.md, "5a. Dion2".

    Examples
    --------
    >>> from ortho_verify import Dion2Conventions
    >>> Dion2Conventions(ns_steps=5).coefficients
    'polar_express'
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
#: ``ortho_fast.groups.muon.default_eps_mode("jordan")`` resolves to.
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
