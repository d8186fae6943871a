"""ortho_fast.validation.check_finite: every NaN / ±Inf is caught wherever it sits, for every
floating dtype and memory layout (it uses the NaN-propagating extremes, not isfinite().all())."""

import pytest
import torch
from hypothesis import example, given, strategies as st

from ortho_fast.validation import FiniteCheck, check_count, check_filled, check_finite, check_hyper

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]


@given(rows=st.integers(1, 40), cols=st.integers(1, 40), dtype=st.sampled_from(DTYPES),
       bad=st.sampled_from([float("nan"), float("inf"), -float("inf")]), transposed=st.booleans(),
       where=st.floats(0, 1, exclude_max=True), seed=st.integers(0, 2**16))
def test_any_non_finite_entry_is_caught(rows, cols, dtype, bad, transposed, where, seed):
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)).to(dtype)
    x = x.mT if transposed else x
    check_finite(x, "x")  # finite: passes
    i = int(where * x.numel())
    x[i // x.shape[1], i % x.shape[1]] = bad
    with pytest.raises(ValueError, match="x: contains NaN or Inf"):
        check_finite(x, "x")


@given(count=st.integers(1, 4), dtype=st.sampled_from(DTYPES), huge=st.booleans(), bad=st.sampled_from(
    [None, float("nan"), float("inf"), -float("inf")]), which=st.integers(0, 3),
       where=st.floats(0, 1, exclude_max=True),
    seed=st.integers(0, 2**16))
def test_finite_check_verdict_is_exact(count, dtype, huge, bad, which, where, seed):
    """``FiniteCheck`` screens with max|x| per tensor (``_foreach_norm(ord=inf)``), which finite
    entries cannot overflow (``huge``: entries near the dtype's largest value, whose sum would be
    ±Inf): its verdict is exactly "every entry finite", and an error names the first tensor that
    is not."""
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(5, 7, generator=gen).to(dtype) for _ in range(count)]
    if huge:
        xs[0] = torch.full((5, 7), torch.finfo(dtype).max / 2, dtype=dtype)
    if bad is not None:
        t = xs[which % count]
        i = int(where * t.numel())
        t.view(-1)[i] = bad
    check = FiniteCheck()
    for k, x in enumerate(xs):
        check.add(x, f"x{k}")
    error = check.error()
    expected = next((k for k, x in enumerate(xs) if not bool(torch.isfinite(x).all())), None)
    if expected is None:
        assert error is None
    else:
        assert isinstance(error, ValueError) and str(error).startswith(f"x{expected}: contains NaN or Inf")


@given(dtypes=st.lists(st.sampled_from([*DTYPES, torch.complex64, torch.int64]), min_size=1, max_size=5),
       which=st.integers(0, 4), bad=st.booleans(), seed=st.integers(0, 2**16))
def test_finite_check_mixes_dtypes_and_complex(dtypes, which, bad, seed):
    """Property: one ``FiniteCheck`` over tensors of several dtypes (maxima of several dtypes are
    reduced together; complex tensors by their real and imaginary parts; integers always finite)
    names the first non-finite tensor, or none."""
    gen = torch.Generator().manual_seed(seed)
    xs = [(torch.randn(4, 3, generator=gen) * 10).to(dt) for dt in dtypes]
    target = which % len(xs)
    if bad and (xs[target].is_floating_point() or xs[target].is_complex()):
        xs[target].view(-1)[1] = complex(0, float("nan")) if xs[target].is_complex() else float("nan")
    check = FiniteCheck()
    for k, x in enumerate(xs):
        check.add(x, f"x{k}")
    error = check.error()
    expected = next((k for k, x in enumerate(xs) if not bool(torch.isfinite(x).all())), None)
    assert (error is None) if expected is None else str(error).startswith(f"x{expected}: contains NaN or Inf")


@given(count=st.integers(1, 6), cuts=st.lists(st.integers(0, 6), max_size=3), plain=st.lists(st.booleans(), min_size=4,
       max_size=4), which=st.integers(0, 5), bad=st.sampled_from([None, float("nan"), float("inf")]),
       seed=st.integers(0, 2**16))
@example(count=4, cuts=[2], plain=[True, False, False, False], which=3, bad=float("nan"), seed=0)  # a block, then more
def test_screened_blocks_keep_the_order_and_the_prefix(count, cuts, plain, which, bad, seed):
    """Property: tensors added in blocks (``add_screened``; one block alone takes the path without
    per-tensor checks) or one by one (``add``), each part under its own prefix, give the verdict
    and the name (prefix included) of adding them all one by one: the first non-finite tensor in
    the order added."""
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(3, 4, generator=gen) for _ in range(count)]
    if bad is not None:
        xs[which % count].view(-1)[which % 12] = bad
    bounds = sorted({0, count, *(c % (count + 1) for c in cuts)})
    check = FiniteCheck()
    for k, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        check.prefix = f"part {k}: "
        if plain[k]:
            check.add_screened(xs[lo:hi], [f"x{i}" for i in range(lo, hi)])
        else:
            for i in range(lo, hi):
                check.add(xs[i], f"x{i}")
    error = check.error()
    expected = next((i for i, x in enumerate(xs) if not bool(torch.isfinite(x).all())), None)
    if expected is None:
        assert error is None
    else:
        part = next(k for k, (lo, hi) in enumerate(zip(bounds, bounds[1:])) if lo <= expected < hi)
        assert str(error).startswith(f"part {part}: x{expected}: contains NaN or Inf"), str(error)


def test_empty_and_scalar():
    check_finite(torch.empty(0, 3), "x")
    check_finite(torch.tensor(1.0), "x")
    with pytest.raises(ValueError):
        check_finite(torch.tensor(float("nan")), "x")


@pytest.mark.parametrize("value", ["0.1", b"1", None, float("nan"), float("inf"), -1.0, [0.1]])
def test_check_hyper_takes_only_finite_real_numbers_in_range(value):
    """A string is not a number here (float("0.1") would pass and break the step's arithmetic)."""
    with pytest.raises(ValueError, match="^lr: expected"):
        check_hyper(value, "lr")
    assert check_hyper(torch.tensor(0.5), "lr") == 0.5 and check_hyper(1, "lr") == 1.0


def test_check_count_and_check_filled():
    assert check_count(3, "k") == 3
    for bad in (0, True, 2.0, "2"):
        with pytest.raises(ValueError, match="^k: expected an integer >= 1"):
            check_count(bad, "k")
    with pytest.raises(ValueError, match="^eps: missing from the AdamW param group"):
        check_filled({"lr": 1e-3}, {"lr": 1e-3, "eps": 1e-8}, "AdamW")
