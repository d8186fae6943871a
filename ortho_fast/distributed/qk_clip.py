"""QK-clip of sharded attention weights: each rank clips the rows of its local block.

QK-clip is elementwise per row (every row of a head gets that head's factor), so under FSDP
(``Shard(0)``), colwise TP (``Shard(0)``), rowwise TP (``Shard(1)``: every rank holds every row,
a slice of the columns), FSDP on TP (``_StridedShard``) and HSDP each rank multiplies its local
rows by the factors of their global rows (``ortho_fast.functional.qk_clip.qk_clip_rows_``): no
communication, and the result equals one process bit for bit. The global row sets come from
``matrix_layout`` (docs/layouts.md); the checks of a step agree across ranks with
``raise_together`` before the step, so a bad logit on one rank raises on all of them.
Source: Kimi K2 (arXiv 2507.20534), Algorithm 1; Motif's parallel Muon (each rank scales its
slice of the per-head scales).
"""

from __future__ import annotations

from ..groups.qk_clip import QKClipRunner
from .comm import raise_together
from .layout import matrix_layout

__all__ = ["sharded_qk_clip_runner"]


def sharded_qk_clip_runner(sharding) -> QKClipRunner:
    """A ``QKClipRunner`` for a distributed Muon (``ortho_fast.distributed.muon.MuonSharding``:
    its ``dp`` / ``tp`` mesh axes): local row sets from ``matrix_layout`` on those axes, errors
    agreed over them (tag "qk_clip"). One process (no axes): a plain ``QKClipRunner``."""
    axes = [a for a in (sharding.dp, sharding.tp) if a is not None]
    if not axes:
        return QKClipRunner()

    def local_rows(p):
        return matrix_layout(p, {"outer": sharding.dp, "inner": sharding.tp}).rows

    def agree(error, device):
        raise_together(error, axes, tag="qk_clip", device=device)  # NCCL reduces on the GPU

    return QKClipRunner(local_rows, agree)
