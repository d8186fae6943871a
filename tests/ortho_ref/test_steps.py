"""Reference Muon steps: the formulas of docs/design.md ("Muon"), invariants, bad input (Dion: test_dion.py)."""

import math

import numpy as np
import pytest

import ortho_ref
from ortho_verify.tolerances import U64, momentum_tolerance, orthonormality_tolerance


def _arrays(m, n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, n)), rng.standard_normal((m, n)), rng.standard_normal((m, n))


@pytest.mark.parametrize("mode, m, n, expected", [
    ("original", 8, 2, 2.0), ("original", 2, 8, 1.0),
    ("match_rms_adamw", 4, 16, 0.2 * 4.0), ("spectral_norm", 2, 8, 0.5), (None, 3, 5, 1.0),
])
def test_lr_scale(mode, m, n, expected):
    assert ortho_ref.lr_scale(mode, m, n) == pytest.approx(expected, rel=4 * U64)


@pytest.mark.parametrize("style", ["ema", "classic"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_momentum_formulas(style, nesterov):
    w, g, m0 = _arrays(6, 4)
    mu, lr, wd = 0.9, 0.1, 0.05
    out = ortho_ref.muon_step(w, g, m0, lr=lr, mu=mu, nesterov=nesterov, momentum_style=style,
                              weight_decay=wd, adjust_lr="original")
    if style == "ema":
        m_new = mu * m0 + (1 - mu) * g
        u = (1 - mu) * g + mu * m_new if nesterov else m_new
    else:
        m_new = mu * m0 + g
        u = g + mu * m_new if nesterov else m_new
    tol = momentum_tolerance(np.linalg.norm(g), np.linalg.norm(m0), "float64")
    assert np.linalg.norm(out.momentum - m_new) <= tol
    assert np.linalg.norm(out.ns_input - u) <= 2 * tol
    assert np.array_equal(out.update, ortho_ref.ns_map(out.ns_input, ortho_ref.schedule("jordan")))
    step = lr * math.sqrt(6 / 4)  # "original": √max(1, m/n)
    expected_w = w * (1 - lr * wd) - step * out.update
    # two elementwise roundings per entry on each side
    assert np.linalg.norm(out.weight - expected_w) <= 4 * U64 * (np.linalg.norm(w) + step * np.linalg.norm(out.update))


def test_muon_polar_orthogonalizer_gives_orthonormal_update():
    w, g, m0 = _arrays(9, 5)
    out = ortho_ref.muon_step(w, g, m0, lr=0.1, orthogonalizer="polar")
    assert np.linalg.norm(out.update.T @ out.update - np.eye(5)) <= orthonormality_tolerance(9, 5, "float64")


@pytest.mark.parametrize("kwargs, match", [
    (dict(weight=np.ones(3)), "weight"), (dict(grad=np.ones((2, 2))), "grad"),
    (dict(momentum_style="adam"), "momentum_style"),
    (dict(adjust_lr="bogus"), "adjust_lr"), (dict(orthogonalizer="svd"), "orthogonalizer"),
    (dict(weight_decay=-0.1), "weight_decay"),
    (dict(grad=np.array([[np.inf, 0.0, 0.0], [0.0, 0.0, 0.0]])), "grad"),
])
def test_muon_bad_input(kwargs, match):
    args = dict(weight=np.ones((2, 3)), grad=np.ones((2, 3)), momentum=np.zeros((2, 3)), lr=0.1)
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        ortho_ref.muon_step(args.pop("weight"), args.pop("grad"), args.pop("momentum"), **args)
