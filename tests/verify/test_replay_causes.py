"""ortho_verify.checks.replay_causes: a result reshaped instead of transposed back, and a kernel
computing in a coarser precision than declared, are named from a replay that can also say no."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import ortho_ref
from ortho_verify import check_orthogonalizer
from ortho_verify.checks.replay_causes import reshaped_cause, stored_precision
from ortho_verify.planted.bugs import newton_schulz_kernel

JORDAN = ortho_ref.schedule("jordan")


@pytest.mark.parametrize("m, n", [(9, 4), (4, 9)])
def test_reshaped_cause_says_yes_only_for_a_reshape(m, n):
    a = np.random.default_rng(0).standard_normal((m, n))
    ref = ortho_ref.ns_map(a, JORDAN)
    assert "reshaped, not transposed" in reshaped_cause(ref.T.reshape(m, n), ref)
    assert reshaped_cause(ref * 1.01, ref) == ""  # a scale is not a reshape
    assert reshaped_cause(ortho_ref.ns_map(a, JORDAN * [1, 1, 1.01]), ref) == ""


def test_stored_precision_recognizes_values_not_magnitudes():
    x = np.random.default_rng(1).standard_normal((6, 5))
    as_bf16 = torch.from_numpy(x).to(torch.bfloat16).double().numpy()
    assert stored_precision(as_bf16, "float32") == "bfloat16"
    assert stored_precision(torch.from_numpy(x).half().double().numpy(), "float32") == "float16"
    assert stored_precision(torch.from_numpy(x).float().double().numpy(), "float32") == ""  # float32 values: declared
    assert stored_precision(as_bf16, "bfloat16") == ""  # nothing coarser than declared
    assert stored_precision(np.eye(5), "float32") == ""  # fewer than 8 nonzero entries: cannot tell


@pytest.mark.parametrize("options, cause", [
    (dict(transpose_back=False), "orientation of a tall input is not undone"),
    (dict(dtype=torch.bfloat16), "computes in bfloat16 where float32 is declared"),
    (dict(coefficients=((3.4445, -4.7750, 2.0315 * 1.01),) * 5), "c x1.01"),  # a coefficient stays a coefficient
], ids=["reshaped", "bfloat16", "coefficient"])
def test_planted_torch_kernels_headline_their_cause(options, cause):
    report = check_orthogonalizer(functools.partial(newton_schulz_kernel, **options), dtype=torch.float32,
                                  shapes=[(37, 16), (12, 29)], statistical=False)
    assert report.status == "failed" and cause in report.cause, report.cause
