"""A first ``ortho-verify`` run trains the GPT in a second process while it checks the synthetic
inputs (``ortho_verify.inputs.data.capture_in_background``): the child writes the same cache an in-process
run writes, and the report is the one of a run in plan order."""

from __future__ import annotations

import numpy as np

from ortho_verify.cli import main as cli
from ortho_verify.inputs import data
from ortho_verify.inputs.data import GPTConfig, capture_in_background, real_gradients
from ortho_verify.inputs.spectra import MatrixCase, synthetic_matrices
from ortho_verify.report.results import CheckResult

TINY = GPTConfig(d_model=16, n_layers=1, n_heads=2, context=16, batch_size=4, steps=4, capture_steps=(2, 4),
                 corpus_bytes=4096)


def test_background_child_writes_the_cache_an_in_process_run_writes(tmp_path):
    proc = capture_in_background(config=TINY, cache_dir=tmp_path / "a", seed=3)
    assert proc is not None
    proc.join(120)
    assert proc.exitcode == 0
    assert capture_in_background(config=TINY, cache_dir=tmp_path / "a", seed=3) is None  # cached now
    loaded = real_gradients(quick=False, config=TINY, cache_dir=tmp_path / "a", seed=3)
    assert data.last_run_info()["from_cache"]
    trained = real_gradients(quick=False, config=TINY, cache_dir=tmp_path / "b", seed=3)
    assert not data.last_run_info()["from_cache"]
    assert [c.name for c in loaded] == [c.name for c in trained]
    assert all(np.array_equal(a.matrix, b.matrix) for a, b in zip(loaded, trained))


class _Finished:
    exitcode = 0

    def join(self, timeout=None):
        return None


def _plan(ran):
    """A plan like ``cli.plan_jobs``: a case-independent job, one job per case, another
    case-independent job; each row names its label, ``ran`` counts the calls per label."""
    def job(label):
        def run():
            ran[label] = ran.get(label, 0) + 1
            return [CheckResult("c", label, "d", 0.1, 1.0, True)]
        return label, run

    return lambda cases, quick, rec: ([job("first")] + [job(f"per case {c.name}") for c in cases] + [job("last")])


def _rows(tmp_path, monkeypatch, background):
    ran: dict = {}
    real = synthetic_matrices(quick=True, seed=1)[:2]
    real = [MatrixCase(f"gpt/step1/{i}", c.matrix, "real", "fake") for i, c in enumerate(real)]
    monkeypatch.setattr(cli, "plan_jobs", _plan(ran))
    monkeypatch.setattr(data, "capture_in_background", lambda **kw: background)
    monkeypatch.setattr(data, "real_gradients", lambda **kw: list(real))
    monkeypatch.setattr(data, "last_run_info", lambda: {"from_cache": True})
    args = cli.build_parser().parse_args(["--quick", "--no-plots", "--out", str(tmp_path)])
    cases, results, info = cli.collect(args, cli.report.make_console(), {}, timing := {})
    return [r.input for r in results], ran, info, timing


def test_overlapped_run_reports_in_plan_order_and_runs_each_job_once(tmp_path, monkeypatch):
    sequential, ran_seq, info_seq, _ = _rows(tmp_path, monkeypatch, None)
    overlapped, ran, info, timing = _rows(tmp_path, monkeypatch, _Finished())
    assert overlapped == sequential and sequential[0] == "first" and sequential[-1] == "last"
    assert set(ran.values()) == {1} and ran.keys() == ran_seq.keys()  # the synthetic jobs ran once, early
    assert info["trained_in_background"] and not info["from_cache"] and "trained_in_background" not in info_seq
    assert any(k.startswith("real gradients (second process") for k in timing["phases"])
    assert abs(sum(timing["checks"].values()) - timing["phases"]["checks"]) < 0.5
