"""Compiled kernels: inputs grouped by shape, ``shapes=`` to restrict them, and dynamo's
recompile-limit failure named as such (with the fix), not reported as a wrong kernel.
A small ``torch.compile(dynamic=False, fullgraph=True, backend="eager")`` kernel on the CPU
(backend "eager": dynamo's tracing and guards without inductor's code generation, which takes
minutes on 2 cores)."""

import pytest
import torch
import torch._dynamo

from ortho_verify import check_orthogonalizer
from ortho_verify.api import DEFAULT_SPECS, RECOMPILE_LIMIT_FIX, default_examples, is_recompile_limit
from ortho_verify.planted.bugs import newton_schulz_kernel


@pytest.fixture
def recompile_limit():
    """dynamo's recompile limit lowered to 2 for the test (restored after, and dynamo's caches reset)."""
    name = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    old = getattr(torch._dynamo.config, name)
    setattr(torch._dynamo.config, name, 2)
    torch._dynamo.reset()
    yield 2
    setattr(torch._dynamo.config, name, old)
    torch._dynamo.reset()


def _compiled():
    def kernel(g):
        return newton_schulz_kernel(g)
    return torch.compile(kernel, dynamic=False, fullgraph=True, backend="eager")


def _three_shapes():
    by_shape = {}
    for ex in default_examples("float32", batched=False):
        by_shape.setdefault(ex.matrix.shape, ex)
    return list(by_shape.values())[:3]


def test_recompile_limit_is_named_with_the_fix(recompile_limit):
    """Three shapes, limit 2: the third input hits the limit. The limit is set in this thread and the
    judge calls the kernel in a worker thread (dynamo's settings are thread-local): failing here
    shows the judge carries the caller's setting over, so raising it is a fix that works."""
    examples = _three_shapes()
    report = check_orthogonalizer(_compiled(), examples=examples)
    assert not report.passed
    limit_rows = [r for r in report.results if r.check == "recompile_limit"]
    assert len(limit_rows) == 1 and not limit_rows[0].passed
    assert "recompile_limit" in limit_rows[0].note and "shapes=" in limit_rows[0].note and "mark_dynamic" in \
        limit_rows[0].note
    assert limit_rows[0].cause == RECOMPILE_LIMIT_FIX
    # the shapes compiled within the limit were judged, and passed; nothing is called a wrong result
    assert all(r.passed for r in report.results if r.check != "recompile_limit")
    assert not any(r.check == "orthogonalizer_runs" for r in report.results)


def test_a_raised_limit_holds_in_the_judge(recompile_limit):
    torch._dynamo.config.recompile_limit = 8
    report = check_orthogonalizer(_compiled(), examples=_three_shapes())
    assert report.passed, report.summary()


def test_shapes_restrict_the_inputs_and_a_compiled_kernel_passes(recompile_limit):
    report = check_orthogonalizer(_compiled(), shapes=[(24, 16)], statistical=False)
    assert report.passed, report.summary()
    shapes = {r.input.split("/")[2] for r in report.results}
    assert shapes == {"(24, 16)"}


def test_default_inputs_are_grouped_by_shape():
    examples = default_examples("float32")
    keys = [(ex.matrix.shape[-2:], ex.matrix.shape[:-2]) for ex in examples]
    seen, last = set(), None
    for key in keys:  # each shape's inputs are consecutive
        assert key == last or key not in seen
        seen.add(key)
        last = key
    picked = default_examples("float32", shapes=[(8, 5), (2, 8, 5)])
    assert {ex.matrix.shape for ex in picked} == {(8, 5), (2, 8, 5)}
    assert len(picked) == 2 * len(DEFAULT_SPECS)


@pytest.mark.parametrize("shapes", [[], [(3,)], [(0, 4)], "abc", [(2, "x")]])
def test_bad_shapes_are_rejected_before_any_work(shapes):
    calls = []
    with pytest.raises(ValueError, match="shapes"):
        check_orthogonalizer(lambda x: calls.append(x) or x, shapes=shapes)
    assert calls == []


def test_is_recompile_limit_recognizes_dynamo_errors():
    exc = getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", None)
    if exc is not None:
        assert is_recompile_limit(exc("hit config.recompile_limit (8)"))
    assert is_recompile_limit(RuntimeError("torch._dynamo hit config.cache_size_limit (8)"))
    wrapped = RuntimeError("backend failed")
    wrapped.__cause__ = RuntimeError("recompile_limit reached")
    assert is_recompile_limit(wrapped)
    assert not is_recompile_limit(RuntimeError("shape mismatch"))
