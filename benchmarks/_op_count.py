"""The CPU proxy of a GPU step's kernel launches and allocations: ``CountOps``, a ``TorchDispatchMode``
counting compute (non-view) aten operations and the bytes their allocating calls return. One counter
for ``benchmarks/proxies.py`` (prints the counts) and ``tests/ortho_fast/test_op_counts.py`` (bounds
them); it needs torch only.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CountOps"]


class CountOps(TorchDispatchMode):
    """Counts the compute (non-view) aten operations run inside it, and the bytes of the tensors
    the allocating ones return (in-place and ``out=`` operations allocate nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.allocated = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view or func is torch.ops.aten.detach.default:
            return out
        self.ops += 1
        if not func._schema.is_mutable and "out" not in kwargs:
            for t in out if isinstance(out, (list, tuple)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.allocated += t.numel() * t.element_size()
        return out
