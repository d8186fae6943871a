"""Collectives over a ``MeshAxis``, each one recorded in the active communication ledger.

Every collective the distributed optimizers issue goes through these functions, so a
``Ledger`` (``with record_collectives() as ledger: opt.step()``) sees all of them: the op, the
axis, its group size, the dtype and the bytes. A group of one rank issues nothing and records
nothing.

Bytes are the size of the collective's *logical tensor*, the convention of the Dion paper's
Table 1 (Ahn et al., arXiv 2504.05295): an all-reduce of an (m, r) tensor counts m·r
elements, an all-gather / gather / scatter counts the whole assembled tensor (every shard,
padding included: gloo and NCCL need equal-sized shards, so uneven shards travel padded), a
broadcast the tensor once. What a ring algorithm puts on each link (2(p−1)/p of an all-reduce)
is a property of the backend, not of the algorithm, and is not counted.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

import torch
import torch.distributed as dist

from .layout import MeshAxis

__all__ = ["CommRecord", "Ledger", "record_collectives", "active_ledger", "all_reduce", "all_reduce_axes",
           "all_gather_blocks",
           "gather_blocks", "scatter_blocks", "broadcast"]


@dataclass(frozen=True)
class CommRecord:
    """One collective: ``op`` ("all_reduce", "all_gather", "gather", "scatter", "broadcast"),
    ``axis`` (the MeshAxis name), ``group_size``, ``numel`` and ``bytes`` of the logical
    tensor (see the module docstring), ``dtype`` and a free-form ``tag`` (what it carried, e.g. "P")."""

    op: str
    axis: str
    group_size: int
    numel: int
    bytes: int
    dtype: str
    tag: str


@dataclass
class Ledger:
    """The collectives of one rank, in issue order. ``total_bytes()`` / ``by_tag()`` / ``by_op()``
    sum them; ``records`` is the list of ``CommRecord``."""

    records: list[CommRecord] = field(default_factory=list)

    def total_bytes(self) -> int:
        return sum(r.bytes for r in self.records)

    def total_numel(self) -> int:
        return sum(r.numel for r in self.records)

    def _sum(self, key) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for r in self.records:
            out[key(r)] += r.numel
        return dict(out)

    def by_tag(self) -> dict[str, int]:
        """Elements per tag."""
        return self._sum(lambda r: r.tag)

    def by_op(self) -> dict[str, int]:
        """Elements per (op, axis) as "op@axis"."""
        return self._sum(lambda r: f"{r.op}@{r.axis}")


_ACTIVE: list[Ledger] = []


@contextlib.contextmanager
def record_collectives() -> Iterator[Ledger]:
    """Record every collective issued through this module inside the block (nesting: the
    innermost ledger records)."""
    ledger = Ledger()
    _ACTIVE.append(ledger)
    try:
        yield ledger
    finally:
        _ACTIVE.remove(ledger)


def active_ledger() -> Ledger | None:
    return _ACTIVE[-1] if _ACTIVE else None


def _record(op: str, axis: MeshAxis, numel: int, dtype: torch.dtype, tag: str) -> None:
    if _ACTIVE:
        size = torch.empty((), dtype=dtype).element_size()
        _ACTIVE[-1].records.append(CommRecord(op, axis.name, axis.size, int(numel), int(numel) * size, str(dtype), tag))


def all_reduce(t: torch.Tensor, axis: MeshAxis | None, *, op=dist.ReduceOp.SUM, tag: str = "") -> torch.Tensor:
    """In-place all-reduce of ``t`` over ``axis`` (sum by default); a no-op for None or one rank."""
    if axis is None or axis.size == 1:
        return t
    dist.all_reduce(t, op=op, group=axis.group)
    _record("all_reduce", axis, t.numel(), t.dtype, tag)
    return t


def _padded(block: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    if tuple(block.shape) == shape:
        return block.contiguous()
    out = block.new_zeros(shape)
    out[: block.shape[0], : block.shape[1]] = block
    return out


def _max_shape(shapes: Sequence[tuple[int, int]]) -> tuple[int, int]:
    return (max(s[0] for s in shapes), max(s[1] for s in shapes))


def all_gather_blocks(block: torch.Tensor, axis: MeshAxis | None, shapes: Sequence[tuple[int, int]], *,
                      tag: str = "") -> list[torch.Tensor]:
    """The 2-D blocks of every rank of ``axis`` (in group order), given their ``shapes``
    (uneven blocks travel zero-padded to the largest shape). One rank: ``[block]``."""
    if axis is None or axis.size == 1:
        return [block]
    pad = _max_shape(shapes)
    parts = [block.new_empty(pad) for _ in range(axis.size)]
    dist.all_gather(parts, _padded(block, pad), group=axis.group)
    _record("all_gather", axis, pad[0] * pad[1] * axis.size, block.dtype, tag)
    return [p[: s[0], : s[1]] for p, s in zip(parts, shapes)]


def gather_blocks(block: torch.Tensor, axis: MeshAxis | None, shapes: Sequence[tuple[int, int]], owner: int, *,
                  tag: str = "") -> list[torch.Tensor] | None:
    """Every rank's 2-D block at the rank at position ``owner`` of ``axis`` (the list there,
    None elsewhere); uneven blocks travel zero-padded. One rank: ``[block]``."""
    if axis is None or axis.size == 1:
        return [block]
    pad = _max_shape(shapes)
    mine = axis.index == owner
    parts = [block.new_empty(pad) for _ in range(axis.size)] if mine else None
    dist.gather(_padded(block, pad), parts, group=axis.group, group_dst=owner)
    _record("gather", axis, pad[0] * pad[1] * axis.size, block.dtype, tag)
    return [p[: s[0], : s[1]] for p, s in zip(parts, shapes)] if mine else None


def scatter_blocks(blocks: Sequence[torch.Tensor] | None, axis: MeshAxis | None, shapes: Sequence[tuple[int, int]],
                   owner: int, *, like: torch.Tensor, tag: str = "") -> torch.Tensor:
    """This rank's block of ``blocks`` (given at the rank at position ``owner`` of ``axis``,
    one per rank in group order, None elsewhere); ``like`` gives dtype and device."""
    if axis is None or axis.size == 1:
        return blocks[0]
    pad = _max_shape(shapes)
    out = like.new_empty(pad)
    parts = [_padded(b, pad) for b in blocks] if axis.index == owner else None
    dist.scatter(out, parts, group=axis.group, group_src=owner)
    _record("scatter", axis, pad[0] * pad[1] * axis.size, like.dtype, tag)
    s = shapes[axis.index]
    return out[: s[0], : s[1]]


def broadcast(t: torch.Tensor, axis: MeshAxis | None, owner: int, *, tag: str = "") -> torch.Tensor:
    """In-place broadcast of ``t`` from the rank at position ``owner`` of ``axis``."""
    if axis is None or axis.size == 1:
        return t
    dist.broadcast(t, group=axis.group, group_src=owner)
    _record("broadcast", axis, t.numel(), t.dtype, tag)
    return t


def all_reduce_axes(t: torch.Tensor, axes: Sequence[MeshAxis], *, op=dist.ReduceOp.SUM, tag: str = "") -> torch.Tensor:
    """All-reduce over the product of ``axes`` (one all-reduce per axis, in order)."""
    for axis in axes:
        all_reduce(t, axis, op=op, tag=tag)
    return t


#: What a rank raises when another rank's input was rejected (its own error names the argument).
ANOTHER_RANK_REJECTED = ("grad: another rank rejected its gradient, state or option in this step (its own error names "
                         "it); no parameter or state was changed")


def _hash20(text: str) -> tuple[float, float]:
    """Two independent 20-bit numbers of ``text`` (sha256): their sums and sums of squares over up
    to 4096 ranks stay exact in float64 (< 2^52)."""
    digest = hashlib.sha256(text.encode()).digest()
    return float(int.from_bytes(digest[:3], "big") >> 4), float(int.from_bytes(digest[3:6], "big") >> 4)


def raise_together(error: BaseException | None, axes: Sequence[MeshAxis], flags: torch.Tensor | None = None, *,
                   tag: str = "check", device=None, digest: Mapping[str, str] | None = None) -> torch.Tensor:
    """The cross-rank error protocol of every distributed step: check locally, then agree.

    Each rank passes the first error its checks found (or None) and, in ``digest``, a text per
    aspect of what it is about to step that must be the same on every rank ("parameters": count,
    shapes, dtypes, placements; "options": the groups' options; ...). One all-reduce (SUM, tag
    ``tag``) per axis of a fixed-size vector — the error flag and, per aspect, two 20-bit hashes
    and their squares (all equal iff N·Σx² = (Σx)² over the N ranks) — makes the verdict global
    before anything whose size depends on the rank (a parameter list of another length would
    otherwise abort the collective, and another lr or shape would let the replicas diverge
    silently). Then ``flags`` (a 1-D float tensor whose entry 0 is ignored and the rest are
    counts the caller wants summed: which parameters have a gradient, ...) is all-reduced.
    Shapes: ``flags`` (1 + k,) on the device the backend reduces (NCCL: the GPU; ``device``).
    Returns: the reduced ``flags`` (entry 0: how many ranks found an error, here 0).
    Raises, on every rank before any step changes anything: ValueError naming the aspects the
    ranks disagree on; else ``error`` itself on the rank that found it and ValueError
    (``ANOTHER_RANK_REJECTED``) on every other rank when any rank found one.
    Communication: 1 + 4·len(digest) elements per axis, then k elements per axis if k > 0.
    """
    if flags is None:
        flags = torch.zeros(1, device=device)
    hashes = [(name, _hash20(text)) for name, text in (digest or {}).items()]
    values = [1.0 if error is not None else 0.0]
    for _, (a, b) in hashes:
        values += [a, b, a * a, b * b]
    head = torch.tensor(values, dtype=torch.float64, device=flags.device)
    all_reduce_axes(head, axes, tag=tag)
    ranks = math.prod(axis.size for axis in axes)
    sums = head[1:].reshape(-1, 4).tolist() if hashes else []
    differ = [name for (name, _), (a, b, a2, b2) in zip(hashes, sums) if a2 * ranks != a * a or b2 * ranks != b * b]
    if differ:
        raise ValueError(f"{', '.join(differ)}: the ranks disagree on the {' and the '.join(differ)} of this step "
                         f"(every rank must build the optimizer with the same parameters in the same order and the "
                         f"same options, and keep them equal); no parameter or state was changed")
    if error is not None:
        raise error
    if head[0] > 0:
        raise ValueError(ANOTHER_RANK_REJECTED)
    if flags.numel() > 1:
        counts = flags[1:].contiguous()
        all_reduce_axes(counts, axes, tag=tag)
        flags[1:] = counts
    flags[0] = 0.0
    return flags
