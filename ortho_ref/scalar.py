"""Reference AdamW and Lion steps (float64, any shape, pure functions; numpy only).

The element-wise optimizers that Muon and Dion hand embeddings, norms, biases and the
output head to. Each function returns new arrays and never mutates its inputs.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._validate import as_like, check_scalar


def _as_array(a, name: str) -> np.ndarray:
    """``a`` as a finite float64 array of its own shape (0-D included), or raise."""
    return as_like(a, name, np.shape(a))


def _betas(betas) -> tuple[float, float]:
    try:
        b1, b2 = betas
    except (TypeError, ValueError):
        raise ValueError(f"betas: expected a pair (beta1, beta2), got {betas!r}") from None
    return (check_scalar(b1, "betas[0]", low=0.0, high=1.0), check_scalar(b2, "betas[1]", low=0.0, high=1.0))


class AdamWStep(NamedTuple):
    """Result of ``adamw_step``: the new state and the update direction, all float64.

    Parameters
    ----------
    weight : float64 ndarray, shape of the weight
        W after the step.
    exp_avg : float64 ndarray, shape of the weight
        The first moment m after the step.
    exp_avg_sq : float64 ndarray, shape of the weight
        The second moment v after the step, in squared gradient units.
    step : int
        t, the number of steps taken including this one.
    update : float64 ndarray, shape of the weight
        The direction m̂ / (√v̂ + eps) that was multiplied by lr.

    See Also
    --------
    adamw_step : The step that returns it.

    Examples
    --------
    >>> from ortho_ref import adamw_step
    >>> out = adamw_step(1.0, 0.5, 0.0, 0.0, 0, lr=0.1, weight_decay=0.0)
    >>> out._fields
    ('weight', 'exp_avg', 'exp_avg_sq', 'step', 'update')
    """

    weight: np.ndarray
    exp_avg: np.ndarray
    exp_avg_sq: np.ndarray
    step: int
    update: np.ndarray


def adamw_step(
    weight,
    grad,
    exp_avg,
    exp_avg_sq,
    step: int,
    *,
    lr: float,
    betas=(0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
) -> AdamWStep:
    """One reference AdamW step (decoupled weight decay), bias-corrected as ``torch.optim.AdamW``.

    With t = step + 1::

        m ← β1·m + (1 − β1)·g,        v ← β2·v + (1 − β2)·g²,
        m̂ = m / (1 − β1ᵗ),            √v̂ = √v / √(1 − β2ᵗ),
        W ← W·(1 − lr·weight_decay) − lr·m̂ / (√v̂ + eps).

    eps is added to the bias-corrected √v̂ (torch). With eps = 0 a coordinate with m = v = 0 gets
    update 0 (the limit eps → 0; torch gives NaN). The inputs are not modified.

    Parameters
    ----------
    weight : array_like of float, any shape (0-D included)
        W before the step.
    grad : array_like of float, shape of `weight`
        The gradient g.
    exp_avg : array_like of float, shape of `weight`
        The first moment m before the step (zeros for fresh state).
    exp_avg_sq : array_like of float, shape of `weight`
        The second moment v before the step, >= 0 (zeros for fresh state).
    step : int
        The number of steps already taken, >= 0 (torch's ``state["step"]`` before the call).
    lr : float
        The learning rate, >= 0.
    betas : tuple of float, default (0.9, 0.999)
        (β1, β2), each in [0, 1).
    eps : float, default 1e-8
        Added to √v̂, in gradient units; >= 0.
    weight_decay : float, default 1e-2
        Decoupled decay, multiplied by lr; >= 0.

    Returns
    -------
    AdamWStep
        ``(weight, exp_avg, exp_avg_sq, step, update)``: the new state (float64, shape of `weight`),
        t, and the direction m̂ / (√v̂ + eps).

    Raises
    ------
    TypeError
        If an array has a non-float dtype.
    ValueError
        If a shape differs from `weight`'s, an array holds NaN or Inf, `exp_avg_sq` is negative,
        `step` is not an integer >= 0, `lr`, `eps` or `weight_decay` is negative, or `betas` is not a
        pair in [0, 1).

    References
    ----------
    I. Loshchilov, F. Hutter, "Decoupled Weight Decay Regularization", ICLR 2019, arXiv 1711.05101,
    Algorithm 2; ``torch.optim.AdamW`` (``_single_tensor_adam``), whose defaults these are.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import adamw_step
    >>> out = adamw_step(np.ones(2), np.array([0.5, -2.0]), np.zeros(2), np.zeros(2), 0, lr=0.1,
    ...                  eps=0.0, weight_decay=0.0)
    >>> out.update.tolist(), out.weight.tolist(), out.step
    ([1.0, -1.0], [0.9, 1.1], 1)
    """
    w = _as_array(weight, "weight")
    g = as_like(grad, "grad", w.shape)
    m = as_like(exp_avg, "exp_avg", w.shape)
    v = as_like(exp_avg_sq, "exp_avg_sq", w.shape)
    if np.any(v < 0):
        raise ValueError("exp_avg_sq: expected non-negative values (a running mean of squared gradients)")
    if isinstance(step, bool) or int(step) != step or step < 0:
        raise ValueError(f"step: expected an integer >= 0 (steps already taken), got {step!r}")
    lr = check_scalar(lr, "lr", low=0.0)
    eps = check_scalar(eps, "eps", low=0.0)
    weight_decay = check_scalar(weight_decay, "weight_decay", low=0.0)
    b1, b2 = _betas(betas)
    if b1 == 1.0 or b2 == 1.0:
        raise ValueError(f"betas: expected values in [0, 1), got {betas!r}")

    t = int(step) + 1
    m_new = b1 * m + (1.0 - b1) * g
    v_new = b2 * v + (1.0 - b2) * g * g
    denom = np.sqrt(v_new) / np.sqrt(1.0 - b2**t) + eps
    update = _safe_ratio(m_new / (1.0 - b1**t), denom)
    w_new = w * (1.0 - lr * weight_decay) - lr * update
    return AdamWStep(w_new, m_new, v_new, t, update)


def _safe_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den with 0 / 0 := 0 (eps = 0 and a coordinate whose gradients were all zero)."""
    out = np.zeros_like(num)
    np.divide(num, den, out=out, where=den > 0)
    return out


class LionStep(NamedTuple):
    """Result of ``lion_step``: the new state, the update and the interpolation it is the sign of.

    Parameters
    ----------
    weight : float64 ndarray, shape of the weight
        W after the step.
    exp_avg : float64 ndarray, shape of the weight
        The momentum m after the step.
    update : float64 ndarray, shape of the weight
        sign(c) ∈ {−1, 0, +1} (sign(0) = 0), the direction multiplied by lr.
    interpolated : float64 ndarray, shape of the weight
        c = β1·m + (1 − β1)·g, with m before the step.

    See Also
    --------
    lion_step : The step that returns it.

    Examples
    --------
    >>> from ortho_ref import lion_step
    >>> lion_step(1.0, 0.5, 0.0, lr=0.1)._fields
    ('weight', 'exp_avg', 'update', 'interpolated')
    """

    weight: np.ndarray
    exp_avg: np.ndarray
    update: np.ndarray
    interpolated: np.ndarray


def lion_step(weight, grad, exp_avg, *, lr: float, betas=(0.9, 0.99), weight_decay: float = 0.0) -> LionStep:
    """One reference Lion step (evoLved sIgn mOmeNtum).

    ::

        c = β1·m + (1 − β1)·g,    W ← W·(1 − lr·weight_decay) − lr·sign(c),
        m ← β2·m + (1 − β2)·g.

    The inputs are not modified.

    Parameters
    ----------
    weight : array_like of float, any shape (0-D included)
        W before the step.
    grad : array_like of float, shape of `weight`
        The gradient g.
    exp_avg : array_like of float, shape of `weight`
        The momentum m before the step (zeros for fresh state).
    lr : float
        The learning rate, >= 0, in the units of `weight` (the update has entries ±1, 0).
    betas : tuple of float, default (0.9, 0.99)
        (β1, β2), each in [0, 1]; the paper's and lucidrains/lion-pytorch's default (Megatron uses
        (0.95, 0.98)).
    weight_decay : float, default 0.0
        Decoupled decay, multiplied by lr; >= 0.

    Returns
    -------
    LionStep
        ``(weight, exp_avg, update, interpolated)``, float64 arrays of the shape of `weight`.

    Raises
    ------
    TypeError
        If an array has a non-float dtype.
    ValueError
        If a shape differs from `weight`'s, an array holds NaN or Inf, `lr` or `weight_decay` is
        negative, or `betas` is not a pair in [0, 1].

    References
    ----------
    X. Chen et al., "Symbolic Discovery of Optimization Algorithms", NeurIPS 2023, arXiv 2302.06675,
    Algorithm 2; microsoft/dion ``lion_update``.

    Examples
    --------
    >>> import numpy as np
    >>> from ortho_ref import lion_step
    >>> out = lion_step(np.ones(3), np.array([2.0, -0.5, 0.0]), np.zeros(3), lr=0.1)
    >>> out.update.tolist(), out.weight.tolist()
    ([1.0, -1.0, 0.0], [0.9, 1.1, 1.0])
    >>> bool(np.allclose(out.exp_avg, [0.02, -0.005, 0.0]))
    True
    """
    w = _as_array(weight, "weight")
    g = as_like(grad, "grad", w.shape)
    m = as_like(exp_avg, "exp_avg", w.shape)
    lr = check_scalar(lr, "lr", low=0.0)
    weight_decay = check_scalar(weight_decay, "weight_decay", low=0.0)
    b1, b2 = _betas(betas)
    c = b1 * m + (1.0 - b1) * g
    update = np.sign(c)
    w_new = w * (1.0 - lr * weight_decay) - lr * update
    return LionStep(w_new, b2 * m + (1.0 - b2) * g, update, c)
