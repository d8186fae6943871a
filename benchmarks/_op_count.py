"""The CPU proxy of a GPU step's kernel launches and memory: ``CountOps``, a ``TorchDispatchMode``
counting compute (non-view) aten operations, the bytes their allocating calls return, and the peak
of the bytes those allocations keep alive. One counter for ``benchmarks/proxies.py`` (prints the
counts) and ``tests/ortho_fast/test_op_counts.py`` / ``tests/ortho_fast/test_step_memory.py``
(bound them); it needs torch only.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CountOps"]


class CountOps(TorchDispatchMode):
    """Counts the compute (non-view) aten operations run inside it (``ops``), the bytes of the
    tensors the allocating ones return (``allocated``; in-place and ``out=`` operations allocate
    nothing), and the peak of the bytes those tensors keep alive (``peak``).

    ``peak`` is the CPU analogue of ``torch.cuda.max_memory_allocated()`` minus the memory
    allocated before the block (benchmarks/gpu.py's "peak extra memory"): every storage an
    allocating operation creates (factories such as ``empty`` / ``zeros_like`` included: the
    optimizer state and workspace created at a first step) counts from its creation until its
    last tensor or view dies (``weakref.finalize`` on the storage, so views count once);
    memory freed inside the block that was allocated before it is not subtracted. Temporaries
    inside one kernel (a CPU cast through a scratch copy) are not seen; on the GPU they do not
    exist. The CUDA caching allocator's rounding (512 B blocks) is not modelled.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.allocated = 0
        self.live = 0
        self.peak = 0

    def _release(self, nbytes: int) -> None:
        self.live -= nbytes

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        self.allocated += t.numel() * t.element_size()
        if nbytes:
            weakref.finalize(storage, self._release, nbytes)
            self.live += nbytes
            self.peak = max(self.peak, self.live)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view or func is torch.ops.aten.detach.default:
            return out
        self.ops += 1
        if not func._schema.is_mutable and "out" not in kwargs:
            for t in out if isinstance(out, (list, tuple)) else (out,):
                if isinstance(t, torch.Tensor):
                    self._track(t)
        return out
