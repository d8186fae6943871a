"""ortho_verify.checks: correct implementations pass, planted bugs are caught."""

import importlib

import numpy as np
import pytest
import torch

import ortho_fast
import ortho_fast.functional.dion as fast_dion  # patch points: dion_apply, right_factor_block
import ortho_fast.functional.layout as fast_layout  # muon_layout
import ortho_fast.functional.muon as fast_muon  # patch points: orthogonalize, adjusted_lr_scale
import ortho_fast.functional.qr as fast_qr  # patch point: cholesky_solve
from ortho_verify import checks
from ortho_verify.inputs.spectra import MatrixCase, matrix_with_spectrum

fast_ns = importlib.import_module("ortho_fast.functional.newton_schulz")  # the module, not the function of that name

_real_ns = fast_ns.newton_schulz  # the unpatched function


def _case(m, n, cond=1e2, seed=0):
    s = np.geomspace(1.0, 1.0 / cond, min(m, n))
    return MatrixCase(f"test/{m}x{n}", matrix_with_spectrum(s, m, n, np.random.default_rng(seed)), "synthetic", "test")


CASES = [_case(24, 16), _case(16, 40, cond=1e4), _case(20, 20, cond=10)]


def _all_pass(results):
    return all(r.passed for r in results) and len(results) > 0


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_correct_implementations_pass(case):
    results = checks.check_coefficient_registries()
    for sched in ortho_fast.COEFFICIENTS:
        for dtype in ("float64", "float32", "bfloat16"):
            results += checks.check_newton_schulz(case, sched, dtype)
    for cfg in checks.MUON_CONFIGS:
        results += checks.check_muon(case, cfg, "float64")
    results += checks.check_muon_layouts(case, "float32")
    results += checks.check_dion(case, 0.5, "float64") + checks.check_dion(case, 1.0, "float32")
    variants = [r for v in checks.DION_VARIANTS for r in checks.check_dion(case, 0.5, "float64", v)]
    variants += checks.check_dion(case, 0.5, "bfloat16", "householder", "float32")
    assert all(not r.note.startswith("ill-posed") for r in variants)  # compared, not only marked ill-posed
    results += variants + checks.check_torch_muon(case)
    failed = [r for r in results if not r.passed]
    assert not failed, failed
    layouts = {r.detail for r in results if r.check == "muon_layout_vs_reference"}
    assert len(layouts) == (4 if case.matrix.shape[0] % 3 == 0 else 2)  # (qkv,) banks x (weight, momentum)


def test_wrong_coefficient_is_caught(monkeypatch):
    bad = ortho_fast.CoefficientSchedule("jordan", (), (3.4445, -4.7750, 2.0415), 5, 1.0, 1e-7, "typo")
    monkeypatch.setitem(ortho_fast.COEFFICIENTS, "jordan", bad)
    assert not _all_pass(checks.check_coefficient_registries())
    assert not checks.check_newton_schulz(CASES[0], "jordan", "float32")[0].passed


def test_missing_step_is_caught(monkeypatch):
    real = fast_ns.resolve_coefficients
    monkeypatch.setattr(fast_ns, "resolve_coefficients", lambda c, steps=None: real(c, steps)[:-1])
    assert not checks.check_newton_schulz(CASES[0], "polar_express", "float64")[0].passed


def _ns_max_norm(g, coefficients="jordan", *, steps=None, safety=1.0, eps=1e-7, dtype=torch.bfloat16, **_):
    """Newton–Schulz with the input divided by max |g| instead of ‖g‖_F (planted bug)."""
    x = (g / (safety * g.abs().amax() + eps)).to(dtype)
    tall = x.shape[0] > x.shape[1]
    x = x.mT if tall else x
    for a, b, c in fast_ns.resolve_coefficients(coefficients, steps):
        x = fast_ns.quintic_step(x, a, b, c)
    return (x.mT if tall else x).to(g.dtype)


def test_max_norm_instead_of_frobenius_is_caught(monkeypatch):
    monkeypatch.setattr(ortho_fast, "newton_schulz", _ns_max_norm)
    assert not checks.check_newton_schulz(CASES[2], "jordan", "float64")[0].passed


def test_bf16_where_float32_declared_is_caught(monkeypatch):
    monkeypatch.setattr(ortho_fast, "newton_schulz",
                        lambda g, c="jordan", **k: _real_ns(g, c, **{**k, "dtype": torch.bfloat16}))
    assert not checks.check_newton_schulz(CASES[2], "jordan", "float32")[0].passed


def test_wrong_error_feedback_sign_is_caught(monkeypatch):
    real = fast_dion.dion_apply  # the one Dion step behind dion_update, the optimizer and its sharded form
    monkeypatch.setattr(fast_dion, "dion_apply", lambda *a, mu, **k: real(*a, mu=2.0 - mu, **k))
    results = checks.check_dion(CASES[0], 0.5, "float64")
    assert not next(r for r in results if r.check == "dion_vs_reference" and "momentum" in r.detail).passed
    assert not next(r for r in results if r.check == "dion_error_feedback").passed


def test_wrong_lr_mode_is_caught(monkeypatch):
    real = fast_muon.adjusted_lr_scale
    monkeypatch.setattr(fast_muon, "adjusted_lr_scale", lambda mode, m, n: real("spectral_norm", m, n))
    # wide case: "original" gives √max(1, m/n) = 1, "spectral_norm" √(m/n) < 1
    assert not checks.check_muon(CASES[1], "torch.optim.Muon", "float64")[0].passed


def test_torch_parity_detects_a_different_eps_mode(monkeypatch):
    real = ortho_fast.Muon
    monkeypatch.setattr(ortho_fast, "Muon", lambda params, **k: real(params, **{**k, "eps_mode": "add", "eps": 1e-3}))
    assert not checks.check_torch_muon(CASES[0])[0].passed


def test_bf16_missing_step_on_ill_conditioned_input_is_caught_per_direction(monkeypatch):
    # cond 1e6: the sorted (Weyl) bf16 comparison is not sharp here, the per-direction one is.
    case = _case(48, 32, cond=1e6, seed=3)
    real = fast_ns.resolve_coefficients
    monkeypatch.setattr(fast_ns, "resolve_coefficients", lambda c, steps=None: real(c, steps)[:-1])
    results = {r.check: r for r in checks.check_newton_schulz(case, "jordan", "bfloat16")}
    assert not results["ns_projected_singular_values"].passed
    assert results["ns_vs_ns_map"].note  # the sorted comparison says it is not sharp


def _muon_with(monkeypatch, **forced):
    """Plant a bug: ortho_fast.Muon built with ``forced`` options whatever the check asks."""
    real = ortho_fast.Muon
    monkeypatch.setattr(ortho_fast, "Muon", lambda params, **k: real(params, **{**k, **forced}))


def _weight_row(results):
    return next(r for r in results if r.detail.endswith(" weight"))


@pytest.mark.parametrize("config, forced, dtype", [
    ("nanochat (cautious wd)", {"cautious_weight_decay": False}, "float32"),
    ("Megatron", {"extra_scale_factor": 1.0}, "float32"),
    ("Megatron", {"eps_mode": "add"}, "float64"),
], ids=["cautious-wd-ignored", "extra-scale-factor-ignored", "add-eps-where-clamp"])
def test_muon_option_bugs_are_caught(monkeypatch, config, forced, dtype):
    assert _weight_row(checks.check_muon(CASES[0], config, dtype)).passed
    _muon_with(monkeypatch, **forced)
    assert not _weight_row(checks.check_muon(CASES[0], config, dtype)).passed


def test_muon_heads_not_split_is_caught(monkeypatch):
    real = fast_layout.muon_layout
    monkeypatch.setattr(fast_layout, "muon_layout", lambda shape, **k: real(shape, **{**k, "num_heads": None}))
    rows = {r.detail.split(" ", 1)[1]: r for r in checks.check_muon_layouts(CASES[0], "float32")}
    assert not rows["qkv 3x4 heads weight"].passed and rows["banks weight"].passed


def test_muon_banks_in_the_wrong_order_are_caught(monkeypatch):
    real = fast_muon.orthogonalize

    def rotated(mats, table, **kw):  # planted: the banked outputs go to the next parameter
        out = real(mats, table, **kw)
        return out[1:] + out[:1] if kw["banks"] else out

    monkeypatch.setattr(fast_muon, "orthogonalize", rotated)
    rows = {r.detail.split(" ", 1)[1]: r for r in checks.check_muon_layouts(CASES[1], "float32")}
    assert not rows["banks weight"].passed


def _dion_q_row(results):
    return next(r for r in results if r.detail.endswith(" Q"))


def test_dion_right_factor_swapped_is_caught(monkeypatch):
    real = fast_dion.right_factor_block  # behind dion_right_factor and every Dion step
    swap = {"qr": "column_norm", "column_norm": "qr"}
    monkeypatch.setattr(fast_dion, "right_factor_block", lambda r, rf, eps, *a: real(r, swap[rf], eps, *a))
    assert not _dion_q_row(checks.check_dion(CASES[0], 0.5, "float64", "orth_dion")).passed


@pytest.mark.parametrize("variant, dtypes, forced", [
    ("power_iters_2", ("float64", None), {"power_iters": 1}),
    ("householder", ("bfloat16", "float32"), {"momentum_dtype": torch.bfloat16, "q_dtype": torch.bfloat16}),
], ids=["power-iteration-skipped", "state-in-parameter-dtype"])
def test_dion_option_bugs_are_caught(monkeypatch, variant, dtypes, forced):
    real = ortho_fast.Dion
    monkeypatch.setattr(ortho_fast, "Dion", lambda params, **k: real(params, **{**k, **forced}))
    assert not _all_pass(checks.check_dion(CASES[0], 0.5, *dtypes[:1], variant, dtypes[1]))


def test_randomized_cholesky_qr_without_its_cholesky_pass_is_caught(monkeypatch):
    # P = Y R_s^-1 (the sketch's preconditioned Y) is not orthonormal: off by O(kappa(Y R_s^-1) - 1)
    assert _all_pass(checks.check_dion(CASES[0], 0.5, "float64", "randomized_cholesky_qr"))
    monkeypatch.setattr(fast_qr, "cholesky_solve", lambda y, *a, **k: y)  # no Cholesky pass
    assert not _all_pass(checks.check_dion(CASES[0], 0.5, "float64", "randomized_cholesky_qr"))


def test_rows_without_a_claim_are_not_evidence():
    assert checks.measured("c", "i", "d", 0.5, 1.0).status == "pass"
    assert checks.measured("c", "i", "d", 2.0, 1.0).status == "fail"
    assert checks.measured("c", "i", "d", 0.5, np.inf).status == "no claim"  # an infinite bound claims nothing
    assert checks.measured("c", "i", "d", 0.5, 1.0, informative=False).status == "no claim"
    failed = checks.measured("c", "i", "d", 2.0, 1.0, informative=False)
    assert failed.status == "fail" and failed.claimed  # a violation is evidence whatever the tolerance
    skipped = checks.no_claim("c", "i", "d", "ill-posed")
    assert skipped.status == "no claim" and skipped.ratio == 0 and skipped.as_dict()["status"] == "no claim"


def test_verdict_needs_a_claim_in_every_check():
    claim, vacuous = checks.measured("a", "x", "d", 0.1, 1.0), checks.no_claim("b", "x", "d", "ill-posed")
    assert checks.verdict([claim]) == ("passed", [])
    status, reasons = checks.verdict([claim, vacuous, checks.no_claim("b", "y", "d", "ill-posed")])
    assert status == "inconclusive" and len(reasons) == 1 and reasons[0].startswith("b: no claim on any of its 2 rows")
    assert checks.verdict([claim, vacuous, checks.measured("b", "y", "d", 0.1, 1.0)])[0] == "passed"
    assert checks.verdict([vacuous, checks.measured("a", "x", "d", 2.0, 1.0)])[0] == "failed"
    assert checks.verdict([]) == ("inconclusive", ["no check was run"])
