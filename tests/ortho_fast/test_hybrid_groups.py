"""ortho_fast.HybridOptimizer's groups and options: microsoft/dion's scalar option names, the
constructor's options, named parameters, ``meshes_from_world_mesh`` (OLMo-core's mesh names),
deepcopy / pickle; and the error contract in one process: a rejected group is not added, a bad
gradient or an option edited on a live group of any algorithm raises before anything changes.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

import ortho_fast
from ortho_fast import HybridOptimizer
from ortho_fast.groups.scalar import ADAMW_DEFAULTS

# =======================================================================================
# microsoft/dion groups, options, errors
# =======================================================================================


def test_microsoft_dion_scalar_group_names_are_accepted():
    p, q = nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2))
    opt = HybridOptimizer([{"params": [p], "algorithm": "adamw", "beta1": 0.8, "epsilon": 1e-6},
                           {"params": [q], "algorithm": "lion", "beta2": 0.97}],
                          defaults={"lion": {"betas": (0.95, 0.98)}})
    adamw, lion = opt.param_groups
    assert adamw["betas"] == (0.8, ADAMW_DEFAULTS["betas"][1]) and adamw["eps"] == 1e-6
    assert lion["betas"] == (0.95, 0.97) and "beta2" not in lion


def _three_groups():
    torch.manual_seed(0)
    ps = [nn.Parameter(torch.randn(6, 4)), nn.Parameter(torch.randn(5, 3)), nn.Parameter(torch.randn(4)),
          nn.Parameter(torch.randn(3))]
    groups = [{"params": [ps[0]], "algorithm": "muon"}, {"params": [ps[1]], "algorithm": "dion"},
              {"params": [ps[2]], "algorithm": "adamw"}, {"params": [ps[3]], "algorithm": "lion"}]
    return ps, groups


@pytest.mark.parametrize("group, error, match", [
    ({"algorithm": "sgd"}, ValueError, r"param group 4: algorithm: expected one of"),
    ({}, ValueError, r"param group 4: algorithm: .*name it in every group"),
    ({"algorithm": "adamw", "params": None}, TypeError, "not iterable"),
    ({"algorithm": "adamw", "no_params": True}, ValueError, r"param group 4 \(adamw\): params: missing"),
    ({"algorithm": "adamw", "momentum": 0.9}, ValueError, r"param group 4 \(adamw\): momentum: an option of muon"),
    ({"algorithm": "lion", "eps": 1e-8}, ValueError, r"param group 4 \(lion\): eps: an option of muon/adamw"),
    ({"algorithm": "adamw", "lr": -1.0}, ValueError, r"param group 4 \(adamw\): lr"),
    ({"algorithm": "adamw", "betas": (0.9, 0.99), "beta1": 0.8}, ValueError, r"param group 4 \(adamw\): betas"),
    ({"algorithm": "muon", "coefficients": "nope"}, ValueError, r"param group 4 \(muon\): coefficients: unknown"),
    ({"algorithm": "dion"}, ValueError, r"param group 4 \(dion\): params: Dion expects"),
])
def test_add_param_group_rejects_bad_groups_and_adds_nothing(group, error, match):
    _, groups = _three_groups()
    opt = HybridOptimizer(groups)
    group = dict(group)
    if "params" not in group and not group.pop("no_params", False):
        group["params"] = [nn.Parameter(torch.zeros(7))]
    group.pop("no_params", None)
    before = [dict(g) for g in opt.param_groups]
    with pytest.raises(error, match=match):
        opt.add_param_group(group)
    assert opt.param_groups == before


def test_constructor_options():
    ps, groups = _three_groups()
    opt = HybridOptimizer([{"params": [ps[2]]}], algorithm="adamw", defaults={"adamw": {"lr": 0.5}})
    assert opt.param_groups[0]["algorithm"] == "adamw" and opt.param_groups[0]["lr"] == 0.5
    for kwargs, match in ((dict(seed=1.5), "seed"), (dict(algorithm="sgd"), "algorithm"),
                          (dict(defaults={"sgd": {}}), "defaults: unknown algorithm"),
                          (dict(defaults={"adamw": {"momentum": 0.9}}), r"defaults\['adamw'\]: unknown option")):
        with pytest.raises((TypeError, ValueError), match=match):
            HybridOptimizer(groups, **kwargs)


@pytest.mark.parametrize("bad", [0, 1, 2, 3], ids=["muon", "dion", "adamw", "lion"])
def test_nan_gradient_in_any_group_changes_nothing(bad):
    ps, groups = _three_groups()
    opt = HybridOptimizer(groups, seed=1)
    for p in ps:
        p.grad = torch.randn_like(p)
    opt.step()  # state for every parameter
    params_before = [p.detach().clone() for p in ps]
    state_before = copy.deepcopy({id(p): dict(s) for p, s in opt.state.items()})
    for p in ps:
        p.grad = torch.randn_like(p)
    ps[bad].grad.view(-1)[1] = float("nan")
    with pytest.raises(ValueError, match=f"param group {bad} \\({groups[bad]['algorithm']}\\): grad"):
        opt.step()
    for p, before in zip(ps, params_before):
        assert torch.equal(p.detach(), before)
    for p, st in opt.state.items():
        assert st.keys() == state_before[id(p)].keys()
        assert all(torch.equal(v, state_before[id(p)][k]) for k, v in st.items())


@pytest.mark.parametrize("bad", [0, 1, 2, 3], ids=["muon", "dion", "adamw", "lion"])
@pytest.mark.parametrize("key, value", [("lr", float("nan")), ("weight_decay", -1.0)])
def test_option_edited_after_construction_changes_nothing(bad, key, value):
    """An option edited on a live group of any algorithm (a scheduler writing NaN) is caught
    by the check pass, naming the group and the key; no parameter or state changes."""
    ps, groups = _three_groups()
    opt = HybridOptimizer(groups, seed=1)
    for p in ps:
        p.grad = torch.randn_like(p)
    opt.step()
    params_before = [p.detach().clone() for p in ps]
    state_before = copy.deepcopy({id(p): dict(s) for p, s in opt.state.items()})
    for p in ps:
        p.grad = torch.randn_like(p)
    opt.param_groups[bad][key] = value
    with pytest.raises(ValueError, match=f"param group {bad} \\({groups[bad]['algorithm']}\\): {key}:"):
        opt.step()
    assert all(torch.equal(p.detach(), b) for p, b in zip(ps, params_before))
    for p, st in opt.state.items():
        assert all(torch.equal(v, state_before[id(p)][k]) for k, v in st.items())


def test_step_rejects_an_algorithm_changed_after_construction():
    ps, groups = _three_groups()
    opt = HybridOptimizer(groups)
    opt.param_groups[2]["algorithm"] = "sgd"
    with pytest.raises(ValueError, match="param group 2: algorithm"):
        opt.step()


def test_named_parameters_keep_their_names():
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    opt = HybridOptimizer(model.named_parameters(), algorithm="adamw")
    assert opt.param_groups[0]["param_names"] == [n for n, _ in model.named_parameters()]
    assert opt.state_dict()["param_groups"][0]["param_names"] == opt.param_groups[0]["param_names"]


class _NamedMesh:
    """Stand-in for a world DeviceMesh: its dims by name (``mesh["tp"]`` -> "tp")."""

    def __init__(self, *names):
        self.mesh_dim_names = names

    def __getitem__(self, name):
        assert name in self.mesh_dim_names
        return name


@pytest.mark.parametrize("names, want", [
    (("dp_replicate", "dp_shard", "tp"), ("dp_replicate", "dp_shard", "tp")),
    (("dp_replicate", "dp_shard"), ("dp_replicate", "dp_shard", None)),
    (("dp", "tp"), (None, "dp", "tp")),
    (("dp_shard_cp", "pp"), (None, "dp_shard_cp", None)),
    (("tp",), (None, None, "tp")),
])
def test_meshes_from_world_mesh_follows_olmo_core(names, want):
    got = ortho_fast.meshes_from_world_mesh(_NamedMesh(*names))
    assert (got["replicate_mesh"], got["outer_shard_mesh"], got["inner_shard_mesh"]) == want
    assert (got["distributed_mesh"], got["tp_mesh"]) == want[1:]
    assert got["replicate_mesh_grad_sync"] is False
    assert ortho_fast.meshes_from_world_mesh(None) == {}


@pytest.mark.parametrize("names", [(), ("dp", "dp_shard")])
def test_meshes_from_world_mesh_rejects_ambiguous_meshes(names):
    with pytest.raises(ValueError, match="mesh:"):
        ortho_fast.meshes_from_world_mesh(_NamedMesh(*names))


def test_deepcopy_and_pickle_step_as_the_original():
    """copy.deepcopy / pickle keep the seed, the default algorithm and its options (torch's
    Optimizer.__getstate__ keeps only defaults, state and param_groups): the copies step bitwise
    as the original and add a group without ``algorithm`` as it does."""
    ps, groups = _three_groups()
    opt = HybridOptimizer(groups, seed=7, algorithm="adamw", defaults={"adamw": {"lr": 0.25}})
    for p in ps:
        p.grad = torch.randn_like(p)
    opt.step()
    buffer = io.BytesIO()
    torch.save(opt, buffer)
    copies = [copy.deepcopy(opt), torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)]
    grads = [torch.randn_like(p) for p in ps]
    for o in [opt] + copies:
        for p, g in zip((p for group in o.param_groups for p in group["params"]), grads):
            p.grad = g.clone()
        o.step()
        o.add_param_group({"params": [nn.Parameter(torch.zeros(3))]})
        assert o.seed == 7 and o.param_groups[-1]["algorithm"] == "adamw" and o.param_groups[-1]["lr"] == 0.25
    for copied in copies:
        for p, q in zip(ps, (q for group in copied.param_groups for q in group["params"])):
            assert torch.equal(p, q)
