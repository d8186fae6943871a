"""ortho_fast.Muon's parity: bitwise torch.optim.Muon (one and several parameters, every lr
mode and nesterov setting; eps_mode "add" shown to differ, so the parity can fail), the
normalization defaults of each schedule, agreement with the float64 oracle
(ortho_ref.muon_step) within ortho_verify.tolerances, and a zero gradient with eps = 0.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ortho_fast
import ortho_ref
from ortho_fast import Muon
from ortho_fast.functional.muon import adjusted_lr_scale
from ortho_fast.groups.muon import default_eps_mode
from ortho_verify import tolerances as tol
from ortho_verify.registry import MUON_COMBOS  # momentum style x nesterov x adjust_lr x weight decay x coefficients
from tests.ortho_fast.helpers import SHAPE_IDS, SHAPES, gradient_matrix, rng_for

# =======================================================================================
# Muon
# =======================================================================================


@pytest.mark.parametrize("lr", [1e-3, 0.02])
@pytest.mark.parametrize("adjust_lr", ["original", "match_rms_adamw"])
@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_muon_bitwise_equals_torch_muon(shape, nesterov, adjust_lr, lr):
    rng = rng_for("torch-muon", shape, nesterov, adjust_lr, lr)
    w0 = torch.tensor(0.02 * rng.standard_normal(shape), dtype=torch.float32)
    p_ref, p_fast = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    o_ref = torch.optim.Muon([p_ref], lr=lr, nesterov=nesterov, adjust_lr_fn=adjust_lr)
    o_fast = Muon([p_fast], lr=lr, nesterov=nesterov, adjust_lr=adjust_lr)
    for _ in range(3):
        g = torch.tensor(gradient_matrix(shape, rng), dtype=torch.float32)
        p_ref.grad, p_fast.grad = g.clone(), g.clone()
        o_ref.step()
        o_fast.step()
        assert float((p_ref.detach() - p_fast.detach()).abs().max()) <= tol.TORCH_MUON_TOLERANCE
        assert torch.equal(p_ref, p_fast)
        assert torch.equal(o_ref.state[p_ref]["momentum_buffer"], o_fast.state[p_fast]["momentum_buffer"])
    assert not torch.equal(p_fast.detach(), w0)  # the steps did something


def test_muon_bitwise_equals_torch_muon_several_params():
    """One optimizer over tall, wide and square parameters: ``Muon(params)`` with plain
    defaults is bitwise ``torch.optim.Muon(params)`` (its eps_mode resolves to torch's clamp)."""
    rng = rng_for("torch-muon-multi")
    w0 = [torch.tensor(0.02 * rng.standard_normal(s), dtype=torch.float32) for s in SHAPES]
    ps_ref = [torch.nn.Parameter(w.clone()) for w in w0]
    ps_fast = [torch.nn.Parameter(w.clone()) for w in w0]
    o_ref = torch.optim.Muon(ps_ref)
    o_fast = Muon(ps_fast)
    assert o_fast.param_groups[0]["eps_mode"] == "clamp"
    for _ in range(3):
        for a, b in zip(ps_ref, ps_fast):
            g = torch.tensor(gradient_matrix(tuple(a.shape), rng), dtype=torch.float32)
            a.grad, b.grad = g.clone(), g.clone()
        o_ref.step()
        o_fast.step()
    for a, b in zip(ps_ref, ps_fast):
        assert torch.equal(a, b)
        assert torch.equal(o_ref.state[a]["momentum_buffer"], o_fast.state[b]["momentum_buffer"])


@pytest.mark.parametrize("eps_mode, equal", [(None, True), ("clamp", True), ("add", False)])
def test_muon_eps_mode_add_differs_from_torch_on_tiny_gradient(eps_mode, equal):
    """eps_mode='add' is not torch's clamp: with ‖U‖_F ≈ eps they differ (X₀ = U/(‖U‖ + eps)
    vs U/max(‖U‖, eps)), which shows the parity tests can fail; the default (None -> "clamp"
    for "jordan") and "clamp" give torch's bits here too."""
    rng = rng_for("eps-mode")
    w0 = torch.tensor(0.02 * rng.standard_normal((8, 12)), dtype=torch.float32)
    p_ref, p_fast = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    o_ref, o_fast = torch.optim.Muon([p_ref], lr=0.02), Muon([p_fast], lr=0.02, eps_mode=eps_mode)
    g = torch.tensor(1e-6 * gradient_matrix((8, 12), rng), dtype=torch.float32)  # ‖U‖_F ≈ 1e-7 = eps
    p_ref.grad, p_fast.grad = g.clone(), g.clone()
    o_ref.step()
    o_fast.step()
    assert torch.equal(p_ref, p_fast) == equal


@pytest.mark.parametrize("coefficients, expected", [
    ("jordan", ("clamp", 1.0, 1e-7)), (ortho_fast.COEFFICIENTS["jordan"], ("clamp", 1.0, 1e-7)),
    ("polar_express", ("add", 1.02, 1e-6)), ("cesista5", ("add", 1.0, 1e-7)), ("you6", ("add", 1.0, 1e-7)),
    ([(3.4445, -4.7750, 2.0315)], ("add", 1.0, 1e-7)),  # a table, even Keller Jordan's row: "add"
])
def test_muon_normalization_defaults_follow_the_schedule(coefficients, expected):
    """eps_mode / safety / eps None resolve from the schedule: torch.optim.Muon's clamp for
    "jordan" only, Keller Jordan's original "add" (dion, Moonlight, nanochat) otherwise;
    explicit values win."""
    p = [torch.nn.Parameter(torch.ones(4, 6))]
    group = Muon(p, coefficients=coefficients).param_groups[0]
    assert (group["eps_mode"], group["safety"], group["eps"]) == expected
    assert default_eps_mode(coefficients) == expected[0]
    group = Muon(p, coefficients=coefficients, eps_mode="add", safety=1.5, eps=0.0).param_groups[0]
    assert (group["eps_mode"], group["safety"], group["eps"]) == ("add", 1.5, 0.0)


@pytest.mark.parametrize("style, nesterov, adjust_lr, weight_decay, coefficients", MUON_COMBOS)
def test_muon_float64_matches_reference(style, nesterov, adjust_lr, weight_decay, coefficients):
    """The oracle runs the oracle's own schedule transcription and the documented default
    normalization (clamp for "jordan", add otherwise), so a wrong default on the fast side fails."""
    lr, mu = 0.02, 0.9
    sched, table = ortho_ref.SCHEDULES[coefficients], ortho_ref.schedule(coefficients)
    eps_mode = "clamp" if coefficients == "jordan" else "add"
    for shape in SHAPES:
        rng = rng_for("muon-ref", shape, style, nesterov, adjust_lr, weight_decay, coefficients)
        g = gradient_matrix(shape, rng, cond=1e2, scale=3.0)
        w0 = 0.02 * rng.standard_normal(shape)
        m0 = gradient_matrix(shape, rng, cond=1e2, scale=2.0)  # nonzero momentum buffer
        p = torch.nn.Parameter(torch.tensor(w0))
        opt = Muon([p], lr=lr, weight_decay=weight_decay, momentum=mu, nesterov=nesterov, momentum_style=style,
                   coefficients=coefficients, adjust_lr=adjust_lr, dtype=torch.float64)
        opt.state[p]["momentum_buffer"] = torch.tensor(m0)
        p.grad = torch.tensor(g)
        opt.step()
        ref = ortho_ref.muon_step(w0, g, m0, lr=lr, mu=mu, nesterov=nesterov, momentum_style=style,
                                  coefficients=table, safety=sched.safety, eps=sched.eps, eps_mode=eps_mode,
                                  adjust_lr=adjust_lr, weight_decay=weight_decay)
        sigma_hat = ortho_ref.normalized_singular_values(ref.ns_input, safety=sched.safety, eps=sched.eps,
                                                         eps_mode=eps_mode)
        ns_tol = tol.ns_tolerance(sigma_hat, table, shape, "float64")
        w_tol = tol.muon_tolerance(ns_tol, ref.lr_scale, lr, float(np.linalg.norm(w0)),
                                   float(np.linalg.norm(ref.update)), "float64")
        m_tol = tol.momentum_tolerance(float(np.linalg.norm(g)), float(np.linalg.norm(m0)), "float64")
        w_err = np.linalg.norm(p.detach().numpy() - ref.weight)
        m_err = np.linalg.norm(opt.state[p]["momentum_buffer"].numpy() - ref.momentum)
        assert p.dtype == torch.float64 and opt.state[p]["momentum_buffer"].dtype == torch.float64
        assert w_err <= w_tol, f"{shape}: weight error {w_err:.3e} > {w_tol:.3e}"
        assert m_err <= m_tol, f"{shape}: momentum error {m_err:.3e} > {m_tol:.3e}"
        assert ref.lr_scale == adjusted_lr_scale(adjust_lr, *shape)


def test_muon_zero_gradient_with_eps_zero_only_decays():
    w0 = torch.ones(3, 4)
    p = torch.nn.Parameter(w0.clone())
    opt = Muon([p], lr=0.02, weight_decay=0.1, eps=0.0)
    p.grad = torch.zeros(3, 4)
    opt.step()
    assert torch.equal(p.detach(), w0 * (1 - 0.02 * 0.1))
