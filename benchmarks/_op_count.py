"""The CPU proxy of a GPU step's kernel launches, bytes moved and memory: ``CountOps``, a
``TorchDispatchMode`` counting compute (non-view) aten operations as the CUDA kernel launches they
would make (``cuda_launches``: one per operation, except a ``_foreach`` operation off torch's fast
path, one per tensor; ``full_launches`` adds the copy of ``self`` inside ``addmm`` / ``baddbmm`` and
the split of a fast ``_foreach`` call into ``multi_tensor_apply`` launches), the bytes every
operation other than a matrix product reads and writes in device memory (``op_bytes``), the bytes
their allocating calls return, and the peak of the bytes those allocations keep alive. One counter
for ``benchmarks/proxies.py`` (prints the counts) and the tests that bound and test them
(tests/ortho_fast/test_op_counts.py, test_launch_rule.py, test_byte_rule.py,
test_dion2_memory.py); it needs torch only. The cost model these feed: docs/performance.md, "Bytes
and the cost model".
"""

from __future__ import annotations

import math
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CountOps", "PRODUCTS", "cuda_launches", "foreach_fast_route", "full_launches", "gemm_self_copy",
           "launches_and_route",
           "multi_tensor_apply_launches", "op_bytes"]

#: ``_foreach`` operations whose CUDA fast path refuses integer and bool inputs even where the lists
#: agree (the result would be floating: torch's ``does_op_promote_integer_inputs_to_float``, and the
#: floating-only unary operations' ``has_integral_tensor`` check). Floating inputs are unaffected.
PROMOTES_INTEGERS = frozenset(
    "div addcdiv sqrt exp expm1 log log10 log1p log2 sin cos tan asin acos atan sinh cosh tanh erf erfc "
    "lgamma sigmoid reciprocal norm powsum".split())
#: Launches of the fast path of ``_foreach_norm`` / ``_foreach_powsum`` (ord 1, 2, inf) when its
#: reduction fits one ``multi_tensor_apply`` launch: the zeroed per-chunk buffer, the reduction and
#: the ``lpnorm_cleanup`` kernel (more reduction launches where ``multi_tensor_apply_launches`` says).
NORM_FAST_LAUNCHES = 3

#: ``multi_tensor_apply``'s split of one fast ``_foreach`` call into kernel launches (torch's
#: aten/src/ATen/native/cuda/MultiTensorApply.cuh, ``kChunkSize`` and ``DepthToMaxConfig``, read
#: at pytorch/pytorch 008356caea068ac05ec39943d334e8ef7b06af40): every tensor is cut into chunks of
#: ``CHUNK_ENTRIES`` entries, one CUDA block each; a launch is made when the blocks reach
#: ``max_blocks`` or, at the end of a tensor, the tensors reach ``max_tensors[depth - 1]`` (depth:
#: the number of tensor lists the kernel is given, the result list of an out-of-place call
#: included; ``max_tensors_scalarlist`` for a call with one scalar per tensor); a block-full launch
#: in the middle of a tensor carries that tensor on to the next launch.
CHUNK_ENTRIES = 65536
#: The 32 KB kernel-argument tables: taken where the CUDA runtime and driver are ≥ 12.1 and the
#: device is sm_70 or newer (``supports_large_kernel_arg``; an H100 / H200 on a current build).
LARGE_KERNEL_ARGS = {"max_tensors": (770, 448, 336, 252, 210), "max_tensors_scalarlist": (672, 448, 336, 252, 210),
                     "max_blocks": 2240}
#: The 4 KB tables, taken otherwise (an older runtime or driver).
SMALL_KERNEL_ARGS = {"max_tensors": (110, 64, 48, 36, 30), "max_tensors_scalarlist": (96, 64, 48, 36, 30),
                     "max_blocks": 320}

#: The matrix products, whose bytes the byte count leaves out (their cost is their FLOPs; what a
#: cuBLAS kernel reads and writes depends on its tiling). The copy of ``self`` that ``addmm`` /
#: ``baddbmm`` make before the product is counted (``gemm_self_copy``).
PRODUCTS = frozenset("mm bmm addmm baddbmm addbmm addmv mv matmul dot vdot _addmm_activation".split())
#: Operations that write their first argument without reading it (``copy_`` reads only its source;
#: ``fill_`` / ``zero_`` and the random fills read nothing).
WRITE_ONLY_SELF = frozenset("copy_ fill_ zero_ _foreach_copy_ _foreach_zero_ normal_ uniform_ random_ "
                            "bernoulli_ exponential_ index_copy_ masked_fill_".split())
#: Operations that write, in their first argument, only the entries their source names (``src`` /
#: ``values`` / ``source``): scatter and index writes. ``_ADD`` ones also read those entries.
PARTIAL_WRITES = frozenset("scatter_ scatter index_put_ index_copy_ scatter_reduce_".split())
PARTIAL_WRITES_ADD = frozenset("scatter_add_ scatter_add index_add_ index_put_accumulate".split())


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
    ROCm (always slow). The split of one fast call into several launches is
    ``multi_tensor_apply_launches``."""
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


def multi_tensor_apply_launches(numels, depth: int, scalar_list: bool = False, tables=None) -> int:
    """The kernel launches of one fast ``_foreach`` call whose first list holds tensors of
    ``numels`` entries, over ``depth`` tensor lists (``scalar_list``: one scalar per tensor), as
    torch's ``multi_tensor_apply`` makes them (``CHUNK_ENTRIES``; ``tables``: ``LARGE_KERNEL_ARGS``,
    the default, or ``SMALL_KERNEL_ARGS``). Empty tensors are skipped; no tensor, no launch.

    Examples: 48 matrices of 2048 × 8192 (256 chunks each) at depth 2 on the large tables:
    12288 blocks, ⌈12288 / 2240⌉ = 6 launches; 120 matrices of 64 × 64 at depth 1 on the small
    tables: ⌈120 / 110⌉ = 2."""
    tables = LARGE_KERNEL_ARGS if tables is None else tables
    max_tensors = tables["max_tensors_scalarlist" if scalar_list else "max_tensors"][depth - 1]
    max_blocks = tables["max_blocks"]
    launches = blocks = tensors = 0
    for numel in numels:
        if numel == 0:
            continue
        tensors += 1
        chunks = -(-numel // CHUNK_ENTRIES)
        # whole runs of blocks-full launches inside this tensor, then its last chunk
        for chunk in range(chunks):
            blocks += 1
            last = chunk == chunks - 1
            if (tensors == max_tensors and last) or blocks == max_blocks:
                launches += 1
                blocks = 0
                tensors = 0 if last else 1
    return launches + (blocks != 0)


def _name(func) -> str:
    return func._schema.name.split("::")[-1]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``Tensor::is_same`` for two tensors seen at dispatch: the same storage bytes as the same view."""
    return a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
                      and a.dtype == b.dtype)


def gemm_self_copy(func, args, kwargs, out) -> int:
    """The bytes of ``self`` that CUDA ``addmm`` / ``baddbmm`` copy into the result before the
    product (one more kernel launch), 0 where no copy runs. torch's ``baddbmm`` meta function
    (aten/src/ATen/native/LinearAlgebra.cpp, ``common_checks_baddbmm_bmm``) copies ``self`` into
    the result when β ≠ 0 (a copy onto itself, ``baddbmm_``, does nothing); CUDA ``addmm``
    (aten/src/ATen/native/cuda/Blas.cpp, ``addmm_out_cuda_impl``) does when β ≠ 0 and the result
    is not ``self``, except on its cuBLASLt path (β = 1 and ``self`` a contiguous bias vector of
    ``mat2``'s columns, ``isInputCompliesAddmmCudaLt``), which adds the bias in the epilogue.
    Returns the bytes the copy writes (it reads ``self``'s distinct entries: ``op_bytes``)."""
    name = _name(func)
    if name not in ("addmm", "baddbmm"):  # the in-place forms write onto self: no copy
        return 0
    schema = func._schema
    values = {a.name: (args[i] if i < len(args) else kwargs.get(a.name, a.default_value))
              for i, a in enumerate(schema.arguments)}
    beta, self = values.get("beta", 1), values["self"]
    result = values.get("out") if values.get("out") is not None else out
    if beta == 0 or not isinstance(result, torch.Tensor) or _same(result, self):
        return 0
    if name == "addmm":
        mat2 = values["mat2"]
        lt = (beta == 1 and self.dim() == 1 and self.shape[0] == mat2.shape[1] and self.is_contiguous()
              and result.dim() == 2 and result.is_contiguous() and self.dtype in FLOATS_LT
              and min(values["mat1"].shape) > 1 and min(mat2.shape) > 1)
        if lt:
            return 0
    return result.numel() * result.element_size()


#: Dtypes of CUDA ``addmm``'s cuBLASLt bias path.
FLOATS_LT = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def _distinct_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct entries a tensor view reaches (a broadcast dim, stride 0, counts once)."""
    entries = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            entries *= size
    return entries * t.element_size()


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for t in value if isinstance(t, torch.Tensor)]
    return []


def op_bytes(func, args, kwargs, out) -> tuple[int, int]:
    """(bytes read, bytes written) in device memory by one aten operation ``func(*args, **kwargs)``
    returning ``out``, as this counter models a CUDA kernel: every tensor argument is read once
    (its distinct entries: a broadcast operand counts once) and every result written once; an
    argument written in place (``self`` of ``add_``, ``_foreach_lerp_``'s list) is read and written,
    an ``out=`` argument written only; the exceptions: ``WRITE_ONLY_SELF`` (``copy_``, ``fill_``,
    ...) do not read their first argument; scatter and index writes (``PARTIAL_WRITES``) write, and
    ``PARTIAL_WRITES_ADD`` read and write, only as many entries of ``self`` as their source holds;
    ``gather`` / ``index_select`` read as many entries of their input as they return; ``empty*``
    factories move nothing, ``*_like`` factories do not read their model. Matrix products
    (``PRODUCTS``) count only the copy of ``self`` inside ``addmm`` / ``baddbmm``
    (``gemm_self_copy``: its reads and writes). A kernel's reads through caches are not modelled:
    every operand is one pass over device memory, the floor for a kernel that does not fuse."""
    name = _name(func)
    base = name.rstrip("_") if not name.startswith("_foreach_") else name
    if base in PRODUCTS:
        copied = gemm_self_copy(func, args, kwargs, out)
        if not copied:
            return 0, 0
        return _distinct_bytes(args[0]), copied
    if name in ("empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted"):
        return 0, 0
    schema = func._schema
    read = written = 0
    partial = name in PARTIAL_WRITES or name in PARTIAL_WRITES_ADD or name.startswith("index_put")
    source_bytes = 0
    if partial:
        for key in ("src", "values", "source"):
            for i, a in enumerate(schema.arguments):
                if a.name == key:
                    v = args[i] if i < len(args) else kwargs.get(key)
                    if isinstance(v, torch.Tensor):
                        source_bytes = v.numel() * args[0].element_size()
                    elif v is not None:  # scatter_.value: one entry per index
                        index = args[2] if len(args) > 2 else kwargs.get("index")
                        source_bytes = index.numel() * args[0].element_size()
    no_read_self = name in WRITE_ONLY_SELF or name.endswith("_like") or name.startswith("new_")
    for i, a in enumerate(schema.arguments):
        value = args[i] if i < len(args) else kwargs.get(a.name)
        ts = _tensors(value)
        if not ts:
            continue
        is_write = a.alias_info is not None and a.alias_info.is_write
        if is_write and a.kwarg_only:  # out=
            written += sum(_distinct_bytes(t) for t in ts)
            continue
        if i == 0 and partial:
            written += source_bytes
            accumulate = name.startswith("index_put") and (args[3] if len(args) > 3 else kwargs.get("accumulate"))
            read += source_bytes if (name in PARTIAL_WRITES_ADD or accumulate) else 0
            continue
        if i == 0 and no_read_self:
            if is_write:
                written += sum(_distinct_bytes(t) for t in ts)
            continue
        if i == 0 and name in ("gather", "index_select", "take"):
            read += sum(t.numel() * t.element_size() for t in _tensors(out))
            continue
        read += sum(_distinct_bytes(t) for t in ts)
        if is_write:
            written += sum(_distinct_bytes(t) for t in ts)
    if not schema.is_mutable and "out" not in kwargs:
        written += sum(_distinct_bytes(t) for t in _tensors(out))
    return read, written


def full_launches(func, args, kwargs, out, tables=None) -> int:
    """The CUDA kernel launches of one aten operation with the splits and copies ``cuda_launches``
    leaves out: a fast ``_foreach`` call is ``multi_tensor_apply_launches`` launches
    (``_foreach_norm`` / ``_foreach_powsum``: those plus the zeroed buffer and the cleanup kernel),
    and ``addmm`` / ``baddbmm`` one more where they copy ``self`` (``gemm_self_copy``)."""
    launches, fast = launches_and_route(func, args, kwargs)
    name = _name(func)
    if not name.startswith("_foreach_"):
        return launches + (1 if name.rstrip("_") in ("addmm", "baddbmm") and gemm_self_copy(func, args, kwargs, out)
                           else 0)
    if not fast or launches == 0:
        return launches
    lists, scalar_list = [], False
    for i, a in enumerate(func._schema.arguments):
        value = args[i] if i < len(args) else kwargs.get(a.name)
        kind = str(a.type)
        if kind.startswith("List[Tensor]") or kind == "Tensor[]":
            if a.name != "out" and value is not None and len(value):
                lists.append(value)
        elif kind.startswith("List[number]") or kind == "Scalar[]":
            scalar_list = True
    numels = [t.numel() for t in lists[0]]
    base = name[len("_foreach_"):].rstrip("_")
    if base in ("norm", "powsum"):
        return NORM_FAST_LAUNCHES - 1 + multi_tensor_apply_launches(numels, 1, False, tables)
    depth = len(lists) + (0 if func._schema.is_mutable else 1)
    return multi_tensor_apply_launches(numels, min(depth, 5), scalar_list, tables)


def _product_shell(func, args, kwargs):
    """The result of a matrix product without its arithmetic: an ``out=`` / in-place call returns
    the tensor it would write, unchanged; a functional one zeros of the shape, dtype and strides
    torch's meta kernel gives."""
    schema = func._schema
    if schema.is_mutable:
        written = [args[i] if i < len(args) else kwargs[a.name] for i, a in enumerate(schema.arguments)
                   if a.alias_info is not None and a.alias_info.is_write]
        return written[0]
    def to_meta(v):
        return v.to("meta") if isinstance(v, torch.Tensor) else v
    shape = func(*[to_meta(a) for a in args], **{k: to_meta(v) for k, v in kwargs.items()})
    return torch.empty_strided(shape.shape, shape.stride(), dtype=shape.dtype, device=args[0].device).zero_()


class CountOps(TorchDispatchMode):
    """Counts the CUDA kernel launches of the compute (non-view) aten operations run inside it
    (``ops``, by ``cuda_launches``: a ``_foreach`` operation off torch's fast path counts one per
    tensor), the operations themselves (``aten_ops``: one each, the count before that rule), the
    ``_foreach`` calls off the fast path (``slow_foreach``: (name, launches)), the bytes of the
    tensors the allocating ones return (``allocated``; in-place and ``out=`` operations allocate
    nothing), and the peak of the bytes those tensors keep alive (``peak``).

    ``launches`` adds what ``ops`` leaves out (``full_launches``): the copy of ``self`` inside
    ``addmm`` / ``baddbmm`` (``gemm_copies`` of them) and the split of a fast ``_foreach`` call
    into ``multi_tensor_apply`` launches (``tables``: ``LARGE_KERNEL_ARGS`` by default, an H100 /
    H200 on CUDA ≥ 12.1; ``SMALL_KERNEL_ARGS`` otherwise). ``bytes_read`` / ``bytes_written``: the
    device-memory traffic of every operation but the matrix products (``op_bytes``), and
    ``bytes_by_op``: name -> bytes read and written, summed. ``skip_products``: the matrix products
    are not computed (their results are zeros of the right shape, dtype and strides, written
    nowhere for an ``out=`` or in-place call): every count above is the same, the values are not
    (for the byte and launch counts of a large model on the CPU, ``benchmarks/proxies.py --no-time``).

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

    def __init__(self, tables=None, skip_products: bool = False) -> None:
        super().__init__()
        self.tables = LARGE_KERNEL_ARGS if tables is None else tables
        self.skip_products = skip_products
        self.ops = 0
        self.aten_ops = 0
        self.launches = 0
        self.gemm_copies = 0
        self.bytes_read = 0
        self.bytes_written = 0
        self.bytes_by_op: dict[str, int] = {}
        self.slow_foreach: list[tuple[str, int]] = []
        self.allocated = 0
        self.live = 0
        self.peak = 0

    @property
    def bytes(self) -> int:
        """Bytes read plus bytes written."""
        return self.bytes_read + self.bytes_written

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
        # what an operation reads is its inputs before it runs (an in-place one changes nothing
        # of their sizes; an out= one may resize its output, counted after)
        if self.skip_products and _name(func).rstrip("_") in PRODUCTS:
            out = _product_shell(func, args, kwargs)
        else:
            out = func(*args, **kwargs)
        if func.is_view or func is torch.ops.aten.detach.default:
            return out
        launches, fast = launches_and_route(func, args, kwargs)
        self.ops += launches
        self.aten_ops += 1
        full = full_launches(func, args, kwargs, out, self.tables)
        self.launches += full
        name = _name(func)
        if name in ("addmm", "baddbmm") and gemm_self_copy(func, args, kwargs, out):
            self.gemm_copies += 1
        read, written = op_bytes(func, args, kwargs, out)
        self.bytes_read += read
        self.bytes_written += written
        if read or written:
            self.bytes_by_op[name] = self.bytes_by_op.get(name, 0) + read + written
        if not fast:
            self.slow_foreach.append((func._schema.name, launches))
        if not func._schema.is_mutable and "out" not in kwargs:
            for t in out if isinstance(out, (list, tuple)) else (out,):
                if isinstance(t, torch.Tensor):
                    self._track(t)
        return out
