"""The CPU proxy of a GPU step's kernel launches and memory: ``CountOps``, a ``TorchDispatchMode``
counting compute (non-view) aten operations as the CUDA kernel launches they would make
(``cuda_launches``: one per operation, except a ``_foreach`` operation off torch's fast path, one
per tensor), the bytes their allocating calls return, and the peak of the bytes those allocations
keep alive. One counter for ``benchmarks/proxies.py`` (prints the counts) and
``tests/ortho_fast/test_op_counts.py`` / ``tests/ortho_fast/test_step_memory.py`` (bound them); it
needs torch only.
"""

from __future__ import annotations

import math
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CountOps", "cuda_launches", "foreach_fast_route", "launches_and_route"]

#: ``_foreach`` operations whose CUDA fast path refuses integer and bool inputs even where the lists
#: agree (the result would be floating: torch's ``does_op_promote_integer_inputs_to_float``, and the
#: floating-only unary operations' ``has_integral_tensor`` check). Floating inputs are unaffected.
PROMOTES_INTEGERS = frozenset(
    "div addcdiv sqrt exp expm1 log log10 log1p log2 sin cos tan asin acos atan sinh cosh tanh erf erfc "
    "lgamma sigmoid reciprocal norm powsum".split())
#: Launches of the fast path of ``_foreach_norm`` / ``_foreach_powsum`` (ord 1, 2, inf): the zeroed
#: per-chunk buffer, the ``multi_tensor_apply`` reduction and the ``lpnorm_cleanup`` kernel.
NORM_FAST_LAUNCHES = 3


def _dense(t: torch.Tensor) -> bool:
    """``Tensor::is_non_overlapping_and_dense``: the strides of the dims of size > 1, in increasing
    order, are those of a contiguous tensor of those dims in that order."""
    expected = 1
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride()) if s != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _same_strides(a: torch.Tensor, b: torch.Tensor) -> bool:
    """torch's ``_check_tensors_share_sizes_and_strides`` for one pair: equal sizes, and equal
    strides on every dim of size > 1."""
    return a.shape == b.shape and all(s == 1 or x == y for s, x, y in zip(a.shape, a.stride(), b.stride()))


def foreach_fast_route(lists, scalars=(), *, promotes_integers: bool = False, per_list_dtype: bool = False) -> bool:
    """Whether torch's CUDA ``_foreach`` kernels take the fast (``multi_tensor_apply``) path for
    these tensor lists: ``check_fast_path_restrictions`` of aten/src/ATen/native/ForeachUtils.h.

    Every tensor of every list strided, non-overlapping and dense, on the device of ``lists[0][0]``
    and of its dtype (``per_list_dtype``: each list of one dtype of its own, the rule of
    ``_foreach_copy_``, whose kernel casts); the i-th tensors of all lists of equal sizes and
    strides; no tensor of ``lists[0]`` promoted by its scalar (``scalars``: none, one for all, or
    one per tensor; a complex scalar list is never fast), nor integral where
    ``promotes_integers``. ``lists``: sequences of tensors, the first non-empty. Not modelled:
    ROCm (always slow) and the split of one fast call into several launches when a call holds more
    tensors or 64 Ki-entry chunks than one launch's arguments carry (``depth_to_max_tensors`` /
    ``depth_to_max_blocks`` of MultiTensorApply.cuh: 110 / 320 and more; far above a 48-matrix
    step at small d)."""
    first = lists[0][0]
    for tensors in lists:
        dtype = tensors[0].dtype if per_list_dtype else first.dtype
        for t in tensors:
            if t.dtype != dtype or t.device != first.device or t.layout != torch.strided or not _dense(t):
                return False
    if not all(_same_strides(a, b) for tensors in lists[1:] for a, b in zip(lists[0], tensors)):
        return False
    for i, t in enumerate(lists[0]):
        if promotes_integers and not (t.is_floating_point() or t.is_complex()):
            return False
        if scalars:
            scalar = scalars[0] if len(scalars) == 1 else scalars[i]
            if len(scalars) > 1 and isinstance(scalar, complex):
                return False
            if torch.result_type(t, scalar) != t.dtype:
                return False
    return True


def cuda_launches(func, args, kwargs) -> int:
    """The CUDA kernel launches of one aten operation ``func(*args, **kwargs)``: the first of
    ``launches_and_route``."""
    return launches_and_route(func, args, kwargs)[0]


def launches_and_route(func, args, kwargs) -> tuple[int, bool]:
    """The CUDA kernel launches of one aten operation ``func(*args, **kwargs)`` as this counter
    models them: 1 for an operation that is not ``_foreach``; for a ``_foreach`` operation, 1 on
    torch's fast path (``foreach_fast_route``; ``_foreach_norm`` / ``_foreach_powsum``:
    ``NORM_FAST_LAUNCHES``) and one per tensor of its first list on the slow path, which loops over
    the tensors with the single-tensor operation. The rules (torch's aten/src/ATen/native/cuda
    Foreach*.cu): ``_foreach_copy_`` checks the device and layout but not the dtype across its two
    lists (each list of one dtype: a cast copy is fast); the scalar-tensor overloads (``.Tensor``)
    are fast only when the 0-dim tensor has the lists' dtype; ``_foreach_norm`` is fast for ord 1,
    2 and inf on floating tensors only. An operation whose tensor lists are empty launches
    nothing. Returns (launches, whether the fast path or a single kernel runs)."""
    schema = func._schema
    name = schema.name.split("::")[-1]
    if not name.startswith("_foreach_"):
        return 1, True
    base = name[len("_foreach_"):].rstrip("_")
    lists, scalars, scalar_tensor, ord_ = [], [], None, 2
    for i, arg in enumerate(schema.arguments):
        if arg.name == "out" or arg.name == "dtype":
            continue
        value = args[i] if i < len(args) else kwargs.get(arg.name, arg.default_value)
        kind = str(arg.type)
        if kind.startswith("List[Tensor]") or kind == "Tensor[]":
            lists.append(list(value))
        elif kind in ("Tensor",):
            scalar_tensor = value
        elif kind in ("number", "Scalar"):
            if arg.name == "ord":
                ord_ = value
            elif value is not None:
                scalars.append(value)
        elif kind.startswith("List[number]") or kind == "Scalar[]":
            scalars.extend(value)
    lists = [t for t in lists if len(t)]
    if not lists:
        return 0, True
    n = len(lists[0])
    if base == "copy":
        fast = foreach_fast_route(lists, per_list_dtype=True)
    elif base in ("norm", "powsum"):
        p = float(ord_)
        floating = all(t.is_floating_point() for t in lists[0])
        fast = floating and p in ((1.0, 2.0, math.inf) if base == "norm" else (1.0, 2.0)) and \
            foreach_fast_route(lists[:1])
        return (NORM_FAST_LAUNCHES if fast else n), fast
    else:
        fast = foreach_fast_route(lists, scalars, promotes_integers=base in PROMOTES_INTEGERS)
        if scalar_tensor is not None:
            fast = fast and scalar_tensor.dtype == lists[0][0].dtype
    return (1 if fast else n), fast


class CountOps(TorchDispatchMode):
    """Counts the CUDA kernel launches of the compute (non-view) aten operations run inside it
    (``ops``, by ``cuda_launches``: a ``_foreach`` operation off torch's fast path counts one per
    tensor), the operations themselves (``aten_ops``: one each, the count before that rule), the
    ``_foreach`` calls off the fast path (``slow_foreach``: (name, launches)), the bytes of the
    tensors the allocating ones return (``allocated``; in-place and ``out=`` operations allocate
    nothing), and the peak of the bytes those tensors keep alive (``peak``).

    Every tensor here is on the CPU, so an operation on a CPU-only tensor of a GPU step (Dion's
    int64 ``step`` counter) counts as a launch it would not be.

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
        self.aten_ops = 0
        self.slow_foreach: list[tuple[str, int]] = []
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
        launches, fast = launches_and_route(func, args, kwargs)
        self.ops += launches
        self.aten_ops += 1
        if not fast:
            self.slow_foreach.append((func._schema.name, launches))
        if not func._schema.is_mutable and "out" not in kwargs:
            for t in out if isinstance(out, (list, tuple)) else (out,):
                if isinstance(t, torch.Tensor):
                    self._track(t)
        return out
