"""ortho_fast: production Newton–Schulz, Muon and Dion in torch (device-agnostic, batched).

The public names are the optimizers (``Muon``, ``NorMuon``, ``Dion``, ``Dion2``, ``HybridOptimizer``),
``newton_schulz`` with its schedules (``COEFFICIENTS``), the whole-model builders (``MuonConfig``,
``DionConfig``, ``param_groups``) and ``optimizer_preset``; docs/optimizers.md is their option reference.
Layers (docs/design.md, "Layers and import rules"): ``ortho_fast.functional`` (per-tensor math),
``ortho_fast.groups`` (param groups: options resolved once, checks, one check-then-step driver), the
optimizer classes and ``ortho_fast.distributed``; their names are imported from those modules.
"""

from . import functional, groups  # noqa: F401  (the layers: ortho_fast.functional, ortho_fast.groups)
from .coefficients import COEFFICIENTS, CoefficientSchedule, UnknownScheduleError
from .config import DionConfig, MuonConfig, meshes_from_world_mesh
from .dion import Dion
from .dion2 import Dion2
from .functional.newton_schulz import newton_schulz
from .hybrid_optimizer import HybridOptimizer
from .muon import Muon
from .normuon import NorMuon
from .param_assignment import param_groups
from .presets import optimizer_preset

__all__ = [
    "Muon", "NorMuon", "Dion", "Dion2", "HybridOptimizer",
    "newton_schulz", "COEFFICIENTS", "CoefficientSchedule", "UnknownScheduleError",
    "MuonConfig", "DionConfig", "meshes_from_world_mesh", "param_groups", "optimizer_preset",
]
