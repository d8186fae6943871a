"""The Newton–Schulz singular-value map of ``ortho-verify reproduce`` on the model's gradients
(Amsel et al., arXiv 2505.16932, Sec. 2)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

import ortho_fast
import ortho_ref
from ortho_fast.groups.muon import default_eps_mode

from ..report.tables import BAND_INTERVAL
from .config import SV_DTYPES, SV_SCHEDULES

__all__ = ["singular_value_study"]


def singular_value_study(gradients: Mapping[int, list], ns_dtypes: Sequence[str] = SV_DTYPES,
                         device: str = "cpu") -> tuple[dict, dict]:
    """The Newton–Schulz singular-value map of ``SV_SCHEDULES`` on real gradients.

    For each gradient G (float32 (m, n); ``gradients``: seed -> [(name, step, G)]) and schedule
    (5 steps, with the normalization ``ortho_fast.Muon`` uses for it: X₀ = G / (s‖G‖_F + eps),
    clamped for "jordan"): σ̂ = singular values of the normalized G (float64 SVD), the exact map
    f(σ̂) (``ortho_ref.ns_polynomial``), and X = ``ortho_fast.newton_schulz(G)`` computed in each
    of ``ns_dtypes`` on ``device``. Per "exact" and per dtype: ``rms`` = ‖X − U Vᵀ‖_F / √k, the
    distance to the polar factor of G (exact: ‖f(σ̂) − 1‖₂ / √k), averaged over the gradients
    of each seed; ``worst_in_band`` = max |uᵢᵀ X vᵢ − 1| (exact: |f(σ̂ᵢ) − 1|) over the
    directions with σ̂ᵢ in ``ortho_verify.report.tables.BAND_INTERVAL`` [1e-3, 1], over all gradients.

    Returns: (stats, points). stats = {"seeds", "gradients" (count per seed), "names",
    "steps", "below_band_fraction" (σ̂ < 1e-3), "schedules": {schedule: {"safety", "eps",
    "eps_mode", "steps", kind: {"rms_by_seed", "rms_mean", "worst_in_band"}}}} with kind in
    ("exact", *ns_dtypes); points = {(schedule, dtype): [(σ̂, uᵢᵀ X vᵢ)]} for
    ``ortho_verify.report.plots.singular_value_map``.
    Source: Amsel et al., arXiv 2505.16932, Sec. 2 (NS as a polynomial of the singular values).
    Raises: ValueError for no gradients.
    """
    seeds = sorted(gradients)
    if not seeds or not all(gradients[s] for s in seeds):
        raise ValueError("gradients: expected at least one gradient per seed")
    lo, hi = BAND_INTERVAL
    stats: dict = {"seeds": seeds, "gradients": len(gradients[seeds[0]]),
                   "names": sorted({n for s in seeds for n, _, _ in gradients[s]}),
                   "steps": sorted({st for s in seeds for _, st, _ in gradients[s]}), "schedules": {}}
    points: dict = {}
    below = total = 0
    for name in SV_SCHEDULES:
        sched = ortho_fast.COEFFICIENTS[name]
        eps_mode = default_eps_mode(name)
        table = ortho_ref.schedule(name)
        kinds = ("exact", *ns_dtypes)
        rms = {k: {s: [] for s in seeds} for k in kinds}
        worst = dict.fromkeys(kinds, 0.0)
        for seed in seeds:
            for _, _, g in gradients[seed]:
                a = g.astype(np.float64)
                u, _, vt = ortho_ref.svd(a)
                sigma = ortho_ref.normalized_singular_values(a, safety=sched.safety, eps=sched.eps, eps_mode=eps_mode)
                band = (sigma >= lo) & (sigma <= hi)
                if name == SV_SCHEDULES[0]:
                    below, total = below + int((sigma < lo).sum()), total + len(sigma)
                f = ortho_ref.ns_polynomial(sigma, table)
                rms["exact"][seed].append(float(np.linalg.norm(f - 1) / math.sqrt(len(f))))
                worst["exact"] = max(worst["exact"], float(np.abs(f[band] - 1).max(initial=0.0)))
                for dtype in ns_dtypes:
                    x = ortho_fast.newton_schulz(torch.from_numpy(g).to(device), name, safety=sched.safety,
                                                 eps=sched.eps, eps_mode=eps_mode, dtype=getattr(torch, dtype))
                    x = x.to(torch.float64).cpu().numpy()
                    projected = np.einsum("ij,ik,kj->j", u, x, vt.T)
                    points.setdefault((name, dtype), []).append((sigma, projected))
                    rms[dtype][seed].append(float(np.linalg.norm(x - u @ vt) / math.sqrt(len(sigma))))
                    worst[dtype] = max(worst[dtype], float(np.abs(projected[band] - 1).max(initial=0.0)))
        entry = {"safety": sched.safety, "eps": sched.eps, "eps_mode": eps_mode, "steps": len(table)}
        for k in kinds:
            by_seed = [float(np.mean(rms[k][s])) for s in seeds]
            entry[k] = {"rms_by_seed": by_seed, "rms_mean": float(np.mean(by_seed)), "worst_in_band": worst[k]}
        stats["schedules"][name] = entry
    stats["below_band_fraction"] = below / total
    return stats, points
