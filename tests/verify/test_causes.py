"""One ranked cause per failure: from evidence that separates the candidates, never a
list of every possibility, and never decided by a 1x1 or degenerate input."""

import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_ref
from ortho_verify import check_optimizer, check_orthogonalizer
from ortho_verify.checks.diagnoses import headline_cause, lr_scale_pair, map_fit_cause, ns_output_cause
from ortho_verify.planted.bugs import newton_schulz_kernel
from ortho_verify.planted.muon import TORCH_STYLE_CONVENTIONS, TorchStyleMuon, planted
from ortho_verify.report.results import CheckResult

JORDAN = ortho_ref.schedule("jordan")
FAST = dict(steps=2, statistical_matrices=0, param_dtype=torch.float32)


def test_coefficient_b_off_by_1pct_fp32_headlines_the_coefficient_not_a_1x1_scale():
    fn = functools.partial(newton_schulz_kernel, coefficients=((3.4445, -4.7750 * 1.01, 2.0315),) * 5)
    report = check_orthogonalizer(fn, dtype=torch.float32, statistical=False)
    assert report.status == "failed"
    assert "coefficient" in report.cause and "b x1.01" in report.cause, report.cause
    assert "constant factor" not in report.cause
    # no row on a 1x1 input carries a cause: any output is a multiple of the reference there
    for f in report.failures:
        if "(1, 1)" in f.result.input:
            assert f.result.cause == ""


def test_degenerate_inputs_give_no_cause():
    a = np.array([[2.0]])
    assert ns_output_cause(0.9 * ortho_ref.ns_map(a, JORDAN), a, JORDAN, safety=1.0, eps=1e-7, eps_mode="add",
                           tolerance=1e-9) == ""
    flat = np.eye(4)[:, :3]  # every singular value equal: a scale and a coefficient cannot be told apart
    assert ns_output_cause(0.9 * ortho_ref.ns_map(flat, JORDAN), flat, JORDAN, safety=1.0, eps=1e-7, eps_mode="add",
                           tolerance=1e-9) == ""


@settings(deadline=None)
@given(which=st.sampled_from([0, 1, 2]), rel=st.sampled_from([-0.01, 0.005, 0.02]))
def test_map_fit_names_the_coefficient_it_was_given(which, rel):
    x = np.geomspace(1.0, 0.1, 12)
    t = JORDAN.copy()
    t[:, which] *= 1 + rel
    d = ortho_ref.ns_polynomial(x, t) - ortho_ref.ns_polynomial(x, JORDAN)
    cause = map_fit_cause(d, x, JORDAN)
    assert "coefficient" in cause and f"{'abc'[which]} x" in cause, cause


def test_map_fit_separates_scale_from_normalization_and_refuses_noise():
    x = np.geomspace(1.0, 0.1, 12)
    f = ortho_ref.ns_polynomial(x, JORDAN)
    assert "constant factor 0.97" in map_fit_cause(-0.03 * f, x, JORDAN)
    d = ortho_ref.ns_polynomial(x / 1.01, JORDAN) - f
    assert "normalized by another scale" in map_fit_cause(d, x, JORDAN)
    rng = np.random.default_rng(0)
    assert map_fit_cause(rng.standard_normal(12) * 1e-3, x, JORDAN) == ""  # nothing explains noise


def test_wrong_lr_scale_names_one_pair_without_aliases():
    m, n = 40, 24
    s = ortho_ref.lr_scale("match_rms_adamw", m, n) / ortho_ref.lr_scale("original", m, n)
    pair = lr_scale_pair(s, m, n)
    assert pair == "match_rms_adamw where original is declared"
    assert "shape_scaling" not in pair and " or " not in pair
    report = check_optimizer(*_swap(planted("lr scale match_rms_adamw for original")), **FAST)
    causes = {f.result.cause for f in report.failures if f.result.cause}
    assert causes and all(" or " not in c and "shape_scaling" not in c and "unit_rms_norm" not in c for c in causes)
    assert any("match_rms_adamw where original is declared" in c for c in causes), causes


def _swap(pair):
    return pair[0], pair[1]


def test_nesterov_as_g_plus_mu_buf_gets_one_consistent_diagnosis():
    factory, conv = planted("Nesterov as g + mu*buf")
    report = check_optimizer(factory, conv, **FAST)
    update_causes = {f.result.cause for f in report.failures if f.result.check.startswith("muon_update")}
    assert len(update_causes) == 1, update_causes
    assert "G + mu*M on the EMA buffer" in update_causes.pop()
    assert all(f.result.check != "muon_momentum" for f in report.failures)  # the buffer itself is right


@pytest.mark.parametrize("plant, expected", [
    ("NorMuon as Muon", "per-row rescale"),
    ("eps added, clamp declared", "eps_mode 'add'"),
    ("Nesterov as g + mu*buf", "G + mu*M"),
    ("coefficient b off by 1%", "coefficient"),
])
def test_bf16_statistical_failures_name_one_cause(plant, expected):
    factory, conv = planted(plant)
    report = check_optimizer(factory, conv, param_dtype=torch.bfloat16, shapes=((4, 2),), steps=2,
                             statistical_matrices=32)
    [row] = [r for r in report.results if r.check == "optimizer_mean_deviation"]
    assert row.check == "optimizer_mean_deviation" and not row.passed
    assert expected in row.cause, row.cause
    assert " or " not in row.cause.split(" (")[0]  # one cause, not a list


def test_headline_ignores_degenerate_rows():
    rows = [CheckResult("x", "geometric/square/(1, 1)", "", 5.0, 1.0, False, cause="constant factor",
                        extra={"degenerate": True}),
            CheckResult("x", "a", "", 2.0, 1.0, False, cause="coefficient b"),
            CheckResult("x", "b", "", 2.0, 1.0, False, cause="coefficient b")]
    assert headline_cause(rows) == "coefficient b"
    assert headline_cause(rows[:1]) == "constant factor"  # only a degenerate one: still said, for want of another
    assert headline_cause([CheckResult("x", "a", "", 0.5, 1.0, True)]) == ""


def test_correct_torch_style_muon_passes_with_no_cause():
    report = check_optimizer(TorchStyleMuon, TORCH_STYLE_CONVENTIONS, **FAST)
    assert report.passed and report.cause == ""


def test_bf16_kernel_statistics_name_one_cause_not_every_possibility():
    from ortho_verify.api import check_orthogonalizer_statistics
    from ortho_verify.checks.statistical import statistical_batch

    fn = functools.partial(newton_schulz_kernel, coefficients=((3.4445, -4.7750 * 1.01, 2.0315),) * 5,
                           dtype=torch.bfloat16)
    [row] = check_orthogonalizer_statistics(fn, statistical_batch(1.0, (40, 24), None, 64, "bfloat16", 1000),
                                            dtype=torch.bfloat16)
    assert not row.passed
    assert row.cause.startswith("a Newton–Schulz coefficient differs"), row.cause
    assert "eps_mode" not in row.cause and "coarser" not in row.cause and "step count" not in row.cause
