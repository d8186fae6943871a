"""The stacked Muon step's kernels: same-shape matrices in one (k, m, n) stack, reused workspaces.

The fast default Muon step (``ortho_fast.groups.muon``, bfloat16 / float16 Newton–Schulz, not
``bitwise_torch``) runs per chunk of same-shape matrices a fixed number of operations, however
many matrices the chunk holds: the Nesterov momentum written into one stack (``_foreach`` ops),
the overflow-safe power-of-two scale and the cast in one division, one Frobenius normalization,
five steps of three batched products, the update as one ``_foreach_add_``. The stacks and the
products' outputs live in a ``Workspace`` kept by the optimizer: allocated at the first step,
reused by every chunk of every later step (no allocation in the step, the same addresses at every
step: what a CUDA graph replays), bounded by ``MAX_STACK_ELEMENTS`` per chunk.
Source: modded-nanogpt / nanochat parameter banks (batched Newton–Schulz); torch.optim's
``_multi_tensor_*`` steps (``_foreach`` ops); docs/performance.md, "The stacked step".
"""

from __future__ import annotations

import math

import torch

#: Most matrix entries one stack (one chunk) holds: 2^25 (128 MiB of float32 momentum, 64 MiB per
#: bfloat16 stack). Larger shape groups are cut into chunks of whole matrices (a chunk holds at
#: least one); the workspace never exceeds one chunk's buffers. The trade-off: each of the 12
#: same-shape matrices of a d = 768 × 12 GPT is then one chunk (179 operations per step; 2^24 cut
#: it into 7 chunks, about 265), for a 243 MB workspace (docs/performance.md, "(e)").
MAX_STACK_ELEMENTS = 1 << 25


class Workspace:
    """Named buffers reused across steps: ``get(name, shape, dtype, device)`` returns a view of
    one flat buffer per (name, dtype, device), grown to the largest request and kept.

    Buffers of one name are shared by every chunk (chunks run one after the other, each consumed
    before the next starts). ``nbytes`` is the memory held between steps. Under ``torch.compile``
    every request is a fresh ``torch.empty`` (inductor plans the graph's memory itself).
    Not part of an optimizer's ``state_dict``; a copied optimizer starts without buffers.
    """

    def __init__(self) -> None:
        self._flat: dict[tuple, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return torch.empty(shape, dtype=dtype, device=device)
        numel = math.prod(shape)
        key = (name, dtype, device)
        flat = self._flat.get(key)
        if flat is None or flat.numel() < numel:
            self._flat.pop(key, None)  # release the smaller one before allocating
            flat = torch.empty(numel, dtype=dtype, device=device)
            self._flat[key] = flat
        return flat[:numel].view(shape)

    @property
    def nbytes(self) -> int:
        """Bytes held between steps."""
        return sum(t.numel() * t.element_size() for t in self._flat.values())

    def clear(self) -> None:
        self._flat.clear()

    def __getstate__(self) -> dict:  # a copied optimizer allocates its own buffers
        return {"_flat": {}}


def scale_and_cast(u: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out`` ← U/β cast to ``out``'s dtype, with β = 2^e per matrix and max|U| in [2^(e−1), 2^e)
    (``newton_schulz.power_of_two_scale``: e capped at the largest finite power of two, β = 1 for
    a zero matrix); returns β, shape (k, 1, 1) in u's dtype. U/β is exact and below 2 in
    magnitude, so the cast cannot overflow (float32 gradients above 65504 into float16 did).
    Shapes: u (k, m, n), out (k, m, n). Five operations for the whole stack."""
    amax = torch.linalg.vector_norm(u, ord=math.inf, dim=(-2, -1), keepdim=True)
    largest = math.floor(math.log2(torch.finfo(u.dtype).max))
    exponent = torch.frexp(amax).exponent.clamp_(max=largest)
    beta = torch.ldexp(torch.ones_like(amax), exponent)
    torch.div(u, beta, out=out)
    return beta


def iterate_stack(x: torch.Tensor, table, *, tall: bool, workspace: Workspace) -> torch.Tensor:
    """The Newton–Schulz steps of ``table`` on a normalized contiguous (k, m, n) stack, on the small
    side without transposing (``newton_schulz.quintic_step_stacked``: the same calls, bitwise),
    every product written into workspace buffers (``out=``): two stacks used in turn and the
    (k, s, s) Gram and polynomial matrices. Returns the stack holding the result (``x`` or the
    workspace's "stack_b"; x must not be that buffer). Shapes: x (k, m, n) -> (k, m, n), x's dtype."""
    k, m, n = x.shape
    s = n if tall else m
    other = workspace.get("stack_b", (k, m, n), x.dtype, x.device)
    gram = workspace.get("gram", (k, s, s), x.dtype, x.device)
    poly = workspace.get("poly", (k, s, s), x.dtype, x.device)
    for a, b, c in table:
        torch.bmm(x.mT, x, out=gram) if tall else torch.bmm(x, x.mT, out=gram)
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
