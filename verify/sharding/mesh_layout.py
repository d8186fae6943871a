"""What a user's optimizer factory is told about a layout (``ShardedLayout``): the mesh, the
placements and the 1-D sub-meshes under microsoft/dion's names, so that a factory maps them to
its own constructor in one line (docs/verification.md, "Distributed optimizers")."""

from __future__ import annotations

from dataclasses import dataclass

from .layouts import Layout
from .tensors import dtensor_placements

__all__ = ["ShardedLayout", "sharded_layout"]


@dataclass(frozen=True)
class ShardedLayout:
    """One layout of ``check_sharded_optimizer``, as its factory ``factory(params, layout)`` sees it.

    ``name``: e.g. "FSDP + TP colwise". ``mesh``: the ``DeviceMesh`` (named dims "dp",
    "dp_replicate", "dp_shard", "tp"). ``placements``: the parameters' DTensor placements, one per
    mesh dim (None: plain replicated tensors, DDP). ``replicate_mesh`` / ``outer_shard_mesh`` /
    ``inner_shard_mesh``: the 1-D sub-meshes of the data-parallel replicas, of FSDP's sharding and
    of TP's (None when the layout has no such dim; microsoft/dion's ``Dion`` arguments).
    ``process_group``: the ``ProcessGroup`` of the replicas for DDP-style optimizers on plain
    tensors (None otherwise). ``dims``: the mesh dim names; ``catalogue``: the entry of
    ``ortho_verify.sharding.SHARDED_LAYOUTS`` it was built from.
    """

    name: str
    mesh: object
    placements: tuple | None
    replicate_mesh: object = None
    outer_shard_mesh: object = None
    inner_shard_mesh: object = None
    process_group: object = None
    dims: tuple[str, ...] = ()
    catalogue: Layout | None = None

    @property
    def shard_mesh(self):
        """The mesh a Muon-style optimizer distributes its work over: ``outer_shard_mesh``, else
        ``replicate_mesh`` (DDP), else None (microsoft/dion's and ortho_fast's ``distributed_mesh``)."""
        return self.outer_shard_mesh if self.outer_shard_mesh is not None else self.replicate_mesh


_ROLE_FIELDS = ("replicate_mesh", "outer_shard_mesh", "inner_shard_mesh", "process_group")


def sharded_layout(layout: Layout, mesh) -> ShardedLayout:
    """The ``ShardedLayout`` of a catalogue entry on ``mesh`` (built by ``init_device_mesh`` with
    ``layout.dims``): each role of ``layout.roles`` becomes the 1-D sub-mesh of its dim ("dim:group":
    that sub-mesh's ProcessGroup). Raises: ValueError for a role that is not a field."""
    roles = {}
    for arg, dim in layout.roles:
        if arg not in _ROLE_FIELDS:
            raise ValueError(f"layout.roles: {arg!r} is not one of {_ROLE_FIELDS}")
        name, _, as_group = dim.partition(":")
        roles[arg] = mesh[name].get_group() if as_group else mesh[name]
    placements = None if layout.placements is None else tuple(dtensor_placements(layout, tuple(mesh.shape)))
    return ShardedLayout(layout.name, mesh, placements, dims=layout.dims, catalogue=layout, **roles)
