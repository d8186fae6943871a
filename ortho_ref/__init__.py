"""ortho_ref: the exact oracle (numpy, scipy, mpmath; never torch).

Polar factor by SVD, the exact result of any Newton–Schulz schedule (``ns_map``), its
bands and first-order gains, and reference Muon and Dion steps. Float64, one matrix at a
time, pure functions.
"""

from .coefficients import SCHEDULES, schedule
from .dion import DionStep, column_normalize, dion_rank, dion_step, dion_transposed, orthonormalize, q_shape
from .muon import MuonStep, lr_scale, muon_step
from .ns_map import (
    ns_band,
    ns_derivative,
    ns_diagonal_gain,
    ns_lipschitz,
    ns_map,
    ns_polynomial,
    ns_step_gains,
    ns_step_magnitudes,
    normalized_singular_values,
)
from .polar import polar, polar_decomposition, singular_values, svd

__all__ = [
    "SCHEDULES", "schedule", "DionStep", "column_normalize", "dion_rank", "dion_step", "dion_transposed",
    "orthonormalize", "q_shape", "MuonStep", "lr_scale", "muon_step", "ns_band", "ns_derivative",
    "ns_diagonal_gain", "ns_lipschitz", "ns_map", "ns_polynomial", "ns_step_gains", "ns_step_magnitudes",
    "normalized_singular_values", "polar", "polar_decomposition", "singular_values", "svd",
]
