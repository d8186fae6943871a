"""The launch-saving forms of the stacked step's update and of the finiteness screen, against the
plain forms they replace: the same bits, the same verdicts and names, fewer CUDA launches as the
CPU proxy counts them (benchmarks/_op_count.py).

- ``stacked.add_update_`` casts a bfloat16 result stack to the float32 parameters' dtype in rounds
  packed into workspace bytes the step no longer reads, where one mixed-dtype ``_foreach_add_``
  would take CUDA's slow path (one launch per matrix);
- ``FiniteCheck`` takes max|x| per gradient with one ``_foreach_norm(ord=inf)`` per (device,
  dtype), where one sum per gradient launched once per gradient.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

from ortho_fast.functional import dion as dion_math, stacked
from ortho_fast.validation import FiniteCheck
from tests.load_file import ROOT, load_file

_OP_COUNT = load_file(ROOT / "benchmarks" / "_op_count.py", "_op_count")
CountOps = _OP_COUNT.CountOps


@given(st.integers(1, 14), st.integers(1, 9), st.integers(1, 9), st.booleans(), st.integers(0, 2**16))
def test_the_update_in_rounds_has_the_bits_of_the_mixed_add(k, m, n, result_first, seed):
    """Property: for any chunk of k (m, n) matrices, ``add_update_`` gives the parameters the bits
    of ``param.add_(out, alpha=lr)`` with the bfloat16 out (the plain mixed-dtype add), whichever
    of the two pool stacks holds the result, and launches min(k, 2·rounds) times: at most 4 where
    the free stack holds half the chunk (k ≥ 5)."""
    gen = torch.Generator().manual_seed(seed)
    pool = torch.empty(2 * k * m * n * 2 + 1024, dtype=torch.uint8)
    half = (k * m * n * 2 + 511) // 512 * 512
    first, second = (pool[:k * m * n * 2].view(torch.bfloat16).view(k, m, n),
                     pool[half:half + k * m * n * 2].view(torch.bfloat16).view(k, m, n))
    stack, free = (first, second) if result_first else (second, first)
    stack.copy_(torch.randn(k, m, n, generator=gen))
    params = [torch.randn(m, n, generator=gen) for _ in range(k)]
    expected = [p.clone().add_(o, alpha=-0.37) for p, o in zip(params, stack.clone().unbind(0))]
    outs = list(stack.unbind(0))
    with CountOps() as counter:
        stacked.add_update_(params, outs, -0.37, free, stack)
    for p, e in zip(params, expected):
        assert torch.equal(p, e)
    assert counter.ops <= min(k, 4 if k >= 4 else k)


def test_the_update_falls_back_to_one_add_when_the_free_stack_overlaps_the_result():
    stack = torch.randn(6, 4, 4).to(torch.bfloat16)
    params = [torch.randn(4, 4) for _ in range(6)]
    expected = [p.clone().add_(o, alpha=0.5) for p, o in zip(params, stack.clone().unbind(0))]
    assert stacked.update_rounds(stack, stack, [16] * 6, torch.float32) is None
    with CountOps() as counter:
        stacked.add_update_(params, list(stack.unbind(0)), 0.5, stack, stack)
    assert all(torch.equal(p, e) for p, e in zip(params, expected))
    assert (counter.aten_ops, counter.ops) == (1, 6)


DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]


@given(st.lists(st.tuples(st.sampled_from(DTYPES), st.integers(0, 12)), min_size=1, max_size=8),
       st.sampled_from([None, float("nan"), float("inf"), -float("inf")]), st.integers(0, 7), st.integers(0, 2**16))
def test_the_finite_check_names_the_first_non_finite_tensor_across_dtypes_and_empties(specs, bad, which, seed):
    """Property: mixed dtypes (one ``_foreach_norm`` per dtype), empty tensors (finite, skipped:
    the inf-norm of an empty tensor is an error), entries at the dtype's largest value (finite);
    the verdict is "every entry finite" and the error names the first tensor that is not."""
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, 3, generator=gen).to(dt) for dt, n in specs]
    xs[0].view(-1)[:1] = torch.finfo(xs[0].dtype).max
    target = which % len(xs)
    if bad is not None and xs[target].numel():
        xs[target].view(-1)[-1] = bad
    check = FiniteCheck()
    for k, x in enumerate(xs):
        check.add(x, f"g{k}")
    error = check.error()
    expected = next((k for k, x in enumerate(xs) if not bool(torch.isfinite(x).all())), None)
    if expected is None:
        assert error is None
    else:
        assert str(error) == f"g{expected}: contains NaN or Inf; expected finite values"


@pytest.mark.parametrize("dtypes", [[torch.float32], [torch.float32, torch.bfloat16]])
def test_the_finite_check_launches_per_dtype_not_per_tensor(dtypes):
    """48 gradients: one ``_foreach_norm`` per dtype (3 launches each on its fast path), then one
    stack, ``isfinite``, ``all`` and the one host read; not one reduction per gradient."""
    xs = [torch.randn(8, 4).to(dtypes[i % len(dtypes)]) for i in range(48)]
    check = FiniteCheck()
    for k, x in enumerate(xs):
        check.add(x, f"g{k}")
    with CountOps() as counter:
        assert check.error() is None
    assert counter.ops <= 3 * len(dtypes) + 4 + len(dtypes) - 1  # + the casts of the other dtype's maxima


@given(st.lists(st.sampled_from(["zero", "negzero", "nan", "inf", "tiny", "normal"]), min_size=1, max_size=6),
       st.sampled_from([torch.float64, torch.float32, torch.bfloat16]))
def test_dion_prepare_flags_are_b_any_and_its_updates_are_the_elementwise_ones(kinds, dtype):
    """Property: ``dion_prepare`` leaves M + G in M and (1 − lr·wd)·X in X, bit for bit, and flags
    each B ≠ 0 exactly as ``B.any()`` (−0.0 is zero, NaN is nonzero)."""
    fill = {"zero": 0.0, "negzero": -0.0, "nan": float("nan"), "inf": float("inf"), "tiny": 1e-30, "normal": 1.5}
    xs = [torch.randn(4, 3).to(dtype) for _ in kinds]
    gs = [torch.full((4, 3), fill[k]).to(dtype) for k in kinds]
    ms = [torch.zeros(4, 3, dtype=dtype) for _ in kinds]
    expected_x = [x.clone().mul_(1 - 0.1 * 0.3) for x in xs]
    expected_m = [m.clone().add_(g) for m, g in zip(ms, gs)]
    flags = dion_math.dion_prepare(xs, gs, ms, lr=0.1, weight_decay=0.3)
    for x, ex, m, em, flag in zip(xs, expected_x, ms, expected_m, flags):
        assert torch.equal(x, ex) and torch.equal(m.isnan(), em.isnan())
        assert torch.equal(torch.nan_to_num(m), torch.nan_to_num(em)) and bool(flag) == bool(em.any())


def test_a_dion_group_with_a_zero_gradient_only_decays_that_parameter():
    """The batched start of a group's step (``dion_prepare``): a zero gradient beside nonzero ones
    keeps that parameter's Q and momentum and only decays it, as a lone parameter does."""
    import ortho_fast

    gen = torch.Generator().manual_seed(3)
    ps = [torch.nn.Parameter(torch.ones(12, 8, dtype=torch.float64)) for _ in range(3)]
    opt = ortho_fast.Dion(ps, lr=0.1, weight_decay=0.5, rank_fraction=0.5, seed=2)
    for i, p in enumerate(ps):
        p.grad = torch.zeros(12, 8, dtype=torch.float64) if i == 1 else torch.randn(12, 8, generator=gen,
                                                                                     dtype=torch.float64)
    opt.step()
    assert torch.equal(opt.state[ps[1]]["Q"], dion_math.initial_q((8, 4), 2, 1, torch.float64, "cpu"))
    assert not opt.state[ps[1]]["momentum"].any()
    assert torch.equal(ps[1].detach(), torch.full((12, 8), 0.95, dtype=torch.float64))
    assert not torch.equal(ps[0].detach(), torch.full((12, 8), 0.95, dtype=torch.float64))
