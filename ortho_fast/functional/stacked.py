"""The stacked Muon step's kernels: same-shape matrices in one (k, m, n) stack, reused workspaces.

The fast default Muon step (``ortho_fast.groups.muon``, bfloat16 / float16 Newton–Schulz, not
``bitwise_torch``) runs per chunk of same-shape matrices a fixed number of operations, however
many matrices the chunk holds: the Nesterov momentum written into one stack (computed in the
workspace's spare bytes, as many matrices at a time as fit, and cast: ``momentum_rounds``; one
write per matrix where that does not pay), the overflow-safe power-of-two scale, one Frobenius normalization, five steps
of three batched products, the update as one ``_foreach_add_`` (of a result cast in a free stack: a few
launches, ``add_update_``; with Muon+ / NorMuon, Ô = O·f formed in rounds in free bytes,
``product_rounds``). The stacks and the products' outputs live
in a ``Workspace`` kept by the optimizer: allocated at the first step, reused by every chunk of
every later step (no allocation in the step, the same addresses at every step: what a CUDA graph
replays). A chunk's workspace stays within ``workspace_budget``: the peak extra memory of a step
within ``MEMORY_RATIO`` × torch.optim.Muon's.
Source: modded-nanogpt / nanochat parameter banks (batched Newton–Schulz); torch.optim's
``_multi_tensor_*`` steps (``_foreach`` ops); torch.optim.Muon (the memory it is measured
against); docs/performance.md, "The stacked step and the GPU proxies".
"""

from __future__ import annotations

import math

import torch

from .graph_scalars import foreach_add_scaled_, is_device_scalar

#: Most matrix entries one stack (one chunk) holds: 2^25 (128 MiB of float32 U where that stack is kept, 64 MiB per
#: bfloat16 stack). Larger shape groups are cut into chunks of whole matrices (a chunk holds at
#: least one); the memory budget (``workspace_budget``) usually cuts them smaller.
MAX_STACK_ELEMENTS = 1 << 25

#: The memory goal of the stacked step: its peak extra memory (state created at the first step,
#: workspace, temporaries) at most this many times torch.optim.Muon's (its momentum buffers plus
#: the temporaries of one matrix). ``workspace_budget`` derives the chunk budget from it.
MEMORY_RATIO = 1.1

#: The smallest workspace budget in bytes (32 MiB): below it the launches, not the memory, are
#: what a step costs (a d = 128 × 12 GPT's whole state is 9 MiB), so every shape group of a small
#: model stays one chunk (tests/ortho_fast/test_op_counts.py). It binds below about d = 600 for
#: 12 GPT blocks; d = 768 × 12 and larger follow ``MEMORY_RATIO``.
MIN_WORKSPACE_BYTES = 32 << 20

#: The fewest tensors a round of ``momentum_rounds`` holds: its three launches then beat one per tensor.
MIN_MOMENTUM_ROUND = 4

#: What one kernel launch weighs in bytes of device traffic in the cost model of docs/performance.md
#: ("Bytes and the cost model": τ·W, 4.5 µs of host time per eager operation at an H100's 3.35 TB/s).
#: A round that saves launches by passing through workspace bytes is taken where the launches it
#: saves times this exceed the bytes it adds (``rounds_pay``).
LAUNCH_BYTES = 15 << 20


def rounds_pay(launches_saved: int, extra_bytes: int) -> bool:
    """Whether rounds that save ``launches_saved`` launches and move ``extra_bytes`` more bytes than
    one operation per tensor pay in the cost model (``LAUNCH_BYTES`` per launch)."""
    return launches_saved > 0 and launches_saved * LAUNCH_BYTES >= extra_bytes

#: Byte alignment of every workspace buffer (the CUDA caching allocator's block size).
ALIGN = 512


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def chunk_nbytes(k: int, m: int, n: int, momentum_dtype: torch.dtype | None, compute_dtype: torch.dtype) -> int:
    """Bytes of workspace one chunk of k (m, n) matrices takes: the momentum stack in
    ``momentum_dtype`` (None: none), two ``compute_dtype`` stacks (the Gram matrix is written
    into the second while the polynomial is formed) and the (k, s, s) polynomial, s = min(m, n);
    each buffer placed at a multiple of ``ALIGN`` bytes, in the order ``Workspace.get`` gives
    them out (the momentum stack first: the stack the iteration starts in when it has the compute
    dtype)."""
    s = min(m, n)
    size = compute_dtype.itemsize
    parts = [k * m * n * (size if momentum_dtype is None else momentum_dtype.itemsize)]
    if momentum_dtype is not None:
        parts.append(k * m * n * size)
    parts += [k * m * n * size, k * s * s * size]
    return sum(_aligned(part) for part in parts[:-1]) + parts[-1]


def torch_temporaries_nbytes(m: int, n: int, dtype: torch.dtype) -> int:
    """Peak bytes torch.optim.Muon's step allocates for one (m, n) matrix of ``dtype`` beyond its
    momentum buffer: the Nesterov matrix U (``dtype``), the bfloat16 iterate and its successor,
    and the (s, s) Gram matrix and polynomial, s = min(m, n) (``torch.optim._muon``:
    ``grad.lerp``, ``_zeropower_via_newtonschulz``'s ``bfloat16()`` and ``addmm`` calls)."""
    s = min(m, n)
    return m * n * (dtype.itemsize + 4) + 4 * s * s


def workspace_budget(state_nbytes: int, largest_temporaries: int, extra_state_nbytes: int = 0) -> int:
    """The bytes one chunk's workspace may take, from the memory goal ``MEMORY_RATIO``.

    torch.optim.Muon's first step peaks at S + T₁: its momentum (S bytes, created then) and the
    temporaries of its largest matrix (T₁, ``torch_temporaries_nbytes``). Ours peaks at
    S + X + W + t: the same momentum, the extra state X (NorMuon's second moments), the
    workspace W (created then, kept) and small temporaries t (per-matrix scales and norms).
    S + X + W + t ≤ r·(S + T₁) holds with W ≤ (r − 1)·S + T₁ − X when t ≤ (r − 1)·T₁: that is
    the budget, never below ``MIN_WORKSPACE_BYTES``. A later step holds S + X + W before it
    starts, so its extra is t only.
    """
    budget = (MEMORY_RATIO - 1) * state_nbytes + largest_temporaries - extra_state_nbytes
    return max(MIN_WORKSPACE_BYTES, int(budget))


class Workspace:
    """Buffers reused across steps, carved from one byte pool per device: ``get(name, shape,
    dtype, device)`` returns a view of the pool placed after the buffers already given out in
    the current frame; a name requested again starts a new frame from the pool's start (chunks
    run one after the other, each consumed before the next starts), so the pool holds one chunk's
    buffers and every chunk of every step gets the same addresses (what a CUDA graph replays).

    ``reserve(nbytes, device)`` sizes the pool before a step (the stacked step reserves its
    largest chunk, ``chunk_nbytes``); a request beyond the pool grows it (the buffers given out
    earlier in the frame stay valid in the old pool while their views live). ``nbytes`` is the
    memory held between steps. Under ``torch.compile`` every request is a fresh ``torch.empty``
    (inductor plans the graph's memory itself). Not part of an optimizer's ``state_dict``; a
    copied optimizer starts without buffers.
    """

    def __init__(self) -> None:
        self._pool: dict[torch.device, torch.Tensor] = {}
        self._frame: dict[torch.device, tuple[set, int]] = {}
        self.generation = 0  # counts the pools made: views of the pools stay valid while it is unchanged

    def reserve(self, nbytes: int, device: torch.device) -> None:
        """Grow the pool of ``device`` to at least ``nbytes`` (the smaller one released first)."""
        device = torch.device(device)
        pool = self._pool.get(device)
        if pool is None or pool.numel() < nbytes:
            self._pool.pop(device, None)
            self._frame.pop(device, None)
            self._pool[device] = torch.empty(nbytes, dtype=torch.uint8, device=device)
            self.generation += 1

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return torch.empty(shape, dtype=dtype, device=device)
        device = torch.device(device)
        names, offset = self._frame.get(device, (frozenset(), 0))
        if name in names:  # the previous chunk is done: this one starts from the pool's start
            names, offset = frozenset(), 0
        end = offset + math.prod(shape) * dtype.itemsize
        if device not in self._pool or self._pool[device].numel() < end:
            self._pool.pop(device, None)
            self._pool[device] = torch.empty(end, dtype=torch.uint8, device=device)
            self.generation += 1
        self._frame[device] = (names | {name}, _aligned(end))
        return self._pool[device][offset:end].view(dtype).view(shape)

    def spare(self, device: torch.device) -> torch.Tensor | None:
        """The pool's bytes after the buffers given out in the current frame (flat uint8; None
        under ``torch.compile`` or without a pool): free until the frame's next request, which
        may place its buffer there. The frame is unchanged (a ``get`` after it places its buffer
        where it would have without it)."""
        device = torch.device(device)
        if torch.compiler.is_compiling() or device not in self._pool:
            return None
        return self._pool[device][self._frame.get(device, (frozenset(), 0))[1]:]

    @property
    def nbytes(self) -> int:
        """Bytes held between steps."""
        return sum(t.numel() for t in self._pool.values())

    def data_ptrs(self) -> list[int]:
        """The addresses of the pools (the same at every step once reserved)."""
        return sorted(t.data_ptr() for t in self._pool.values())

    def clear(self) -> None:
        self._pool.clear()
        self._frame.clear()
        self.generation += 1

    def __getstate__(self) -> dict:  # a copied optimizer allocates its own buffers
        return {"_pool": {}, "_frame": {}, "generation": self.generation + 1}


def _as_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The bytes of contiguous ``t`` as a flat tensor of ``dtype`` (its whole entries)."""
    raw = t.reshape(-1).view(torch.uint8)
    return raw[:raw.numel() // dtype.itemsize * dtype.itemsize].view(dtype)


def update_rounds(free: torch.Tensor, stack: torch.Tensor, sizes: list[int], dtype: torch.dtype
                  ) -> list[tuple[int, int, list[torch.Tensor]]] | None:
    """How ``add_update_`` casts a (k, m, n) result ``stack`` to ``dtype`` without new memory: in
    rounds (lo, hi, views), each the matrices lo..hi-1 cast into ``views`` (flat ``dtype`` views,
    ``sizes[i]`` entries each) packed into the free stack ``free`` and, from the second round, into
    the bytes of the result's matrices already added (a prefix of ``stack``). None when ``free``
    shares bytes with ``stack`` or when the rounds (two launches each) would not beat one launch
    per matrix, or not pay for the bytes they add (``rounds_pay``: 2 per entry and parameter byte).
    ``sizes``: entries of each matrix, in the stack's order."""
    lo_f, hi_f = free.data_ptr(), free.data_ptr() + free.numel() * free.element_size()
    lo_s, hi_s = stack.data_ptr(), stack.data_ptr() + stack.numel() * stack.element_size()
    if not (hi_f <= lo_s or hi_s <= lo_f) or not (free.is_contiguous() and stack.is_contiguous()):
        return None
    free_flat, stack_bytes, rounds, done = _as_dtype(free, dtype), stack.reshape(-1).view(torch.uint8), [], 0
    while done < len(sizes) and 2 * (len(rounds) + 1) < len(sizes):
        regions = [free_flat, _as_dtype(stack_bytes[:sum(sizes[:done]) * stack.element_size()], dtype)]
        views, hi = [], done
        for region in regions:
            used = 0
            while hi < len(sizes) and used + sizes[hi] <= region.numel():
                views.append(region[used:used + sizes[hi]])
                used, hi = used + sizes[hi], hi + 1
        if hi == done:
            return None
        rounds.append((done, hi, views))
        done = hi
    if done != len(sizes):
        return None
    # the cast copy and a same-dtype add move 2 bytes more per entry and parameter byte than one mixed
    # add per matrix (read the result, read and write the parameter)
    return rounds if rounds_pay(len(sizes) - 2 * len(rounds), 2 * dtype.itemsize * sum(sizes)) else None


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes [start, end) a strided tensor reaches (its strides are not negative)."""
    start = t.data_ptr()
    if t.is_contiguous():
        return start, start + t.nbytes
    if t.numel() == 0:
        return start, start
    return start, start + (1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))) * t.element_size()


def momentum_rounds(free: torch.Tensor, grads: list[torch.Tensor],
                    keep: list[torch.Tensor]) -> list[tuple[int, int, list[torch.Tensor]]] | None:
    """How ``functional.muon.momentum_into`` computes U of k tensors in the dtype of ``grads``
    before its one rounding into a narrower stack, in scratch packed into the free workspace bytes
    ``free`` (flat uint8, ``Workspace.spare``) without new memory: rounds (lo, hi, views), each
    the tensors lo..hi-1 computed in ``views`` (of the gradients' shapes and dtype, packed one
    after the other from the start of ``free``, which every round reuses: a round's results are
    written out before the next starts). A round costs three launches (the copy of G, the
    ``lerp_`` / ``add_``, the cast), so only rounds of at least ``MIN_MOMENTUM_ROUND`` tensors are
    kept, and only where the launches they save pay for the bytes they add (``rounds_pay``: 4 bytes
    per entry and gradient byte, the copy of G and the cast): they cover the tensors before the last
    ``hi``, the others keep one launch each. None
    when there is no such round or when ``free`` shares bytes with a tensor of ``keep`` (the
    gradients, the buffers and the destination). Host work: a few calls per tensor (the step at
    small d is bound by the host's launches, not by the device)."""
    lo_f, hi_f = _span(free)
    if not free.is_contiguous() or any(not (hi <= lo_f or hi_f <= lo) for lo, hi in map(_span, keep)):
        return None
    flat, shape = _as_dtype(free, grads[0].dtype), grads[0].shape
    sizes = None if all(g.shape == shape for g in grads) else [g.numel() for g in grads]
    per = max(1, math.prod(shape))
    rounds, lo = [], 0
    while lo < len(grads):
        if sizes is None:  # one shape: as many as fit, one view of the block unbound
            hi = min(len(grads), lo + flat.numel() // per)
            views = list(flat[:(hi - lo) * per].view(hi - lo, *shape).unbind(0))
        else:
            hi, used = lo, 0
            while hi < len(grads) and used + sizes[hi] <= flat.numel():
                used, hi = used + sizes[hi], hi + 1
            views = [v.view(g.shape) for v, g in zip(flat[:used].split(sizes[lo:hi]), grads[lo:hi])]
        # the copy of G into the scratch and its cast move 4 bytes more per entry and gradient byte than
        # one ``lerp(..., out=)`` per tensor (read G, read M, write U)
        entries = (hi - lo) * per if sizes is None else sum(sizes[lo:hi])
        if hi - lo < MIN_MOMENTUM_ROUND or not rounds_pay(hi - lo - 3, 4 * grads[0].element_size() * entries):
            break
        rounds.append((lo, hi, views))
        lo = hi
    return rounds or None


def product_rounds(free, stack: torch.Tensor, counts: list[int], dtype: torch.dtype
                   ) -> list[tuple[int, int, list[tuple[int, int, torch.Tensor]]]] | None:
    """How ``muon_stages.add_scaled_product_`` forms Ô = O·f of a (k, m, n) result ``stack`` in
    ``dtype`` without new memory: rounds (lo, hi, parts) over the stack's members (``counts[i]``
    consecutive matrices each), each the members lo..hi-1 as parts (a, b, out): the matrices
    a..b-1 (whole members) written into ``out``, a contiguous (b − a, m, n) ``dtype`` view of one
    free region. The regions: the buffers of ``free`` (contiguous, each disjoint from ``stack`` and
    from the others: the workspace's stack not holding the result, ``Workspace.spare``; a buffer
    sharing bytes with ``stack`` is left out), which every round reuses (a round's products are
    added before the next starts), and from the second round the bytes of the stack's matrices
    already added (a prefix of ``stack``). A round costs one launch per part and one
    ``_foreach_add_``: None when the rounds would not beat one launch per member (the per-tensor
    ``_foreach_addcmul_``) or not pay for the bytes they add (``rounds_pay``: Ô written and read, 2
    per entry and parameter byte), or when a member fits in no region. Host work only."""
    m, n = stack.shape[-2:]
    per, size = m * n, dtype.itemsize
    lo_s, hi_s = _span(stack)
    if not stack.is_contiguous() or per == 0:
        return None
    fixed = [_as_dtype(f, dtype) for f in free if f is not None and f.is_contiguous() and f.data_ptr() % size == 0
             and (_span(f)[1] <= lo_s or hi_s <= _span(f)[0])]
    starts = [0]
    for c in counts:
        starts.append(starts[-1] + c)
    stack_bytes = stack.reshape(-1).view(torch.uint8)
    rounds, lo, launches = [], 0, 0
    while lo < len(counts):
        prefix = ([_as_dtype(stack_bytes[:starts[lo] * per * stack.element_size()], dtype)]
                  if lo and lo_s % size == 0 else [])
        parts, hi = [], lo
        for region in fixed + prefix:
            j = hi
            while j < len(counts) and (starts[j + 1] - starts[hi]) * per <= region.numel():
                j += 1
            if j > hi:
                parts.append((starts[hi], starts[j], region[:(starts[j] - starts[hi]) * per].view(-1, m, n)))
                hi = j
        launches += len(parts) + 1
        if hi == lo or launches >= len(counts):
            return None
        rounds.append((lo, hi, parts))
        lo = hi
    # Ô written and read back: 2 bytes more per entry and parameter byte than the ``_foreach_addcmul_``
    return rounds if rounds_pay(len(counts) - launches, 2 * size * starts[-1] * per) else None


def add_update_(params: list[torch.Tensor], outs: list[torch.Tensor], alpha: float, free: torch.Tensor | None,
                stack: torch.Tensor | None, cache: dict | None = None) -> None:
    """params[i] ← params[i] + alpha·outs[i] (``graph_scalars.foreach_add_scaled_``), with the
    result cast to the parameters' dtype in rounds packed into workspace bytes the step no longer
    reads (``update_rounds``: the free stack ``free``, then the result's added matrices) where
    the dtypes differ: a mixed-dtype ``_foreach_add_`` takes CUDA's slow path (one launch per
    matrix), a round is two (a cast ``_foreach_copy_`` and a same-dtype ``_foreach_add_``). The
    bits are the same: the cast to a wider float is exact and the sum is computed in the
    parameters' dtype either way. ``outs``: views of ``stack`` (k, m, n) in order; ``free``: a
    stack of the workspace not holding the result (None: the plain add). Changes the bytes of
    ``free`` and ``stack``. ``cache``: a dict keeping the rounds, their views shaped as ``outs``, from
    step to step (a chunk's plan: ``free`` and ``stack`` are then the same bytes at every step)."""
    dtype = params[0].dtype
    if cache is not None and "update_rounds" in cache:
        rounds = cache["update_rounds"]
    else:
        rounds = None
        if not torch.compiler.is_compiling() and free is not None and stack is not None and outs[0].dtype != dtype:
            rounds = update_rounds(free, stack, [o.numel() for o in outs], dtype)
            rounds = rounds and [(lo, hi, [b.view(o.shape) for b, o in zip(views, outs[lo:hi])])
                                 for lo, hi, views in rounds]
        if cache is not None:
            cache["update_rounds"] = rounds
    if rounds is None:
        foreach_add_scaled_(params, outs, alpha)
        return
    for lo, hi, views in rounds:
        if is_device_scalar(alpha):
            foreach_add_scaled_(params[lo:hi], outs[lo:hi], alpha, buffers=views)
        else:  # ``foreach_add_scaled_`` with the buffers: the cast copy, then the add (its kernels)
            torch._foreach_copy_(views, outs[lo:hi])
            torch._foreach_add_(params[lo:hi], views, alpha=alpha)


def scale_and_cast(u: torch.Tensor, out: torch.Tensor, kept: dict | None = None) -> torch.Tensor:
    """``out`` ← U/β cast to ``out``'s dtype, with β = 2^e per matrix and max|U| in [2^(e−1), 2^e)
    (``newton_schulz.power_of_two_scale``: e capped at the largest finite power of two, β = 1 for
    a zero matrix); returns β, shape (k, 1, 1) in u's dtype. U/β is exact and below 2 in
    magnitude, so the cast cannot overflow (float32 gradients above 65504 into float16 did).
    Shapes: u (k, m, n), out (k, m, n). Five operations for the whole stack (four with ``kept``: a dict
    keeping the (k, 1, 1) ones from call to call, a chunk's plan).
    """
    amax = torch.linalg.vector_norm(u, ord=math.inf, dim=(-2, -1), keepdim=True)
    largest = math.floor(math.log2(torch.finfo(u.dtype).max))
    exponent = torch.frexp(amax).exponent.clamp_(max=largest)
    key = ("ones", amax.shape, amax.dtype, amax.device)
    ones = kept.get(key) if kept is not None else None
    if ones is None:
        ones = torch.ones_like(amax)
        if kept is not None:
            kept[key] = ones
    beta = torch.ldexp(ones, exponent)
    torch.div(u, beta, out=out)
    return beta


def iterate_stack(x: torch.Tensor, table, *, tall: bool, workspace: Workspace) -> torch.Tensor:
    """The Newton–Schulz steps of ``table`` on a normalized contiguous (k, m, n) stack, on the small
    side without transposing (``newton_schulz.quintic_step_stacked``: the same calls, bitwise),
    every product written into workspace buffers (``out=``): two stacks used in turn (the (k, s, s)
    Gram matrix is written into the one not holding x, which the step's last product overwrites
    after the polynomial is formed) and the (k, s, s) polynomial. Returns the stack holding the result (``x`` or the
    workspace's "stack_b"; x must not be that buffer). Shapes: x (k, m, n) -> (k, m, n), x's dtype."""
    kept = getattr(workspace, "cache", None)  # a chunk's ``groups.muon_plan.Replay``: the views kept
    hit = kept.get("iterate") if kept is not None else None
    if hit is None or hit[0] is not x:
        k, m, n = x.shape
        s = n if tall else m
        other = workspace.get("stack_b", (k, m, n), x.dtype, x.device)
        poly = workspace.get("poly", (k, s, s), x.dtype, x.device)
        # per stack: itself, its transpose and the (k, s, s) Gram matrix in its bytes (s <= m, n: fits)
        views = {id(t): (t, t.mT, t.view(-1)[:k * s * s].view(k, s, s)) for t in (x, other)}
        hit = (x, other, poly, views)
        if kept is not None:
            kept["iterate"] = hit
    _, other, poly, views = hit
    for a, b, c in table:
        gram = views[id(other)][2]
        torch.bmm(views[id(x)][1], x, out=gram) if tall else torch.bmm(x, views[id(x)][1], out=gram)
        if c == 0.0:  # baddbmm's alpha == 0 quirk (``newton_schulz.quintic_step``)
            torch.mul(gram, b, out=poly)
        else:
            torch.baddbmm(gram, gram, gram, beta=b, alpha=c, out=poly)
        if tall:
            torch.baddbmm(x, x, poly, beta=a, out=other)
        else:
            torch.baddbmm(x, poly, x, beta=a, out=other)
        x, other = other, x
    return x
