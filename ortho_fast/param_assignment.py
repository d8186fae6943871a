"""Which parameter goes where: ``param_groups`` splits a model's parameters into ``HybridOptimizer``
groups (matrices to Muon / Dion; embeddings, vectors, scalars and the output head to AdamW / Lion) the
way OLMo-core, Motif, Megatron and microsoft/dion do.
"""

from __future__ import annotations

import fnmatch
import math
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from .functional.layout import DROPPED_NAME_COMPONENTS, is_expert_name
from .groups.algorithms import ALGORITHMS, MATRIX_ALGORITHMS, SCALAR_ALGORITHMS

#: Name components of embedding parameters (HF ``embed_tokens``, torchtitan ``tok_embeddings``,
#: nanoGPT ``wte``/``wpe``, OLMo-core ``embeddings``, BERT ``word_embeddings``, ...).
EMBEDDING_NAMES = ("embed_tokens", "tok_embeddings", "wte", "wpe", "embedding", "embeddings", "word_embeddings",
                   "position_embeddings")
#: Output-head names: ``lm_head`` as any component (HF, nanoGPT, nanochat, OLMo-core
#: ``lm_head.w_out``); ``output``, ``head``, ``output_layer`` only as the first component (Meta
#: Llama ``output``, timm ``head``, Megatron ``output_layer``), so that e.g. BERT's
#: ``attention.output.dense`` stays a matrix.
HEAD_NAMES = ("lm_head",)
TOP_LEVEL_HEAD_NAMES = ("output", "head", "output_layer")
#: Wrapper components dropped from names before matching (torch.compile, activation
#: checkpointing, FSDP1; as Motif), plus a leading ``module`` of DataParallel / DDP.
WRAPPER_NAME_COMPONENTS = tuple(DROPPED_NAME_COMPONENTS) + ("_fsdp_wrapped_module",)

Override = tuple  # (glob str | Callable[[torch.Tensor, str], bool], dict of group options)

#: Megatron / Emerging-Optimizers' Lion betas for the scalar parameters of Muon.
LION_SCALAR_BETAS = (0.95, 0.98)

#: The whole-model defaults, per matrix algorithm: the one table that ``param_groups`` and
#: ``MuonConfig`` / ``DionConfig`` both take their defaults from, so that the two ways of building
#: the optimizer of a model give the same groups (docs/compatibility.md, "Whole-model defaults").
#: ``lr`` / ``weight_decay``: the matrix groups'; ``scalar_weight_decay`` None: the scalar groups
#: take ``weight_decay``; ``scalar_options``: per scalar algorithm; ``matrix_options``: further
#: options of every matrix group. Sources: muon — torch.optim.Muon and torch.optim.AdamW (no output-head
#: lr scaling: torch has none); dion — OLMo-core ``DionConfig`` (lr 0.01, weight decay 0.1 for every group
#: but the embeddings, AdamW betas (0.9, 0.95), output head at lr/√d_model) with microsoft/dion's
#: default QR ("rcqr"); dion2 — microsoft/dion's ``Dion2`` lr and weight decay, one of each for
#: every group (microsoft/dion), the output head as OLMo-core. Lion's betas: Megatron's (0.95, 0.98).
HYBRID_DEFAULTS: dict[str, dict[str, Any]] = {
    "muon": dict(lr=1e-3, weight_decay=0.1, scalar_weight_decay=1e-2, embedding_weight_decay=0.0,
                 lm_head_lr_scale=None, matrix_options={},
                 scalar_options={"adamw": {"betas": (0.9, 0.999), "eps": 1e-8}, "lion": {"betas": LION_SCALAR_BETAS}}),
    "dion": dict(lr=0.01, weight_decay=0.1, scalar_weight_decay=None, embedding_weight_decay=0.0,
                 lm_head_lr_scale="inv_sqrt_d_model", matrix_options={"qr_method": "randomized_cholesky_qr"},
                 scalar_options={"adamw": {"betas": (0.9, 0.95), "eps": 1e-8}, "lion": {"betas": LION_SCALAR_BETAS}}),
    "dion2": dict(lr=0.01, weight_decay=0.01, scalar_weight_decay=None, embedding_weight_decay=0.0,
                  lm_head_lr_scale="inv_sqrt_d_model", matrix_options={},
                  scalar_options={"adamw": {"betas": (0.9, 0.999), "eps": 1e-8}, "lion": {"betas": LION_SCALAR_BETAS}}),
}


class _Default:
    """The default of an argument of ``param_groups``: ``HYBRID_DEFAULTS[algorithm][name]``."""

    def __repr__(self) -> str:
        return "DEFAULT"


#: Sentinel of ``param_groups``' ``lm_head_lr_scale``: the value of ``HYBRID_DEFAULTS`` for the algorithm.
DEFAULT: Any = _Default()


def normalize_name(name: str, *, data_parallel: bool = False) -> str:
    """``name`` without wrapper components (``WRAPPER_NAME_COMPONENTS``; the leading
    ``module`` too when ``data_parallel``): "_orig_mod.blocks.0._checkpoint_wrapped_module.fc.weight"
    -> "blocks.0.fc.weight".

    Source: Motif Muon (drops ``_orig_mod`` of torch.compile and ``_checkpoint_wrapped_module``
    of activation checkpointing); FSDP1's ``_fsdp_wrapped_module`` and DataParallel / DDP's
    ``module`` prefix likewise.
    Raises: TypeError naming ``name`` for a name that is not a str.
    """
    if not isinstance(name, str):
        raise TypeError(f"name: expected a parameter name (str), got {type(name).__name__}")
    parts = [c for c in name.split(".") if c not in WRAPPER_NAME_COMPONENTS]
    if data_parallel and parts and parts[0] == "module":
        parts = parts[1:]
    return ".".join(parts)


def _is_embedding_name(name: str) -> bool:
    return any(c in EMBEDDING_NAMES for c in name.split(".")[:-1])


def _is_head_name(name: str) -> bool:
    modules = name.split(".")[:-1]
    return any(c in HEAD_NAMES for c in modules) or (bool(modules) and modules[0] in TOP_LEVEL_HEAD_NAMES)


def _category(p: torch.Tensor, names: list[str], embedding_ids: set, expert_keys: Sequence[str]) -> str:
    """"embedding", "head" (output-head matrices), "matrix" or "scalar" for one parameter
    with all its (normalized) names — a weight tied to the embedding is an embedding."""
    if id(p) in embedding_ids or any(_is_embedding_name(n) for n in names):
        return "embedding"
    if p.ndim >= 2 and any(_is_head_name(n) for n in names):
        return "head"
    expert = bool(expert_keys) and any(is_expert_name(n, expert_keys) for n in names)
    return "matrix" if p.ndim - int(expert) >= 2 else "scalar"


def _match(override: Override, p: torch.Tensor, name: str, normalized: str) -> bool:
    key = override[0]
    if isinstance(key, str):
        return fnmatch.fnmatchcase(normalized, key) or fnmatch.fnmatchcase(name, key)
    return bool(key(p, name))


def _resolve(value, fallback):
    return fallback if value is None else value


def param_groups(
    model: nn.Module,
    *,
    algorithm: str = "muon",
    scalar_algorithm: str = "adamw",
    lr: float | None = None,
    scalar_lr: float | None = None,
    weight_decay: float | None = None,
    scalar_weight_decay: float | None = None,
    embedding_weight_decay: float | None = None,
    lm_head_lr_scale: str | None = DEFAULT,
    d_model: int | None = None,
    expert_keys: Sequence[str] = (),
    overrides: Sequence[Override] = (),
    matrix_options: Mapping[str, Any] | None = None,
    scalar_options: Mapping[str, Any] | None = None,
) -> list[dict]:
    """Assign ``model``'s trainable parameters to ``HybridOptimizer`` groups.

    Per parameter (names normalized by ``normalize_name``; the first rule that applies):

    1. ``overrides``: (glob, options) or (predicate(param, name) -> bool, options) pairs, in the spirit
       of Megatron's ParamKey; the first match wins. A glob is matched (``fnmatch``, case-sensitive)
       against the normalized and the original name. The options go on top of the options of the
       parameter's own category — or, if they set ``algorithm`` to the other family, of that family's
       category ("matrix" or "scalar"); an ``algorithm`` other than the category's keeps only its lr and
       weight_decay.
    2. "embedding": a parameter of an ``nn.Embedding`` / ``nn.EmbeddingBag``, or with a name component in
       ``EMBEDDING_NAMES`` (a weight tied to the embedding, such as nanoGPT's ``lm_head.weight``, is one)
       -> ``scalar_algorithm``, ``scalar_lr``, ``embedding_weight_decay`` (OLMo-core: 0).
    3. "head": an output-head weight with ≥ 2 dims (``HEAD_NAMES``, ``TOP_LEVEL_HEAD_NAMES``) ->
       ``scalar_algorithm`` at ``scalar_lr``/√d_model when ``lm_head_lr_scale`` is "inv_sqrt_d_model"
       (OLMo-core's DionConfig), ``scalar_lr`` when None. Head biases and norms are "scalar".
    4. "matrix": ≥ 2 dims, counting one dim less for names matching ``expert_keys`` (Motif): 2-D
       weights, fused QKV, 3-D experts, 4-D conv -> ``algorithm`` (Muon: experts via its ``expert_keys``,
       ≥ 4-D conv flattened; Dion: ≥ 4-D conv with ``flatten=True``, experts rejected), ``lr``,
       ``weight_decay``. A 3-D parameter that matches no expert key (a conv1d weight, or an expert stack
       whose key is missing) is rejected by Muon and Dion when the optimizer is built: give
       ``expert_keys``, or an override with ``{"flatten": True}`` for conv1d.
    5. "scalar": everything else (norms, biases, gains, expert biases) -> ``scalar_algorithm``,
       ``scalar_lr``, ``scalar_weight_decay``.

    Options left None come from ``HYBRID_DEFAULTS[algorithm]``, the table ``MuonConfig`` / ``DionConfig``
    take theirs from (docs/compatibility.md, "Whole-model defaults"): the same model gets the same groups
    from ``param_groups`` + ``HybridOptimizer`` as from ``MuonConfig(...).build`` / ``DionConfig(...).build``
    with the same arguments. Parameters with ``requires_grad=False`` are left out.

    Parameters
    ----------
    model : torch.nn.Module
        The model; its ``named_parameters()`` are assigned.
    algorithm : {"muon", "dion", "dion2"}, default "muon"
        The algorithm of the matrices.
    scalar_algorithm : {"adamw", "lion"}, default "adamw"
        The algorithm of embeddings, the output head and the scalar parameters.
    lr, scalar_lr : float, optional
        The matrices' lr (None: the table's); the others' (None: ``lr``, one lr for every group, as
        microsoft/dion and OLMo-core).
    weight_decay, scalar_weight_decay, embedding_weight_decay : float, optional
        Decoupled weight decay of each category; None: the table's (scalar: ``weight_decay`` where the
        table has none).
    lm_head_lr_scale : {"inv_sqrt_d_model", None}, optional
        The output head's lr scale; not given: the table's.
    d_model : int, optional
        The model width of the head's lr scale; None: the head weight's fan_in (shape[-1], as OLMo-core).
    expert_keys : sequence of str, default ()
        Name patterns of (experts, m, n) stacks.
    overrides : sequence of (str or callable, dict), default ()
        Per-parameter options (rule 1).
    matrix_options, scalar_options : dict, optional
        Further options of every matrix / scalar group, on top of the table's (Dion's ``qr_method``;
        ``{"dtype": torch.float16, "gram": True}`` for float16 Gram Newton–Schulz; AdamW / Lion betas).

    Returns
    -------
    list of dict
        Groups ``{"params", "param_names" (original names), "algorithm", options...}``, one per distinct
        (algorithm, options), in order of first appearance.

    Raises
    ------
    ValueError
        An unknown algorithm (here or in an override) or ``lm_head_lr_scale``, a ``d_model`` that is not a
        positive int, no trainable parameter, heads of different fan_in without ``d_model``, expert weights
        with Dion.
    TypeError
        An override that is not a (glob or predicate, dict) pair.

    References
    ----------
    allenai/OLMo-core ``DionConfig.default_group_overrides``; Motif's Muon (name normalization,
    ``expert_keys``); Megatron-LM ParamKey (overrides); microsoft/dion (``algorithm`` groups).

    Examples
    --------
    >>> import torch, ortho_fast
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    >>> [(group["algorithm"], group["param_names"]) for group in ortho_fast.param_groups(model)]
    [('muon', ['0.weight', '2.weight']), ('adamw', ['0.bias', '1.weight', '1.bias', '2.bias'])]
    """
    if algorithm not in MATRIX_ALGORITHMS:
        raise ValueError(f"algorithm: expected one of {MATRIX_ALGORITHMS}, got {algorithm!r}")
    if scalar_algorithm not in SCALAR_ALGORITHMS:
        raise ValueError(f"scalar_algorithm: expected one of {SCALAR_ALGORITHMS}, got {scalar_algorithm!r}")
    defaults = HYBRID_DEFAULTS[algorithm]
    if lm_head_lr_scale is DEFAULT:
        lm_head_lr_scale = defaults["lm_head_lr_scale"]
    if lm_head_lr_scale not in ("inv_sqrt_d_model", None):
        raise ValueError(f"lm_head_lr_scale: expected 'inv_sqrt_d_model' or None, got {lm_head_lr_scale!r}")
    if d_model is not None and (isinstance(d_model, bool) or not isinstance(d_model, int) or d_model < 1):
        raise ValueError(f"d_model: expected a positive int or None, got {d_model!r}")
    for o in overrides:
        if not (isinstance(o, tuple) and len(o) == 2 and (isinstance(o[0], str) or callable(o[0]))
                and isinstance(o[1], Mapping)):
            raise TypeError(f"overrides: expected (glob or predicate(param, name), dict of options) pairs, got {o!r}")
        if o[1].get("algorithm", "muon") not in ALGORITHMS:
            raise ValueError(f"overrides: algorithm {o[1]['algorithm']!r} of {o[0]!r}; expected one of "
                             f"{sorted(ALGORITHMS)}")
    data_parallel = isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel))
    expert_keys = (expert_keys,) if isinstance(expert_keys, str) else tuple(expert_keys)

    names: dict[int, list[str]] = {}
    params: dict[int, torch.Tensor] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if p.requires_grad:
            params.setdefault(id(p), p)
            names.setdefault(id(p), []).append(name)
    if not params:
        raise ValueError("model: has no trainable parameters")
    embedding_ids = {id(p) for m in model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))
                     for p in m.parameters(recurse=False)}
    normalized = {k: [normalize_name(n, data_parallel=data_parallel) for n in v] for k, v in names.items()}
    category = {k: _category(params[k], normalized[k], embedding_ids, expert_keys) for k in params}

    lr = _resolve(lr, defaults["lr"])
    weight_decay = _resolve(weight_decay, defaults["weight_decay"])
    scalar_lr = _resolve(scalar_lr, lr)
    scalar_weight_decay = _resolve(scalar_weight_decay, _resolve(defaults["scalar_weight_decay"], weight_decay))
    embedding_weight_decay = _resolve(embedding_weight_decay, defaults["embedding_weight_decay"])
    heads = {params[k].shape[-1] for k in params if category[k] == "head"}
    if lm_head_lr_scale and heads and d_model is None and len(heads) > 1:
        raise ValueError(f"d_model: output heads of different fan_in {sorted(heads)}; pass d_model")
    head_lr = scalar_lr / math.sqrt(d_model or next(iter(heads))) if lm_head_lr_scale and heads else scalar_lr
    scalar = dict(defaults["scalar_options"][scalar_algorithm], **(scalar_options or {}), algorithm=scalar_algorithm,
                  lr=scalar_lr, weight_decay=scalar_weight_decay)
    base = {
        "matrix": dict(defaults["matrix_options"], **(matrix_options or {}), algorithm=algorithm, lr=lr,
                       weight_decay=weight_decay),
        "scalar": scalar,
        "embedding": dict(scalar, weight_decay=embedding_weight_decay),
        "head": dict(scalar, lr=head_lr),
    }

    groups: dict[str, dict] = {}
    for k, p in params.items():
        name, norm = names[k][0], normalized[k][0]
        cat = category[k]
        extra: Mapping[str, Any] = next((o[1] for o in overrides if _match(o, p, name, norm)), {})
        chosen = extra.get("algorithm")
        if chosen in MATRIX_ALGORITHMS and cat != "matrix":
            cat = "matrix"
        elif chosen in SCALAR_ALGORITHMS and cat == "matrix":
            cat = "scalar"
        options = dict(base[cat])
        if chosen is not None and chosen != options["algorithm"]:  # keep lr / weight_decay only
            options = {"lr": options["lr"], "weight_decay": options["weight_decay"]}
        options.update(extra)
        if options["algorithm"] == "muon" and expert_keys:
            options.setdefault("expert_keys", expert_keys)
        if options["algorithm"] == "dion" and p.ndim > 2:
            if expert_keys and any(is_expert_name(n, expert_keys) for n in normalized[k]):
                raise ValueError(f"expert_keys: {name!r} is an expert weight of shape {tuple(p.shape)}; Dion here "
                                 "has no per-expert batching: use algorithm='muon' or route it with overrides")
            if p.ndim > 3:  # conv2d / conv3d; 3-D is ambiguous (conv1d or an unnamed expert stack)
                options.setdefault("flatten", True)
        key = repr(sorted(options.items(), key=lambda kv: kv[0]))
        group = groups.setdefault(key, {"params": [], "param_names": [], **options})
        group["params"].append(p)
        group["param_names"].append(name)
    return list(groups.values())
