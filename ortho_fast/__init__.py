"""ortho_fast: production Newton–Schulz, Muon and Dion in torch (device-agnostic, batched).

Layers (docs/design.md, "Layers and import rules"): ``ortho_fast.functional`` (per-tensor math),
``ortho_fast.groups`` (param groups: options resolved once, checks, one check-then-step driver),
the optimizer classes (``Muon``, ``Dion``, ``HybridOptimizer``) and ``ortho_fast.distributed``.
"""

from . import functional, groups  # noqa: F401  (the layers: ortho_fast.functional, ortho_fast.groups)
from .coefficients import COEFFICIENTS, CoefficientSchedule, UnknownScheduleError, resolve_coefficients
from .dion import (
    DION_DEFAULTS,
    Dion,
    check_dion_step,
    dion_group_step,
    dion_rank,
    dion_right_factor,
    dion_update,
    gaussian_sketch,
    initial_q,
    normalize_dion_group,
    orthonormalize,
    sketch_generator,
)
from .dion2 import DION2_DEFAULTS, Dion2
from .hybrid import (
    ALGORITHMS,
    DionConfig,
    HybridOptimizer,
    MuonConfig,
    meshes_from_world_mesh,
    normalize_name,
    param_groups,
)
from .muon import (
    MUON_DEFAULTS,
    Muon,
    MuonLayout,
    adjusted_lr_scale,
    check_muon_step,
    default_eps_mode,
    is_expert_name,
    muon_group_step,
    muon_layout,
    muon_momentum,
    normalize_muon_group,
)
from .newton_schulz import MATMUL_PRECISIONS, newton_schulz, resolve_compute_dtype
from .normuon import NorMuon
from .presets import optimizer_preset
from .scalar import (
    ADAMW_DEFAULTS,
    LION_DEFAULTS,
    adamw_group_step,
    check_adamw_step,
    check_lion_step,
    lion_group_step,
    normalize_adamw_group,
    normalize_lion_group,
)

__all__ = [
    "COEFFICIENTS", "CoefficientSchedule", "UnknownScheduleError", "resolve_coefficients", "default_eps_mode",
    "Dion", "dion_rank", "dion_update",
    "initial_q", "orthonormalize", "DION_DEFAULTS", "check_dion_step", "dion_group_step", "dion_right_factor",
    "gaussian_sketch", "normalize_dion_group", "sketch_generator", "Muon", "adjusted_lr_scale", "muon_momentum",
    "newton_schulz",
    "MUON_DEFAULTS", "MuonLayout", "check_muon_step", "is_expert_name", "muon_group_step", "muon_layout",
    "normalize_muon_group", "MATMUL_PRECISIONS", "resolve_compute_dtype",
    "ADAMW_DEFAULTS", "LION_DEFAULTS", "adamw_group_step", "check_adamw_step", "check_lion_step",
    "lion_group_step", "normalize_adamw_group", "normalize_lion_group",
    "ALGORITHMS", "DionConfig", "HybridOptimizer", "MuonConfig", "meshes_from_world_mesh", "normalize_name",
    "param_groups", "DION2_DEFAULTS", "Dion2", "optimizer_preset", "NorMuon",
]
