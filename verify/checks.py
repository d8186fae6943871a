"""The checks of ``ortho-verify``: the fast side measured against the oracle.

Each check returns ``CheckResult`` rows: what was measured, on which input, the error, the
tolerance from ``verify.tolerances`` and whether it passed. Inputs are float64 numpy
matrices (``verify.spectra.MatrixCase``); the fast side runs in the dtype under test.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import asdict, dataclass

import numpy as np
import torch

import ortho_fast
import ortho_ref
from verify import tolerances as tol
from verify.spectra import MatrixCase

#: A per-direction tolerance below this (a tenth of the band's typical width) counts as a
#: sharp check in the report's notes; it changes no verdict.
SHARP_SINGULAR_VALUE_TOLERANCE = 0.1

TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class CheckResult:
    """One measured comparison. ``ratio`` = error / tolerance (0 when both are 0)."""

    check: str
    input: str
    detail: str
    error: float
    tolerance: float
    passed: bool
    note: str = ""

    @property
    def ratio(self) -> float:
        if self.tolerance > 0:
            return self.error / self.tolerance
        return 0.0 if self.error == 0 else math.inf

    def as_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio}


def _result(check, case_name, detail, error, tolerance, note="") -> CheckResult:
    error, tolerance = float(error), float(tolerance)
    return CheckResult(check, case_name, detail, error, tolerance, bool(error <= tolerance), note)


def _rng(case: MatrixCase, salt: str) -> np.random.Generator:
    """Deterministic generator for the auxiliary arrays of a case (weights, momenta, Q0)."""
    return np.random.default_rng(zlib.crc32(f"{case.name}/{salt}".encode()))


def check_coefficient_registries() -> list[CheckResult]:
    """``ortho_fast.COEFFICIENTS`` vs the oracle's independent transcription, bit for bit,
    for the default step count and for 3 steps past it (the tail rule)."""
    out = []
    names = sorted(set(ortho_fast.COEFFICIENTS) | set(ortho_ref.SCHEDULES))
    for name in names:
        if name not in ortho_fast.COEFFICIENTS or name not in ortho_ref.SCHEDULES:
            out.append(_result("coefficient_registry", name, "present on both sides", math.inf,
                               tol.COEFFICIENT_REGISTRY_TOLERANCE, "missing on one side"))
            continue
        fast, ref = ortho_fast.COEFFICIENTS[name], ortho_ref.SCHEDULES[name]
        err = 0.0
        for steps in (fast.default_steps, fast.default_steps + 3):
            err = max(err, float(np.max(np.abs(np.array(fast.table(steps)) - ortho_ref.schedule(name, steps)))))
        err = max(err, abs(fast.safety - ref.safety), abs(fast.eps - ref.eps),
                  float(fast.default_steps != ref.default_steps) * math.inf)
        out.append(_result("coefficient_registry", name, "tables, tail, normalization", err,
                           tol.COEFFICIENT_REGISTRY_TOLERANCE))
    return out


def check_newton_schulz(case: MatrixCase, schedule: str, dtype: str) -> list[CheckResult]:
    """(a) ``newton_schulz`` vs ``ns_map`` and (b) the singular-value spread vs the exact band.

    float32/float64: ‖X_fast − X_ref‖_F ≤ ``ns_tolerance``. bfloat16: sorted singular
    values within ``ns_singular_value_tolerance`` (Weyl), and per direction uᵢᵀX_fast vᵢ
    against f(σ̂ᵢ) within ``ns_singular_value_tolerances``. Spread: every singular value of
    X_fast lies in the exact band of f over [σ̂_min, σ̂_max] widened by the singular-value
    tolerance; the error is the largest excursion outside the band.
    """
    a = case.matrix
    # The reference uses the oracle's own transcription of the schedule; the fast side is
    # called by name, so a wrong entry in either registry shows up here too.
    sched = ortho_ref.SCHEDULES[schedule]
    table = ortho_ref.schedule(schedule)
    sigma_hat = ortho_ref.normalized_singular_values(a, safety=sched.safety, eps=sched.eps)
    fast = ortho_fast.newton_schulz(
        torch.from_numpy(a), schedule, safety=sched.safety, eps=sched.eps, dtype=TORCH_DTYPES[dtype]
    ).to(torch.float64).numpy()
    ref = ortho_ref.ns_map(a, table, safety=sched.safety, eps=sched.eps)
    detail = f"{schedule}/{dtype}"
    if not np.all(np.isfinite(fast)):
        return [_result(name, case.name, detail, math.inf, 0.0, "fast output has NaN or Inf")
                for name in ("ns_vs_ns_map", "spread_in_band")]
    f_sigma = ortho_ref.ns_polynomial(sigma_hat, table)  # exact output singular values, per direction
    sv_fast = np.sort(ortho_ref.singular_values(fast))
    sv_ref = np.sort(f_sigma)
    sv_tol = tol.ns_singular_value_tolerance(sigma_hat, table, a.shape, dtype)
    lo, hi = ortho_ref.ns_band(table, float(sigma_hat.min()), float(sigma_hat.max()) * (1 + 1e-12) + 1e-300)
    weak = "tolerance exceeds the band's upper edge: too ill-conditioned for a sharp comparison in this dtype" \
        if sv_tol >= hi else ""
    out = []
    if dtype == "bfloat16":
        out.append(_result("ns_vs_ns_map", case.name, detail + " (singular values)",
                           np.max(np.abs(sv_fast - sv_ref)), sv_tol, weak))
        # Per direction: uᵢᵀ X_fast vᵢ against f(σ̂ᵢ) with its own first-order tolerance.
        u_a, _, vt_a = ortho_ref.svd(a)
        projected = np.einsum("ij,ik,kj->j", u_a, fast, vt_a.T)
        taus = tol.ns_singular_value_tolerances(sigma_hat, table, a.shape, dtype)
        ratios = np.abs(projected - f_sigma) / taus
        i = int(np.argmax(ratios))
        sharp = int(np.sum(taus < SHARP_SINGULAR_VALUE_TOLERANCE))
        out.append(_result("ns_projected_singular_values", case.name, f"{detail} (direction {i + 1})",
                           abs(projected[i] - f_sigma[i]), taus[i],
                           f"{sharp} of {len(taus)} directions with tolerance < {SHARP_SINGULAR_VALUE_TOLERANCE}"))
    else:
        out.append(_result("ns_vs_ns_map", case.name, detail + " (Frobenius)", np.linalg.norm(fast - ref),
                           tol.ns_tolerance(sigma_hat, table, a.shape, dtype)))
    excursion = max(0.0, lo - float(sv_fast.min()), float(sv_fast.max()) - hi)
    out.append(_result("spread_in_band", case.name, detail, excursion, sv_tol,
                       f"band [{lo:.3f}, {hi:.3f}], measured [{sv_fast.min():.3f}, {sv_fast.max():.3f}]"
                       + (f"; {weak}" if weak else "")))
    return out


#: Muon option sets of the systems users come from (DESIGN.md, "Systems our users come from").
MUON_CONFIGS = {
    "torch.optim.Muon": dict(momentum_style="ema", nesterov=True, coefficients="jordan", adjust_lr="original",
                             weight_decay=0.1, lr=0.02),
    "microsoft/dion": dict(momentum_style="classic", nesterov=False, coefficients="polar_express",
                           adjust_lr="spectral_norm", weight_decay=0.01, lr=0.01),
    "Moonlight": dict(momentum_style="classic", nesterov=True, coefficients="jordan", adjust_lr="match_rms_adamw",
                      weight_decay=0.1, lr=0.002),
}


def _aux(case: MatrixCase, salt: str, shape, scale: float) -> np.ndarray:
    return _rng(case, salt).standard_normal(shape) * scale


def check_muon(case: MatrixCase, config: str, dtype: str, mu: float = 0.95) -> list[CheckResult]:
    """(c) One ``ortho_fast.Muon`` step vs ``ortho_ref.muon_step`` from the same weight and
    momentum, with the options of ``MUON_CONFIGS[config]``, computed in ``dtype``."""
    opts = dict(MUON_CONFIGS[config])
    lr, wd = opts.pop("lr"), opts.pop("weight_decay")
    g = case.matrix
    gscale = float(np.linalg.norm(g)) / math.sqrt(g.size)
    w0 = _aux(case, "weight", g.shape, 0.02)
    m0 = _aux(case, "momentum", g.shape, gscale)
    sched = ortho_ref.SCHEDULES[opts["coefficients"]]
    tdt = TORCH_DTYPES[dtype]
    p = torch.nn.Parameter(torch.tensor(w0, dtype=tdt))
    opt = ortho_fast.Muon([p], lr=lr, weight_decay=wd, momentum=mu, dtype=tdt, **opts)
    opt.state[p]["momentum_buffer"] = torch.tensor(m0, dtype=tdt)
    p.grad = torch.tensor(g, dtype=tdt)
    opt.step()
    ref = ortho_ref.muon_step(
        w0, g, m0, lr=lr, mu=mu, nesterov=opts["nesterov"], momentum_style=opts["momentum_style"],
        coefficients=ortho_ref.schedule(opts["coefficients"]), safety=sched.safety, eps=sched.eps,
        adjust_lr=opts["adjust_lr"], weight_decay=wd,
    )
    table = ortho_ref.schedule(opts["coefficients"])
    sigma_hat = ortho_ref.normalized_singular_values(ref.ns_input, safety=sched.safety, eps=sched.eps)
    ns_tol = tol.ns_tolerance(sigma_hat, table, g.shape, dtype)
    w_err = np.linalg.norm(p.detach().double().numpy() - ref.weight)
    w_tol = tol.muon_tolerance(ns_tol, ref.lr_scale, lr, float(np.linalg.norm(w0)), float(np.linalg.norm(ref.update)), dtype)
    m_err = np.linalg.norm(opt.state[p]["momentum_buffer"].double().numpy() - ref.momentum)
    m_tol = tol.momentum_tolerance(float(np.linalg.norm(g)), float(np.linalg.norm(m0)), dtype)
    return [
        _result("muon_vs_reference", case.name, f"{config}/{dtype} weight", w_err, w_tol),
        _result("muon_vs_reference", case.name, f"{config}/{dtype} momentum", m_err, m_tol),
    ]


def check_dion(case: MatrixCase, rank_fraction: float, dtype: str, *, lr: float = 0.01, mu: float = 0.95,
               weight_decay: float = 0.1) -> list[CheckResult]:
    """(d) One ``ortho_fast.Dion`` step (known Q injected through ``load_state_dict``) vs
    ``ortho_ref.dion_step``, plus the error-feedback identity M_new = B − (1−μ)PRᵀ and
    PᵀP = I measured on the fast side's own P and R."""
    g = case.matrix
    m, n = g.shape
    r = ortho_ref.dion_rank(m, n, rank_fraction)
    gscale = float(np.linalg.norm(g)) / math.sqrt(g.size)
    w0 = _aux(case, "weight", g.shape, 0.02)
    m0 = _aux(case, "momentum", g.shape, gscale)
    q0 = _aux(case, "Q0", ortho_ref.q_shape(m, n, r), 1.0)
    tdt = TORCH_DTYPES[dtype]
    detail = f"rank {r}/{min(m, n)} ({rank_fraction:g})/{dtype}"

    p = torch.nn.Parameter(torch.tensor(w0, dtype=tdt))
    opt = ortho_fast.Dion([p], lr=lr, mu=mu, weight_decay=weight_decay, rank_fraction=rank_fraction)
    sd = opt.state_dict()
    sd["state"] = {0: {"momentum": torch.tensor(m0, dtype=tdt), "Q": torch.tensor(q0, dtype=tdt)}}
    opt.load_state_dict(sd)
    p.grad = torch.tensor(g, dtype=tdt)
    opt.step()
    ref = ortho_ref.dion_step(w0, g, m0, q0, lr=lr, mu=mu, weight_decay=weight_decay)
    bounds = tol.dion_tolerances(ref, q0, lr=lr, mu=mu, weight=w0, dtype=dtype)
    state = opt.state[p]
    out = []
    if bounds["well_posed"]:
        for key, fast_val, ref_val in (
            ("weight", p.detach(), ref.weight),
            ("momentum", state["momentum"], ref.momentum),
            ("Q", state["Q"], ref.Q),
        ):
            err = np.linalg.norm(fast_val.double().numpy() - ref_val)
            out.append(_result("dion_vs_reference", case.name, f"{detail} {key}", err, bounds[key],
                               f"kappa(BQ) = {bounds['kappa']:.2e}"))
    else:
        out.append(CheckResult("dion_vs_reference", case.name, detail, 0.0, 0.0, True,
                               f"ill-posed: kappa(BQ) = {bounds['kappa']:.2e}, P not determined by B; "
                               "invariants only"))

    # Error-feedback identity and orthonormality on the fast function's own P and R.
    x = torch.tensor(w0, dtype=tdt)
    mom = torch.tensor(m0, dtype=tdt)
    b = (mom + torch.tensor(g, dtype=tdt)).double().numpy()
    q = torch.tensor(q0, dtype=tdt)
    upd = ortho_fast.dion_update(x, torch.tensor(g, dtype=tdt), mom, q, lr=lr, mu=mu,
                                 weight_decay=weight_decay, epsilon=1e-8)
    pp, rr = upd.P.double().numpy(), upd.R.double().numpy()
    bw = b.T if m < n else b
    mw = mom.double().numpy()
    mw = mw.T if m < n else mw
    ef_err = np.linalg.norm(mw - (bw - (1 - mu) * pp @ rr.T))
    ef_tol = tol.error_feedback_tolerance(float(np.linalg.norm(b)), float(np.linalg.norm(pp)),
                                          float(np.linalg.norm(rr)), mu, bw.shape[0], r, dtype)
    out.append(_result("dion_error_feedback", case.name, f"{detail} M = B - (1-mu) P R^T", ef_err, ef_tol))
    orth_err = np.linalg.norm(pp.T @ pp - np.eye(r))
    out.append(_result("dion_orthonormal_P", case.name, f"{detail} P^T P = I", orth_err,
                       tol.orthonormality_tolerance(bw.shape[0], r, dtype)))
    return out


def check_torch_muon(case: MatrixCase, steps: int = 3) -> list[CheckResult]:
    """(e) ``ortho_fast.Muon(eps_mode="clamp")`` vs ``torch.optim.Muon`` with torch's
    defaults, float32 parameters, ``steps`` steps: bitwise equality expected."""
    g = case.matrix
    w0 = torch.tensor(_aux(case, "weight", g.shape, 0.02), dtype=torch.float32)
    p_ref = torch.nn.Parameter(w0.clone())
    p_fast = torch.nn.Parameter(w0.clone())
    o_ref = torch.optim.Muon([p_ref], lr=0.02)
    o_fast = ortho_fast.Muon([p_fast], lr=0.02, eps_mode="clamp")
    rng = _rng(case, "torch-steps")
    for t in range(steps):
        grad = torch.tensor(g * (1.0 + 0.1 * t) + 0.01 * rng.standard_normal(g.shape) * np.abs(g).max(),
                            dtype=torch.float32)
        p_ref.grad, p_fast.grad = grad.clone(), grad.clone()
        o_ref.step()
        o_fast.step()
    err = float((p_ref.detach() - p_fast.detach()).abs().max())
    return [_result("muon_vs_torch", case.name, f"{steps} steps, bf16 NS, max |dW|", err, tol.TORCH_MUON_TOLERANCE)]
