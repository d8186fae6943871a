"""The statistical row of ``check_optimizer`` (``optimizer_mean_deviation``): J same-shape
parameters stepped by the optimizer under test, the update each one received recovered from its
weights, and the per-direction mean over the J matrices of uᵢᵀ Õ vᵢ − f(σ̂ᵢ) against the
threshold of ``ortho_verify.tolerances.statistical`` (the kernel's roundings) plus
``ortho_verify.tolerances.optimizer_statistical`` (the roundings of the momentum, the Nesterov
mix and the weight update around it), at the false-alarm probability of the orthogonalizer rows
(1e-6 per row). docs/verification.md, "Statistical rows of check_optimizer".

One bfloat16 step's window is wide (a singular value of the update anywhere in [0.55, 2.4] for
Keller Jordan's schedule), so a NorMuon run where Muon is declared, a safety factor of 1.01 for
1.02, eps added for clamped, an lr scale off by 2% or a Nesterov mix of the wrong form pass the
per-step rows; each moves every matrix's direction i the same way, and the mean over J matrices
separates it from rounding at a 1/√J smaller threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import ortho_ref

from ..inputs.spectra import matrix_with_spectrum
from ..report.results import CheckResult, measured
from ..tolerances import statistical as stat
from ..tolerances.optimizer_statistical import optimizer_rounding_moments
from .diagnoses import CAUSE_TEXT, lr_scale_pair, map_candidates, momentum_form_candidates, with_cause
from .statistical import worst_direction

__all__ = ["MIN_STATISTICAL_MATRICES", "STATISTICAL_GRADIENT_NORM", "STATISTICAL_MATRICES", "STATISTICAL_SHAPE",
           "STATISTICAL_STEPS", "StatisticalInputs", "optimizer_mean_deviation", "statistical_inputs"]

#: Same-shape parameters added by default to a bfloat16 / float16 run (or a run whose declared
#: Newton–Schulz dtype is one of them): the power table of docs/verification.md is measured with it.
STATISTICAL_MATRICES = 64
#: Fewest matrices ``check_optimizer`` accepts for the statistical row (a mean over fewer is
#: dominated by its second-order allowance).
MIN_STATISTICAL_MATRICES = 8
#: Their shape: tall (NorMuon's per-row rescale and the lr scales differ most on tall matrices),
#: the shape of the orthogonalizer rows' batches.
STATISTICAL_SHAPE = (40, 24)
#: ‖G‖_F of their gradients: small enough that eps = 1e-7 is ≳ 1% of s‖U‖_F with EMA momentum
#: (eps added vs clamped then moves every direction), far above underflow in bfloat16.
STATISTICAL_GRADIENT_NORM = 1e-5
#: Steps with gradients for them; the row measures the last (step 2: the momentum and the
#: Nesterov mix are non-trivial, so their form matters; step 1 from M = 0 makes U a multiple of G).
STATISTICAL_STEPS = 2
#: Ratio of the largest to the smallest row scale of their gradients.
STATISTICAL_ROW_SPREAD = 10.0


@dataclass(frozen=True)
class StatisticalInputs:
    """``weights`` (J, m, n) and ``grads`` (STATISTICAL_STEPS, J, m, n) float64, rounded to the
    parameters' dtype; ``provenance`` the call that rebuilds them."""

    weights: np.ndarray
    grads: np.ndarray
    provenance: str


def statistical_inputs(shape, count: int, cond: float, seed: int, dtype: str) -> StatisticalInputs:
    """Weights 0.02·N(0, 1) and ``STATISTICAL_STEPS`` gradients per matrix: singular values
    geomspace(1, 1/cond) with Haar vectors (``numpy.random.default_rng(seed + 2000)``), rows then
    scaled by geomspace(1, 1/``STATISTICAL_ROW_SPREAD``) (neurons of different scales, as in a
    trained network: the rows of the update then differ in norm, which a per-row rescale changes)
    and the whole to ‖G‖_F = ``STATISTICAL_GRADIENT_NORM`` (1 in float16, whose normal range ends
    at 6.1e-5); rounded to ``dtype``. The statistic
    needs no particular distribution: each matrix's singular triplets are computed exactly."""
    import torch

    m, n = shape
    rng = np.random.default_rng(seed + 2000)
    s = np.geomspace(1.0, 1.0 / cond, min(m, n))
    rows = np.geomspace(1.0, 1.0 / STATISTICAL_ROW_SPREAD, m)[:, None]
    weights = 0.02 * rng.standard_normal((count, m, n))

    def grad():
        g = rows * matrix_with_spectrum(s, m, n, rng)
        return g * (norm / np.linalg.norm(g))

    # float16: ‖G‖_F = 1e-5 puts entries below its normal range (the model assumes no underflow)
    norm = 1.0 if dtype == "float16" else STATISTICAL_GRADIENT_NORM

    grads = np.stack([np.stack([grad() for _ in range(count)]) for _ in range(STATISTICAL_STEPS)])
    tdt = getattr(torch, dtype)

    def rounded(a):
        return torch.from_numpy(a).to(tdt).double().numpy()

    return StatisticalInputs(rounded(weights), rounded(grads),
                             f"ortho_verify.checks.optimizer_statistics.statistical_inputs({tuple(shape)}, {count}, "
                             f"{cond!r}, {seed}, {dtype!r})")


def optimizer_mean_deviation(conv, *, weights: np.ndarray, momenta: np.ndarray, grads: np.ndarray,
                             new_weights: np.ndarray, new_momenta: np.ndarray | None, lr: float, mu: float, wd: float,
                             table, safety: float, eps: float, param_dtype: str, ns_dtype: str, input_name: str,
                             probability: float = stat.FALSE_ALARM_PROBABILITY, step_index: int | None = None
                             ) -> CheckResult:
    """The row ``optimizer_mean_deviation`` of one step of J parameters (``conv``: MuonConventions
    without pipeline stages or cautious weight decay). Per matrix j the reference
    ``ortho_ref.muon_step`` from (weights, momenta, grads)[j] gives U and the lr scale s; the
    measured update Õ = (W(1 − lr·wd) − W_new)/(lr·s); dᵢⱼ = uᵢᵀÕvᵢ − f(σ̂ᵢⱼ). Threshold per
    direction: ``ns_mean_deviation_tolerances`` of the kernel's variance proxies in ``ns_dtype``
    (``ns_rounding_moments``) plus ``optimizer_rounding_moments`` (momentum, mix and weight
    roundings in ``param_dtype``), the second-order bias bounds and the oracle's allowance added.
    Directions outside the first-order regime (one-matrix √v > ``STATISTIC_FIRST_ORDER_LIMIT``)
    are left out; none left: no claim. Error: |mean dᵢ| of the direction with the largest ratio.
    ``step_index``: the 1-based step t, which a bias-corrected momentum (``conv.bias_correction``)
    needs; its mix terms are then c = 1/(1−μ^t) ≥ 1 times larger (the momentum term's
    1/(1−μ^(t+1)) is smaller) and so are their roundings.
    Shapes: (J, m, n) float64 each. ``ns_dtype`` outside ``STATISTICAL_DTYPES`` (float64): no claim.
    """
    check = "optimizer_mean_deviation"
    J, m, n = weights.shape
    detail = f"update of {J} {m}x{n} parameters, step from their own state ({ns_dtype} Newton-Schulz)"
    if ns_dtype not in stat.STATISTICAL_DTYPES:
        return measured(check, input_name, detail, 0.0, math.inf,
                        f"no claim: the statistical model covers {stat.STATISTICAL_DTYPES}", informative=False,
                        extra={"supplementary": True})
    k = min(m, n)
    refs = [ortho_ref.muon_step(w, g, mp, lr=lr, mu=mu, nesterov=conv.nesterov, momentum_style=conv.momentum_style,
                                coefficients=table, safety=safety, eps=eps, eps_mode=conv.eps_mode,
                                adjust_lr=conv.adjust_lr, weight_decay=wd, extra_scale_factor=conv.extra_scale_factor,
                                nesterov_form=conv.nesterov_form, weight_decay_style=conv.weight_decay_style,
                                bias_correction=conv.bias_correction, step=step_index)
            for w, g, mp in zip(weights, grads, momenta)]
    step = lr * refs[0].lr_scale
    factor = ortho_ref.muon.decay_factor(conv.weight_decay_style, lr=lr, weight_decay=wd, scale=refs[0].lr_scale)
    measured_update = (weights * factor - new_weights) / step
    if conv.weight_decay_style == "l2":  # the gradient the momentum sees
        grads = grads + wd * weights
    if not np.all(np.isfinite(measured_update)):
        return measured(check, input_name, detail, math.inf, 0.0, "the update has NaN or Inf")
    ns_in = np.stack([r.ns_input for r in refs])
    us, ss, vts = np.linalg.svd(ns_in, full_matrices=False)
    us, vs = us[..., :k], np.swapaxes(vts[..., :k, :], -1, -2)
    sigma_hat = np.stack([ortho_ref.normalized_singular_values(a, safety=safety, eps=eps, eps_mode=conv.eps_mode)
                          for a in ns_in])
    d = np.einsum("jpi,jpq,jqi->ji", us, measured_update, vs) - ortho_ref.ns_polynomial(sigma_hat, table)
    var, bias = stat.ns_rounding_moments(sigma_hat, us, vs, table, ns_dtype)
    m_new = np.stack([r.momentum for r in refs]) if new_momenta is None else new_momenta
    w_mix = mu if conv.nesterov else 1.0
    if conv.bias_correction:  # every mix term divided by at most 1 − μ^t
        w_mix /= 1.0 - mu ** step_index
    inputs2 = 2.0 * (w_mix ** 2 * (m_new ** 2 + (mu * momenta) ** 2 + grads ** 2) + ns_in ** 2)
    o_ref = np.stack([r.update for r in refs])
    weights2 = weights ** 2 + new_weights ** 2 + 2.0 * (step * o_ref) ** 2
    var_o, bias_o = optimizer_rounding_moments(sigma_hat, us, vs, table, ns_input=ns_in, safety=safety,
                                               input_magnitudes=inputs2, weight_magnitudes=weights2, step=step,
                                               state_dtype=param_dtype, ns_dtype=ns_dtype)
    var = var + var_o
    allow = stat.oracle_deviation_allowance(sigma_hat, (m, n), table) + bias + bias_o
    worst = worst_direction(check, input_name, detail, d, sigma_hat, var, allow, probability, supplementary=True,
                            record_directions=True)
    row, kept, thresholds = worst.row, worst.kept, worst.thresholds
    if row.passed:
        return row
    cause = _statistical_cause(conv, d_mean=d.mean(axis=0), kept=kept, thresholds=thresholds, weights=weights,
                               momenta=momenta, grads=grads, measured_update=measured_update, table=table,
                               safety=safety, eps=eps, mu=mu, sigma_hat=sigma_hat.mean(axis=0), shape=(m, n),
                               declared_in=ns_in, step_index=step_index)
    return with_cause(row, cause)


def _mean_deviation(update: np.ndarray, ns_in: np.ndarray, table, *, safety: float, eps: float, eps_mode: str
                    ) -> np.ndarray:
    """Per direction the mean over the matrices of uᵢᵀ·update·vᵢ − f(σ̂ᵢ), U's exact triplets. (k,)"""
    k = min(ns_in.shape[-2:])
    us, _, vts = np.linalg.svd(ns_in, full_matrices=False)
    sig = np.stack([ortho_ref.normalized_singular_values(a, safety=safety, eps=eps, eps_mode=eps_mode) for a in ns_in])
    return (np.einsum("jpi,jpq,jiq->ji", us[..., :k], update, vts[..., :k, :])
            - ortho_ref.ns_polynomial(sig, table)).mean(axis=0)


def _statistical_cause(conv, *, d_mean, kept, thresholds, weights, momenta, grads, measured_update, table, safety, eps,
                       mu, sigma_hat, shape, declared_in=None, step_index=None) -> str:
    """One cause of a failing ``optimizer_mean_deviation`` row, ranked by how much of the
    deviation each candidate leaves (max over the tested directions of |mean deviation| /
    threshold after it; the row failed because the declared form leaves > 1):
    replays — every momentum form of ``momentum_form_candidates`` through the declared map, and a
    per-row rescale of the update (NorMuon's, rows to equal RMS, norm restored) undone — and
    one-parameter fits of the mean deviation (``map_candidates``: output scale = lr scale, with
    the one pair of known lr scales it matches; normalization scale = safety / eps; a coefficient).
    The candidate that leaves the least is named when it leaves ≤ 1 (within the statistics) or
    less than a quarter of the declared form's; otherwise the deviation is described without a cause.
    ``declared_in``: the declared Newton–Schulz inputs (J, m, n) when the caller has them (a
    bias-corrected momentum needs the step index to rebuild them); None: rebuilt here."""
    from scipy.optimize import minimize_scalar

    def left(dev):  # (sum of squared ratios: the ranking; max ratio: whether it is explained)
        r = np.abs(dev[kept]) / thresholds
        return float(np.sum(r * r)), float(np.max(r))

    base = left(d_mean)
    scores = []  # (sum of squares, max ratio, text, group)
    declared_in = _ns_inputs(conv, weights, momenta, grads, mu) if declared_in is None else declared_in
    forms = dict(mu=mu, table=table, safety=safety, eps=eps, step=step_index)
    for label, _ in momentum_form_candidates(conv, grads[0], momenta[0], **forms):
        ns_alt = np.stack([dict(momentum_form_candidates(conv, g, mp, **forms))[label]
                           for g, mp in zip(grads, momenta)])
        scores.append((*left(_mean_deviation(measured_update, ns_alt, table, safety=safety, eps=eps,
                                             eps_mode=conv.eps_mode)), f"the update matches {label}", label))
    other = "add" if conv.eps_mode == "clamp" else "clamp"
    scores.append((*left(_mean_deviation(measured_update, declared_in, table, safety=safety, eps=eps, eps_mode=other)),
                   f"eps_mode {other!r} (the norm {'plus' if other == 'add' else 'clamped at'} eps = {eps:g}) where "
                   f"{conv.eps_mode!r} is declared", "eps"))
    # a per-row rescale undone: the measured update's rows rescaled back to the reference's row norms
    refs = np.stack([ortho_ref.ns_map(u, table, safety=safety, eps=eps, eps_mode=conv.eps_mode) for u in declared_in])
    rows_ref = np.linalg.norm(refs, axis=-1, keepdims=True)
    rows_meas = np.linalg.norm(measured_update, axis=-1, keepdims=True)
    undone = measured_update * np.where(rows_meas > 0, rows_ref / np.where(rows_meas > 0, rows_meas, 1), 1)
    spread = float(np.mean(np.std(rows_meas / np.maximum(rows_ref, 1e-300), axis=-2)))
    scores.append((*left(_mean_deviation(undone, declared_in, table, safety=safety, eps=eps, eps_mode=conv.eps_mode)),
                   f"a per-row rescale of the update after Newton–Schulz (NorMuon's normalization; the rows' norms "
                   f"differ from the declared update's by {100 * spread:.1f}% on average) where plain Muon is declared",
                   "rows"))
    x = sigma_hat[kept]
    for name, g in map_candidates(x, table).items():
        res = minimize_scalar(lambda e: float(np.sum(((d_mean[kept] - g(e)) / thresholds) ** 2)), bounds=(-0.2, 0.2),
                              method="bounded", options={"xatol": 1e-7})
        e = float(res.x)
        after = d_mean.copy()
        after[kept] = d_mean[kept] - g(e)
        if name == "output":
            pair = lr_scale_pair(1 + e, *shape, within=0.005)
            text = CAUSE_TEXT["output"].format(f=1 + e) + (f": matches the lr scale {pair}" if pair else "")
        elif name == "normalization":
            text = CAUSE_TEXT["normalization"].format(f=1 + e)
        else:
            text = f"Newton–Schulz coefficient {name} x{1 + e:.4g} in every step (another schedule or a typo)"
        scores.append((*left(after), text, "coefficient" if name in "abc" else name))
    scores.sort(key=lambda t: t[0])
    chi, worst, text, group = scores[0]
    if group == "coefficient":  # one cause: a coefficient; which one only when the fit separates them
        rivals = [t for t in scores[1:] if t[3] == "coefficient"]
        if rivals and rivals[0][0] < 4 * chi:
            text = ("a Newton–Schulz coefficient differs from the declared schedule (a, b and c fit alike within "
                    f"the statistics; best: {text.split(' in every')[0].removeprefix('Newton–Schulz ')})")
    runner = next((t for t in scores[1:] if t[3] != group), None)
    separated = runner is None or runner[0] >= 2 * chi
    if worst <= 1 or chi < 0.25 * base[0]:
        rest = "" if separated else f"; {runner[2].split(' (')[0]} fits nearly as well"
        return f"{text} (leaves {worst:.2g} of the threshold; the declared form leaves {base[1]:.2g}{rest})"
    return (f"a systematic deviation of the update beyond rounding that no known form explains (the closest, "
            f"{text.split(' (')[0]}, leaves {worst:.2g} of the threshold)")


def _ns_inputs(conv, weights, momenta, grads, mu) -> np.ndarray:
    """The declared Newton–Schulz inputs U of every matrix (J, m, n)."""
    return np.stack([ortho_ref.muon.momentum_update(g, mp, mu=mu, nesterov=conv.nesterov,
                                                    momentum_style=conv.momentum_style,
                                                    nesterov_form=conv.nesterov_form)[1]
                     for g, mp in zip(grads, momenta)])
