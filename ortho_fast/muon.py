"""Muon for one process: momentum, Newton–Schulz orthogonalization, scaled update.

Pure functions on tensors first (``adjusted_lr_scale``, ``muon_momentum``, ``muon_layout``),
then the param-group contract a hybrid optimizer drives (``MUON_DEFAULTS``,
``default_eps_mode``, ``normalize_muon_group``, ``check_muon_step``, ``muon_group_step``), then the ``Muon`` class,
which only owns state and grouping.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import torch
from torch.optim import Optimizer

from ._state import add_param_group_checked, load_state_dict_checked, state_dict_with_dtype_names
from ._validate import check_choice, check_count, check_filled, check_finite, check_hyper
from .coefficients import CoefficientsLike, resolve_coefficients, schedule_of
from .newton_schulz import EPS_MODES, newton_schulz, resolve_compute_dtype

MOMENTUM_STYLES = ("ema", "classic")
#: lr adjustment modes; the last three are Megatron / Emerging-Optimizers ``scale_mode`` names.
ADJUST_LR_MODES = ("original", "match_rms_adamw", "spectral_norm", None, "shape_scaling", "spectral", "unit_rms_norm")
#: Name components dropped before ``expert_keys`` matching (torch.compile, activation checkpointing; as Motif).
DROPPED_NAME_COMPONENTS = ("_orig_mod", "_checkpoint_wrapped_module")

#: Every Muon param-group key with its default (torch.optim.Muon's defaults where torch has the option).
MUON_DEFAULTS: dict[str, object] = {
    "lr": 1e-3,
    "weight_decay": 0.1,
    "momentum": 0.95,
    "nesterov": True,
    "momentum_style": "ema",
    "coefficients": "jordan",
    "ns_steps": None,  # None: the schedule's default (5 for jordan)
    "safety": None,  # None: the named schedule's (1.0 jordan, 1.02 polar_express), else 1.0
    "eps": None,  # None: the named schedule's (1e-7 jordan, 1e-6 polar_express), else 1e-7
    "eps_mode": None,  # None: "clamp" for the named schedule "jordan" (torch.optim.Muon), else "add"
    "adjust_lr": "original",
    "extra_scale_factor": 1.0,
    "cautious_weight_decay": False,
    "dtype": torch.bfloat16,
    "banks": False,
    "expert_keys": (),
    "split_sizes": None,
    "split_groups": 1,
    "num_heads": None,
    "flatten": None,  # None: >= 4-D flattened, 3-D rejected unless expert; True / False: microsoft/dion's flatten
}


def adjusted_lr_scale(adjust_lr: str | None, m: int, n: int) -> float:
    """lr multiplier for an (m, n) = (fan_out, fan_in) matrix.

    "original" = "shape_scaling" √max(1, m/n) (Keller Jordan, torch.optim.Muon, nanochat;
    Megatron "shape_scaling"); "match_rms_adamw" 0.2·√max(m, n) (Moonlight, arXiv 2502.16982);
    "spectral_norm" = "unit_rms_norm" √(m/n) (microsoft/dion; Megatron "unit_rms_norm");
    "spectral" √max(m, n) (Megatron's default — not dion's "spectral_norm"); None: 1
    (torch.optim.Muon's ``adjust_lr_fn=None`` means "original", not this).
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


def muon_momentum(grad: torch.Tensor, buf: torch.Tensor, *, mu: float, nesterov: bool, style: str) -> torch.Tensor:
    """Update the momentum buffer in place and return the matrix to orthogonalize.

    "ema": M ← M + (1−μ)(G − M) (``lerp``), U = G + μ(M − G) if nesterov else M
    (torch.optim.Muon, Keller Jordan, nanochat). "classic": M ← μM + G, U = G + μM if
    nesterov else M (microsoft/dion, Moonlight).
    Shapes: grad, buf (...) of the parameter's shape, same dtype -> (...); computed in that dtype.
    Source: torch.optim.Muon ``_single_tensor_muon`` (``lerp_``, nesterov ``lerp``); Keller
    Jordan's ``muon_update``; microsoft/dion ``muon_update_pre_orthogonalize`` (classic).
    Raises: ValueError naming ``style`` for a style not in ``MOMENTUM_STYLES``, before ``buf``
    changes. Shapes and dtypes are not checked here (``check_muon_step`` does it).
    """
    check_choice(style, "style", MOMENTUM_STYLES)
    if style == "ema":
        buf.lerp_(grad, 1 - mu)
        return grad.lerp(buf, mu) if nesterov else buf
    buf.mul_(mu).add_(grad)
    return grad.add(buf, alpha=mu) if nesterov else buf


# ---------------------------------------------------------------------------------------
# How a parameter is cut into matrices
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MuonLayout:
    """The matrices Muon orthogonalizes for one parameter, as views of a param-shaped tensor.

    The parameter is read as (*batch, m, n): experts (batch = (E,)) are (shape[1],
    prod(shape[2:])) each; other parameters are (shape[0], prod(shape[1:])) (conv weights
    flattened as Keller Jordan's and Moonlight's Muon), or with ``flatten=False`` batches
    (batch = shape[:-2]) of (shape[-2], shape[-1]) matrices. Its m rows are ``groups`` repetitions
    of the row blocks ``blocks`` = ((offset, rows, head_rows), ...): block j of every
    repetition is gathered into one (groups·rows, n) matrix (Megatron's per-query-group fused
    QKV layout when groups > 1), then cut into heads of ``head_rows`` consecutive rows.
    """

    batch: tuple[int, ...]
    m: int
    n: int
    groups: int
    blocks: tuple[tuple[int, int, int], ...]

    def views(self, t: torch.Tensor) -> list[torch.Tensor]:
        """One view (*batch, groups, rows, n) per block of a contiguous param-shaped tensor."""
        base = t.view(*self.batch, self.groups, self.m // self.groups, self.n)
        return [base[..., off:off + rows, :] for off, rows, _ in self.blocks]

    def matrix_shapes(self) -> list[tuple[int, ...]]:
        """Shape of each block's matrices for ``newton_schulz``: (*batch, head_rows, n) for one
        head, (*batch, heads, head_rows, n) for several; heads ordered as the gathered rows."""
        out = []
        for _, rows, head_rows in self.blocks:
            heads = self.groups * rows // head_rows
            out.append((*self.batch, *((heads,) if heads > 1 else ()), head_rows, self.n))
        return out

    def matrices(self, t: torch.Tensor) -> list[torch.Tensor]:
        """The Newton–Schulz inputs of a param-shaped tensor (views where possible)."""
        return [v.reshape(s) for v, s in zip(self.views(t.contiguous()), self.matrix_shapes())]


def muon_layout(
    shape: Sequence[int],
    *,
    expert: bool = False,
    split_sizes: Sequence[int] | None = None,
    split_groups: int = 1,
    num_heads: int | Sequence[int] | None = None,
    flatten: bool | None = None,
    name: str = "parameter",
) -> MuonLayout:
    """Cut a parameter of ``shape`` into the matrices Muon orthogonalizes (see ``MuonLayout``).

    Shapes: 2-D (m, n) as is; expert weights (E, m, n, ...) one matrix per expert,
    (shape[1], prod(shape[2:])), whatever ``flatten``. Other parameters with ≥ 3 dims by
    ``flatten``: None (default) flattens ≥ 4-D (conv2d (out, in, kh, kw), conv3d) to
    (shape[0], prod(shape[1:])) as Keller Jordan's and Moonlight's Muon, and rejects 3-D,
    which is either a conv1d weight (out, in, k) or a stack of expert matrices whose name
    ``expert_keys`` missed — flattening the stack to one (E, m·n) matrix would silently be a
    different update; True flattens every ≥ 3-D parameter (conv1d; microsoft/dion
    ``flatten=True``); False reads it as a batch of (shape[-2], shape[-1]) matrices
    (microsoft/dion's default ``flatten=False``). ``split_sizes`` (s_1, …, s_B) cut the m rows into
    blocks (fused projections, e.g. (q, k, v) rows of a fused QKV weight), repeated
    ``split_groups`` times (Megatron's split_qkv layout: ``split_sizes = (heads_per_group·d,
    d, d)``, ``split_groups = num_query_groups``); ``num_heads`` (one int for every block or
    one per block) cuts each gathered block into that many per-head matrices.
    Source: Keller Jordan's Muon and Moonlight (conv flattening); Megatron-LM
    ``TensorParallelMuon`` split_qkv; microsoft/dion ``flatten``; Motif (experts).
    Raises: ValueError naming the argument for < 2 dims (Muon is for matrices: give vectors
    and scalars to AdamW / Lion) or a zero dim, a 3-D non-expert with ``flatten`` None (the
    message names ``expert_keys`` and ``flatten``), experts with < 3 dims, split sizes that
    are not positive or do not sum to m / split_groups, heads that do not divide a (gathered) block.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) < 2:
        raise ValueError(
            f"params: Muon expects parameters with at least 2 dims (m, n); {name} has shape {shape}. "
            "Give vectors, scalars and embeddings to AdamW/Lion."
        )
    if 0 in shape:
        raise ValueError(f"params: {name} has shape {shape}; Muon needs non-empty matrices")
    if expert and len(shape) < 3:
        raise ValueError(f"expert_keys: {name} matches an expert key but has shape {shape}; expert weights are "
                         "(experts, m, n, ...)")
    if len(shape) == 3 and not expert and flatten is None:
        raise ValueError(
            f"params: {name} has shape {shape}: a 3-D parameter is a stack of expert matrices (E, m, n) — "
            "name it in expert_keys (one matrix per expert; needs named parameters) — or a conv1d weight "
            "(out, in, k) — pass flatten=True for one (out, in·k) matrix (flatten=False: a batch of (m, n) "
            "matrices, microsoft/dion's)"
        )
    batch = shape[:1] if expert else shape[:-2] if flatten is False else ()
    m = shape[len(batch)]
    n = math.prod(shape[len(batch) + 1:])
    groups = check_count(split_groups, "split_groups")
    if split_sizes is None:
        if groups != 1:
            raise ValueError(f"split_groups: {groups} repetitions need split_sizes")
        sizes = (m,)
    else:
        sizes = tuple(check_count(s, "split_sizes") for s in split_sizes) if len(split_sizes) else ()
        if not sizes or groups * sum(sizes) != m:
            dim = len(batch)
            raise ValueError(
                f"split_sizes: {tuple(split_sizes)} × split_groups {groups} = {groups * sum(sizes)} rows, but {name} "
                f"of shape {shape} has {m} rows (dim {dim}); the sizes must sum to dim {dim} / split_groups"
            )
    heads = num_heads if num_heads is not None else 1
    heads = tuple(heads) if isinstance(heads, (tuple, list)) else (heads,) * len(sizes)
    if len(heads) != len(sizes):
        raise ValueError(f"num_heads: expected an integer or one per split block ({len(sizes)}), got {num_heads!r}")
    blocks, offset = [], 0
    for rows, h in zip(sizes, heads):
        h = check_count(h, "num_heads")
        if (groups * rows) % h:
            raise ValueError(f"num_heads: {h} heads do not divide the {groups}×{rows} rows of a block of {name}")
        blocks.append((offset, rows, groups * rows // h))
        offset += rows
    return MuonLayout(batch, m, n, groups, tuple(blocks))


# ---------------------------------------------------------------------------------------
# The param-group contract (driven by Muon.step and by hybrid optimizers)
# ---------------------------------------------------------------------------------------


def is_expert_name(name: str, expert_keys: str | Sequence[str]) -> bool:
    """True if a key equals a dot-separated component (or a run of components) of ``name``,
    after dropping ``DROPPED_NAME_COMPONENTS``: "experts" matches "layers.0.mlp.experts.w1",
    not "layers.0.mlp.shared_experts.w1".

    Args: ``name`` a parameter name as ``named_parameters()`` gives it; ``expert_keys`` one key
    or a sequence of keys (a single str is one key, not its characters).
    Source: Motif Muon (``expert_keys``, names normalized by dropping ``_orig_mod`` and
    ``_checkpoint_wrapped_module``).
    Raises: TypeError naming ``name`` / ``expert_keys`` for a name or key that is not a str.
    """
    if not isinstance(name, str):
        raise TypeError(f"name: expected a parameter name (str), got {type(name).__name__}")
    keys = (expert_keys,) if isinstance(expert_keys, str) else tuple(expert_keys)
    if not all(isinstance(k, str) for k in keys):
        raise TypeError(f"expert_keys: expected strings, got {expert_keys!r}")
    padded = "." + ".".join(c for c in name.split(".") if c not in DROPPED_NAME_COMPONENTS) + "."
    return any(f".{key}." in padded for key in keys)


def _param_name(group: dict, index: int, p: torch.Tensor) -> str:
    names = group.get("param_names")
    return repr(names[index]) if names else f"parameter {index} (shape {tuple(p.shape)})"


def _layout(group: dict, index: int, p: torch.Tensor) -> MuonLayout:
    names = group.get("param_names")
    expert = bool(group["expert_keys"] and names) and is_expert_name(names[index], group["expert_keys"])
    return muon_layout(p.shape, expert=expert, split_sizes=group["split_sizes"], split_groups=group["split_groups"],
                       num_heads=group["num_heads"], flatten=group["flatten"], name=_param_name(group, index, p))


def _check_bool(group: dict, key: str) -> None:
    if not isinstance(group[key], bool):
        raise TypeError(f"{key}: expected a bool, got {group[key]!r}")


def _int_tuple(value, key: str, allow_int: bool):
    """None, an int (if allowed) or a sequence -> None, the int, or a tuple; TypeError otherwise."""
    if value is None or (allow_int and isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        what = "None, an integer or a sequence of integers" if allow_int else "None or a sequence of integers"
        raise TypeError(f"{key}: expected {what}, got {value!r}")
    return tuple(value)


def default_eps_mode(coefficients: CoefficientsLike) -> str:
    """The normalization a Muon group uses when ``eps_mode`` is None.

    "clamp", X₀ = U / max(s‖U‖_F, eps), for the named schedule "jordan": torch.optim.Muon's
    ``_zeropower_via_newtonschulz`` divides by ``norm().clamp(min=eps)``, so the defaults give
    torch's bits. "add", X₀ = U / (s‖U‖_F + eps), for every other schedule and for user tables
    (even Keller Jordan's row given as numbers): Keller Jordan's original
    ``zeropower_via_newtonschulz5`` (X / (‖X‖ + 1e-7)), Moonlight, microsoft/dion and nanochat
    (X / (1.02‖X‖ + 1e-6) with Polar Express). The two differ only where ‖U‖_F is near eps.
    Raises: UnknownScheduleError (KeyError, ValueError) for an unknown schedule name.
    """
    named = schedule_of(coefficients)
    return "clamp" if named is not None and named.name == "jordan" else "add"


def _muon_options(group: dict) -> dict:
    """Validate every option of a Muon group filled with ``MUON_DEFAULTS``, changing nothing;
    return the resolved values of the keys that have a normalized form: ``safety`` / ``eps``
    None -> the named schedule's (else 1.0 / 1e-7), ``eps_mode`` None -> ``default_eps_mode``,
    ``expert_keys`` / ``split_sizes`` / ``num_heads`` as tuples.

    Raises: ValueError / TypeError whose message starts with the offending key;
    UnknownScheduleError (KeyError, ValueError) for an unknown schedule name.
    """
    check_filled(group, MUON_DEFAULTS, "Muon")
    for key, kw in (("lr", {}), ("weight_decay", {}), ("momentum", {"high": 1.0}),
                    ("extra_scale_factor", {"low_open": True})):
        check_hyper(group[key], key, **kw)
    for key in ("nesterov", "cautious_weight_decay", "banks"):
        _check_bool(group, key)
    if not any(group["flatten"] is v for v in (None, True, False)):
        raise TypeError(f"flatten: expected None, True or False, got {group['flatten']!r}")
    check_choice(group["momentum_style"], "momentum_style", MOMENTUM_STYLES)
    check_choice(group["adjust_lr"], "adjust_lr", ADJUST_LR_MODES)
    resolve_compute_dtype(group["dtype"])
    if group["ns_steps"] is not None:
        check_count(group["ns_steps"], "ns_steps")
    coefficients: CoefficientsLike = group["coefficients"]
    resolve_coefficients(coefficients, group["ns_steps"])  # bad table -> ValueError / TypeError
    named = schedule_of(coefficients)
    out = {
        "safety": group["safety"] if group["safety"] is not None else named.safety if named else 1.0,
        "eps": group["eps"] if group["eps"] is not None else named.eps if named else 1e-7,
        "eps_mode": group["eps_mode"] if group["eps_mode"] is not None else default_eps_mode(coefficients),
    }
    check_hyper(out["safety"], "safety", low_open=True)
    check_hyper(out["eps"], "eps")
    check_choice(out["eps_mode"], "eps_mode", EPS_MODES)
    keys = group["expert_keys"]
    keys = (keys,) if isinstance(keys, str) else tuple(keys) if isinstance(keys, (tuple, list)) else None
    if keys is None or not all(isinstance(k, str) and k for k in keys):
        raise TypeError(f"expert_keys: expected a non-empty string or a sequence of them, got {group['expert_keys']!r}")
    out["expert_keys"] = keys
    out["split_sizes"] = _int_tuple(group["split_sizes"], "split_sizes", allow_int=False)
    out["num_heads"] = _int_tuple(group["num_heads"], "num_heads", allow_int=True)
    return out


def normalize_muon_group(group: dict) -> None:
    """Validate one Muon param group (already filled with ``MUON_DEFAULTS``) and store its
    resolved options in place (``_muon_options``: ``safety`` / ``eps`` / ``eps_mode`` None ->
    from the schedule, ``expert_keys`` / ``split_sizes`` / ``num_heads`` to tuples).

    Checks every option, then every parameter (floating dtype, ≥ 2 dims, a 3-D non-expert
    only with ``flatten`` set, experts ≥ 3 dims, split sizes and heads that fit, names
    present when ``expert_keys`` is set).
    Called at construction and by ``add_param_group`` / ``load_state_dict``.
    Raises: ValueError / TypeError whose message starts with the offending key;
    UnknownScheduleError (KeyError and ValueError) for an unknown coefficient schedule name.
    A bad option changes nothing; a bad parameter leaves the options in their resolved form.
    """
    group.update(_muon_options(group))
    if group["expert_keys"] and group["params"] and not group.get("param_names"):
        raise ValueError("expert_keys: matching needs parameter names; pass model.named_parameters() (or "
                         "(name, parameter) pairs) to the optimizer")
    for i, p in enumerate(group["params"]):
        if not p.is_floating_point():
            raise TypeError(f"params: Muon expects floating-point parameters, got dtype {p.dtype} for "
                            f"{_param_name(group, i, p)}")
        _layout(group, i, p)


def check_muon_step(group: dict, state: Mapping[torch.Tensor, dict]) -> None:
    """Check everything one ``muon_group_step`` will read; change nothing.

    Every option of the group (a scheduler or a user may have edited it after construction:
    lr, coefficients, ns_steps, ...), as ``normalize_muon_group`` checks it. Per parameter with
    a gradient: the gradient is dense, real, of the parameter's shape and finite; an existing
    ``momentum_buffer`` is a tensor of the parameter's shape and dtype; the group's split /
    expert / flatten settings still fit the parameter.
    Raises: ValueError / TypeError starting with the option key, or with "grad" /
    "momentum_buffer" naming the parameter; UnknownScheduleError for an unknown schedule name.
    """
    group = {**group, **_muon_options(group)}
    for i, p in enumerate(group["params"]):
        g = p.grad
        if g is None:
            continue
        name = _param_name(group, i, p)
        if g.is_sparse or torch.is_complex(g):
            raise ValueError(f"grad: Muon expects dense real gradients ({name})")
        if g.shape != p.shape:
            raise ValueError(f"grad: expected shape {tuple(p.shape)}, got {tuple(g.shape)} ({name})")
        check_finite(g, f"grad of {name}")
        buf = state[p].get("momentum_buffer") if p in state else None
        if buf is not None and (not isinstance(buf, torch.Tensor) or buf.shape != p.shape or buf.dtype != p.dtype):
            got = (tuple(buf.shape), buf.dtype) if isinstance(buf, torch.Tensor) else type(buf).__name__
            raise ValueError(f"momentum_buffer: expected a tensor of shape {tuple(p.shape)} and dtype {p.dtype}, "
                             f"got {got} ({name})")
        _layout(group, i, p)


def _orthogonalize(mats: list[torch.Tensor], group: dict) -> list[torch.Tensor]:
    """newton_schulz on every matrix batch, returned in the compute dtype (the update adds it
    to the parameter with type promotion, which converts exactly as an explicit cast would,
    without the extra pass). With ``banks``, inputs of the same (rows, cols) and dtype are
    concatenated along the batch and orthogonalized in one call (a lone member keeps its own
    call, so its bits do not depend on ``banks``)."""
    kw = dict(steps=group["ns_steps"], safety=group["safety"], eps=group["eps"], dtype=group["dtype"],
              eps_mode=group["eps_mode"])
    if group["dtype"] is not None:  # None: each input's own dtype, returned as such
        kw["out_dtype"] = resolve_compute_dtype(group["dtype"])[0]
    if not group["banks"]:
        return [newton_schulz(x, group["coefficients"], **kw) for x in mats]
    banks: dict[tuple, list[int]] = defaultdict(list)
    for i, x in enumerate(mats):
        banks[(*x.shape[-2:], x.dtype)].append(i)
    out: list[torch.Tensor] = [None] * len(mats)  # type: ignore[list-item]
    for members in banks.values():
        if len(members) == 1:
            out[members[0]] = newton_schulz(mats[members[0]], group["coefficients"], **kw)
            continue
        flat = [mats[i].reshape(-1, *mats[i].shape[-2:]) for i in members]
        result = newton_schulz(torch.cat(flat), group["coefficients"], **kw)
        for i, part in zip(members, result.split([f.shape[0] for f in flat])):
            out[i] = part.reshape(mats[i].shape)
    return out


def _apply_update(p: torch.Tensor, layout: MuonLayout, outs: list[torch.Tensor], group: dict,
                  shapes: Sequence[tuple[int, ...]] | None = None) -> None:
    """W ← W·(1 − lr·wd) − lr·s_j·O_j per block j (cautious: the decay only where
    sign(O) · sign(W) >= 0), in the parameter's dtype, through views of W; s_j from the block's
    matrix shape, or from ``shapes[j]`` (a shard's update is scaled by the global shape)."""
    lr, wd = float(group["lr"]), float(group["weight_decay"])
    cautious = group["cautious_weight_decay"]
    w = p if p.is_contiguous() else p.contiguous()
    if not cautious:
        w.mul_(1 - lr * wd)
    for view, o, shape in zip(layout.views(w), outs, shapes or layout.matrix_shapes()):
        o = o.reshape(view.shape)
        if cautious:
            decayed = torch.where(o.sign() * view.sign() >= 0, view * (1 - lr * wd), view)
            view.copy_(decayed)
        scale = adjusted_lr_scale(group["adjust_lr"], shape[-2], shape[-1]) * group["extra_scale_factor"]
        view.add_(o, alpha=-lr * scale)
    if w is not p:
        p.copy_(w)


@torch.no_grad()
def muon_group_step(group: dict, state: "defaultdict[torch.Tensor, dict]") -> None:
    """One Muon step for every parameter of ``group`` that has a gradient (``check_muon_step``
    must have passed): momentum, Newton–Schulz per matrix of ``muon_layout`` (banked when
    ``banks``), W ← W·(1 − lr·wd) − lr·s·O with s = adjusted_lr_scale(block shape)·
    extra_scale_factor and the decoupled (or cautious) weight decay on the unscaled lr.

    State: ``state[p]["momentum_buffer"]`` of the parameter's shape and dtype (created as
    zeros), the key of torch.optim.Muon.
    Source: Jordan et al. 2024 (Muon); torch.optim.Muon; microsoft/dion Muon; Chen et al.
    2025 (arXiv 2510.12402, cautious weight decay).
    """
    group = {**group, **_muon_options(group)}  # options as check_muon_step validated them
    items = []
    for i, p in enumerate(group["params"]):
        if p.grad is None:
            continue
        st = state[p]
        if "momentum_buffer" not in st:
            st["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
        u = muon_momentum(p.grad, st["momentum_buffer"], mu=group["momentum"], nesterov=group["nesterov"],
                          style=group["momentum_style"])
        layout = _layout(group, i, p)
        items.append((p, layout, layout.matrices(u)))
    outs = iter(_orthogonalize([x for _, _, mats in items for x in mats], group))
    for p, layout, mats in items:
        _apply_update(p, layout, [next(outs) for _ in mats], group)


# ---------------------------------------------------------------------------------------
# The optimizer
# ---------------------------------------------------------------------------------------


class Muon(Optimizer):
    """Muon (MomentUm Orthogonalized by Newton–Schulz), one process.

    Per matrix W (m, n) of a parameter (``muon_layout``: 2-D as is, ≥ 4-D conv weights
    flattened, experts one matrix each, fused projections split) with gradient G: momentum
    (``momentum_style``, ``nesterov``), O = newton_schulz(U), W ← W·(1 − lr·weight_decay) −
    lr·s·O with s = adjusted_lr_scale(adjust_lr, m, n)·extra_scale_factor.

    Defaults follow ``torch.optim.Muon`` (lr 1e-3, weight_decay 0.1, momentum 0.95, nesterov,
    Keller Jordan's coefficients, 5 steps, eps 1e-7 clamped, bf16 Newton–Schulz, "original"
    lr adjustment): ``Muon(params)`` is bit-identical to ``torch.optim.Muon(params)`` on CPU
    for any list of 2-D parameters (``banks`` is off by default: a batched ``bmm`` differs
    from torch's 2-D ``addmm`` in the last bits). The normalization follows the schedule:
    ``eps_mode`` None is "clamp" (torch's U / max(‖U‖_F, eps)) for "jordan" and "add" (Keller
    Jordan's original U / (s‖U‖_F + eps), as microsoft/dion, Moonlight, nanochat) for every
    other schedule or table (``default_eps_mode``); ``safety`` / ``eps`` None are the named
    schedule's (1.02 / 1e-6 for "polar_express"), else 1 / 1e-7. microsoft/dion's Muon:
    ``momentum_style="classic", nesterov=False, coefficients="polar_express",
    adjust_lr="spectral_norm"`` (its normalization comes from the schedule).
    Megatron: ``momentum_style="ema", nesterov=False, coefficients="cesista5",
    adjust_lr="spectral", dtype="medium"`` plus its split_qkv as ``split_sizes``/``split_groups``.

    Args (each is also a param-group key, see ``MUON_DEFAULTS``): ``coefficients`` registry
    name or per-step rows; ``ns_steps``; ``safety``/``eps``/``eps_mode`` the normalization;
    ``dtype`` the Newton–Schulz compute dtype (``newton_schulz``); ``extra_scale_factor``;
    ``cautious_weight_decay`` decay only where sign(O) = sign(W) (Chen et al. 2025, arXiv
    2510.12402, I(u⊙x ≥ 0)); ``banks`` stack equal-shaped matrices of a group into one
    batched call; ``expert_keys`` names whose parameters are (experts, m, n) stacks (needs
    ``Muon(model.named_parameters())``); ``split_sizes``, ``split_groups``, ``num_heads``
    fused-projection splits (per group: put the QKV weights in their own param group);
    ``flatten`` for ≥ 3-D parameters that are not experts: None flattens ≥ 4-D conv weights
    and rejects 3-D (a conv1d weight or an unnamed expert stack: say which), True flattens
    them (conv1d), False treats them as batches of matrices (microsoft/dion's ``flatten``).
    Distributed (``ortho_fast.distributed.muon``; every rank constructs and steps the optimizer
    with the same parameters in the same order): ``distributed_mesh`` a 1-D DeviceMesh or a
    ProcessGroup (microsoft/dion's Muon argument): DTensor parameters sharded on it are FSDP
    (each matrix gathered to one owner rank, round-robin by parameter index, orthogonalized
    there and scattered back; the momentum stays a DTensor like the parameter), plain tensors and
    parameters replicated on it are DDP (the owner orthogonalizes, every rank receives the
    update by broadcast; gradients must already be averaged). ``tp_mesh`` a 1-D DeviceMesh of
    tensor parallelism (``Shard(0)`` colwise, ``Shard(1)`` rowwise, ``_StridedShard`` under FSDP)
    with ``tp_mode`` (Megatron / Emerging-Optimizers names): "duplicated" (all-gather, every TP
    rank orthogonalizes the whole matrix), "distributed" (Newton–Schulz on the shards, the Gram
    matrix all-reduced each step), "blockwise" (each TP shard orthogonalized alone and scaled
    by its own shape: layout-dependent by design). FSDP + TP: ``distributed_mesh=mesh["dp"],
    tp_mesh=mesh["tp"]``. FSDP, DDP and TP "duplicated" are bitwise the one-process update;
    "distributed" equal to rounding. Sharded parameters take no ``banks``, ``split_sizes`` /
    ``split_groups`` / ``num_heads``, ``expert_keys`` or ``flatten=False`` batches (plain and
    replicated ones take every option).
    State: ``momentum_buffer`` (the parameter's shape and dtype), as torch.optim.Muon, so its
    checkpoints load (missing group keys are taken from the current groups); the loaded state
    owns its tensors (``load_state_dict`` never aliases the given state dict).
    Source: Jordan et al. 2024 (Muon blog); Liu et al. arXiv 2502.16982; torch.optim.Muon.
    Raises: at construction / add_param_group / load_state_dict, ValueError / TypeError /
    UnknownScheduleError from ``normalize_muon_group``; at ``step``, the same for an option
    edited since, and ValueError for a bad gradient or state, from ``check_muon_step`` for
    every group before any parameter or state changes (distributed: on every rank, after one
    all-reduce of an error flag and of which parameters have a gradient, so a bad shard raises
    everywhere instead of hanging its peers; also a gradient or ``momentum_buffer`` not laid out
    as its parameter, and a parameter with a gradient on some ranks only — every rank must step
    the same parameters);
    at construction LayoutError (a ValueError) for a mesh or a parameter layout that cannot be
    used (``ortho_fast.distributed.muon.MuonSharding``), ValueError naming ``tp_mode`` or an option
    a sharded parameter cannot take; RuntimeError if torch.distributed is not initialized.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        *,
        momentum_style: str = "ema",
        coefficients: CoefficientsLike = "jordan",
        ns_steps: int | None = None,
        safety: float | None = None,
        eps: float | None = None,
        eps_mode: str | None = None,
        adjust_lr: str | None = "original",
        extra_scale_factor: float = 1.0,
        cautious_weight_decay: bool = False,
        dtype: torch.dtype | str | None = torch.bfloat16,
        banks: bool = False,
        expert_keys: Sequence[str] = (),
        split_sizes: Sequence[int] | None = None,
        split_groups: int = 1,
        num_heads: int | Sequence[int] | None = None,
        flatten: bool | None = None,
        distributed_mesh=None,
        tp_mesh=None,
        tp_mode: str = "duplicated",
    ) -> None:
        defaults = dict(
            lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov, momentum_style=momentum_style,
            coefficients=coefficients, ns_steps=ns_steps, safety=safety, eps=eps, eps_mode=eps_mode,
            adjust_lr=adjust_lr, extra_scale_factor=extra_scale_factor, cautious_weight_decay=cautious_weight_decay,
            dtype=dtype, banks=banks, expert_keys=expert_keys, split_sizes=split_sizes, split_groups=split_groups,
            num_heads=num_heads, flatten=flatten,
        )
        normalize_muon_group({**defaults, "params": []})  # the defaults themselves, before any group
        from .distributed.muon import MuonSharding

        self._sharding = MuonSharding(distributed_mesh, tp_mesh, tp_mode)
        super().__init__(params, defaults)

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_sharding": self._sharding}

    def add_param_group(self, param_group: dict) -> None:
        """torch's add_param_group, then ``normalize_muon_group`` and the distributed plan of its
        parameters (``MuonSharding.add_group``); a rejected group is not added."""

        def normalize(group: dict) -> None:
            normalize_muon_group(group)
            self._sharding.add_group(group)

        add_param_group_checked(self, param_group, normalize)

    def state_dict(self) -> dict:
        """torch's ``state_dict`` with dtype options as names (``state_dict_with_dtype_names``)."""
        return state_dict_with_dtype_names(self)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load_state_dict through ``load_state_dict_checked``: Muon keys missing from a
        saved group (a torch.optim.Muon checkpoint) are taken from the current group, every
        group is validated first, and the loaded ``momentum_buffer`` tensors are copies."""
        load_state_dict_checked(self, state_dict, lambda i, saved, current: (MUON_DEFAULTS, normalize_muon_group))

    @torch.no_grad()
    def step(self, closure=None):
        """One Muon step for every parameter with a gradient. Returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._sharding.active:
            self._sharding.step(self.param_groups, self.state)
            return loss
        for group in self.param_groups:  # all checks before the first change
            check_muon_step(group, self.state)
        for group in self.param_groups:
            muon_group_step(group, self.state)
        return loss
