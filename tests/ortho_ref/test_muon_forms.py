"""The Nesterov forms and weight-decay styles of ``ortho_ref.muon_step``, pinned against their
definitions written out term by term (independent of ``momentum_update`` / ``decay_factor``)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ortho_ref
from ortho_ref.muon import NESTEROV_FORMS, WEIGHT_DECAY_STYLES, lr_scale


def _inputs(seed, m, n):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, n)), rng.standard_normal((m, n)), rng.standard_normal((m, n))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), m=st.integers(1, 6), n=st.integers(1, 6),
       mu=st.floats(0.0, 0.99), wd=st.floats(0.0, 2.0), lr=st.floats(1e-4, 0.5),
       style=st.sampled_from(WEIGHT_DECAY_STYLES), form=st.sampled_from(NESTEROV_FORMS),
       momentum_style=st.sampled_from(("ema", "classic")), adjust=st.sampled_from(("original", "spectral_norm")))
def test_forms_and_styles_follow_their_definitions(seed, m, n, mu, wd, lr, style, form, momentum_style, adjust):
    w, g, m0 = _inputs(seed, m, n)
    out = ortho_ref.muon_step(w, g, m0, lr=lr, mu=mu, weight_decay=wd, momentum_style=momentum_style,
                              nesterov=True, nesterov_form=form, weight_decay_style=style, adjust_lr=adjust)
    g_eff = g + wd * w if style == "l2" else g
    if momentum_style == "ema":
        m_new = mu * m0 + (1 - mu) * g_eff
        u = (g_eff if form == "full_grad" else (1 - mu) * g_eff) + mu * m_new
    else:
        m_new = mu * m0 + g_eff
        u = g_eff + mu * m_new
    s = lr_scale(adjust, m, n)
    factor = {"decoupled": 1 - lr * wd, "adjusted_lr": 1 - lr * s * wd, "independent": 1 - wd, "l2": 1.0}[style]
    o = ortho_ref.ns_map(u, ortho_ref.schedule("jordan"), safety=1.0, eps=1e-7)
    np.testing.assert_allclose(out.momentum, m_new, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(out.ns_input, u, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(out.weight, w * factor - lr * s * o, rtol=1e-12, atol=1e-12)


def test_styles_differ_where_they_should():
    w, g, m0 = _inputs(0, 8, 4)  # tall: the adjusted lr differs from lr
    common = dict(lr=0.1, mu=0.9, weight_decay=0.5, adjust_lr="original")
    weights = {s: ortho_ref.muon_step(w, g, m0, weight_decay_style=s, **common).weight for s in WEIGHT_DECAY_STYLES}
    for a in WEIGHT_DECAY_STYLES:
        for b in WEIGHT_DECAY_STYLES:
            if a < b:
                assert np.linalg.norm(weights[a] - weights[b]) > 1e-3, (a, b)


@pytest.mark.parametrize("kwargs, name", [
    (dict(nesterov="False"), "nesterov"),
    (dict(cautious_weight_decay="False"), "cautious_weight_decay"),
    (dict(nesterov_form="lerp2"), "nesterov_form"),
    (dict(weight_decay_style="coupled"), "weight_decay_style"),
    (dict(weight_decay_style="l2", cautious_weight_decay=True), "weight_decay_style"),
])
def test_bad_options_are_named(kwargs, name):
    w, g, m0 = _inputs(1, 3, 3)
    with pytest.raises((TypeError, ValueError), match=name):
        ortho_ref.muon_step(w, g, m0, lr=0.1, **kwargs)
    with pytest.raises((TypeError, ValueError), match=name):
        ortho_ref.muon.muon_pipeline_step(w, g, m0, lr=0.1, **kwargs)
