"""Muon's per-tensor math: momentum, orthogonalization of a list of matrices, and the scaled update.

Functions of tensors and keyword hyperparameters (no param-group dicts): the role of torch.optim's
``_single_tensor_muon``. ``ortho_fast.groups.muon`` drives them for a param group, and
``ortho_fast.distributed.muon`` for sharded parameters.

Patch points (documented seams for tests that plant bugs): ``orthogonalize`` and
``adjusted_lr_scale`` are looked up in this module at every call by the group layer and the
distributed step, so ``monkeypatch.setattr(ortho_fast.functional.muon, "orthogonalize", ...)``
reaches every Muon step.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Sequence

import torch

from ..validation import check_choice
from .graph_scalars import add_scaled_, foreach_scale_, is_device_scalar, lerp_weight
from .layout import MuonLayout
from .newton_schulz import newton_schulz_resolved, newton_schulz_stack, newton_schulz_stacked
from .stacked import momentum_rounds

MOMENTUM_STYLES = ("ema", "classic")
#: lr adjustment modes; the last three are Megatron / Emerging-Optimizers ``scale_mode`` names.
ADJUST_LR_MODES = ("original", "match_rms_adamw", "spectral_norm", None, "shape_scaling", "spectral", "unit_rms_norm")
#: Weight-decay styles (``ortho_ref.muon.WEIGHT_DECAY_STYLES``' names): "decoupled" W(1 − lr·wd), the
#: unscaled lr (torch.optim.Muon, microsoft/dion, Moonlight); "adjusted_lr" W(1 − lr·s·wd), s the
#: update's lr multiplier of the matrix (nanochat); "independent" W(1 − wd) (Emerging-Optimizers'
#: ``weight_decay_method="independent"``). The oracle's "l2" (wd·W added to the gradient) is not one.
WEIGHT_DECAY_STYLES = ("decoupled", "adjusted_lr", "independent")


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
    if nesterov and is_device_scalar(mu):
        return grad + buf * mu
    return grad.add(buf, alpha=mu) if nesterov else buf


def muon_momentum_foreach(grads: Sequence[torch.Tensor], bufs: Sequence[torch.Tensor], *, mu: float, nesterov: bool,
                          style: str) -> list[torch.Tensor]:
    """``muon_momentum`` on lists of tensors with torch's ``_foreach`` ops (one call per list
    instead of one per tensor): updates every ``bufs[i]`` in place and returns the matrices to
    orthogonalize, one per gradient. The same bits as ``muon_momentum`` on each pair (the
    ``_foreach`` ops apply the same elementwise kernels).
    Shapes: ``grads[i]``, ``bufs[i]`` (...) of one shape and dtype per i.
    Source: torch.optim's ``_multi_tensor_*`` steps (``foreach=True``).
    Raises: ValueError naming ``style`` (before any buffer changes).
    """
    check_choice(style, "style", MOMENTUM_STYLES)
    grads, bufs = list(grads), list(bufs)
    if not grads:
        return []
    if style == "ema":
        torch._foreach_lerp_(bufs, grads, lerp_weight(1 - mu, len(bufs)))
        return list(torch._foreach_lerp(grads, bufs, lerp_weight(mu, len(bufs)))) if nesterov else bufs
    foreach_scale_(bufs, mu)  # the bits of mul_ (bfloat16 / float16 on the CPU too)
    torch._foreach_add_(bufs, grads)
    if nesterov and is_device_scalar(mu):
        return list(torch._foreach_add(grads, torch._foreach_mul(bufs, mu)))
    return list(torch._foreach_add(grads, bufs, alpha=mu)) if nesterov else bufs


def update_momentum_buffers(grads: Sequence[torch.Tensor], bufs: Sequence[torch.Tensor], *, mu: float,
                            style: str, split=None) -> None:
    """The buffer half of ``muon_momentum_foreach``: every ``bufs[i]`` updated in place ("ema":
    M ← M + (1−μ)(G − M); "classic": M ← μM + G), the same bits. ``split``: "classic"'s
    ``graph_scalars.split_rounded(bufs)`` made ahead. Raises: ValueError naming ``style``."""
    check_choice(style, "style", MOMENTUM_STYLES)
    grads, bufs = list(grads), list(bufs)
    if not grads:
        return
    if style == "ema":
        torch._foreach_lerp_(bufs, grads, lerp_weight(1 - mu, len(bufs)))
    else:
        foreach_scale_(bufs, mu, split)
        torch._foreach_add_(bufs, grads)


def momentum_into_rounds(out: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], bufs: Sequence[torch.Tensor],
                         free: torch.Tensor | None, *, nesterov: bool):
    """The rounds ``momentum_into`` takes with ``free`` (``stacked.momentum_rounds``), or None where it
    takes none (no ``free``, no Nesterov, ``out`` of the gradients' dtype, under ``torch.compile``, no
    round paying). The rounds hold views of ``free``: valid while its bytes are free at that step."""
    out = list(out)
    if not out or not nesterov or free is None or torch.compiler.is_compiling() or out[0].dtype == grads[0].dtype:
        return None
    return momentum_rounds(free, list(grads), out + list(grads) + list(bufs))


def momentum_into(out: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], bufs: Sequence[torch.Tensor], *,
                  mu: float, nesterov: bool, style: str, free: torch.Tensor | None = None, rounds=...) -> None:
    """The other half: writes U (the matrix to orthogonalize) into ``out[i]`` from the updated
    ``bufs[i]`` — G + μ(M − G) ("ema", ``lerp``) / G + μM ("classic") with ``nesterov``, else M —
    the same bits as ``muon_momentum_foreach``'s results (the same kernels, in place on a copy
    of G). ``out`` of another dtype than the gradients (the bfloat16 stack of the stacked step):
    U is computed in the gradients' dtype and rounded once on the write. With ``free`` (flat
    uint8 bytes the step does not read now, ``stacked.Workspace.spare``) in rounds
    (``stacked.momentum_rounds``): G copied into scratch views of ``free`` (one
    ``_foreach_copy_``), the ``_foreach_lerp_`` / ``_foreach_add_`` there, the cast into ``out``
    (one ``_foreach_copy_``): three launches a round in place of one per tensor. Else (no ``free``, under
    ``torch.compile``, no round paying; and for the tensors
    after the last round) one ``out=`` call per tensor (no temporary of U). Either way the bits
    of ``muon_momentum_foreach``'s results cast to ``out``'s dtype. Changes the bytes of ``free``.
    ``rounds``: ``momentum_into_rounds``' result made ahead (a chunk's plan keeps it; ``free`` unused).
    Shapes: ``out[i]``, ``grads[i]``, ``bufs[i]`` of one shape per i; ``grads[i]``, ``bufs[i]``
    of one dtype.
    Source: torch.optim's ``_multi_tensor_*`` steps (``_foreach`` ops); docs/performance.md (e)."""
    check_choice(style, "style", MOMENTUM_STYLES)
    out = list(out)
    if not out:
        return
    if not nesterov:
        torch._foreach_copy_(out, list(bufs))
        return
    grads, bufs = list(grads), list(bufs)
    if out[0].dtype != grads[0].dtype:
        if rounds is ...:
            rounds = momentum_into_rounds(out, grads, bufs, free, nesterov=nesterov)
        if rounds is None:
            for o, g, b in zip(out, grads, bufs):
                if style == "ema":
                    torch.lerp(g, b, mu, out=o)
                else:
                    torch.add(g, b * mu, out=o) if is_device_scalar(mu) else torch.add(g, b, alpha=mu, out=o)
            return
        for lo, hi, scratch in rounds:
            _nesterov_in_place(scratch, grads[lo:hi], bufs[lo:hi], mu=mu, style=style)
            torch._foreach_copy_(out[lo:hi], scratch)
        momentum_into(out[hi:], grads[hi:], bufs[hi:], mu=mu, nesterov=nesterov, style=style, rounds=None)
        return
    _nesterov_in_place(out, grads, bufs, mu=mu, style=style)


def _nesterov_in_place(out: list[torch.Tensor], grads: list[torch.Tensor], bufs: list[torch.Tensor], *, mu: float,
                       style: str) -> None:
    """out[i] ← G + μ(M − G) ("ema") / G + μM ("classic"): G copied in, then one in-place
    ``_foreach`` op (the kernels of ``lerp`` / ``add``: their bits); out of the gradients' dtype."""
    torch._foreach_copy_(out, grads)
    if style == "ema":
        torch._foreach_lerp_(out, bufs, lerp_weight(mu, len(out)))
    elif is_device_scalar(mu):
        torch._foreach_add_(out, torch._foreach_mul(bufs, mu))
    else:
        torch._foreach_add_(out, bufs, alpha=mu)


def cautious_decay_factor(o: torch.Tensor, w: torch.Tensor, decay: float) -> torch.Tensor:
    """Cautious weight decay's factor: 1 − ``decay`` where sign(O)·sign(W) >= 0, else 1, in
    ``w``'s computation dtype (float32 for bfloat16 / float16 ``w``, else ``w``'s): ``w.mul_`` of it
    gives the bits of ``torch.where(sign(O)·sign(W) >= 0, W·(1 − decay), W)``. The mask is built
    from four boolean comparisons (O and W of opposite signs), so its peak temporaries are about
    5 bytes per entry, not the 12 of float32 signs and their product.
    Shapes: o, w the same (m, n) (or broadcastable), finite -> w's shape.
    Source: Chen et al. 2025, arXiv 2510.12402 (cautious weight decay)."""
    opposite = o.gt(0).logical_and_(w.lt(0)).logical_or_(o.lt(0).logical_and_(w.gt(0)))
    one = torch.ones((), dtype=torch.promote_types(w.dtype, torch.float32), device=w.device)
    return torch.where(opposite, one, one * (1 - decay))  # a product: under compile an lr is a graph input


def decay_amount(style: str, *, lr: float, weight_decay: float, scale: float = 1.0) -> float:
    """d with W ← W·(1 − d) the weight decay of a step under ``style`` (``WEIGHT_DECAY_STYLES``):
    lr·wd ("decoupled"), lr·s·wd ("adjusted_lr", ``scale`` s the matrix's lr multiplier
    ``adjusted_lr_scale``·extra_scale_factor), wd ("independent"). Python floats (an lr that
    ``torch.compile`` made symbolic stays one).
    Source: ``ortho_ref.muon.decay_factor`` (1 − d); nanochat ``nanochat/optim.py`` (lr·√max(1, m/n)·wd).
    Raises: ValueError naming ``weight_decay_style`` for an unknown style."""
    if style == "decoupled":
        return lr * weight_decay
    if style == "adjusted_lr":
        return lr * scale * weight_decay
    if style == "independent":
        return weight_decay
    check_choice(style, "weight_decay_style", WEIGHT_DECAY_STYLES)
    raise AssertionError("unreachable")


def decay_weights(params: Sequence[torch.Tensor], *, lr: float, weight_decay: float, split=None) -> None:
    """Decoupled weight decay W ← W·(1 − lr·wd) on every tensor of ``params`` in place, with one
    ``_foreach_mul_`` (``graph_scalars.foreach_scale_``: the bits of ``W.mul_(1 - lr * wd)``; nothing when lr·wd = 0).
    ``split``: ``graph_scalars.split_rounded(params)`` made ahead.
    Source: torch.optim.Muon / AdamW (decoupled decay with the unscaled lr)."""
    if is_device_scalar(lr) or is_device_scalar(weight_decay):  # capturable: applied, never compared on the host
        foreach_scale_(params, 1 - lr * weight_decay, split)
        return
    factor = 1 - float(lr) * float(weight_decay)
    if factor != 1.0 and params:
        foreach_scale_(params, factor, split)


def decay_by_style(items: Sequence[tuple[torch.Tensor, Sequence[tuple[int, ...]]]], *, style: str, lr: float,
                   weight_decay: float, adjust_lr: str | None, extra_scale_factor: float = 1.0,
                   split=None) -> set[int]:
    """The weight decay of a step as ``_foreach`` ops (``decay_weights``) on the parameters of
    ``items`` ((parameter, the matrix shapes of its layout) pairs), in place: one op for "decoupled"
    / "independent"; for "adjusted_lr" one per lr multiplier s, over the parameters whose matrices
    share one s (``decay_amount``). Returns the ids of the parameters it left undecayed ("adjusted_lr"
    with blocks of different s: ``muon_update`` decays them per block). ``split``: for "decoupled" /
    "independent", ``graph_scalars.split_rounded`` of the parameters made ahead."""
    if style != "adjusted_lr":
        amount = decay_amount(style, lr=lr, weight_decay=weight_decay)
        lr, wd = (lr, weight_decay) if style == "decoupled" else (1.0, amount)
        decay_weights([p for p, _ in items], lr=lr, weight_decay=wd, split=split)  # 1 − lr·wd: the bits of mul_
        return set()
    by_scale: dict[float, list[torch.Tensor]] = {}
    left = set()
    for p, shapes in items:
        scales = {adjusted_lr_scale(adjust_lr, *shape[-2:]) * extra_scale_factor for shape in shapes}
        if len(scales) == 1:
            by_scale.setdefault(scales.pop(), []).append(p)
        else:
            left.add(id(p))
    for scale, params in by_scale.items():
        decay_weights(params, lr=decay_amount(style, lr=lr, weight_decay=weight_decay, scale=scale), weight_decay=1.0)
    return left


class MatrixStack(list):
    """A list of matrices that are the consecutive slices, in order, of one contiguous (k, m, n)
    tensor ``stack`` (``ortho_fast.groups.muon``'s stacked step builds its momentum so): a list
    for every caller, and ``orthogonalize`` reads the stack without copying it. The result of
    ``orthogonalize`` on one is again one (``stack``: the compute-dtype result). ``scratch``: the
    stack is the caller's buffer, free to be overwritten (in the compute dtype the iteration
    then starts in it: no copy)."""

    def __init__(self, mats, stack: torch.Tensor, scratch: bool = False) -> None:
        super().__init__(mats)
        self.stack = stack
        self.scratch = scratch


def orthogonalize(mats: Sequence[torch.Tensor], table, *, safety: float, eps: float, eps_mode: str,
                  compute_dtype: torch.dtype | None = None, precision: str | None = None,
                  banks: bool = False, gram: bool | None = None, workspace=None) -> list[torch.Tensor]:
    """Newton–Schulz (``newton_schulz_resolved``) on every matrix batch of ``mats``.

    Shapes: each input (..., m, n) -> the same shape, returned in ``compute_dtype`` (None: each
    input's own dtype). The update adds it to the parameter with type promotion, which converts
    exactly as an explicit cast would, without the extra pass. With ``banks``, inputs of the same
    (m, n) and dtype are stacked along the batch and orthogonalized in one batched call
    (``newton_schulz_stacked``: written into the stack in one cast, wide side contiguous; a lone
    member keeps its own 2-D call, so its bits do not depend on ``banks``).
    Args: ``table`` the resolved per-step rows; ``safety``, ``eps``, ``eps_mode``, ``precision``,
    ``gram`` as ``newton_schulz_resolved`` (validated by the caller). ``workspace``: an
    ``ortho_fast.functional.stacked.Workspace`` for the stacked call when all inputs share one
    shape (the results are then views of its buffers, valid until its next use); a ``MatrixStack``
    of k >= 2 matrices (or a ``scratch`` one) is orthogonalized as its stack (no copy) and returns
    a ``MatrixStack``.
    Source: Keller Jordan's Muon (per-matrix Newton–Schulz); modded-nanogpt / nanochat parameter banks.
    """
    def run(x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype if compute_dtype is None else compute_dtype
        return newton_schulz_resolved(x, table, safety=safety, eps=eps, eps_mode=eps_mode, compute_dtype=dtype,
                                      precision=precision, out_dtype=dtype, gram=gram)

    if not banks:
        return [run(x) for x in mats]
    stack = getattr(mats, "stack", None)
    if stack is not None and (stack.shape[0] >= 2 or getattr(mats, "scratch", False)):
        dtype = stack.dtype if compute_dtype is None else compute_dtype
        x = newton_schulz_stack(stack, table, safety=safety, eps=eps, eps_mode=eps_mode, compute_dtype=dtype,
                                precision=precision, gram=gram, workspace=workspace,
                                overwrite=getattr(mats, "scratch", False))
        return MatrixStack(split_stack(x, mats), x)
    grouped: dict[tuple, list[int]] = defaultdict(list)
    for i, x in enumerate(mats):
        grouped[(*x.shape[-2:], x.dtype)].append(i)
    out: list[torch.Tensor] = [None] * len(mats)  # type: ignore[list-item]
    for members in grouped.values():
        if len(members) == 1:
            out[members[0]] = run(mats[members[0]])
            continue
        dtype = mats[members[0]].dtype if compute_dtype is None else compute_dtype
        results = newton_schulz_stacked([mats[i] for i in members], table, safety=safety, eps=eps, eps_mode=eps_mode,
                                        compute_dtype=dtype, precision=precision, gram=gram,
                                        workspace=workspace if len(grouped) == 1 else None)
        for i, result in zip(members, results):
            out[i] = result
    return out


def split_stack(x: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The consecutive slices of a (k, m, n) stack shaped as the tensors of ``like`` (views)."""
    out, start = [], 0
    for t in like:
        k = t.numel() // (x.shape[-2] * x.shape[-1])
        out.append(x[start:start + k].view(t.shape))
        start += k
    return out


def _nonzero(x) -> bool:
    """Whether a decay may be nonzero: a tensor (capturable: never read on the host) or a float != 0."""
    return is_device_scalar(x) or x != 0.0


def muon_update(p: torch.Tensor, layout: MuonLayout, outs: Sequence[torch.Tensor], *, lr: float,
                weight_decay: float, adjust_lr: str | None, extra_scale_factor: float = 1.0,
                cautious_weight_decay: bool = False, shapes: Sequence[tuple[int, ...]] | None = None,
                weight_decay_style: str = "decoupled") -> None:
    """W ← W·(1 − d_j) − lr·s_j·O_j per block j of ``layout``, in place, in W's dtype.

    s_j = ``adjusted_lr_scale(adjust_lr, m_j, n_j)``·``extra_scale_factor`` from the block's matrix
    shape, or from ``shapes[j]`` (a shard's update is scaled by the global shape). The decay d_j is
    ``decay_amount(weight_decay_style, lr, wd, s_j)``: lr·wd with the unscaled lr ("decoupled", the
    default), lr·s_j·wd ("adjusted_lr", per block), wd ("independent"); ``cautious_weight_decay``
    applies it only where sign(O)·sign(W) >= 0 (Chen et al. 2025, arXiv 2510.12402). Works through
    views of W (a non-contiguous W is updated through a contiguous copy, then copied back).
    Shapes: ``p`` param-shaped; ``outs[j]`` reshapeable to block j's view.
    Source: torch.optim.Muon (decoupled decay, ``adjust_lr``); Moonlight (0.2·√max(m, n));
    Megatron (``extra_scale_factor``); nanochat (decay with the adjusted lr).
    """
    # a tensor lr / weight decay (capturable) is applied, never compared on the host; a Python 0.0 decay skips
    lr = lr if is_device_scalar(lr) else float(lr)
    wd = weight_decay if is_device_scalar(weight_decay) else float(weight_decay)
    per_block = weight_decay_style == "adjusted_lr"
    w = p if p.is_contiguous() else p.contiguous()
    whole = 0.0 if per_block or not _nonzero(wd) else decay_amount(weight_decay_style, lr=lr, weight_decay=wd)
    if not cautious_weight_decay and _nonzero(whole):  # W·1 is W: skipped (``decay_weights`` did it)
        w.mul_(1 - whole)
    for view, o, shape in zip(layout.views(w), outs, shapes or layout.matrix_shapes()):
        o = o.reshape(view.shape)
        scale = adjusted_lr_scale(adjust_lr, shape[-2], shape[-1]) * extra_scale_factor
        decay = whole
        if per_block and _nonzero(wd):
            decay = decay_amount(weight_decay_style, lr=lr, weight_decay=wd, scale=scale)
        if cautious_weight_decay:
            view.mul_(cautious_decay_factor(o, view, decay))
        elif per_block and _nonzero(decay):
            view.mul_(1 - decay)
        add_scaled_(view, o, -lr * scale)
    if w is not p:
        p.copy_(w)
