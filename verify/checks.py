"""The checks of ``ortho-verify``: the fast side measured against the oracle.

Each check returns ``CheckResult`` rows: what was measured, on which input, the error, the
tolerance from ``ortho_verify.tolerances`` and whether it passed. Inputs are float64 numpy
matrices (``ortho_verify.spectra.MatrixCase``); the fast side runs in the dtype under test.
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
from ortho_verify import tolerances as tol
from ortho_verify.spectra import MatrixCase

#: A per-direction tolerance below this (a tenth of the band's typical width) counts as a
#: sharp check in the report's notes; it changes no verdict.
SHARP_SINGULAR_VALUE_TOLERANCE = 0.1

TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class CheckResult:
    """One measured comparison. ``ratio`` = error / tolerance (0 when both are 0).

    ``passed``: no violation was found. ``claimed``: the row is evidence — False for a
    comparison that was not made (ill-posed: P not determined by B) or whose tolerance cannot
    reject a wrong result (infinite, or admitting the zero output); such a row passed vacuously,
    its ``status`` is "no claim" and reports count it apart (``verdict``). A failed row is always
    claimed. ``extra``: optional named measurements shown in the report (e.g. the fraction of the
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
    claimed: bool = True

    @property
    def ratio(self) -> float:
        if self.tolerance > 0:
            return self.error / self.tolerance
        return 0.0 if self.error == 0 else math.inf

    @property
    def status(self) -> str:
        """"fail", "pass" (a claim that held) or "no claim" (passed vacuously)."""
        return "fail" if not self.passed else "pass" if self.claimed else "no claim"

    def as_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio, "status": self.status}


def measured(check: str, case_name: str, detail: str, error, tolerance, note: str = "",
             extra: dict | None = None, informative: bool = True) -> CheckResult:
    """A ``CheckResult`` that passes iff error <= tolerance (NaN fails). It is a claim unless it
    passed with an infinite tolerance or with ``informative`` False (see ``CheckResult``)."""
    error, tolerance = float(error), float(tolerance)
    passed = bool(error <= tolerance)
    return CheckResult(check, case_name, detail, error, tolerance, passed, note, extra or {},
                       not passed or (informative and math.isfinite(tolerance)))


def no_claim(check: str, case_name: str, detail: str, why: str, extra: dict | None = None) -> CheckResult:
    """A row for a comparison that was not made (error 0, tolerance inf): ``why`` is its note."""
    return CheckResult(check, case_name, detail, 0.0, math.inf, True, why, extra or {}, False)


def verdict(results) -> tuple[str, list[str]]:
    """("passed" | "failed" | "inconclusive", reasons) of a list of ``CheckResult``.

    failed: some row failed. inconclusive (nothing failed, but not evidence of correctness): no
    row made a claim, or some check made no claim on any of its inputs; the reasons name each
    such check with its row count and the note of its first row. passed: otherwise.
    """
    results = list(results)
    if any(not r.passed for r in results):
        return "failed", []
    families: dict[str, list[CheckResult]] = {}
    for r in results:
        families.setdefault(r.check, []).append(r)
    reasons = [f"{check}: no claim on any of its {len(rows)} rows ({rows[0].note or 'no note'})"
               for check, rows in families.items() if not any(r.claimed for r in rows)]
    if not results:
        reasons = ["no check was run"]
    return ("inconclusive" if reasons else "passed"), reasons


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


def _envelope_row(check: str, input_name: str, detail: str, values: np.ndarray, exact_low, exact_high,
                  taus: np.ndarray, informative: bool, note: str) -> CheckResult:
    """``values`` (any order) against per-direction intervals: the exact value of direction i
    lies in [a_i, b_i] (``exact_low``, ``exact_high``: arrays or scalars) and the computed one
    within τᵢ of it; the pairing is unknown. Order statistics are monotone (x_i ∈ [l_i, h_i] for
    every i implies sort(x)_k ∈ [sort(l)_k, sort(h)_k]), so the k-th smallest value v_k must lie in
    [sort(a − τ)_k, sort(b + τ)_k]: error = its excursion outside [sort(a)_k, sort(b)_k], tolerance =
    the envelope's widening on that side; the row reports the k with the largest ratio."""
    a, b = np.broadcast_to(exact_low, taus.shape), np.broadcast_to(exact_high, taus.shape)
    v, lo, hi = np.sort(values), np.sort(a), np.sort(b)
    below, above = lo - np.sort(a - taus), np.sort(b + taus) - hi
    error = np.maximum(0.0, np.maximum(lo - v, v - hi))
    bound = np.where(v < lo, below, above)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(bound > 0, error / bound, np.where(error > 0, np.inf, 0.0))
    k = int(np.argmax(ratios))
    return measured(check, input_name, detail, error[k], bound[k],
                    f"k = {k + 1} of {len(v)} (ascending): {v[k]:.3f}, exact in [{lo[k]:.3f}, {hi[k]:.3f}], allowed "
                    f"[{lo[k] - below[k]:.3f}, {hi[k] + above[k]:.3f}]" + (f"; {note}" if note else ""),
                    informative=informative)


def compare_ns_output(fast: np.ndarray, a: np.ndarray, table, *, safety: float, eps: float, dtype: str,
                      input_name: str, detail: str, eps_mode: str = "add", extra: float = 0.0, svd=None,
                      record: list | None = None, prefix: str = "") -> list[CheckResult]:
    """Judge a computed Newton–Schulz result ``fast`` of the input ``a`` against the oracle.

    float32/float64: (a) ‖fast − ns_map(a)‖_F ≤ ``ns_tolerance`` + ``extra``; (b) spread: every
    singular value of ``fast`` lies in the exact band of f over [σ̂_min, σ̂_max] widened by that
    tolerance (error: the largest excursion outside the band).
    bfloat16, with the per-direction tolerances τᵢ of ``ns_singular_value_tolerances`` (+ ``extra``):
    (a) the sorted singular values of ``fast`` within the order-statistic envelope of the
    intervals f(σ̂ᵢ) ± τᵢ (``_envelope_row``), and per direction uᵢᵀ fast vᵢ against f(σ̂ᵢ) within
    τᵢ (``ns_projected_singular_values``); (b) spread: the sorted singular values within the
    envelope of [lo − τᵢ, hi + τᵢ] (band [lo, hi]). A bfloat16 row whose intervals all contain
    0 (f(σ̂ᵢ) ≤ τᵢ for every i; band: lo ≤ τᵢ) admits the zero output: it makes no claim
    (``CheckResult.claimed``) unless it fails.

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
    band = f"band [{lo:.3f}, {hi:.3f}], measured [{sv_fast.min():.3f}, {sv_fast.max():.3f}]"
    projected = None
    if dtype == "bfloat16" or record is not None:
        u_a, _, vt_a = ortho_ref.svd(a) if svd is None else svd
        projected = np.einsum("ij,ik,kj->j", u_a, fast, vt_a.T)
        if record is not None:
            record.append((sigma_hat, projected))
    if dtype != "bfloat16":
        ref = ortho_ref.ns_map(a, table, safety=safety, eps=eps, eps_mode=eps_mode)
        # Spread in float32/float64: σᵢ(ns_map) = f(σ̂ᵢ) lies in the band, and by Weyl each σᵢ moves
        # by at most ‖X_fast − X_ref‖₂ ≤ ‖·‖_F ≤ ns_tolerance, which counts the cancelling step terms
        # (the first-order singular-value model does not: a 1 × 1 float32 input exceeded it by 2%).
        sv_tol = tol.ns_tolerance(sigma_hat, table, a.shape, dtype) + extra
        weak = "; tolerance exceeds the band's upper edge" if sv_tol >= hi else ""
        excursion = max(0.0, lo - float(sv_fast.min()), float(sv_fast.max()) - hi)
        return [measured(names[0], input_name, detail + " (Frobenius)", np.linalg.norm(fast - ref), sv_tol),
                measured(names[1], input_name, detail, excursion, sv_tol, band + weak)]
    taus = tol.ns_singular_value_tolerances(sigma_hat, table, a.shape, dtype) + extra
    resolved = f_sigma > taus  # directions whose interval f ± τ excludes 0
    vacuous = "no claim: every direction's tolerance admits 0 (f(sigma_i) <= tau_i), too ill-conditioned " \
              "or too small for bfloat16"
    ratios = np.abs(projected - f_sigma) / taus
    i = int(np.argmax(ratios))
    sharp = int(np.sum(taus < SHARP_SINGULAR_VALUE_TOLERANCE))
    return [
        _envelope_row(names[0], input_name, detail + " (singular values)", sv_fast, f_sigma, f_sigma, taus,
                      bool(resolved.any()), "" if resolved.any() else vacuous),
        measured(prefix + "ns_projected_singular_values", input_name, f"{detail} (worst direction)",
                 abs(projected[i] - f_sigma[i]), taus[i],
                 f"direction {i + 1}; {int(resolved.sum())} of {len(taus)} directions resolved (f > tau), {sharp} "
                 f"with tau < {SHARP_SINGULAR_VALUE_TOLERANCE}" + ("" if resolved.any() else f"; {vacuous}"),
                 informative=bool(resolved.any())),
        _envelope_row(names[1], input_name, detail, sv_fast, lo, hi, taus, bool(np.any(lo > taus)),
                      band + ("" if np.any(lo > taus) else "; no claim: the band widened by tau reaches 0")),
    ]


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
#: Megatron: Emerging-Optimizers' defaults (EMA momentum without Nesterov, cesista5, "spectral"
#: √max(m, n), clamped normalization) with extra_scale_factor 0.2 (= Moonlight's 0.2·√max(m, n));
#: nanochat: Polar Express with cautious weight decay (its mask (g·p) >= 0).
MUON_CONFIGS = {
    "torch.optim.Muon": dict(momentum_style="ema", nesterov=True, coefficients="jordan", adjust_lr="original",
                             eps_mode="clamp", weight_decay=0.1, lr=0.02),
    "microsoft/dion": dict(momentum_style="classic", nesterov=False, coefficients="polar_express",
                           adjust_lr="spectral_norm", weight_decay=0.01, lr=0.01),
    "Moonlight": dict(momentum_style="classic", nesterov=True, coefficients="jordan", adjust_lr="match_rms_adamw",
                      eps_mode="add", weight_decay=0.1, lr=0.002),  # Moonlight divides by ‖X‖ + 1e-7
    "Megatron": dict(momentum_style="ema", nesterov=False, coefficients="cesista5", adjust_lr="spectral",
                     extra_scale_factor=0.2, eps_mode="clamp", weight_decay=0.01, lr=3e-4),
    "nanochat (cautious wd)": dict(momentum_style="ema", nesterov=True, coefficients="polar_express",
                                   adjust_lr="original", cautious_weight_decay=True, weight_decay=0.2, lr=0.02),
}

#: Heads per q / k / v block in ``check_muon_layouts`` (the n_heads of ``ortho_verify.data``'s GPT,
#: whose fused qkv weight is (3·d, d) with rows ordered q heads, k heads, v heads).
LAYOUT_HEADS = 4
#: Same-shape matrices stacked into one bank in ``check_muon_layouts``.
LAYOUT_BANK = 3


def _aux(case: MatrixCase, salt: str, shape, scale: float) -> np.ndarray:
    return _rng(case, salt).standard_normal(shape) * scale


def _fast_muon(config: str, dtype: str, mu: float, groups) -> list[tuple[np.ndarray, np.ndarray]]:
    """One ``ortho_fast.Muon`` step with the options of ``MUON_CONFIGS[config]`` computed in
    ``dtype``. ``groups``: [(extra group keys, [(weight, momentum, grad), ...])] of float64
    arrays; returns (weight, momentum) after the step, float64, per parameter in order."""
    opts = dict(MUON_CONFIGS[config])
    lr, wd = opts.pop("lr"), opts.pop("weight_decay")
    tdt = TORCH_DTYPES[dtype]
    params = [[torch.nn.Parameter(torch.tensor(w, dtype=tdt)) for w, _, _ in arrays] for _, arrays in groups]
    opt = ortho_fast.Muon([{**keys, "params": ps} for (keys, _), ps in zip(groups, params)], lr=lr, weight_decay=wd,
                          momentum=mu, dtype=tdt, **opts)
    for ps, (_, arrays) in zip(params, groups):
        for p, (_, m0, g) in zip(ps, arrays):
            opt.state[p]["momentum_buffer"] = torch.tensor(m0, dtype=tdt)
            p.grad = torch.tensor(g, dtype=tdt)
    opt.step()
    return [(as_float64(p), as_float64(opt.state[p]["momentum_buffer"])) for ps in params for p in ps]


def _muon_errors(config: str, dtype: str, mu: float, w0: np.ndarray, g: np.ndarray, m0: np.ndarray,
                weight: np.ndarray, momentum: np.ndarray) -> list[tuple[str, float, float]]:
    """[("weight", error, tolerance), ("momentum", error, tolerance)] of a fast Muon step on one
    (m, n) matrix (float64 ``weight`` / ``momentum`` after it) against ``ortho_ref.muon_step``
    from ``w0``, ``g``, ``m0`` with the options of ``MUON_CONFIGS[config]``: Frobenius errors,
    tolerances ``muon_tolerance`` (+ ``cautious_weight_decay_tolerance``) and
    ``momentum_tolerance`` for the compute ``dtype``."""
    opts = MUON_CONFIGS[config]
    lr, wd, eps_mode = opts["lr"], opts["weight_decay"], opts.get("eps_mode", "add")
    sched = ortho_ref.SCHEDULES[opts["coefficients"]]
    table = ortho_ref.schedule(opts["coefficients"])
    ref = ortho_ref.muon_step(
        w0, g, m0, lr=lr, mu=mu, nesterov=opts["nesterov"], momentum_style=opts["momentum_style"],
        coefficients=table, safety=sched.safety, eps=sched.eps, eps_mode=eps_mode, adjust_lr=opts["adjust_lr"],
        weight_decay=wd, extra_scale_factor=opts.get("extra_scale_factor", 1.0),
        cautious_weight_decay=opts.get("cautious_weight_decay", False),
    )
    sigma_hat = ortho_ref.normalized_singular_values(ref.ns_input, safety=sched.safety, eps=sched.eps,
                                                     eps_mode=eps_mode)
    ns_tol = tol.ns_tolerance(sigma_hat, table, g.shape, dtype)
    w_tol = tol.muon_tolerance(ns_tol, ref.lr_scale, lr, float(np.linalg.norm(w0)), float(np.linalg.norm(ref.update)),
                               dtype)
    if opts.get("cautious_weight_decay"):
        w_tol += tol.cautious_weight_decay_tolerance(w0, ref.update, ns_tol, lr, wd)
    m_tol = tol.momentum_tolerance(float(np.linalg.norm(g)), float(np.linalg.norm(m0)), dtype)
    return [("weight", float(np.linalg.norm(weight - ref.weight)), w_tol),
            ("momentum", float(np.linalg.norm(momentum - ref.momentum)), m_tol)]


def _muon_inputs(case: MatrixCase, suffix: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weight, momentum, gradient) of a Muon check: the case's matrix as the gradient."""
    g = case.matrix
    gscale = float(np.linalg.norm(g)) / math.sqrt(g.size)
    return _aux(case, "weight" + suffix, g.shape, 0.02), _aux(case, "momentum" + suffix, g.shape, gscale), g


def check_muon(case: MatrixCase, config: str, dtype: str, mu: float = 0.95) -> list[CheckResult]:
    """(c) One ``ortho_fast.Muon`` step vs ``ortho_ref.muon_step`` from the same weight and
    momentum, with the options of ``MUON_CONFIGS[config]``, computed in ``dtype``."""
    w0, m0, g = _muon_inputs(case)
    [(w, mom)] = _fast_muon(config, dtype, mu, [({}, [(w0, m0, g)])])
    return [measured("muon_vs_reference", case.name, f"{config}/{dtype} {key}", err, bound)
            for key, err, bound in _muon_errors(config, dtype, mu, w0, g, m0, w, mom)]


def check_muon_layouts(case: MatrixCase, dtype: str, config: str = "Megatron", mu: float = 0.95) -> list[CheckResult]:
    """(c') ``ortho_fast.Muon``'s parameter layouts on one step, block by block against
    ``ortho_ref.muon_step`` on each block alone (``_muon_errors``'s tolerances per block).

    - fused QKV (when m is divisible by 3): ``split_sizes`` = (m/3,)·3 and ``num_heads`` =
      ``LAYOUT_HEADS`` (1 when it does not divide m/3): each head's rows are one matrix;
    - banks: ``LAYOUT_BANK`` parameters of the case's shape (same gradient, own weight and
      momentum) with ``banks=True``, orthogonalized in one batched call.
    One row per layout and quantity (weight, momentum): the block with the largest
    error/tolerance, named in the note. Source: Megatron-LM split_qkv; Keller Jordan's and
    nanochat's banked Muon.
    """
    m = case.matrix.shape[0]
    bank = [_muon_inputs(case, f"/bank{i}" if i else "") for i in range(LAYOUT_BANK)]
    layouts = [("banks", {"banks": True}, bank, [(i, slice(None)) for i in range(LAYOUT_BANK)])]
    if m % 3 == 0:
        heads = LAYOUT_HEADS if (m // 3) % LAYOUT_HEADS == 0 else 1
        rows = m // (3 * heads)
        layouts.insert(0, (f"qkv 3x{heads} heads", {"split_sizes": (m // 3,) * 3, "num_heads": heads}, bank[:1],
                           [(0, slice(i, i + rows)) for i in range(0, m, rows)]))
    fast = iter(_fast_muon(config, dtype, mu, [(keys, arrays) for _, keys, arrays, _ in layouts]))
    out = []
    for name, _, arrays, blocks in layouts:
        after = [next(fast) for _ in arrays]
        rows_by_key: dict[str, list[CheckResult]] = {}
        for j, (i, sl) in enumerate(blocks):
            (w0, m0, g), (w, mom) = arrays[i], after[i]
            for key, err, bound in _muon_errors(config, dtype, mu, w0[sl], g[sl], m0[sl], w[sl], mom[sl]):
                rows_by_key.setdefault(key, []).append(measured(
                    "muon_layout_vs_reference", case.name, f"{config}/{dtype} {name} {key}", err, bound,
                    f"worst of {len(blocks)} blocks: block {j + 1}"))
        out += [max(rows, key=lambda r: (not r.passed, r.ratio)) for rows in rows_by_key.values()]
    return out


def dion_reference_rows(name: str, detail: str, ref: "ortho_ref.DionStep", q_in: np.ndarray, w_in: np.ndarray, *,
                        lr: float, mu: float, dtype: str, weight, momentum, Q, error_feedback: bool = True,
                        bounds: dict | None = None, check: str = "dion_vs_reference") -> list[CheckResult]:
    """``check`` rows: the fast weight, momentum and Q (float64 arrays in the parameter's
    orientation; Q (min(m, n), r)) against ``ref`` = ``ortho_ref.dion_step`` from ``w_in`` and
    ``q_in``, within ``bounds`` (default ``dion_tolerances``; or ``dion_variant_tolerances`` for
    the step's options); one "no claim" row (``no_claim``) when κ₂(BQ) is too large for the
    dtype (P is then not determined by B, and is not compared)."""
    if bounds is None:
        bounds = tol.dion_tolerances(ref, q_in, lr=lr, mu=mu, weight=w_in, dtype=dtype, error_feedback=error_feedback)
    if not bounds["well_posed"]:
        return [no_claim(check, name, detail, f"ill-posed: kappa(BQ) = {bounds['kappa']:.2e}, P not determined by "
                                              f"B in {dtype}; not compared")]
    return [measured(check, name, f"{detail} {key}", np.linalg.norm(fast - ref_val), bounds[key],
                     f"kappa(BQ) = {bounds['kappa']:.2e}")
            for key, fast, ref_val in (("weight", weight, ref.weight), ("momentum", momentum, ref.momentum),
                                       ("Q", Q, ref.Q))]


#: Dion options checked by ``check_dion(..., variant=...)``: the QR methods (microsoft/dion's
#: "qr", CholeskyQR2, its default "rcqr"), Orth-Dion's QR right factor, and two power iterations.
DION_VARIANTS = {
    "householder": dict(qr_method="householder"),
    "cholesky_qr": dict(qr_method="cholesky_qr"),
    "randomized_cholesky_qr": dict(qr_method="randomized_cholesky_qr"),
    "orth_dion": dict(right_factor="qr"),
    "power_iters_2": dict(power_iters=2, qr_method="randomized_cholesky_qr"),
}


def dion_sketches(opts: dict, seed: int, index: int, step: int, rows: int, rank: int,
                  dtype: torch.dtype) -> list[np.ndarray] | None:
    """The sketches ``ortho_fast.Dion(seed=seed, **opts)`` draws for parameter ``index`` at
    ``step`` (>= 1), for ``dion_variant_tolerances(sketches=...)``.

    Shapes: one float64 (k, rows) array per power iteration, k = ``sketch_rows(rank,
    oversample)``, rows = max(m, n) (the working orientation); drawn as the optimizer does
    (``ortho_fast.sketch_generator`` on the CPU, in ``dtype``, the momentum dtype, or float32 for
    bfloat16 / float16). None when the optimizer draws none (another ``qr_method``, or k >= rows).
    Source: microsoft/dion ``orthogonalize`` (rcqr); ``ortho_fast.dion.gaussian_sketch``.
    """
    k = ortho_ref.sketch_rows(rank, opts.get("oversample", ortho_ref.dion.RCQR_OVERSAMPLE))
    if opts.get("qr_method") != "randomized_cholesky_qr" or k >= rows:
        return None
    gen = ortho_fast.sketch_generator(seed, index, step, "cpu")
    fdt = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    return [as_float64(ortho_fast.gaussian_sketch(gen, k, rows, fdt, "cpu")) for _ in range(opts.get("power_iters", 1))]


def _rounded(a: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    return as_float64(torch.tensor(a, dtype=dtype))


def check_dion(case: MatrixCase, rank_fraction: float, dtype: str, variant: str | None = None,
               state_dtype: str | None = None, *, lr: float = 0.01, mu: float = 0.95, weight_decay: float = 0.1,
               seed: int = 0) -> list[CheckResult]:
    """(d) One ``ortho_fast.Dion`` step (momentum, known Q and step injected through
    ``load_state_dict``) vs ``ortho_ref.dion_step`` from the same inputs (weight and gradient
    rounded to the parameter's ``dtype``, momentum and Q to ``state_dtype``, default ``dtype``).

    Default options (``variant`` and ``state_dtype`` None): rows ``dion_vs_reference``
    within ``dion_tolerances``, plus the error-feedback identity M_new = B − (1−μ)PRᵀ and
    PᵀP = I measured on the fast side's own P and R (``ortho_verify.error_feedback.identity_rows``).
    Otherwise the options of ``DION_VARIANTS[variant]`` on both sides (the reference's own
    sketches from ``seed``; the tolerance takes κ₂(Y R_s⁻¹) of the sketches the optimizer drew,
    ``dion_sketches``) and mixed precision (``state_dtype`` as microsoft/dion's
    ``DionMixedPrecisionConfig`` momentum_dtype = Q_dtype; B, P, R computed in it): rows
    ``dion_variant_vs_reference`` within ``dion_variant_tolerances``.
    Shapes: the case's matrix (m, n) is the gradient; r = ``dion_rank(m, n, rank_fraction)``;
    ``dtype`` / ``state_dtype`` name entries of ``TORCH_DTYPES``.
    Raises: KeyError for an unknown variant or dtype name.
    """
    from ortho_verify import error_feedback  # it builds on this module

    opts = DION_VARIANTS[variant] if variant is not None else {}
    g = case.matrix
    m, n = g.shape
    r = ortho_ref.dion_rank(m, n, rank_fraction)
    gscale = float(np.linalg.norm(g)) / math.sqrt(g.size)
    sdt_name = state_dtype or dtype
    tdt, sdt = TORCH_DTYPES[dtype], TORCH_DTYPES[sdt_name]
    w0, g = _rounded(_aux(case, "weight", g.shape, 0.02), tdt), _rounded(g, tdt)
    m0 = _rounded(_aux(case, "momentum", g.shape, gscale), sdt)
    q0 = _rounded(_aux(case, "Q0", ortho_ref.q_shape(m, n, r), 1.0), sdt)
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
