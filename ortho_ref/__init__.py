"""ortho_ref: the exact oracle (numpy, scipy, mpmath; never torch).

Polar factor by SVD, the exact result of any Newton–Schulz schedule (``ns_map``), its
bands and first-order gains, and reference Muon, Dion, AdamW and Lion steps. Float64, one matrix at a
time, pure functions.

Modules, lowest first (each imports only those above it; docs/design.md, "Layers and import rules"):
``_validate`` (input checks), ``coefficients`` (schedules), ``linalg`` (float64 SVD),
``ns_polynomials`` (the scalar step polynomials), ``ns_bands`` (their exact bands and gains), ``mp`` (the
mpmath tier), ``polar`` and ``ns_map`` (the matrix maps and their ``digits=`` dispatch), ``muon_parts``,
``muon_stages`` and ``muon``, ``dion_shapes``, ``dion_qr``, ``dion``, ``dion_ideal`` and ``dion2``, ``qk_clip``,
``scalar`` (AdamW, Lion), ``golden`` (the 50-digit golden files).
"""

from . import muon_stages
from .coefficients import SCHEDULES, schedule
from .dion import (
    QR_METHODS,
    RIGHT_FACTORS,
    DionReplicatedStep,
    DionStep,
    column_normalize,
    dion_rank,
    dion_right_factor,
    dion_step,
    dion_step_replicated,
    dion_transposed,
    gaussian_sketch,
    orthonormalize,
    q_shape,
    sketch_rows,
)
from .dion2 import (
    Dion2Step,
    dion2_local_select,
    dion2_num_selected,
    dion2_select,
    dion2_select_rows,
    dion2_slice_norms,
    dion2_step,
)
from .dion_ideal import dion_ideal_step
from .linalg import svd
from .mp import from_hi_lo, to_float64, to_hi_lo
from .muon import MuonPipelineStep, MuonStep, lr_scale, muon_pipeline_step, muon_step
from .ns_bands import ns_attracting_band, ns_band, ns_lipschitz, ns_step_gains, ns_step_magnitudes
from .ns_map import normalized_singular_values, ns_map
from .ns_polynomials import (
    NS_MAP_BOUND,
    check_bounded_schedule,
    ns_derivative,
    ns_diagonal_gain,
    ns_map_sups,
    ns_polynomial,
)
from .polar import polar, polar_condition, polar_decomposition, singular_values
from .qk_clip import qk_clip_factors, qk_clip_fused, qkv_row_heads
from .scalar import AdamWStep, LionStep, adamw_step, lion_step

__all__ = [
    "SCHEDULES", "schedule", "DionStep", "column_normalize", "dion_rank", "dion_step", "dion_transposed",
    "orthonormalize", "q_shape", "QR_METHODS", "RIGHT_FACTORS", "DionReplicatedStep", "dion_ideal_step",
    "dion_right_factor", "dion_step_replicated", "gaussian_sketch", "sketch_rows", "MuonStep", "lr_scale", "muon_step",
    "ns_attracting_band", "ns_band", "ns_derivative",
    "ns_diagonal_gain", "ns_lipschitz", "ns_map", "ns_polynomial", "ns_step_gains", "ns_step_magnitudes",
    "normalized_singular_values", "polar", "polar_decomposition", "singular_values", "svd",
    "polar_condition", "from_hi_lo", "to_float64", "to_hi_lo",
    "AdamWStep", "LionStep", "adamw_step", "lion_step",
    "Dion2Step", "dion2_local_select", "dion2_num_selected", "dion2_select", "dion2_select_rows", "dion2_slice_norms",
    "MuonPipelineStep", "muon_pipeline_step", "muon_stages",
    "dion2_step", "qk_clip_factors", "qk_clip_fused", "qkv_row_heads", "NS_MAP_BOUND", "check_bounded_schedule",
    "ns_map_sups",
]
