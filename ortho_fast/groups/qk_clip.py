"""QK-clip (MuonClip) in the optimizer: group options, parameter roles, the logits hook, the step.

A Muon param group turns QK-clip on with ``qk_clip_threshold`` τ (None: off) and names the
attention shape (``qk_clip_num_heads``, ``qk_clip_num_kv_heads``, ``qk_clip_layout`` for fused
weights). Which parameter is the query, key or fused QKV projection of which attention layer
comes from the parameter names (Motif's rule, extended to the common module names:
``ROLE_NAMES``; the layer is the last integer component of the name, as Motif's ``qk_logits``
index, else the attention module's path) or from the group keys ``qk_clip_roles`` /
``qk_clip_layer``. The model reports each layer's per-head maximum attention logits for the
step, either through ``step(qk_logits={layer: logits})`` (Motif's ``Muon.step`` argument) or
``record_max_logits(layer, logits)`` (any number of calls before the step, e.g. one per
micro-batch: the element-wise maximum is kept). After the update of that step every layer with
logits is clipped (``ortho_fast.functional.qk_clip.qk_clip_``); a layer without logits this
step is left alone (as Motif). Every check runs before the step changes anything.
Source: Kimi K2 (arXiv 2507.20534), Algorithm 1; Motif ``optimizer.muon`` (``qk_logits``,
``parse_qk_layer``); docs/math.md, "QK-clip (MuonClip)".
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Hashable, Mapping

import torch

from ..functional import qk_clip as qk_math
from ..functional.qk_clip import QK_CLIP_LAYOUTS, QK_CLIP_ROLES
from ..validation import FiniteCheck, is_dtensor, local_tensor

__all__ = ["QK_CLIP_DEFAULTS", "ROLE_NAMES", "QKClipRunner", "QKClipTarget", "check_qk_clip_group",
           "fill_qk_clip_keys", "qk_clip_plan", "role_of_name", "take_qk_clip_options"]

#: The param-group keys of QK-clip with their defaults (off: ``qk_clip_threshold`` None).
QK_CLIP_DEFAULTS: dict[str, object] = {
    "qk_clip_threshold": None,  # τ > 0 turns QK-clip on (Kimi K2 uses 100)
    "qk_clip_alpha": 0.5,  # α: query rows × γ^α, key rows × γ^(1−α)
    "qk_clip_num_heads": None,  # query heads of each attention layer of the group
    "qk_clip_num_kv_heads": None,  # key / value heads (GQA); None: qk_clip_num_heads
    "qk_clip_layout": "concatenated",  # row order of fused QKV weights (QK_CLIP_LAYOUTS)
    "qk_clip_roles": None,  # None: from names (ROLE_NAMES); else one role (or None) per parameter, or {name: role}
    "qk_clip_layer": None,  # None: from names; else the layer key of every role in the group
}

#: Module names (the name component before ``weight``) read as each role: Motif (wq, wk, q_proj,
#: k_proj), Hugging Face (q_proj, k_proj, qkv_proj, Wqkv), nanochat (c_q, c_k), Megatron-LM
#: (linear_qkv, linear_q_proj). A fused GPT-2 ``c_attn`` is not listed: Hugging Face stores it
#: transposed (Conv1D); name it with ``qk_clip_roles`` when it is an ``nn.Linear``.
ROLE_NAMES: dict[str, str] = {
    **dict.fromkeys(("wq", "q_proj", "c_q", "query", "linear_q_proj"), "query"),
    **dict.fromkeys(("wk", "k_proj", "c_k", "key", "linear_k_proj"), "key"),
    **dict.fromkeys(("wqkv", "qkv_proj", "Wqkv", "qkv", "linear_qkv", "query_key_value"), "qkv"),
}


def take_qk_clip_options(keywords: dict) -> dict:
    """Remove the QK-clip keys from a constructor's keyword dict; return them filled with
    ``QK_CLIP_DEFAULTS`` (the optimizer's defaults for every group)."""
    return {k: keywords.pop(k) if k in keywords else v for k, v in QK_CLIP_DEFAULTS.items()}


def fill_qk_clip_keys(saved: dict, current: dict) -> dict:
    """A saved param group (``load_state_dict``) gets the QK-clip keys it lacks from the current
    group (a checkpoint of torch.optim.Muon or of an older version has none); returns ``saved``."""
    for key in QK_CLIP_DEFAULTS:
        saved.setdefault(key, current.get(key, QK_CLIP_DEFAULTS[key]))
    return saved


def role_of_name(name: str) -> tuple[str | None, Hashable | None]:
    """(role, layer) of a parameter name: the role from the module name before ``weight``
    (``ROLE_NAMES``), the layer the last all-digit component as an int (Motif's
    ``parse_qk_layer``: "model.3.attn.wq.weight" -> ("query", 3)), else the attention module's
    path ("attn.c_q.weight" -> ("query", "attn")). (None, None) for any other name."""
    parts = [p for p in name.split(".") if p not in ("_orig_mod", "_checkpoint_wrapped_module")]
    if len(parts) < 2 or parts[-1] != "weight" or parts[-2] not in ROLE_NAMES:
        return None, None
    digits = [int(p) for p in parts if p.isdigit()]
    return ROLE_NAMES[parts[-2]], digits[-1] if digits else ".".join(parts[:-2])


def _count(value, key: str, allow_none: bool = False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key}: expected a positive integer, got {value!r}")
    return value


def _check_options(group: dict) -> bool:
    """Validate the group's QK-clip options; True if QK-clip is on for the group."""
    tau = group.get("qk_clip_threshold")
    if tau is None:
        return False
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"qk_clip_threshold: expected None or a finite number > 0, got {tau!r}")
    alpha = group.get("qk_clip_alpha", 0.5)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"qk_clip_alpha: expected a number in [0, 1], got {alpha!r}")
    heads = _count(group.get("qk_clip_num_heads"), "qk_clip_num_heads")
    kv = _count(group.get("qk_clip_num_kv_heads"), "qk_clip_num_kv_heads", allow_none=True)
    if kv is not None and heads % kv:
        raise ValueError(f"qk_clip_num_kv_heads: {kv} key heads must divide qk_clip_num_heads {heads}")
    if group.get("qk_clip_layout", "concatenated") not in QK_CLIP_LAYOUTS:
        raise ValueError(f"qk_clip_layout: expected one of {QK_CLIP_LAYOUTS}, got {group.get('qk_clip_layout')!r}")
    return True


@dataclass(frozen=True)
class QKClipTarget:
    """One parameter QK-clip rescales: its layer key, role, head counts, α, τ and fused layout."""

    param: torch.Tensor
    name: str
    layer: Hashable
    role: str
    num_heads: int
    num_kv_heads: int
    alpha: float
    threshold: float
    layout: str


def _roles(group: dict) -> list[tuple[str | None, Hashable | None]]:
    params, names = group["params"], group.get("param_names") or [None] * len(group["params"])
    given = group.get("qk_clip_roles")
    if given is None:
        out = [role_of_name(n) if n else (None, None) for n in names]
    elif isinstance(given, Mapping):
        unknown = sorted(set(given) - {n for n in names if n})
        if unknown:
            raise ValueError(f"qk_clip_roles: names {unknown} are not parameters of the group (named: "
                             f"{[n for n in names if n]})")
        out = [((given.get(n), role_of_name(n)[1] or n.rsplit(".", 2)[0]) if n in given else (None, None))
               for n in names]
    elif isinstance(given, (list, tuple)) and len(given) == len(params):
        out = [(r, None) for r in given]
    else:
        raise ValueError(f"qk_clip_roles: expected None, a {{name: role}} dict or one role per parameter "
                         f"({len(params)}), got {given!r}")
    layer = group.get("qk_clip_layer")
    out = [(r, layer if layer is not None else lay) for r, lay in out]
    for r, lay in out:
        if r is not None and r not in QK_CLIP_ROLES:
            raise ValueError(f"qk_clip_roles: expected roles in {QK_CLIP_ROLES} (or None), got {r!r}")
        if r is not None and lay is None:
            raise ValueError("qk_clip_layer: parameters given roles by position need a layer key (set "
                             "qk_clip_layer for the group, one attention layer per group)")
    return out


def check_qk_clip_group(group: dict) -> list[QKClipTarget]:
    """Validate one group's QK-clip options and roles (at construction, ``add_param_group``,
    ``load_state_dict`` and each step); return its targets ([] when off). Changes nothing.

    Per target: a 2-D parameter (plain, or a DTensor: its global shape) whose rows are whole
    heads (query: num_heads, key: num_kv_heads, qkv: num_heads + 2·num_kv_heads blocks of equal size).
    Raises: ValueError naming the key (``qk_clip_threshold`` not None and not finite > 0,
    ``qk_clip_alpha`` outside [0, 1], head counts, layout, roles) or the parameter.
    """
    if not _check_options(group):
        return []
    h = group["qk_clip_num_heads"]
    kv = group.get("qk_clip_num_kv_heads") or h
    names = group.get("param_names") or [None] * len(group["params"])
    targets = []
    for i, (p, (role, layer)) in enumerate(zip(group["params"], _roles(group))):
        if role is None:
            continue
        label = repr(names[i]) if names[i] else f"parameter {i} (shape {tuple(p.shape)})"
        blocks = {"query": h, "key": kv, "qkv": h + 2 * kv}[role]
        if p.dim() != 2 or p.shape[0] % blocks:
            raise ValueError(f"qk_clip_num_heads: {label} ({role}) of shape {tuple(p.shape)} is not {blocks} "
                             "head blocks of rows (qk_clip_num_heads / qk_clip_num_kv_heads)")
        targets.append(QKClipTarget(p, label, layer, role, h, kv, float(group.get("qk_clip_alpha", 0.5)),
                                    float(group["qk_clip_threshold"]), group.get("qk_clip_layout", "concatenated")))
    return targets


def qk_clip_plan(groups) -> dict[Hashable, list[QKClipTarget]]:
    """Every group's targets by layer key; each layer has one "qkv" target or one "query" and
    one "key" target of equal head size, and one set of head counts.
    Raises: ValueError naming the layer for a layer with a query but no key (or the reverse),
    two parameters of the same role, or query / key head sizes that differ."""
    plan: dict[Hashable, list[QKClipTarget]] = {}
    for group in groups:
        for t in check_qk_clip_group(group):
            plan.setdefault(t.layer, []).append(t)
    for layer, targets in plan.items():
        roles = sorted(t.role for t in targets)
        if roles not in (["qkv"], ["key", "query"]):
            raise ValueError(f"qk_clip_roles: layer {layer!r} has roles {roles}; expected one fused 'qkv' weight "
                             f"or one 'query' and one 'key' weight ({[t.name for t in targets]})")
        if len({(t.num_heads, t.num_kv_heads) for t in targets}) > 1:
            raise ValueError(f"qk_clip_num_heads: the weights of layer {layer!r} have different head counts")
        if roles == ["key", "query"]:
            q, k = sorted(targets, key=lambda t: t.role != "query")
            if (q.param.shape[0] // q.num_heads != k.param.shape[0] // k.num_kv_heads
                    or q.param.shape[1] != k.param.shape[1]):
                raise ValueError(f"qk_clip_num_heads: query {q.name} {tuple(q.param.shape)} and key {k.name} "
                                 f"{tuple(k.param.shape)} of layer {layer!r} do not have the same head size / columns")
    return plan


class QKClipRunner:
    """The QK-clip of one optimizer: the logits recorded for the next step, and ``around_step``.

    ``local_rows``: for a distributed optimizer, a function DTensor parameter -> int64 tensor of
    the global rows its local block holds (``ortho_fast.distributed.layout.matrix_layout(...).rows``;
    cached per parameter); each rank then clips its own rows (``qk_clip_rows_``), equal to one
    process bit for bit. Without it a DTensor target raises ValueError. ``agree``: called with the
    first local error (or None) and the parameters' device before the step when QK-clip is on, to
    raise on every rank together (``ortho_fast.distributed.comm.raise_together``). DTensor logits are read whole
    (``full_tensor``).

    ``record(layer, logits)`` keeps the element-wise maximum per layer until the next step
    (no host sync). ``around_step(groups, qk_logits, check_finite)`` is a context manager: on
    entry it checks everything (options, roles, the layers and shapes of the logits, and — with
    ``check_finite`` — their finiteness in one host read), on a normal exit of the optimizer
    step it clips every layer with logits and forgets them; ``last_factors`` keeps each
    layer's γ per key group of the last step (device tensors, for logging). Nothing of it is
    in the optimizer's ``state_dict``: like Motif's per-step ``qk_clip_state``, the logits
    belong to one step (record them after loading a checkpoint, before ``step``).
    """

    def __init__(self, local_rows=None, agree=None) -> None:
        self.pending: dict[Hashable, torch.Tensor] = {}
        self.last_factors: dict[Hashable, torch.Tensor] = {}
        self.local_rows, self.agree = local_rows, agree
        self.rows_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __getstate__(self) -> dict:  # a copied optimizer computes its own row sets
        return {**self.__dict__, "rows_cache": {}}

    def rows_of(self, p: torch.Tensor) -> torch.Tensor:
        """Global rows of a DTensor parameter's local block (``local_rows``, cached per parameter).
        Raises: ValueError when the optimizer has no ``local_rows`` (not distributed)."""
        if self.local_rows is None:
            raise ValueError("qk_clip_threshold: a sharded (DTensor) attention weight needs a distributed optimizer "
                             "(distributed_mesh / tp_mesh) to clip its local rows")
        hit = self.rows_cache.get(id(p))
        if hit is None or hit[0] is not p:
            hit = (p, self.local_rows(p))
            self.rows_cache[id(p)] = hit
        return hit[1]

    def record(self, layer: Hashable, max_logits: torch.Tensor) -> None:
        """Keep ``max_logits`` (a (num_heads,) real tensor, detached) for ``layer`` at the next step.
        Raises: TypeError naming ``max_logits`` for anything else (checked further at the step)."""
        if (not isinstance(max_logits, torch.Tensor) or max_logits.dim() != 1 or max_logits.dtype.is_complex
                or max_logits.dtype == torch.bool):
            raise TypeError(f"max_logits: expected a 1-D real tensor (one maximum logit per query head) for layer "
                            f"{layer!r}, got {max_logits!r}")
        logits = max_logits.detach()
        logits = logits.full_tensor() if is_dtensor(logits) else logits
        old = self.pending.get(layer)
        if old is not None and old.shape != logits.shape:
            raise ValueError(f"max_logits: layer {layer!r} was recorded with {old.shape[0]} heads, now "
                             f"{logits.shape[0]}")
        self.pending[layer] = logits.clone() if old is None else torch.maximum(old, logits.to(old.device, old.dtype))

    def _logits(self, plan, qk_logits, check_finite: bool) -> dict:
        """Every layer's logits for this step (recorded and given, element-wise maximum), checked:
        known layer, (num_heads,) real, finite (one host read, with ``check_finite``)."""
        sources = list(self.pending.items())
        if qk_logits is not None:
            if not isinstance(qk_logits, Mapping):
                raise TypeError(f"qk_logits: expected a mapping {{layer: (num_heads,) tensor}}, got "
                                f"{type(qk_logits).__name__}")
            sources += [(layer, value.full_tensor() if is_dtensor(value) else torch.as_tensor(value))
                        for layer, value in qk_logits.items()]
        finite = FiniteCheck()
        given: dict = {}
        for layer, value in sources:
            if layer not in plan:
                raise ValueError(f"qk_logits: layer {layer!r} has no query / key weights with QK-clip on; "
                                 f"known layers: {sorted(plan, key=repr)}")
            h = plan[layer][0].num_heads
            if tuple(value.shape) != (h,) or value.dtype.is_complex or value.dtype == torch.bool:
                raise ValueError(f"qk_logits: layer {layer!r} expects {h} real maximum logits (one per query "
                                 f"head), got shape {tuple(value.shape)} dtype {value.dtype}")
            if check_finite:
                finite.add(value, f"qk_logits of layer {layer!r}")
            old = given.get(layer)
            given[layer] = value if old is None else torch.maximum(old, value.to(old.device, old.dtype))
        error = finite.error() if check_finite else None
        if error is not None:
            raise error
        return given

    @contextmanager
    def around_step(self, groups, qk_logits=None, check_finite: bool = True):
        """Check, run the optimizer step (the ``with`` body), then clip (see the class docstring)."""
        plan = qk_clip_plan(groups)
        given, error = {}, None
        if plan:  # QK-clip off: logits are only logged
            try:
                given = self._logits(plan, qk_logits, check_finite)
                for t in (t for targets in plan.values() for t in targets if is_dtensor(t.param)):
                    self.rows_of(t.param)
            except (ValueError, TypeError) as err:
                error = err
            if self.agree is not None:
                device = next(iter(plan.values()))[0].param.device
                self.agree(error, device)  # raises on every rank if any rank found an error
            elif error is not None:
                raise error
        yield
        factors = {}
        for layer, logits in given.items():
            for t in plan[layer]:
                kw = dict(threshold=t.threshold, role=t.role, num_heads=t.num_heads, num_kv_heads=t.num_kv_heads,
                          alpha=t.alpha, layout=t.layout)
                if is_dtensor(t.param):
                    local = local_tensor(t.param.data)
                    qk_math.qk_clip_rows_(local, self.rows_of(t.param), t.param.shape[0],
                                          logits, **kw)
                else:
                    qk_math.qk_clip_(t.param.data if isinstance(t.param, torch.nn.Parameter) else t.param, logits, **kw)
            t = plan[layer][0]
            factors[layer] = qk_math.qk_clip_factors(logits, t.threshold, t.num_kv_heads)
        self.last_factors = factors
        self.pending.clear()
