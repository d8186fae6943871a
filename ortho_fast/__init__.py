"""ortho_fast: production Newton–Schulz, Muon and Dion in torch (device-agnostic, batched)."""

from .coefficients import COEFFICIENTS, CoefficientSchedule, resolve_coefficients
from .dion import Dion, dion_rank, dion_update, initial_q, orthonormalize
from .muon import Muon, adjusted_lr_scale, muon_momentum
from .newton_schulz import newton_schulz

__all__ = [
    "COEFFICIENTS", "CoefficientSchedule", "resolve_coefficients", "Dion", "dion_rank", "dion_update",
    "initial_q", "orthonormalize", "Muon", "adjusted_lr_scale", "muon_momentum", "newton_schulz",
]
