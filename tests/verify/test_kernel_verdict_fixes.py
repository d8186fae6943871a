"""Verdicts of ``check_orthogonalizer`` on failures that were reported in the wrong words: a recompile
limit is its own kind, a library frame is never the user's, a failure confined to one orientation or one
number of batch dims says so, no infinite ratio in the report's lines, a cause whenever something failed,
and bad inputs (a kernel calling sys.exit, a tensor as ``examples``) get clear rows / errors."""

from __future__ import annotations

import functools
import sys

import pytest
import torch

from ortho_verify import check_orthogonalizer
from ortho_verify.checks.kernel_calls import raised_row
from ortho_verify.inputs.examples import build_example
from ortho_verify.kinds import FAILURE_KINDS, failure_kind, user_frame
from ortho_verify.planted.bugs import newton_schulz_kernel
from tests.load_file import load_file

FAST = dict(statistical=False)


def test_recompile_limit_is_its_own_kind_not_wrong_math():
    class FailOnRecompileLimitHit(RuntimeError):
        pass

    row = raised_row(FailOnRecompileLimitHit("hit config.recompile_limit (8)"), torch.zeros(3, 4), "x", "fn(input)")
    assert row.check == "recompile_limit" and not row.passed
    assert "recompile limit" in FAILURE_KINDS and failure_kind(row) == "recompile limit"


def _library_module(tmp_path, package: str):
    """A module in a folder named like an installed library (``<tmp>/lib/<package>/site-packages/...``) whose
    function raises."""
    folder = tmp_path / package / "site-packages" / "fakelib"
    folder.mkdir(parents=True)
    (folder / "engine.py").write_text("def render(x):\n    raise RuntimeError('inside the library')\n\n\n"
                                      "def caught():\n    try:\n        render(1)\n    except RuntimeError as err:\n"
                                      "        return err\n")
    return load_file(folder / "engine.py", "fakelib_engine")


def test_a_frame_inside_an_installed_library_is_never_the_users(tmp_path):
    lib = _library_module(tmp_path, "jinja")

    def users_kernel(x):
        return lib.render(x)

    with pytest.raises(RuntimeError) as err:
        users_kernel(1)
    frame = user_frame(err.value)
    assert "site-packages" not in frame and frame.endswith("in users_kernel")
    only_library = lib.caught()  # raised and caught inside the library: no frame of the user's
    assert user_frame(only_library) == ""
    row = raised_row(only_library, torch.zeros(3, 4), "x", "fn(input)")
    assert "site-packages" not in row.note and "installed library" in row.note


def test_tall_only_failure_says_so_in_the_cause():
    report = check_orthogonalizer(functools.partial(newton_schulz_kernel, transpose_back=False), **FAST)
    assert report.cause.startswith("only tall inputs fail"), report.cause
    assert "coefficient" not in report.cause


def test_failure_on_one_number_of_batch_dims_says_so_in_the_cause():
    def swapped(g):
        if g.ndim == 4:
            return newton_schulz_kernel(g.transpose(0, 1).contiguous())
        return newton_schulz_kernel(g)

    report = check_orthogonalizer(swapped, **FAST)
    assert not report.passed
    assert report.cause.startswith("only inputs with 2 batch dims fail"), report.cause


def test_never_transposed_back_shows_no_inf_and_accepted_rows_show_no_inf():
    def never_back(g):
        return newton_schulz_kernel(g.mT if g.shape[-2] > g.shape[-1] else g)

    text = check_orthogonalizer(never_back, **FAST).summary()
    head, per_check = text.splitlines()[0], text.split("worst case per check:")[1].split("failures")[0]
    assert "inf" not in head and "inf" not in per_check, text

    def writes_input(g):
        out = newton_schulz_kernel(g)
        g.mul_(0.5)
        return out

    accepted = check_orthogonalizer(writes_input, allow_side_effects={"input_mutated"}, **FAST)
    assert accepted.passed
    lines = accepted.summary().split("worst case per check:")[1]
    assert "inf" not in lines and "input_unchanged: accepted" in lines


def test_cause_is_never_empty_when_only_runs_failed():
    def no_batches(g):
        if g.ndim > 2:
            raise RuntimeError("batches are not supported")
        return newton_schulz_kernel(g)

    report = check_orthogonalizer(no_batches, **FAST)
    assert {r.check for r in report.results if not r.passed} == {"orthogonalizer_runs"}
    assert report.cause.startswith("orthogonalizer_runs failed (unsupported)"), report.cause


def test_a_kernel_calling_sys_exit_fails_a_row_instead_of_crashing_the_judge():
    def exits(g):
        sys.exit(3)

    report = check_orthogonalizer(exits, examples=[build_example("geometric", {"log_cond": 1.0}, shape=(6, 9))])
    (row,) = [r for r in report.results if not r.passed]
    assert row.check == "orthogonalizer_runs" and "SystemExit" in row.note
    one = [build_example("geometric", {"log_cond": 1.0}, shape=(6, 9))]
    report = check_orthogonalizer(exits, timeout_s=None, examples=one)
    assert any("SystemExit" in r.note for r in report.results)


@pytest.mark.parametrize("examples", [[torch.randn(6, 9)], torch.randn(6, 9)])
def test_examples_of_the_wrong_type_get_a_type_error_naming_examples(examples):
    with pytest.raises(TypeError, match="examples: expected a list of ortho_verify.inputs.examples.SpectralExample"):
        check_orthogonalizer(newton_schulz_kernel, examples=examples)
