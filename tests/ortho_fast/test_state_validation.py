"""``load_state_dict`` validates the saved state before anything changes (Muon, Dion,
HybridOptimizer with AdamW and Lion groups): every key present and no foreign one, real
floating tensors of the right shape, finite, step counts non-negative integers; a rejected
load leaves ``state_dict()`` exactly as before.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings, strategies as st

from ortho_fast import Dion, HybridOptimizer, Muon
from tests.ortho_fast.helpers import gradient_matrix, rng_for
from tests.round_trip import run_steps

SHAPES = ((12, 8), (8, 12))


def _stepped(make):
    rng = rng_for("state-validation")
    ps = [torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(s), dtype=torch.float32)) for s in SHAPES]
    opt = make(ps)
    run_steps(ps, opt, [[torch.tensor(gradient_matrix(s, rng), dtype=torch.float32) for s in SHAPES]])
    return opt


OPTIMIZERS = {
    "muon": lambda ps: Muon(ps),
    "dion": lambda ps: Dion(ps, rank_fraction=0.5),
    "dion_rcqr": lambda ps: Dion(ps, rank_fraction=0.5, qr_method="randomized_cholesky_qr"),
    "adamw": lambda ps: HybridOptimizer([{"params": ps, "algorithm": "adamw"}]),
    "lion": lambda ps: HybridOptimizer([{"params": ps, "algorithm": "lion"}]),
    "hybrid_dion": lambda ps: HybridOptimizer([{"params": ps, "algorithm": "dion"}]),
}
TENSOR_KEYS = {"muon": ["momentum_buffer"], "dion": ["momentum", "Q"], "dion_rcqr": ["momentum", "Q"],
               "adamw": ["exp_avg", "exp_avg_sq"], "lion": ["exp_avg"], "hybrid_dion": ["momentum", "Q"]}
COUNT_KEYS = {"dion": ["step"], "dion_rcqr": ["step"], "adamw": ["step"], "hybrid_dion": ["step"]}


def _snapshot(opt):
    return copy.deepcopy(opt.state_dict())


def _assert_same_state_dict(a, b):
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for i in a["state"]:
        assert a["state"][i].keys() == b["state"][i].keys()
        for key, value in a["state"][i].items():
            other = b["state"][i][key]
            assert value.dtype == other.dtype and torch.equal(value, other), (i, key)


def _rejects(opt, corrupt: dict, message: str):
    before = _snapshot(opt)
    with pytest.raises(ValueError, match=message):
        opt.load_state_dict(corrupt)
    _assert_same_state_dict(before, _snapshot(opt))


def _corruptions(name: str):
    for key in TENSOR_KEYS[name]:
        yield key, "nan", lambda t: t.clone().fill_(float("nan")), rf"{key} of parameter 1 .*NaN or Inf"
        yield key, "inf", lambda t: torch.where(torch.arange(t.numel()).view(t.shape) == 3, torch.tensor(float("inf")),
                                                t), rf"{key} of parameter 1 .*NaN or Inf"
        yield key, "int64", lambda t: torch.ones(t.shape, dtype=torch.int64), rf"{key}: expected a real floating"
        yield key, "shape", lambda t: torch.zeros(3, 3), rf"{key}: expected shape"
        if len(TENSOR_KEYS[name]) + len(COUNT_KEYS.get(name, [])) > 1:  # else an empty entry: never stepped
            yield key, "missing", None, rf"{key}: missing from the saved"
    for key in COUNT_KEYS.get(name, []):
        yield key, "negative", lambda t: torch.full_like(t, -1), rf"{key}: expected a one-element tensor holding"
        yield key, "fraction", lambda t: torch.tensor(1.5), rf"{key}: expected a one-element"
        yield key, "vector", lambda t: torch.zeros(2), rf"{key}: expected a one-element"
        yield key, "python int", lambda t: 3, rf"{key}: expected a one-element"
        if name == "dion_rcqr" or name == "adamw":
            yield key, "missing", None, rf"{key}: missing from the saved"
    yield ("foreign", "extra key", "extra",
           r"^(param group 0 \(\w+\): )?(exp_avg|Q): not a \w+ state key \(a state key of")


CASES = [(name, *case) for name in OPTIMIZERS for case in _corruptions(name)]


@pytest.mark.parametrize("name, key, kind, corrupt, message", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_corrupt_state_is_rejected_and_changes_nothing(name, key, kind, corrupt, message):
    opt = _stepped(OPTIMIZERS[name])
    sd = copy.deepcopy(opt.state_dict())
    entry = sd["state"][1]
    if corrupt is None:
        del entry[key]
    elif corrupt == "extra":
        entry["Q" if name in ("muon", "adamw", "lion") else "exp_avg"] = torch.zeros(2)
    else:
        entry[key] = corrupt(entry[key])
    _rejects(opt, sd, message)


@settings(max_examples=20, deadline=None)
@given(name=st.sampled_from(sorted(OPTIMIZERS)), index=st.integers(0, 1), row=st.integers(0, 2), col=st.integers(0, 3),
       bad=st.sampled_from([float("nan"), float("inf"), -float("inf")]))
def test_one_bad_entry_anywhere_is_rejected(name, index, row, col, bad):
    opt = _stepped(OPTIMIZERS[name])
    sd = copy.deepcopy(opt.state_dict())
    key = TENSOR_KEYS[name][0]
    sd["state"][index][key][row, col] = bad
    _rejects(opt, sd, rf"{key} of parameter {index} .*NaN or Inf")


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_good_state_dict_loads(name):
    opt = _stepped(OPTIMIZERS[name])
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))


def test_dion_step_may_be_missing_only_where_it_changes_nothing():
    """Dion's ``step`` keys the sketches of randomized Cholesky QR only: without it a Householder
    run resumes identically (the load re-creates it as 0), a randomized one would not."""
    opt = _stepped(OPTIMIZERS["dion"])
    sd = copy.deepcopy(opt.state_dict())
    del sd["state"][0]["step"]
    opt.load_state_dict(sd)
    assert int(opt.state[opt.param_groups[0]["params"][0]].get("step", torch.tensor(0))) in (0, 1)


def test_not_a_state_dict():
    opt = _stepped(OPTIMIZERS["muon"])
    before = _snapshot(opt)
    with pytest.raises(ValueError, match="^state_dict: expected a dict with 'state' and 'param_groups'"):
        opt.load_state_dict({"state": {}})
    _assert_same_state_dict(before, _snapshot(opt))


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_emptied_entry_loads_as_absent(name):
    """An entry emptied to {} (what reading ``opt.state[p]`` of a torch optimizer leaves, and what
    its ``state_dict`` then saves) means no state, as an absent entry does: the load succeeds and
    the next step starts that parameter from zeros, exactly as dropping the entry would."""
    saved = _snapshot(_stepped(OPTIMIZERS[name]))
    first = next(iter(saved["state"]))
    absent, emptied = copy.deepcopy(saved), copy.deepcopy(saved)
    del absent["state"][first]
    emptied["state"][first] = {}
    results = []
    for checkpoint in (absent, emptied):
        opt = _stepped(OPTIMIZERS[name])
        opt.load_state_dict(checkpoint)
        params = [p for group in opt.param_groups for p in group["params"]]
        for p in params:
            p.grad = torch.ones_like(p)
        opt.step()
        results.append(([p.detach().clone() for p in params], _snapshot(opt)))
    (params_a, state_a), (params_e, state_e) = results
    assert all(torch.equal(a, e) for a, e in zip(params_a, params_e))
    _assert_same_state_dict(state_a, state_e)
