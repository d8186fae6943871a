"""The launch rule of the CPU proxy (benchmarks/_op_count.py, ``cuda_launches``): a ``_foreach``
operation counts one CUDA launch where torch's fast path (``multi_tensor_apply``) would take it and
one per tensor where its slow path loops, following torch's aten/src/ATen/native/ForeachUtils.h
``check_fast_path_restrictions`` and the per-operation checks of the Foreach*.cu kernels.

Each case is written from the rule, not from the counter's output: the same lists with one tensor
of another dtype, a layout change (a transposed or strided tensor), a promoting scalar,
and the exceptions (``_foreach_copy_`` casts on its fast path; ``_foreach_norm`` is three launches
and fast only for ord 1, 2, inf on floating tensors).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, strategies as st

from tests.load_file import ROOT, load_file

_OP_COUNT = load_file(ROOT / "benchmarks" / "_op_count.py", "_op_count")
CountOps = _OP_COUNT.CountOps
NORM_FAST = _OP_COUNT.NORM_FAST_LAUNCHES

FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def counted(fn) -> CountOps:
    with CountOps() as counter:
        fn()
    return counter


def tensors(dtypes, shape=(3, 4)):
    return [torch.ones(shape, dtype=dt) for dt in dtypes]


@given(st.lists(st.sampled_from(FLOATS), min_size=1, max_size=6), st.sampled_from(FLOATS))
def test_an_add_of_one_dtype_is_one_launch_and_of_two_one_per_tensor(dtypes, other):
    """Property: ``_foreach_add_(xs, ys)`` is one launch iff every tensor of both lists has
    ``xs[0]``'s dtype, else one launch per tensor (the slow path's ``add_`` per pair)."""
    xs = tensors(dtypes)
    ys = tensors([other] * len(dtypes))
    fast = set(dtypes) == {other}
    counter = counted(lambda: torch._foreach_add_(xs, ys, alpha=0.5))
    assert (counter.ops, counter.aten_ops) == (1 if fast else len(dtypes), 1)
    assert counter.slow_foreach == ([] if fast else [("aten::_foreach_add_", len(dtypes))])


@given(st.sampled_from(FLOATS), st.sampled_from(FLOATS), st.integers(1, 6))
def test_a_copy_that_casts_is_one_launch(dst, src, k):
    """Property: ``_foreach_copy_`` skips the dtype check across its lists (its kernel casts):
    one launch for any pair of dtypes, each list of one dtype."""
    xs, ys = tensors([dst] * k), tensors([src] * k)
    assert counted(lambda: torch._foreach_copy_(xs, ys)).ops == 1


def test_a_copy_from_a_list_of_two_dtypes_is_one_launch_per_tensor():
    xs, ys = tensors([torch.float32] * 3), tensors([torch.float32, torch.bfloat16, torch.float32])
    assert counted(lambda: torch._foreach_copy_(xs, ys)).ops == 3


def test_a_transposed_or_strided_tensor_sends_the_call_to_the_slow_path():
    """The i-th tensors of the lists must share sizes and strides (a transposed twin of the same
    shape does not), and every tensor must be non-overlapping and dense (a column slice is not);
    a transposed tensor paired with transposed tensors is dense and fast."""
    xs = tensors([torch.float32] * 3, (4, 4))
    ys = tensors([torch.float32] * 3, (4, 4))
    ys[1] = ys[1].t().contiguous().t()  # same values, column-major strides
    assert counted(lambda: torch._foreach_add_(xs, ys)).ops == 3
    both = [t.t() for t in tensors([torch.float32] * 3, (4, 4))]
    others = [t.t() for t in tensors([torch.float32] * 3, (4, 4))]
    assert counted(lambda: torch._foreach_add_(both, others)).ops == 1
    sliced = [torch.ones(4, 8)[:, ::2] for _ in range(3)]
    assert counted(lambda: torch._foreach_mul_(sliced, 2.0)).ops == 3


def test_a_scalar_that_promotes_the_tensor_is_slow():
    """A float scalar on integer tensors (the result would be float), an int on bool tensors;
    a float scalar on float tensors of any width keeps their dtype and is fast."""
    ints = [torch.ones(3, dtype=torch.int32) for _ in range(4)]
    assert counted(lambda: torch._foreach_add(ints, 1.5)).ops == 4
    assert counted(lambda: torch._foreach_add(ints, 2)).ops == 1
    bools = [torch.ones(3, dtype=torch.bool) for _ in range(4)]
    assert counted(lambda: torch._foreach_add(bools, 2)).ops == 4
    for dt in FLOATS:
        xs = tensors([dt] * 4)
        assert counted(lambda: torch._foreach_mul_(xs, 0.3)).ops == 1
    xs = tensors([torch.float32] * 4)
    assert counted(lambda: torch._foreach_mul_(xs, [0.5, 1.0, 2.0, 3.0])).ops == 1


def test_an_op_promoting_integers_to_float_is_slow_on_integers():
    ints = [torch.ones(3, dtype=torch.int64) for _ in range(4)]
    assert counted(lambda: torch._foreach_div(ints, ints)).ops == 4
    assert counted(lambda: torch._foreach_mul(ints, ints)).ops == 1
    assert counted(lambda: torch._foreach_sqrt(ints)).ops == 4


def test_a_scalar_tensor_of_another_dtype_is_slow():
    xs = tensors([torch.float32] * 5)
    assert counted(lambda: torch._foreach_mul_(xs, torch.tensor(2.0))).ops == 1
    assert counted(lambda: torch._foreach_mul_(xs, torch.tensor(2.0, dtype=torch.float64))).ops == 5


def test_a_lerp_checks_all_three_lists():
    xs, ys, ws = (tensors([torch.float32] * 3, (4, 4)) for _ in range(3))
    assert counted(lambda: torch._foreach_lerp_(xs, ys, 0.1)).ops == 1
    assert counted(lambda: torch._foreach_lerp_(xs, ys, ws)).ops == 1
    ws[2] = ws[2].t().contiguous().t()
    assert counted(lambda: torch._foreach_lerp_(xs, ys, ws)).ops == 3


@pytest.mark.parametrize("ord_", [1, 2, math.inf, 3, -math.inf])
@pytest.mark.parametrize("mixed", [False, True])
def test_a_norm_is_three_launches_on_its_fast_path(ord_, mixed):
    """``_foreach_norm`` on its fast path zeroes a per-chunk buffer, reduces, and cleans up: three
    launches; for another ord or mixed dtypes, one ``linalg_vector_norm`` per tensor."""
    xs = tensors([torch.float32, torch.bfloat16 if mixed else torch.float32, torch.float32, torch.float32])
    fast = ord_ in (1, 2, math.inf) and not mixed
    assert counted(lambda: torch._foreach_norm(xs, ord_)).ops == (NORM_FAST if fast else 4)


def test_other_operations_count_one_and_views_none():
    x = torch.ones(4, 4)
    counter = counted(lambda: (x @ x, x.t(), x.view(16), x.sum()))
    assert (counter.ops, counter.aten_ops) == (2, 2)
