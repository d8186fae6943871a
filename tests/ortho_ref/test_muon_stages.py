"""The oracle's Muon pipeline stages (ortho_ref.muon_stages) and their composition (muon_pipeline_step):
the defining properties of MuonEq, Muon+ and NorMuon, checked on drawn matrices, and bad input."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ortho_ref
from ortho_ref import muon_stages as stages
from ortho_ref.muon import muon_pipeline_step
from ortho_verify.strategies import spectral_matrices
from ortho_verify.tolerances.stages import equilibration_error, scaling_error


def _full_rank(a):
    return (np.all(np.linalg.norm(a, axis=1) > stages.NORM_FLOOR)
            and np.all(np.linalg.norm(a, axis=0) > stages.NORM_FLOOR))


@settings(deadline=None, max_examples=40)
@given(spectral_matrices(max_dim=24, max_cond=1e3, rank_deficient=False), st.sampled_from(stages.EQUILIBRATION_SIDES))
def test_equilibrate_equal_row_norms_and_same_frobenius(drawn, side):
    a, _ = drawn
    if not _full_rank(a):
        return
    out = stages.equilibrate(a, side)
    axis = 1 if side == "row" else 0
    norms = np.linalg.norm(out, axis=axis)
    count = a.shape[0] if side == "row" else a.shape[1]
    target = np.linalg.norm(a) / math.sqrt(count)
    tol = equilibration_error(a.shape, "float64", side)
    assert np.max(np.abs(norms - target)) <= 2 * tol * target  # each norm: the scaled row's error + its own rounding
    assert abs(np.linalg.norm(out) - np.linalg.norm(a)) <= 2 * tol * np.linalg.norm(a)
    # a row scaling: every row keeps its direction
    lead = a / np.linalg.norm(a, axis=axis, keepdims=True)
    assert np.linalg.norm(out / np.linalg.norm(out, axis=axis, keepdims=True) - lead) <= 2 * tol * math.sqrt(count)


def test_equilibrate_column_is_the_transpose():
    a = np.random.default_rng(1).standard_normal((5, 7))
    assert np.array_equal(stages.equilibrate(a, "column"), stages.equilibrate(a.T, "row").T)


@settings(deadline=None, max_examples=40)
@given(spectral_matrices(max_dim=24, max_cond=1e3))
def test_renormalize_sets_the_frobenius_norm(drawn):
    a, s = drawn
    out = stages.renormalize(a)
    c = math.sqrt(min(a.shape))
    if np.linalg.norm(a) >= stages.NORM_FLOOR:
        assert abs(np.linalg.norm(out) - c) <= 2 * scaling_error(a.size, "float64") * c
    # the same direction: out is a positive multiple of a
    k = float(np.vdot(out, a)) / float(np.vdot(a, a))
    assert k > 0 and np.linalg.norm(out - k * a) <= 2 * scaling_error(a.size, "float64") * np.linalg.norm(out)


@settings(deadline=None, max_examples=40)
@given(spectral_matrices(max_dim=24, max_cond=1e3, rank_deficient=False), st.sampled_from(stages.NORMUON_DIMS),
       st.sampled_from(stages.NORMUON_EPS_MODES), st.floats(0.0, 0.99))
def test_normuon_keeps_the_norm_and_updates_the_ema(drawn, dim, eps_mode, beta2):
    a, _ = drawn
    m, n = a.shape
    rng = np.random.default_rng(0)
    v0 = rng.random(stages.normuon_variance_shape(m, n, dim)) * np.mean(a * a)
    out, v = stages.normuon_normalize(a, v0, beta2=beta2, eps=1e-12, eps_mode=eps_mode, dim=dim)
    rows = stages.normuon_side(m, n, dim) == "row"
    mean_square = np.mean(a * a, axis=1 if rows else 0, keepdims=True)
    count = n if rows else m
    assert np.allclose(v, beta2 * v0 + (1 - beta2) * mean_square, rtol=scaling_error(count, "float64"), atol=0)
    assert abs(np.linalg.norm(out) - np.linalg.norm(a)) <= 4 * scaling_error(a.size, "float64") * np.linalg.norm(a)
    # every neuron divided by its own √v (+ eps), then one common factor
    d = np.sqrt(v) + 1e-12 if eps_mode == "add" else np.sqrt(np.maximum(v, 1e-12))
    ratio = out * d / a
    finite = np.abs(a) > 0
    assert np.ptp(ratio[finite]) <= 8 * scaling_error(a.size, "float64") * np.max(np.abs(ratio[finite]))


def test_normuon_with_beta2_zero_equalizes_the_neurons():
    """β₂ = 0 and eps = 0: v is this step's mean square, so every row of the output has the same
    RMS, ‖O‖_F/√m (NorMuon's purpose: uniform per-neuron update scales)."""
    a = np.random.default_rng(2).standard_normal((6, 9)) * np.arange(1, 7)[:, None]
    out, _ = stages.normuon_normalize(a, np.zeros((6, 1)), beta2=0.0, eps=0.0)
    rms = np.sqrt(np.mean(out * out, axis=1))
    assert np.ptp(rms) <= 4 * scaling_error(a.size, "float64") * rms.max()


@pytest.mark.parametrize("m, n, dim, side", [(8, 4, "by_shape", "row"), (4, 8, "by_shape", "column"),
                                             (5, 5, "by_shape", "row"), (4, 8, "row", "row"),
                                             (8, 4, "column", "column")])
def test_normuon_side(m, n, dim, side):
    assert stages.normuon_side(m, n, dim) == side
    assert stages.normuon_variance_shape(m, n, dim) == ((m, 1) if side == "row" else (1, n))


def test_zero_update_stays_zero():
    z = np.zeros((3, 4))
    assert not np.any(stages.renormalize(z))
    out, v = stages.normuon_normalize(z, np.zeros((3, 1)), beta2=0.9)
    assert not np.any(out) and not np.any(v)


def _inputs(m=7, n=5, seed=3):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, n)), rng.standard_normal((m, n)), rng.standard_normal((m, n))


def test_pipeline_with_every_stage_off_is_muon_step():
    w, g, m0 = _inputs()
    kw = dict(lr=0.02, mu=0.9, weight_decay=0.1, cautious_weight_decay=True, adjust_lr="match_rms_adamw")
    a, b = ortho_ref.muon_step(w, g, m0, **kw), muon_pipeline_step(w, g, m0, **kw)
    for x, y in zip(a, b):
        assert np.array_equal(x, y)
    assert b.variance is None and np.array_equal(b.ns_output, b.update)


@pytest.mark.parametrize("shape", [(7, 5), (5, 7)])
def test_pipeline_composes_the_stages_in_nanochat_order(shape):
    w, g, m0 = _inputs(*shape)
    table = ortho_ref.schedule("polar_express")
    kw = dict(lr=0.02, mu=0.95, coefficients=table, safety=1.01, eps=1e-6, weight_decay=0.2,
              cautious_weight_decay=True)
    v0 = np.full(stages.normuon_variance_shape(*shape, "by_shape"), 0.01)
    out = muon_pipeline_step(w, g, m0, row_equilibration=True, renormalize=True, normuon_beta2=0.9,
                             normuon_variance=v0, normuon_eps=1e-10, normuon_eps_mode="clamp", normuon_dim="by_shape",
                             **kw)
    m_new = 0.95 * m0 + 0.05 * g
    u = stages.equilibrate(0.05 * g + 0.95 * m_new)
    o = stages.renormalize(ortho_ref.ns_map(u, table, safety=1.01, eps=1e-6))
    o, v = stages.normuon_normalize(o, v0, beta2=0.9, eps=1e-10, eps_mode="clamp", dim="by_shape")
    s = ortho_ref.lr_scale("original", *shape)
    w_new = np.where(np.sign(o) * np.sign(w) >= 0, w * (1 - 0.02 * 0.2), w) - 0.02 * s * o
    scale = np.linalg.norm(w)
    tol = 8 * scaling_error(w.size, "float64")
    assert np.linalg.norm(out.update - o) <= tol * np.linalg.norm(o)
    assert np.linalg.norm(out.variance - v) <= tol * np.linalg.norm(v)
    assert np.linalg.norm(out.weight - w_new) <= tol * scale


@pytest.mark.parametrize("kwargs, match", [
    (dict(row_equilibration="diagonal"), "row_equilibration"),
    (dict(renormalize=1), "renormalize"),
    (dict(normuon_beta2=1.0), "normuon_beta2"),
    (dict(normuon_beta2=-0.1), "normuon_beta2"),
    (dict(normuon_beta2=0.9, normuon_dim="rows"), "normuon_dim"),
    (dict(normuon_beta2=0.9, normuon_eps_mode="max"), "normuon_eps_mode"),
    (dict(normuon_beta2=0.9, normuon_eps=-1.0), "normuon_eps"),
    (dict(normuon_beta2=0.9, normuon_variance=np.zeros((1, 5))), "normuon_variance"),
])
def test_pipeline_bad_options(kwargs, match):
    w, g, m0 = _inputs()
    with pytest.raises((ValueError, TypeError), match=match):
        muon_pipeline_step(w, g, m0, lr=0.1, **kwargs)


def test_stage_bad_input():
    with pytest.raises(ValueError, match="side"):
        stages.equilibrate(np.ones((2, 2)), "diagonal")
    with pytest.raises(ValueError, match="variance"):
        stages.normuon_normalize(np.ones((2, 3)), np.ones((3, 1)), beta2=0.5)
    with pytest.raises(ValueError, match="o"):
        stages.renormalize(np.array([[np.nan]]))


def test_paper_normuon_scale_is_renormalize_plus_match_rms_adamw():
    """NorMuon's Algorithm 1 (arXiv 2510.05491) steps by η̂·Ô with η̂ = 0.2·η·√(mn)/‖Ô‖_F; the
    implementations' stages compose to it: Muon+ sets ‖O‖_F = √min(m, n), NorMuon keeps it, and
    "match_rms_adamw" scales by 0.2·√max(m, n) (docs/math.md, "Muon pipeline stages"). Exact for ε = 0
    (with ε > 0 the renormalization before NorMuon moves ε relative to √v)."""
    w, g, m0 = _inputs(9, 4)
    lr = 0.01
    out = muon_pipeline_step(w, g, m0, lr=lr, mu=0.95, nesterov=False, momentum_style="ema", renormalize=True,
                             normuon_beta2=0.95, normuon_eps=0.0, adjust_lr="match_rms_adamw")
    o_hat, _ = stages.normuon_normalize(out.ns_output, np.zeros((9, 1)), beta2=0.95, eps=0.0)
    paper = w - (0.2 * lr * math.sqrt(9 * 4) / np.linalg.norm(o_hat)) * o_hat
    assert np.linalg.norm(out.weight - paper) <= 8 * scaling_error(w.size, "float64") * np.linalg.norm(w)


@pytest.mark.parametrize("shape", [(6, 4), (3, 7)])
@pytest.mark.parametrize("dim", ["row", "by_shape"])
def test_float64_stages_agree_with_the_mpmath_tier(shape, dim):
    """The float64 stages against their 40-digit values: within the float64 rounding the
    tolerances derive (``scaling_error``: one norm and one scaling per stage)."""
    from ortho_ref.mp import to_float64

    rng = np.random.default_rng(5)
    a = rng.standard_normal(shape) * np.geomspace(1, 1e-3, shape[0])[:, None]
    v0 = rng.random(stages.normuon_variance_shape(*shape, dim)) * 0.1
    tol = 2 * scaling_error(a.size, "float64")
    for side in stages.EQUILIBRATION_SIDES:
        exact = to_float64(stages.equilibrate_mp(a, side, digits=40))
        assert np.linalg.norm(stages.equilibrate(a, side) - exact) <= tol * np.linalg.norm(exact)
    exact = to_float64(stages.renormalize_mp(a, digits=40))
    assert np.linalg.norm(stages.renormalize(a) - exact) <= tol * np.linalg.norm(exact)
    for mode in stages.NORMUON_EPS_MODES:
        got = stages.normuon_normalize(a, v0, beta2=0.9, eps=1e-8, eps_mode=mode, dim=dim)
        want = stages.normuon_normalize_mp(a, v0, beta2=0.9, eps=1e-8, eps_mode=mode, dim=dim, digits=40)
        # NorMuon's own rounding (stage_tolerances): 2(C_NS(√ℓ + √(mn)) + 12)u‖O‖ ≤ 8·scaling_error(mn)·‖O‖
        assert np.linalg.norm(got.update - to_float64(want.update)) <= 4 * tol * np.linalg.norm(a)
        assert np.linalg.norm(got.variance - to_float64(want.variance)) <= tol * np.linalg.norm(got.variance)
