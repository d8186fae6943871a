"""Muon tolerances: the weight and momentum after one fast step vs ``ortho_ref.muon_step``, cautious
weight decay, and bitwise parity with ``torch.optim.Muon`` (docs/tolerances.md).
"""

from __future__ import annotations

import numpy as np

from .roundoff import U64, unit_roundoff

__all__ = ["TORCH_MUON_TOLERANCE", "WEIGHT_DECAY_POWER_LIMIT", "cautious_weight_decay_tolerance", "momentum_tolerance",
           "muon_tolerance", "weight_decay_power", "weight_decay_tolerance"]


def muon_tolerance(ns_tol: float, lr_scale: float, lr: float, weight_norm: float, update_norm: float, dtype) -> float:
    """Frobenius tolerance for the weight after one fast Muon step vs ``ortho_ref.muon_step``.

    W_new = W(1 − lr·wd) − lr·s·O: the orthogonalized update's error enters scaled by lr·s
    (``ns_tol`` from ``ns_tolerance`` at the momentum-mixed input U, which already counts the
    input rounding of U); the two elementwise operations on W (scale, subtract) and the
    rounding of W and O to the parameter dtype add at most 2u(‖W‖_F + lr·s‖O‖_F) each way.
    """
    u = unit_roundoff(dtype)
    return lr * lr_scale * ns_tol + 4 * (u + U64) * (weight_norm + lr * lr_scale * update_norm)


def momentum_tolerance(grad_norm: float, momentum_norm: float, dtype) -> float:
    """Frobenius tolerance for a momentum buffer after μM + cG (or lerp): each entry is two
    products and a sum of numbers bounded by |M| and |G|, so ≤ 3u(‖M‖_F + ‖G‖_F), doubled for
    the rounding of the inputs to the parameter dtype."""
    u = unit_roundoff(dtype)
    return 6 * (u + U64) * (grad_norm + momentum_norm)


#: fast Muon with ``eps_mode="clamp"`` runs the same torch operations, in the same order and
#: dtype, as torch.optim.Muon (``addmm`` steps, bf16 norm and clamp, lerp momentum), so on one
#: backend the results are bitwise equal: tolerance 0 in max |ΔW|.
TORCH_MUON_TOLERANCE = 0.0


def cautious_weight_decay_tolerance(weight: np.ndarray, update_ref: np.ndarray, ns_tol: float, lr: float,
                                    weight_decay: float) -> float:
    """Extra Frobenius tolerance for the weight of a Muon step with cautious weight decay,
    added to ``muon_tolerance`` (float32 / float64 compute).

        lr · weight_decay · ‖W ⊙ 1{|O_ref| ≤ ns_tol}‖_F

    Derivation. Cautious weight decay (Chen et al. 2025, arXiv 2510.12402) decays entry (i, j)
    only where sign(O_ij)·sign(W_ij) ≥ 0; both sides use the same W (the weight before the
    step) and exact sign tests, so the masks can differ only where the fast update O_fast and
    the reference O_ref have different signs (rounding O to the parameter dtype keeps the sign
    or gives 0, which decays like the ≥). That needs |O_ref,ij| ≤ |O_fast,ij − O_ref,ij| ≤
    ‖O_fast − O_ref‖_F ≤ ns_tol (``ns_tolerance`` at the momentum-mixed input). On such an
    entry the two weights differ by the decay lr·wd·|W_ij| in addition to the rounding that
    ``muon_tolerance`` bounds; elsewhere the masks agree and ``muon_tolerance`` applies as for
    decoupled decay. The set is usually empty (the term is then 0 and the check is as sharp as
    for decoupled decay).
    Shapes: weight, update_ref (m, n) float64 -> float.
    """
    w = np.asarray(weight, dtype=np.float64)
    ambiguous = np.abs(np.asarray(update_ref, dtype=np.float64)) <= ns_tol
    return lr * weight_decay * float(np.linalg.norm(np.where(ambiguous, w, 0.0)))


#: The weight-decay row makes a claim only where it detects a decay error of at most this fraction of
#: the declared lr·wd: a quarter tells the decay applied twice (1), not at all (1), with the update's
#: lr multiplier s instead of 1 (s − 1 >= 0.39 on the probe's 48×12 shape for every adjust_lr mode
#: but None) and the l2 coupling (1) apart from the declared one.
WEIGHT_DECAY_POWER_LIMIT = 0.25


def weight_decay_tolerance(weight_norm: float, dtype) -> float:
    """Frobenius tolerance of ``muon_weight_decay``: W_new against d·W after a step with a zero
    gradient from a zero momentum (d = ``ortho_ref.muon.decay_factor`` of the declared style).

        4 (u + u64) ‖W‖_F

    Derivation. With G = 0 and M = 0 the Newton–Schulz input is U = 0 and its output is exactly 0
    (0 / (s‖0‖ + eps) and 0 / max(0, eps) are 0, a polynomial without constant term keeps 0), so the
    step is the decay alone. Whether written W·d or W − (lr·wd)·W, each entry is at most two
    roundings away from d·W_ij (the product, the difference; |d| <= 1): 2u|W_ij|; the roundings of the
    scalar d (or lr·wd) add u|W_ij| more, and the float64 reference u64. Doubled for margin as
    ``muon_tolerance`` (one more rounding if the step adds a zero update).
    """
    return 4 * (unit_roundoff(dtype) + U64) * float(weight_norm)


def weight_decay_power(lr: float, weight_decay: float, dtype) -> float:
    """The smallest decay error the ``muon_weight_decay`` row detects, as a fraction of lr·wd.

        δ_min = 4 (u + u64) / (lr·wd)

    A decay factor d' is told from the declared d when |d' − d|·‖W‖_F exceeds
    ``weight_decay_tolerance`` (4(u + u64)‖W‖_F), i.e. |d' − d| > 4(u + u64); errors of the decay
    come as multiples of lr·wd (twice: lr·wd; with s·lr: (s − 1)·lr·wd; coupled L2: lr·wd), so
    δ_min is the power in those units, independent of ‖W‖. float32, lr = 0.02, wd = 0.1: 1.2e-4;
    bfloat16: 7.8 (a bfloat16 weight cannot hold a 0.2 % decay: the row makes no claim there).
    Returns inf for lr·wd = 0 (nothing to detect).
    """
    scale = float(lr) * float(weight_decay)
    return float("inf") if scale <= 0 else 4 * (unit_roundoff(dtype) + U64) / scale
