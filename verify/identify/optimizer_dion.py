"""Dion and Dion2 identification: which algorithm a probed optimizer runs (a right factor Q in its
state: Dion; ``fraction`` / ``ef_decay`` keywords: Dion2), and its ``DionConventions`` /
``Dion2Conventions`` recovered by replaying a probe's second step through the oracle for each
candidate (docs/verification.md, "Identifying an optimizer")."""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

import ortho_ref

from ..conventions import Dion2Conventions, DionConventions, table_and_normalization
from .optimizer_probes import Prober, spectrum_matrix
from .result import Evidence

__all__ = ["DION_QR_NAMES", "dion_q_key", "identify_dion", "identify_dion2", "is_dion2"]

#: microsoft/dion's ``qr_method`` names -> ``ortho_ref.QR_METHODS``.
DION_QR_NAMES = {"qr": "householder", "cqr": "cholesky_qr", "rcqr": "randomized_cholesky_qr"}
_SHAPE = (16, 24)  # wide: Q has 16 rows in the min-side orientation, 24 when never transposed
_LR, _MU, _WD = 0.05, 0.8, 0.1


def is_dion2(defaults: dict) -> bool:
    """Whether the signature is Dion2's (keywords ``fraction`` and ``ef_decay``)."""
    return "fraction" in defaults and "ef_decay" in defaults


def dion_q_key(state: dict, shape) -> str | None:
    """The key of a right factor Q in a parameter's flat state: a 2-D tensor of min(m, n) or n rows and
    fewer columns than its rows allow that is not the momentum (shape (m, n)) nor a row statistic."""
    m, n = shape
    for key, v in state.items():
        if v.ndim == 2 and v.shape != (m, n) and v.shape[0] in (min(m, n), n) and 1 < v.shape[1] <= min(m, n):
            return key
    return None


def _momentum_key(state: dict, shape) -> str | None:
    return next((k for k, v in state.items() if v.shape == tuple(shape) and np.any(v)), None)


def identify_dion(prober: Prober, defaults: dict, rng, evidence: list, differences: list) -> DionConventions:
    """DionConventions from a 2-step probe on a 16×24 parameter (at rank_fraction 0.5 when the signature
    has that keyword and it is not given: at full rank error feedback leaves no trace): the keys of the
    momentum and Q, then each
    candidate (error feedback, right factor, orientation, power iterations) replayed from the observed
    state before step 2 (``ortho_ref.dion_step``) against the weight after it; the qr method and
    epsilon are the signature's (every QR method gives the same P up to column signs: not observable)."""
    from ..checks.dion import never_transposed_dion_step

    if "rank_fraction" in defaults and "rank_fraction" not in prober.extra_kwargs:
        prober = Prober(prober.optimizer, prober.names, {**prober.extra_kwargs, "rank_fraction": 0.5})
    grads = [spectrum_matrix(_SHAPE, np.geomspace(1.0, 1e-1, min(_SHAPE)), rng) for _ in range(2)]
    w0 = 0.02 * rng.standard_normal(_SHAPE)
    run = prober.run([w0], [[g] for g in grads], lr=_LR, mu=_MU, wd=_WD)
    if run.error is not None:
        raise ValueError(f"optimizer: probed two Dion steps on a 16x24 parameter; it raised "
                         f"{type(run.error).__name__}: {run.error}")
    s1 = run.states[0][0]
    q_key, m_key = dion_q_key(s1, _SHAPE), _momentum_key(s1, _SHAPE)
    w1, w2 = run.weights[1][0], run.weights[2][0]
    m1, q1 = s1[m_key], s1[q_key]
    eps = float(defaults.get("epsilon", 1e-8) or 1e-8)
    qr = DION_QR_NAMES.get(defaults.get("qr_method"), "householder")
    powers = sorted({1, int(defaults.get("power_iters", 1) or 1)})
    ranked = []
    for ef, right, orientation, power in itertools.product((True, False), ortho_ref.RIGHT_FACTORS,
                                                          ("min_side", "never_transpose"), powers):
        opts = dict(lr=_LR, mu=_MU, weight_decay=_WD, epsilon=eps, power_iters=power, error_feedback=ef,
                    right_factor=right)
        try:
            if orientation == "never_transpose":
                if q1.shape[0] != _SHAPE[1]:
                    continue
                ref = never_transposed_dion_step(w1, grads[1], m1, q1, **opts)
            else:
                if q1.shape[0] != min(_SHAPE):
                    continue
                ref = ortho_ref.dion_step(w1, grads[1], m1, q1, **opts)
        except ValueError:
            continue
        m2 = run.states[1][0][m_key]  # error feedback shows in the momentum after the step, not in W2
        err = float(np.linalg.norm(w2 - ref.weight)) / float(np.linalg.norm(w2 - w1)) + float(
            np.linalg.norm(m2 - ref.momentum)) / float(np.linalg.norm(m2))
        ranked.append((err, dict(error_feedback=ef, right_factor=right, orientation=orientation, power_iters=power)))
    ranked.sort(key=lambda r: r[0])
    best = ranked[0]
    # the weight moves by lr·√(m/n)·PQᵀ; a float32 step reproduces it to ~1e-5 of that, a wrong form by O(1)
    evidence.append(Evidence("dion_form", best[1], best[0], ranked[1][1] if len(ranked) > 1 else None,
                             ranked[1][0] if len(ranked) > 1 else math.inf, 1e-2,
                             f"step 2 replayed from the observed M, Q (rank {q1.shape[1]} of {min(_SHAPE)}); "
                             "‖W2 - W2_ref‖ / ‖W2 - W1‖ + ‖M2 - M2_ref‖ / ‖M2‖"))
    evidence.append(Evidence("rank", int(q1.shape[1]), 0.0, note=f"state[{q_key!r}] has shape {q1.shape}"))
    if best[0] > 1e-2:
        differences.append(f"the Dion step matches no candidate: closest {best[1]} leaves {best[0]:.3g} of the update")
    return DionConventions(epsilon=eps, momentum_state_key=m_key, q_state_key=q_key, qr_method=qr,
                           hyperparameter_names=dict(prober.names), extra_kwargs=dict(prober.extra_kwargs),
                           **best[1])


def identify_dion2(optimizer, defaults: dict, extra_kwargs: dict, evidence: list, differences: list, *, seed: int):
    """(Dion2Conventions, rows) by judging each candidate (adjust_lr × the registered schedules' closest two)
    with ``check_dion2_optimizer`` for one step and keeping the one with the smallest worst error /
    tolerance; rows: the chosen one's three-step check."""
    from ..checks.dion2 import check_dion2_optimizer

    names = {k: k for k in ("lr", "fraction", "ef_decay", "weight_decay")}
    ranked = []
    for coefficients, mode in itertools.product(("polar_express", "jordan", "cesista5"),
                                                ("spectral_norm", "rms_norm", None)):
        conv = Dion2Conventions(coefficients=coefficients, adjust_lr=mode, hyperparameter_names=names,
                                extra_kwargs=dict(extra_kwargs))
        try:
            rows = check_dion2_optimizer(optimizer, conv, steps=1, seed=seed)
        except (KeyError, TypeError, ValueError):
            continue
        worst = max((r.error / r.tolerance if r.tolerance else (0.0 if r.passed else math.inf)) for r in rows)
        ranked.append((worst, (coefficients, mode), conv))
    if not ranked:
        raise ValueError("optimizer: probed as Dion2 (keywords fraction, ef_decay); no candidate could be run")
    ranked.sort(key=lambda r: (r[0], r[1][0] != "polar_express"))
    mode_ranked = _dion2_scale(optimizer, names, extra_kwargs, ranked[0][2], seed)
    if mode_ranked:
        mode = mode_ranked[0][1]
        evidence.append(Evidence("adjust_lr", mode, mode_ranked[0][0], mode_ranked[1][1], mode_ranked[1][0], math.nan,
                                 "one step from zero momentum on 16x40, 40x16, 24x24: ‖W1 - W1_ref‖ / ‖W1 - W0‖ "
                                 "per mode, a ranking (the judge's weight rows make no claim in bfloat16)"))
        ranked = [(r[0], r[1], r[2]) for r in ranked if r[1][1] == mode] or ranked
    evidence.append(Evidence("dion2_schedule_and_scale", ranked[0][1], ranked[0][0],
                             ranked[1][1] if len(ranked) > 1 else None,
                             ranked[1][0] if len(ranked) > 1 else math.inf, 1.0,
                             "one step judged per candidate (check_dion2_optimizer); worst error / tolerance"))
    if ranked[0][0] > 1:
        differences.append(f"no Dion2 declaration fits: closest {ranked[0][1]} leaves {ranked[0][0]:.3g}")
    conv = ranked[0][2]
    return conv, check_dion2_optimizer(optimizer, conv, steps=3, seed=seed, param_dtype=torch.float32)


def _dion2_scale(optimizer, names, extra_kwargs, conv, seed) -> list:
    """adjust_lr modes of Dion2 ranked by ‖W1 − W1_ref‖_F / ‖W1 − W0‖_F after one step from a zero
    momentum (``ortho_ref.dion2.dion2_step`` with each mode) on a wide, a tall and a square matrix; the
    modes' scales differ by ≥ 20 % there, a bfloat16 Newton–Schulz output by ~1 %. [] if the step raises."""
    from ortho_ref.dion2 import dion2_step

    rng = np.random.default_rng(seed + 2)
    shapes = ((16, 40), (40, 16), (24, 24))
    w0 = [0.02 * rng.standard_normal(s) for s in shapes]
    grads = [rng.standard_normal(s) for s in shapes]
    hyper = dict(lr=_LR, fraction=0.25, ef_decay=0.95, weight_decay=_WD)
    params = [torch.nn.Parameter(torch.tensor(w, dtype=torch.float32)) for w in w0]
    try:
        opt = optimizer(params, **{names[k]: v for k, v in hyper.items()}, **extra_kwargs)
        for p, g in zip(params, grads):
            p.grad = torch.tensor(g, dtype=torch.float32)
        opt.step()
    except Exception:  # noqa: BLE001 - the user's code; the judge's rows report it
        return []
    w1 = [p.detach().double().numpy() for p in params]
    w0 = [torch.tensor(w, dtype=torch.float32).double().numpy() for w in w0]
    table, safety, eps = table_and_normalization(conv.coefficients, conv.ns_steps, conv.safety, conv.epsilon)
    ranked = []
    for mode in ("spectral_norm", "rms_norm", None):
        err = 0.0
        for a, b, g in zip(w0, w1, grads):
            ref = dion2_step(a, g, np.zeros_like(a), adjust_lr=mode, coefficients=table, safety=safety,
                             eps=eps, **hyper)
            err = max(err, float(np.linalg.norm(b - ref.weight)) / max(float(np.linalg.norm(b - a)), 1e-300))
        ranked.append((err, mode, None))
    return sorted(ranked, key=lambda r: r[0])
