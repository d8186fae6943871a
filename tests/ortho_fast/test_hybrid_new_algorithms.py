"""Dion2 and NorMuon in HybridOptimizer: the "dion2" group steps bitwise as ortho_fast.Dion2 on the
same parameters; state dicts round-trip (NorMuon's variance_neuron included); options checked as the classes check
them."""

import pytest
import torch

import ortho_fast


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.Linear(16, 6, bias=False)).double()


def _grads(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)


@pytest.mark.parametrize("fraction", [0.25, 1.0])
def test_hybrid_dion2_group_is_dion2(fraction):
    a, b = _model(0), _model(0)
    hybrid = ortho_fast.HybridOptimizer([{"params": list(a.parameters()), "algorithm": "dion2", "lr": 0.02,
                                          "fraction": fraction, "weight_decay": 0.1}])
    alone = ortho_fast.Dion2(list(b.parameters()), lr=0.02, fraction=fraction, weight_decay=0.1)
    for step in range(3):
        _grads(a, step), _grads(b, step)
        hybrid.step(), alone.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
        assert torch.equal(hybrid.state[pa]["momentum"], alone.state[pb]["momentum"])


def test_hybrid_dion2_state_dict_round_trip_and_bad_option():
    model = _model(1)
    groups = ortho_fast.param_groups(model, algorithm="dion2", lr=0.01)
    opt = ortho_fast.HybridOptimizer(groups)
    _grads(model, 0)
    opt.step()
    again = ortho_fast.HybridOptimizer(ortho_fast.param_groups(model, algorithm="dion2", lr=0.01))
    again.load_state_dict(opt.state_dict())
    for p in model.parameters():
        assert torch.equal(again.state[p]["momentum"], opt.state[p]["momentum"])
    with pytest.raises(ValueError, match="fraction"):
        ortho_fast.HybridOptimizer([{"params": list(model.parameters()), "algorithm": "dion2", "fraction": 1.5}])


def test_hybrid_rejects_qk_clip_options():
    model = _model(2)
    with pytest.raises(ValueError, match="qk_clip_threshold: QK-clip runs in ortho_fast.Muon"):
        ortho_fast.HybridOptimizer([{"params": list(model.parameters()), "algorithm": "muon",
                                     "qk_clip_threshold": 100.0}])


def test_hybrid_normuon_group_is_normuon_and_round_trips():
    a, b = _model(3), _model(3)
    hybrid = ortho_fast.HybridOptimizer([{"params": list(a.parameters()), "algorithm": "muon", "lr": 0.02,
                                          "normuon_beta2": 0.95}])
    alone = ortho_fast.Muon(list(b.parameters()), lr=0.02, normuon_beta2=0.95)
    for step in range(2):
        _grads(a, step), _grads(b, step)
        hybrid.step(), alone.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
        assert torch.equal(hybrid.state[pa]["variance_neuron"], alone.state[pb]["variance_neuron"])
    again = ortho_fast.HybridOptimizer([{"params": list(a.parameters()), "algorithm": "muon", "lr": 0.02,
                                         "normuon_beta2": 0.95}])
    again.load_state_dict(hybrid.state_dict())
    for p in a.parameters():
        assert torch.equal(again.state[p]["variance_neuron"], hybrid.state[p]["variance_neuron"])
