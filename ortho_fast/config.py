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
    """The distributed arguments of ``HybridOptimizer`` from a world DeviceMesh with named dims,
    as OLMo-core builds its Dion: ``dp_replicate`` + ``dp_shard`` -> HSDP (replicate mesh, outer
    shard mesh), any other single ``dp*`` dim -> the outer shard mesh (FSDP; DDP when the
    parameters are plain tensors), ``tp`` -> the inner shard mesh; gradient sync left to FSDP /
    DDP (``replicate_mesh_grad_sync=False``). Muon gets the same shard dim as ``distributed_mesh``
    and ``tp`` as ``tp_mesh`` (its parameters are replicated over ``dp_replicate``, whose gradient
    all-reduce FSDP does). Other dims (``cp``, ``pp``, ``ep``, ...) are not passed: a parameter
    sharded on one raises at construction. None -> {} (one process).
    Shapes: ``mesh`` an N-D DeviceMesh with ``mesh_dim_names``.
    Source: allenai/OLMo-core ``DionConfig`` (``src/olmo_core/optim/dion.py``).
    Raises: ValueError naming ``mesh`` for a mesh without dim names or with several ``dp*`` dims
    other than the ``dp_replicate`` / ``dp_shard`` pair.
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

    Muon: torch.optim.Muon's defaults — lr 1e-3, weight_decay 0.1, momentum 0.95, nesterov,
    Keller Jordan's coefficients ("jordan"), bf16 Newton–Schulz, "original" lr adjustment
    √max(1, m/n) (torch's ``adjust_lr_fn=None``). ``ns_steps``, ``safety``, ``eps`` and
    ``eps_mode`` None come from the schedule exactly as in ``Muon``: "jordan" runs 5 steps
    with torch's X₀ = U / max(‖U‖_F, 1e-7) (bitwise torch.optim.Muon on CPU with
    ``muon_options={"bitwise_torch": True}``), "polar_express" 5 steps with X₀ = U / (1.02‖U‖_F + 1e-6)
    (microsoft/dion, nanochat), "you6" 6 steps.
    ``muon_options``: any other ``MUON_DEFAULTS`` key (momentum_style, split_sizes, flatten, ...;
    a field that is set wins over the same key there).
    Scalars (``HYBRID_DEFAULTS["muon"]``, as ``param_groups(model, algorithm="muon")``):
    torch.optim.AdamW's defaults — betas (0.9, 0.999), eps 1e-8, weight_decay 0.01 — at the Muon lr
    (``scalar_lr`` None; 1e-3 is also AdamW's default); embeddings without
    weight decay (OLMo-core); no output-head lr scaling (torch has none; "inv_sqrt_d_model"
    for OLMo-core's). ``scalar_algorithm="lion"`` (recommended with Muon by Megatron /
    Emerging-Optimizers) uses betas (0.95, 0.98) unless ``scalar_betas`` is given; Lion
    wants an lr 3–10× below AdamW's (Chen et al. 2023), so set ``scalar_lr``.
    ``build(model, mesh=None)`` -> ``HybridOptimizer`` over ``param_groups(model, ...)``; a named
    world ``mesh`` distributes it (``meshes_from_world_mesh``; ``tp_mode`` for tensor parallelism).
    Raises (at ``build``): what ``param_groups`` and ``HybridOptimizer`` raise.
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
        """The optimizer for ``model`` (see the class docstring); ``mesh`` a named world
        DeviceMesh of a distributed model (``meshes_from_world_mesh``), with ``tp_mode``."""
        return self._build(model, "muon", HYBRID_DEFAULTS["muon"]["scalar_options"]["adamw"]["betas"], mesh,
                           tp_mode=self.tp_mode)


@accepts_aliases(DION_CONFIG_ALIASES, DION_DEFAULTS, "dion_options", "dion_config")
@dataclass(kw_only=True)
class DionConfig(_HybridConfig):
    """Dion for the matrices, AdamW (or Lion) for the rest, with OLMo-core's defaults.

    OLMo-core ``DionConfig`` (allenai/OLMo-core ``src/olmo_core/optim/dion.py``, the
    ``MatrixAwareOptimConfig`` versions; the first version had lr 1e-3): lr 0.01, mu 0.95,
    betas (0.9, 0.95) for AdamW, weight_decay 0.1 for every group but the
    embeddings (0), rank_fraction 1.0; rank_multiple_of 1, epsilon 1e-8 and power_iters 1
    from microsoft/dion's ``Dion``; AdamW eps = microsoft/dion's epsilon 1e-8. Grouping as
    OLMo-core: matrices -> Dion, embeddings -> AdamW without weight decay, vectors -> AdamW,
    output head -> AdamW at lr/√d_model; one lr for every group (``scalar_lr`` None). These
    are ``HYBRID_DEFAULTS["dion"]``, as ``param_groups(model, algorithm="dion")``.
    ``qr_method`` "randomized_cholesky_qr", microsoft/dion's default ("rcqr", oversample
    1.25), which OLMo-core does not override; ``ortho_fast.Dion`` itself defaults to
    "householder", the reference method.
    ``dion_options``: any other ``DION_DEFAULTS`` key. Lion for the scalars: betas (0.95,
    0.98) unless ``scalar_betas`` is given.
    ``build(model, mesh=None)`` -> ``HybridOptimizer`` over ``param_groups(model, ...)``; a named
    world ``mesh`` distributes it as OLMo-core does (``meshes_from_world_mesh``).
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
        """The optimizer for ``model`` (see the class docstring); ``mesh`` a named world
        DeviceMesh of a distributed model (``meshes_from_world_mesh``: OLMo-core's mapping)."""
        return self._build(model, "dion", self.betas, mesh)
