"""ortho_fast.Muon's options against the float64 oracle (``ortho_ref.muon_step``, through
``tests.ortho_fast.helpers.check_against_muon_reference``): lr modes, extra scale factor,
cautious weight decay (its mask convention pinned on both sides), normalization (safety,
eps, eps_mode, ns_steps, user tables) and the compute dtype.

Tolerances come from ortho_verify.tolerances; bitwise equality is asserted where the same torch
operations run in the same order.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_ref
from ortho_fast import Muon, newton_schulz
from ortho_fast.functional.muon import ADJUST_LR_MODES, adjusted_lr_scale
from tests.ortho_fast.helpers import (
    BASE,
    ROWS,
    check_against_muon_reference,
    muon_reference,
    rng_for,
    run_one_muon_step,
)

# =======================================================================================
# Every option in float64 against the oracle
# =======================================================================================


@pytest.mark.parametrize("adjust_lr", ADJUST_LR_MODES)
@pytest.mark.parametrize("extra_scale_factor", [1.0, 0.2])
@pytest.mark.parametrize("cautious", [False, True])
def test_lr_modes_extra_scale_and_cautious_decay_match_reference(adjust_lr, extra_scale_factor, cautious):
    opts = {**BASE, "adjust_lr": adjust_lr, "extra_scale_factor": extra_scale_factor, "cautious_weight_decay": cautious}
    rng = rng_for("modes", adjust_lr, extra_scale_factor, cautious)
    for w_new, m_new, w0, g, m0 in run_one_muon_step([(24, 16), (16, 24), (20, 20)], opts, rng):
        check_against_muon_reference(w_new, m_new, w0, g, m0, [ROWS], opts)


@settings(deadline=None)
@given(
    m=st.integers(1, 24), n=st.integers(1, 24),
    style=st.sampled_from(["ema", "classic"]), nesterov=st.booleans(),
    adjust_lr=st.sampled_from(ADJUST_LR_MODES), extra=st.floats(0.05, 5.0),
    cautious=st.booleans(), coefficients=st.sampled_from(sorted(ortho_ref.SCHEDULES)),
    eps_mode=st.sampled_from([None, "add", "clamp"]), wd=st.sampled_from([0.0, 0.1, 2.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_options_property_against_reference(m, n, style, nesterov, adjust_lr, extra, cautious, coefficients,
                                            eps_mode, wd, seed):
    opts = dict(lr=0.03, weight_decay=wd, momentum=0.9, nesterov=nesterov, momentum_style=style,
                coefficients=coefficients, eps_mode=eps_mode, adjust_lr=adjust_lr, extra_scale_factor=extra,
                cautious_weight_decay=cautious)
    (out,) = run_one_muon_step([(m, n)], opts, np.random.default_rng(seed))
    check_against_muon_reference(*out, [ROWS], opts)


#: A user table (not in the registry) of two rows: X <- aX + (bA + cA²)X.
USER_ROWS = [(3.0, -3.2, 1.2), (2.0, -1.5, 0.5)]


#: (options, the options a fast side that ignored them would run instead).
NORMALIZATION_CASES = [
    (dict(safety=1.3), {}), (dict(eps=0.5), {}), (dict(eps=0.5, eps_mode="clamp"), dict(eps=0.5)),
    (dict(eps=0.0), {}), (dict(ns_steps=3), {}),
    (dict(coefficients="polar_express_paper", ns_steps=8), dict(coefficients="polar_express_paper")),
    (dict(coefficients="you6"), dict(coefficients="you6", ns_steps=5)),
    (dict(coefficients="polar_express", safety=1.0, eps=1e-7), dict(coefficients="polar_express")),
    (dict(coefficients=USER_ROWS), {}),
    (dict(coefficients=USER_ROWS, ns_steps=4, eps_mode=None),
     dict(coefficients=USER_ROWS, ns_steps=4, eps_mode="clamp")),
    (dict(coefficients="cesista5", eps_mode=None), dict(coefficients="cesista5", eps_mode="clamp")),
    (dict(eps_mode=None), dict(eps_mode="add")),  # "jordan": torch's clamp
]


@pytest.mark.parametrize("extra, ignored", NORMALIZATION_CASES, ids=[repr(c[0]) for c in NORMALIZATION_CASES])
def test_normalization_steps_and_tables_match_reference(extra, ignored):
    """Muon's safety, eps, eps_mode (and its default), ns_steps and a user table against
    ortho_ref.muon_step with the same values (tall, wide, square; ‖U‖_F ≈ 1, so eps = 0.5
    matters). Each option must be applied: the oracle run with ``ignored`` instead is farther
    than the tolerance, so the comparison can fail."""
    opts = {**BASE, **extra}
    outs = run_one_muon_step([(12, 8), (8, 12), (10, 10)], opts, rng_for("normalization", repr(extra)))
    for w_new, m_new, w0, g, m0 in outs:
        check_against_muon_reference(w_new, m_new, w0, g, m0, [ROWS], opts)
    w_new, _, w0, g, m0 = outs[0]
    ref, w_tol, _ = muon_reference(w0, g, m0, {**BASE, **ignored})
    assert np.linalg.norm(w_new - ref.weight) > w_tol, "the option changed nothing: this test could not fail"


def test_adjusted_lr_scale_equals_oracle_transcription():
    """The two independent transcriptions of the lr modes give the same floats."""
    for mode in ADJUST_LR_MODES:
        for m, n in ((8, 2), (2, 8), (5, 5), (768, 3072)):
            assert adjusted_lr_scale(mode, m, n) == ortho_ref.lr_scale(mode, m, n), (mode, m, n)
    assert adjusted_lr_scale("spectral", 4, 16) == 4.0  # Megatron "spectral" is √max(m, n) ...
    assert adjusted_lr_scale("spectral_norm", 4, 16) == 0.5  # ... dion's "spectral_norm" is √(m/n)


def test_megatron_spectral_times_point_two_is_match_rms_adamw_bitwise():
    rng = rng_for("spectral-0.2")
    w0, g = 0.02 * rng.standard_normal((12, 20)), rng.standard_normal((12, 20))

    def run(**kw):
        p = torch.nn.Parameter(torch.tensor(w0, dtype=torch.float32))
        p.grad = torch.tensor(g, dtype=torch.float32)
        Muon([p], lr=0.02, **kw).step()
        return p.detach()

    assert torch.equal(run(adjust_lr="spectral", extra_scale_factor=0.2), run(adjust_lr="match_rms_adamw"))
    assert not torch.equal(run(adjust_lr="spectral"), run(adjust_lr="match_rms_adamw"))


# =======================================================================================
# Cautious weight decay: the convention, pinned
# =======================================================================================


def test_cautious_decay_mask_convention():
    """Decay exactly where sign(O)·sign(W) >= 0, with O the orthogonalized update and W the
    weight before the step (Chen et al. 2025, I(u⊙x >= 0)). A zero gradient row gives an
    exactly zero row of O, which the >= decays (a strict > would not).
    Compared bitwise with the formula evaluated by torch on the same O."""
    rng = rng_for("cwd")
    w0 = torch.tensor(0.05 * rng.standard_normal((10, 14)), dtype=torch.float32)
    g = torch.tensor(rng.standard_normal((10, 14)), dtype=torch.float32)
    g[2] = 0.0
    lr, wd = 0.1, 0.5
    p = torch.nn.Parameter(w0.clone())
    p.grad = g.clone()
    Muon([p], lr=lr, weight_decay=wd, momentum=0.0, nesterov=False, cautious_weight_decay=True).step()
    o = newton_schulz(g, dtype=torch.bfloat16)  # momentum 0, no nesterov: U = G
    mask = o.sign() * w0.sign() >= 0
    expected = torch.where(mask, w0 * (1 - lr * wd), w0)
    expected.add_(o, alpha=-lr * adjusted_lr_scale("original", 10, 14))
    assert torch.equal(p.detach(), expected)
    assert 0 < int(mask.sum()) < mask.numel()  # both kinds of entries occur: the test can fail
    assert not o[2].any() and torch.equal(p.detach()[2], w0[2] * (1 - lr * wd))
    decoupled = torch.nn.Parameter(w0.clone())
    decoupled.grad = g.clone()
    Muon([decoupled], lr=lr, weight_decay=wd, momentum=0.0, nesterov=False).step()
    assert not torch.equal(decoupled.detach(), p.detach())


def test_oracle_cautious_decay_on_a_known_update():
    """The oracle's own convention on a case solved by hand: U = G = 3·I gives the polar factor
    O = I exactly; W's (0, 0) entry opposes O (no decay), the off-diagonal O entries are 0
    (decayed, the >=), (1, 1) agrees (decayed)."""
    w = np.array([[-0.5, 0.25], [0.5, 0.75]])
    lr, wd, extra = 0.1, 0.5, 0.2
    out = ortho_ref.muon_step(w, 3.0 * np.eye(2), np.zeros((2, 2)), lr=lr, mu=0.0, nesterov=False,
                              orthogonalizer="polar", weight_decay=wd, adjust_lr="spectral",
                              extra_scale_factor=extra, cautious_weight_decay=True)
    assert np.array_equal(out.update, np.eye(2))
    assert out.lr_scale == math.sqrt(2) * extra
    decayed = w * (1 - lr * wd)
    expected = np.array([[w[0, 0], decayed[0, 1]], [decayed[1, 0], decayed[1, 1]]]) - lr * out.lr_scale * np.eye(2)
    assert np.array_equal(out.weight, expected)


def test_compute_dtype_settings():
    """dtype=None computes in the parameter's dtype; Megatron's "medium" is bfloat16."""
    rng = rng_for("compute-dtype")
    w0 = torch.tensor(0.02 * rng.standard_normal((12, 18)))
    g = torch.tensor(rng.standard_normal((12, 18)))

    def run(dtype):
        p = torch.nn.Parameter(w0.clone())
        p.grad = g.clone()
        Muon([p], lr=0.02, dtype=dtype).step()
        return p.detach()

    assert torch.equal(run(None), run(torch.float64))
    assert torch.equal(run("medium"), run(torch.bfloat16))
    assert not torch.equal(run(None), run("medium"))
