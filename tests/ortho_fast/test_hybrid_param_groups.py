"""ortho_fast.param_groups: which parameter of a small GPT (inside torch.compile's and activation
checkpointing's wrappers, with an MoE stack and a tied or untied head) goes to which algorithm
with which lr and weight decay; the defaults' sources, the lm_head lr scale, head names,
overrides (first match wins) and bad input.
"""

from __future__ import annotations

import math

import pytest
from torch import nn

from ortho_fast import HybridOptimizer, param_groups
from ortho_fast.groups.muon import MUON_DEFAULTS
from ortho_fast.groups.scalar import ADAMW_DEFAULTS
from tests.ortho_fast.helpers import D_MODEL, VOCAB, gpt_model, groups_by_name


def _expected(lr, scalar_lr, wd, scalar_wd, head_lr, tied=False) -> dict:
    """name -> (algorithm, lr, weight_decay) for the GPT of tests/ortho_fast/helpers.py under Muon / AdamW."""
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
        "_orig_mod.ln_f.weight": ("adamw", scalar_lr, scalar_wd),
        "_orig_mod.ln_f.bias": ("adamw", scalar_lr, scalar_wd),
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


# =======================================================================================
# param_groups
# =======================================================================================


def test_param_groups_assigns_every_parameter_as_expected():
    model = gpt_model()
    groups = param_groups(model, lr=0.02, scalar_lr=3e-3, weight_decay=0.1, scalar_weight_decay=0.01,
                          expert_keys=("experts",), lm_head_lr_scale="inv_sqrt_d_model")
    assert _assignment(groups) == _expected(0.02, 3e-3, 0.1, 0.01, 3e-3 / math.sqrt(D_MODEL))
    by_name = groups_by_name(groups)
    assert by_name["_orig_mod.moe.experts.w1"]["expert_keys"] == ("experts",)
    # names are the model's own; every trainable parameter once, the frozen one not at all
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert {n: p for g in groups for n, p in zip(g["param_names"], g["params"])}.keys() == named.keys()
    assert all(p is named[n] for g in groups for n, p in zip(g["param_names"], g["params"]))


def test_param_groups_defaults_follow_the_matrix_algorithm():
    """lr / weight_decay None: the matrix algorithm's row of the whole-model defaults
    (``HYBRID_DEFAULTS``, the same as MuonConfig's: torch.optim.Muon's lr and weight decay, the
    scalars at the same lr with torch.optim.AdamW's weight decay, no head scaling), the
    embeddings weight decay 0."""
    groups = param_groups(gpt_model(), expert_keys=("experts",))
    mu = MUON_DEFAULTS
    assert _assignment(groups) == _expected(mu["lr"], mu["lr"], mu["weight_decay"],
                                            ADAMW_DEFAULTS["weight_decay"],
                                            mu["lr"])
    without_experts = _assignment(param_groups(gpt_model()))
    assert without_experts["_orig_mod.moe.experts.b1"][0] == "muon"  # (E, 2d) counts as a matrix then


def test_param_groups_tied_embedding_is_an_embedding():
    model = gpt_model(tied=True)
    groups = param_groups(model, lr=0.02, scalar_lr=3e-3, weight_decay=0.1, scalar_weight_decay=0.01,
                          expert_keys="experts")
    assert _assignment(groups) == _expected(0.02, 3e-3, 0.1, 0.01, None, tied=True)
    assert model._orig_mod.lm_head.weight is groups_by_name(groups)["_orig_mod.wte.weight"]["params"][0]


@pytest.mark.parametrize("scale, d_model, expected", [
    ("inv_sqrt_d_model", None, 1e-2 / math.sqrt(D_MODEL)),
    ("inv_sqrt_d_model", 64, 1e-2 / 8),
    (None, None, 1e-2),
])
def test_lm_head_lr_scale(scale, d_model, expected):
    groups = param_groups(gpt_model(), scalar_lr=1e-2, lm_head_lr_scale=scale, d_model=d_model)
    assert _assignment(groups)["_orig_mod.lm_head.weight"] == ("adamw", expected,
                                                               ADAMW_DEFAULTS["weight_decay"])


def test_head_names_only_at_the_top_except_lm_head():
    """``output`` is a head as the first component (Meta Llama), not inside a block (BERT's
    attention.output.dense); ``lm_head`` anywhere (OLMo-core's lm_head.w_out); a leading
    ``module`` of DataParallel is dropped."""
    net = nn.Module()
    net.output = nn.Linear(D_MODEL, VOCAB, bias=False)
    net.layer = nn.Module()
    net.layer.output = nn.Linear(D_MODEL, D_MODEL)
    net.lm_head = nn.Module()
    net.lm_head.w_out = nn.Linear(D_MODEL, 2 * VOCAB, bias=False)
    got = _assignment(param_groups(nn.DataParallel(net), scalar_lr=1e-2, d_model=D_MODEL,
                                   lm_head_lr_scale="inv_sqrt_d_model"))
    head = ("adamw", 1e-2 / math.sqrt(D_MODEL), ADAMW_DEFAULTS["weight_decay"])
    assert got["module.output.weight"] == got["module.lm_head.w_out.weight"] == head
    assert got["module.layer.output.weight"][0] == "muon" and got["module.layer.output.bias"][0] == "adamw"
    with pytest.raises(ValueError, match="d_model: output heads of different fan_in"):
        param_groups(_two_heads(), lm_head_lr_scale="inv_sqrt_d_model")


def _two_heads() -> nn.Module:
    net = nn.Module()
    net.output = nn.Linear(D_MODEL, VOCAB)
    net.lm_head = nn.Linear(2 * D_MODEL, VOCAB)
    return net


def test_overrides_first_match_wins_globs_and_predicates():
    overrides = (
        ("*moe.router.weight", {"algorithm": "adamw"}),  # a matrix sent to the scalar side
        ("*attn.proj.weight", {"lr": 0.5}),
        ("*attn.*", {"lr": 0.7}),  # after the line above: the proj weight keeps 0.5
        (lambda p, name: p.ndim == 0, {"weight_decay": 0.0}),
        ("_orig_mod.ln_f.bias", {"algorithm": "muon"}),  # the original name matches too
    )
    groups = param_groups(gpt_model(), lr=0.02, scalar_lr=3e-3, weight_decay=0.1, scalar_weight_decay=0.01,
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
    groups = param_groups(gpt_model(), algorithm="dion", expert_keys=("experts",), matrix_options={"mu": 0.9},
                          overrides=(("*experts.w1", {"algorithm": "muon"}),))
    experts = groups_by_name(groups)["_orig_mod.moe.experts.w1"]
    assert experts["algorithm"] == "muon" and "mu" not in experts and experts["expert_keys"] == ("experts",)
    assert groups_by_name(groups)["_orig_mod.patch.weight"]["flatten"] is True  # conv under Dion
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
        param_groups(gpt_model(), **kwargs)


def test_param_groups_no_trainable_parameters():
    model = nn.Linear(2, 2)
    model.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        param_groups(model)
