"""Registry of Newton–Schulz coefficient schedules, each with its source.

A schedule gives ``rows`` (a, b, c) for steps 1..len(rows) and a ``tail`` row repeated
for every later step (the convention of microsoft/dion and NVIDIA Emerging-Optimizers for
``steps`` beyond the table), plus the input normalization its source uses:
X₀ = X / (safety·‖X‖_F + eps).

Names used elsewhere (Megatron / NVIDIA Emerging-Optimizers ``coefficient_type``): "simple" is
``jordan``, "quintic" is ``cesista5``, "cubic" is ``cubic``; Emerging-Optimizers'
"polar_express" is ``polar_express_paper`` rounded to 4 decimals and run for >= 8 steps — pass
its rows as a user table to reproduce it exactly. It is not this registry's ``polar_express``
(microsoft/dion's rows, 5 steps, safety 1.02).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Union

import torch


@dataclass(frozen=True)
class CoefficientSchedule:
    """A named Newton–Schulz schedule: its per-step odd-quintic rows, normalization and source.

    Step k maps X ← a_k·X + (b_k·A + c_k·A²)·X with A = X·Xᵀ; ``table(steps)`` gives the rows of a run
    of ``steps`` steps. The registered schedules are ``ortho_fast.COEFFICIENTS``.

    Parameters
    ----------
    name : str
        The registry name ("jordan", "polar_express", ...).
    rows : tuple of (a, b, c) float triples
        The per-step coefficients, in order.
    tail : (a, b, c) float triple
        The row used after ``rows`` runs out.
    default_steps : int
        The step count its source uses.
    safety, eps : float
        Its normalization X₀ = G / (safety·‖G‖_F + eps).
    source : str
        The paper or code it comes from.

    References
    ----------
    Each schedule's ``source`` (Jordan et al. 2024; Amsel et al. 2025, "The Polar Express",
    arXiv 2505.16932; ...).

    Examples
    --------
    >>> import ortho_fast
    >>> schedule = ortho_fast.COEFFICIENTS["polar_express"]
    >>> len(schedule.table(7)), schedule.safety
    (7, 1.02)
    """

    name: str
    rows: tuple[tuple[float, float, float], ...]
    tail: tuple[float, float, float]
    default_steps: int
    safety: float
    eps: float
    source: str

    def table(self, steps: int | None = None) -> list[tuple[float, float, float]]:
        """The per-step rows of a run of ``steps`` steps.

        Parameters
        ----------
        steps : int, optional
            The number of steps (≥ 1); None: ``default_steps``.

        Returns
        -------
        list of (a, b, c) float triples
            ``rows[:steps]``, then ``tail`` for the steps beyond ``rows``.

        Raises
        ------
        ValueError
            Naming ``steps`` when it is not an integer ≥ 1.
        """
        t = self.default_steps if steps is None else steps
        if not isinstance(t, int) or isinstance(t, bool) or t < 1:
            raise ValueError(f"steps: expected an integer >= 1, got {steps!r}")
        return list(self.rows[:t]) + [self.tail] * max(0, t - len(self.rows))


# Polar Express, paper Algorithm 1 (l = 1e-3), before the 1.01 safety division.
_POLAR_EXPRESS_PAPER_RAW = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
)

_POLAR_EXPRESS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)

_CESISTA5 = (
    (4.0848, -6.8946, 2.9270),
    (3.9505, -6.3029, 2.6377),
    (3.7418, -5.5913, 2.3037),
    (2.8769, -3.1427, 1.2046),
    (2.8366, -3.0525, 1.2012),
)

_YOU6 = tuple(
    (a / 1024, b / 1024, c / 1024)
    for a, b, c in (
        (3955, -8306, 5008),
        (3735, -6681, 3463),
        (3799, -6499, 3211),
        (4019, -6385, 2906),
        (2677, -3029, 1162),
        (2172, -1833, 682),
    )
)

COEFFICIENTS: dict[str, CoefficientSchedule] = {
    s.name: s
    for s in (
        CoefficientSchedule(
            name="jordan", rows=(), tail=(3.4445, -4.7750, 2.0315), default_steps=5, safety=1.0, eps=1e-7,
            source="Keller Jordan, Muon blog post (2024); torch.optim.Muon default ns_coefficients",
        ),
        CoefficientSchedule(
            name="cesista5", rows=_CESISTA5, tail=_CESISTA5[-1], default_steps=5, safety=1.0, eps=1e-7,
            source="F. L. Cesista (2025); NVIDIA Emerging-Optimizers coefficient_type='quintic'; "
            "optax contrib dion; microsoft/dion use_polar_express=False",
        ),
        CoefficientSchedule(
            name="polar_express", rows=_POLAR_EXPRESS, tail=_POLAR_EXPRESS[-1], default_steps=5,
            safety=1.02, eps=1e-6,
            source="Amsel, Persson, Musco, Gower, arXiv 2505.16932, as used by microsoft/dion, "
            "nanochat and modded-nanogpt (normalize with safety 1.02, eps 1e-6)",
        ),
        CoefficientSchedule(
            name="polar_express_paper",
            rows=tuple((a / 1.01, b / 1.01**3, c / 1.01**5) for a, b, c in _POLAR_EXPRESS_PAPER_RAW),
            tail=(1.875, -1.25, 0.375), default_steps=5, safety=1.01, eps=1e-7,
            source="Amsel et al., arXiv 2505.16932, Algorithm 1 with l = 1e-3: steps <= 7 divided by "
            "(1.01, 1.01^3, 1.01^5); steps >= 8 use (15/8, -10/8, 3/8)",
        ),
        CoefficientSchedule(
            name="you6", rows=_YOU6, tail=_YOU6[-1], default_steps=6, safety=1.0, eps=1e-7,
            source="You Jiacheng, six-step schedule (modula, modded-nanogpt); integer rows / 1024",
        ),
        CoefficientSchedule(
            name="cubic", rows=(), tail=(1.5, -0.5, 0.0), default_steps=5, safety=1.0, eps=1e-7,
            source="classic cubic Newton–Schulz iteration for the polar factor "
            "(Kovarik 1970; Bjorck & Bowie 1971); converges to U Vᵀ",
        ),
    )
}

CoefficientsLike = Union[str, CoefficientSchedule, Sequence[Sequence[float]]]


class UnknownScheduleError(KeyError, ValueError):
    """An unknown schedule name: both a KeyError (a failed registry look-up) and a ValueError.

    ``str()`` gives the message without KeyError's quotes; the message names the argument and lists the
    registered schedules (``ortho_fast.COEFFICIENTS``).

    Examples
    --------
    >>> import torch, ortho_fast
    >>> try:
    ...     ortho_fast.newton_schulz(torch.eye(3), "nonexistent")
    ... except ortho_fast.UnknownScheduleError as error:
    ...     print(isinstance(error, ValueError) and isinstance(error, KeyError))
    True
    """

    __str__ = ValueError.__str__


def schedule_of(coefficients: CoefficientsLike) -> CoefficientSchedule | None:
    """The registry schedule ``coefficients`` names (or is), None for a user table.

    Raises: UnknownScheduleError (KeyError and ValueError) naming ``coefficients`` and listing
    the registry for an unknown name.
    """
    if isinstance(coefficients, CoefficientSchedule):
        return coefficients
    if not isinstance(coefficients, str):
        return None
    if coefficients not in COEFFICIENTS:
        raise UnknownScheduleError(
            f"coefficients: unknown schedule {coefficients!r}; expected one of {sorted(COEFFICIENTS)} "
            "or a (T, 3) table of (a, b, c) rows")
    return COEFFICIENTS[coefficients]


def resolve_coefficients(coefficients: CoefficientsLike, steps: int | None = None) -> list[tuple[float, float, float]]:
    """Turn a registry name, a schedule, or a user table into per-step (a, b, c) rows.

    A user table (T, 3) (a list of rows or a tensor) runs T steps by default; ``steps``
    beyond T repeats its last row, fewer truncates. A single (a, b, c) row counts as T = 1
    with the default of 5 steps (torch.optim.Muon's ``ns_coefficients`` convention).
    Shapes: coefficients (T, 3) or (3,) -> list of T' = steps (or T) tuples (a, b, c), float.
    Raises: UnknownScheduleError (a KeyError and a ValueError) for an unknown name, listing the
    registry; TypeError for something that is not a name, a schedule or numbers; ValueError for
    a table that is not (T, 3) with finite entries, a divergent table (``check_bounded_table``), or
    steps < 1.
    """
    named = schedule_of(coefficients)
    if named is not None:
        return named.table(steps)
    try:
        rows = torch.as_tensor(coefficients, dtype=torch.float64).cpu()
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(
            f"coefficients: expected a schedule name, a CoefficientSchedule or (T, 3) rows of numbers, "
            f"got {type(coefficients).__name__}"
        ) from None
    single_row = rows.ndim == 1
    if single_row:
        rows = rows.reshape(1, -1)
    if rows.ndim != 2 or rows.shape[1] != 3 or rows.shape[0] < 1:
        raise ValueError(f"coefficients: expected a (T, 3) table of (a, b, c) rows, got shape {tuple(rows.shape)}")
    if not bool(torch.isfinite(rows).all()):
        raise ValueError("coefficients: contains NaN or Inf")
    table = [tuple(float(v) for v in row) for row in rows.tolist()]
    schedule = CoefficientSchedule("user", tuple(table[:-1]), table[-1], 5 if single_row else len(table), 1.0, 1e-7,
                                   "user")
    return check_bounded_table(schedule.table(steps))


#: The largest sup over σ̂ ∈ [0, 1] of |f_t(σ̂)| (the map after step t) a table may reach: the
#: registered schedules stay below 2 (Keller Jordan's overshoot 1.202, Polar Express's first step
#: 1.992); past 16 the next step's A² = (XXᵀ)² has singular values past 16⁴ = 65536 > 65504, float16's
#: largest finite number. A divergent table passes it within a few steps (docs/math.md, §2.2).
MAP_BOUND = 16.0


def _step_sup(a: float, b: float, c: float, h: float) -> float:
    """sup over x ∈ [0, h] of |a x + b x³ + c x⁵|: at x = h and at the critical points inside,
    x² = y with 5c y² + 3b y + a = 0 (closed form)."""
    ys = []
    if c != 0.0:
        disc = 9 * b * b - 20 * a * c
        if disc >= 0.0:  # q = −(3b + sign(b)√disc)/2: y = q / 5c and a / q, no cancellation
            q = -(3 * b + math.copysign(math.sqrt(disc), 3 * b)) / 2
            ys = [q / (5 * c)] + ([a / q] if q != 0.0 else [])
    elif b != 0.0:
        ys = [-a / (3 * b)]
    xs = [h] + [math.sqrt(y) for y in ys if 0.0 <= y <= h * h]
    try:
        return max(abs(x * (a + x * x * (b + c * x * x))) for x in xs)
    except OverflowError:
        return math.inf


def check_bounded_table(table: list[tuple[float, float, float]]) -> list[tuple[float, float, float]]:
    """``table`` if the map of its first t rows stays within ``MAP_BOUND`` on [0, 1] for every t:
    B_t = sup over [0, B_{t−1}] of |p_t| (B_0 = 1; exact, p_t being odd and f_{t−1}([0, 1]) an interval
    holding 0 and ±B_{t−1}). Keller Jordan's overshoot (1.202) and every registered schedule pass.
    Raises: ValueError naming ``coefficients``, the table and the first step past the bound (its map
    grows without bound: finite inputs give Inf / NaN).
    Source: Amsel et al. 2025 (arXiv 2505.16932), Sec. 2 (the polynomial view of Newton–Schulz)."""
    h, sups = 1.0, []
    for t, (a, b, c) in enumerate(table, 1):
        h = _step_sup(a, b, c, h)
        sups.append(h)
        if not h <= MAP_BOUND:
            raise ValueError(f"coefficients: a divergent table: after step {t} of {len(table)} (row {(a, b, c)}) "
                             f"the map's sup over σ̂ ∈ [0, 1] is {h:.3g} > {MAP_BOUND:g} (the steps before: "
                             f"{[round(v, 3) for v in sups[:-1]]}): it grows without bound, so finite inputs "
                             f"give Inf / NaN; table {[list(row) for row in table]}")
    return table
