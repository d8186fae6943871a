"""Dion's low-rank error feedback, checked on the fast side's own factors.

Dion (Ahn et al., arXiv 2504.05295, Algorithm 1) keeps in the momentum what its rank-r step
did not use: B = M + G, P = orth(BQ), R = BᵀP, M_new = B − (1 − μ)PRᵀ. With PᵀP = I and
R = BᵀP this guarantees, exactly:

(i)   the identity M_new = B − (1 − μ)PRᵀ;
(ii)  nothing outside the rank-r subspace is lost: (I − PPᵀ)M_new = (I − PPᵀ)B, and
      PᵀM_new = μPᵀB (inside, the momentum decays as in classic momentum);
(iii) bookkeeping over T steps from M_0 = 0: Σ G_t = M_T + (1 − μ)Σ P_t R_tᵀ;
(iv)  for a fixed B the steps are subspace iteration on BBᵀ: span P_t approaches the top-r
      left singular subspace, tan θ_t ≲ (σ_{r+1}/σ_r)^{2t−1} tan θ_0;
(v)   at full rank, once Q has converged (Q = V), PQᵀ is the polar factor UVᵀ, and from a
      random Q_0 it approaches it column by column;
(vi)  without error feedback (M_new = μPRᵀ) the same checks hold in the form that mode
      defines, and they measure what is lost: ‖Σ(I − P_tP_tᵀ)B_t‖ of the gradient.

Every check runs ``ortho_fast.functional.dion.dion_update`` (the fast side) step by step, reads its P and R
and evaluates the identities in float64 from the fast values; the tolerances are in
``ortho_verify.tolerances.error_feedback``.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
import torch

import ortho_ref
from ortho_fast.functional.dion import dion_update

from .. import tolerances as tol
from ..inputs.arrays import TORCH_DTYPES, as_float64 as _f64
from ..inputs.spectra import MatrixCase, matrix_with_spectrum
from ..report.results import CheckResult, measured, no_claim

__all__ = [
    "DionTrace", "check_error_feedback", "check_full_rank_polar", "check_subspace_convergence",
    "error_feedback_matrices", "identity_rows", "observed_step_rows", "run_fast_dion", "tan_max_angle",
]

EPSILON = 1e-8  # Dion's column-normalization ε (microsoft/dion, ortho_fast.Dion default)


@dataclass
class DionTrace:
    """What T fast Dion steps did, float64, in the working orientation (m' ≥ n').

    B, P, R, M, Q: lists of length T; B_t (m', n') = fl(M_{t−1} + G_t) as the fast side formed
    it, P_t (m', r), R_t (n', r), M_t (m', n') the momentum after step t, Q_t (n', r) after it.
    G: the gradients (m', n'); M0: the starting momentum.
    """

    G: list
    B: list
    P: list
    R: list
    M: list
    Q: list
    M0: np.ndarray


def _working(a: np.ndarray, transposed: bool) -> np.ndarray:
    return a.T if transposed else a


def run_fast_dion(gradients, q0: np.ndarray, *, mu: float, dtype: str, error_feedback: bool = True,
                  m0: np.ndarray | None = None, reset_momentum: bool = False) -> DionTrace:
    """Run ``ortho_fast.functional.dion.dion_update`` on ``gradients`` (each (m, n) float64, rounded to ``dtype``)
    from momentum ``m0`` (default 0) and right factor ``q0`` (min(m, n), r), lr = 0.

    ``reset_momentum``: start every step from M = m0 (with G fixed this is a fixed B, the
    setting of checks (iv) and (v)). Returns the ``DionTrace`` (working orientation).
    """
    tdt = TORCH_DTYPES[dtype]
    m, n = gradients[0].shape
    transposed = ortho_ref.dion_transposed(m, n)
    start = torch.tensor(np.zeros((m, n)) if m0 is None else m0, dtype=tdt)
    mom, q = start.clone(), torch.tensor(q0, dtype=tdt)
    x = torch.zeros((m, n), dtype=tdt)
    trace = DionTrace([], [], [], [], [], [], _working(_f64(start), transposed))
    for g in gradients:
        if reset_momentum:
            mom = start.clone()
        gt = torch.tensor(g, dtype=tdt)
        b = _f64(mom + gt)  # the same single rounding dion_update's add_ commits
        upd = dion_update(x, gt, mom, q, lr=0.0, mu=mu, weight_decay=0.0, epsilon=EPSILON,
                          error_feedback=error_feedback)
        trace.G.append(_working(_f64(gt), transposed))
        trace.B.append(_working(b, transposed))
        trace.P.append(_f64(upd.P))
        trace.R.append(_f64(upd.R))
        trace.M.append(_working(_f64(mom), transposed))
        trace.Q.append(_f64(q))
    return trace


def _norms(trace: DionTrace, t: int) -> tuple[float, float, float]:
    return tuple(float(np.linalg.norm(a[t])) for a in (trace.B, trace.P, trace.R))


def identity_rows(name: str, detail: str, trace: DionTrace, *, mu: float, dtype: str,
                  error_feedback: bool = True) -> list[CheckResult]:
    """(i) M_t = B_t − (1 − μ)P_tR_tᵀ (without error feedback M_t = μP_tR_tᵀ) and ‖P_tᵀP_t − I‖_F,
    worst step of the trace. Checks ``dion_error_feedback`` and ``dion_orthonormal_P``."""
    rows, rank = trace.P[0].shape
    worst_ef, worst_orth = None, None
    for t in range(len(trace.B)):
        b, p, r = trace.B[t], trace.P[t], trace.R[t]
        expected = b - (1 - mu) * p @ r.T if error_feedback else mu * p @ r.T
        bn, pn, rn = _norms(trace, t)
        ef = measured("dion_error_feedback", name,
                      f"{detail} " + ("M = B - (1-mu) P R^T" if error_feedback else "M = mu P R^T"),
                      np.linalg.norm(trace.M[t] - expected),
                      tol.error_feedback_tolerance(bn if error_feedback else 0.0, pn, rn,
                                                   mu if error_feedback else 1 - mu, rows, rank, dtype))
        orth = measured("dion_orthonormal_P", name, f"{detail} P^T P = I", np.linalg.norm(p.T @ p - np.eye(rank)),
                        tol.orthonormality_tolerance(rows, rank, dtype))
        worst_ef = ef if worst_ef is None or ef.ratio > worst_ef.ratio else worst_ef
        worst_orth = orth if worst_orth is None or orth.ratio > worst_orth.ratio else worst_orth
    return [worst_ef, worst_orth]


def _gradient_sequence(case: MatrixCase, steps: int) -> list[np.ndarray]:
    """G_t = A·(1 + 0.1t) + N_t, N_t Gaussian with half the entry RMS of A (deterministic from
    the case name): a gradient that drifts and carries full-rank noise, so that the rank-r
    step always leaves something behind."""
    a = case.matrix
    rms = float(np.linalg.norm(a)) / math.sqrt(a.size)
    rng = np.random.default_rng(_seed(case.name))
    return [a * (1 + 0.1 * t) + 0.5 * rms * rng.standard_normal(a.shape) for t in range(steps)]


def _seed(text: str) -> int:
    return zlib.crc32(text.encode())


def _q0(case: MatrixCase, rank: int) -> np.ndarray:
    m, n = case.matrix.shape
    return np.random.default_rng(_seed(case.name + "/Q0")).standard_normal(ortho_ref.q_shape(m, n, rank))


def check_error_feedback(case: MatrixCase, rank_fraction: float, dtype: str, *, mu: float = 0.95, steps: int = 4,
                         error_feedback: bool = True) -> list[CheckResult]:
    """Checks (i)–(iii), and (vi) with ``error_feedback=False``, over ``steps`` fast Dion steps
    from M_0 = 0 on the drifting gradient sequence of ``case`` (see ``_gradient_sequence``).

    Rows: ``dion_error_feedback``, ``dion_orthonormal_P`` (worst step), ``ef_outside_subspace``,
    ``ef_inside_subspace`` (worst step), ``ef_bookkeeping``. Each carries ``extra``:
    ``lost_fraction`` = ‖Σ G_t − M_T − (1 − μ)Σ P_tR_tᵀ‖_F / ‖Σ G_t‖_F (rounding level with
    error feedback; the gradient mass dropped without it) and ``outside_fraction``,
    ‖(I − P_TP_Tᵀ)B_T‖_F/‖B_T‖_F at the last step (what the rank-r step did not use; with error
    feedback it includes the residual carried from earlier steps).
    """
    m, n = case.matrix.shape
    r = ortho_ref.dion_rank(m, n, rank_fraction)
    trace = run_fast_dion(_gradient_sequence(case, steps), _q0(case, r), mu=mu, dtype=dtype,
                          error_feedback=error_feedback)
    detail = f"rank {r}/{min(m, n)} ({rank_fraction:g})/{dtype}/EF {'on' if error_feedback else 'off'}"
    rows, rank = trace.P[0].shape
    out = identity_rows(case.name, detail, trace, mu=mu, dtype=dtype, error_feedback=error_feedback)
    outside_rows, inside_rows, outside_fraction = [], [], math.nan
    for t in range(steps):
        b, p, m_new = trace.B[t], trace.P[t], trace.M[t]
        left = m_new - b if error_feedback else m_new
        out_tol, in_tol = tol.ef_subspace_tolerances(*_norms(trace, t), mu, rows, rank, dtype, error_feedback)
        outside_rows.append(measured("ef_outside_subspace", case.name,
                                     detail + (" (I-PP^T)(M-B) = 0" if error_feedback else " (I-PP^T)M = 0"),
                                     np.linalg.norm(left - p @ (p.T @ left)), out_tol))
        inside_rows.append(measured("ef_inside_subspace", case.name, detail + " P^T M = mu P^T B",
                                    np.linalg.norm(p.T @ m_new - mu * (p.T @ b)), in_tol))
        outside_fraction = float(np.linalg.norm(b - p @ (p.T @ b)) / np.linalg.norm(b))  # kept: the last step
    g_sum = np.sum(trace.G, axis=0)
    pr_sum = sum(p @ r_mat.T for p, r_mat in zip(trace.P, trace.R))
    unaccounted = g_sum - (trace.M[-1] - trace.M0) - (1 - mu) * pr_sum
    lost = sum(b - p @ r_mat.T for b, p, r_mat in zip(trace.B, trace.P, trace.R))
    e_t = [tol.error_feedback_tolerance(bn if error_feedback else 0.0, pn, rn, mu if error_feedback else 1 - mu,
                                        rows, rank, dtype) for bn, pn, rn in (_norms(trace, t) for t in range(steps))]
    residual = unaccounted if error_feedback else unaccounted - lost
    extra = {"lost_fraction": float(np.linalg.norm(unaccounted) / np.linalg.norm(g_sum)),
             "outside_fraction": outside_fraction, "error_feedback": error_feedback, "rank": r, "steps": steps}
    formula = "sum G = M_T + (1-mu) sum P R^T" + ("" if error_feedback else " + sum (B - P R^T)")
    out += [max(outside_rows, key=lambda x: x.ratio), max(inside_rows, key=lambda x: x.ratio),
            measured("ef_bookkeeping", case.name, f"{detail} {formula}, T = {steps}", np.linalg.norm(residual),
                     tol.ef_bookkeeping_tolerance(e_t, [np.linalg.norm(b) for b in trace.B], dtype),
                     "unaccounted gradient ||sum G - M_T - (1-mu) sum PR^T|| / ||sum G|| = "
                     f"{extra['lost_fraction']:.2e}",
                     extra)]
    for row in out:
        row.extra = {**extra, **row.extra}
    return out


def tan_max_angle(basis: np.ndarray, subspace: np.ndarray) -> float:
    """tan of the largest principal angle between span(basis) and span(subspace) (both with
    orthonormal columns, same count): ‖(I − SSᵀ)X (SᵀX)⁻¹‖₂ (Björck & Golub 1973); inf if SᵀX is
    singular. Shapes: basis (d, r), subspace (d, r)."""
    c = subspace.T @ basis
    s = np.linalg.svd(c, compute_uv=False)
    if s[-1] <= 0:
        return math.inf
    return float(np.linalg.norm((basis - subspace @ c) @ np.linalg.inv(c), 2))


def _fixed_b(case: MatrixCase, dtype: str) -> tuple[np.ndarray, tuple, bool]:
    """B rounded to the dtype (param orientation), the oracle SVD of its working orientation."""
    b = _f64(torch.tensor(case.matrix, dtype=TORCH_DTYPES[dtype]))
    transposed = ortho_ref.dion_transposed(*b.shape)
    return b, ortho_ref.svd(_working(b, transposed)), transposed


def _conditions(q0: np.ndarray, trace: DionTrace) -> np.ndarray:
    """κ₂ of the right factor each step of ``trace`` started from: Q_0, then Q_1, ..., Q_{T−1}."""
    return np.array([np.linalg.cond(q) for q in [q0, *trace.Q[:-1]]])


def check_subspace_convergence(case: MatrixCase, rank_fraction: float, dtype: str, *, steps: int = 8,
                               mu: float = 0.95) -> list[CheckResult]:
    """(iv) Fixed B = the case's matrix: ``steps`` fast Dion steps, each from M = 0 with G = B and
    the Q of the previous step. tan θ_t between span P_t and the top-r left singular subspace
    (oracle SVD) must stay within ``subspace_iteration_bounds`` for every t.

    Row ``ef_subspace_convergence`` (worst t); the note gives the measured and the predicted
    contraction per step, (σ_{r+1}/σ_r)².
    """
    b, (u, s, vt), transposed = _fixed_b(case, dtype)
    m, n = b.shape
    r = ortho_ref.dion_rank(m, n, rank_fraction)
    q0 = _q0(case, r)
    trace = run_fast_dion([b] * steps, q0, mu=mu, dtype=dtype, reset_momentum=True)
    q_used = _f64(torch.tensor(q0, dtype=TORCH_DTYPES[dtype]))
    tan0 = tan_max_angle(np.linalg.qr(q_used)[0], vt[:r].T)
    bounds = tol.subspace_iteration_bounds(s, r, tan0, steps, _working(b, transposed).shape, dtype,
                                           _conditions(q_used, trace))
    tans = np.array([tan_max_angle(p, u[:, :r]) for p in trace.P])
    ratios = np.where(bounds > 0, tans / bounds, np.inf)
    t = int(np.argmax(ratios))
    q = float(s[r] / s[r - 1]) if r < len(s) and s[r - 1] > 0 else 0.0
    rate = float(tans[-1] / tans[-2]) if steps > 1 and tans[-2] > 0 else math.nan
    detail = f"rank {r}/{min(m, n)} ({rank_fraction:g})/{dtype} tan theta_t <= q^(2t-1) tan theta_0, t <= {steps}"
    note = (f"worst t = {t + 1}; tan theta: {tans[0]:.1e} (t=1) -> {tans[-1]:.1e} (t={steps}); contraction per step "
            f"measured {rate:.3g}, predicted q^2 = {q * q:.3g}")
    return [measured("ef_subspace_convergence", case.name, detail, tans[t], bounds[t], note,
                     {"tan": tans.tolist(), "bound": bounds.tolist(), "q": q})]


def check_full_rank_polar(case: MatrixCase, dtype: str, *, steps: int = 24, mu: float = 0.95) -> list[CheckResult]:
    """(v) Full rank r = min(m, n), fixed B: (a) from Q_0 = V (converged, oracle SVD) one fast
    step gives PQᵀ = UVᵀ within ``polar_fixed_point_tolerance``; (b) from a Gaussian Q_0,
    ‖P_tQ_tᵀ − UVᵀ‖_F stays within ``full_rank_polar_bounds`` for t = 1..steps.

    Rows ``ef_full_rank_polar`` (fixed point) and ``ef_full_rank_convergence`` (worst t over the
    steps with a finite bound; the note names the others). An input whose fixed-point bound is
    not first-order valid (δ_P ≥ 0.1: B too ill-conditioned for the dtype), or whose convergence
    bound is infinite at every step, gives a "no claim" row (``ortho_verify.report.results.no_claim``).
    """
    b, (u, s, vt), transposed = _fixed_b(case, dtype)
    m, n = b.shape
    k = min(m, n)
    polar = u[:, :k] @ vt[:k]
    shape = _working(b, transposed).shape
    name, out = case.name, []
    fixed_tol = tol.polar_fixed_point_tolerance(s, EPSILON, shape, dtype)
    if not math.isfinite(fixed_tol):
        return [no_claim("ef_full_rank_polar", name, f"rank {k}/{k}/{dtype}",
                         f"ill-posed: cond(B) = {s[0] / s[-1] if s[-1] > 0 else math.inf:.1e} or repeated "
                         "singular values; P Q^T not determined to working precision")]
    # (a) Q_0 = V: the fixed point, PQᵀ = U diag(σ/(σ + ε)) Vᵀ (ε of the column normalization).
    fixed = run_fast_dion([b], vt[:k].T, mu=mu, dtype=dtype)
    expected = (u[:, :k] * (s / (s + EPSILON))) @ vt[:k]
    out.append(measured("ef_full_rank_polar", name, f"rank {k}/{k}/{dtype} Q_0 = V: P Q^T = U diag(s/(s+eps)) V^T",
                        np.linalg.norm(fixed.P[0] @ fixed.Q[0].T - expected), fixed_tol,
                        f"distance to the polar factor U V^T: {np.linalg.norm(fixed.P[0] @ fixed.Q[0].T - polar):.1e} "
                        f"(the normalization's eps: ||eps/(s+eps)|| = {np.linalg.norm(EPSILON / (s + EPSILON)):.1e})"))
    # (b) From a Gaussian Q_0: column-by-column convergence.
    q0 = _q0(case, k)
    q0_used_raw = _f64(torch.tensor(q0, dtype=TORCH_DTYPES[dtype]))
    q0_used = np.linalg.qr(q0_used_raw)[0]
    prefix = [tan_max_angle(q0_used[:, :j], vt[:j].T)
              for j in range(1, k)]
    trace = run_fast_dion([b] * steps, q0, mu=mu, dtype=dtype, reset_momentum=True)
    dists = np.array([np.linalg.norm(p @ q.T - polar) for p, q in zip(trace.P, trace.Q)])
    bounds = tol.full_rank_polar_bounds(s, np.array(prefix), steps, EPSILON, shape, dtype,
                                        _conditions(q0_used_raw, trace))
    detail = f"rank {k}/{k}/{dtype} ||P_t Q_t^T - U V^T||, t <= {steps}"
    trend = f"distance to the polar factor {dists[0]:.1e} (t=1) -> {dists[-1]:.1e} (t={steps})"
    extra = {"distance": dists.tolist(), "bound": bounds.tolist()}
    finite = np.flatnonzero(np.isfinite(bounds))
    if not len(finite):  # a non-positive denominator at some rank j (B too ill-conditioned for the dtype)
        out.append(no_claim("ef_full_rank_convergence", name, detail,
                            f"bound infinite at every step: B too ill-conditioned for {dtype}; {trend}", extra))
        return out
    t = int(finite[np.argmax(dists[finite] / bounds[finite])])
    skipped = f"; no claim for t = 1..{finite[0]} (bound infinite)" if finite[0] else ""
    out.append(measured("ef_full_rank_convergence", name, detail, dists[t], bounds[t],
                        f"worst t = {t + 1}; {trend}{skipped}", extra))
    return out


def observed_step_rows(name: str, detail: str, *, weight: np.ndarray, weight_new: np.ndarray, momentum: np.ndarray,
                       grad: np.ndarray, momentum_new: np.ndarray, q_new: np.ndarray, lr: float, mu: float,
                       weight_decay: float, dtype: str, error_feedback: bool = True,
                       note: str = "") -> list[CheckResult]:
    """Invariants of one Dion step from its inputs and the state after it — weight, momentum and
    stored Q, no P — for optimizers whose P is not determined to working precision (bfloat16).

    With O = (W(1 − lr·wd) − W_new)/(lr·√(m/n)) = P Qᵀ in the working orientation and B = M + G:
    ``dion_update_structure``: ‖OᵀO − QQᵀ‖_F (the update is an orthonormal P times the stored Q:
    a wrong lr scale, noise in the weights or an update from another Q fails it);
    ``dion_momentum_split``: ‖M_new − (B − (1 − μ)Π̂B)‖_F (without error feedback ‖M_new − μΠ̂B‖_F),
    Π̂ the projector on the top-r left singular vectors of O (= span P): error feedback keeps in
    the momentum what the step did not use, Ahn et al. (arXiv 2504.05295) Algorithm 1.
    Tolerances: ``ortho_verify.tolerances.dion_observed_step_tolerances`` (``dtype``: the coarsest of
    the parameter and state dtypes). Shapes: weight, weight_new, momentum, grad, momentum_new
    (m, n) float64 in the parameter's orientation; q_new (min(m, n), r). ``note`` is appended.
    """
    m, n = weight.shape
    transposed = ortho_ref.dion_transposed(m, n)
    step, decay = lr * math.sqrt(m / n), 1.0 - lr * weight_decay
    o = _working((decay * weight - weight_new) / step, transposed)
    b = _working(momentum + grad, transposed)
    r = q_new.shape[1]
    u_o, s_o, _ = ortho_ref.svd(o)
    projected = u_o[:, :r] @ (u_o[:, :r].T @ b)
    expected = b - (1 - mu) * projected if error_feedback else mu * projected
    bounds = tol.dion_observed_step_tolerances(
        weight_norms=(float(np.linalg.norm(weight)), float(np.linalg.norm(weight_new))), decay=decay, step=step,
        q=q_new, b_norm=float(np.linalg.norm(b)), sigma_r=float(s_o[r - 1]) if r <= len(s_o) else 0.0, mu=mu,
        rows=o.shape[0], dtype=dtype, error_feedback=error_feedback)
    tail = f"; {note}" if note else ""
    split = "M = B - (1-mu) P P^T B" if error_feedback else "M = mu P P^T B"
    return [measured("dion_update_structure", name, f"{detail} O^T O = Q Q^T, O = (W(1-lr wd) - W_new)/(lr s)",
                     np.linalg.norm(o.T @ o - q_new @ q_new.T), bounds["update"],
                     f"||O - P Q^T|| <= {bounds['update_error']:.2e}{tail}"),
            measured("dion_momentum_split", name, f"{detail} {split}, span P = top-{r} left singular subspace of O",
                     np.linalg.norm(_working(momentum_new, transposed) - expected), bounds["momentum"],
                     f"sin theta(span P, estimate) <= {bounds['sin_theta']:.2f}{tail}")]


def error_feedback_matrices(seed: int = 0) -> list[MatrixCase]:
    """Synthetic inputs for the error-feedback checks: σ_j = 0.7^(j−1) (every consecutive ratio
    0.7, so subspace iteration converges at every rank at the rate 0.49 per step, condition
    number 0.7^(1−k)), tall 48 × 24 and wide 20 × 36 (Dion works on the transpose), and tall
    12 × 6 (condition number 5.9): the bounds of ``full_rank_polar_bounds`` are infinite in
    float32 for the two larger ones (subspace_iteration_bounds' denominator at the small σ_j),
    finite from t = 6 for this one, so check (v) makes a claim in float32 too."""
    rng = np.random.default_rng(seed)
    cases = []
    for m, n in ((48, 24), (20, 36), (12, 6)):
        s = 0.7 ** np.arange(min(m, n))
        cases.append(MatrixCase(f"synthetic/gapped-0.7/{m}x{n}", matrix_with_spectrum(s, m, n, rng), "synthetic",
                                f"U diag(0.7^j) V^T, U, V Haar, seed {seed}"))
    return cases
