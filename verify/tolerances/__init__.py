"""Every tolerance of the verification suite, each a formula with its derivation.

Nothing here is a number tuned until a test passes: each tolerance is computed from the
oracle's own quantities (the normalized spectrum σ̂, first-order gains of the Newton–Schulz
map, condition numbers) and the unit roundoff u of the compute dtype. docs/tolerances.md
repeats the derivations; the constants are the only free choices and each says why.

By subject (every name stays importable from ``ortho_verify.tolerances``):

- ``roundoff``: unit roundoffs (TF32's 2⁻¹¹ operand rounding included), C_NS, the matmul /
  factorization rounding models;
- ``newton_schulz``: ``ns_tolerance``, the per-direction bfloat16 / float16 / TF32 tolerances and the
  Gram Newton–Schulz ones (``ns_gram_singular_value_tolerances``, ``ns_gram_tolerance``);
- ``statistical``: the mean deviation over many matrices of a low-precision kernel
  (``ns_rounding_moments``, ``ns_mean_deviation_tolerances``, false-alarm probability 1e-6);
  ``gram_statistical``: its rounding moments for Gram Newton–Schulz (``gram_rounding_moments``);
- ``polar``: the oracle's SVD, polar factor, ``ns_map`` and mpmath agreement;
- ``muon``: a Muon step, momentum, cautious weight decay, parity with torch.optim.Muon;
- ``dion``: a Dion step with any QR method / right factor / precision, the error-feedback identity;
- ``error_feedback``: Dion's error-feedback invariants, subspace iteration, observed steps;
- ``scalar``: AdamW and Lion;
- ``sharded``: the layout contract of the distributed optimizers;
- ``compiled``: a ``torch.compile``d step against the eager step;
- ``baselines``: the regression margin of ``ortho-verify --baseline``.

numpy and ``ortho_ref`` only: importing it needs neither torch nor the judge's optional
dependencies.

Notation: u = unit roundoff of the compute dtype (2⁻⁵³ float64, 2⁻²⁴ float32, 2⁻⁸ bfloat16,
2⁻¹¹ float16), u64 = 2⁻⁵³ (the float64 oracle), k = min(m, n), d = max(m, n).
"""

from .baselines import BASELINE_FLOOR, BASELINE_GROWTH
from .compiled import compiled_tolerance
from .dion import (
    FIRST_ORDER_LIMIT,
    dion_ideal_step_tolerances,
    dion_tolerances,
    dion_variant_tolerances,
    error_feedback_projection_tolerance,
    error_feedback_tolerance,
    orthonormality_tolerance,
    qr_factor_tolerance,
    qr_orthogonality_tolerance,
    sketch_condition,
)
from .dion2 import FIRST_ORDER_FRACTION, dion2_norm_tolerances, dion2_selection_violation, dion2_step_tolerances
from .error_feedback import (
    dion_observed_step_tolerances,
    ef_bookkeeping_tolerance,
    ef_subspace_tolerances,
    full_rank_polar_bounds,
    polar_fixed_point_tolerance,
    subspace_iteration_bounds,
    subspace_perturbation,
)
from .gram_statistical import gram_rounding_moments
from .muon import (
    TORCH_MUON_TOLERANCE,
    WEIGHT_DECAY_POWER_LIMIT,
    cautious_weight_decay_tolerance,
    momentum_tolerance,
    muon_tolerance,
    weight_decay_power,
    weight_decay_tolerance,
)
from .newton_schulz import (
    COEFFICIENT_REGISTRY_TOLERANCE,
    NS_FORMS,
    gains_and_sizes,
    gram_point_gains,
    gram_rounding_points,
    ns_gram_singular_value_tolerances,
    ns_gram_tolerance,
    ns_singular_value_tolerance,
    ns_singular_value_tolerances,
    ns_tolerance,
    per_product_roundoff,
    validate_restarts,
)
from .polar import (
    LAPACK_SVD_TOLMUL,
    POLAR_VALIDITY,
    SCALAR_STEP_ROUNDINGS,
    mp_accuracy,
    mp_agreement_tolerance,
    ns_map_tolerance,
    polar_condition_tolerance,
    polar_hermitian_tolerance,
    polar_tolerance,
    prescribed_spectrum_tolerance,
    svd_residual_tolerance,
)
from .qk_clip import POW_ULPS, QK_CLIP_FIRST_ORDER, qk_clip_tolerance
from .roundoff import (
    C_NS,
    COMPUTE_PRECISIONS,
    PER_DIRECTION_PRECISIONS,
    TF32_UNIT_ROUNDOFF,
    U64,
    UNIT_ROUNDOFF,
    compute_precision,
    condition_number,
    factor_roundoff,
    matmul_roundoff,
    operand_roundings,
    unit_roundoff,
)
from .scalar import adamw_tolerances, lion_tolerances
from .sharded import SHARDED_RTOL, newton_schulz_in, sharded_compute_tolerance, sharded_tolerance
from .stages import equilibration_error, normuon_amplification, scaling_error, stage_tolerances
from .statistical import FALSE_ALARM_PROBABILITY, hoeffding_lambda, ns_mean_deviation_tolerances, ns_rounding_moments

__all__ = [
    "COMPUTE_PRECISIONS", "NS_FORMS", "PER_DIRECTION_PRECISIONS", "TF32_UNIT_ROUNDOFF", "compute_precision",
    "gram_point_gains", "gram_rounding_moments", "gram_rounding_points", "ns_gram_singular_value_tolerances",
    "ns_gram_tolerance",
    "operand_roundings", "per_product_roundoff", "validate_restarts",
    "equilibration_error", "normuon_amplification", "scaling_error", "stage_tolerances",
    "POW_ULPS", "QK_CLIP_FIRST_ORDER", "qk_clip_tolerance",
    "FIRST_ORDER_FRACTION", "dion2_norm_tolerances", "dion2_selection_violation", "dion2_step_tolerances",
    "BASELINE_FLOOR", "BASELINE_GROWTH", "COEFFICIENT_REGISTRY_TOLERANCE", "C_NS", "FALSE_ALARM_PROBABILITY",
    "FIRST_ORDER_LIMIT", "hoeffding_lambda", "ns_mean_deviation_tolerances", "ns_rounding_moments",
    "LAPACK_SVD_TOLMUL", "POLAR_VALIDITY", "SCALAR_STEP_ROUNDINGS", "SHARDED_RTOL", "TORCH_MUON_TOLERANCE", "U64",
    "UNIT_ROUNDOFF", "adamw_tolerances", "cautious_weight_decay_tolerance", "compiled_tolerance", "condition_number",
    "dion_ideal_step_tolerances", "dion_observed_step_tolerances", "dion_tolerances", "dion_variant_tolerances",
    "ef_bookkeeping_tolerance", "ef_subspace_tolerances", "error_feedback_projection_tolerance",
    "error_feedback_tolerance", "factor_roundoff", "full_rank_polar_bounds", "gains_and_sizes", "lion_tolerances",
    "matmul_roundoff", "momentum_tolerance", "mp_accuracy", "mp_agreement_tolerance", "muon_tolerance",
    "weight_decay_power", "weight_decay_tolerance", "WEIGHT_DECAY_POWER_LIMIT",
    "ns_map_tolerance", "ns_singular_value_tolerance", "ns_singular_value_tolerances", "ns_tolerance",
    "orthonormality_tolerance", "polar_condition_tolerance", "polar_fixed_point_tolerance",
    "polar_hermitian_tolerance", "polar_tolerance", "prescribed_spectrum_tolerance", "qr_factor_tolerance",
    "qr_orthogonality_tolerance", "newton_schulz_in", "sharded_compute_tolerance", "sharded_tolerance",
    "sketch_condition", "subspace_iteration_bounds",
    "subspace_perturbation", "svd_residual_tolerance", "unit_roundoff",
]
