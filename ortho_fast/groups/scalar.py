"""AdamW and Lion param groups (torch), for the parameters Muon and Dion leave: embeddings,
norms, biases, scalars and the output head, stepped by multi-tensor (``_foreach``) operations per
(device, dtype). The math is in ``ortho_fast.functional.scalar``.

Each algorithm implements the contract that ``ortho_fast.HybridOptimizer`` drives
(the same as ``muon`` and ``dion``):

    <ALG>_DEFAULTS                     dict of the group options and their defaults
    normalize_<alg>_group(group)       validate a group already filled with defaults
    check_<alg>_step(group, state)     check gradients and existing state; changes nothing
    <alg>_group_step(group, state)     one step for every parameter of the group with a grad

``state`` is the optimizer's ``defaultdict(dict)`` keyed by parameter.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch

from ..functional.scalar import (
    adamw_capturable_foreach_update,
    adamw_foreach_update,
    adamw_update,
    lion_foreach_update,
    lion_update,
)
from ..validation import FiniteCheck, check_filled, check_finite, check_hyper
from .driver import GroupRunner
from .options import AdamWOptions, LionOptions

#: torch.optim.AdamW's defaults (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2).
ADAMW_DEFAULTS: dict[str, object] = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)

#: Chen et al. 2023 (arXiv 2302.06675) and lucidrains/lion-pytorch: lr 1e-4 (3–10× below
#: AdamW's), betas (0.9, 0.99), weight_decay 0. Megatron's Lion for Muon's scalars: (0.95, 0.98).
LION_DEFAULTS: dict[str, object] = dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0)


def _betas(betas, *, high_open: bool) -> tuple[float, float]:
    """``betas`` validated as a pair of floats in [0, 1) (``high_open``) or [0, 1]."""
    try:
        b1, b2 = betas
    except (TypeError, ValueError):
        raise ValueError(f"betas: expected a pair (beta1, beta2), got {betas!r}") from None
    pair = (check_hyper(b1, "betas[0]", high=1.0), check_hyper(b2, "betas[1]", high=1.0))
    if high_open and 1.0 in pair:
        raise ValueError(f"betas: expected values in [0, 1), got {betas!r}")
    return pair


def resolve_adamw_options(group: dict) -> AdamWOptions:
    """The AdamW options of ``group`` validated, as floats; changes nothing.
    Raises: ValueError naming the key (see ``normalize_adamw_group``)."""
    check_filled(group, ADAMW_DEFAULTS, "AdamW")
    out = {key: check_hyper(group[key], key) for key in ("lr", "eps", "weight_decay")}
    return AdamWOptions(betas=_betas(group["betas"], high_open=True), **out)


def resolve_lion_options(group: dict) -> LionOptions:
    """The Lion options of ``group`` validated, as floats; changes nothing.
    Raises: ValueError naming the key (see ``normalize_lion_group``)."""
    check_filled(group, LION_DEFAULTS, "Lion")
    out = {key: check_hyper(group[key], key) for key in ("lr", "weight_decay")}
    return LionOptions(betas=_betas(group["betas"], high_open=False), **out)


def normalize_adamw_group(group: dict) -> None:
    """Validate an AdamW group (filled with ``ADAMW_DEFAULTS``) and store its options as floats.

    Raises: ValueError naming the key for lr, eps, weight_decay < 0 or not finite, and betas
    not a pair in [0, 1).
    """
    options = resolve_adamw_options(group)
    group.update(lr=options.lr, betas=options.betas, eps=options.eps, weight_decay=options.weight_decay)


def normalize_lion_group(group: dict) -> None:
    """Validate a Lion group (filled with ``LION_DEFAULTS``) and store its options as floats.

    Raises: ValueError naming the key for lr, weight_decay < 0 or not finite, and betas not a
    pair in [0, 1].
    """
    options = resolve_lion_options(group)
    group.update(lr=options.lr, betas=options.betas, weight_decay=options.weight_decay)


def _check_grads(group: dict, state: Mapping[torch.Tensor, dict], buffers: tuple[str, ...], name: str,
                 finite: FiniteCheck | bool = True) -> None:
    """Every parameter with a gradient: real floating parameter, dense real finite gradient
    of its shape, and existing state buffers of its shape."""
    for i, p in enumerate(group["params"]):
        g = p.grad
        if g is None:
            continue
        where = f"{name} parameter {i} (shape {tuple(p.shape)})"
        if not p.is_floating_point():
            raise TypeError(f"params: {where}: expected a real floating-point parameter, got dtype {p.dtype}")
        if g.is_sparse or g.shape != p.shape or g.dtype != p.dtype or g.device != p.device:
            raise ValueError(f"grad: {where}: expected a dense tensor of shape {tuple(p.shape)}, dtype {p.dtype} "
                             f"on {p.device}, got {'sparse ' if g.is_sparse else ''}{g.dtype} of shape "
                             f"{tuple(g.shape)} on {g.device}")
        if finite is True:
            check_finite(g, f"grad of {where}")
        elif isinstance(finite, FiniteCheck):
            finite.add(g, f"grad of {where}")
        st = state.get(p, {})
        for key in buffers:
            if key in st and st[key].shape != p.shape:
                raise ValueError(f"{key}: {where}: expected shape {tuple(p.shape)}, got {tuple(st[key].shape)}")


def check_adamw_step(group: dict, state: Mapping[torch.Tensor, dict], finite: FiniteCheck | bool = True) -> None:
    """Checks before an AdamW step; changes nothing.

    Raises: ValueError naming the option for lr, eps, weight_decay or betas edited since the
    group was added (as ``normalize_adamw_group``); TypeError for a non-floating (integer,
    bool, complex) parameter; ValueError for a sparse, non-finite gradient or one whose
    shape, dtype or device differs from the parameter's, ``exp_avg`` / ``exp_avg_sq`` of the
    wrong shape, a ``step`` that is not a one-element tensor, or a ``capturable`` that is not a
    bool (or None).
    """
    resolve_adamw_options(group)
    if group.get("capturable") not in (None, False, True):
        raise ValueError(f"capturable: expected a bool (torch.optim.AdamW's option), got {group['capturable']!r}")
    _check_grads(group, state, ("exp_avg", "exp_avg_sq"), "AdamW", finite)
    for i, p in enumerate(group["params"]):
        step = state.get(p, {}).get("step")
        if p.grad is not None and step is not None and not (isinstance(step, torch.Tensor) and step.numel() == 1):
            raise ValueError(f"step: AdamW parameter {i}: expected a one-element tensor (torch's layout), got {step!r}")


def check_lion_step(group: dict, state: Mapping[torch.Tensor, dict], finite: FiniteCheck | bool = True) -> None:
    """Checks before a Lion step; changes nothing.

    Raises: ValueError naming the option for lr, weight_decay or betas edited since the group
    was added (as ``normalize_lion_group``); TypeError for a non-floating (integer, bool,
    complex) parameter; ValueError for a sparse, non-finite gradient or one whose shape,
    dtype or device differs from the parameter's, or an ``exp_avg`` of the wrong shape.
    """
    resolve_lion_options(group)
    _check_grads(group, state, ("exp_avg",), "Lion", finite)


def _by_device_and_dtype(params) -> dict[tuple[torch.device, torch.dtype], list[torch.Tensor]]:
    """The parameters with a gradient, in order, grouped by (device, dtype): the lists one
    ``_foreach`` operation takes on CUDA's fast path."""
    buckets: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for p in params:
        if p.grad is not None:
            buckets.setdefault((p.device, p.dtype), []).append(p)
    return buckets


def _per_tensor(params: list[torch.Tensor]) -> bool:
    """Whether these parameters (one device and dtype) step one at a time: under
    ``torch.compile`` (inductor fuses the loop), and for bfloat16 / float16 on the CPU, where
    torch's ``_foreach`` operations round their float scalars (β2, ε, the lr) to the tensors'
    dtype first (other bits than the single-tensor operations, which compute in float32:
    tests/ortho_fast/test_scalar.py); on the CPU each ``_foreach`` operation loops over the tensors
    anyway."""
    reduced = params[0].dtype in (torch.bfloat16, torch.float16) and params[0].device.type == "cpu"
    return reduced or torch.compiler.is_compiling()


@torch.no_grad()
def adamw_group_step(group: dict, state) -> None:
    """One AdamW step, in place, for every parameter of ``group`` with a gradient.

    Eager: the parameters grouped by (device, dtype), each group stepped by
    ``adamw_foreach_update`` (torch.optim.AdamW's multi-tensor path: 8 ``_foreach`` kernels per
    group on CUDA, 7 without weight decay, whatever the number of parameters). Under
    ``torch.compile``, and for bfloat16 / float16 parameters on the CPU: ``adamw_update`` per
    parameter (torch's single-tensor path). The bits are torch.optim.AdamW's: on the CPU the
    parameters and state are bitwise ``torch.optim.AdamW(foreach=False)`` (its CPU default; in
    float32 / float64 its foreach path too); on CUDA those of its foreach path, its default there.
    State layout torch's: ``step`` a CPU scalar tensor (float32, float64 under a float64 default
    dtype) also for a parameter on a GPU, so the bias corrections are computed on the host
    without a device sync; ``exp_avg`` and ``exp_avg_sq`` of the parameter's shape and dtype — a
    torch AdamW state dict loads as is. A ``step`` loaded on a GPU in a group without
    ``capturable`` stays there and is read with one sync per parameter, as torch's
    non-capturable step does. Host work (the counters, the corrections) is not captured by a
    CUDA graph: a captured step would replay the bias corrections of the captured step.
    ``capturable=True`` in the group (torch.optim.AdamW's option; a torch checkpoint saved with it
    carries it): ``step`` on the parameter's device (torch's capturable layout: a counter found
    elsewhere is moved there) and ``adamw_capturable_foreach_update`` (the corrections computed
    on the device: no host work, the step replays in a CUDA graph; torch's capturable bits).
    Shapes: any parameter shape; computed in the parameter's dtype.
    Source: Loshchilov & Hutter, arXiv 1711.05101, Algorithm 2; torch.optim.AdamW.
    Call ``check_adamw_step`` first: this function assumes valid input.
    """
    lr, (beta1, beta2) = group["lr"], group["betas"]
    eps, wd = group["eps"], group["weight_decay"]
    options = dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=wd)
    capturable = group.get("capturable") is True
    for params in _by_device_and_dtype(group["params"]).values():
        for p in params:
            st = state[p]
            if len(st) == 0:
                scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
                st["step"] = torch.zeros((), dtype=scalar, device=p.device if capturable else "cpu")
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif capturable and st["step"].device != p.device:
                st["step"] = st["step"].to(p.device)
        states = [state[p] for p in params]
        if _per_tensor(params):
            for p, st in zip(params, states):
                adamw_update(p, p.grad, st["exp_avg"], st["exp_avg_sq"], st["step"], **options)
            continue
        update = adamw_capturable_foreach_update if capturable else adamw_foreach_update
        update(params, [p.grad for p in params], [st["exp_avg"] for st in states],
               [st["exp_avg_sq"] for st in states], [st["step"] for st in states], **options)


@torch.no_grad()
def lion_group_step(group: dict, state) -> None:
    """One Lion step, in place, for every parameter of ``group`` with a gradient:
    U = sign(lerp(m, g, 1 − β1)), m ← lerp(m, g, 1 − β2), W ← W·(1 − lr·wd) − lr·U.

    State: ``exp_avg`` (m) of the parameter's shape and dtype. The operations are those of
    microsoft/dion's single-tensor ``lion_update`` run eagerly (``lerp``, ``sign_``,
    ``mul_``, ``add_``); sign(0) = 0. Eager: the parameters grouped by (device, dtype), each
    group stepped by ``lion_foreach_update`` (5 ``_foreach`` kernels per group on CUDA, 4 without
    weight decay; on the CPU the same per-tensor operations, the same bits); under
    ``torch.compile``, and for bfloat16 / float16 on the CPU: ``lion_update`` per parameter.
    No host read.
    Source: Chen et al., arXiv 2302.06675 (Lion); microsoft/dion ``scalar_opts.py``.
    Call ``check_lion_step`` first: this function assumes valid input.
    """
    lr, (beta1, beta2), wd = group["lr"], group["betas"], group["weight_decay"]
    options = dict(lr=lr, beta1=beta1, beta2=beta2, weight_decay=wd)
    for params in _by_device_and_dtype(group["params"]).values():
        for p in params:
            if "exp_avg" not in state[p]:
                state[p]["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        exp_avgs = [state[p]["exp_avg"] for p in params]
        if _per_tensor(params):
            for p, m in zip(params, exp_avgs):
                lion_update(p, p.grad, m, **options)
            continue
        lion_foreach_update(params, [p.grad for p in params], exp_avgs, **options)


class ElementwiseGroups(GroupRunner):
    """Runs the groups of an elementwise algorithm through its group functions: ``check(group,
    state, finite)`` (``check_adamw_step`` / ``check_lion_step``) and ``step(group, state)``
    (``adamw_group_step`` / ``lion_group_step``). Options are cheap to check: no cache."""

    def __init__(self, check: Callable[..., None], step: Callable[[dict, object], None]) -> None:
        self._check, self._step = check, step

    def check(self, groups, state, finite: FiniteCheck | None = None) -> None:
        for group in groups:
            self._check(group, state, finite if finite is not None else False)

    def step(self, group: dict, state, first_index: int) -> None:
        self._step(group, state)
