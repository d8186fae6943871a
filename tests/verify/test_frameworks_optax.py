"""ortho_verify.frameworks.optax_optimizer: optax transforms judged by check_optimizer through the
adapter — optax.contrib.muon passes under the conventions it uses (its default Nesterov mix with
bias_correction=True), fails where they differ from torch.optim.Muon's, a planted optax Muon fails;
parameters and state are mirrored exactly."""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import pytest
import torch

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
optax = pytest.importorskip("optax")

from ortho_verify import TORCH_MUON, MuonConventions, check_optimizer  # noqa: E402
from ortho_verify.frameworks import optax_optimizer  # noqa: E402

#: The factory keywords of optax.contrib.muon for check_optimizer's lr, momentum and weight_decay.
NAMES = {"lr": "learning_rate", "momentum": "beta", "weight_decay": "weight_decay"}
#: optax.contrib.muon(nesterov=False) as read from its source (optax 0.2.8, contrib/_muon.py): EMA momentum
#: (update_moment with order 1), Keller Jordan's coefficients, X₀ = U/(‖U‖_F + 1e-8), Newton–Schulz in the
#: parameters' dtype, width scale √max(1, fan_out/fan_in) = "original" in the in_out layout, weight decay
#: added to the orthogonalized update before the lr (decoupled, unscaled lr). Without Nesterov the bias
#: correction M/(1 − β^t) is a scalar that the normalization removes.
OPTAX_MUON = MuonConventions(nesterov=False, coefficients="jordan", eps=1e-8, eps_mode="add", adjust_lr="original",
                             ns_dtype=torch.float32, momentum_state_key="momentum", hyperparameter_names=NAMES)
OptaxMuon = optax_optimizer(functools.partial(optax.contrib.muon, nesterov=False))
#: optax.contrib.muon with its defaults: the Nesterov mix bias-corrected,
#: U_t = β·M_t/(1 − β^(t+1)) + (1 − β)·G_t/(1 − β^t), the stored M_t the uncorrected EMA.
OPTAX_MUON_DEFAULT = dataclasses.replace(OPTAX_MUON, nesterov=True, bias_correction=True)
OptaxMuonDefault = optax_optimizer(optax.contrib.muon)
FAST = dict(steps=2, statistical_matrices=0)
#: A tall and a wide matrix: the two orientations, one compilation of fewer leaves than the default three.
TWO = dict(FAST, shapes=[(37, 16), (12, 29)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_optax_muon_passes_under_its_conventions(dtype):
    extra = {} if dtype == torch.float32 else {"statistical_matrices": 8}  # the bfloat16 run's statistical row
    report = check_optimizer(OptaxMuon, OPTAX_MUON, param_dtype=dtype, **extra)
    assert report.passed, report.summary()
    assert {"muon_update/ns_vs_ns_map", "muon_momentum"} <= {r.check for r in report.results}


def test_optax_muon_declared_as_torch_muon_fails_naming_nesterov():
    torch_muon = dataclasses.replace(TORCH_MUON, hyperparameter_names=NAMES, momentum_state_key="momentum")
    report = check_optimizer(OptaxMuon, torch_muon, param_dtype=torch.float32, **FAST)
    assert report.status == "failed"
    assert "the Nesterov term dropped" in report.cause and "nesterov=True" in report.cause, report.cause
    momenta = [r for r in report.results if r.check == "muon_momentum"]
    assert len(momenta) == 6 and all(r.passed for r in momenta)  # the buffer is the same EMA


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_optax_muon_defaults_pass_with_bias_correction_declared(dtype):
    extra = {} if dtype == torch.float32 else {"statistical_matrices": 8}  # the bfloat16 run's statistical row
    report = check_optimizer(OptaxMuonDefault, OPTAX_MUON_DEFAULT, param_dtype=dtype, **extra)
    assert report.passed, report.summary()
    steps = {r.input.rsplit("step ", 1)[1] for r in report.results if r.check == "muon_update/ns_vs_ns_map"}
    assert {"1", "2", "3"} <= steps and any(r.check == "muon_momentum" for r in report.results)
    if dtype == torch.bfloat16:
        assert any(r.check == "optimizer_mean_deviation" and r.claimed for r in report.results)


def test_optax_default_nesterov_undeclared_bias_correction_fails_from_step_2():
    """Declared without bias_correction, optax's Nesterov input U = β·M_t/(1 − β^(t+1)) + (1 − β)·G_t/(1 − β^t)
    is ∝ G at step 1 (passes as torch's mix) and leaves it from step 2; the momentum buffer itself is the
    declared EMA at every step."""
    declared = dataclasses.replace(OPTAX_MUON_DEFAULT, bias_correction=False)
    report = check_optimizer(OptaxMuonDefault, declared, param_dtype=torch.float32, **TWO)
    updates = [r for r in report.results if r.check.startswith("muon_update/")]
    first = [r for r in updates if r.input.endswith("step 1")]
    second = [r for r in updates if r.input.endswith("step 2") and r.check.endswith("ns_vs_ns_map")]
    momenta = [r for r in report.results if r.check == "muon_momentum"]
    assert first and second and len(momenta) == 4
    assert all(r.passed for r in first + momenta) and not any(r.passed for r in second)


class UserMuonState(NamedTuple):
    momentum: dict


def user_muon(learning_rate, beta=0.95, weight_decay=0.0, *, decay_twice=False):
    """A user's Muon written as an optax transform, torch.optim.Muon's conventions with float32
    Newton–Schulz: M ← βM + (1 − β)G, U = (1 − β)G + βM, optax's Newton–Schulz with eps 1e-7, width
    scale √max(1, fan_out/fan_in) in the (in, out) layout, decoupled weight decay. ``decay_twice``
    plants a bug: M ← β(βM) + (1 − β)G."""
    from optax.contrib._muon import orthogonalize_via_newton_schulz

    coefficients = jnp.asarray((3.4445, -4.7750, 2.0315))

    def init(params):
        return UserMuonState(jax.tree.map(jnp.zeros_like, params))

    def update(grads, state, params):
        def one(g, m, w):
            m = beta * (beta * m if decay_twice else m) + (1 - beta) * g
            o = orthogonalize_via_newton_schulz((1 - beta) * g + beta * m, coefficients, 5, eps=1e-7)
            scale = max(1.0, w.shape[1] / w.shape[0]) ** 0.5
            return -learning_rate * (scale * o + weight_decay * w), m

        pairs = jax.tree.map(one, grads, state.momentum, params)
        is_pair = lambda x: isinstance(x, tuple)  # noqa: E731
        return (jax.tree.map(lambda p: p[0], pairs, is_leaf=is_pair),
                UserMuonState(jax.tree.map(lambda p: p[1], pairs, is_leaf=is_pair)))

    return optax.GradientTransformation(init, update)


USER_MUON = MuonConventions(eps=1e-7, eps_mode="add", ns_dtype=torch.float32, momentum_state_key="momentum",
                            hyperparameter_names=NAMES)


def test_user_optax_muon_passes_and_its_momentum_decayed_twice_fails():
    good = check_optimizer(optax_optimizer(user_muon), USER_MUON, param_dtype=torch.float32, **TWO)
    assert good.passed, good.summary()
    bad = check_optimizer(optax_optimizer(functools.partial(user_muon, decay_twice=True)), USER_MUON,
                          param_dtype=torch.float32, **TWO)
    assert bad.status == "failed"
    failed = {r.check for r in bad.results if not r.passed}
    assert "muon_momentum" in failed and "muon_update/ns_vs_ns_map" in failed, failed
    assert all(r.passed for r in bad.results if r.check == "muon_momentum" and r.input.endswith("step 1"))


def l2_muon(learning_rate, beta, weight_decay):
    """L2 weight decay in optax: the decay added to the gradient before optax.contrib.muon's momentum."""
    return optax.chain(optax.add_decayed_weights(weight_decay),
                       optax.contrib.muon(learning_rate, beta=beta, nesterov=False))


def test_weight_decay_added_to_the_gradient_is_the_l2_style():
    l2 = optax_optimizer(l2_muon)
    assert check_optimizer(l2, dataclasses.replace(OPTAX_MUON, weight_decay_style="l2"), param_dtype=torch.float32,
                           **TWO).passed
    report = check_optimizer(l2, OPTAX_MUON, param_dtype=torch.float32, **TWO)  # declared decoupled
    assert report.status == "failed" and not all(r.passed for r in report.results if r.check == "muon_momentum")


def test_state_is_named_by_path_with_momentum_and_step():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = optax_optimizer(optax.contrib.muon)(model.named_parameters(), learning_rate=0.1)
    for _ in range(2):
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
    w, b = model[1].weight, model[1].bias
    assert sorted(opt.state[w]) == ["inner_states/muon/inner_state/0/count", "inner_states/muon/inner_state/0/mu",
                                    "inner_states/muon/inner_state/0/ns_coeffs", "momentum", "step"]
    assert sorted(opt.state[b]) == ["inner_states/adam/inner_state/0/count", "inner_states/adam/inner_state/0/mu",
                                    "inner_states/adam/inner_state/0/nu", "momentum", "step"]
    mu = opt.jax_state[0].inner_states["muon"].inner_state[0].mu["1"]["weight"]  # (in, out) = (3, 2)
    assert mu.shape == (3, 2) and opt.state[w]["momentum"].shape == w.shape == (2, 3)
    assert torch.equal(opt.state[w]["momentum"], torch.from_dlpack(mu).T)
    assert int(opt.state[w]["inner_states/muon/inner_state/0/count"]) == 2 and float(opt.state[w]["step"]) == 2.0


@pytest.mark.parametrize("layout", ["in_out", "out_in"])
def test_sgd_mirrors_torch_sgd_and_skips_params_without_grad(layout):
    shapes = [(5, 3), (4,), (2, 3, 2)]
    ours = [torch.nn.Parameter(torch.randn(s, generator=torch.Generator().manual_seed(i)))
            for i, s in enumerate(shapes)]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt = optax_optimizer(lambda lr, momentum: optax.sgd(lr, momentum=momentum), layout=layout)(ours, lr=0.1,
                                                                                              momentum=0.9)
    ref = torch.optim.SGD(theirs, lr=0.1, momentum=0.9)
    for t in range(3):
        for i, (p, q) in enumerate(zip(ours, theirs)):
            g = None if (i == 2 and t == 1) else torch.randn(shapes[i], generator=torch.Generator().manual_seed(9 + t))
            p.grad, q.grad = g, (None if g is None else g.clone())
        frozen = ours[2].detach().clone()
        opt.step()
        ref.step()
        if t == 1:
            assert torch.equal(ours[2], frozen)  # no gradient: value and own state kept
        for p, q in zip(ours, theirs):
            torch.testing.assert_close(p, q, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(opt.state[ours[0]]["momentum"], ref.state[theirs[0]]["momentum_buffer"])


def _no_update(lr):
    return optax.GradientTransformation(optax.identity().init, None)


def test_bad_input_names_the_argument_and_changes_nothing():
    with pytest.raises(TypeError, match="^transform_factory: expected a callable"):
        optax_optimizer(None)
    with pytest.raises(ValueError, match="^layout: expected one of"):
        optax_optimizer(optax.sgd, layout="rows")
    w = torch.nn.Parameter(torch.ones(3, 2))
    with pytest.raises(TypeError, match="^transform_factory: returned GradientTransformation without a callable up"):
        optax_optimizer(_no_update)([w], lr=0.1)
    report = check_optimizer(optax_optimizer(_no_update), dataclasses.replace(USER_MUON, hyperparameter_names={
        "lr": "lr", "momentum": "lr", "weight_decay": "lr"}), param_dtype=torch.float32, steps=1)
    assert report.status == "failed" and "transform_factory" in report.failures[0].result.note
    Sgd = optax_optimizer(lambda learning_rate: optax.sgd(learning_rate))
    with pytest.raises(TypeError, match="unexpected keyword argument 'lr'.*'learning_rate'"):
        Sgd([w], lr=0.1)
    with pytest.raises(TypeError, match=r"missing hyperparameter\(s\) \['learning_rate'\]"):
        Sgd([w])

    def wrong_tree(learning_rate):  # updates with one leaf too many
        return optax.GradientTransformation(lambda p: optax.EmptyState(),
                                            lambda u, s, p=None: ({**u, "extra": jnp.zeros(1)}, s))

    opt = optax_optimizer(wrong_tree)([w], learning_rate=0.1)
    w.grad = torch.ones(3, 2)
    with pytest.raises(ValueError, match="^transform_factory: update returned updates whose pytree does not match"):
        opt.step()
    masked = optax_optimizer(lambda learning_rate: optax.masked(optax.sgd(learning_rate), {"w": True}))
    opt = masked([w], learning_rate=0.1)
    with pytest.raises(Exception) as err:  # optax's own error, with the params pytree described
        opt.step()
    assert any("params pytree of group 0" in note and "'0'" in note for note in getattr(err.value, "__notes__", []))
    w.grad = torch.ones(3, 2).to_sparse()
    with pytest.raises(ValueError, match=r"^params: the gradient of '0' is sparse, expected a dense gradient"):
        Sgd([w], learning_rate=0.1).step()
    assert torch.equal(w, torch.ones(3, 2)) and not opt.state  # nothing changed
    with pytest.raises(NotImplementedError, match="load_state_dict"):
        Sgd([w], learning_rate=0.1).load_state_dict({})


def _torch_signature(factory):
    """optax.contrib.muon behind torch's keyword names, as identify_optimizer probes them."""
    adapted = optax_optimizer(factory)

    def build(params, lr=0.02, momentum=0.95, weight_decay=0.0):
        return adapted(params, learning_rate=lr, beta=momentum, weight_decay=weight_decay)
    return build


@pytest.mark.parametrize("nesterov", [True, False])
def test_identification_recovers_the_bias_correction(nesterov):
    """With Nesterov the two-step momentum probe sees the debiased mix; without, only the eps probe sees
    U₁ = G instead of (1 − β)G. Either way the declaration found has bias_correction=True."""
    from ortho_verify.identify.optimizer import identify_optimizer

    found = identify_optimizer(_torch_signature(functools.partial(optax.contrib.muon, nesterov=nesterov)),
                               judge=False)
    conv = found.declaration
    assert found.fits and not found.differences, found.summary()
    assert (conv.nesterov, conv.bias_correction, conv.momentum_style, conv.eps, conv.eps_mode) == (
        nesterov, True, "ema", 1e-8, "add"), found.summary()
