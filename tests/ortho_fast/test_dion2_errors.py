"""ortho_fast.Dion2: bad options and inputs rejected naming the argument, with no change; state
dicts round-trip bitwise and are checked on load."""

from __future__ import annotations

import copy

import pytest
import torch

import ortho_fast


def _opt(**kwargs):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(6, 10)), torch.nn.Parameter(torch.randn(10, 6))]
    return params, ortho_fast.Dion2(params, lr=0.05, **kwargs)


def _step(params, opt, seed):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    opt.step()


@pytest.mark.parametrize("kwargs, name", [
    ({"fraction": 0.0}, "fraction"), ({"fraction": 1.5}, "fraction"), ({"ef_decay": -0.1}, "ef_decay"),
    ({"lr": -1.0}, "lr"), ({"weight_decay": float("nan")}, "weight_decay"), ({"adjust_lr": "original"}, "adjust_lr"),
    ({"selection_scope": "all"}, "selection_scope"), ({"flatten": 1}, "flatten"), ({"ns_steps": 0}, "ns_steps"),
    ({"use_triton": True}, "use_triton"), ({"triton_post_ortho": True}, "triton_post_ortho"),
    ({"betas": (2.0, 0.5)}, "betas"), ({"newton_schulz_func": print}, "newton_schulz_func"),
])
def test_bad_options_name_the_argument(kwargs, name):
    with pytest.raises((ValueError, TypeError), match=name):
        ortho_fast.Dion2([torch.nn.Parameter(torch.randn(4, 4))], **kwargs)


def test_unknown_keyword_suggests_the_closest_name():
    with pytest.raises(TypeError, match="ef_decay"):
        ortho_fast.Dion2([torch.nn.Parameter(torch.randn(4, 4))], ef_decy=0.9)
    with pytest.raises((ValueError, RuntimeError), match="distributed_mesh"):
        ortho_fast.Dion2([torch.nn.Parameter(torch.randn(4, 4))], object())


def test_bad_parameters_and_groups_are_rejected_whole():
    with pytest.raises(ValueError, match="params"):
        ortho_fast.Dion2([torch.nn.Parameter(torch.randn(4))])
    params, opt = _opt()
    with pytest.raises(ValueError, match="fraction"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.randn(3, 3))], "fraction": 2.0})
    with pytest.raises(ValueError, match="algorithm"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.randn(3, 3))], "algorithm": "muon"})
    assert len(opt.param_groups) == 1
    opt.add_param_group({"params": [torch.nn.Parameter(torch.randn(3, 3))], "algorithm": "dion2",
                         "use_polar_express": False})
    assert opt.param_groups[1]["coefficients"] == "cesista5"


def test_bad_gradient_or_edited_option_changes_nothing():
    params, opt = _opt()
    _step(params, opt, 1)
    before = ([p.detach().clone() for p in params], copy.deepcopy(opt.state_dict()))
    params[0].grad = torch.randn(6, 10)
    params[1].grad = torch.full((10, 6), float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        opt.step()
    params[1].grad = torch.randn(10, 6)
    opt.param_groups[0]["ef_decay"] = -1.0
    with pytest.raises(ValueError, match="ef_decay"):
        opt.step()
    opt.param_groups[0]["ef_decay"] = 0.95
    opt.state[params[0]]["momentum"] = torch.zeros(10, 6)
    with pytest.raises(ValueError, match="momentum"):
        opt.step()
    opt.state[params[0]]["momentum"] = before[1]["state"][0]["momentum"].clone()
    assert all(torch.equal(p, q) for p, q in zip(params, before[0]))
    assert all(torch.equal(opt.state[p]["momentum"], before[1]["state"][i]["momentum"]) for i, p in enumerate(params))


def test_state_dict_round_trips_bitwise():
    params, opt = _opt(dtype=torch.float32)
    _step(params, opt, 1)
    saved = copy.deepcopy(opt.state_dict())
    params2 = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt2 = ortho_fast.Dion2(params2, lr=0.05)
    opt2.load_state_dict(saved)
    assert opt2.param_groups[0]["dtype"] is torch.float32
    for a, b in ((params, opt), (params2, opt2)):
        _step(a, b, 2)
    assert all(torch.equal(p, q) for p, q in zip(params, params2))
    assert all(torch.equal(opt.state[p]["momentum"], opt2.state[q]["momentum"]) for p, q in zip(params, params2))
    # the loaded state owns its tensors
    assert not any(opt2.state[q]["momentum"].data_ptr() == saved["state"][i]["momentum"].data_ptr()
                   for i, q in enumerate(params2))


@pytest.mark.parametrize("corrupt, name", [
    (lambda s: s["state"][0].update(momentum=torch.zeros(3, 3)), "momentum"),
    (lambda s: s["state"][0].update(momentum=torch.full((6, 10), float("inf"))), "momentum"),
    (lambda s: s["state"][0].update(exp_avg=torch.zeros(6, 10)), "exp_avg"),
    (lambda s: s["param_groups"][0].update(fraction=0.0), "fraction"),
])
def test_bad_checkpoint_changes_nothing(corrupt, name):
    params, opt = _opt()
    _step(params, opt, 1)
    saved = copy.deepcopy(opt.state_dict())
    before = copy.deepcopy(opt.state_dict())
    corrupt(saved)
    with pytest.raises(ValueError, match=name):
        opt.load_state_dict(saved)
    after = opt.state_dict()
    assert after["param_groups"] == before["param_groups"]
    assert all(torch.equal(after["state"][i]["momentum"], before["state"][i]["momentum"]) for i in before["state"])


@pytest.mark.parametrize("bad, match", [
    (lambda p: torch.randn(p.shape, dtype=torch.float64), "grad: expected dtype"),
    (lambda p: torch.randn(p.shape, dtype=torch.complex64), "grad: Dion2 expects dense real gradients"),
])
def test_a_bad_gradient_on_the_second_parameter_changes_nothing(bad, match):
    """The second parameter's gradient of the wrong dtype / kind raises naming it, after the first
    parameter's gradient was fine: no weight and no momentum changed (torch itself refuses a
    gradient of another shape)."""
    params, opt = _opt()
    _step(params, opt, 1)
    before = ([p.detach().clone() for p in params], [opt.state[p]["momentum"].clone() for p in params])
    params[0].grad = torch.randn(6, 10)
    params[1].grad_dtype = None  # torch 2.13 refuses a gradient of another dtype unless told to accept any
    params[1].grad = bad(params[1])
    with pytest.raises(ValueError, match=match):
        opt.step()
    assert all(torch.equal(p, q) for p, q in zip(params, before[0]))
    assert all(torch.equal(opt.state[p]["momentum"], m) for p, m in zip(params, before[1]))
