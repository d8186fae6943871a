"""``ortho_verify.replay_example``: a failure of a report replayed from its provenance gives the
same row (check, input, error, tolerance); docs/verification.md, "Replaying a failure"."""

from __future__ import annotations

import functools

import pytest
import torch

import ortho_fast
import ortho_verify
from ortho_verify import MuonConventions, check_optimizer, check_orthogonalizer
from ortho_verify.api import REPLAY_HINT
from ortho_verify.planted.bugs import SimpleMuon, newton_schulz_kernel
from ortho_verify.replay import replay_example
from ortho_verify.strategies import build_example

CASES = [build_example("geometric", {"log_cond": 1.0}, shape=(2, 12, 8), dtype="float32", seed=4)]


def _same(replayed, failure):
    [row] = [r for r in replayed if r.check == failure.result.check and r.input == failure.result.input]
    assert (row.error, row.tolerance, row.passed) == (failure.result.error, failure.result.tolerance, False)


def test_public_name_and_hint():
    assert ortho_verify.replay_example is replay_example
    report = check_orthogonalizer(functools.partial(newton_schulz_kernel, coefficients=((3.4445, 4.7750, 2.0315),) * 5),
                                  dtype=torch.float32, examples=CASES)
    assert report.failures and all(f.provenance.endswith(REPLAY_HINT) for f in report.failures)
    assert "ortho_verify.replay_example" in report.summary()
    for failure in report.failures[:3]:  # a batched example: one matrix of it
        _same(replay_example(report_kernel(), failure, dtype=torch.float32), failure)


def report_kernel():
    return functools.partial(newton_schulz_kernel, coefficients=((3.4445, 4.7750, 2.0315),) * 5)


def test_statistical_failure_replays():
    def kernel(g):
        return ortho_fast.newton_schulz(g, [[3.4445, -4.7750, 2.0415]] * 5, dtype=torch.bfloat16)

    report = check_orthogonalizer(kernel, dtype=torch.bfloat16)
    [failure, *_] = [f for f in report.failures if f.result.check == "ns_mean_deviation"]
    _same(replay_example(kernel, failure, dtype=torch.bfloat16), failure)
    by_string = replay_example(kernel, failure.provenance, check="ns_mean_deviation")
    assert [r.error for r in by_string] == [failure.result.error]


def test_optimizer_failure_replays():
    conventions = MuonConventions(ns_dtype=torch.float32)
    optimizer = functools.partial(SimpleMuon, nesterov=False)
    report = check_optimizer(optimizer, conventions, steps=2)
    failure = report.failures[0]
    _same(replay_example(optimizer, failure, conventions=conventions), failure)


@pytest.mark.parametrize("bad", ["__import__('os').system('true')", "ortho_verify.api.optimizer_inputs(x, 1, 2, 3)",
                                 "not a call ("])
def test_other_provenance_is_refused(bad):
    with pytest.raises(ValueError, match="provenance"):
        replay_example(lambda g: g, bad)
