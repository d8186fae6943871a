"""The checks of ``ortho-verify``: the fast side measured against the oracle.

Each check returns ``CheckResult`` rows: what was measured, on which input, the error, the
tolerance from ``verify.tolerances`` and whether it passed. Inputs are float64 numpy
matrices (``verify.spectra.MatrixCase``); the fast side runs in the dtype under test.
"""

from __future__ import annotations

import functools
import math
import zlib
from dataclasses import asdict, dataclass, field

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
    """One measured comparison. ``ratio`` = error / tolerance (0 when both are 0).

    ``extra``: optional named measurements shown in the report (e.g. the fraction of the
    gradient lost without error feedback); they change no verdict.
    """

    check: str
    input: str
    detail: str
    error: float
    tolerance: float
    passed: bool
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        if self.tolerance > 0:
            return self.error / self.tolerance
        return 0.0 if self.error == 0 else math.inf

    def as_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio}


def measured(check: str, case_name: str, detail: str, error, tolerance, note: str = "",
             extra: dict | None = None) -> CheckResult:
    """A ``CheckResult`` that passes iff error <= tolerance (NaN fails)."""
    error, tolerance = float(error), float(tolerance)
    return CheckResult(check, case_name, detail, error, tolerance, bool(error <= tolerance), note, extra or {})


def as_float64(t: torch.Tensor) -> np.ndarray:
    """A float64 numpy copy on the CPU (never sharing memory with ``t``: ``.double().numpy()``
    of a float64 tensor would, and a later in-place update would change the copy)."""
    return t.detach().to(device="cpu", dtype=torch.float64, copy=True).numpy()


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
            out.append(measured("coefficient_registry", name, "present on both sides", math.inf,
                               tol.COEFFICIENT_REGISTRY_TOLERANCE, "missing on one side"))
            continue
        fast, ref = ortho_fast.COEFFICIENTS[name], ortho_ref.SCHEDULES[name]
        err = 0.0
        for steps in (fast.default_steps, fast.default_steps + 3):
            err = max(err, float(np.max(np.abs(np.array(fast.table(steps)) - ortho_ref.schedule(name, steps)))))
        err = max(err, abs(fast.safety - ref.safety), abs(fast.eps - ref.eps),
                  float(fast.default_steps != ref.default_steps) * math.inf)
        out.append(measured("coefficient_registry", name, "tables, tail, normalization", err,
                           tol.COEFFICIENT_REGISTRY_TOLERANCE))
    return out


def compare_ns_output(fast: np.ndarray, a: np.ndarray, table, *, safety: float, eps: float, dtype: str,
                      input_name: str, detail: str, eps_mode: str = "add", extra: float = 0.0, svd=None,
                      record: list | None = None, prefix: str = "") -> list[CheckResult]:
    """Judge a computed Newton–Schulz result ``fast`` of the input ``a`` against the oracle.

    (a) float32/float64: ‖fast − ns_map(a)‖_F ≤ ``ns_tolerance`` + ``extra``. bfloat16:
    sorted singular values within ``ns_singular_value_tolerance`` (Weyl), and per direction
    uᵢᵀ fast vᵢ against f(σ̂ᵢ) within ``ns_singular_value_tolerances`` (each + ``extra``).
    (b) Spread: every singular value of ``fast`` lies in the exact band of f over
    [σ̂_min, σ̂_max] widened by the tolerance of (a) (bfloat16: the singular-value one); the
    error is the largest excursion outside the band.

    Shapes: fast, a (m, n) float64; table (T, 3). ``dtype`` names the compute dtype the
    tolerances are for; ``extra`` an absolute Frobenius allowance for errors made outside
    the Newton–Schulz iteration (e.g. the weight update around it); ``svd`` an optional
    precomputed ``ortho_ref.svd(a)``; ``record``: if a list, (σ̂, uᵢᵀ fast vᵢ) is appended
    (the points of the singular-value map); ``prefix`` is prepended to the check names.
    Returns: CheckResult rows ``ns_vs_ns_map``, ``ns_projected_singular_values`` (bfloat16)
    and ``spread_in_band``; a non-finite or mis-shaped ``fast`` fails both with error inf.
    """
    names = [prefix + "ns_vs_ns_map", prefix + "spread_in_band"]
    if fast.shape != a.shape or not np.all(np.isfinite(fast)):
        why = f"output shape {fast.shape} != input shape {a.shape}" if fast.shape != a.shape else \
            "output has NaN or Inf"
        return [measured(name, input_name, detail, math.inf, 0.0, why) for name in names]
    sigma_hat = ortho_ref.normalized_singular_values(a, safety=safety, eps=eps, eps_mode=eps_mode)
    f_sigma = ortho_ref.ns_polynomial(sigma_hat, table)  # exact output singular values, per direction
    sv_fast = np.sort(ortho_ref.singular_values(fast))
    lo, hi = ortho_ref.ns_band(table, float(sigma_hat.min()), float(sigma_hat.max()) * (1 + 1e-12) + 1e-300)
    weak_note = "tolerance exceeds the band's upper edge: too ill-conditioned for a sharp comparison in this dtype"
    projected = None
    if dtype == "bfloat16" or record is not None:
        u_a, _, vt_a = ortho_ref.svd(a) if svd is None else svd
        projected = np.einsum("ij,ik,kj->j", u_a, fast, vt_a.T)
        if record is not None:
            record.append((sigma_hat, projected))
    out = []
    if dtype == "bfloat16":
        sv_tol = tol.ns_singular_value_tolerance(sigma_hat, table, a.shape, dtype) + extra
        out.append(measured(names[0], input_name, detail + " (singular values)",
                            np.max(np.abs(sv_fast - np.sort(f_sigma))), sv_tol, weak_note if sv_tol >= hi else ""))
        # Per direction: uᵢᵀ X_fast vᵢ against f(σ̂ᵢ) with its own first-order tolerance.
        taus = tol.ns_singular_value_tolerances(sigma_hat, table, a.shape, dtype) + extra
        ratios = np.abs(projected - f_sigma) / taus
        i = int(np.argmax(ratios))
        sharp = int(np.sum(taus < SHARP_SINGULAR_VALUE_TOLERANCE))
        out.append(measured(prefix + "ns_projected_singular_values", input_name, f"{detail} (worst direction)",
                            abs(projected[i] - f_sigma[i]), taus[i],
                            f"direction {i + 1}; {sharp} of {len(taus)} directions with tolerance < "
                            f"{SHARP_SINGULAR_VALUE_TOLERANCE}"))
    else:
        ref = ortho_ref.ns_map(a, table, safety=safety, eps=eps, eps_mode=eps_mode)
        # Spread in float32/float64: σᵢ(ns_map) = f(σ̂ᵢ) lies in the band, and by Weyl each σᵢ moves
        # by at most ‖X_fast − X_ref‖₂ ≤ ‖·‖_F ≤ ns_tolerance, which counts the cancelling step terms
        # (the first-order singular-value model does not: a 1 × 1 float32 input exceeded it by 2%).
        sv_tol = tol.ns_tolerance(sigma_hat, table, a.shape, dtype) + extra
        out.append(measured(names[0], input_name, detail + " (Frobenius)", np.linalg.norm(fast - ref), sv_tol))
    excursion = max(0.0, lo - float(sv_fast.min()), float(sv_fast.max()) - hi)
    weak = weak_note if sv_tol >= hi else ""
    out.append(measured(names[1], input_name, detail, excursion, sv_tol,
                       f"band [{lo:.3f}, {hi:.3f}], measured [{sv_fast.min():.3f}, {sv_fast.max():.3f}]"
                       + (f"; {weak}" if weak else "")))
    return out


@functools.lru_cache(maxsize=2)
def case_svd(case: MatrixCase):
    """``ortho_ref.svd`` of a case's matrix, kept for the case's next checks (same input,
    several schedules and dtypes)."""
    return ortho_ref.svd(case.matrix)


def check_newton_schulz(case: MatrixCase, schedule: str, dtype: str, record: list | None = None) -> list[CheckResult]:
    """(a) ``newton_schulz`` vs ``ns_map`` and (b) the singular-value spread vs the exact band
    (``compare_ns_output``), for a registered schedule computed in ``dtype``.

    ``record``: optional list receiving (σ̂, uᵢᵀ X_fast vᵢ) for the singular-value map.
    """
    a = case.matrix
    # The reference uses the oracle's own transcription of the schedule; the fast side is
    # called by name, so a wrong entry in either registry shows up here too.
    sched = ortho_ref.SCHEDULES[schedule]
    fast = ortho_fast.newton_schulz(
        torch.from_numpy(a), schedule, safety=sched.safety, eps=sched.eps, dtype=TORCH_DTYPES[dtype]
    ).to(torch.float64).numpy()
    needs_svd = dtype == "bfloat16" or record is not None
    return compare_ns_output(fast, a, ortho_ref.schedule(schedule), safety=sched.safety, eps=sched.eps, dtype=dtype,
                             input_name=case.name, detail=f"{schedule}/{dtype}",
                             svd=case_svd(case) if needs_svd else None, record=record)


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
        measured("muon_vs_reference", case.name, f"{config}/{dtype} weight", w_err, w_tol),
        measured("muon_vs_reference", case.name, f"{config}/{dtype} momentum", m_err, m_tol),
    ]


def dion_reference_rows(name: str, detail: str, ref: "ortho_ref.DionStep", q_in: np.ndarray, w_in: np.ndarray, *,
                        lr: float, mu: float, dtype: str, weight, momentum, Q,
                        error_feedback: bool = True) -> list[CheckResult]:
    """``dion_vs_reference`` rows: the fast weight, momentum and Q (float64 arrays in the
    parameter's orientation; Q (min(m, n), r)) against ``ref`` = ``ortho_ref.dion_step`` from
    ``w_in`` and ``q_in``, within ``dion_tolerances``; one passing "ill-posed" row when κ₂(BQ)
    is too large for the dtype (P is then not determined by B)."""
    bounds = tol.dion_tolerances(ref, q_in, lr=lr, mu=mu, weight=w_in, dtype=dtype, error_feedback=error_feedback)
    if not bounds["well_posed"]:
        return [CheckResult("dion_vs_reference", name, detail, 0.0, 0.0, True,
                            f"ill-posed: kappa(BQ) = {bounds['kappa']:.2e}, P not determined by B; invariants only")]
    return [measured("dion_vs_reference", name, f"{detail} {key}", np.linalg.norm(fast - ref_val), bounds[key],
                     f"kappa(BQ) = {bounds['kappa']:.2e}")
            for key, fast, ref_val in (("weight", weight, ref.weight), ("momentum", momentum, ref.momentum),
                                       ("Q", Q, ref.Q))]


def check_dion(case: MatrixCase, rank_fraction: float, dtype: str, *, lr: float = 0.01, mu: float = 0.95,
               weight_decay: float = 0.1) -> list[CheckResult]:
    """(d) One ``ortho_fast.Dion`` step (known Q injected through ``load_state_dict``) vs
    ``ortho_ref.dion_step``, plus the error-feedback identity M_new = B − (1−μ)PRᵀ and
    PᵀP = I measured on the fast side's own P and R (``verify.error_feedback.identity_rows``)."""
    from verify import error_feedback  # it builds on this module

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
    state = opt.state[p]
    out = dion_reference_rows(case.name, detail, ref, q0, w0, lr=lr, mu=mu, dtype=dtype,
                              weight=as_float64(p), momentum=as_float64(state["momentum"]), Q=as_float64(state["Q"]))
    trace = error_feedback.run_fast_dion([g], q0, m0=m0, mu=mu, dtype=dtype)
    return out + error_feedback.identity_rows(case.name, detail, trace, mu=mu, dtype=dtype)


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
    return [measured("muon_vs_torch", case.name, f"{steps} steps, bf16 NS, max |dW|", err, tol.TORCH_MUON_TOLERANCE)]
