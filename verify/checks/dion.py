"""Dion checks of ``ortho-verify``: one ``ortho_fast.Dion`` step against ``ortho_ref.dion_step``
(Ahn et al., arXiv 2504.05295, Algorithm 1), with the default options plus the error-feedback
identities, or with a variant of ``DION_VARIANTS`` (from ``ortho_verify.registry``) and mixed
precision (docs/design.md, "Dion").
"""

from __future__ import annotations

import math

import numpy as np
import torch

import ortho_fast
import ortho_ref
from ortho_fast.functional.qr import gaussian_sketch, sketch_generator

from .. import registry, tolerances as tol
from ..inputs.arrays import TORCH_DTYPES, as_float64, case_array, rounded
from ..inputs.spectra import MatrixCase
from ..report.results import CheckResult, measured, no_claim
from . import error_feedback
from .gauge import align_column_signs

__all__ = ["DION_VARIANTS", "check_dion", "dion_reference_rows", "dion_sketches", "never_transposed_dion_step"]

def dion_reference_rows(name: str, detail: str, ref: "ortho_ref.DionStep", q_in: np.ndarray, w_in: np.ndarray, *,
                        lr: float, mu: float, dtype: str, weight, momentum, Q, error_feedback: bool = True,
                        bounds: dict | None = None, check: str = "dion_vs_reference") -> list[CheckResult]:
    """``check`` rows: the fast weight, momentum and Q (float64 arrays in the parameter's
    orientation; Q (min(m, n), r)) against ``ref`` = ``ortho_ref.dion_step`` from ``w_in`` and
    ``q_in``, within ``bounds`` (default ``dion_tolerances``; or ``dion_variant_tolerances`` for
    the step's options); one "no claim" row (``no_claim``) when κ₂(BQ) is too large for the
    dtype (P is then not determined by B, and is not compared).

    Gauge: P is determined only up to its column signs (a QR that leaves them free is correct),
    and Q's columns flip with P's; the weight and the momentum (B − (1 − μ)PRᵀ, i.e. P Rᵀ) do not
    depend on them and are compared as they are, Q after ``align_column_signs`` (the note says
    how many columns were flipped). docs/verification.md, "Gauge invariance".
    """
    if bounds is None:
        bounds = tol.dion_tolerances(ref, q_in, lr=lr, mu=mu, weight=w_in, dtype=dtype, error_feedback=error_feedback)
    if not bounds["well_posed"]:
        return [no_claim(check, name, detail, f"ill-posed: kappa(BQ) = {bounds['kappa']:.2e}, P not determined by "
                                              f"B in {dtype}; not compared")]
    note = f"kappa(BQ) = {bounds['kappa']:.2e}"
    q_aligned, flipped = align_column_signs(Q, ref.Q) if np.shape(Q) == ref.Q.shape else (Q, 0)
    if np.shape(Q) != ref.Q.shape:
        return [measured(check, name, f"{detail} {key}", np.linalg.norm(fast - ref_val), bounds[key], note)
                for key, fast, ref_val in (("weight", weight, ref.weight), ("momentum", momentum, ref.momentum))] + [
            measured(check, name, f"{detail} Q", np.inf, bounds["Q"],
                     f"Q of shape {np.shape(Q)}, expected {ref.Q.shape} (min(m, n), r): declare the orientation "
                     "(DionConventions(orientation=...))")]
    return [measured(check, name, f"{detail} {key}", np.linalg.norm(fast - ref_val), bounds[key], extra_note)
            for key, fast, ref_val, extra_note in (
                ("weight", weight, ref.weight, note),
                ("momentum", momentum, ref.momentum, note + "; = P R^T, gauge-free"),
                ("Q", q_aligned, ref.Q, note + f"; up to column signs ({flipped} of {ref.Q.shape[1]} flipped)"))]


#: Dion options checked by ``check_dion(..., variant=...)``: the QR methods (microsoft/dion's
#: "qr", CholeskyQR2, its default "rcqr"), Orth-Dion's QR right factor, and two power iterations
#: (``ortho_verify.registry.DION_VARIANTS``).
DION_VARIANTS = registry.DION_VARIANTS


def dion_sketches(opts: dict, seed: int, index: int, step: int, rows: int, rank: int,
                  dtype: torch.dtype) -> list[np.ndarray] | None:
    """The sketches ``ortho_fast.Dion(seed=seed, **opts)`` draws for parameter ``index`` at
    ``step`` (>= 1), for ``dion_variant_tolerances(sketches=...)``.

    Shapes: one float64 (k, rows) array per power iteration, k = ``sketch_rows(rank,
    oversample)``, rows = max(m, n) (the working orientation); drawn as the optimizer does
    (``ortho_fast.functional.qr.sketch_generator`` on the CPU, in ``dtype``, the momentum dtype, or float32 for
    bfloat16 / float16). None when the optimizer draws none (another ``qr_method``, or k >= rows).
    Source: microsoft/dion ``orthogonalize`` (rcqr); ``ortho_fast.functional.qr.gaussian_sketch``.
    """
    k = ortho_ref.sketch_rows(rank, opts.get("oversample", ortho_ref.dion.RCQR_OVERSAMPLE))
    if opts.get("qr_method") != "randomized_cholesky_qr" or k >= rows:
        return None
    gen = sketch_generator(seed, index, step, "cpu")
    fdt = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    return [as_float64(gaussian_sketch(gen, k, rows, fdt, "cpu")) for _ in range(opts.get("power_iters", 1))]


def check_dion(case: MatrixCase, rank_fraction: float, dtype: str, variant: str | None = None,
               state_dtype: str | None = None, *, lr: float = 0.01, mu: float = 0.95, weight_decay: float = 0.1,
               seed: int = 0) -> list[CheckResult]:
    """(d) One ``ortho_fast.Dion`` step (momentum, known Q and step injected through
    ``load_state_dict``) vs ``ortho_ref.dion_step`` from the same inputs (weight and gradient
    rounded to the parameter's ``dtype``, momentum and Q to ``state_dtype``, default ``dtype``).

    Default options (``variant`` and ``state_dtype`` None): rows ``dion_vs_reference``
    within ``dion_tolerances``, plus the error-feedback identity M_new = B − (1−μ)PRᵀ and
    PᵀP = I measured on the fast side's own P and R (``ortho_verify.checks.error_feedback.identity_rows``).
    Otherwise the options of ``DION_VARIANTS[variant]`` on both sides (the reference's own
    sketches from ``seed``; the tolerance takes κ₂(Y R_s⁻¹) of the sketches the optimizer drew,
    ``dion_sketches``) and mixed precision (``state_dtype`` as microsoft/dion's
    ``DionMixedPrecisionConfig`` momentum_dtype = Q_dtype; B, P, R computed in it): rows
    ``dion_variant_vs_reference`` within ``dion_variant_tolerances``.
    Shapes: the case's matrix (m, n) is the gradient; r = ``dion_rank(m, n, rank_fraction)``;
    ``dtype`` / ``state_dtype`` name entries of ``TORCH_DTYPES``.
    Raises: KeyError for an unknown variant or dtype name.
    """
    opts = DION_VARIANTS[variant] if variant is not None else {}
    g = case.matrix
    m, n = g.shape
    r = ortho_ref.dion_rank(m, n, rank_fraction)
    gscale = float(np.linalg.norm(g)) / math.sqrt(g.size)
    sdt_name = state_dtype or dtype
    tdt, sdt = TORCH_DTYPES[dtype], TORCH_DTYPES[sdt_name]
    w0, g = rounded(case_array(case, "weight", g.shape, 0.02), tdt), rounded(g, tdt)
    m0 = rounded(case_array(case, "momentum", g.shape, gscale), sdt)
    q0 = rounded(case_array(case, "Q0", ortho_ref.q_shape(m, n, r), 1.0), sdt)
    detail = f"rank {r}/{min(m, n)} ({rank_fraction:g})/{dtype}"

    p = torch.nn.Parameter(torch.tensor(w0, dtype=tdt))
    opt = ortho_fast.Dion([p], lr=lr, mu=mu, weight_decay=weight_decay, rank_fraction=rank_fraction,
                          momentum_dtype=sdt, q_dtype=sdt, seed=seed, **opts)
    sd = opt.state_dict()
    sd["state"] = {0: {"momentum": torch.tensor(m0, dtype=sdt), "Q": torch.tensor(q0, dtype=sdt),
                       "step": torch.tensor(0)}}
    opt.load_state_dict(sd)
    p.grad = torch.tensor(g, dtype=tdt)
    opt.step()
    ref = ortho_ref.dion_step(w0, g, m0, q0, lr=lr, mu=mu, weight_decay=weight_decay,
                              rng=np.random.default_rng(seed), **opts)
    state = opt.state[p]
    fast = dict(weight=as_float64(p), momentum=as_float64(state["momentum"]), Q=as_float64(state["Q"]))
    if variant is None and state_dtype is None:
        out = dion_reference_rows(case.name, detail, ref, q0, w0, lr=lr, mu=mu, dtype=dtype, **fast)
        trace = error_feedback.run_fast_dion([g], q0, m0=m0, mu=mu, dtype=dtype)
        return out + error_feedback.identity_rows(case.name, detail, trace, mu=mu, dtype=dtype)
    bounds = tol.dion_variant_tolerances(ref, q0, lr=lr, mu=mu, weight=w0, dtype=sdt_name, param_dtype=dtype,
                                         q_dtype=sdt_name, sketches=dion_sketches(opts, seed, 0, 1, max(m, n), r, sdt),
                                         grad_norm=float(np.linalg.norm(g)), **opts)
    detail = f"{variant or 'default'} {detail}" + (f" state {sdt_name}" if state_dtype else "")
    return dion_reference_rows(case.name, detail, ref, q0, w0, lr=lr, mu=mu, dtype=sdt_name, bounds=bounds,
                               check="dion_variant_vs_reference", **fast)


def never_transposed_dion_step(weight: np.ndarray, grad: np.ndarray, momentum: np.ndarray, Q: np.ndarray, *,
                               lr: float, mu: float = 0.95, weight_decay: float = 0.0, epsilon: float = 1e-8,
                               power_iters: int = 1, error_feedback: bool = True, qr_method: str = "householder",
                               right_factor: str = "column_norm") -> "ortho_ref.DionStep":
    """``ortho_ref.dion_step`` for a Dion that never transposes: B = M + G as stored, for wide
    matrices too, so Q has shape (n, r) and P (m, r) for every (m, n). Built from the oracle's
    public pieces (``ortho_ref.orthonormalize``, ``ortho_ref.dion_right_factor``), float64:
    P = orth(B Q) (power_iters > 1: Q ← right factor of BᵀP between), R = BᵀP, M = B − (1 − μ)PRᵀ
    (or μPRᵀ), Q = right factor of R, X = (1 − lr·wd)X − lr·√(m/n)·PQᵀ.
    Shapes: weight, grad, momentum (m, n); Q (n, r) -> ``ortho_ref.DionStep`` with B (m, n),
    P (m, r), R and Q (n, r). Source: Ahn et al., arXiv 2504.05295, Algorithm 1.
    Raises: ValueError for a Q whose row count is not n, or a randomized qr_method (its sketch
    is drawn for the min-side orientation).
    """
    w, b = np.asarray(weight, dtype=np.float64), np.asarray(momentum, dtype=np.float64) + np.asarray(grad, np.float64)
    q = np.asarray(Q, dtype=np.float64)
    m, n = b.shape
    if q.ndim != 2 or q.shape[0] != n:
        raise ValueError(f"Q: expected shape (n, r) = ({n}, r) for a never-transposed Dion, got {q.shape}")
    if qr_method == "randomized_cholesky_qr":
        raise ValueError("qr_method: randomized_cholesky_qr is compared in the min-side orientation only")
    scale = math.sqrt(m / n)
    if not np.any(b):
        z = np.zeros((m, q.shape[1]))
        return ortho_ref.DionStep(w * (1 - lr * weight_decay), b, q, z, np.zeros_like(q), b, scale)
    for t in range(power_iters):
        p = ortho_ref.orthonormalize(b @ q, qr_method)
        r_mat = b.T @ p
        q = ortho_ref.dion_right_factor(r_mat, right_factor, epsilon)
    pr = p @ r_mat.T
    mom = b - (1 - mu) * pr if error_feedback else mu * pr
    return ortho_ref.DionStep(w * (1 - lr * weight_decay) - lr * scale * (p @ q.T), mom, q, p, r_mat, b, scale)
