"""The statistical check of a low-precision Newton–Schulz kernel (bfloat16, float16, float32):
the mean signed deviation of uᵢᵀ X vᵢ from f(σ̂ᵢ) over many matrices of one spectrum, per
direction, against ``ortho_verify.tolerances.statistical`` (false-alarm probability ≤ 1e-6 per
check; docs/tolerances.md, "Statistical checks of low-precision kernels").

A per-direction worst-case bound must hold for every rounding pattern and is as wide as the
largest first-order gain allows; a systematic error (a coefficient off by 0.5%, a safety factor
of 1.01 declared as 1.02, eps added where the kernel clamps) moves every matrix's direction i the
same way, while rounding moves it by a mean-zero amount, so the mean over J independent
matrices separates the two at a 1/√J smaller threshold. docs/verification.md, "Statistical
power in low precision".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import ortho_ref

from ..inputs.spectra import matrix_with_spectrum
from ..report.results import CheckResult, measured
from ..tolerances import NS_FORMS, statistical as stat
from ..tolerances.gram_statistical import gram_rounding_moments
from .diagnoses import map_fit_cause, ns_output_cause, with_cause

__all__ = ["CLI_QUICK_STATISTICAL_SCHEDULES", "CLI_STATISTICAL_MATRICES", "STATISTICAL_SPECS", "StatisticalBatch",
           "check_ns_statistics",
           "compare_ns_statistics", "statistical_batch", "statistical_batches"]


@dataclass(frozen=True, eq=False)
class StatisticalBatch:
    """J matrices with one prescribed spectrum and independent Haar singular vectors.

    Attributes: ``matrices`` (J, m, n) float64, the values as the kernel's input dtype holds them;
    ``name`` an identifier; ``provenance`` the call that rebuilds it (``statistical_batch``)."""

    matrices: np.ndarray
    name: str
    provenance: str


#: (log_cond, shape, ‖G‖_F, J) of the default statistical batches of ``check_orthogonalizer``:
#: a geometric spectrum σ ∈ [0.1, 1]·c (every direction in the first-order regime in bfloat16),
#: tall, at scale 1 and at ‖G‖_F = 1.6e-5 (where eps = 1e-7 is a 0.6% scale: eps added vs
#: clamped), 256 matrices each (the power table of docs/verification.md is measured with these).
STATISTICAL_SPECS = ((1.0, (40, 24), None, 256), (1.0, (40, 24), 1.6e-5, 256))


def statistical_batch(log_cond: float, shape: tuple[int, int], norm: float | None, count: int, dtype: str,
                      seed: int = 0) -> StatisticalBatch:
    """``count`` matrices of ``shape`` with singular values geomspace(1, 10^−log_cond, k) (scaled to
    Frobenius norm ``norm`` when given), Haar vectors from ``numpy.random.default_rng(seed)`` in
    order, rounded to ``dtype`` ("bfloat16", "float16", "float32", "float64") as the kernel gets them.
    Raises: ValueError for count < 1, a bad shape or norm."""
    import torch

    m, n = shape
    if count < 1 or m < 1 or n < 1:
        raise ValueError(f"count, shape: expected count >= 1 and a shape of positive dims, got {count}, {shape}")
    if norm is not None and not (norm > 0 and math.isfinite(norm)):
        raise ValueError(f"norm: expected a finite positive number or None, got {norm!r}")
    s = np.geomspace(1.0, 10.0 ** -log_cond, min(m, n))
    if norm is not None:
        s = s * (norm / np.linalg.norm(s))
    rng = np.random.default_rng(seed)
    mats = np.stack([matrix_with_spectrum(s, m, n, rng) for _ in range(count)])
    rounded = torch.from_numpy(mats).to(getattr(torch, dtype)).double().numpy()
    scale = "" if norm is None else f"/norm {norm:.1e}"
    return StatisticalBatch(rounded, f"statistical/geometric {log_cond:g}/{shape}{scale}/{count} matrices/seed {seed}",
                            f"ortho_verify.checks.statistical.statistical_batch({log_cond!r}, {tuple(shape)!r}, "
                            f"{norm!r}, {count}, {dtype!r}, seed={seed})")


def statistical_batches(dtype: str, seed: int = 0) -> list[StatisticalBatch]:
    """The batches of ``STATISTICAL_SPECS`` for a dtype; batch i is drawn with seed ``seed + 1000 + i``
    (apart from the default examples' seeds)."""
    return [statistical_batch(lc, shape, norm, count, dtype, seed + 1000 + i)
            for i, (lc, shape, norm, count) in enumerate(STATISTICAL_SPECS)]


@dataclass(frozen=True)
class WorstDirection:
    """The verdict of a per-direction mean-deviation test (``worst_direction``): its ``row``;
    ``kept`` (k,) bool, the directions in the first-order regime; their ``thresholds`` and
    ``means`` (None when none is kept: the row then makes no claim); ``index`` the direction
    (0-based, of k) with the largest |mean| / threshold and ``mean`` its mean deviation, None when
    none is kept."""

    row: CheckResult
    kept: np.ndarray
    thresholds: np.ndarray | None = None
    means: np.ndarray | None = None
    index: int | None = None
    mean: float | None = None


def worst_direction(check: str, input_name: str, detail: str, d: np.ndarray, sigmas: np.ndarray, var: np.ndarray,
                    allow: np.ndarray, probability: float, *, supplementary: bool = False,
                    record_directions: bool = False) -> WorstDirection:
    """The row of a per-direction mean deviation over J matrices: d (J, k) the deviations
    uᵢᵀ·X·vᵢ − f(σ̂ᵢ), sigmas (J, k) the σ̂ᵢ, var (J, k) / allow (J, k) the rounding variance proxies
    and the allowances (bias bounds, the oracle's). Directions with one-matrix √v above
    ``STATISTIC_FIRST_ORDER_LIMIT`` are left out (none left: a no-claim row); the others get
    ``ns_mean_deviation_tolerances`` at false-alarm ``probability``, and the row's error / tolerance
    are |mean| and the threshold of the direction with the largest ratio. ``supplementary``: the
    no-claim row says so in its extra; ``record_directions``: the row's extra holds the mean
    deviation and σ̂ per direction and ``kept``. Used by ``compare_ns_statistics`` and
    ``ortho_verify.checks.optimizer_statistics``."""
    kept = np.sqrt(var.max(axis=0)) <= stat.STATISTIC_FIRST_ORDER_LIMIT
    if not kept.any():
        return WorstDirection(measured(check, input_name, detail, 0.0, math.inf,
                                       "no claim: no direction in the first-order regime (one-matrix sqrt(v) > "
                                       f"{stat.STATISTIC_FIRST_ORDER_LIMIT})", informative=False,
                                       extra={"supplementary": True} if supplementary else None), kept)
    thresholds = stat.ns_mean_deviation_tolerances(var[:, kept], allow[:, kept], probability)
    means = d[:, kept].mean(axis=0)
    i = int(np.argmax(np.abs(means) / thresholds))
    index = int(np.flatnonzero(kept)[i])
    lam = stat.hoeffding_lambda(probability, int(kept.sum()))
    extra = {"mean_deviation": d.mean(axis=0).tolist(), "sigma_hat": sigmas.mean(axis=0).tolist(),
             "kept": kept.tolist()} if record_directions else None
    row = measured(check, input_name, f"{detail} (mean over {len(d)} matrices, worst direction)",
                   abs(float(means[i])), float(thresholds[i]),
                   f"direction {index + 1} of {d.shape[1]} (sigma_hat {float(np.mean(sigmas[:, index])):.3g}): "
                   f"mean deviation {float(means[i]):+.3g}, std {float(d[:, index].std()):.3g} per matrix; "
                   f"{int(kept.sum())} directions tested, lambda {lam:.2f} (false alarm <= {probability:g})",
                   extra=extra)
    return WorstDirection(row, kept, thresholds, means, index, float(means[i]))


def compare_ns_statistics(fast: np.ndarray, inputs: np.ndarray, table, *, safety: float, eps: float, dtype: str,
                          input_name: str, detail: str, eps_mode: str = "add",
                          probability: float = stat.FALSE_ALARM_PROBABILITY, form: str = "standard",
                          restarts=()) -> CheckResult:
    """The row ``ns_mean_deviation``: per direction i the mean over the J matrices of
    dᵢⱼ = uᵢᵀ X_j vᵢ − f(σ̂ᵢⱼ) (exact singular vectors of input j, f the declared schedule's scalar
    map) against ``ns_mean_deviation_tolerances``: the variance proxies of ``ns_rounding_moments``
    (Bonferroni over the directions tested) plus its second-order bias bounds and the oracle's
    allowance. Directions whose one-matrix proxy standard deviation √vᵢⱼ exceeds
    ``STATISTIC_FIRST_ORDER_LIMIT`` in any matrix are left out (outside the first-order model); a
    row with none left makes no claim. Error: |mean dᵢ| of the direction with the largest ratio.
    ``form="gram"`` with ``restarts`` (0-based steps before which X ← QX, R ← XXᵀ): the kernel is Gram
    Newton–Schulz, whose rounding moments are ``gram_rounding_moments``'s (docs/tolerances.md,
    "Statistical checks of Gram kernels").

    Shapes: fast, inputs (J, m, n) float64 (the kernel's outputs and its inputs as it received
    them); table (T, 3). ``dtype`` in ``STATISTICAL_DTYPES``. A non-finite or mis-shaped ``fast``
    fails with error inf.
    Raises: ValueError for a dtype outside ``STATISTICAL_DTYPES``, a form outside ``NS_FORMS`` or bad
    restarts.
    """
    check = "ns_mean_deviation"
    if form not in NS_FORMS:
        raise ValueError(f"form: expected one of {NS_FORMS}, got {form!r}")
    if dtype not in stat.STATISTICAL_DTYPES:
        raise ValueError(f"dtype: the statistical check covers {stat.STATISTICAL_DTYPES}, got {dtype!r}")
    if fast.shape != inputs.shape:
        return measured(check, input_name, detail, math.inf, 0.0, f"output shape {fast.shape} != input shape "
                        f"{inputs.shape}")
    if not np.all(np.isfinite(fast)):
        j = int(np.flatnonzero(~np.isfinite(fast).reshape(len(fast), -1).all(axis=1))[0])
        cause = ns_output_cause(fast[j], inputs[j], table, safety=safety, eps=eps, eps_mode=eps_mode, tolerance=0.0)
        return with_cause(measured(check, input_name, detail, math.inf, 0.0, "output has NaN or Inf"), cause)
    m, n = inputs.shape[-2:]
    k = min(m, n)
    deviations, sigmas, lefts, rights = [], [], [], []
    for a, x in zip(inputs, fast):
        u, _, vt = ortho_ref.svd(a)
        u, v = u[:, :k], vt[:k].T
        sigma_hat = ortho_ref.normalized_singular_values(a, safety=safety, eps=eps, eps_mode=eps_mode)
        sigmas.append(sigma_hat)
        lefts.append(u)
        rights.append(v)
        deviations.append(np.einsum("pi,pq,qi->i", u, x, v) - ortho_ref.ns_polynomial(sigma_hat, table))
    d, sigmas = np.array(deviations), np.array(sigmas)
    if form == "gram":
        var, bias = gram_rounding_moments(sigmas, np.array(lefts), np.array(rights), table, dtype, restarts)
    else:
        var, bias = stat.ns_rounding_moments(sigmas, np.array(lefts), np.array(rights), table, dtype)
    allow = stat.oracle_deviation_allowance(sigmas, (m, n), table) + bias
    worst = worst_direction(check, input_name, detail, d, sigmas, var, allow, probability)
    row, index = worst.row, worst.index
    if row.passed:
        return row
    # one cause, fitted on the per-direction means (output scale, normalization, a coefficient)
    fitted = map_fit_cause(worst.means, sigmas[:, worst.kept].mean(axis=0), table)
    return with_cause(row, fitted or f"a systematic deviation of direction {index + 1} (sigma_hat "
                           f"{float(np.mean(sigmas[:, index])):.3g}) by {worst.mean:+.3g} on average over {len(d)} "
                           "matrices, beyond what rounding explains; no single known form (output scale, "
                           "normalization, one coefficient) explains the deviations")


#: Matrices per statistical batch in ``ortho-verify`` (bfloat16): fewer than
#: ``check_orthogonalizer``'s 256 to keep the run time (under 1 s per schedule on one core).
CLI_STATISTICAL_MATRICES = {"quick": 32, "default": 64}
#: Schedules with a statistical row in ``ortho-verify --quick`` (the default run has every one).
CLI_QUICK_STATISTICAL_SCHEDULES = ("jordan", "polar_express")


def check_ns_statistics(schedule: str, dtype: str, count: int, seed: int = 0,
                        gram: bool | None = None, device=None) -> list[CheckResult]:
    """``ortho_fast.newton_schulz`` (a registered schedule with its own normalization, computed in
    ``dtype``, ``gram`` its kernel setting) on ``statistical_batch(1.0, (40, 24), None, count, dtype,
    seed)``: the row ``ns_mean_deviation`` (``compare_ns_statistics``). For ``ortho-verify``;
    ``device``: where ``newton_schulz`` runs (None: the CPU; the batch moved there, the result back).
    ``gram=True`` in float16 is judged as what it is, a Gram kernel (``form="gram"``) with ortho_fast's
    restarts (``gram_restarts``), as ``check_newton_schulz`` does; in float32 with the standard model,
    which it meets (the float32 Gram kernel is held to the plain kernel's accuracy).
    Raises: ValueError for a dtype outside the statistical model's, an unknown schedule, or
    ``gram=True`` in bfloat16 (ortho_fast's)."""
    import torch

    import ortho_fast

    sched = ortho_ref.SCHEDULES[schedule]
    batch = statistical_batch(1.0, (40, 24), None, count, dtype, seed)
    fast = ortho_fast.newton_schulz(torch.from_numpy(batch.matrices).to(device or "cpu"), schedule,
                                    safety=sched.safety, eps=sched.eps, dtype=getattr(torch, dtype),
                                    gram=gram).cpu().to(torch.float64).numpy()
    from ortho_fast.functional.newton_schulz import gram_restarts

    from .newton_schulz import kernel_suffix

    table = ortho_ref.schedule(schedule)
    gram_form = bool(gram) and dtype == "float16"
    restarts = gram_restarts(len(table)) if gram_form else ()
    return [compare_ns_statistics(fast, batch.matrices, table, safety=sched.safety, eps=sched.eps, dtype=dtype,
                                  input_name=batch.name, detail=f"{schedule}/{dtype}{kernel_suffix(gram)}"
                                  + (f" restarts {list(restarts)}" if gram_form else ""),
                                  form="gram" if gram_form else "standard", restarts=restarts)]
