"""The conventions identification recognizes as known: the registered schedules of ``ortho_ref.SCHEDULES``
at their default step counts, the tables public systems use that the registry does not hold, and for
each schedule the normalizations (safety, eps, eps mode) in use, each with its source.

A kernel passes identification only with a known table and a known normalization for it; anything else
is named as a difference (the user who means it declares it, as ``check_orthogonalizer`` always took it).
docs/identification.md, "Known conventions".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import ortho_ref

__all__ = ["KNOWN_NORMALIZATIONS", "KNOWN_TABLES", "KnownSchedule", "known_schedule", "schedule_names"]


@dataclass(frozen=True)
class KnownSchedule:
    """A schedule identification recognizes: its ``rows`` for the default step count (``default_steps``),
    the table for other step counts (``table(steps)``: registered schedules extend by their tail rule; a
    known table by its last row), its own normalization (``safety``, ``eps``) and ``source``."""

    name: str
    rows: np.ndarray
    default_steps: int
    safety: float
    eps: float
    source: str
    registered: bool

    def table(self, steps: int) -> np.ndarray:
        if self.registered:
            return ortho_ref.schedule(self.name, steps)
        rows = self.rows[:steps]
        return np.concatenate([rows, np.repeat(self.rows[-1:], max(0, steps - len(rows)), axis=0)])


_PAPER_RAW = np.array([row for row in ortho_ref.SCHEDULES["polar_express_paper"].rows[:5]]) * \
    1.01 ** np.array([1.0, 3.0, 5.0])

#: Tables in public use that ``ortho_ref.SCHEDULES`` does not register: name -> (rows, safety, eps, source).
KNOWN_TABLES = {
    "polar_express_paper_safety_1.05": (
        _PAPER_RAW / 1.05 ** np.array([1.0, 3.0, 5.0]), 1.0, 1e-7,
        "Dao AI Lab gram-newton-schulz, coefficients.py POLAR_EXPRESS_COEFFICIENTS: the first five rows of Amsel et "
        "al. (arXiv 2505.16932) Algorithm 1 divided by (1.05, 1.05^3, 1.05^5); normalized by ‖X‖_F + 1e-7"),
}

#: (safety, eps, eps_mode) in use per schedule, beyond each schedule's own (safety, eps, "add"), with sources.
KNOWN_NORMALIZATIONS = {
    "jordan": {(1.0, 1e-7, "clamp"): "torch.optim.Muon _zeropower_via_newtonschulz: X / max(‖X‖_F, eps), eps 1e-7"},
    "polar_express": {(1.01, 1e-6, "add"): "karpathy/nanochat optim.py muon_step_fused: X / (1.01‖X‖_F + 1e-6)"},
    "cesista5": {(1.0, 1e-15, "clamp"): "NVIDIA Emerging-Optimizers muon_utils.newton_schulz: "
                                        "torch.nn.functional.normalize(x, eps=1e-15) = x / max(‖x‖_F, 1e-15)"},
}


def schedule_names() -> list[str]:
    """Every known schedule: the registered ones, then ``KNOWN_TABLES``."""
    return list(ortho_ref.SCHEDULES) + list(KNOWN_TABLES)


def known_schedule(name: str) -> KnownSchedule:
    """The ``KnownSchedule`` of a registered schedule or a ``KNOWN_TABLES`` entry.
    Raises: KeyError naming the schedule for an unknown name."""
    if name in ortho_ref.SCHEDULES:
        s = ortho_ref.SCHEDULES[name]
        return KnownSchedule(name, ortho_ref.schedule(name), s.default_steps, s.safety, s.eps, s.source, True)
    if name in KNOWN_TABLES:
        rows, safety, eps, source = KNOWN_TABLES[name]
        return KnownSchedule(name, np.asarray(rows, dtype=np.float64), len(rows), safety, eps, source, False)
    raise KeyError(f"schedule: unknown {name!r}; known: {schedule_names()}")


def known_normalization(name: str, safety: float, eps: float, eps_mode: str) -> str:
    """The source of (safety, eps, eps_mode) for schedule ``name`` when it is in use with it ("" when not):
    the schedule's own (safety, eps) added, or an entry of ``KNOWN_NORMALIZATIONS``."""
    sched = known_schedule(name)
    if (safety, eps, eps_mode) == (sched.safety, sched.eps, "add"):
        return sched.source
    return KNOWN_NORMALIZATIONS.get(name, {}).get((safety, eps, eps_mode), "")
