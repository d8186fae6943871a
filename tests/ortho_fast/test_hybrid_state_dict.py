"""ortho_fast.HybridOptimizer checkpoints: state_dict round trips through torch.save are bitwise
the uninterrupted run for every configuration, ``load_state_dict`` does not alias the given
tensors, a torch.optim.AdamW checkpoint continues bitwise, and a state dict of another
algorithm is rejected.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

from ortho_fast import HybridOptimizer, MuonConfig
from tests.ortho_fast.helpers import HYBRID_CONFIGS, assert_same_model, fill_grads, gpt_model

# =======================================================================================
# state_dict
# =======================================================================================


@pytest.mark.parametrize("config", HYBRID_CONFIGS)
def test_state_dict_round_trip_is_bitwise(config):
    """k steps, save (through torch.save), load into a fresh optimizer on a copy of the model,
    continue: the same bits as the uninterrupted run."""
    model = gpt_model()
    opt = HYBRID_CONFIGS[config]().build(model)
    for k in range(2):
        fill_grads(model, k)
        opt.step()
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, buf)
    resumed = gpt_model(seed=99)  # different initial weights, overwritten by the checkpoint
    buf.seek(0)
    saved = torch.load(buf)
    resumed.load_state_dict(saved["model"])
    opt2 = HYBRID_CONFIGS[config]().build(resumed)
    opt2.load_state_dict(saved["optim"])
    for k in range(2, 4):
        fill_grads(model, k)
        fill_grads(resumed, k)
        opt.step()
        opt2.step()
    assert_same_model(model, resumed)
    for p, q in zip(model.parameters(), resumed.parameters()):
        assert opt.state[p].keys() == opt2.state[q].keys()
        for key, v in opt.state[p].items():
            assert v.dtype == opt2.state[q][key].dtype and torch.equal(v, opt2.state[q][key]), key


def test_load_state_dict_does_not_alias_the_given_tensors():
    model = gpt_model()
    opt = MuonConfig(expert_keys=("experts",)).build(model)
    fill_grads(model, 0)
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
        fill_grads(a, k)
        ref.step()
    b.load_state_dict(a.state_dict())
    opt = HybridOptimizer([{"params": list(b.parameters()), "algorithm": "adamw"}])
    opt.load_state_dict(ref.state_dict())
    assert opt.param_groups[0]["betas"] == (0.9, 0.95) and opt.param_groups[0]["lr"] == 0.01
    for k in range(2, 4):
        fill_grads(a, k)
        fill_grads(b, k)
        ref.step()
        opt.step()
    assert_same_model(a, b)


def test_load_state_dict_rejects_another_algorithm():
    p = nn.Parameter(torch.zeros(3))
    sd = HybridOptimizer([{"params": [p], "algorithm": "lion"}]).state_dict()
    opt = HybridOptimizer([{"params": [nn.Parameter(torch.zeros(3))], "algorithm": "adamw"}])
    with pytest.raises(ValueError, match="param group 0: the state dict's algorithm 'lion' differs"):
        opt.load_state_dict(sd)
