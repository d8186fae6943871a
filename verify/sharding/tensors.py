"""Tensors of a distributed check, shared by ``ortho-verify sharding`` and
``check_sharded_optimizer``: placing the same seeded full tensor on a mesh, assembling a full
copy, and comparing copies (relative Frobenius difference, a digest per rank)."""

from __future__ import annotations

import hashlib
import math
from typing import Sequence

import torch

from .layouts import Layout

__all__ = ["digest", "dtensor_placements", "full_copy", "full_value", "is_dtensor", "place", "relative_difference",
           "write_full"]


def is_dtensor(t) -> bool:
    """True for a ``torch.distributed.tensor.DTensor`` (False when DTensor is unavailable)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch built without distributed
        return False
    return isinstance(t, DTensor)


def dtensor_placements(layout: Layout, mesh_shape: tuple[int, ...]) -> list:
    """The DTensor placements of ``layout.placements`` on a mesh of ``mesh_shape``: "R" Replicate,
    "S0" / "S1" Shard, "SS0" ``_StridedShard(0)`` with split factor the product of the later mesh
    dims that shard the same tensor dim (FSDP2 on top of colwise TP)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    out = []
    for d, code in enumerate(layout.placements):
        if code == "R":
            out.append(Replicate())
        elif code.startswith("SS"):
            later = [mesh_shape[e] for e in range(d + 1, len(mesh_shape)) if layout.placements[e] == f"S{code[2:]}"]
            out.append(_StridedShard(int(code[2:]), split_factor=math.prod(later)))
        else:
            out.append(Shard(int(code[1:])))
    return out


def place(full: torch.Tensor, layout: Layout, mesh, device) -> torch.Tensor:
    """This rank's view of ``full``: a DTensor with the layout's placements (no communication:
    every rank holds the full tensor; on the replicate dim each replica keeps its own values),
    or a plain copy when ``layout.placements`` is None (DDP)."""
    full = full.to(device)
    if layout.placements is None:
        return full.clone()
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full, mesh, dtensor_placements(layout, tuple(mesh.shape)), src_data_rank=None)


def full_value(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: ``full_tensor()`` of a DTensor (a collective), else ``t`` itself."""
    return t.full_tensor() if is_dtensor(t) else t


def write_full(p: torch.Tensor, full: torch.Tensor) -> None:
    """Store the full value ``full`` into ``p``: its own shard for a DTensor."""
    if is_dtensor(p):
        from torch.distributed.tensor import distribute_tensor

        p.to_local().copy_(distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local())
    else:
        p.copy_(full)


def full_copy(t: torch.Tensor) -> torch.Tensor:
    """A float64 CPU copy of the global tensor (``full_tensor()``, a collective, for a DTensor;
    never an alias of the optimizer's tensor, which a check may then modify)."""
    return (t.full_tensor() if is_dtensor(t) else t).detach().to("cpu", torch.float64, copy=True)


def relative_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    """‖got − want‖_F / ‖want‖_F (0 when both are zero, inf when only ``want`` is; inf for
    different shapes)."""
    if got.shape != want.shape:
        return math.inf
    den = torch.linalg.vector_norm(want).item()
    diff = torch.linalg.vector_norm(got - want).item()
    return diff / den if den else (0.0 if diff == 0 else math.inf)


def digest(tensors: Sequence[torch.Tensor]) -> str:
    """SHA-256 of the tensors' bytes (CPU tensors): equal digests mean bitwise equal copies."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.numpy().tobytes())
    return h.hexdigest()
