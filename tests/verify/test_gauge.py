"""Gauge-invariant Dion comparisons: a Dion whose QR leaves column signs free is correct and
passes; the same comparison without the alignment was a false alarm; a real error in Q is
still caught."""

import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_ref
from ortho_verify import DION, DionConventions, check_optimizer, tolerances as tol
from ortho_verify.checks.dion import never_transposed_dion_step
from ortho_verify.checks.gauge import align_column_signs, projector_distance
from ortho_verify.inputs.spectra import haar_orthogonal
from ortho_verify.planted.dion import NEVER_TRANSPOSE_CONVENTIONS, FreeSignDion


@pytest.mark.parametrize("param_dtype", [torch.float32, torch.float64], ids=str)
def test_free_sign_qr_dion_passes(param_dtype):
    report = check_optimizer(FreeSignDion, DION, param_dtype=param_dtype)
    assert report.passed, report.summary()
    flipped = [r for r in report.results if r.detail.endswith(" Q")]
    assert flipped and all("flipped)" in r.note and not r.note.startswith("0 of") for r in flipped)
    assert any(" 0 of" not in r.note for r in flipped)  # the gauge was exercised


def test_without_alignment_the_free_sign_dion_was_a_false_alarm():
    opt_p = torch.nn.Parameter(torch.tensor(0.02 * np.random.default_rng(0).standard_normal((37, 16))))
    opt = FreeSignDion([opt_p], lr=0.02, mu=0.95)
    rng = np.random.default_rng(1)
    for _ in range(2):
        before = {k: v.clone().numpy() for k, v in opt.state.get(opt_p, {}).items()}
        w_prev = opt_p.detach().clone().numpy()
        g = rng.standard_normal((37, 16))
        opt_p.grad = torch.tensor(g)
        opt.step()
    ref = ortho_ref.dion_step(w_prev, g, before["momentum"], before["Q"], lr=0.02, mu=0.95, weight_decay=0.01)
    bounds = tol.dion_tolerances(ref, before["Q"], lr=0.02, mu=0.95, weight=w_prev, dtype="float64")
    q_fast = opt.state[opt_p]["Q"].numpy()
    assert np.linalg.norm(q_fast - ref.Q) / bounds["Q"] > 1e3  # the raw comparison: a false alarm
    aligned, flipped = align_column_signs(q_fast, ref.Q)
    assert flipped > 0 and np.linalg.norm(aligned - ref.Q) <= bounds["Q"]
    assert np.linalg.norm(opt_p.detach().numpy() - ref.weight) <= bounds["weight"]  # gauge-free quantities agree


def test_a_real_error_in_q_is_still_caught():
    report = check_optimizer(functools.partial(FreeSignDion, roll_q=True), DION)
    assert report.status == "failed"
    assert any(f.result.check == "dion_vs_reference" and f.result.detail.endswith(" Q") for f in report.failures)


def test_never_transpose_orientation_and_float32_orthonormalization():
    never = functools.partial(FreeSignDion, transpose=False)
    assert check_optimizer(never, NEVER_TRANSPOSE_CONVENTIONS).passed
    wrong = check_optimizer(never, DION)  # declared min-side: a failing row, not a ValueError
    assert wrong.status == "failed" and {f.result.check for f in wrong.failures} == {"optimizer_state"}
    assert all("unexpected shape" in f.result.cause for f in wrong.failures)
    f32 = functools.partial(FreeSignDion, orthonormalize_dtype=torch.float32)
    assert not check_optimizer(f32, DION, param_dtype=torch.float64).passed
    report = check_optimizer(f32, DionConventions(orthonormalize_dtype=torch.float32), param_dtype=torch.float64)
    assert report.passed, report.summary()


def test_never_transposed_reference_is_the_min_side_step_on_tall_matrices():
    rng = np.random.default_rng(3)
    w, g, m = (rng.standard_normal((9, 5)) for _ in range(3))
    q = rng.standard_normal((5, 3))
    a, b = never_transposed_dion_step(w, g, m, q, lr=0.1), ortho_ref.dion_step(w, g, m, q, lr=0.1)
    assert np.allclose(a.weight, b.weight, atol=1e-13) and np.allclose(a.Q, b.Q, atol=1e-13)
    with pytest.raises(ValueError, match="Q"):
        never_transposed_dion_step(w.T, g.T, m.T, q, lr=0.1)


@settings(deadline=None)
@given(st.integers(1, 12), st.integers(0, 2**31 - 1))
def test_sign_alignment_and_projector_are_gauge_invariant(r, seed):
    rng = np.random.default_rng(seed)
    k = r + int(rng.integers(0, 6))
    f = haar_orthogonal(k, rng)[:, :r]
    signs = rng.choice([-1.0, 1.0], r)
    aligned, flipped = align_column_signs(f * signs, f)
    assert np.array_equal(aligned, f) and flipped == int(np.sum(signs < 0))
    rotation = haar_orthogonal(r, rng)
    assert projector_distance(f @ rotation, f) <= 1e-13 * max(1, r)
    assert projector_distance(haar_orthogonal(k, rng)[:, :r], f) >= 0
    with pytest.raises(ValueError, match="fast"):
        align_column_signs(f[:, :0], f)
