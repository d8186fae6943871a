"""The one registry of optimizer configurations that the judge and the tests read.

Each ``OptimizerConfig`` names a set of ``ortho_fast`` constructor keyword options (those of
``ortho_fast.Muon`` / ``ortho_fast.Dion``, or of the AdamW / Lion param groups) and the system
whose behaviour it reproduces (docs/design.md, "Systems our users come from"). Readers:

- ``ortho_verify.checks`` (``MUON_CONFIGS``: one Muon step per system; ``STAGE_CONFIGS``: the Muon
  pipeline stages, nanochat's and microsoft/dion NorMuon's steps; ``DION_VARIANTS``: Dion's
  QR methods, Orth-Dion and power iterations),
- ``ortho_verify.cli.main`` (``DION_VARIANT_RUNS``: which variant runs in which dtypes),
- ``ortho_verify.sharding`` (``SHARDING_DION`` / ``SHARDING_MUON``, the options of every
  layout, and the Dion variants some layouts add),
- ``ortho_verify.reproduce`` (``REPRODUCTION_METHODS``: each method's optimizer options),
- the tests (``MUON_AXES`` / ``muon_option_grid``: the Muon option combinations they sweep).

Pure Python: importing it imports neither torch nor the judge's optional dependencies. Values
that need torch (a dtype) are given by name ("bfloat16") or left to the reader.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

__all__ = [
    "ALGORITHMS", "CONFIGS", "DION2_CONFIGS", "DION2_RUNS", "DION_VARIANTS", "DION_VARIANT_RUNS", "MUON_AXES",
    "MUON_COMBOS", "MUON_CONFIGS", "OptimizerConfig", "PRESET_DTYPES", "QK_CLIP_CONFIG", "QK_CLIP_DTYPES",
    "REPRODUCTION_METHODS", "REPRODUCTION_RANK_FRACTIONS", "SHARDING_DION", "SHARDING_DION2", "SHARDING_MUON",
    "SHARDING_NORMUON", "STAGE_CONFIGS", "get",
    "muon_option_grid", "select",
]

#: Algorithms a configuration can name (the ``algorithm`` of ``ortho_fast.param_groups``).
ALGORITHMS = ("muon", "dion", "adamw", "lion", "dion2")


@dataclass(frozen=True)
class OptimizerConfig:
    """A named optimizer configuration.

    ``name``: unique key (e.g. "torch.optim.Muon", "dion/orth_dion", "reproduce/muon-jordan");
    ``algorithm``: one of ``ALGORITHMS``; ``options``: ``ortho_fast`` constructor keyword options
    (read-only mapping; ``kwargs()`` gives a fresh dict); ``source``: the system or paper it
    reproduces; ``tags``: who reads it ("checks", "dion_variant", "sharding", "reproduce");
    ``label``: a display name (default ``name``).
    Raises: ValueError naming ``algorithm`` for an unknown algorithm, naming ``name`` for an
    empty name.
    """

    name: str
    algorithm: str
    options: Mapping = field(default_factory=dict)
    source: str = ""
    tags: tuple[str, ...] = ()
    label: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name: expected a non-empty string, got {self.name!r}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm: expected one of {ALGORITHMS}, got {self.algorithm!r}")
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))
        if not self.label:
            object.__setattr__(self, "label", self.name)

    def kwargs(self, **overrides) -> dict:
        """The options as a new dict, updated with ``overrides`` (insertion order kept)."""
        return {**self.options, **overrides}


def _c(name, algorithm, source, tags, label="", **options) -> OptimizerConfig:
    return OptimizerConfig(name, algorithm, options, source, tuple(tags), label)


#: Dion's rank fractions in ``ortho-verify reproduce`` (fraction, its name in method keys and labels).
REPRODUCTION_RANK_FRACTIONS = ((1.0, "1"), (0.25, "1/4"), (0.0625, "1/16"))

CONFIGS: tuple[OptimizerConfig, ...] = (
    # One Muon step per system our users come from (ortho_verify.checks.check_muon). Megatron:
    # Emerging-Optimizers' defaults (EMA momentum without Nesterov, cesista5, "spectral" √max(m, n),
    # clamped normalization) with extra_scale_factor 0.2 (= Moonlight's 0.2·√max(m, n));
    # nanochat: Polar Express with cautious weight decay (its mask (g·p) >= 0).
    _c("torch.optim.Muon", "muon", "torch.optim.Muon (PyTorch 2.9+), Keller Jordan's Muon", ["checks"],
       momentum_style="ema", nesterov=True, coefficients="jordan", adjust_lr="original", eps_mode="clamp",
       weight_decay=0.1, lr=0.02),
    _c("microsoft/dion", "muon", "microsoft/dion's Muon", ["checks"], momentum_style="classic", nesterov=False,
       coefficients="polar_express", adjust_lr="spectral_norm", weight_decay=0.01, lr=0.01),
    _c("Moonlight", "muon", "Moonlight (Liu et al., arXiv 2502.16982); divides by ‖X‖ + 1e-7", ["checks"],
       momentum_style="classic", nesterov=True, coefficients="jordan", adjust_lr="match_rms_adamw", eps_mode="add",
       weight_decay=0.1, lr=0.002),
    _c("Megatron", "muon", "Megatron-LM / NVIDIA Emerging-Optimizers", ["checks"], momentum_style="ema",
       nesterov=False, coefficients="cesista5", adjust_lr="spectral", extra_scale_factor=0.2, eps_mode="clamp",
       weight_decay=0.01, lr=3e-4),
    _c("nanochat (cautious wd)", "muon", "nanochat (Karpathy): Polar Express, cautious weight decay", ["checks"],
       momentum_style="ema", nesterov=True, coefficients="polar_express", adjust_lr="original",
       cautious_weight_decay=True, weight_decay=0.2, lr=0.02),
    # The Muon pipeline stages (ortho_verify.checks.stages.check_muon_stages, tag "stages"): nanochat's
    # current matrix step (EMA Nesterov, MuonEq, Polar Express with safety 1.01, Muon+, NorMuon per row
    # or column by shape with rsqrt(max(v, 1e-10)), β₂ 0.9 as its gpt.py, cautious weight decay),
    # microsoft/dion's NorMuon defaults, and each stage alone on torch.optim.Muon's step.
    _c("stages/nanochat", "muon", "nanochat (Karpathy) nanochat/optim.py muon_step_fused: all stages", ["stages"],
       label="nanochat", momentum_style="ema", nesterov=True, coefficients="polar_express", safety=1.01, eps=1e-6,
       adjust_lr="original", cautious_weight_decay=True, weight_decay=0.2, lr=0.02, row_equilibration=True,
       renormalize=True, normuon_beta2=0.9, normuon_dim="by_shape", normuon_eps=1e-10, normuon_eps_mode="clamp"),
    _c("stages/microsoft-dion-normuon", "muon", "microsoft/dion NorMuon (dion/normuon.py) defaults", ["stages"],
       label="microsoft/dion NorMuon", momentum_style="classic", nesterov=False, coefficients="polar_express",
       adjust_lr="spectral_norm", weight_decay=0.01, lr=0.01, normuon_beta2=0.95, normuon_dim="row",
       normuon_eps=1e-8, normuon_eps_mode="add"),
    _c("stages/muoneq", "muon", "MuonEq row equilibration (arXiv 2603.28254) on torch.optim.Muon's step", ["stages"],
       label="MuonEq", momentum_style="ema", nesterov=True, coefficients="jordan", adjust_lr="original",
       eps_mode="clamp", weight_decay=0.1, lr=0.02, row_equilibration=True),
    _c("stages/muon-plus", "muon", "Muon+ renormalization (arXiv 2602.21545) on torch.optim.Muon's step", ["stages"],
       label="Muon+", momentum_style="ema", nesterov=True, coefficients="jordan", adjust_lr="original",
       eps_mode="clamp", weight_decay=0.1, lr=0.02, renormalize=True),
    # Dion variants (ortho_verify.checks.check_dion(..., variant=...)): the QR methods (microsoft/dion's
    # "qr", CholeskyQR2, its default "rcqr"), Orth-Dion's QR right factor, and two power iterations.
    _c("dion/householder", "dion", "microsoft/dion qr_method='qr' (Householder)", ["dion_variant"],
       label="householder", qr_method="householder"),
    _c("dion/cholesky_qr", "dion", "microsoft/dion qr_method='cqr' (CholeskyQR2)", ["dion_variant"],
       label="cholesky_qr", qr_method="cholesky_qr"),
    _c("dion/randomized_cholesky_qr", "dion", "microsoft/dion qr_method='rcqr' (its default)", ["dion_variant"],
       label="randomized_cholesky_qr", qr_method="randomized_cholesky_qr"),
    _c("dion/orth_dion", "dion", "Orth-Dion: QR of R as the right factor (Ahn et al., arXiv 2504.05295)",
       ["dion_variant"], label="orth_dion", right_factor="qr"),
    _c("dion/power_iters_2", "dion", "microsoft/dion power_iters=2 with rcqr", ["dion_variant"],
       label="power_iters_2", power_iters=2, qr_method="randomized_cholesky_qr"),
    # ortho-verify sharding: the options of the distributed and of the one-process optimizer of every
    # layout (a rank fraction below one keeps Dion's error feedback in play; Newton–Schulz in the
    # parameter's dtype: dtype None).
    _c("sharding/dion", "dion", "microsoft/dion's distributed Dion (Ahn et al., Algorithms 2-3)", ["sharding"],
       lr=0.02, mu=0.9, weight_decay=0.1, rank_fraction=0.5, seed=0),
    _c("sharding/muon", "muon", "microsoft/dion's distributed Muon; Megatron's TP modes", ["sharding"],
       lr=0.02, momentum=0.9, weight_decay=0.1, dtype=None),
    # Dion2 (microsoft/dion dion/dion2.py): one step against ortho_ref.dion2 (ortho_verify.checks.dion2);
    # its defaults, a larger fraction with "global" selection and no lr adjustment, and the
    # cesista5 schedule (use_polar_express=False) with "rms_norm" scaling and ef_decay 1.
    _c("dion2/microsoft-dion", "dion2", "microsoft/dion Dion2 defaults", ["dion2_checks"]),
    _c("dion2/global-half", "dion2", "microsoft/dion Dion2, selection_scope='global'", ["dion2_checks"],
       fraction=0.5, selection_scope="global", adjust_lr=None, lr=0.02, weight_decay=0.1),
    _c("dion2/cesista5-rms", "dion2", "microsoft/dion Dion2, use_polar_express=False, adjust_lr='rms_norm'",
       ["dion2_checks"], coefficients="cesista5", adjust_lr="match_rms_adamw", ef_decay=1.0, fraction=0.3),
    _c("sharding/dion2", "dion2", "microsoft/dion's distributed Dion2, selection_scope='global'", ["sharding"],
       lr=0.02, weight_decay=0.1, fraction=0.5, ef_decay=0.9, selection_scope="global", dtype=None),
    _c("sharding/normuon", "muon", "microsoft/dion's distributed NorMuon; nanochat's stages (MuonEq, Muon+, NorMuon "
       "by shape)", ["sharding"], lr=0.02, momentum=0.9, weight_decay=0.1, dtype=None, row_equilibration=True,
       renormalize=True, normuon_beta2=0.9, normuon_dim="by_shape"),
    # ortho-verify reproduce: each method's own options (momentum, lr, the Newton–Schulz dtype and
    # Muon's lr convention come from the study's ReproConfig).
    _c("reproduce/adamw", "adamw", "torch.optim.AdamW", ["reproduce"], label="AdamW"),
    _c("reproduce/muon-jordan", "muon", "torch.optim.Muon / Keller Jordan's Muon", ["reproduce"],
       label="Muon (Keller)", nesterov=True, coefficients="jordan"),
    _c("reproduce/muon-polar_express", "muon", "Polar Express (Amsel et al., arXiv 2505.16932)", ["reproduce"],
       label="Muon (Polar Express)", nesterov=True, coefficients="polar_express"),
    *(_c(f"reproduce/dion-{name}-{'ef' if ef else 'noef'}", "dion", "Dion (Ahn et al., arXiv 2504.05295, "
         "Algorithm 1; microsoft/dion)", ["reproduce"], label=f"Dion r={name}, {'EF' if ef else 'no EF'}",
         rank_fraction=fraction, error_feedback=ef, qr_method="householder")
      for fraction, name in REPRODUCTION_RANK_FRACTIONS for ef in (True, False)),
    # NorMuon: Muon (Polar Express, Nesterov as the Muon rows) with NorMuon's per-neuron second-moment EMA
    # (β₂ 0.95, microsoft/dion NorMuon's default; per row, √v + 1e-8: the stage defaults). Dion2: microsoft/dion's
    # Dion2 at fraction 1/4 with its default ef_decay 0.95, Polar Express and Dion's √(m/n) lr scale; it has no μ.
    _c("reproduce/normuon", "muon", "NorMuon (Li et al., arXiv 2510.05491; microsoft/dion dion/normuon.py)",
       ["reproduce"], label="NorMuon (Polar Express)", nesterov=True, coefficients="polar_express",
       normuon_beta2=0.95),
    _c("reproduce/dion2-1/4", "dion2", "Dion2 (Ahn, Amsel, Langford, arXiv 2512.16928; microsoft/dion dion/dion2.py)",
       ["reproduce"], label="Dion2 f=1/4", fraction=0.25, ef_decay=0.95, coefficients="polar_express",
       adjust_lr="spectral_norm"),
)

_BY_NAME = {c.name: c for c in CONFIGS}
if len(_BY_NAME) != len(CONFIGS):  # pragma: no cover - a duplicate name is a bug of this file
    raise RuntimeError("registry: duplicate configuration names")


def get(name: str) -> OptimizerConfig:
    """The configuration called ``name``. Raises: KeyError listing the known names."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"name: unknown optimizer configuration {name!r}; known: {sorted(_BY_NAME)}") from None


def select(tag: str | None = None, algorithm: str | None = None) -> tuple[OptimizerConfig, ...]:
    """The configurations with ``tag`` (if given) and ``algorithm`` (if given), in registry order."""
    return tuple(c for c in CONFIGS if (tag is None or tag in c.tags)
                 and (algorithm is None or c.algorithm == algorithm))


#: ``ortho_verify.checks.MUON_CONFIGS``: system name -> Muon options (lr and weight_decay included).
MUON_CONFIGS: dict[str, dict] = {c.name: c.kwargs() for c in select("checks", "muon")}
#: ``ortho_verify.checks.stages.STAGE_CONFIGS``: label -> Muon options with pipeline stages.
STAGE_CONFIGS: dict[str, dict] = {c.label: c.kwargs() for c in select("stages", "muon")}
#: ``ortho_verify.checks.DION_VARIANTS``: variant name -> Dion options.
DION_VARIANTS: dict[str, dict] = {c.label: c.kwargs() for c in select("dion_variant")}
#: (variant, parameter dtype, state dtype or None) of ``ortho-verify``'s Dion variant checks:
#: every variant in float64, and bfloat16 parameters with float32 momentum and Q (mixed precision).
DION_VARIANT_RUNS: tuple[tuple[str, str, str | None], ...] = (
    *((v, "float64", None) for v in DION_VARIANTS), ("householder", "bfloat16", "float32"))
#: ``ortho_verify.checks.DION2_CONFIGS``: name -> ``ortho_fast.Dion2`` options.
DION2_CONFIGS: dict[str, dict] = {c.name: c.kwargs() for c in select("dion2_checks", "dion2")}
#: (config, dtype) of ``ortho-verify``'s Dion2 rows (parameters, state and Newton–Schulz in dtype).
DION2_RUNS: tuple[tuple[str, str], ...] = tuple((c, d) for c in DION2_CONFIGS
                                                for d in ("float64", "float32", "bfloat16"))
#: Options of ``ortho-verify sharding``'s Dion and Muon (``ortho_verify.sharding.DION_OPTIONS`` /
#: ``MUON_OPTIONS``).
SHARDING_DION: dict = get("sharding/dion").kwargs()
SHARDING_MUON: dict = get("sharding/muon").kwargs()
SHARDING_DION2: dict = get("sharding/dion2").kwargs()
SHARDING_NORMUON: dict = get("sharding/normuon").kwargs()
#: The methods of ``ortho-verify reproduce``, in report order.
REPRODUCTION_METHODS: tuple[OptimizerConfig, ...] = select("reproduce")

#: ``ortho_verify.checks.qk_clip``'s optimizer options: QK-clip (group keys of ``ortho_fast.groups.qk_clip``,
#: not Muon constructor defaults, so kept out of ``CONFIGS``) on top of ``ortho_fast.optimizer_preset("motif")``
#: at Motif's / Kimi K2's threshold, GQA heads, Newton–Schulz in the parameter's dtype.
QK_CLIP_CONFIG: OptimizerConfig = _c("qk_clip/motif", "muon", "Motif Muon + QK-clip (MuonClip, Kimi K2 arXiv "
                                     "2507.20534)", ["qk_clip"], qk_clip_threshold=100.0, qk_clip_alpha=0.5,
                                     qk_clip_num_heads=4, qk_clip_num_kv_heads=2, dtype=None)
#: Parameter dtypes of ``ortho-verify``'s QK-clip rows and preset rows (``ortho_verify.presets.preset_jobs``).
QK_CLIP_DTYPES: tuple[str, ...] = ("float64", "float32", "bfloat16")
PRESET_DTYPES: tuple[str, ...] = ("float64", "float32", "bfloat16")

#: The Muon option axes the tests sweep (``ortho_fast.Muon`` keywords -> values).
MUON_AXES: dict[str, tuple] = {
    "momentum_style": ("ema", "classic"),
    "nesterov": (True, False),
    "adjust_lr": ("original", "match_rms_adamw", "spectral_norm", None),
    "weight_decay": (0.0, 0.1),
    "coefficients": ("jordan", "polar_express"),
}


def muon_option_grid(*axes: str, as_dicts: bool = False) -> list:
    """Every combination of the values of ``axes`` (names of ``MUON_AXES``; default all of them,
    in that order), as tuples in ``itertools.product`` order (the last axis varies fastest), or
    as dicts of ``ortho_fast.Muon`` keywords with ``as_dicts``.
    Raises: KeyError naming an unknown axis."""
    axes = axes or tuple(MUON_AXES)
    for a in axes:
        if a not in MUON_AXES:
            raise KeyError(f"axes: unknown Muon option axis {a!r}; known: {list(MUON_AXES)}")
    combos = list(itertools.product(*(MUON_AXES[a] for a in axes)))
    return [dict(zip(axes, c)) for c in combos] if as_dicts else combos


#: ``tests/ortho_fast/test_optimizers.py``'s sweep: (momentum_style, nesterov, adjust_lr,
#: weight_decay, coefficients), 64 combinations.
MUON_COMBOS: list[tuple] = muon_option_grid()
