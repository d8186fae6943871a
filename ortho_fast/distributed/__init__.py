"""Distributed execution of Muon and Dion over torch.distributed (DeviceMesh / DTensor / ProcessGroup).

``layout``: where each element of a matrix parameter lives (global index sets per rank, the
process groups sharding each dimension); ``comm``: the collectives, each recorded in a
``Ledger``. The optimizers themselves take the mesh arguments (``ortho_fast.Dion(...,
replicate_mesh=, outer_shard_mesh=, inner_shard_mesh=, process_group=)``,
``ortho_fast.Muon(..., distributed_mesh=, tp_mesh=, tp_mode=)``).
"""

from .comm import CommRecord, Ledger, record_collectives
from .dion import dion_check_volume, dion_comm_volume, sharded_dion_step, synchronize_replicas
from .layout import LayoutError, MatrixLayout, MeshAxis, matrix_layout, mesh_axis
from .muon import TP_MODES, MuonSharding, muon_comm_volume, newton_schulz_sharded

__all__ = ["CommRecord", "Ledger", "record_collectives", "LayoutError", "MatrixLayout", "MeshAxis", "matrix_layout",
           "mesh_axis", "TP_MODES", "MuonSharding", "muon_comm_volume", "newton_schulz_sharded", "dion_check_volume",
           "dion_comm_volume", "sharded_dion_step", "synchronize_replicas"]
