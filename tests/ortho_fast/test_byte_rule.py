"""The byte rule and the launch rules beyond one launch per operation of the CPU proxy
(benchmarks/_op_count.py): ``op_bytes`` (the device-memory bytes an operation other than a matrix
product reads and writes), ``gemm_self_copy`` (the copy of ``self`` inside CUDA ``addmm`` /
``baddbmm``: one more launch and its bytes) and ``multi_tensor_apply_launches`` (the split of a
fast ``_foreach`` call into launches, torch's aten/src/ATen/native/cuda/MultiTensorApply.cuh).

Each expected value is written from the rule (torch's source for the launches; one pass over each
operand for the bytes), not from the counter's output; the counter that drops an operand, counts a
write-only ``self`` as read, misses a copy or a split fails the case that names it.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from tests.load_file import ROOT, load_file

_OP_COUNT = load_file(ROOT / "benchmarks" / "_op_count.py", "_op_count")
CountOps = _OP_COUNT.CountOps
LARGE, SMALL = _OP_COUNT.LARGE_KERNEL_ARGS, _OP_COUNT.SMALL_KERNEL_ARGS
CHUNK = _OP_COUNT.CHUNK_ENTRIES
mta = _OP_COUNT.multi_tensor_apply_launches

FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def counted(fn, **kw) -> CountOps:
    with CountOps(**kw) as counter:
        fn()
    return counter


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# ---------------------------------------------------------------- bytes

@given(st.integers(1, 9), st.integers(1, 9), st.sampled_from(FLOATS))
def test_an_in_place_add_reads_both_and_writes_self(m, n, dtype):
    """Property: ``a.add_(b)`` reads a and b and writes a; ``a + b`` reads both and writes a new one."""
    a, b = torch.ones(m, n, dtype=dtype), torch.ones(m, n, dtype=dtype)
    c = counted(lambda: a.add_(b))
    assert (c.bytes_read, c.bytes_written) == (2 * nbytes(a), nbytes(a))
    c = counted(lambda: a + b)
    assert (c.bytes_read, c.bytes_written) == (2 * nbytes(a), nbytes(a))


@given(st.sampled_from(FLOATS), st.sampled_from(FLOATS), st.integers(1, 50))
def test_a_copy_reads_its_source_only(dst, src, k):
    """Property: ``copy_`` (a cast included) reads the source in its dtype and writes the
    destination in its own; ``fill_`` / ``zero_`` read nothing."""
    x, y = torch.zeros(k, dtype=dst), torch.ones(k, dtype=src)
    c = counted(lambda: x.copy_(y))
    assert (c.bytes_read, c.bytes_written) == (nbytes(y), nbytes(x))
    assert (counted(lambda: x.fill_(2)).bytes_read, counted(lambda: x.zero_()).bytes_written) == (0, nbytes(x))


def test_a_broadcast_operand_is_read_once():
    """A (n,) row vector added to an (m, n) matrix is n entries read, not m·n."""
    a, v = torch.ones(6, 5), torch.ones(5)
    c = counted(lambda: a.add_(v))
    assert c.bytes_read == nbytes(a) + nbytes(v) and c.bytes_written == nbytes(a)


def test_an_out_argument_is_written_not_read():
    a, b, out = torch.ones(4, 4), torch.ones(4, 4), torch.empty(4, 4)
    c = counted(lambda: torch.mul(a, b, out=out))
    assert (c.bytes_read, c.bytes_written) == (2 * nbytes(a), nbytes(out))


def test_a_scatter_writes_and_a_gather_reads_only_the_selected_slices():
    """``scatter_`` writes as many entries of self as its source holds (reads the source and the
    index); ``scatter_add_`` also reads them; ``gather`` reads as many entries as it returns."""
    w = torch.zeros(8, 6)
    index = torch.tensor([[1] * 6, [5] * 6])
    src = torch.ones(2, 6)
    c = counted(lambda: w.scatter_(0, index, src))
    assert (c.bytes_read, c.bytes_written) == (nbytes(index) + nbytes(src), nbytes(src))
    c = counted(lambda: w.scatter_add_(0, index, src))
    assert (c.bytes_read, c.bytes_written) == (nbytes(index) + 2 * nbytes(src), nbytes(src))
    c = counted(lambda: torch.gather(w, 0, index))
    assert (c.bytes_read, c.bytes_written) == (nbytes(index) + nbytes(src), nbytes(src))


def test_factories_and_products_move_no_counted_bytes():
    """``empty_like`` moves nothing, ``zeros_like`` writes without reading its model; ``mm`` /
    ``bmm`` and ``baddbmm`` with β = 0 are products: no counted bytes."""
    a = torch.ones(4, 4)
    assert counted(lambda: torch.empty_like(a)).bytes == 0
    c = counted(lambda: torch.zeros_like(a))
    assert (c.bytes_read, c.bytes_written) == (0, nbytes(a))
    def products():
        return (a @ a, torch.bmm(a[None], a[None]), torch.baddbmm(a[None], a[None], a[None], beta=0))
    assert counted(products).bytes == 0


def test_a_foreach_lerp_counts_every_list():
    xs, ys = [torch.ones(3, 4) for _ in range(5)], [torch.ones(3, 4, dtype=torch.bfloat16) for _ in range(5)]
    zs = [torch.ones(3, 4) for _ in range(5)]
    c = counted(lambda: torch._foreach_lerp_(xs, zs, 0.1))
    assert (c.bytes_read, c.bytes_written) == (10 * nbytes(xs[0]), 5 * nbytes(xs[0]))
    c = counted(lambda: torch._foreach_copy_(ys, xs))
    assert (c.bytes_read, c.bytes_written) == (5 * nbytes(xs[0]), 5 * nbytes(ys[0]))


# ---------------------------------------------------------------- the copy inside addmm / baddbmm

@pytest.mark.parametrize("beta", [0.5, 1.0, -2.0])
def test_a_baddbmm_with_beta_copies_self_unless_it_writes_onto_it(beta):
    """torch's ``baddbmm`` meta function copies ``self`` into the result when β ≠ 0: +1 launch and
    self read, the result written; ``baddbmm_`` and ``out=self`` copy nothing; β = 0 neither."""
    s, b1, b2 = torch.ones(3, 4, 5), torch.ones(3, 4, 2), torch.ones(3, 2, 5)
    c = counted(lambda: torch.baddbmm(s, b1, b2, beta=beta))
    assert (c.ops, c.launches, c.gemm_copies) == (1, 2, 1)
    assert (c.bytes_read, c.bytes_written) == (nbytes(s), nbytes(s))
    out = torch.empty(3, 4, 5)
    assert counted(lambda: torch.baddbmm(s, b1, b2, beta=beta, out=out)).launches == 2
    assert counted(lambda: torch.baddbmm(s, b1, b2, beta=beta, out=s)).launches == 1
    assert counted(lambda: s.baddbmm_(b1, b2, beta=beta)).launches == 1
    assert counted(lambda: torch.baddbmm(s, b1, b2, beta=0.0)).launches == 1


def test_an_addmm_copies_a_matrix_self_and_adds_a_bias_in_its_epilogue():
    """CUDA ``addmm``: a 2-D ``self`` with β ≠ 0 is copied into the result (+1 launch); a
    contiguous bias vector with β = 1 takes the cuBLASLt epilogue (no copy); with β ≠ 1 it is
    broadcast by the copy (its n entries read, m·n written)."""
    a, b, c2 = torch.ones(4, 3), torch.ones(3, 5), torch.ones(4, 5)
    bias = torch.ones(5)
    assert counted(lambda: torch.addmm(c2, a, b, beta=0.7)).launches == 2
    assert counted(lambda: torch.addmm(c2, a, b, beta=0.0)).launches == 1
    assert counted(lambda: torch.addmm(bias, a, b)).launches == 1
    c = counted(lambda: torch.addmm(bias, a, b, beta=0.5))
    assert c.launches == 2 and (c.bytes_read, c.bytes_written) == (nbytes(bias), nbytes(c2))
    assert counted(lambda: c2.addmm_(a, b, beta=0.7)).launches == 1


def test_torch_muon_pays_two_copies_per_newton_schulz_iteration():
    """torch.optim.Muon's Newton–Schulz runs ``addmm`` twice per iteration with β = b and β = a
    (both ≠ 0) into a new tensor: 5 iterations × 2 copies per matrix, over 48 matrices."""
    gen = torch.Generator().manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in [(96, 32), (32, 32), (128, 32), (32, 128)] * 12]
    opt = torch.optim.Muon(ps, lr=0.02)
    for _ in range(2):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen)
        c = counted(opt.step)
    assert c.gemm_copies == 10 * 48 and c.launches == c.ops + 10 * 48


# ---------------------------------------------------------------- the multi_tensor_apply split

@given(st.integers(1, 2000), st.integers(1, 5), st.booleans(), st.sampled_from([LARGE, SMALL]))
def test_tensors_of_one_chunk_split_by_the_tensor_table(n, depth, scalar_list, tables):
    """Property: n tensors of at most one chunk each: a launch every ``max_tensors[depth - 1]``
    tensors (the scalar-list table for one scalar per tensor), ⌈n / that⌉ launches."""
    key = "max_tensors_scalarlist" if scalar_list else "max_tensors"
    assert mta([CHUNK] * n, depth, scalar_list, tables) == math.ceil(n / tables[key][depth - 1])


@given(st.integers(1, 20000), st.integers(1, 5), st.sampled_from([LARGE, SMALL]))
def test_one_large_tensor_splits_by_the_block_table(chunks, depth, tables):
    """Property: one tensor of c chunks: a launch every ``max_blocks`` chunks, ⌈c / max_blocks⌉."""
    assert mta([chunks * CHUNK], depth, False, tables) == math.ceil(chunks / tables["max_blocks"])


def test_empty_tensors_are_skipped_and_a_call_without_entries_launches_nothing():
    assert mta([0, 0], 1) == 0
    assert mta([0, 5, 0], 1) == 1


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 400), st.sampled_from([LARGE, SMALL]))
def test_a_fast_foreach_call_counts_its_split(n, tables):
    """A real call: ``_foreach_mul_(xs, 2.0)`` is depth 1, ``_foreach_add(xs, ys)`` (a result list)
    depth 3, ``_foreach_mul_(xs, [..])`` the scalar-list table; the plain count stays one launch."""
    xs, ys = [torch.ones(2) for _ in range(n)], [torch.ones(2) for _ in range(n)]
    cases = [(lambda: torch._foreach_mul_(xs, 2.0), tables["max_tensors"][0]),
             (lambda: torch._foreach_add(xs, ys), tables["max_tensors"][2]),
             (lambda: torch._foreach_mul_(xs, [2.0] * n), tables["max_tensors_scalarlist"][0])]
    for fn, per_launch in cases:
        c = counted(fn, tables=tables)
        assert (c.ops, c.launches) == (1, math.ceil(n / per_launch))


def test_a_norm_is_its_reduction_launches_plus_two():
    """``_foreach_norm`` on its fast path: the zeroed buffer, the reduction (split as any depth-1
    call) and the cleanup kernel."""
    xs = [torch.ones(3) for _ in range(111)]
    assert counted(lambda: torch._foreach_norm(xs), tables=SMALL).launches == 2 + 2
    assert counted(lambda: torch._foreach_norm(xs), tables=LARGE).launches == _OP_COUNT.NORM_FAST_LAUNCHES


def test_skipping_the_products_keeps_every_count():
    """``skip_products``: the counts of a step are those of the step computed (values aside)."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(48, 16), (16, 16), (64, 16), (16, 64)] * 3
    results = []
    for skip in (False, True):
        ps = [torch.nn.Parameter(torch.randn(s, generator=torch.Generator().manual_seed(1))) for s in shapes]
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen)
        opt = torch.optim.Muon(ps, lr=0.02)
        c = counted(opt.step, skip_products=skip)
        results.append((c.ops, c.launches, c.bytes_read, c.bytes_written, c.peak, c.allocated))
    assert results[0] == results[1]
