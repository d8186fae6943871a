"""One optimizer for a whole model: ``HybridOptimizer`` (``ortho_fast.hybrid_optimizer``), the
algorithms its groups run (``ortho_fast.groups.algorithms``), ``param_groups`` (``ortho_fast.grouping``)
and ``MuonConfig`` / ``DionConfig`` / ``meshes_from_world_mesh`` (``ortho_fast.config``), gathered here
where they have always been importable."""

from .config import DionConfig, MuonConfig, meshes_from_world_mesh
from .grouping import (
    EMBEDDING_NAMES,
    HEAD_NAMES,
    HYBRID_DEFAULTS,
    TOP_LEVEL_HEAD_NAMES,
    WRAPPER_NAME_COMPONENTS,
    normalize_name,
    param_groups,
)
from .groups.algorithms import ALGORITHMS, MATRIX_ALGORITHMS, SCALAR_ALGORITHMS, Algorithm
from .hybrid_optimizer import HybridOptimizer

__all__ = ["ALGORITHMS", "Algorithm", "DionConfig", "EMBEDDING_NAMES", "HEAD_NAMES", "HYBRID_DEFAULTS",
           "HybridOptimizer", "MATRIX_ALGORITHMS", "MuonConfig", "SCALAR_ALGORITHMS", "TOP_LEVEL_HEAD_NAMES",
           "WRAPPER_NAME_COMPONENTS", "meshes_from_world_mesh", "normalize_name", "param_groups"]
