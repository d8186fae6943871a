"""ortho_fast.Dion2 against the oracle (ortho_ref.dion2) in float64, batched parameters, 3-D
parameters, microsoft/dion's constructor names and the patch point."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_fast
from ortho_fast.functional import dion2 as dion2_math
from ortho_ref.dion2 import dion2_step
from ortho_verify.checks.dion2 import reference_options
from ortho_verify.tolerances.dion2 import dion2_step_tolerances


def _run(shapes, options, steps=1, seed=0, dtype=torch.float64):
    """Fast Dion2 on parameters of ``shapes`` (one group) for ``steps`` steps; returns the
    parameters, the optimizer and the gradients fed (float64 numpy, per step per parameter)."""
    rng = np.random.default_rng(seed)
    params = [torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(s), dtype=dtype)) for s in shapes]
    opt = ortho_fast.Dion2(params, dtype=dtype, **options)
    grads = []
    for _ in range(steps):
        gs = [rng.standard_normal(s) for s in shapes]
        for p, g in zip(params, gs):
            p.grad = torch.tensor(g, dtype=dtype)
        opt.step()
        grads.append(gs)
    return params, opt, grads


def _oracle(w0, grads, options):
    ref = reference_options(options)
    w, m = w0, np.zeros_like(w0)
    for g in grads:
        step = dion2_step(w, g, m, **ref)
        tols = dion2_step_tolerances(w, step.update, step.accumulated, step.selected, step.rows, g, m,
                                     lr=ref["lr"], lr_scale=step.lr_scale, coefficients=ref["coefficients"],
                                     safety=ref["safety"], eps=ref["eps"], dtype="float64")
        w, m = step.weight, step.momentum
    return w, m, tols


OPTIONS = st.fixed_dictionaries({
    "fraction": st.sampled_from([0.1, 0.25, 0.5, 1.0]),
    "ef_decay": st.sampled_from([0.0, 0.5, 0.95, 1.0]),
    "adjust_lr": st.sampled_from(["spectral_norm", "rms_norm", None]),
    "coefficients": st.sampled_from(["polar_express", "cesista5"]),
    "weight_decay": st.sampled_from([0.0, 0.1]),
    "selection_scope": st.sampled_from(["local", "global"]),
})


@settings(deadline=None, max_examples=20)
@given(shape=st.tuples(st.integers(1, 24), st.integers(1, 24)), options=OPTIONS, seed=st.integers(0, 2**31))
def test_float64_step_matches_the_oracle(shape, options, seed):
    (p,), opt, grads = _run([shape], {"lr": 0.05, **options}, steps=1, seed=seed)
    w0 = np.random.default_rng(seed).standard_normal(shape) * 0.02
    w, m, (w_tol, m_tol) = _oracle(w0, [gs[0] for gs in grads], {"lr": 0.05, **options})
    assert np.linalg.norm(p.detach().numpy() - w) <= w_tol
    assert np.linalg.norm(opt.state[p]["momentum"].numpy() - m) <= m_tol


def test_three_steps_and_a_batch_of_same_shape_parameters():
    """Parameters of one shape are selected and orthogonalized as one batch, each its own top-k."""
    shapes = [(12, 20), (12, 20), (20, 12), (7, 7)]
    options = {"lr": 0.05, "fraction": 0.3}
    params, opt, grads = _run(shapes, options, steps=3, seed=5)
    rng = np.random.default_rng(5)
    w0s = [0.02 * rng.standard_normal(s) for s in shapes]
    for i, p in enumerate(params):
        w, m, (w_tol, m_tol) = _oracle(w0s[i], [gs[i] for gs in grads], options)
        assert np.linalg.norm(p.detach().numpy() - w) <= 3 * w_tol  # three steps, each within its tolerance
        assert np.linalg.norm(opt.state[p]["momentum"].numpy() - m) <= 3 * m_tol


@pytest.mark.parametrize("flatten", [True, False])
def test_three_dimensional_parameters(flatten):
    (p,), opt, grads = _run([(3, 4, 6)], {"lr": 0.05, "fraction": 0.5, "flatten": flatten}, seed=2)
    w0 = 0.02 * np.random.default_rng(2).standard_normal((3, 4, 6))
    g = grads[0][0]
    if flatten:
        w, m, _ = _oracle(w0.reshape(3, 24), [g.reshape(3, 24)], {"lr": 0.05, "fraction": 0.5})
        w, m = w.reshape(3, 4, 6), m.reshape(3, 4, 6)
    else:
        pairs = [_oracle(w0[i], [g[i]], {"lr": 0.05, "fraction": 0.5}) for i in range(3)]
        w, m = np.stack([a for a, _, _ in pairs]), np.stack([b for _, b, _ in pairs])
    np.testing.assert_allclose(p.detach().numpy(), w, atol=1e-12)
    np.testing.assert_allclose(opt.state[p]["momentum"].numpy(), m, atol=1e-14)


def test_non_contiguous_three_dimensional_parameter_is_updated_in_place():
    q = torch.nn.Parameter(torch.randn(3, 4, 6, dtype=torch.float64))
    nc = torch.nn.Parameter(torch.empty(4, 6, 3, dtype=torch.float64).permute(2, 0, 1))
    with torch.no_grad():
        nc.copy_(q)
    assert not nc.is_contiguous()
    g = torch.randn(3, 4, 6, dtype=torch.float64)
    outs = []
    for param in (q, nc):
        opt = ortho_fast.Dion2([param], lr=0.1, fraction=0.5, flatten=True, dtype=torch.float64)
        param.grad = g.clone()
        opt.step()
        outs.append((param.detach().clone(), opt.state[param]["momentum"].clone()))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_microsoft_dion_names_and_positional_order():
    p = torch.nn.Parameter(torch.randn(8, 16))
    opt = ortho_fast.Dion2([p], None, 0.02, 0.5, 0.9, (0.9, 0.95), 0.0, 1e-8, "rms_norm", False, False, False,
                           use_gram_newton_schulz=False, newton_schulz_func=None, verbose=True,
                           triton_post_ortho=False)
    group = opt.param_groups[0]
    assert (group["lr"], group["fraction"], group["ef_decay"], group["weight_decay"]) == (0.02, 0.5, 0.9, 0.0)
    assert group["adjust_lr"] == "match_rms_adamw" and group["coefficients"] == "cesista5"
    assert group["selection_scope"] == "local"
    p.grad = torch.randn(8, 16)
    opt.step()
    assert set(opt.state[p]) == {"momentum"}
    assert ortho_fast.Dion2([p], use_polar_express=True).param_groups[0]["coefficients"] == "polar_express"


def test_patch_point_reaches_the_step(monkeypatch):
    calls = []

    def planted(sub, table, **kwargs):
        calls.append(tuple(sub.shape))
        return torch.zeros_like(sub, dtype=kwargs["compute_dtype"])

    monkeypatch.setattr(dion2_math, "orthogonalize_selected", planted)
    p = torch.nn.Parameter(torch.ones(4, 10))
    opt = ortho_fast.Dion2([p], lr=0.1, weight_decay=0.0, fraction=0.5)
    p.grad = torch.randn(4, 10)
    opt.step()
    assert calls == [(1, 2, 10)] and torch.equal(p.detach(), torch.ones(4, 10))
