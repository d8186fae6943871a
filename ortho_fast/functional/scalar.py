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
    result is bitwise ``torch.optim.AdamW(foreach=False)``'s.
    Shapes: p, grad, exp_avg, exp_avg_sq of one shape and dtype; ``step_t`` a CPU scalar tensor
    (one host read per call, as torch's).
    Source: Loshchilov & Hutter, arXiv 1711.05101, Algorithm 2; torch.optim.AdamW.
    """
    step_t += 1
    if weight_decay != 0:
        p.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
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
