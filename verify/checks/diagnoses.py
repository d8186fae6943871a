"""Diagnoses: the likely cause of a failed check, in words (``CheckResult.cause``).

Run only on failures, so a passing run pays nothing. Each function looks at what the failing
implementation produced and names the simplest explanation it can confirm numerically:
a map that goes negative (the update ascends), a divergence, an update off by a constant
factor (compared with the known lr scales), a momentum that matches another known form or
none, a state of an unexpected shape. docs/verification.md, "Diagnoses".
"""

from __future__ import annotations

import dataclasses

import numpy as np

import ortho_ref

from ..kinds import headline_cause
from ..report.results import CheckResult

__all__ = ["CAUSE_TEXT", "LR_SCALE_ALIASES", "headline_cause", "lr_scale_pair", "map_candidates",
           "momentum_form_candidates", "map_fit_cause", "momentum_cause", "ns_output_cause", "scale_cause",
           "with_cause"]

#: lr-scale modes that are other libraries' names for the same scale (``MuonConventions.adjust_lr``):
#: a cause names the canonical one only.
LR_SCALE_ALIASES = {"shape_scaling": "original", "unit_rms_norm": "spectral_norm"}


def with_cause(row: CheckResult, cause: str) -> CheckResult:
    """``row`` with its ``cause`` set and prepended to its note (so every summary shows it; a
    copy; a passed row or an empty cause returns the row unchanged)."""
    if row.passed or not cause or cause == row.cause:
        return row
    note = row.note.removeprefix(f"cause: {row.cause}").removeprefix("; ") if row.cause else row.note
    return dataclasses.replace(row, cause=cause, note=f"cause: {cause}" + (f"; {note}" if note else ""))


def _intervals(x: np.ndarray, mask: np.ndarray) -> str:
    """'[a, b]' of the values of ``x`` where ``mask`` holds (the hull; ``x`` any order)."""
    sel = x[mask]
    return f"[{sel.min():.3g}, {sel.max():.3g}]"


def ns_output_cause(fast: np.ndarray, a: np.ndarray, table, *, safety: float, eps: float, eps_mode: str,
                    tolerance: float, lr_shape: tuple[int, int] | None = None) -> str:
    """The likely cause of a failed Newton–Schulz comparison of ``fast`` with ns_map(``a``).

    In order: NaN / Inf in the output (the iteration diverged: a coefficient of the wrong sign,
    a missing normalization); the declared map f itself negative on part of [σ̂_min, σ̂_max] (the
    reference ascends there: the schedule, e.g. a table cycled past its length, is wrong); the
    computed map uᵢᵀ fast vᵢ negative beyond ``tolerance`` on some σ̂ (the update ascends
    along those directions); the output a constant multiple s of ns_map(a) (to within
    ``tolerance``: a scale bug; with ``lr_shape`` = (m, n) s is compared with the ratios of the
    known lr scales of ``ortho_ref.lr_scale``). "" when none applies.
    Shapes: fast, a (m, n) float64; table (T, 3).
    """
    if not np.all(np.isfinite(fast)):
        return ("output has NaN or Inf: the iteration diverged (a coefficient of the wrong sign, e.g. b > 0, or an "
                "input not normalized)")
    u, s, vt = ortho_ref.svd(a)
    sigma_hat = ortho_ref.normalized_singular_values(a, safety=safety, eps=eps, eps_mode=eps_mode)
    f = ortho_ref.ns_polynomial(sigma_hat, table)
    grid = np.geomspace(max(float(sigma_hat.min()), 1e-3), max(float(sigma_hat.max()), 1e-3), 200)
    declared = ortho_ref.ns_polynomial(grid, table)
    if np.any(declared < 0):
        return (f"the declared map f is negative on sigma_hat in {_intervals(grid, declared < 0)}: a step with it "
                "ascends (the coefficient table is wrong, e.g. cycled past its length)")
    k = len(sigma_hat)
    projected = np.einsum("ij,ik,kj->j", u[:, :k], fast, vt[:k].T)
    negative = projected < -tolerance
    if np.any(negative):
        return (f"map negative on sigma_hat in {_intervals(sigma_hat, negative)}: the update ascends along "
                f"{int(negative.sum())} of {k} directions (e.g. a coefficient table cycled past its length)")
    if min(a.shape) < 2 or int(np.sum(s > 1e-12 * max(float(s.max()), 1e-300))) < 2 or \
            float(np.ptp(sigma_hat)) <= 1e-2 * float(sigma_hat.max()):
        return ""  # 1x1, rank 1 or a flat spectrum: any deviation is a constant factor there; it decides nothing
    ref = ortho_ref.ns_map(a, table, safety=safety, eps=eps, eps_mode=eps_mode)
    cause = scale_cause(fast, ref, tolerance, lr_shape)
    if cause:
        return cause
    return map_fit_cause(projected - f, sigma_hat, table, tolerance=tolerance, lr_shape=lr_shape)


def map_candidates(sigma_hat: np.ndarray, table) -> dict:
    """Per known kind of systematic error, the map it gives as a function of one relative change
    ε (the deviation from f(σ̂) is g(ε) − f): the output scaled by 1 + ε (an lr scale, a constant
    factor), the normalization scaled (σ̂ → σ̂/(1 + ε): a safety factor or an eps other than
    declared, eps added vs clamped), one coefficient a, b or c scaled by 1 + ε in every step."""
    table = np.asarray(table, dtype=np.float64)
    f = ortho_ref.ns_polynomial(sigma_hat, table)

    def coefficient(j):
        def g(e):
            t = table.copy()
            t[:, j] *= 1 + e
            return ortho_ref.ns_polynomial(sigma_hat, t) - f
        return g

    return {"output": lambda e: e * f,
            "normalization": lambda e: ortho_ref.ns_polynomial(sigma_hat / (1 + e), table) - f,
            "a": coefficient(0), "b": coefficient(1), "c": coefficient(2)}


CAUSE_TEXT = {
    "output": "the update is off by a constant factor {f:.4g}",
    "normalization": "the input is normalized by another scale, x{f:.4g} of the declared s‖U‖_F (a safety factor or "
                     "eps other than declared, or eps added vs clamped)",
    "coefficient": "a Newton–Schulz coefficient differs from the declared schedule ({detail})",
}


def map_fit_cause(deviation: np.ndarray, sigma_hat: np.ndarray, table, *, tolerance: float = 0.0,
                  explained: float = 0.9, lr_shape: tuple[int, int] | None = None) -> str:
    """The one known systematic error that explains a per-direction deviation d(σ̂) of the map,
    ranked by fitting each candidate of ``map_candidates`` (one relative change ε, least squares
    over the directions, exact map, |ε| ≤ 0.2) and comparing the fraction of ‖d‖² each explains.
    The best is named with its fitted factor when it explains at least ``explained``; the three
    coefficient candidates count as one cause ("a coefficient differs") and name the coefficient
    only when its fit is at least 4 times better (residual) than the other two's — never a list.
    "" when nothing explains it or there are fewer than 3 directions (they cannot separate the
    candidates). Shapes: deviation, sigma_hat (k,) or (J, k) (fitted jointly)."""
    from scipy.optimize import minimize_scalar

    d = np.asarray(deviation, dtype=np.float64).reshape(-1)
    x = np.asarray(sigma_hat, dtype=np.float64).reshape(-1)
    if d.size < 3 or not np.all(np.isfinite(d)) or float(d @ d) == 0 or float(np.ptp(x)) <= 1e-2 * float(x.max()):
        return ""
    fits = {}
    for name, g in map_candidates(x, table).items():
        res = minimize_scalar(lambda e: float(np.sum((d - g(e)) ** 2)), bounds=(-0.2, 0.2), method="bounded",
                              options={"xatol": 1e-7})
        fits[name] = (float(res.fun) / float(d @ d), float(res.x))
    best = min(fits, key=lambda k: fits[k][0])
    resid, e = fits[best]
    if 1 - resid < explained:
        return ""
    if best in "abc":
        others = sorted(fits[k][0] for k in "abc" if k != best)
        which = (f"best fit: {best} x{1 + e:.4g}, residual {resid:.1e} vs {others[0]:.1e} for the next coefficient"
                 if others[0] >= 4 * resid else "a, b and c fit alike on these inputs")
        text = CAUSE_TEXT["coefficient"].format(detail=which)
    else:
        text = CAUSE_TEXT[best].format(f=1 + e)
        pair = lr_scale_pair(1 + e, *lr_shape) if best == "output" and lr_shape is not None else ""
        text += f" on a {lr_shape[0]}x{lr_shape[1]} matrix: matches the lr scale {pair}" if pair else ""
    return f"{text}; explains {100 * (1 - resid):.1f}% of the deviation over {d.size} directions"


def scale_cause(fast: np.ndarray, ref: np.ndarray, tolerance: float, lr_shape: tuple[int, int] | None = None) -> str:
    """"off by a constant factor s" when ‖fast − s·ref‖_F ≤ max(tolerance, 1e-3‖ref‖_F) for the
    least-squares s = ⟨fast, ref⟩/⟨ref, ref⟩ ≠ 1, naming the pair of lr scales (``ortho_ref.lr_scale``
    modes, with 0.2 and 5 for Moonlight's / Megatron's factor) whose ratio on ``lr_shape`` = (m, n)
    is within 1% of s; "" otherwise."""
    denom = float(np.sum(ref * ref))
    if denom == 0:
        return ""
    s = float(np.sum(fast * ref)) / denom
    if abs(s - 1) < 1e-3 or np.linalg.norm(fast - s * ref) > max(tolerance, 1e-3 * np.sqrt(denom)):
        return ""
    text = f"update off by a constant factor s = {s:.4g}"
    if lr_shape is not None:
        m, n = lr_shape
        names = [mode for mode in ortho_ref.muon.ADJUST_LR_MODES if mode is not None and mode not in LR_SCALE_ALIASES]
        scales = {str(mode): ortho_ref.lr_scale(mode, m, n) for mode in names} | {"None": 1.0}
        pair = lr_scale_pair(s, m, n)
        text += f" on a {m}x{n} matrix" + (f": matches the lr scale {pair}" if pair else
                                           ": no ratio of known lr scales (" + ", ".join(scales) + ") explains it")
    return text


def lr_scale_pair(s: float, m: int, n: int, within: float = 0.01) -> str:
    """"used where declared is declared": the one pair of known lr scales (``ortho_ref.lr_scale``
    modes without the aliases of ``LR_SCALE_ALIASES``, and None = 1) whose ratio on (m, n) is
    closest to ``s`` (within ``within`` relative; a tie goes to a pair without None); "" if none."""
    names = [mode for mode in ortho_ref.muon.ADJUST_LR_MODES if mode is not None and mode not in LR_SCALE_ALIASES]
    scales = {str(mode): ortho_ref.lr_scale(mode, m, n) for mode in names} | {"None": 1.0}
    matches = sorted((abs(a / b / s - 1), used == "None" or declared == "None", f"{used} where {declared} is declared")
                     for used, a in scales.items() for declared, b in scales.items()
                     if used != declared and abs(a / b / s - 1) < within)
    return matches[0][2] if matches else ""


def momentum_cause(fast: np.ndarray, grad: np.ndarray, previous: np.ndarray, *, mu: float, declared: str,
                   tolerance: float) -> str:
    """Which known momentum form the buffer ``fast`` matches (to ``tolerance``), when it is not
    the ``declared`` one: "ema" μM + (1−μ)G, "classic" μM + G, "gradient only" G, the buffer not
    updated, or the right form normalized in place to unit Frobenius norm; otherwise that it
    differs from every known form (with its norm against the expected one)."""
    forms = {"ema": mu * previous + (1 - mu) * grad, "classic": mu * previous + grad, "gradient only": grad,
             "not updated": previous}
    expected = forms[declared]
    for name, value in forms.items():
        if name != declared and np.linalg.norm(fast - value) <= tolerance:
            return f"momentum matches the {name} form, not the declared {declared!r}"
    norm = float(np.linalg.norm(expected))
    if norm > 0 and np.linalg.norm(fast - expected / norm) <= max(tolerance, 1e-3):
        return (f"momentum normalized in place: the stored buffer has norm {np.linalg.norm(fast):.3g} instead of "
                f"{norm:.3g} (the {declared} form divided by its norm)")
    return (f"momentum differs from every known momentum form (ema, classic, gradient only, not updated, normalized); "
            f"norm {np.linalg.norm(fast):.3g}, expected {norm:.3g}")


def momentum_form_candidates(conv, grad, m_prev, *, mu: float, table, safety: float, eps: float,
                             step: int | None = None) -> list[tuple[str, np.ndarray]]:
    """(label, Newton–Schulz input U′) of the momentum forms other than the declared one that an
    optimizer commonly computes: Nesterov dropped / added, the other momentum style, both, the
    Nesterov mix written as G + μ·M_new on the declared buffer (the classic form on an EMA buffer,
    or the EMA lerp on a classic one), and Adam-style bias correction dropped / added (optax's
    debiased mix; only with ``step``). Each alternative keeps every other declared convention: the
    Nesterov form, and the bias correction where it is defined (an EMA mix) at the 1-based
    ``step``. ``grad``: the gradient the momentum takes (with the L2 term of a declared "l2"
    weight-decay style already added). Shapes: (m, n) float64 each."""
    out = []

    def ns_input(nesterov, style, bias):
        form = conv.nesterov_form if nesterov else "mix"
        bias = bias and style == "ema" and form == "mix" and step is not None
        return ortho_ref.muon.momentum_update(grad, m_prev, mu=mu, nesterov=nesterov, momentum_style=style,
                                              nesterov_form=form, bias_correction=bias,
                                              step=step if bias else None)

    for nesterov, style in ((not conv.nesterov, conv.momentum_style),
                            (conv.nesterov, "classic" if conv.momentum_style == "ema" else "ema"),
                            (not conv.nesterov, "classic" if conv.momentum_style == "ema" else "ema")):
        _, u = ns_input(nesterov, style, conv.bias_correction)
        what = "the Nesterov term dropped" if conv.nesterov and not nesterov else \
            "a Nesterov term added" if nesterov and not conv.nesterov else f"{style} momentum"
        out.append((f"nesterov={nesterov}, momentum_style={style!r} ({what})", u))
    if conv.nesterov and conv.nesterov_form == "mix":
        m_new, _ = ns_input(True, conv.momentum_style, False)
        if conv.momentum_style == "ema":
            out.append(("the Nesterov mix written as G + mu*M on the EMA buffer (the classic form) instead of "
                        "lerp(G, M, mu)", grad + mu * m_new))
        else:
            out.append(("the Nesterov mix written as lerp(G, M, mu) on the classic buffer instead of G + mu*M",
                        (1 - mu) * grad + mu * m_new))
    elif conv.nesterov:  # declared "full_grad": the mix of its style instead
        _, u = ortho_ref.muon.momentum_update(grad, m_prev, mu=mu, nesterov=True, momentum_style=conv.momentum_style)
        out.append(("nesterov_form='mix' (the Nesterov mix of the declared style) instead of 'full_grad' "
                    "(G + mu*M)", u))
    if conv.momentum_style == "ema" and conv.nesterov_form == "mix" and step is not None:
        _, u = ns_input(conv.nesterov, "ema", not conv.bias_correction)
        out.append(("bias_correction=False (the momentum without Adam-style debiasing)" if conv.bias_correction
                    else "bias_correction=True (Adam-style debiasing of the momentum, as optax's Muon)", u))
    return out
