"""ortho_fast's Dion and Muon as factories of ``check_sharded_optimizer`` (``dion_factory``,
``muon_factory``): ortho_fast's own distributed optimizers checked through the same public
mechanism as anyone's (``ortho-verify sharding --optimizer ortho_verify.sharding:dion_factory``).
Options: ``ortho_verify.registry.SHARDING_DION`` / ``SHARDING_MUON``."""

from __future__ import annotations

import ortho_fast

from .layouts import DION_OPTIONS, MUON_OPTIONS

__all__ = ["dion_factory", "muon_factory"]


def dion_factory(params, layout):
    """``ortho_fast.Dion`` with ``DION_OPTIONS``, the layout's meshes under microsoft/dion's names
    (one process: no mesh). Every replica is fed the same gradient, so the compressed
    data-parallel sync (the default) must give the one-process step too."""
    if layout is None:
        return ortho_fast.Dion(params, **DION_OPTIONS)
    return ortho_fast.Dion(params, **DION_OPTIONS, replicate_mesh=layout.replicate_mesh,
                           outer_shard_mesh=layout.outer_shard_mesh, inner_shard_mesh=layout.inner_shard_mesh)


def muon_factory(params, layout):
    """``ortho_fast.Muon`` with ``MUON_OPTIONS``: ``distributed_mesh`` the outer shard mesh (FSDP,
    HSDP: every replica computes the same update) or the replicate mesh (DDP), ``tp_mesh`` the
    inner shard mesh (TP "duplicated")."""
    if layout is None:
        return ortho_fast.Muon(params, **MUON_OPTIONS)
    return ortho_fast.Muon(params, **MUON_OPTIONS, distributed_mesh=layout.shard_mesh, tp_mesh=layout.inner_shard_mesh)
