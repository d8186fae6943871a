"""Where each element of a matrix parameter lives: mesh axes, placements and global index sets.

A distributed optimizer here never asks torch to redistribute a parameter. It reads the
parameter's placements once, turns them into this rank's *global index sets* of the matrix
(rows ``I`` and columns ``J`` of the (m, n) matrix the optimizer works on, so the local block
is ``W[I][:, J]``), and names the process groups that shard each matrix dimension. Every
distributed algorithm (``ortho_fast.distributed.dion`` / ``muon``) is written against that
description, so one code path covers DDP, FSDP2 (``Shard(0)``), TP (colwise ``Shard(0)``,
rowwise ``Shard(1)``), HSDP and their combinations, FSDP2 on top of colwise TP
(``_StridedShard``), uneven shards (``torch.chunk`` semantics: trailing shards smaller or
empty) and flattened ndim > 2 weights.

The index sets follow ``torch.distributed.tensor._utils._compute_local_shape_and_global_offset``
(left-to-right over the mesh dims, ``_StridedShard`` materializing its strided offsets); a test
checks them against ``DTensor.full_tensor()`` for every layout.

Terms (microsoft/dion's constructor arguments, docs/design.md): the *replicate* mesh carries data
parallelism (DDP, the replicate dim of HSDP), the *outer shard* mesh weight sharding (FSDP),
the *inner shard* mesh tensor parallelism (TP). Each is a 1-D DeviceMesh or a ProcessGroup.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Sequence

import torch
import torch.distributed as dist

from ..validation import is_dtensor

__all__ = ["ROLES", "LayoutError", "MeshAxis", "MatrixLayout", "mesh_axis", "check_axes", "matrix_layout"]

#: The optimizer's mesh arguments, in the order they are matched against a parameter's mesh dims.
ROLES = ("replicate", "outer", "inner")
#: Tensor-parallel Newton–Schulz modes (Megatron ``muon_tp_mode`` / Emerging-Optimizers ``newton_schulz_tp``).
TP_MODES = ("duplicated", "distributed", "blockwise")


class LayoutError(ValueError):
    """A mesh or a parameter layout the distributed optimizers cannot use (raised at construction)."""


class MeshAxis(NamedTuple):
    """One 1-D process group as seen from this rank.

    Fields: ``name`` (the argument it came from, e.g. "outer_shard_mesh"), ``group`` (the
    ProcessGroup; None for the trivial group of one rank), ``ranks`` (global ranks in group
    order), ``index`` (this rank's position in ``ranks``).
    """

    name: str
    group: object
    ranks: tuple[int, ...]
    index: int

    @property
    def size(self) -> int:
        return len(self.ranks)


def _group_ranks(group) -> tuple[int, ...]:
    return tuple(dist.get_process_group_ranks(group))


def mesh_axis(mesh, name: str) -> MeshAxis | None:
    """``MeshAxis`` of a 1-D DeviceMesh or a ProcessGroup (None passes through).

    Raises: LayoutError naming ``name`` for a DeviceMesh with ndim != 1, a mesh this rank is
    not part of, or something that is neither; RuntimeError if torch.distributed is not initialized.
    """
    if mesh is None:
        return None
    if not dist.is_initialized():
        raise RuntimeError(f"{name}: torch.distributed is not initialized (call init_process_group first)")
    from torch.distributed.device_mesh import DeviceMesh

    if isinstance(mesh, DeviceMesh):
        if mesh.ndim != 1:
            raise LayoutError(f"{name}: expected a 1-D DeviceMesh, got ndim {mesh.ndim} (shape {tuple(mesh.shape)}, "
                              f"names {mesh.mesh_dim_names}); pass one dimension, e.g. mesh['dp']")
        if mesh.get_coordinate() is None:
            raise LayoutError(f"{name}: this rank ({dist.get_rank()}) is not part of the mesh")
        group = mesh.get_group(0)
    elif isinstance(mesh, dist.ProcessGroup):
        group = mesh
    else:
        raise LayoutError(f"{name}: expected a 1-D DeviceMesh or a ProcessGroup, got {type(mesh).__name__}")
    ranks = _group_ranks(group)
    me = dist.get_rank()
    if me not in ranks:
        raise LayoutError(f"{name}: this rank ({me}) is not in its process group {ranks}")
    return MeshAxis(name, group if len(ranks) > 1 else None, ranks, ranks.index(me))


def check_axes(axes: Sequence[MeshAxis | None]) -> None:
    """Raise LayoutError if two given axes overlap: two 1-D meshes of one N-D mesh share exactly
    this rank; any other common rank means the same devices would be counted twice."""
    given = [a for a in axes if a is not None]
    for a, b in itertools.combinations(given, 2):
        common = set(a.ranks) & set(b.ranks)
        if a.size > 1 and b.size > 1 and common != {a.ranks[a.index]}:
            raise LayoutError(f"{a.name} and {b.name} overlap: ranks {sorted(common)} are in both "
                              f"({a.name} {a.ranks}, {b.name} {b.ranks}); each must be a different dimension of one "
                              "mesh")


def dim_indices(shape: Sequence[int], mesh_shape: Sequence[int], coordinate: Sequence[int],
                 placements: Sequence) -> list[torch.Tensor]:
    """Global indices along each tensor dim held at mesh ``coordinate`` (left-to-right over
    the mesh dims, as torch's ``_compute_local_shape_and_global_offset``)."""
    from torch.distributed.tensor.placement_types import Shard, _StridedShard, _StridedShardOffsetMode

    idx = [torch.arange(s) for s in shape]
    for mesh_dim, pl in enumerate(placements):
        if isinstance(pl, _StridedShard):
            size, offsets = pl._local_shard_size_and_offset(len(idx[pl.dim]), mesh_shape[mesh_dim],
                                                            coordinate[mesh_dim],
                                                            offset_mode=_StridedShardOffsetMode.ALL)
            sel = torch.tensor(list(offsets)[:size], dtype=torch.int64) if size else torch.zeros(0, dtype=torch.int64)
        elif isinstance(pl, Shard):
            size, start = Shard.local_shard_size_and_offset(len(idx[pl.dim]), mesh_shape[mesh_dim],
                                                            coordinate[mesh_dim])
            sel = torch.arange(start, start + size) if size else torch.zeros(0, dtype=torch.int64)
        else:
            continue
        idx[pl.dim] = idx[pl.dim][sel]
    return idx


def flat_indices(idx: Sequence[torch.Tensor], shape: Sequence[int]) -> torch.Tensor:
    """Row-major flat indices of the product of per-dim index sets (``reshape`` order)."""
    flat = torch.zeros(1, dtype=torch.int64)
    for ix, size in zip(idx, shape):
        flat = (flat[:, None] * size + ix[None, :]).reshape(-1)
    return flat


@dataclass(frozen=True)
class MatrixLayout:
    """This rank's part of one matrix parameter W (m, n).

    ``rows`` / ``cols``: int64 CPU tensors of global indices, the local block is
    ``W[rows][:, cols]`` (strided or empty sets allowed). ``row_axes`` / ``col_axes``: the
    axes that shard each dimension, in mesh-dim order (gathering over all of them yields W).
    ``peer`` gives the index sets of another rank along those axes. ``transposed()`` is the
    layout of Wᵀ (Dion and Newton–Schulz work in an orientation fixed by (m, n) only).
    """

    shape: tuple[int, int]
    rows: torch.Tensor
    cols: torch.Tensor
    row_axes: tuple[MeshAxis, ...] = ()
    col_axes: tuple[MeshAxis, ...] = ()
    # How to recompute the index sets at another coordinate (internal).
    _tensor_shape: tuple[int, ...] = ()
    _mesh_shape: tuple[int, ...] = ()
    _coordinate: tuple[int, ...] = ()
    _placements: tuple = ()
    _axis_dims: Mapping[str, int] = field(default_factory=dict)
    _swapped: bool = False

    @property
    def local_shape(self) -> tuple[int, int]:
        return (len(self.rows), len(self.cols))

    @property
    def is_sharded(self) -> bool:
        return bool(self.row_axes or self.col_axes)

    def transposed(self) -> "MatrixLayout":
        return MatrixLayout((self.shape[1], self.shape[0]), self.cols, self.rows, self.col_axes, self.row_axes,
                            self._tensor_shape, self._mesh_shape, self._coordinate, self._placements, self._axis_dims,
                            not self._swapped)

    def peer(self, positions: Mapping[str, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, cols) held by the rank whose position along each named axis is
        ``positions[name]`` (other axes: this rank's). Axis names are ``MeshAxis.name``; an axis
        that does not shard this parameter holds the same block everywhere and is ignored."""
        if not self._placements:
            return self.rows, self.cols
        coord = list(self._coordinate)
        for name, pos in positions.items():
            if name in self._axis_dims:
                coord[self._axis_dims[name]] = pos
        idx = dim_indices(self._tensor_shape, self._mesh_shape, coord, self._placements)
        rows, cols = idx[0], flat_indices(idx[1:], self._tensor_shape[1:])
        return (cols, rows) if self._swapped else (rows, cols)

    def without(self, name: str) -> "MatrixLayout":
        """The layout if the axis ``name`` (a ``MeshAxis.name``) did not shard the parameter (its
        mesh dim read as Replicate): e.g. the tensor-parallel block of a rank before FSDP shards
        it further. ``self`` if that axis does not shard the parameter."""
        if name not in self._axis_dims:
            return self
        from torch.distributed.tensor.placement_types import Replicate

        placements = list(self._placements)
        placements[self._axis_dims[name]] = Replicate()
        idx = dim_indices(self._tensor_shape, self._mesh_shape, self._coordinate, placements)
        rows, cols = idx[0], flat_indices(idx[1:], self._tensor_shape[1:])
        row_axes, col_axes = (tuple(a for a in axes if a.name != name) for axes in (self.row_axes, self.col_axes))
        dims = {k: d for k, d in self._axis_dims.items() if k != name}
        if self._swapped:
            rows, cols = cols, rows
        return MatrixLayout(self.shape, rows, cols, row_axes, col_axes, self._tensor_shape, self._mesh_shape,
                            self._coordinate, tuple(placements), dims, self._swapped)


def matrix_layout(param: torch.Tensor, axes: Mapping[str, MeshAxis | None], *,
                  hint: str = "pass it as outer_shard_mesh (FSDP) or inner_shard_mesh (TP)") -> MatrixLayout:
    """The ``MatrixLayout`` of a parameter of ndim >= 2 as the matrix (shape[0], prod(shape[1:])).

    A plain tensor is whole on this rank (no axes). A DTensor's mesh dims are matched, by their
    process-group ranks, against ``axes`` (keys from ``ROLES``; values from ``mesh_axis``):
    a ``Shard`` / ``_StridedShard`` mesh dim must be the outer or inner shard axis, a
    ``Replicate`` mesh dim may be any axis or none.
    Raises: LayoutError naming the parameter's mesh dim for a ``Partial`` placement, a sharded
    mesh dim that is none of the given meshes ("a DTensor sharded on a mesh the optimizer was
    not given"; ``hint`` ends that message with the optimizer's own argument names), or sharded
    by the replicate mesh; ValueError for ndim < 2.
    """
    if param.ndim < 2:
        raise ValueError(f"param: expected ndim >= 2, got shape {tuple(param.shape)}")
    shape = tuple(int(s) for s in param.shape)
    m, n = shape[0], int(torch.tensor(shape[1:]).prod())
    if not is_dtensor(param):
        return MatrixLayout((m, n), torch.arange(m), torch.arange(n))
    from torch.distributed.tensor.placement_types import Replicate, Shard, _StridedShard

    mesh, placements = param.device_mesh, tuple(param.placements)
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise LayoutError(f"param: this rank is not part of the parameter's mesh {mesh}")
    names = mesh.mesh_dim_names or tuple(f"dim{d}" for d in range(mesh.ndim))
    row_axes, col_axes, axis_dims = [], [], {}
    for d, pl in enumerate(placements):
        if isinstance(pl, Replicate) or mesh.size(d) == 1:
            continue
        if not isinstance(pl, (Shard, _StridedShard)):
            raise LayoutError(f"param: mesh dim {names[d]!r} has placement {pl}; only Shard, _StridedShard and "
                              f"Replicate parameters can be stepped (a Partial parameter has no value yet)")
        ranks = _group_ranks(mesh.get_group(d))
        role = next((r for r in ROLES if axes.get(r) is not None and axes[r].ranks == ranks), None)
        if role is None:
            given = {a.name: a.ranks for a in axes.values() if a is not None}
            raise LayoutError(f"param: a DTensor of shape {shape} is sharded ({pl}) on mesh dim {names[d]!r} with "
                              f"ranks {ranks}, which is none of the meshes the optimizer was given {given}; {hint}")
        if role == "replicate":
            raise LayoutError(f"param: mesh dim {names[d]!r} shards the parameter ({pl}) but is the replicate_mesh; "
                              f"the replicate mesh must hold whole replicas (pass it as outer_shard_mesh)")
        axis_dims[axes[role].name] = d
        (row_axes if pl.dim % param.ndim == 0 else col_axes).append(axes[role])
    idx = dim_indices(shape, tuple(mesh.shape), tuple(coordinate), placements)
    return MatrixLayout((m, n), idx[0], flat_indices(idx[1:], shape[1:]), tuple(row_axes), tuple(col_axes),
                        shape, tuple(mesh.shape), tuple(coordinate), placements, axis_dims)
