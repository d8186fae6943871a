"""Bad input to the optimizers' constructors, ``add_param_group`` and ``load_state_dict``: a clear
error of the expected type whose message starts with the argument or key the user gave, and
nothing changed — parameters, state and param groups compared deeply before and after (
"Checkpoints").

The table covers every optimizer class (``Muon``, ``NorMuon``, ``Dion``, ``Dion2`` and
``HybridOptimizer`` with AdamW, Lion and mixed groups) against the corruptions a checkpoint meets
in practice: state keys turned into strings by JSON, an entry of no parameter, a key of no
algorithm, an id listed twice, another optimizer's state dict, negative second moments; and at
construction a parameter listed twice, a meta-device parameter, an out-of-range decay, an alias.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_fast
from ortho_fast import Dion, Dion2, HybridOptimizer, Muon, NorMuon

SHAPES = ((6, 4), (4, 5), (3, 3))


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in SHAPES]


#: name -> (factory(params) -> optimizer, second-moment state key or None)
OPTIMIZERS = {
    "Muon": (lambda ps: Muon(ps), None),
    "NorMuon": (lambda ps: NorMuon(ps), "variance_neuron"),
    "Dion": (lambda ps: Dion(ps), None),
    "Dion2": (lambda ps: Dion2(ps), None),
    "AdamW": (lambda ps: HybridOptimizer([{"params": ps, "algorithm": "adamw"}]), "exp_avg_sq"),
    "Lion": (lambda ps: HybridOptimizer([{"params": ps, "algorithm": "lion"}]), None),
    "Hybrid": (lambda ps: HybridOptimizer([{"params": ps[:2], "algorithm": "muon"},
                                           {"params": ps[2:], "algorithm": "adamw"}]), "exp_avg_sq"),
}


def _stepped(name: str, steps: int = 2, seed: int = 0):
    params = _params(seed)
    opt = OPTIMIZERS[name][0](params)
    g = torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    return params, opt


def _snapshot(value):
    """A deep copy in which tensors are cloned, for ``_assert_same``."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _snapshot(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_snapshot(v) for v in value)
    return copy.deepcopy(value)


def _assert_same(a, b, where="") -> None:
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _everything(opt, params):
    """Parameters, per-parameter state (in parameter order) and param groups (parameters by index)."""
    index = {id(p): i for i, p in enumerate(params)}
    groups = [{k: ([index[id(p)] for p in v] if k == "params" else v) for k, v in g.items()}
              for g in opt.param_groups]
    return _snapshot({"params": list(params), "state": [dict(opt.state.get(p, {})) for p in params],
                      "groups": groups})


def _raises_and_keeps(opt, params, action, error, match) -> None:
    before = _everything(opt, params)
    with pytest.raises(error, match=match):
        action()
    _assert_same(before, _everything(opt, params), "after the raise")


# -------------------------------------------------------------------------- load_state_dict


def _json_keys(sd):
    sd["state"] = {str(k): v for k, v in sd["state"].items()}


def _extra_entry(sd):
    sd["state"][99] = copy.deepcopy(next(iter(sd["state"].values())))


def _unknown_key(sd):
    next(iter(sd["state"].values()))["not_a_state_key"] = torch.zeros(1)


def _duplicate_id(sd):
    sd["param_groups"][-1]["params"].append(sd["param_groups"][0]["params"][0])


LOAD_CORRUPTIONS = {
    "string state keys (JSON)": (_json_keys, ValueError, r"^state: key '0' is a string .*int\(k\)"),
    "entry of no parameter": (_extra_entry, ValueError, r"^state: key 99 is not a parameter id"),
    "unknown state key": (_unknown_key, ValueError, r"^not_a_state_key: not a \w+ state key"),
    "id listed twice": (_duplicate_id, ValueError, r"^param_groups: parameter id 0 is listed twice"),
}


@pytest.mark.parametrize("corruption", list(LOAD_CORRUPTIONS))
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_corrupt_checkpoint_raises_naming_the_key_and_changes_nothing(name, corruption):
    params, opt = _stepped(name)
    sd = copy.deepcopy(opt.state_dict())
    corrupt, error, match = LOAD_CORRUPTIONS[corruption]
    corrupt(sd)
    _raises_and_keeps(opt, params, lambda: opt.load_state_dict(sd), error, match)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_the_conversion_the_json_error_names_restores_the_checkpoint(name):
    """The message's fix ({int(k): v ...}) loads the checkpoint, and the next step equals the original's."""
    params, opt = _stepped(name)
    sd = copy.deepcopy(opt.state_dict())
    sd["state"] = {str(k): v for k, v in sd["state"].items()}
    sd["param_groups"] = json.loads(json.dumps(sd["param_groups"], default=str))  # the groups' trip too
    other_params, other = _stepped(name, steps=0)
    with torch.no_grad():
        for q, p in zip(other_params, params):
            q.copy_(p)
    with pytest.raises(ValueError, match="string"):
        other.load_state_dict(sd)
    sd["state"] = {int(k): v for k, v in sd["state"].items()}
    other.load_state_dict(sd)
    for p, q in zip(params, other_params):
        p.grad = torch.ones_like(p)
        q.grad = torch.ones_like(q)
    opt.step()
    other.step()
    for p, q in zip(params, other_params):
        torch.testing.assert_close(q, p, rtol=0, atol=0)


@pytest.mark.parametrize("name", [n for n, (_, key) in OPTIMIZERS.items() if key is not None])
@settings(max_examples=10, deadline=None)
@given(scale=st.floats(1e-30, 1e30), index=st.integers(0, 2))
def test_a_negative_second_moment_raises(name, scale, index):
    params, opt = _stepped(name)
    key = OPTIMIZERS[name][1]
    sd = copy.deepcopy(opt.state_dict())
    holders = [e for e in sd["state"].values() if key in e]
    entry = holders[index % len(holders)]
    entry[key].view(-1)[0] = -scale
    _raises_and_keeps(opt, params, lambda: opt.load_state_dict(sd), ValueError,
                      rf"^{key}: a second moment must be >= 0")


@pytest.mark.parametrize("name", ["Muon", "NorMuon", "Dion2"])
def test_a_torch_sgd_state_dict_is_foreign(name):
    params, opt = _stepped(name)
    sgd = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    for p in params:
        p.grad = torch.ones_like(p)
    sgd.step()
    foreign = copy.deepcopy(sgd.state_dict())
    match = r"^(dampening: an option of torch\.optim\.SGD|momentum: an option of ortho_fast muon)"
    _raises_and_keeps(opt, params, lambda: opt.load_state_dict(foreign), ValueError, match)


def test_dion2_loading_a_muon_state_dict_says_it_is_muon_s():
    params, muon = _stepped("Muon")
    dion2 = Dion2(params)
    _raises_and_keeps(dion2, params, lambda: dion2.load_state_dict(muon.state_dict()), ValueError,
                      r"^momentum: an option of ortho_fast muon, not of dion2")


def test_a_torch_muon_checkpoint_still_loads():
    """The documented path (docs/compatibility.md): torch.optim.Muon's groups are mapped, not foreign."""
    params = _params()
    torch_opt = torch.optim.Muon(params)
    for p in params:
        p.grad = torch.ones_like(p)
    torch_opt.step()
    Muon(params).load_state_dict(torch_opt.state_dict())


def test_a_torch_adamw_checkpoint_still_loads_into_an_adamw_group():
    params = _params()
    torch_opt = torch.optim.AdamW(params)
    for p in params:
        p.grad = torch.ones_like(p)
    torch_opt.step()
    HybridOptimizer([{"params": params, "algorithm": "adamw"}]).load_state_dict(torch_opt.state_dict())


def test_a_scheduler_s_own_group_key_is_kept():
    params, opt = _stepped("Muon")
    sd = copy.deepcopy(opt.state_dict())
    sd["param_groups"][0]["initial_lr"] = 0.5
    opt.load_state_dict(sd)
    assert opt.param_groups[0]["initial_lr"] == 0.5


# -------------------------------------------------------------------------- construction


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_parameter_listed_twice_is_rejected(name):
    p = _params()[0]
    with pytest.raises(ValueError, match=r"^(param group 0 \(\w+\): )?params: parameter 1 is parameter 0 again"):
        OPTIMIZERS[name][0]([p, p])


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_add_param_group_with_a_parameter_twice_changes_nothing(name):
    params, opt = _stepped(name)
    extra = torch.nn.Parameter(torch.randn(4, 4))
    group = {"params": [extra, extra]}
    if isinstance(opt, HybridOptimizer):
        group["algorithm"] = opt.param_groups[0]["algorithm"]
    _raises_and_keeps(opt, params, lambda: opt.add_param_group(group), ValueError,
                      r"^(param group \d \(\w+\): )?params: parameter 1 is parameter 0 again")


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_meta_device_parameter_is_rejected_naming_it(name):
    meta = [torch.nn.Parameter(torch.empty(s, device="meta")) for s in SHAPES]
    with pytest.raises(ValueError, match=r"params: parameter 0 of shape \(6, 4\) is on the meta device"):
        OPTIMIZERS[name][0](meta)


@settings(max_examples=20, deadline=None)
@given(st.one_of(st.floats(1.0, 1e6, exclude_min=True), st.floats(-1e6, 0, exclude_max=True)))
def test_dion2_ef_decay_outside_0_1_is_rejected_everywhere(ef_decay):
    with pytest.raises(ValueError, match=r"^ef_decay: expected a finite value in \[0\.0, 1\.0\]"):
        Dion2(_params(), ef_decay=ef_decay)
    params, opt = _stepped("Dion2")
    _raises_and_keeps(opt, params, lambda: opt.add_param_group({"params": [torch.nn.Parameter(torch.randn(3, 3))],
                                                                "ef_decay": ef_decay}),
                      ValueError, r"^ef_decay")
    sd = copy.deepcopy(opt.state_dict())
    sd["param_groups"][0]["ef_decay"] = ef_decay
    _raises_and_keeps(opt, params, lambda: opt.load_state_dict(sd), ValueError, r"^ef_decay")


@pytest.mark.parametrize("make, alias", [
    (lambda v: Muon(_params(), mu=v), "mu"),
    (lambda v: Muon([{"params": _params(), "mu": v}]), "mu"),
    (lambda v: NorMuon(_params(), muon_beta2=v), "muon_beta2"),
    (lambda v: Dion(_params(), rcqr_oversample=-v), "rcqr_oversample"),
])
def test_errors_name_the_alias_the_user_gave(make, alias):
    with pytest.raises(ValueError, match=rf"^{alias} \(\w+ here\): expected"):
        make(1.5)


def test_a_saved_group_s_alias_is_named_on_load():
    params, opt = _stepped("Muon")
    sd = copy.deepcopy(opt.state_dict())
    group = sd["param_groups"][0]
    group["mu"] = 1.5
    del group["momentum"]
    _raises_and_keeps(opt, params, lambda: opt.load_state_dict(sd), ValueError, r"^mu \(momentum here\)")


@pytest.mark.parametrize("out_dtype", [torch.int32, torch.int64, torch.bool, torch.complex64, "float32"])
def test_newton_schulz_out_dtype_must_be_floating(out_dtype):
    g = torch.randn(4, 3)
    with pytest.raises(TypeError, match=r"^out_dtype: expected None or a real floating torch\.dtype"):
        ortho_fast.newton_schulz(g, out_dtype=out_dtype)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_parameter_in_two_groups_is_named(name):
    params, opt = _stepped(name)
    group = {"params": [torch.nn.Parameter(torch.randn(3, 3)), params[0]]}
    if isinstance(opt, HybridOptimizer):
        group["algorithm"] = opt.param_groups[0]["algorithm"]
    _raises_and_keeps(opt, params, lambda: opt.add_param_group(group), ValueError,
                      r"^params: parameter 1 of the new param group is already parameter 0 of param group 0")


def test_a_hybrid_group_s_alias_is_named():
    with pytest.raises(ValueError, match=r"^param group 0 \(muon\): mu \(momentum here\): expected"):
        HybridOptimizer([{"params": _params(), "algorithm": "muon", "mu": 1.5}])
