"""Property: for any ortho_fast.Muon option set in the convention space, identify_optimizer recovers
the options it was built with (a factory with those options, no declaration)."""

from __future__ import annotations

import functools

from hypothesis import HealthCheck, given, settings, strategies as st

import ortho_fast
from ortho_verify.identify.optimizer import identify_optimizer
from tests.strategies import profile_examples

OPTIONS = st.fixed_dictionaries({
    "momentum_style": st.sampled_from(["ema", "classic"]),
    "nesterov": st.booleans(),
    "coefficients": st.sampled_from(["jordan", "polar_express", "cesista5"]),
    "adjust_lr": st.sampled_from(["original", "spectral_norm", "match_rms_adamw", None]),
    "cautious_weight_decay": st.booleans(),
})


@settings(deadline=None, derandomize=True, **profile_examples(7), suppress_health_check=[HealthCheck.too_slow])
@given(OPTIONS)
def test_ortho_fast_options_are_recovered(options):
    found = identify_optimizer(functools.partial(ortho_fast.Muon, **options), judge=False)
    assert found.fits and not found.differences, found.summary()
    assert {k: getattr(found.declaration, k) for k in options} == options, found.summary()
