"""Configurations with the defaults of the systems users come from: ``MuonConfig`` / ``DionConfig``
build a ``HybridOptimizer`` for a whole model (OLMo-core's ``DionConfig`` / ``MuonConfig``), and
``meshes_from_world_mesh`` maps a named world mesh to the optimizers' mesh arguments.
"""

from __future__ import annotations

import functools
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Mapping

from torch import nn

from .coefficients import CoefficientsLike
from .compat import DION_CONFIG_ALIASES, MUON_CONFIG_ALIASES, Alias, apply_aliases
from .groups.dion import DION_DEFAULTS
from .groups.muon import MUON_DEFAULTS
from .hybrid_optimizer import HybridOptimizer
from .param_assignment import HYBRID_DEFAULTS, LION_SCALAR_BETAS, param_groups


def accepts_aliases(aliases: tuple[Alias, ...], algorithm_defaults: Mapping[str, Any], options_field: str,
                    fixed: str):
    """Class decorator for a keyword-only config dataclass: its constructor also takes the other
    systems' names of ``aliases`` (``ortho_fast.compat``). An alias of a field sets the field; an
    alias of another option of the algorithm (``algorithm_defaults``), or that option by our own
    name, goes into the dict field ``options_field`` (``muon_options`` / ``dion_options``). ``inspect.signature`` still
    shows the dataclass fields.
    Raises (at construction): TypeError for an unknown name with the closest one; ValueError
    naming both names for conflicting ones (see ``apply_aliases``)."""
    def decorate(cls):
        init = cls.__init__
        names = [f.name for f in fields(cls)]
        field_defaults = {f.name: f.default for f in fields(cls) if f.default is not MISSING}

        @functools.wraps(init)
        def __init__(self, **kwargs):
            extra = {k: kwargs.pop(k) for k in list(kwargs) if k not in names}
            given_options = dict(kwargs.get(options_field) or {})
            others = {k: v for k, v in algorithm_defaults.items() if k not in names}
            for key in [k for k in extra if k in others]:  # our own option names, beside the fields
                if key in given_options and given_options[key] != extra[key]:
                    raise ValueError(f"{key}: given both directly and in {options_field}; give one of them")
                given_options[key] = extra.pop(key)
            options = {**others, **given_options, **field_defaults, **kwargs}
            before = dict(options)
            apply_aliases(extra, aliases, options, {**others, **field_defaults}, fixed=fixed, where=cls.__name__)
            changed = {k: v for k, v in options.items() if k not in before or before[k] is not v}
            for key, value in changed.items():
                if key in names:
                    kwargs[key] = value
                else:
                    given_options[key] = value
            if given_options:
                kwargs[options_field] = given_options
            init(self, **kwargs)

        cls.__init__ = __init__
        return cls
    return decorate


@dataclass(kw_only=True)
class _HybridConfig:
    """Fields shared by ``MuonConfig`` and ``DionConfig`` (the scalar side and the grouping).

    Every default not given here is the algorithm's row of ``ortho_fast.param_assignment.HYBRID_DEFAULTS``,
    the table ``param_groups`` takes its defaults from too (docs/compatibility.md, "Whole-model
    defaults"): ``build(model)`` and ``HybridOptimizer(param_groups(model, algorithm=..., ...))``
    with the same arguments give the same groups."""

    scalar_algorithm: str = "adamw"
    scalar_lr: float | None = None
    scalar_betas: tuple[float, float] | None = None
    scalar_eps: float = 1e-8
    scalar_weight_decay: float | None = None
    embedding_weight_decay: float = 0.0
    lm_head_lr_scale: str | None = HYBRID_DEFAULTS["muon"]["lm_head_lr_scale"]
    d_model: int | None = None
    expert_keys: tuple[str, ...] = ()
    overrides: tuple = ()
    seed: int = 0

    #: Megatron's Lion betas for the scalar parameters of Muon (Emerging-Optimizers).
    LION_BETAS = LION_SCALAR_BETAS

    def _matrix_options(self) -> dict:
        raise NotImplementedError

    def _scalar_options(self, adamw_betas: tuple[float, float]) -> dict:
        if self.scalar_algorithm == "lion":
            return {"betas": self.LION_BETAS if self.scalar_betas is None else self.scalar_betas}
        return {"betas": adamw_betas if self.scalar_betas is None else self.scalar_betas, "eps": self.scalar_eps}

    def _build(self, model: nn.Module, algorithm: str, adamw_betas, mesh=None, **distributed) -> HybridOptimizer:
        matrix = self._matrix_options()
        groups = param_groups(
            model, algorithm=algorithm, scalar_algorithm=self.scalar_algorithm, lr=matrix.pop("lr"),
            scalar_lr=self.scalar_lr, weight_decay=matrix.pop("weight_decay"),
            scalar_weight_decay=self.scalar_weight_decay,
            embedding_weight_decay=self.embedding_weight_decay, lm_head_lr_scale=self.lm_head_lr_scale,
            d_model=self.d_model, expert_keys=self.expert_keys, overrides=self.overrides,
            matrix_options=matrix, scalar_options=self._scalar_options(adamw_betas),
        )
        meshes = meshes_from_world_mesh(mesh)
        keys = ("distributed_mesh", "tp_mesh") if algorithm == "muon" else (
            "replicate_mesh", "outer_shard_mesh", "inner_shard_mesh", "replicate_mesh_grad_sync")
        return HybridOptimizer(groups, seed=self.seed, **{k: meshes[k] for k in keys if k in meshes}, **distributed)


def meshes_from_world_mesh(mesh) -> dict:
    """The distributed arguments of ``HybridOptimizer`` from a world DeviceMesh with named dims.

    As OLMo-core builds its Dion: ``dp_replicate`` + ``dp_shard`` -> HSDP (replicate mesh, outer shard
    mesh), any other single ``dp*`` dim -> the outer shard mesh (FSDP; DDP when the parameters are plain
    tensors), ``tp`` -> the inner shard mesh; gradient sync left to FSDP / DDP
    (``replicate_mesh_grad_sync=False``). Muon gets the same shard dim as ``distributed_mesh`` and ``tp``
    as ``tp_mesh`` (its parameters are replicated over ``dp_replicate``, whose gradient all-reduce FSDP
    does). Other dims (``cp``, ``pp``, ``ep``, ...) are not passed: a parameter sharded on one raises at
    construction.

    Parameters
    ----------
    mesh : DeviceMesh or None
        An N-D DeviceMesh with ``mesh_dim_names``; None for one process.

    Returns
    -------
    dict
        ``replicate_mesh``, ``outer_shard_mesh``, ``inner_shard_mesh``, ``replicate_mesh_grad_sync``,
        ``distributed_mesh``, ``tp_mesh`` (1-D meshes or None); {} for ``mesh`` None.

    Raises
    ------
    ValueError
        Naming ``mesh``: no dim names, or several ``dp*`` dims other than the ``dp_replicate`` /
        ``dp_shard`` pair.

    References
    ----------
    allenai/OLMo-core ``DionConfig`` (``src/olmo_core/optim/dion.py``).

    Examples
    --------
    >>> import ortho_fast
    >>> ortho_fast.meshes_from_world_mesh(None)
    {}
    """
    if mesh is None:
        return {}
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    if not names:
        raise ValueError("mesh: expected a DeviceMesh with mesh_dim_names (e.g. ('dp_replicate', 'dp_shard', 'tp'))")
    dp = [n for n in names if n.startswith("dp")]
    replicate = shard = None
    if "dp_replicate" in names and "dp_shard" in names:
        replicate, shard = mesh["dp_replicate"], mesh["dp_shard"]
        dp = [n for n in dp if n not in ("dp_replicate", "dp_shard")]
    elif len(dp) == 1:
        shard, dp = mesh[dp[0]], []
    if dp:
        raise ValueError(f"mesh: cannot tell the data-parallel dims apart in {names}; expected 'dp_replicate' + "
                         f"'dp_shard' (HSDP) or a single 'dp*' dim")
    tp = mesh["tp"] if "tp" in names else None
    return dict(replicate_mesh=replicate, outer_shard_mesh=shard, inner_shard_mesh=tp, replicate_mesh_grad_sync=False,
                distributed_mesh=shard, tp_mesh=tp)


@accepts_aliases(MUON_CONFIG_ALIASES, MUON_DEFAULTS, "muon_options", "muon_config")
@dataclass(kw_only=True)
class MuonConfig(_HybridConfig):
    """Muon for the matrices, AdamW (or Lion) for the rest, with torch's defaults.

    ``build(model)`` returns a ``HybridOptimizer`` over ``param_groups(model, algorithm="muon", ...)``;
    every default not given is ``HYBRID_DEFAULTS["muon"]`` (``ortho_fast.param_assignment``), the table
    ``param_groups`` takes its defaults from, so both ways give the same groups. Also accepts the other
    systems' names (``mu``, ``ns_coefficients``, ...). docs/optimizers.md, "MuonConfig and DionConfig".

    Parameters
    ----------
    scalar_algorithm : {"adamw", "lion"}, default "adamw"
        The algorithm of embeddings, vectors, scalars and the output head.
    scalar_lr, scalar_betas, scalar_eps, scalar_weight_decay : float, (float, float), float, float, optional
        Their lr (None: ``lr``), betas (AdamW (0.9, 0.999), Lion (0.95, 0.98)), eps (1e-8), decay (0.01).
    embedding_weight_decay : float, default 0.0
        Weight decay of the embeddings (OLMo-core).
    lm_head_lr_scale, d_model : {"inv_sqrt_d_model", None}, int, default None, None
        Output-head lr scale (OLMo-core's lr/√d_model); d_model None: the head's fan_in.
    expert_keys, overrides : sequence of str, sequence of (glob or predicate, dict), default (), ()
        Names of (experts, m, n) stacks; per-parameter option overrides (``param_groups``).
    seed : int, default 0
        ``HybridOptimizer``'s seed.
    lr, weight_decay, momentum, nesterov : float, float, float, bool, default 1e-3, 0.1, 0.95, True
        Muon's lr, decoupled weight decay, momentum and Nesterov momentum (torch.optim.Muon's).
    coefficients, ns_steps, safety, eps, eps_mode : str or rows, int, float, float, str, default "jordan"
        The Newton–Schulz schedule and normalization, as ``Muon``'s (None: the schedule's).
    adjust_lr, tp_mode : str or None, str, default "original", "duplicated"
        The per-matrix lr scale √max(1, m/n) (torch's); tensor-parallel mode of a distributed ``build``.
    muon_options : dict, default {}
        Any other ``Muon`` option (``momentum_style``, ``split_sizes``, ...); a field that is set wins.

    Raises
    ------
    TypeError, ValueError
        An unknown or conflicting name at construction; at ``build``, what ``param_groups`` and
        ``HybridOptimizer`` raise.

    References
    ----------
    ``torch.optim.Muon`` and ``torch.optim.AdamW``; allenai/OLMo-core ``src/olmo_core/optim`` (the
    grouping); Megatron / NVIDIA-NeMo Emerging-Optimizers (Lion for the scalars of Muon).

    Examples
    --------
    >>> import torch, ortho_fast
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    >>> opt = ortho_fast.MuonConfig(lr=0.02).build(model)
    >>> sorted({group["algorithm"] for group in opt.param_groups})
    ['adamw', 'muon']
    """

    lr: float = HYBRID_DEFAULTS["muon"]["lr"]
    weight_decay: float = HYBRID_DEFAULTS["muon"]["weight_decay"]
    momentum: float = 0.95
    nesterov: bool = True
    coefficients: CoefficientsLike = "jordan"
    ns_steps: int | None = None
    safety: float | None = None
    eps: float | None = None
    eps_mode: str | None = None
    adjust_lr: str | None = "original"
    tp_mode: str = "duplicated"
    muon_options: dict = field(default_factory=dict)

    def _matrix_options(self) -> dict:
        schedule = {k: v for k, v in (("ns_steps", self.ns_steps), ("safety", self.safety), ("eps", self.eps),
                                      ("eps_mode", self.eps_mode)) if v is not None}
        return dict(self.muon_options, lr=self.lr, weight_decay=self.weight_decay, momentum=self.momentum,
                    nesterov=self.nesterov, coefficients=self.coefficients, adjust_lr=self.adjust_lr, **schedule)

    def build(self, model: nn.Module, mesh=None) -> HybridOptimizer:
        """The optimizer of ``model``, distributed over a named world mesh if one is given.

        Parameters
        ----------
        model : torch.nn.Module
            The model whose trainable parameters are grouped (``param_groups``).
        mesh : DeviceMesh, optional
            A world mesh with named dims (``meshes_from_world_mesh``: OLMo-core's mapping).

        Returns
        -------
        HybridOptimizer
            Over ``param_groups(model, ...)`` with this configuration's options.
        """
        return self._build(model, "muon", HYBRID_DEFAULTS["muon"]["scalar_options"]["adamw"]["betas"], mesh,
                           tp_mode=self.tp_mode)


@accepts_aliases(DION_CONFIG_ALIASES, DION_DEFAULTS, "dion_options", "dion_config")
@dataclass(kw_only=True)
class DionConfig(_HybridConfig):
    """Dion for the matrices, AdamW (or Lion) for the rest, with OLMo-core's defaults.

    ``build(model)`` returns a ``HybridOptimizer`` over ``param_groups(model, algorithm="dion", ...)``;
    every default not given is ``HYBRID_DEFAULTS["dion"]`` (``ortho_fast.param_assignment``): OLMo-core's
    ``DionConfig`` with microsoft/dion's ``Dion`` defaults and QR ("randomized_cholesky_qr").
    docs/optimizers.md, "MuonConfig and DionConfig", says where each default comes from.

    Parameters
    ----------
    scalar_algorithm : {"adamw", "lion"}, default "adamw"
        The algorithm of embeddings, vectors, scalars and the output head.
    scalar_lr, scalar_betas, scalar_eps, scalar_weight_decay : float, (float, float), float, float, optional
        Their lr (None: ``lr``), betas (None: ``betas``; Lion (0.95, 0.98)), eps (1e-8), decay (None: 0.1).
    embedding_weight_decay : float, default 0.0
        Weight decay of the embeddings (OLMo-core).
    lm_head_lr_scale, d_model : {"inv_sqrt_d_model", None}, int, default "inv_sqrt_d_model", None
        Output-head lr scale (OLMo-core's lr/√d_model); d_model None: the head's fan_in.
    expert_keys, overrides : sequence of str, sequence of (glob or predicate, dict), default (), ()
        Names of (experts, m, n) stacks; per-parameter option overrides (``param_groups``).
    seed : int, default 0
        The seed of Dion's Q0 and sketches.
    lr, mu, betas, weight_decay : float, float, (float, float), float, default 0.01, 0.95, (0.9, 0.95), 0.1
        Dion's lr and momentum; AdamW's betas; the weight decay of every group but the embeddings.
    rank_fraction, rank_multiple_of, epsilon, power_iters : float, int, float, int, default 1.0, 1, 1e-8, 1
        As ``Dion``'s.
    qr_method : str, default "randomized_cholesky_qr"
        microsoft/dion's default QR ("rcqr"), which OLMo-core keeps; ``Dion`` itself uses "householder".
    dion_options : dict, default {}
        Any other ``Dion`` option; a field that is set wins.

    Raises
    ------
    TypeError, ValueError
        An unknown or conflicting name at construction; at ``build``, what ``param_groups`` and
        ``HybridOptimizer`` raise.

    References
    ----------
    allenai/OLMo-core ``DionConfig`` (``src/olmo_core/optim/dion.py``); microsoft/dion ``Dion``;
    Ahn et al. 2025, arXiv 2504.05295.

    Examples
    --------
    >>> import torch, ortho_fast
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    >>> opt = ortho_fast.DionConfig(rank_fraction=0.5).build(model)
    >>> sorted({group["algorithm"] for group in opt.param_groups})
    ['adamw', 'dion']
    """

    lr: float = HYBRID_DEFAULTS["dion"]["lr"]
    mu: float = 0.95
    betas: tuple[float, float] = HYBRID_DEFAULTS["dion"]["scalar_options"]["adamw"]["betas"]
    weight_decay: float = HYBRID_DEFAULTS["dion"]["weight_decay"]
    rank_fraction: float = 1.0
    rank_multiple_of: int = 1
    epsilon: float = 1e-8
    power_iters: int = 1
    qr_method: str = HYBRID_DEFAULTS["dion"]["matrix_options"]["qr_method"]
    lm_head_lr_scale: str | None = HYBRID_DEFAULTS["dion"]["lm_head_lr_scale"]
    dion_options: dict = field(default_factory=dict)

    def _matrix_options(self) -> dict:
        return dict(self.dion_options, lr=self.lr, weight_decay=self.weight_decay, mu=self.mu,
                    rank_fraction=self.rank_fraction, rank_multiple_of=self.rank_multiple_of, epsilon=self.epsilon,
                    power_iters=self.power_iters, qr_method=self.qr_method)

    def build(self, model: nn.Module, mesh=None) -> HybridOptimizer:
        """The optimizer of ``model``, distributed over a named world mesh if one is given.

        Parameters
        ----------
        model : torch.nn.Module
            The model whose trainable parameters are grouped (``param_groups``).
        mesh : DeviceMesh, optional
            A world mesh with named dims (``meshes_from_world_mesh``: OLMo-core's mapping).

        Returns
        -------
        HybridOptimizer
            Over ``param_groups(model, ...)`` with this configuration's options.
        """
        return self._build(model, "dion", self.betas, mesh)
