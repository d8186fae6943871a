"""Bad input to the oracle (``ortho_ref``) and the judge (``ortho_verify``): a clear error naming the
argument and what was expected, raised before any work (the messages that named nothing)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ortho_fast
import ortho_ref
import ortho_verify
from ortho_verify.checks.optimizer_checks import check_optimizer

JORDAN = [(3.4445, -4.7750, 2.0315)]


@pytest.mark.parametrize("call", [lambda a: ortho_ref.ns_map(a, JORDAN), ortho_ref.polar, ortho_ref.singular_values])
@pytest.mark.parametrize("bad, error, match", [
    ([[1.0, 2.0], [3.0]], ValueError, r"^a: expected a real floating-point \(m, n\) array .*ragged"),
    (torch.ones(3, 3, dtype=torch.bfloat16), TypeError, r"^a: expected .*torch\.bfloat16 tensor.*a\.float\(\)"),
    (np.ones((3, 3), dtype=np.int64), TypeError, r"^a: expected a real floating-point array"),
    (np.ones(3), ValueError, r"^a: expected a 2-D array"),
])
def test_the_oracle_names_its_argument(call, bad, error, match):
    with pytest.raises(error, match=match):
        call(bad)


@pytest.mark.parametrize("bad, error",
                         [([(1, 2, 3), (4, 5)], ValueError), (torch.ones(2, 3, dtype=torch.bfloat16), TypeError),
                                        ([["a", "b", "c"]], ValueError)])
def test_the_oracle_names_a_bad_coefficient_table(bad, error):
    with pytest.raises(error, match=r"^coefficients: expected a \(T, 3\) table"):
        ortho_ref.ns_map(np.eye(3), bad)


@pytest.mark.parametrize("fn", [None, 3, "newton_schulz"])
def test_check_orthogonalizer_needs_a_callable(fn):
    with pytest.raises(TypeError, match=r"^fn: expected a callable"):
        ortho_verify.check_orthogonalizer(fn)


@pytest.mark.parametrize("kwargs, match", [
    (dict(shapes=[(3,)]), r"^shapes: expected \(m, n\) pairs"), (dict(shapes=[]), r"^shapes: expected at least one"),
    (dict(shapes=[(0, 3)]), r"^shapes: expected \(m, n\) pairs"), (dict(shapes=[(2.5, 3)]), r"^shapes"),
    (dict(shapes=5), r"^shapes: expected a sequence"), (dict(cond=0), r"^cond: expected a finite condition number"),
    (dict(cond=float("nan")), r"^cond"), (dict(cond=0.5), r"^cond"),
])
def test_check_optimizer_names_shapes_and_cond_before_any_work(kwargs, match):
    calls = []

    def factory(params, **kw):
        calls.append(1)
        return ortho_fast.Muon(params, **kw)

    with pytest.raises(ValueError, match=match):
        check_optimizer(factory, steps=1, param_dtype=torch.float32, **kwargs)
    assert calls == []


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "soon"])
def test_sharding_timeout_must_be_positive_before_launching(value, capsys):
    from ortho_verify.sharding.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--timeout", value])
    assert exit_info.value.code == 2
    assert "--timeout" in capsys.readouterr().err
