"""Optimizer state dicts with torch.dtype group options (Muon's ``dtype``, Dion's
``momentum_dtype`` / ``q_dtype``) through ``torch.distributed.checkpoint``'s full state dict,
which rejects a torch.dtype value: the options are written as names and read back
(``ortho_fast._state.state_dict_with_dtype_names``). One 2-rank launch for the module."""

from __future__ import annotations

import io

import pytest
import torch

import ortho_fast
from ortho_verify.sharding.workers import run_workers

OPTIMIZERS = {
    "muon": lambda params, mesh: ortho_fast.Muon(params, dtype=torch.float32, distributed_mesh=mesh),
    "dion": lambda params, mesh: ortho_fast.Dion(params, momentum_dtype=torch.float32, q_dtype=torch.float32,
                                                 rank_fraction=0.5, outer_shard_mesh=mesh),
    "hybrid": lambda params, mesh: ortho_fast.HybridOptimizer(
        [{"params": params, "algorithm": "dion", "momentum_dtype": torch.float32}], outer_shard_mesh=mesh),
}


def _full_state_dict_round_trip(rank: int, world: int) -> dict:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    full = StateDictOptions(full_state_dict=True)
    out = {}
    for name, make in OPTIMIZERS.items():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 6, bias=False), torch.nn.Linear(6, 5, bias=False)).double()
        fully_shard(model, mesh=mesh)
        opt = make(list(model.parameters()), mesh)
        model(torch.randn(3, 8, dtype=torch.float64)).square().sum().backward()
        opt.step()
        opt.zero_grad()
        saved = get_optimizer_state_dict(model, opt, options=full)
        fresh = make(list(model.parameters()), mesh)
        set_optimizer_state_dict(model, fresh, saved, options=full)
        states = [(opt.state[p], fresh.state[p]) for p in model.parameters()]
        out[name] = {
            "saved_dtypes": sorted({v for g in saved["param_groups"] for k, v in g.items()
                                   if "dtype" in k and v is not None}, key=str),
            "restored_groups_equal": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
                                     == [{k: v for k, v in g.items() if k != "params"} for g in fresh.param_groups],
            "state_equal": all(torch.equal(a[k].full_tensor() if hasattr(a[k], "full_tensor") else a[k],
                                           b[k].full_tensor() if hasattr(b[k], "full_tensor") else b[k])
                               for a, b in states for k in a),
        }
    return out


@pytest.fixture(scope="module")
def results():
    return run_workers(2, _full_state_dict_round_trip, timeout=120)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_full_state_dict_round_trip(results, name):
    for rank in results:
        got = rank[name]
        assert got["saved_dtypes"] == ["torch.float32"], got  # names, not torch.dtype values
        assert got["restored_groups_equal"] and got["state_equal"], got


def test_one_process_state_dict_names_dtypes_and_loads_back():
    p = torch.nn.Parameter(torch.randn(6, 4, dtype=torch.float64))
    opt = ortho_fast.Dion([p], momentum_dtype=torch.float32)
    p.grad = torch.randn_like(p)
    opt.step()
    sd = opt.state_dict()
    assert sd["param_groups"][0]["momentum_dtype"] == "torch.float32"
    fresh = ortho_fast.Dion([p], momentum_dtype=torch.float64)
    fresh.load_state_dict(torch.load(io.BytesIO(_saved(sd)), weights_only=True))
    assert fresh.param_groups[0]["momentum_dtype"] is torch.float32
    assert fresh.state[p]["momentum"].dtype is torch.float32
    assert torch.equal(fresh.state[p]["momentum"], opt.state[p]["momentum"])


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()
