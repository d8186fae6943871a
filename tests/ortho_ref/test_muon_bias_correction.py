"""The bias-corrected EMA momentum of ``ortho_ref.muon`` (optax ``contrib.muon``'s form), pinned
against its definition written out term by term (independent of ``momentum_update``), with the
stored momentum left uncorrected."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ortho_ref
from ortho_ref.muon import lr_scale, momentum_update


def _inputs(seed, m, n):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, n)), rng.standard_normal((m, n)), rng.standard_normal((m, n))


def _written_out(g, m0, mu, t, nesterov):
    """optax 0.2.8 ``scale_by_muon``: M_t = μM_{t−1} + (1−μ)G_t; Nesterov
    U_t = μ·M_t/(1−μ^(t+1)) + (1−μ)·G_t/(1−μ^t), else U_t = M_t/(1−μ^t)."""
    m_new = mu * m0 + (1 - mu) * g
    if nesterov:
        return m_new, mu * m_new / (1 - mu ** (t + 1)) + (1 - mu) * g / (1 - mu ** t)
    return m_new, m_new / (1 - mu ** t)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), m=st.integers(1, 6), n=st.integers(1, 6), mu=st.floats(0.0, 0.99),
       t=st.integers(1, 200), nesterov=st.booleans(), lr=st.floats(1e-4, 0.5), wd=st.floats(0.0, 1.0),
       pipeline=st.booleans())
def test_bias_corrected_momentum_follows_its_definition(seed, m, n, mu, t, nesterov, lr, wd, pipeline):
    w, g, m0 = _inputs(seed, m, n)
    step = ortho_ref.muon.muon_pipeline_step if pipeline else ortho_ref.muon_step
    out = step(w, g, m0, lr=lr, mu=mu, weight_decay=wd, nesterov=nesterov, bias_correction=True, step=t)
    m_new, u = _written_out(g, m0, mu, t, nesterov)
    o = ortho_ref.ns_map(u, ortho_ref.schedule("jordan"), safety=1.0, eps=1e-7)
    np.testing.assert_allclose(out.momentum, m_new, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(out.ns_input, u, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out.weight, w * (1 - lr * wd) - lr * lr_scale("original", m, n) * o,
                               rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("nesterov", [True, False])
def test_the_correction_is_visible_and_fades(nesterov):
    """Each planted misreading (no correction, the two counts swapped, one step off) moves U by far
    more than the 1e-12 the property above allows at step 2; at step 1 without Nesterov the
    correction is exactly 1/(1−μ), and it fades as μ^t → 0."""
    _, g, m0 = _inputs(3, 5, 4)
    mu = 0.9
    _, u = momentum_update(g, m0, mu=mu, nesterov=nesterov, momentum_style="ema", bias_correction=True, step=2)
    m_new, plain = momentum_update(g, m0, mu=mu, nesterov=nesterov, momentum_style="ema")
    wrong = [plain, _written_out(g, m0, mu, 3, nesterov)[1]]
    if nesterov:
        wrong.append(mu * m_new / (1 - mu ** 2) + (1 - mu) * g / (1 - mu ** 3))  # counts swapped
    for planted in wrong:
        assert np.max(np.abs(planted - u)) > 1e-3
    _, first = momentum_update(g, m0, mu=mu, nesterov=False, momentum_style="ema", bias_correction=True, step=1)
    np.testing.assert_allclose(first, m_new / (1 - mu), rtol=1e-14)
    _, late = momentum_update(g, m0, mu=mu, nesterov=nesterov, momentum_style="ema", bias_correction=True, step=2000)
    np.testing.assert_allclose(late, plain, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kwargs, name", [
    (dict(bias_correction=True), "step"),
    (dict(bias_correction=True, step=0), "step"),
    (dict(bias_correction=True, step=2.0), "step"),
    (dict(bias_correction=True, step=True), "step"),
    (dict(bias_correction=True, step=3, momentum_style="classic"), "bias_correction"),
    (dict(bias_correction=True, step=3, nesterov_form="full_grad"), "bias_correction"),
    (dict(bias_correction="True", step=3), "bias_correction"),
])
def test_bad_bias_correction_options_are_named(kwargs, name):
    w, g, m0 = _inputs(1, 3, 3)
    with pytest.raises((TypeError, ValueError), match=name):
        ortho_ref.muon_step(w, g, m0, lr=0.1, **kwargs)
    with pytest.raises((TypeError, ValueError), match=name):
        ortho_ref.muon.muon_pipeline_step(w, g, m0, lr=0.1, **kwargs)


def test_no_nesterov_full_grad_form_is_not_used():
    """Without Nesterov the form does not enter U, so the debiased M_new/(1−μ^t) is defined for it."""
    _, g, m0 = _inputs(2, 3, 4)
    a = momentum_update(g, m0, mu=0.5, nesterov=False, momentum_style="ema", nesterov_form="full_grad",
                        bias_correction=True, step=4)[1]
    np.testing.assert_allclose(a, _written_out(g, m0, 0.5, 4, False)[1], rtol=1e-14)
