"""Planted bugs of ``ortho-verify sharding``: replacements of torch.distributed collectives that a
correct check must catch (``PLANTS``; ``tests/verify/test_sharding.py`` requires the layouts to fail)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch.distributed as dist

__all__ = ["PLANTS", "planted"]


def _skipping_matrix_all_reduce(collective):
    """``all_reduce`` that leaves every matrix (ndim >= 2: partial products, Gram matrices, column
    norms) unreduced; scalars and the optimizers' 1-D flags still travel, so the step runs."""

    def wrapped(tensor, *args, **kwargs):
        return None if tensor.ndim >= 2 else collective(tensor, *args, **kwargs)

    return wrapped


def _rotating(collective):
    """``collective`` (all_gather / gather) whose received list lands one rank over: every
    gathered block at the wrong shard offset."""

    def wrapped(*args, **kwargs):
        result = collective(*args, **kwargs)
        for parts in args:
            if isinstance(parts, list) and len(parts) > 1:
                parts[:] = parts[1:] + parts[:1]
        return result

    return wrapped


def _rotating_sent(collective):
    """``collective`` (scatter) whose blocks to send are rotated one rank over first: every rank
    receives its neighbour's block."""

    def wrapped(*args, **kwargs):
        for parts in args:
            if isinstance(parts, list) and len(parts) > 1:
                parts[:] = parts[1:] + parts[:1]
        return collective(*args, **kwargs)

    return wrapped


def _first_rank_only(collective):
    """``broadcast`` whose result reaches global rank 0 only: the other receiving ranks keep a
    zero buffer (as if they were on another group), so their copies diverge while rank 0's
    stays right."""

    def wrapped(tensor, *, group, group_src):  # as ``ortho_fast.distributed.comm.broadcast`` calls it
        result = collective(tensor, group=group, group_src=group_src)
        if dist.get_rank() not in (0, dist.get_global_rank(group, group_src)):
            tensor.zero_()
        return result

    return wrapped


#: name -> (what it breaks, {torch.distributed attribute: replacement factory}).
PLANTS = {
    "no_all_reduce": ("every all-reduce of a matrix skipped (partial sums left local)",
                      {"all_reduce": _skipping_matrix_all_reduce}),
    "rotated_blocks": ("every gathered block placed one rank over (a wrong shard offset)",
                       {"all_gather": _rotating, "gather": _rotating}),
    "rotated_scatter": ("every scattered block sent one rank over (the way back to the shards)",
                        {"scatter": _rotating_sent}),
    "broadcast_to_rank_0": ("every broadcast reaches global rank 0 only (the other copies diverge unseen by "
                            "rank 0's comparison)", {"broadcast": _first_rank_only}),
}


@contextlib.contextmanager
def planted(name: str | None) -> Iterator[None]:
    """Within the block, replace the torch.distributed collectives that ``PLANTS[name]`` names."""
    if name is None:
        yield
        return
    saved = {attr: getattr(dist, attr) for attr in PLANTS[name][1]}
    try:
        for attr, make in PLANTS[name][1].items():
            setattr(dist, attr, make(saved[attr]))
        yield
    finally:
        for attr, original in saved.items():
            setattr(dist, attr, original)
