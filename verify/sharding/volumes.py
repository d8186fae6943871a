"""Communication of ``ortho-verify sharding``: the analytic volume of each layout (the Dion paper's
Table 1 per layout, ``dion_comm_volume`` / ``muon_comm_volume``) and the verdict on a measured one."""

from __future__ import annotations

import math

from ortho_fast.distributed.volumes import dion2_comm_volume, dion_comm_volume, muon_comm_volume
from ortho_fast.functional.dion import dion_rank
from ortho_fast.functional.muon_stages import normuon_variance_shape

from .layouts import Layout, optimizer_options

__all__ = ["analytic_volume", "comm_verdict", "padded_shape"]


def _sharding(layout: Layout, mesh_shape: tuple[int, ...], role: str) -> tuple[int, int | None]:
    """(size, tensor dim it shards or None) of the mesh dim given to the optimizer argument ``role``;
    (1, None) if the layout has none. A dim of one rank issues no collective."""
    dim = dict(layout.roles).get(role)
    if dim is None:
        return 1, None
    d = layout.dims.index(dim.partition(":")[0])
    code = "R" if layout.placements is None else layout.placements[d]
    return mesh_shape[d], None if code == "R" else int(code[-1])


def padded_shape(layout: Layout, mesh_shape: tuple[int, ...], shape: tuple[int, int]) -> tuple[int, int]:
    """(m, n) rounded up to a multiple of the number of ranks sharding each dim: the largest shard
    times the shard count (``torch.chunk`` shards, nested ceilings ceil(ceil(m/a)/b) = ceil(m/ab))."""
    out = list(shape)
    for d in (0, 1):
        k = math.prod(size for size, code in zip(mesh_shape, layout.placements or ()) if code != "R" and
                      int(code[-1]) == d)
        out[d] = k * math.ceil(shape[d] / k)
    return out[0], out[1]


def analytic_volume(layout: Layout, mesh_shape: tuple[int, ...], shape: tuple[int, int], *,
                    padded: bool = False) -> int | None:
    """Elements one rank's collectives carry in one step of an optimizer holding the (m, n) matrix
    alone, from the distributed optimizer's own formula (``muon_comm_volume`` /
    ``dion_comm_volume``, the Dion paper's Table 1 per layout), for the owner rank (the largest);
    ``padded``: evaluated at ``padded_shape``, the most that zero-padded uneven shards can add
    (gloo and NCCL gather equal-sized blocks). Muon's formula counts that padding itself (its
    largest blocks), Dion2 all-reduces exact sizes (``dion2_comm_volume``), so for both ``padded``
    changes nothing: the ledger must equal the formula for every shape. None where no formula exists (yet)."""
    m, n = padded_shape(layout, mesh_shape, shape) if padded and layout.optimizer == "dion" else shape
    if layout.optimizer == "dion2":
        opts = optimizer_options(layout)
        shards = [(size, dim) for role in ("distributed_mesh", "tp_mesh")
                  for size, dim in [_sharding(layout, mesh_shape, role)] if dim is not None]
        return sum(dion2_comm_volume(m, n, fraction=opts["fraction"], row_shards=[s for s, d in shards if d == 0],
                                     col_shards=[s for s, d in shards if d == 1],
                                     selection_scope=opts["selection_scope"]).values())
    if layout.optimizer in ("muon", "normuon-stages"):
        dp_size, dp_dim = _sharding(layout, mesh_shape, "distributed_mesh")
        tp_size, tp_dim = _sharding(layout, mesh_shape, "tp_mesh")
        dp = None if dp_size == 1 else "ddp" if dp_dim is None else "fsdp"
        tp_mode = optimizer_options(layout).get("tp_mode", "duplicated") if tp_size > 1 else None
        opts = optimizer_options(layout)
        variance = 0  # NorMuon's second moment, broadcast by the owner: m per row or n per column
        if layout.optimizer == "normuon-stages":
            variance = math.prod(normuon_variance_shape((m, n), opts.get("normuon_dim", "row")))
        return sum(muon_comm_volume((m, n), dp=dp, dp_size=dp_size, dp_dim=dp_dim or 0, tp_mode=tp_mode,
                                    tp_size=tp_size, tp_dim=tp_dim or 0, variance=variance).values())
    shards = [(size, dim) for role in ("outer_shard_mesh", "inner_shard_mesh")
              for size, dim in [_sharding(layout, mesh_shape, role)] if dim is not None]
    opts = optimizer_options(layout)
    variant = {k: opts[k] for k in ("qr_method", "right_factor", "power_iters", "oversample") if k in opts}
    replicas = max(_sharding(layout, mesh_shape, role)[0] for role in ("replicate_mesh", "process_group"))
    return sum(dion_comm_volume(
        m, n, dion_rank(*shape, opts["rank_fraction"]), row_shards=[s for s, d in shards if d == 0],
        col_shards=[s for s, d in shards if d == 1], replicas=replicas,
        replicate_mesh_grad_sync=opts.get("replicate_mesh_grad_sync", True), **variant).values())


def comm_verdict(measured: int, analytic: int | None, padded: int | None) -> str:
    """"exact" (measured = analytic), "padding" (analytic < measured <= the padded evaluation),
    "no formula" (analytic None) or "MISMATCH" (anything else: a collective missing or extra)."""
    if analytic is None:
        return "no formula"
    return "exact" if measured == analytic else "padding" if analytic < measured <= padded else "MISMATCH"
