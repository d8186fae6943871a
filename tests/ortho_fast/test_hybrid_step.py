"""ortho_fast.HybridOptimizer steps every algorithm at once: bitwise each algorithm's own class
applied separately (ortho_fast.Muon, ortho_fast.Dion, torch.optim.AdamW, the Lion group
function); MuonConfig's defaults are torch.optim.Muon's and torch.optim.AdamW's; MuonConfig /
DionConfig resolve the schedule's normalization, reject ambiguous 3-D parameters and take their
defaults from their documented sources.
"""

from __future__ import annotations

import collections
import copy
import math

import pytest
import torch
from torch import nn

import ortho_fast
from ortho_fast import DionConfig, HybridOptimizer, MuonConfig
from ortho_fast.groups.scalar import ADAMW_DEFAULTS, lion_group_step, normalize_lion_group
from tests.ortho_fast.helpers import D_MODEL, HYBRID_CONFIGS, assert_same_model, fill_grads, gpt_model, groups_by_name

# =======================================================================================
# HybridOptimizer == each algorithm's own optimizer, applied separately
# =======================================================================================


def _options(group, drop=("algorithm",)):
    return {k: v for k, v in group.items() if k not in drop}


def _separate(opt: HybridOptimizer, model_copy: nn.Module) -> list:
    """Each algorithm's groups, mapped onto ``model_copy``, in its own optimizer:
    ortho_fast.Muon, ortho_fast.Dion (same seed), torch.optim.AdamW (single-tensor, CPU's
    default), and the Lion group function."""
    params = dict(model_copy.named_parameters())
    by_alg = collections.defaultdict(list)
    for g in opt.param_groups:
        by_alg[g["algorithm"]].append({**_options(g), "params": [params[n] for n in g["param_names"]]})
    out = []
    if by_alg["muon"]:
        out.append(ortho_fast.Muon(by_alg["muon"]))
    if by_alg["dion"]:
        out.append(ortho_fast.Dion(by_alg["dion"], seed=opt.seed))
    if by_alg["adamw"]:
        out.append(torch.optim.AdamW([_options(g, ("param_names",)) for g in by_alg["adamw"]], foreach=False))
    if by_alg["lion"]:
        out.append(_LionGroups(by_alg["lion"]))
    return out


class _LionGroups:
    """Lion groups stepped by the group function alone (there is no torch.optim.Lion)."""

    def __init__(self, groups):
        self.groups, self.state = groups, collections.defaultdict(dict)
        for g in groups:
            normalize_lion_group(g)

    def step(self):
        for g in self.groups:
            lion_group_step(g, self.state)


@pytest.mark.parametrize("config", HYBRID_CONFIGS)
def test_hybrid_step_equals_each_algorithm_applied_separately(config):
    model = gpt_model()
    twin = copy.deepcopy(model)
    opt = HYBRID_CONFIGS[config]().build(model)
    separate = _separate(opt, twin)
    for k in range(3):
        fill_grads(model, k)
        fill_grads(twin, k)
        opt.step()
        for o in separate:
            o.step()
        assert_same_model(model, twin)
    assert len(opt.state) == sum(len(o.state) for o in separate) == 35


def test_muon_config_defaults_are_torch_muon_and_torch_adamw():
    """MuonConfig(muon_options={"bitwise_torch": True}) on 2-D weights is bitwise torch.optim.Muon
    with its defaults (the fast default batches same-shape matrices), and its
    AdamW groups are torch.optim.AdamW with its defaults (embeddings without decay)."""
    model = gpt_model()
    twin = copy.deepcopy(model)
    opt = MuonConfig(expert_keys=("experts",), muon_options={"bitwise_torch": True}).build(model)
    params = dict(twin.named_parameters())
    groups = {g["algorithm"]: [] for g in opt.param_groups}
    for g in opt.param_groups:
        groups[g["algorithm"]] += [n for n in g["param_names"] if g["algorithm"] == "adamw" or params[n].ndim == 2]
    emb = ["_orig_mod.wte.weight", "_orig_mod.wpe.weight"]
    torch_muon = torch.optim.Muon([params[n] for n in groups["muon"]])
    torch_adamw = torch.optim.AdamW([{"params": [params[n] for n in groups["adamw"] if n not in emb]},
                                     {"params": [params[n] for n in emb], "weight_decay": 0.0}])
    for k in range(3):
        fill_grads(model, k)
        fill_grads(twin, k)
        opt.step()
        torch_muon.step()
        torch_adamw.step()
    named = dict(model.named_parameters())
    for n in groups["muon"] + groups["adamw"]:
        assert torch.equal(named[n], params[n]), n
    assert len(groups["muon"]) == 9 and len(groups["adamw"]) == 24


@pytest.mark.parametrize("coefficients, resolved", [
    ("jordan", (None, 1.0, 1e-7, "clamp")), ("polar_express", (None, 1.02, 1e-6, "add")),
    ("you6", (None, 1.0, 1e-7, "add")),
])
def test_muon_config_normalization_and_steps_come_from_the_schedule(coefficients, resolved):
    """MuonConfig resolves ns_steps / safety / eps / eps_mode as Muon does: you6 runs its 6
    rows (ns_steps None), polar_express normalizes with 1.02 and 1e-6 added. The step equals
    ortho_fast.Muon(coefficients=...) with its own defaults, bitwise."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 8, bias=False))
    twin = copy.deepcopy(model)
    opt = MuonConfig(coefficients=coefficients).build(model)
    (group,) = opt.param_groups
    assert (group["ns_steps"], group["safety"], group["eps"], group["eps_mode"]) == resolved
    ref = ortho_fast.Muon(twin.parameters(), coefficients=coefficients)
    fill_grads(model, 0)
    fill_grads(twin, 0)
    opt.step()
    ref.step()
    assert_same_model(model, twin)
    group = MuonConfig(coefficients=coefficients, ns_steps=2, eps_mode="clamp", muon_options={"eps": 0.5}).build(
        copy.deepcopy(model)).param_groups[0]
    assert (group["ns_steps"], group["eps_mode"], group["eps"]) == (2, "clamp", 0.5)


def test_three_dim_parameters_need_expert_keys_or_flatten():
    """A 3-D parameter no expert key matches (the MoE stack here, or a conv1d weight) is not
    silently flattened by Muon or Dion: building raises naming expert_keys / flatten; an
    override with flatten=True takes a conv1d weight as one (out, in·k) matrix."""
    with pytest.raises(ValueError, match=r"param group \d \(muon\): params: '_orig_mod.moe.experts.w1'.*expert_keys"):
        MuonConfig().build(gpt_model())
    with pytest.raises(ValueError, match=r"\(dion\): params: .*flatten=True.*expert_keys"):
        DionConfig().build(gpt_model())
    net = nn.Sequential(nn.Conv1d(4, 6, 3, bias=False), nn.Conv2d(6, 4, 2, bias=False))
    opt = MuonConfig(overrides=(("0.weight", {"flatten": True}),)).build(net)
    assert [(g["param_names"], g["flatten"]) for g in opt.param_groups] == [(["0.weight"], True), (["1.weight"], None)]
    opt = DionConfig(overrides=(("0.weight", {"flatten": True}),)).build(net)
    assert all(g["flatten"] for g in opt.param_groups)


def test_config_defaults_and_their_sources():
    opt = DionConfig(overrides=(("*experts.w1", {"algorithm": "muon"}),), expert_keys=("experts",)).build(gpt_model())
    dion = next(g for g in opt.param_groups if g["algorithm"] == "dion")
    assert (dion["lr"], dion["mu"], dion["weight_decay"], dion["rank_fraction"], dion["rank_multiple_of"]) == \
        (0.01, 0.95, 0.1, 1.0, 1)
    adamw = groups_by_name(opt.param_groups)
    assert adamw["_orig_mod.ln_f.weight"]["betas"] == (0.9, 0.95)
    assert adamw["_orig_mod.ln_f.weight"]["weight_decay"] == 0.1
    assert adamw["_orig_mod.wte.weight"]["weight_decay"] == 0.0
    assert adamw["_orig_mod.lm_head.weight"]["lr"] == 0.01 / math.sqrt(D_MODEL)
    lion = groups_by_name(MuonConfig(scalar_algorithm="lion", expert_keys=("experts",)).build(gpt_model()).param_groups)
    lion = lion["_orig_mod.ln_f.weight"]
    assert lion["algorithm"] == "lion" and lion["betas"] == (0.95, 0.98)  # Megatron's Lion betas
    muon = groups_by_name(MuonConfig(expert_keys=("experts",)).build(gpt_model()).param_groups)
    assert muon["_orig_mod.ln_f.weight"]["betas"] == ADAMW_DEFAULTS["betas"]
    assert muon["_orig_mod.ln_f.weight"]["weight_decay"] == ADAMW_DEFAULTS["weight_decay"]
    assert muon["_orig_mod.lm_head.weight"]["lr"] == 1e-3  # no head scaling in torch
