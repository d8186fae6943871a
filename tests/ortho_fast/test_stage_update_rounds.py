"""The stages' update in rounds (``muon_stages.add_scaled_product_``, ``stacked.product_rounds``):
W ← W + α·O·f of a (k, m, n) result stack O and the stages' per-neuron factors f, with Ô = O·f
formed by one batched product per part into free workspace bytes and added with one same-dtype
``_foreach_add_`` per round, where the mixed-dtype ``_foreach_addcmul_`` with broadcast factors
takes CUDA's slow path (one launch per tensor, as the CPU proxy benchmarks/_op_count.py counts).

Not the same bits as the fused form: the ``_foreach_addcmul_`` rounds α·O and then computes
fma(α·O, f, W) (measured on the CPU, torch 2.13; torch's CUDA kernel writes ``a + alpha * b * c``,
which nvcc contracts the same way); the rounds round Ô = O·f before the sum. Both are judged
against W + α·O·f computed exactly (float64 from the exact bfloat16 O, float32 f and W):
``_bound``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

from ortho_fast.functional import muon_stages as stage_math, stacked
from ortho_verify.tolerances.stages import scaled_product_update_bound
from tests.load_file import ROOT, load_file

_OP_COUNT = load_file(ROOT / "benchmarks" / "_op_count.py", "_op_count")
CountOps = _OP_COUNT.CountOps

ALPHA = -0.0123


def _bound(w: torch.Tensor, product: torch.Tensor) -> torch.Tensor:
    """``ortho_verify.tolerances.stages.scaled_product_update_bound`` in float32 (its derivation)."""
    return scaled_product_update_bound(w.abs(), product.abs(), "float32")


def _case(counts, m, n, stack_dtype, side, seed):
    gen = torch.Generator().manual_seed(seed)
    k = sum(counts)
    stack = torch.randn(k, m, n, generator=gen).to(stack_dtype)
    shape = {"row": (k, m, 1), "column": (k, 1, n), "matrix": (k, 1, 1)}[side]
    factor = torch.rand(shape, generator=gen) * 3 + 0.25  # every matrix its own factors
    params = [torch.randn(c, m, n, generator=gen) for c in counts]
    return stack, factor, params


def _outside(params, before, stack, factor, counts) -> int:
    """Entries of the updated ``params`` farther than ``_bound`` from W + α·O·f (float64)."""
    bad, start = 0, 0
    for p, w, c in zip(params, before, counts):
        product = ALPHA * stack[start:start + c].double() * factor[start:start + c].double()
        start += c
        bad += int(((p.double() - (w.double() + product)).abs() > _bound(w.double(), product)).sum())
    return bad


def _pool(nbytes: int) -> torch.Tensor:
    """A flat byte buffer of ``nbytes`` with 512 guard bytes each side (returned as the middle)."""
    return torch.zeros(nbytes + 1024, dtype=torch.uint8)[512:512 + nbytes]


@given(st.lists(st.integers(1, 3), min_size=1, max_size=9), st.integers(1, 12), st.integers(1, 12),
       st.sampled_from(["row", "column", "matrix"]), st.sampled_from([torch.bfloat16, torch.float32]),
       st.floats(0.0, 2.5), st.integers(0, 2**16))
def test_the_update_in_rounds_is_within_the_bound_and_allocates_nothing(counts, m, n, side, stack_dtype, share,
                                                                       seed):
    """Property: for any members (1–3 matrices each), factor shape and free region (``share`` of
    the stack's bytes in float32), the parameters end within ``_bound`` of W + α·O·f; the rounds,
    where ``product_rounds`` finds them, launch one product per part and one add per round, fewer
    than one per member, allocate nothing and write no byte outside the free region, the stack's
    added matrices and the parameters (the factor is untouched)."""
    stack, factor, params = _case(counts, m, n, stack_dtype, side, seed)
    free = _pool(int(share * sum(counts) * m * n * 4))
    guard = free._base if free._base is not None else free
    before, o, f = [p.clone() for p in params], stack.clone(), factor.clone()
    rounds = stacked.product_rounds([free], stack, counts, torch.float32)
    with CountOps() as counter:
        stage_math.add_scaled_product_(params, stack, factor, counts, ALPHA, [free])
    assert _outside(params, before, o, f, counts) == 0
    assert torch.equal(factor, f)
    assert not guard[:512].any() and not guard[-512:].any()
    if rounds is not None:
        assert counter.ops == sum(len(parts) + 1 for _, _, parts in rounds) < len(counts)
        assert counter.peak == 0 and counter.allocated == 0
    else:
        assert counter.ops <= len(counts)  # the ``_foreach_addcmul_``: one launch per tensor at most


@given(st.lists(st.integers(1, 3), min_size=1, max_size=12), st.integers(1, 6), st.integers(1, 6),
       st.floats(0.0, 2.5), st.booleans())
def test_the_rounds_cover_the_members_in_order_in_free_bytes_only(counts, m, n, share, two_regions):
    """Property: ``product_rounds`` gives rounds covering members 0..len−1 in order, each part
    whole members' consecutive matrices, its output inside one free buffer or inside the stack's
    matrices added in earlier rounds (never bytes a later round still reads), the parts of a
    round disjoint, and fewer launches in all than members."""
    k = sum(counts)
    stack = torch.zeros(k, m, n, dtype=torch.bfloat16)
    size = int(share * k * m * n * 4)
    frees = [_pool(size // 2), _pool(size - size // 2)] if two_regions else [_pool(size)]
    rounds = stacked.product_rounds(frees, stack, counts, torch.float32)
    if rounds is None:
        return
    starts = [sum(counts[:i]) for i in range(len(counts) + 1)]
    spans = [(f.data_ptr(), f.data_ptr() + f.nbytes) for f in frees]
    expect_lo, launches = 0, 0
    for lo, hi, parts in rounds:
        assert lo == expect_lo < hi
        added = (stack.data_ptr(), stack.data_ptr() + starts[lo] * m * n * stack.element_size())
        assert [a for a, _, _ in parts][0] == starts[lo] and parts[-1][1] == starts[hi]
        used = []
        for (a, b, out), nxt in zip(parts, [p[0] for p in parts[1:]] + [starts[hi]]):
            assert b == nxt and b in starts and out.shape == (b - a, m, n) and out.dtype == torch.float32
            span = (out.data_ptr(), out.data_ptr() + out.nbytes)
            assert any(lo_ <= span[0] and span[1] <= hi_ for lo_, hi_ in spans + [added])
            assert all(span[1] <= u0 or u1 <= span[0] for u0, u1 in used)
            used.append(span)
        launches += len(parts) + 1
        expect_lo = hi
    assert expect_lo == len(counts) and launches < len(counts)


def test_a_free_buffer_sharing_the_stacks_bytes_is_left_out():
    """The result stack offered as free (the workspace's stack that holds the result) is no free
    region: no round (nothing else is free before the first round), the fused update."""
    stack, factor, params = _case([1] * 6, 8, 4, torch.bfloat16, "row", 0)
    assert stacked.product_rounds([stack.view(-1).view(torch.uint8)], stack, [1] * 6, torch.float32) is None
    before = [p.clone() for p in params]
    with CountOps() as counter:
        stage_math.add_scaled_product_(params, stack, factor, [1] * 6, ALPHA, [stack.view(-1).view(torch.uint8)])
    assert counter.ops == 6 and _outside(params, before, stack, factor, [1] * 6) == 0


def test_bfloat16_parameters_keep_the_fused_update():
    """bfloat16 parameters are narrower than the float32 product: a round would round Ô twice
    (to float32, then in the bfloat16 sum's own way); they keep the one-rounding fused form."""
    stack, factor, _ = _case([1] * 6, 8, 4, torch.bfloat16, "row", 1)
    params = [torch.randn(1, 8, 4).to(torch.bfloat16) for _ in range(6)]
    expected = [p.clone() for p in params]
    torch._foreach_addcmul_(expected, list(stack.split(1)), list(factor.split(1)), value=ALPHA)
    stage_math.add_scaled_product_(params, stack, factor, [1] * 6, ALPHA, [_pool(6 * 8 * 4 * 4)])
    assert all(torch.equal(p, e) for p, e in zip(params, expected))


@pytest.mark.parametrize("plant", ["a round skipped", "a wrong factor slice", "the product rounded to bfloat16"])
def test_the_bound_catches_a_planted_error(plant, monkeypatch):
    """The check of the property test fails on each planted error: the last round's add skipped,
    each matrix multiplied by its neighbour's factors, Ô rounded to bfloat16 before the add."""
    counts = [1] * 8
    stack, factor, params = _case(counts, 16, 8, torch.bfloat16, "row", 2)
    before = [p.clone() for p in params]
    free = _pool(4 * 16 * 8 * 4)
    used = factor
    if plant == "a round skipped":
        real = stacked.product_rounds
        monkeypatch.setattr(stacked, "product_rounds", lambda *a: real(*a)[:-1])
    elif plant == "a wrong factor slice":
        used = factor.roll(1, 0)
    else:
        real_mul = torch.mul
        monkeypatch.setattr(torch, "mul", lambda a, b, out: out.copy_(real_mul(a, b).bfloat16()))
    assert stacked.product_rounds([free], stack, counts, torch.float32) is not None
    stage_math.add_scaled_product_(params, stack, used, counts, ALPHA, [free])
    assert _outside(params, before, stack, factor, counts) > 0
