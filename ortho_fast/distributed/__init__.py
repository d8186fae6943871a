"""Distributed execution of Muon and Dion over torch.distributed (DeviceMesh / DTensor / ProcessGroup).

``layout``: where each element of a matrix parameter lives (global index sets per rank, the
process groups sharding each dimension); ``comm``: the collectives, each recorded in a
``Ledger``. The optimizers themselves take the mesh arguments (``ortho_fast.Dion(...,
replicate_mesh=, outer_shard_mesh=, inner_shard_mesh=, process_group=)``,
``ortho_fast.Muon(..., distributed_mesh=, tp_mesh=, tp_mode=)``).
"""
