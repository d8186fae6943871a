"""The checks of ``ortho-verify``: the fast side measured against the oracle.

Each check returns ``CheckResult`` rows (``ortho_verify.report.results``): what was measured, on which
input, the error, the tolerance from ``ortho_verify.tolerances`` and whether it passed. Inputs
are float64 numpy matrices (``ortho_verify.inputs.spectra.MatrixCase``); the fast side runs in the dtype
under test. By subject:

- ``ortho_verify.checks.newton_schulz``: coefficient registries, ``newton_schulz`` vs ``ns_map``
  and the exact band (``compare_ns_output``, also used by ``ortho_verify.api``);
- ``ortho_verify.checks.muon``: one Muon step per system of ``MUON_CONFIGS``, the parameter
  layouts, parity with ``torch.optim.Muon``;
- ``ortho_verify.checks.dion``: one Dion step, default options or a variant of ``DION_VARIANTS``.

The option sets come from ``ortho_verify.registry``. Every name below stays importable from
``ortho_verify.checks`` (the result types and ``as_float64`` / ``TORCH_DTYPES`` too).
"""

from ..inputs.arrays import TORCH_DTYPES, as_float64
from ..report.results import CheckResult, measured, no_claim, verdict
from .dion import DION_VARIANTS, check_dion, dion_reference_rows, dion_sketches
from .dion2 import DION2_CONFIGS, check_dion2, check_dion2_optimizer, compare_dion2_step
from .muon import LAYOUT_BANK, LAYOUT_HEADS, MUON_CONFIGS, check_muon, check_muon_layouts, check_torch_muon
from .newton_schulz import (
    SHARP_SINGULAR_VALUE_TOLERANCE,
    case_svd,
    check_coefficient_registries,
    check_newton_schulz,
    compare_ns_output,
)
from .qk_clip import QK_CLIP_PLANTED, check_qk_clip, qk_clip_jobs
from .stages import check_muon_stages, stage_jobs

__all__ = [
    "check_muon_stages", "stage_jobs",
    "QK_CLIP_PLANTED", "check_qk_clip", "qk_clip_jobs",
    "CheckResult", "DION2_CONFIGS", "DION_VARIANTS", "check_dion2", "check_dion2_optimizer", "compare_dion2_step",
    "LAYOUT_BANK", "LAYOUT_HEADS", "MUON_CONFIGS", "SHARP_SINGULAR_VALUE_TOLERANCE",
    "TORCH_DTYPES", "as_float64", "case_svd", "check_coefficient_registries", "check_dion", "check_muon",
    "check_muon_layouts", "check_newton_schulz", "check_torch_muon", "compare_ns_output", "dion_reference_rows",
    "dion_sketches", "measured", "no_claim", "verdict",
]
