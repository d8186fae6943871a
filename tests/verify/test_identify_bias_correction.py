"""The momentum-form fit of identify_optimizer tells the bias-corrected EMA Nesterov mix (optax
``contrib.muon``) from the plain one: the two-step probe's update of each form, computed in float64
from ortho_ref, is fitted to its own form and not to the other (float32 tolerances: the dtype an optimizer whose
Newton–Schulz runs in float32 is probed in)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

import ortho_ref
from ortho_verify.identify import optimizer_fit as fit
from ortho_verify.identify.optimizer_probes import spectrum_matrix
from tests.strategies import profile_examples


@settings(deadline=None, **profile_examples(3))
@given(seed=st.integers(0, 2**31 - 1), mu=st.floats(0.5, 0.99), corrected=st.booleans())
def test_bias_corrected_mix_is_fitted_to_its_own_form(seed, mu, corrected):
    rng = np.random.default_rng(seed)
    shape = (24, 16)
    g1, g2 = (spectrum_matrix(shape, np.geomspace(1.0, 1e-1, 16), rng) for _ in range(2))
    m1 = (1 - mu) * g1
    m2 = mu * m1 + (1 - mu) * g2  # written out: U₂ of the mix, optax's debiasing or none
    u2 = (mu * m2 / (1 - mu ** 3) + (1 - mu) * g2 / (1 - mu ** 2)) if corrected else (1 - mu) * g2 + mu * m2
    schedule = ("jordan", ortho_ref.schedule("jordan"), 1.0, 1e-7)
    ranked = fit.fit_momentum_form([g1, g2], ortho_ref.ns_map(u2, schedule[1]), ["ema"], mu, schedule, "float32")
    best = ranked[0][2]
    assert best["nesterov"] and best["nesterov_form"] == "mix"
    assert best.get("bias_correction", False) is corrected, ranked[:2]
    assert ranked[0][0] <= 1e-6 < 1 < ranked[1][0], ranked[:2]  # the other candidates leave more than the tolerance
