"""ortho_fast.hybrid: which parameter goes to which algorithm (param_groups), one optimizer
stepping them all (HybridOptimizer == each algorithm's own class applied separately, bitwise),
state_dict round trips, deepcopy / pickle, microsoft/dion and torch checkpoint compatibility,
and the error contract (a rejected group is not added, a rejected step changes nothing; on 2
gloo ranks, one launch for the module: a gradient that one rank alone rejects raises on both)."""

from __future__ import annotations

import collections
import copy
import io
import math

import pytest
import torch
from torch import nn

import ortho_fast
from ortho_fast import (
    ADAMW_DEFAULTS, DionConfig, HybridOptimizer, MuonConfig, lion_group_step, normalize_lion_group, param_groups,
)

D, VOCAB, CTX = 8, 16, 4


class Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)  # fused QKV
        self.proj = nn.Linear(d, d)


class MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(d), Attention(d), nn.LayerNorm(d), MLP(d)


class CheckpointWrapper(nn.Module):
    """Stands for torch.distributed's checkpoint_wrapper (its attribute name)."""

    def __init__(self, inner):
        super().__init__()
        self._checkpoint_wrapped_module = inner


class Compiled(nn.Module):
    """Stands for torch.compile's OptimizedModule (its attribute name)."""

    def __init__(self, inner):
        super().__init__()
        self._orig_mod = inner


class MoE(nn.Module):
    def __init__(self, d, experts=3):
        super().__init__()
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.Module()
        self.experts.w1 = nn.Parameter(0.02 * torch.randn(experts, 2 * d, d))  # (E, m, n)
        self.experts.b1 = nn.Parameter(torch.zeros(experts, 2 * d))  # expert biases: vectors


class GPT(nn.Module):
    def __init__(self, tied: bool = False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        self.patch = nn.Conv2d(1, D, 2)  # a 4-D conv weight
        self.blocks = nn.ModuleList([Block(D), CheckpointWrapper(Block(D))])
        self.moe = MoE(D)
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        if tied:
            self.lm_head.weight = self.wte.weight
        self.scale = nn.Parameter(torch.ones(()))
        self.frozen = nn.Parameter(torch.ones(3), requires_grad=False)


def _model(tied=False, seed=0) -> nn.Module:
    torch.manual_seed(seed)
    return Compiled(GPT(tied))


def _expected(lr, scalar_lr, wd, scalar_wd, head_lr, tied=False) -> dict:
    """name -> (algorithm, lr, weight_decay) for the GPT above under Muon / AdamW."""
    out = {}
    for b, wrap in ((0, ""), (1, "_checkpoint_wrapped_module.")):
        pre = f"_orig_mod.blocks.{b}.{wrap}"
        for mat in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"):
            out[pre + mat + ".weight"] = ("muon", lr, wd)
            out[pre + mat + ".bias"] = ("adamw", scalar_lr, scalar_wd)
        for ln in ("ln_1", "ln_2"):
            out[pre + ln + ".weight"] = out[pre + ln + ".bias"] = ("adamw", scalar_lr, scalar_wd)
    out.update({
        "_orig_mod.wte.weight": ("adamw", scalar_lr, 0.0), "_orig_mod.wpe.weight": ("adamw", scalar_lr, 0.0),
        "_orig_mod.patch.weight": ("muon", lr, wd), "_orig_mod.patch.bias": ("adamw", scalar_lr, scalar_wd),
        "_orig_mod.moe.router.weight": ("muon", lr, wd), "_orig_mod.moe.experts.w1": ("muon", lr, wd),
        "_orig_mod.moe.experts.b1": ("adamw", scalar_lr, scalar_wd),
        "_orig_mod.ln_f.weight": ("adamw", scalar_lr, scalar_wd), "_orig_mod.ln_f.bias": ("adamw", scalar_lr, scalar_wd),
        "_orig_mod.scale": ("adamw", scalar_lr, scalar_wd),
    })
    if not tied:
        out["_orig_mod.lm_head.weight"] = ("adamw", head_lr, scalar_wd)
    return out


def _assignment(groups) -> dict:
    out = {}
    for g in groups:
        for name, p in zip(g["param_names"], g["params"]):
            assert name not in out
            out[name] = (g["algorithm"], g["lr"], g["weight_decay"])
    return out


def _by_name(groups) -> dict:
    return {name: g for g in groups for name in g["param_names"]}


# =======================================================================================
# param_groups
# =======================================================================================


def test_param_groups_assigns_every_parameter_as_expected():
    model = _model()
    groups = param_groups(model, lr=0.02, scalar_lr=3e-3, weight_decay=0.1, scalar_weight_decay=0.01,
                          expert_keys=("experts",))
    assert _assignment(groups) == _expected(0.02, 3e-3, 0.1, 0.01, 3e-3 / math.sqrt(D))
    by_name = _by_name(groups)
    assert by_name["_orig_mod.moe.experts.w1"]["expert_keys"] == ("experts",)
    # names are the model's own; every trainable parameter once, the frozen one not at all
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert {n: p for g in groups for n, p in zip(g["param_names"], g["params"])}.keys() == named.keys()
    assert all(p is named[n] for g in groups for n, p in zip(g["param_names"], g["params"]))


def test_param_groups_defaults_follow_the_matrix_algorithm():
    """lr / weight_decay None: the matrix algorithm's defaults; the scalars take the same lr
    and weight decay (microsoft/dion, OLMo-core), the embeddings weight decay 0."""
    groups = param_groups(_model(), expert_keys=("experts",))
    mu = ortho_fast.MUON_DEFAULTS
    assert _assignment(groups) == _expected(mu["lr"], mu["lr"], mu["weight_decay"], mu["weight_decay"],
                                            mu["lr"] / math.sqrt(D))
    without_experts = _assignment(param_groups(_model()))
    assert without_experts["_orig_mod.moe.experts.b1"][0] == "muon"  # (E, 2d) counts as a matrix then


def test_param_groups_tied_embedding_is_an_embedding():
    model = _model(tied=True)
    groups = param_groups(model, lr=0.02, scalar_lr=3e-3, weight_decay=0.1, scalar_weight_decay=0.01,
                          expert_keys="experts")
    assert _assignment(groups) == _expected(0.02, 3e-3, 0.1, 0.01, None, tied=True)
    assert model._orig_mod.lm_head.weight is _by_name(groups)["_orig_mod.wte.weight"]["params"][0]


@pytest.mark.parametrize("scale, d_model, expected", [
    ("inv_sqrt_d_model", None, 1e-2 / math.sqrt(D)),
    ("inv_sqrt_d_model", 64, 1e-2 / 8),
    (None, None, 1e-2),
])
def test_lm_head_lr_scale(scale, d_model, expected):
    groups = param_groups(_model(), scalar_lr=1e-2, lm_head_lr_scale=scale, d_model=d_model)
    assert _assignment(groups)["_orig_mod.lm_head.weight"] == ("adamw", expected, ortho_fast.MUON_DEFAULTS["weight_decay"])


def test_head_names_only_at_the_top_except_lm_head():
    """``output`` is a head as the first component (Meta Llama), not inside a block (BERT's
    attention.output.dense); ``lm_head`` anywhere (OLMo-core's lm_head.w_out); a leading
    ``module`` of DataParallel is dropped."""
    net = nn.Module()
    net.output = nn.Linear(D, VOCAB, bias=False)
    net.layer = nn.Module()
    net.layer.output = nn.Linear(D, D)
    net.lm_head = nn.Module()
    net.lm_head.w_out = nn.Linear(D, 2 * VOCAB, bias=False)
    got = _assignment(param_groups(nn.DataParallel(net), scalar_lr=1e-2, d_model=D))
    head = ("adamw", 1e-2 / math.sqrt(D), ortho_fast.MUON_DEFAULTS["weight_decay"])
    assert got["module.output.weight"] == got["module.lm_head.w_out.weight"] == head
    assert got["module.layer.output.weight"][0] == "muon" and got["module.layer.output.bias"][0] == "adamw"
    with pytest.raises(ValueError, match="d_model: output heads of different fan_in"):
        param_groups(_two_heads())


def _two_heads() -> nn.Module:
    net = nn.Module()
    net.output = nn.Linear(D, VOCAB)
    net.lm_head = nn.Linear(2 * D, VOCAB)
    return net


def test_overrides_first_match_wins_globs_and_predicates():
    overrides = (
        ("*moe.router.weight", {"algorithm": "adamw"}),  # a matrix sent to the scalar side
        ("*attn.proj.weight", {"lr": 0.5}),
        ("*attn.*", {"lr": 0.7}),  # after the line above: the proj weight keeps 0.5
        (lambda p, name: p.ndim == 0, {"weight_decay": 0.0}),
        ("_orig_mod.ln_f.bias", {"algorithm": "muon"}),  # the original name matches too
    )
    groups = param_groups(_model(), lr=0.02, scalar_lr=3e-3, weight_decay=0.1, scalar_weight_decay=0.01,
                          expert_keys=("experts",), overrides=overrides)
    got = _assignment(groups)
    assert got["_orig_mod.moe.router.weight"] == ("adamw", 3e-3, 0.01)
    assert got["_orig_mod.blocks.1._checkpoint_wrapped_module.attn.proj.weight"] == ("muon", 0.5, 0.1)
    assert got["_orig_mod.blocks.0.attn.qkv.weight"] == ("muon", 0.7, 0.1)
    assert got["_orig_mod.blocks.0.attn.qkv.bias"] == ("adamw", 0.7, 0.01)
    assert got["_orig_mod.scale"] == ("adamw", 3e-3, 0.0)
    assert got["_orig_mod.ln_f.bias"] == ("muon", 0.02, 0.1)
    assert got["_orig_mod.blocks.0.mlp.fc.weight"] == ("muon", 0.02, 0.1)  # untouched


def test_override_switching_algorithm_keeps_only_lr_and_weight_decay():
    groups = param_groups(_model(), algorithm="dion", expert_keys=("experts",), matrix_options={"mu": 0.9},
                          overrides=(("*experts.w1", {"algorithm": "muon"}),))
    experts = _by_name(groups)["_orig_mod.moe.experts.w1"]
    assert experts["algorithm"] == "muon" and "mu" not in experts and experts["expert_keys"] == ("experts",)
    assert _by_name(groups)["_orig_mod.patch.weight"]["flatten"] is True  # conv under Dion
    HybridOptimizer(groups)  # every group is valid for its algorithm


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(algorithm="adamw"), ValueError, "algorithm: expected one of"),
    (dict(scalar_algorithm="sgd"), ValueError, "scalar_algorithm"),
    (dict(lm_head_lr_scale="sqrt"), ValueError, "lm_head_lr_scale"),
    (dict(overrides=("*.weight",)), TypeError, "overrides"),
    (dict(overrides=(("*.weight", 3),)), TypeError, "overrides"),
    (dict(overrides=(("*.weight", {"algorithm": "sgd"}),)), ValueError, "overrides: algorithm 'sgd'"),
    (dict(d_model=0), ValueError, "d_model"),
    (dict(algorithm="dion", expert_keys=("experts",)), ValueError, "expert_keys: .*experts.w1"),
])
def test_param_groups_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        param_groups(_model(), **kwargs)


def test_param_groups_no_trainable_parameters():
    model = nn.Linear(2, 2)
    model.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        param_groups(model)


# =======================================================================================
# HybridOptimizer == each algorithm's own optimizer, applied separately
# =======================================================================================


def _grads(model, seed):
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)


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


def _assert_same_model(a: nn.Module, b: nn.Module):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name


CONFIGS = {
    "muon_adamw": lambda: MuonConfig(expert_keys=("experts",), lr=0.02),
    "muon_lion": lambda: MuonConfig(expert_keys=("experts",), scalar_algorithm="lion", scalar_lr=3e-4),
    "dion_adamw": lambda: DionConfig(overrides=(("*experts.w1", {"algorithm": "muon"}),), expert_keys=("experts",),
                                     rank_fraction=0.5, seed=3),
    "dion_lion_rcqr": lambda: DionConfig(overrides=(("*experts.*", {"algorithm": "lion"}),), scalar_algorithm="lion",
                                         qr_method="randomized_cholesky_qr", seed=5),
}


@pytest.mark.parametrize("config", CONFIGS)
def test_hybrid_step_equals_each_algorithm_applied_separately(config):
    model = _model()
    twin = copy.deepcopy(model)
    opt = CONFIGS[config]().build(model)
    separate = _separate(opt, twin)
    for k in range(3):
        _grads(model, k)
        _grads(twin, k)
        opt.step()
        for o in separate:
            o.step()
        _assert_same_model(model, twin)
    assert len(opt.state) == sum(len(o.state) for o in separate) == 35


def test_muon_config_defaults_are_torch_muon_and_torch_adamw():
    """MuonConfig() on 2-D weights is bitwise torch.optim.Muon with its defaults, and its
    AdamW groups are torch.optim.AdamW with its defaults (embeddings without decay)."""
    model = _model()
    twin = copy.deepcopy(model)
    opt = MuonConfig(expert_keys=("experts",)).build(model)
    params = dict(twin.named_parameters())
    groups = {g["algorithm"]: [] for g in opt.param_groups}
    for g in opt.param_groups:
        groups[g["algorithm"]] += [n for n in g["param_names"] if g["algorithm"] == "adamw" or params[n].ndim == 2]
    emb = ["_orig_mod.wte.weight", "_orig_mod.wpe.weight"]
    torch_muon = torch.optim.Muon([params[n] for n in groups["muon"]])
    torch_adamw = torch.optim.AdamW([{"params": [params[n] for n in groups["adamw"] if n not in emb]},
                                     {"params": [params[n] for n in emb], "weight_decay": 0.0}])
    for k in range(3):
        _grads(model, k)
        _grads(twin, k)
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
    _grads(model, 0)
    _grads(twin, 0)
    opt.step()
    ref.step()
    _assert_same_model(model, twin)
    group = MuonConfig(coefficients=coefficients, ns_steps=2, eps_mode="clamp", muon_options={"eps": 0.5}).build(
        copy.deepcopy(model)).param_groups[0]
    assert (group["ns_steps"], group["eps_mode"], group["eps"]) == (2, "clamp", 0.5)


def test_three_dim_parameters_need_expert_keys_or_flatten():
    """A 3-D parameter no expert key matches (the MoE stack here, or a conv1d weight) is not
    silently flattened by Muon or Dion: building raises naming expert_keys / flatten; an
    override with flatten=True takes a conv1d weight as one (out, in·k) matrix."""
    with pytest.raises(ValueError, match=r"param group \d \(muon\): params: '_orig_mod.moe.experts.w1'.*expert_keys"):
        MuonConfig().build(_model())
    with pytest.raises(ValueError, match=r"\(dion\): params: .*flatten=True.*expert_keys"):
        DionConfig().build(_model())
    net = nn.Sequential(nn.Conv1d(4, 6, 3, bias=False), nn.Conv2d(6, 4, 2, bias=False))
    opt = MuonConfig(overrides=(("0.weight", {"flatten": True}),)).build(net)
    assert [(g["param_names"], g["flatten"]) for g in opt.param_groups] == [(["0.weight"], True), (["1.weight"], None)]
    opt = DionConfig(overrides=(("0.weight", {"flatten": True}),)).build(net)
    assert all(g["flatten"] for g in opt.param_groups)


def test_config_defaults_and_their_sources():
    opt = DionConfig(overrides=(("*experts.w1", {"algorithm": "muon"}),), expert_keys=("experts",)).build(_model())
    dion = next(g for g in opt.param_groups if g["algorithm"] == "dion")
    assert (dion["lr"], dion["mu"], dion["weight_decay"], dion["rank_fraction"], dion["rank_multiple_of"]) == \
        (0.01, 0.95, 0.1, 1.0, 1)
    adamw = _by_name(opt.param_groups)
    assert adamw["_orig_mod.ln_f.weight"]["betas"] == (0.9, 0.95) and adamw["_orig_mod.ln_f.weight"]["weight_decay"] == 0.1
    assert adamw["_orig_mod.wte.weight"]["weight_decay"] == 0.0
    assert adamw["_orig_mod.lm_head.weight"]["lr"] == 0.01 / math.sqrt(D)
    lion = _by_name(MuonConfig(scalar_algorithm="lion", expert_keys=("experts",)).build(_model()).param_groups)
    lion = lion["_orig_mod.ln_f.weight"]
    assert lion["algorithm"] == "lion" and lion["betas"] == (0.95, 0.98)  # Megatron's Lion betas
    muon = _by_name(MuonConfig(expert_keys=("experts",)).build(_model()).param_groups)
    assert muon["_orig_mod.ln_f.weight"]["betas"] == ADAMW_DEFAULTS["betas"]
    assert muon["_orig_mod.ln_f.weight"]["weight_decay"] == ADAMW_DEFAULTS["weight_decay"]
    assert muon["_orig_mod.lm_head.weight"]["lr"] == 1e-3  # no head scaling in torch


# =======================================================================================
# state_dict
# =======================================================================================


@pytest.mark.parametrize("config", CONFIGS)
def test_state_dict_round_trip_is_bitwise(config):
    """k steps, save (through torch.save), load into a fresh optimizer on a copy of the model,
    continue: the same bits as the uninterrupted run."""
    model = _model()
    opt = CONFIGS[config]().build(model)
    for k in range(2):
        _grads(model, k)
        opt.step()
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, buf)
    resumed = _model(seed=99)  # different initial weights, overwritten by the checkpoint
    buf.seek(0)
    saved = torch.load(buf)
    resumed.load_state_dict(saved["model"])
    opt2 = CONFIGS[config]().build(resumed)
    opt2.load_state_dict(saved["optim"])
    for k in range(2, 4):
        _grads(model, k)
        _grads(resumed, k)
        opt.step()
        opt2.step()
    _assert_same_model(model, resumed)
    for p, q in zip(model.parameters(), resumed.parameters()):
        assert opt.state[p].keys() == opt2.state[q].keys()
        for key, v in opt.state[p].items():
            assert v.dtype == opt2.state[q][key].dtype and torch.equal(v, opt2.state[q][key]), key


def test_load_state_dict_does_not_alias_the_given_tensors():
    model = _model()
    opt = MuonConfig(expert_keys=("experts",)).build(model)
    _grads(model, 0)
    opt.step()
    sd = opt.state_dict()  # references to opt's live state
    opt2 = MuonConfig(expert_keys=("experts",)).build(copy.deepcopy(model))
    opt2.load_state_dict(sd)
    assert all(v is not sd["state"][i][k] for i, p in enumerate(opt2.param_groups[0]["params"])
               for k, v in opt2.state[p].items())
    before = copy.deepcopy(sd["state"])
    for g in opt2.param_groups:
        for p in g["params"]:
            p.grad = torch.ones_like(p)
    opt2.step()
    assert all(torch.equal(v, before[i][k]) for i, st in sd["state"].items() for k, v in st.items())


def test_load_torch_adamw_checkpoint_continues_bitwise():
    """A torch.optim.AdamW checkpoint (no 'algorithm' key, torch's extra options) loads into a
    HybridOptimizer with an AdamW group and continues exactly as torch would."""
    torch.manual_seed(0)
    a, b = nn.Linear(4, 3), nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    ref = torch.optim.AdamW(a.parameters(), lr=0.01, betas=(0.9, 0.95))
    for k in range(2):
        _grads(a, k)
        ref.step()
    b.load_state_dict(a.state_dict())
    opt = HybridOptimizer([{"params": list(b.parameters()), "algorithm": "adamw"}])
    opt.load_state_dict(ref.state_dict())
    assert opt.param_groups[0]["betas"] == (0.9, 0.95) and opt.param_groups[0]["lr"] == 0.01
    for k in range(2, 4):
        _grads(a, k)
        _grads(b, k)
        ref.step()
        opt.step()
    _assert_same_model(a, b)


def test_load_state_dict_rejects_another_algorithm():
    p = nn.Parameter(torch.zeros(3))
    sd = HybridOptimizer([{"params": [p], "algorithm": "lion"}]).state_dict()
    opt = HybridOptimizer([{"params": [nn.Parameter(torch.zeros(3))], "algorithm": "adamw"}])
    with pytest.raises(ValueError, match="param group 0: the state dict's algorithm 'lion' differs"):
        opt.load_state_dict(sd)


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


# ---------------------------------------------------------------------------------------
# Distributed: one launch of 2 gloo ranks for the module.
# ---------------------------------------------------------------------------------------

#: name -> (Dion sharded, Muon sharded, index of the parameter whose gradient is NaN on rank 1 only).
#: Parameters: 0 the Dion matrix, 1 the Muon matrix, 2 an AdamW DTensor vector (FSDP), 3 a plain AdamW vector.
_BAD_ON_ONE_RANK = {
    "adamw DTensor shard": (True, True, 2), "adamw plain": (True, True, 3), "muon sharded": (True, True, 1),
    "dion sharded": (True, True, 0), "muon not distributed": (True, False, 1), "dion not distributed": (False, True, 0),
}


def _distributed_hybrid(rank: int, world: int) -> dict:
    """Each case of ``_BAD_ON_ONE_RANK``: a good step, then a step whose gradient rank 1 alone
    rejects (every rank must raise, nothing change), then a good step (the ranks still agree)."""
    import hashlib

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("x",))
    shapes = ((8, 6), (6, 4), (8,), (4,))

    def place(full, sharded):
        return distribute_tensor(full, mesh, [Shard(0)], src_data_rank=None) if sharded else full.clone()

    def local(t):
        return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()

    out = {}
    for name, (dion_sharded, muon_sharded, bad) in _BAD_ON_ONE_RANK.items():
        sharded = (dion_sharded, muon_sharded, True, False)
        gen = torch.Generator().manual_seed(0)
        full = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
        ps = [nn.Parameter(place(w, sh)) for w, sh in zip(full, sharded)]
        groups = [{"params": [p], "algorithm": a} for p, a in zip(ps, ("dion", "muon", "adamw", "adamw"))]
        meshes = dict(outer_shard_mesh=mesh["x"] if dion_sharded else None,
                      distributed_mesh=mesh["x"] if muon_sharded else None)
        opt = HybridOptimizer(groups, seed=3, **meshes)

        def step(nan: bool):
            for i, (p, s, sh) in enumerate(zip(ps, shapes, sharded)):
                g = torch.randn(s, generator=gen, dtype=torch.float64)
                if nan and i == bad and rank == 1:
                    g.view(-1)[-1] = float("nan")  # the last row / entry: rank 1's block when sharded
                p.grad = place(g, sh)
            opt.step()

        step(False)
        before = [local(t) for p in ps for t in (p, *opt.state[p].values())]
        try:
            step(True)
            out[name] = None
        except ValueError as err:
            out[name] = str(err)
        after = [local(t) for p in ps for t in (p, *opt.state[p].values())]
        out[name + " unchanged"] = len(before) == len(after) and all(map(torch.equal, before, after))
        step(False)
        digest = hashlib.sha256(b"".join(local(p).numpy().tobytes() for p, sh in zip(ps, sharded) if not sh))
        digests = [None] * world
        dist.all_gather_object(digests, digest.hexdigest())
        out[name + " replicas agree"] = len(set(digests)) == 1
    return out


@pytest.fixture(scope="module")
def distributed_hybrid():
    from ortho_verify.workers import run_workers

    return run_workers(2, _distributed_hybrid, timeout=120)


@pytest.mark.parametrize("name", list(_BAD_ON_ONE_RANK))
def test_bad_gradient_on_one_rank_raises_on_every_rank_without_change(distributed_hybrid, name):
    """A NaN that only rank 1 sees — in a sharded Dion or Muon group, in an AdamW DTensor's shard,
    in a plain AdamW parameter, or in a Muon / Dion group that does not communicate beside one
    that does — raises on both ranks (rank 1 naming the group and the gradient, rank 0 saying
    another rank rejected it) before any parameter or state changes on either, and the next
    step runs on both (no rank left waiting in a collective)."""
    index = _BAD_ON_ONE_RANK[name][2]
    for rank, out in enumerate(distributed_hybrid):
        err = out[name]
        assert err is not None, (rank, name)
        if rank == 1:
            assert "NaN or Inf" in err and (index not in (2, 3) or f"param group {index} (adamw): grad" in err), err
        else:
            assert "another rank" in err, err
        assert out[name + " unchanged"] and out[name + " replicas agree"], (rank, name)
