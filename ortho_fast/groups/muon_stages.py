"""The Muon pipeline stages of a param group: their options, NorMuon's state, its checks.

A Muon group switches the stages of ``ortho_fast.functional.muon_stages`` on by option
(``STAGE_DEFAULTS``, part of ``MUON_DEFAULTS``): ``row_equilibration`` (MuonEq),
``renormalize`` (Muon+), ``normuon_beta2`` with ``normuon_eps`` / ``normuon_eps_mode`` /
``normuon_dim`` (NorMuon). ``resolve_stage_options`` validates them, ``normuon_variances`` gives
the per-matrix views of NorMuon's state ``state[p]["variance_neuron"]`` (microsoft/dion's key),
``check_stage_state`` checks a stored one before a step, ``NORMUON_STATE_SPEC`` is what
``load_state_dict`` checks, and ``stacked_stage_update_`` is the stages' part of the stacked step
(what it derives once per chunk kept in a ``StagePlan``).
Source: docs/design.md, "Muon"; docs/math.md, "Muon pipeline stages".
"""

from __future__ import annotations

import math
import operator

import torch

from ..functional import muon_stages as stage_math
from ..functional.layout import MuonLayout
from ..functional.muon import adjusted_lr_scale
from ..functional.muon_stages import NORMUON_DIMS, NORMUON_EPS_MODES, equilibration_side, normuon_variance_shape
from ..validation import check_choice, check_hyper

#: The stage keys of a Muon group with their defaults (every stage off).
STAGE_DEFAULTS: dict[str, object] = {
    "row_equilibration": False,  # MuonEq: False, True (= "row"), "row" or "column"
    "renormalize": False,  # Muon+: ‖O‖_F set to √min(m, n)
    "normuon_beta2": None,  # NorMuon off; a float in [0, 1): its second-moment EMA
    "normuon_eps": 1e-8,  # microsoft/dion's 1e-8 (nanochat: 1e-10 with "clamp")
    "normuon_eps_mode": "add",  # "add" √v + eps (microsoft/dion), "clamp" √max(v, eps) (nanochat)
    "normuon_dim": "row",  # "row" (paper, microsoft/dion), "column", "by_shape" (nanochat)
}

#: NorMuon's state key (microsoft/dion ``NorMuon``'s, so its checkpoints map).
VARIANCE_KEY = "variance_neuron"


def resolve_stage_options(group: dict) -> dict:
    """The resolved stage options of a Muon group (keys of ``MuonOptions``): ``equilibration``
    (None, "row" or "column"), ``renormalize``, ``normuon_beta2`` (float or None),
    ``normuon_eps``, ``normuon_eps_mode``, ``normuon_dim``.
    Raises: ValueError / TypeError starting with the offending key; changes nothing."""
    side = equilibration_side(group["row_equilibration"])
    if not isinstance(group["renormalize"], bool):
        raise TypeError(f"renormalize: expected a bool, got {group['renormalize']!r}")
    beta2 = group["normuon_beta2"]
    if beta2 is not None:
        beta2 = check_hyper(beta2, "normuon_beta2", high=1.0)
        if beta2 >= 1.0:
            raise ValueError(f"normuon_beta2: expected a number in [0, 1) or None, got {group['normuon_beta2']!r}")
    eps = check_hyper(group["normuon_eps"], "normuon_eps")
    check_choice(group["normuon_eps_mode"], "normuon_eps_mode", NORMUON_EPS_MODES)
    check_choice(group["normuon_dim"], "normuon_dim", NORMUON_DIMS)
    if beta2 is not None and group["normuon_eps_mode"] == "clamp" and eps == 0.0:
        raise ValueError("normuon_eps: 0 with normuon_eps_mode='clamp' divides by √0 for a zero row; give eps > 0")
    return dict(equilibration=side, renormalize=group["renormalize"], normuon_beta2=beta2, normuon_eps=eps,
                normuon_eps_mode=group["normuon_eps_mode"], normuon_dim=group["normuon_dim"])


def variance_shape(layout: MuonLayout, dim: str) -> tuple[int, ...]:
    """Shape of ``state[p]["variance_neuron"]`` for a parameter of ``layout``: one matrix batch
    (a 2-D parameter, experts, a flatten=False batch): ``normuon_variance_shape`` of it, (m, 1)
    for an (m, n) weight as microsoft/dion; several blocks (splits, heads): the blocks' second
    moments flattened and concatenated in block order, (total,)."""
    shapes = [normuon_variance_shape(s, dim) for s in layout.matrix_shapes()]
    return shapes[0] if len(shapes) == 1 else (sum(math.prod(s) for s in shapes),)


def normuon_variances(p: torch.Tensor, state, layout: MuonLayout, dim: str) -> list[torch.Tensor]:
    """Views, one per matrix of ``layout``, of NorMuon's second moment of ``p`` (created as zeros
    of ``variance_shape`` in the parameter's dtype, as microsoft/dion's ``zeros_like(param[..., 0:1])``)."""
    st = state[p]
    if VARIANCE_KEY not in st:
        st[VARIANCE_KEY] = torch.zeros(variance_shape(layout, dim), dtype=p.dtype, device=p.device)
    shapes = [normuon_variance_shape(s, dim) for s in layout.matrix_shapes()]
    if len(shapes) == 1:
        return [st[VARIANCE_KEY]]
    flat = st[VARIANCE_KEY]
    return [part.view(s) for part, s in zip(flat.split([math.prod(s) for s in shapes]), shapes)]


def check_stage_state(st: dict, p: torch.Tensor, layout: MuonLayout, options, name: str) -> None:
    """ValueError naming ``variance_neuron`` and the parameter when a stored second moment is not a
    tensor of ``variance_shape`` and the parameter's dtype (NorMuon on), or exists with NorMuon
    off (a resumed run would silently ignore it); changes nothing."""
    value = st.get(VARIANCE_KEY)
    if value is None:
        return
    if options.normuon_beta2 is None:
        raise ValueError(f"{VARIANCE_KEY}: {name} has a NorMuon second moment but its group has normuon_beta2=None "
                         "(set normuon_beta2, or drop the key)")
    want = variance_shape(layout, options.normuon_dim)
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != want or value.dtype != p.dtype:
        got = (tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"{VARIANCE_KEY}: expected a tensor of shape {want} and dtype {p.dtype}, got {got} ({name})")


class StagePlan:
    """What ``stacked_stage_update_`` derives once per chunk and keeps in the chunk's cache: the stack
    it runs on, the stage options it was made with (``key``), the update's scale s, the parameters'
    (k_i, m, n) views and counts (kept while the parameters hold the same bytes), NorMuon's
    ``NormuonFactor`` and the second moments it last read (``parts``: the state's tensors, their
    (c, a, b) views and their lengths). A chunk's step then runs its kernels only."""

    __slots__ = ("stack", "key", "scale", "params", "ptrs", "dsts", "counts", "normuon", "parts", "views", "sizes")

    def __init__(self, members, stack: torch.Tensor, options, key: tuple) -> None:
        m, n = stack.shape[-2:]
        self.stack = stack
        self.key = key
        self.scale = adjusted_lr_scale(options.adjust_lr, m, n) * options.extra_scale_factor
        self.params = [p for p, _, _ in members]
        self.ptrs = None
        self.dsts = self.counts = None
        self.normuon = self.parts = self.views = self.sizes = None

    def variances(self, members, state, options, parts: list) -> torch.Tensor:
        """The second moments concatenated into one new (k, a, b) tensor (held only by the step: no
        memory kept between steps), from ``parts`` (the state's tensors, None where not created
        yet: created here as ``normuon_variances`` does)."""
        if not (self.parts is not None and len(self.parts) == len(parts) and all(map(operator.is_, parts,
                                                                                      self.parts))):
            if any(v is None for v in parts):  # created at the first step
                parts = [normuon_variances(p, state, lay, options.normuon_dim)[0] for p, lay, _ in members]
            self.parts, self.views = parts, [v.view(-1, *v.shape[-2:]) for v in parts]
            self.sizes = [v.shape[0] for v in self.views]
            self.normuon = stage_math.NormuonFactor(self.stack.shape, self.stack.dtype, parts[0].dtype,
                                                    beta2=options.normuon_beta2, eps=options.normuon_eps,
                                                    eps_mode=options.normuon_eps_mode, dim=options.normuon_dim)
        return torch.cat(self.views)


def _stage_key(options) -> tuple:
    """The options ``StagePlan`` derives from (every one but lr, weight decay and momentum)."""
    return (options.renormalize, options.normuon_beta2, options.normuon_eps, options.normuon_eps_mode,
            options.normuon_dim, options.adjust_lr, options.extra_scale_factor)


def stacked_stage_update_(members, stack: torch.Tensor, state, options, lr: float, free=(),
                          cache: dict | None = None) -> None:
    """Muon+ / NorMuon and the update of one chunk of the stacked step (``ortho_fast.groups.muon``):
    ``members`` (parameter, layout, index) whose matrices are the consecutive slices of the
    (k, m, n) Newton–Schulz result ``stack``. The stages' factors f (``post_factors`` on the whole
    stack: (k, m, 1) / (k, 1, n) per neuron, (k, 1, 1) Muon+ alone; NorMuon's second moments
    concatenated, updated, written back with one ``_foreach_copy_``), then
    W ← W − lr·s·O·f per parameter, s = adjusted_lr_scale(m, n)·extra_scale_factor, with
    ``add_scaled_product_``: Ô = O·f formed in rounds in ``free`` (flat workspace bytes the step
    no longer reads: the stack not holding the result, ``Workspace.spare``) and in the stack's
    added matrices, each round one batched product and one same-dtype ``_foreach_add_``; where
    that does not fit or pay (or ``free`` is empty), one ``_foreach_addcmul_`` (Ô computed in
    float32 inside it, never stored). No O-sized temporary either way.
    The decay is done before (``decay_weights``); the parameters are contiguous (``plan_stacks``).
    ``cache``: a dict keeping the chunk's ``StagePlan`` (its views, counts and factor constants) and
    the update's rounds from step to step (a chunk's plan:
    the same parameters and workspace bytes at every step); the factors are then computed by the
    same operations as ``post_factors`` (the same bits) unless ``post_factors`` or ``normuon_factor``
    is patched (then called as they are)."""
    plan = cache.get("stage") if cache is not None else None
    key = _stage_key(options)
    if plan is None or plan.stack is not stack or plan.key != key:
        plan = StagePlan(members, stack, options, key)
        if cache is not None:
            cache["stage"] = plan
    variances = None
    if options.normuon_beta2 is not None:
        variances = [plan.variances(members, state, options, [state[p].get(VARIANCE_KEY) for p in plan.params])]
    if (cache is not None and stage_math.post_factors is POST_FACTORS and stage_math.normuon_factor is NORMUON_FACTOR
            and stage_math.renormalize_factor is RENORMALIZE_FACTOR):  # ``post_factors``' operations, constants kept
        gain = stage_math.renormalize_factor(stack) if options.renormalize else None
        factor = gain if variances is None else plan.normuon(stack, variances[0], gain)
    else:
        factor = stage_math.post_factors([stack], variances, **options.post_orthogonalize_kwargs())[0]
    if variances is not None:  # written back: one copy of the same entries
        torch._foreach_copy_(plan.views, torch.split_with_sizes(variances[0], plan.sizes))
    ptrs = list(map(torch.Tensor.data_ptr, plan.params)) if cache is not None else None  # views of the same bytes
    if ptrs is None or plan.ptrs != ptrs:
        m, n = stack.shape[-2:]
        plan.dsts = [p.view(-1, m, n) for p in plan.params]
        plan.counts = [p.numel() // (m * n) for p in plan.params]
        plan.ptrs = ptrs
    stage_math.add_scaled_product_(plan.dsts, stack, factor, plan.counts, -lr * plan.scale, free, cache=cache)


#: The stage functions as this module found them (a patched one is called through ``post_factors``).
POST_FACTORS = stage_math.post_factors
NORMUON_FACTOR = stage_math.normuon_factor
RENORMALIZE_FACTOR = stage_math.renormalize_factor
