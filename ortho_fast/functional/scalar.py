"""AdamW and Lion per-tensor updates (in place), for the parameters Muon and Dion leave.

Functions of tensors and keyword hyperparameters; ``ortho_fast.groups.scalar`` creates the state
and drives them for a param group.
"""

from __future__ import annotations

import torch

from .graph_scalars import add_scaled_


@torch.no_grad()
def adamw_update(p: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                 step_t: torch.Tensor, *, lr: float, beta1: float, beta2: float, eps: float,
                 weight_decay: float) -> None:
    """One AdamW step in place on ``p``, ``exp_avg``, ``exp_avg_sq`` and the step counter ``step_t``.

    The operations, their order and dtypes are those of torch.optim.AdamW's single-tensor path
    (``_single_tensor_adam``, decoupled weight decay, no amsgrad / maximize / capturable), so the
    result is bitwise ``torch.optim.AdamW(foreach=False)``'s. Under ``torch.compile``: the bias
    corrections from ``step_t`` as float64 tensors (no host read; an lr changed by a scheduler is
    a graph input, not a constant: ``functional.graph_scalars``) and the step as a product, within
    ``ortho_verify.tolerances.compiled_tolerance`` of eager.
    Shapes: p, grad, exp_avg, exp_avg_sq of one shape and dtype; ``step_t`` a CPU scalar tensor
    (one host read per call, as torch's; none under compile).
    Source: Loshchilov & Hutter, arXiv 1711.05101, Algorithm 2; torch.optim.AdamW.
    """
    step_t += 1
    if weight_decay != 0:
        p.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    if torch.compiler.is_compiling():
        # no host read, and the lr where a graph can take it as an input (graph_scalars):
        # the corrections as float64 0-dim tensors of the counter, the step as a product
        count = step_t.reshape(()).to(torch.float64)
        denom = (exp_avg_sq.sqrt() / (1 - beta2**count).sqrt()).add_(eps)
        p.add_(exp_avg / denom * (-lr / (1 - beta1**count)))
        return
    step = step_t.item()
    step_size = lr / (1 - beta1**step)
    denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(eps)
    p.addcdiv_(exp_avg, denom, value=-step_size)


@torch.no_grad()
def lion_update(p: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, *, lr: float, beta1: float,
                beta2: float, weight_decay: float) -> None:
    """One Lion step in place: U = sign(lerp(m, g, 1 − β1)), m ← lerp(m, g, 1 − β2),
    W ← W·(1 − lr·wd) − lr·U; sign(0) = 0.

    Shapes: p, grad, exp_avg of one shape and dtype.
    Source: Chen et al., arXiv 2302.06675 (Lion); microsoft/dion ``lion_update`` (single tensor, eager).
    """
    update = exp_avg.lerp(grad, 1 - beta1).sign_()
    exp_avg.lerp_(grad, 1 - beta2)
    if weight_decay != 0:
        p.mul_(1 - lr * weight_decay)
    add_scaled_(p, update, -lr)


def host_step_values(steps: list[torch.Tensor]) -> list[float]:
    """The values of the step counters ``steps`` as Python floats, read without a device sync
    where they live on the CPU (torch.optim.AdamW's layout, also for parameters on a GPU): one
    ``stack`` and a read of the CPU result. A counter on another device (a torch.optim.AdamW
    checkpoint saved with ``capturable=True`` or ``fused=True`` keeps it there) is read with
    ``.item()``: one device sync each, as torch.optim.AdamW's own non-capturable step.
    Shapes: one-element tensors of any floating or integer dtype."""
    if all(s.device.type == "cpu" for s in steps):
        return [float(v) for v in torch.stack([s.reshape(()) for s in steps]).tolist()]
    return [s.item() for s in steps]


def _advance_moments(params, grads, exp_avgs, exp_avg_sqs, steps, *, lr: float, beta1: float, beta2: float,
                     weight_decay: float) -> None:
    """The start of a multi-tensor AdamW step, in place: t ← t + 1, the decoupled decay
    W ← W·(1 − lr·wd), m ← lerp(m, g, 1 − β1), v ← β2·v + (1 − β2)·g² (torch's order)."""
    torch._foreach_add_(steps, 1.0)
    if weight_decay != 0:
        torch._foreach_mul_(params, 1 - lr * weight_decay)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)


@torch.no_grad()
def adamw_foreach_update(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
                         exp_avg_sqs: list[torch.Tensor], steps: list[torch.Tensor], *, lr: float, beta1: float,
                         beta2: float, eps: float, weight_decay: float) -> None:
    """``adamw_update`` for many tensors at once, in place: one ``_foreach`` operation per stage
    (8 kernels on CUDA's fast path, 7 without weight decay, whatever the number of tensors) and
    the step counters advanced by one ``_foreach_add_``.

    The operations, their order and dtypes are those of torch.optim.AdamW's multi-tensor path
    (``_multi_tensor_adam``, decoupled weight decay, no amsgrad / maximize / capturable): the
    bias corrections from the step counts in float64 on the host, per tensor, the update with
    a list of per-tensor scalars. On the CPU in float32 / float64 every ``_foreach`` operation
    runs the single-tensor operation per tensor, so the result is bitwise ``adamw_update``'s (and
    ``torch.optim.AdamW(foreach=False)``'s); in bfloat16 / float16 there torch's ``_foreach``
    operations round β2 and ε to the tensors' dtype first (other bits: use ``adamw_update``). On
    CUDA it is ``torch.optim.AdamW(foreach=True)``'s, torch's default there.
    Shapes: ``params[i]``, ``grads[i]``, ``exp_avgs[i]``, ``exp_avg_sqs[i]`` of one shape; all of one
    dtype and device (the fast path: ``ortho_fast.groups.scalar`` groups a param group by
    (device, dtype)); ``steps[i]`` a one-element tensor, read by ``host_step_values`` (no device
    sync for a CPU counter, torch's layout).
    Source: Loshchilov & Hutter, arXiv 1711.05101, Algorithm 2; torch.optim.AdamW (foreach).
    """
    _advance_moments(params, grads, exp_avgs, exp_avg_sqs, steps, lr=lr, beta1=beta1, beta2=beta2,
                     weight_decay=weight_decay)
    counts = host_step_values(steps)
    corrections = {step: (-(lr / (1 - beta1**step)), (1 - beta2**step) ** 0.5) for step in set(counts)}
    values = [corrections[step] for step in counts]
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denom, [sqrt_bc2 for _, sqrt_bc2 in values])
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_(params, exp_avgs, denom, [step_size for step_size, _ in values])


@torch.no_grad()
def adamw_capturable_foreach_update(params: list[torch.Tensor], grads: list[torch.Tensor],
                                    exp_avgs: list[torch.Tensor], exp_avg_sqs: list[torch.Tensor],
                                    steps: list[torch.Tensor], *, lr: float, beta1: float, beta2: float, eps: float,
                                    weight_decay: float) -> None:
    """``adamw_foreach_update`` with the step counters on the parameters' device and the bias
    corrections computed there (torch.optim.AdamW's ``capturable=True`` path): no host work and no
    host read, so a CUDA graph that captures the step replays it (lr and weight decay as captured).

    The operations, their order and dtypes are those of torch.optim.AdamW's multi-tensor path
    with ``capturable=True``: the corrections in the counters' dtype (float32: β2^t rounded there,
    other bits than the host's float64, which ``adamw_foreach_update`` keeps), the step size
    folded into the denominator. 16 kernels on CUDA plus two per tensor: the denominators divided
    by each tensor's own 0-dim correction take ``_foreach``'s slow path (sizes differ), as torch's.
    Shapes: as ``adamw_foreach_update``; ``steps[i]`` a 0-dim floating tensor on the parameters'
    device.
    Source: Loshchilov & Hutter, arXiv 1711.05101, Algorithm 2; torch.optim.AdamW (capturable, foreach).
    """
    _advance_moments(params, grads, exp_avgs, exp_avg_sqs, steps, lr=lr, beta1=beta1, beta2=beta2,
                     weight_decay=weight_decay)
    step_sizes = torch._foreach_pow(beta1, steps)  # -> (β1^t − 1) / lr, inverted: −lr / (1 − β1^t)
    sqrt_bc2 = torch._foreach_pow(beta2, steps)  # -> √(1 − β2^t)
    torch._foreach_sub_(step_sizes, 1)
    torch._foreach_sub_(sqrt_bc2, 1)
    torch._foreach_neg_(sqrt_bc2)
    torch._foreach_div_(step_sizes, lr)
    torch._foreach_reciprocal_(step_sizes)
    torch._foreach_sqrt_(sqrt_bc2)
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denom, sqrt_bc2)
    torch._foreach_add_(denom, eps)
    torch._foreach_div_(denom, step_sizes)
    torch._foreach_addcdiv_(params, exp_avgs, denom)


@torch.no_grad()
def lion_foreach_update(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor], *,
                        lr: float, beta1: float, beta2: float, weight_decay: float) -> None:
    """``lion_update`` for many tensors at once, in place: one ``_foreach`` operation per stage
    (5 kernels on CUDA's fast path, 4 without weight decay, whatever the number of tensors);
    on the CPU in float32 / float64 bitwise ``lion_update``'s on each tensor (the same
    operations, per tensor; bfloat16 / float16 there: see ``adamw_foreach_update``).
    Allocates the sign updates of all the tensors at once (one parameter's size each).
    Shapes: ``params[i]``, ``grads[i]``, ``exp_avgs[i]`` of one shape; all of one dtype and device.
    Source: Chen et al., arXiv 2302.06675 (Lion); microsoft/dion ``lion_update``.
    """
    updates = torch._foreach_lerp(exp_avgs, grads, 1 - beta1)
    torch._foreach_sign_(updates)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta2)
    if weight_decay != 0:
        torch._foreach_mul_(params, 1 - lr * weight_decay)
    torch._foreach_add_(params, updates, alpha=-lr)
