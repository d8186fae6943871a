"""Configuration of ``ortho-verify reproduce``: the methods (``METHODS``, their options from
``ortho_verify.registry``), sizes, seeds and lr grids (``ReproConfig``, ``QUICK``), the lr schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ortho_fast.groups.dion import DION_DEFAULTS
from ortho_fast.groups.dion2 import DION2_DEFAULTS
from ortho_fast.groups.muon import MUON_DEFAULTS

from .. import registry
from ..inputs.data import GPTConfig

__all__ = ["FAMILIES", "FLAT_REFERENCE", "TREND_SERIES", "TrendSeries", "UNAVAILABLE_METHODS", "missing_options",
           "CLOSE_MARGIN", "MATCH_MARGIN", "METHODS", "METHODS_BY_KEY", "MUON_LR_CONVENTIONS", "Method", "NS_DTYPES",
           "QUICK", "RANK_FRACTIONS", "RESULTS_FORMAT", "ReproConfig", "SV_DTYPES", "SV_SCHEDULES", "VERDICTS",
           "gpt_config", "lr_multiplier", "method_options"]

RESULTS_FORMAT = 1
VERDICTS = ("reproduced", "not reproduced", "inconclusive")
#: "Matches": the paired difference ± its seed spread lies within ±1 % of the reference's loss.
MATCH_MARGIN = 0.01
#: "Stays close": the same, within ±2.5 % (a looser claim than "matches").
CLOSE_MARGIN = 0.025
SV_SCHEDULES = ("jordan", "polar_express")
SV_DTYPES = ("float32", "bfloat16")
NS_DTYPES = ("bfloat16", "float16", "float32", "float64")
#: Muon's per-matrix lr scale (``ortho_fast.functional.muon.adjusted_lr_scale``): "spectral_norm" √(m/n), Dion's own
#: convention (microsoft/dion's Muon), so that Muon and Dion differ only in how they orthogonalize;
#: "original" √max(1, m/n) (torch.optim.Muon, Keller Jordan), which gives an (m, n) matrix with m < n
#: √(n/m) times Dion's step.
MUON_LR_CONVENTIONS = ("spectral_norm", "original")


#: The method families (the ``algorithm`` of ``ortho_fast.param_groups`` that trains the hidden matrices;
#: "adamw" trains every parameter) and the option defaults that say which options the installed
#: ``ortho_fast`` knows.
FAMILIES = ("adamw", "muon", "dion", "dion2")
_FAMILY_DEFAULTS = {"muon": MUON_DEFAULTS, "dion": DION_DEFAULTS,
                    "dion2": DION2_DEFAULTS}


@dataclass(frozen=True)
class Method:
    """One optimizer of the study. ``family`` (one of ``FAMILIES``) "adamw" trains every parameter
    with AdamW; "muon" / "dion" / "dion2" train the hidden matrices (attention qkv / proj, MLP fc /
    proj) with Muon (``coefficients`` a schedule of ``ortho_fast.COEFFICIENTS``; NorMuon when
    ``normuon_beta2`` is set: Li et al., arXiv 2510.05491), Dion (``rank_fraction``,
    ``error_feedback``) or Dion2 (``fraction`` of the rows or columns orthogonalized,
    ``ef_decay``: microsoft/dion ``dion/dion2.py``) and the rest (embeddings, LayerNorms, lm_head)
    with AdamW."""

    key: str
    label: str
    family: str
    coefficients: str | None = None
    rank_fraction: float | None = None
    error_feedback: bool | None = None
    fraction: float | None = None
    ef_decay: float | None = None
    normuon_beta2: float | None = None


def missing_options(config: registry.OptimizerConfig) -> tuple[str, ...]:
    """The options of a reproduction method (``ortho_verify.registry`` configuration) that the
    installed ``ortho_fast`` does not know for its algorithm (keys absent from ``MUON_DEFAULTS`` /
    ``DION_DEFAULTS`` / ``DION2_DEFAULTS``); () for AdamW. ``ortho_fast.param_groups`` keeps an
    unknown group key without using it, so a method with a missing option would train as another
    algorithm under its name: such a method is left out of ``METHODS``.
    Raises: KeyError for an algorithm outside ``FAMILIES``."""
    if config.algorithm == "adamw":
        return ()
    known = _FAMILY_DEFAULTS[config.algorithm]
    return tuple(k for k in config.options if k not in known)


def _method(c: registry.OptimizerConfig) -> Method:
    return Method(c.name.removeprefix("reproduce/"), c.label, c.algorithm, **{
        k: c.options.get(k) for k in ("coefficients", "rank_fraction", "error_feedback", "fraction", "ef_decay",
                                      "normuon_beta2")})


#: Dion's rank fractions (fraction, name in method keys): ``ortho_verify.registry.REPRODUCTION_RANK_FRACTIONS``.
RANK_FRACTIONS = registry.REPRODUCTION_RANK_FRACTIONS
#: Every method of the study, in report order: ``ortho_verify.registry.REPRODUCTION_METHODS`` whose
#: options the installed ``ortho_fast`` knows (``missing_options``).
METHODS: tuple[Method, ...] = tuple(_method(c) for c in registry.REPRODUCTION_METHODS if not missing_options(c))
METHODS_BY_KEY = {m.key: m for m in METHODS}
#: The registry's methods left out of ``METHODS``: key -> the options ``ortho_fast`` does not know
#: (e.g. "normuon" before ``ortho_fast``'s Muon has ``normuon_beta2``). The report lists them.
UNAVAILABLE_METHODS: dict[str, tuple[str, ...]] = {
    c.name.removeprefix("reproduce/"): missing_options(c) for c in registry.REPRODUCTION_METHODS
    if missing_options(c)}


@dataclass(frozen=True)
class TrendSeries:
    """A paired difference followed across model sizes (``ortho_verify.reproduce.trend``): ``worse``
    − ``better`` per seed, method keys (``kind`` "loss": test losses) or Newton–Schulz schedules
    (``kind`` "spectral": distance to UVᵀ); ``claim`` the key of the claim it belongs to (None: a
    diagnostic row), ``label`` as the report prints it."""

    key: str
    label: str
    claim: str | None
    worse: str
    better: str
    kind: str = "loss"


#: The series whose trend the size sweep judges.
TREND_SERIES = (
    TrendSeries("muon_vs_adamw", "AdamW − Muon (Keller)", "muon_vs_adamw", "adamw", "muon-jordan"),
    TrendSeries("dion_full_rank", "Dion r=1, EF − Muon (Keller)", "dion_full_rank", "dion-1-ef", "muon-jordan"),
    TrendSeries("dion_quarter_rank", "Dion r=1/4, EF − Muon (Keller)", "dion_quarter_rank", "dion-1/4-ef",
                "muon-jordan"),
    TrendSeries("dion_sixteenth_rank", "Dion r=1/16, EF − Muon (Keller)", None, "dion-1/16-ef", "muon-jordan"),
    TrendSeries("error_feedback_1/4", "no EF − EF, Dion r=1/4", "error_feedback", "dion-1/4-noef", "dion-1/4-ef"),
    TrendSeries("error_feedback_1/16", "no EF − EF, Dion r=1/16", "error_feedback", "dion-1/16-noef",
                "dion-1/16-ef"),
    TrendSeries("normuon", "Muon (Polar Express) − NorMuon", "normuon_vs_muon", "muon-polar_express", "normuon"),
    TrendSeries("dion2_quarter", "Dion2 f=1/4 − Muon (Polar Express)", "dion2_quarter", "dion2-1/4",
                "muon-polar_express"),
    TrendSeries("polar_express", "Keller − Polar Express, distance to UVᵀ", "polar_express", "jordan",
                "polar_express", kind="spectral"),
)
#: The method whose mean test loss sets the flat margin of the loss series.
FLAT_REFERENCE = "muon-jordan"


def method_options(method: Method) -> dict:
    """The method's own optimizer options (``ortho_fast`` keywords) from ``ortho_verify.registry``:
    Muon's nesterov and coefficients; Dion's rank_fraction, error_feedback and qr_method; none for
    AdamW. ``build_optimizer`` adds what the ``ReproConfig`` sets (momentum, lr convention, dtype).
    Raises: KeyError for a method not in the registry."""
    return registry.get(f"reproduce/{method.key}").kwargs()


def _check_grid(name: str, grid) -> None:
    if not grid or any(not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0) for v in grid):
        raise ValueError(f"{name}: expected a non-empty tuple of positive learning rates, got {grid!r}")
    if list(grid) != sorted(set(grid)):
        raise ValueError(f"{name}: expected increasing learning rates, got {grid!r}")


@dataclass(frozen=True)
class ReproConfig:
    """Sizes, schedule, seeds and learning-rate grids of the reproduction.

    Model (``ortho_verify.inputs.data``'s GPT): ``d_model``, ``n_layers``, ``n_heads``, ``context`` (bytes).
    Training: ``steps`` optimizer steps of ``batch_size`` random windows of the train split,
    every lr on the schedule of ``lr_multiplier``: linear warm-up over ``warmup_fraction`` of the
    steps, then cosine decay to ``final_lr_fraction`` of the peak (the same for every method).
    Held-out loss (nats per byte): mean next-byte cross-entropy over ``eval_windows`` evenly
    spaced windows of the validation (sweep) or test (evaluation) split, recorded at
    ``curve_points`` + 1 evenly spaced steps (step 0 included) of the evaluation runs.
    ``heldout_every``: one file in k validation, one test (``ortho_verify.inputs.data.stdlib_split``).
    Seeds: ``sweep_seed`` for the lr sweep, ``seeds`` for the evaluation (disjoint).
    Grids: ``adamw_lrs``, ``muon_lrs`` (Muon and NorMuon; scaled per matrix by ``muon_adjust_lr``,
    one of ``MUON_LR_CONVENTIONS``; default Dion's √(m/n)), ``dion_lrs`` (Dion and Dion2, both
    scaled by √(m/n); it starts at 0.0025 because low-rank Dion's best lr lay at the low edge of a
    grid starting at 0.01 even after two extensions);
    ``lr_extensions`` rounds that extend a grid by a factor ``lr_factor`` beyond an edge that
    won. AdamW: ``betas``, ``adamw_eps``; Muon / Dion momentum ``momentum`` (Dion2 has none: its
    momentum buffer accumulates gradients and decays by ``ef_decay`` where selected); Newton–Schulz
    compute dtype ``ns_dtype``; weight decay 0 everywhere.
    ``capture_points`` steps (1, ..., steps) at which the Muon (Keller) runs record gradients (0: none,
    and no singular-value map: its float64 SVDs of every matrix would cost more than the training at the
    GPU plan's widths).

    Raises: ValueError naming the field for a non-positive size, d_model not divisible by
    n_heads, an empty / unsorted / non-positive grid, no evaluation seed, the sweep seed among
    the evaluation seeds, a momentum outside [0, 1), lr_factor <= 1, a warm-up or final lr
    fraction outside [0, 1) / (0, 1], or an unknown ns_dtype / muon_adjust_lr.
    """

    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    context: int = 64
    batch_size: int = 16
    steps: int = 600
    curve_points: int = 12
    eval_windows: int = 512
    heldout_every: int = 10
    sweep_seed: int = 0
    seeds: tuple[int, ...] = (1, 2, 3)
    adamw_lrs: tuple[float, ...] = (1e-3, 2e-3, 4e-3)
    muon_lrs: tuple[float, ...] = (0.01, 0.02, 0.04)
    dion_lrs: tuple[float, ...] = (0.0025, 0.005, 0.01, 0.02, 0.04)
    lr_extensions: int = 1
    lr_factor: float = 2.0
    warmup_fraction: float = 0.05
    final_lr_fraction: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    adamw_eps: float = 1e-8
    momentum: float = 0.95
    muon_adjust_lr: str = "spectral_norm"
    ns_dtype: str = "bfloat16"
    capture_points: int = 3

    def __post_init__(self) -> None:
        for name in ("d_model", "n_layers", "n_heads", "context", "batch_size", "steps", "curve_points",
                     "eval_windows", "capture_points"):
            value = getattr(self, name)
            low = 0 if name == "capture_points" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}: expected an int >= {low}, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads: {self.n_heads} does not divide d_model {self.d_model}")
        if isinstance(self.lr_extensions, bool) or not isinstance(self.lr_extensions, int) or self.lr_extensions < 0:
            raise ValueError(f"lr_extensions: expected an int >= 0, got {self.lr_extensions!r}")
        for name in ("adamw_lrs", "muon_lrs", "dion_lrs"):
            _check_grid(name, getattr(self, name))
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: expected distinct evaluation seeds, got {self.seeds!r}")
        if self.sweep_seed in self.seeds:
            raise ValueError(f"seeds: the sweep seed {self.sweep_seed} must not be an evaluation seed "
                             "(the lr is chosen on it)")
        if not (0.0 <= self.momentum < 1.0) or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"momentum, betas: expected values in [0, 1), got {self.momentum!r}, {self.betas!r}")
        if not self.lr_factor > 1.0:
            raise ValueError(f"lr_factor: expected > 1, got {self.lr_factor!r}")
        if not (0.0 <= self.warmup_fraction < 1.0) or not (0.0 < self.final_lr_fraction <= 1.0):
            raise ValueError(f"warmup_fraction, final_lr_fraction: expected [0, 1) and (0, 1], got "
                             f"{self.warmup_fraction!r}, {self.final_lr_fraction!r}")
        if self.ns_dtype not in NS_DTYPES:
            raise ValueError(f"ns_dtype: expected one of {NS_DTYPES}, got {self.ns_dtype!r}")
        if self.muon_adjust_lr not in MUON_LR_CONVENTIONS:
            raise ValueError(f"muon_adjust_lr: expected one of {MUON_LR_CONVENTIONS}, got {self.muon_adjust_lr!r}")

    def scaled(self, k: int) -> "ReproConfig":
        """This configuration with d_model, n_heads (head size kept), batch_size, steps and
        eval_windows multiplied by ``k`` (an int >= 1; about k⁴ times the compute)."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"scale: expected an int >= 1, got {k!r}")
        return replace(self, d_model=self.d_model * k, n_heads=self.n_heads * k, batch_size=self.batch_size * k,
                       steps=self.steps * k, eval_windows=self.eval_windows * k)

    def grid(self, family: str) -> tuple[float, ...]:
        """The initial lr grid of a method family (one of ``FAMILIES``): ``adamw_lrs``, ``muon_lrs``
        (Muon, NorMuon), ``dion_lrs`` (Dion and Dion2: the same √(m/n) lr convention).
        Raises: ValueError naming ``family`` for another family."""
        grids = {"adamw": self.adamw_lrs, "muon": self.muon_lrs, "dion": self.dion_lrs, "dion2": self.dion_lrs}
        if family not in grids:
            raise ValueError(f"family: expected one of {FAMILIES}, got {family!r}")
        return grids[family]

    def capture_steps(self) -> tuple[int, ...]:
        """Steps at which the Muon (Keller) evaluation runs record gradients: 1 to ``steps``,
        ``capture_points`` of them evenly spaced."""
        if not self.capture_points:
            return ()
        return tuple(sorted({int(round(s)) for s in np.linspace(1, self.steps, self.capture_points)}))

    def warmup_steps(self) -> int:
        """Steps of linear warm-up: ``warmup_fraction`` × steps rounded, at least 1 if the
        fraction is positive."""
        return max(1, round(self.warmup_fraction * self.steps)) if self.warmup_fraction > 0 else 0

    def curve_steps(self) -> tuple[int, ...]:
        """Steps at which the evaluation runs record the held-out loss (0 = initialization)."""
        return tuple(sorted({int(round(s)) for s in np.linspace(0, self.steps, self.curve_points + 1)}))


#: The --quick configuration: tiny models and few steps with every method and every code path, a measurement run
#: (it decides no claim; its time is in the README, written by scripts/timings.py).
QUICK = ReproConfig(d_model=32, n_layers=1, n_heads=2, context=32, batch_size=8, steps=24, curve_points=4,
                    eval_windows=32, seeds=(1, 2), capture_points=2)


def lr_multiplier(index: int, config: ReproConfig) -> float:
    """Multiplier of the peak lr at 0-based step ``index`` (step ``index`` + 1 of ``config.steps``):
    (index + 1) / W for index < W = ``config.warmup_steps()``, then
    r + (1 − r)·(1 + cos(π·(index − W) / (steps − W − 1)))/2 with r = ``final_lr_fraction``, so
    the first step after the warm-up runs at the peak and the last at r × peak. Linear warm-up
    and cosine decay as nanoGPT's and Moonlight's (Liu et al., arXiv 2502.16982) AdamW and Muon
    runs."""
    warmup = config.warmup_steps()
    if index < warmup:
        return (index + 1) / warmup
    span = config.steps - warmup - 1
    progress = min(1.0, (index - warmup) / span) if span > 0 else 1.0
    r = config.final_lr_fraction
    return r + (1 - r) * 0.5 * (1 + math.cos(math.pi * progress))


def gpt_config(config: ReproConfig) -> GPTConfig:
    """The ``ortho_verify.inputs.data.GPTConfig`` of the study's model (sizes, batch and steps of ``config``)."""
    return GPTConfig(d_model=config.d_model, n_layers=config.n_layers, n_heads=config.n_heads, context=config.context,
                     batch_size=config.batch_size, steps=config.steps, capture_steps=(config.steps,))
