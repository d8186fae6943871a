"""ortho_fast.Muon's state and groups: bitwise parity with torch.optim.Muon over many equal
shapes and loading its checkpoints, the param-group contract (``MUON_DEFAULTS`` and the group
functions a hybrid optimizer calls), ``named_parameters``, state_dict round trips and
determinism with banks, experts and splits, options reset to None on a live group, and
``load_state_dict`` copying the momentum buffers.
"""

from __future__ import annotations

import copy
import inspect
from collections import defaultdict

import pytest
import torch

from ortho_fast import Muon
from ortho_fast.groups.muon import MUON_DEFAULTS, check_muon_step, muon_group_step, normalize_muon_group
from tests.ortho_fast.helpers import LAYOUT_SHAPES, layout_optimizer, layout_params, rng_for
from tests.round_trip import assert_bitwise_same, round_trip, run_steps

# =======================================================================================
# torch.optim.Muon: parity with many equal shapes, and its checkpoints
# =======================================================================================


def test_torch_parity_with_equal_shapes_and_torch_checkpoint():
    """``bitwise_torch=True`` (no batching, eps_mode resolved to torch's clamp) with several 16 x 24
    parameters stays bitwise equal to torch (the fast default stacks them: tests/ortho_fast/
    test_muon_fast_path.py); a torch.optim.Muon state_dict loads (Muon keys it
    lacks come from the current groups, its lr replaces ours, its group becomes bitwise_torch) and
    the next steps stay bitwise equal to torch's uninterrupted run, even from a default optimizer."""
    rng = rng_for("torch-ckpt")
    w0 = [torch.tensor(0.02 * rng.standard_normal((16, 24)), dtype=torch.float32) for _ in range(3)]
    grads = [[torch.tensor(rng.standard_normal((16, 24)), dtype=torch.float32) for _ in w0] for _ in range(4)]
    ps_ref, ps_fast, ps_t = ([torch.nn.Parameter(w.clone()) for w in w0] for _ in range(3))
    run_steps(ps_ref, torch.optim.Muon(ps_ref, lr=0.02), grads)
    run_steps(ps_fast, Muon(ps_fast, lr=0.02, bitwise_torch=True), grads)
    assert all(torch.equal(a, b) for a, b in zip(ps_ref, ps_fast))
    o_t = torch.optim.Muon(ps_t, lr=0.02)
    run_steps(ps_t, o_t, grads[:2])
    ps_load = [torch.nn.Parameter(p.detach().clone()) for p in ps_t]
    o_load = Muon(ps_load, lr=0.5)  # the torch checkpoint sets bitwise_torch=True
    o_load.load_state_dict(copy.deepcopy(o_t.state_dict()))
    assert o_load.param_groups[0]["lr"] == 0.02 and o_load.param_groups[0]["coefficients"] == "jordan"
    assert o_load.param_groups[0]["bitwise_torch"] is True
    run_steps(ps_load, o_load, grads[2:])
    assert all(torch.equal(a, b) for a, b in zip(ps_ref, ps_load))


# =======================================================================================
# The param-group contract
# =======================================================================================


def test_defaults_are_the_constructor_defaults_and_group_functions_drive_muon():
    sig = inspect.signature(Muon.__init__)
    assert {k: sig.parameters[k].default for k in MUON_DEFAULTS} == MUON_DEFAULTS
    rng = rng_for("contract")
    w0 = [torch.tensor(0.02 * rng.standard_normal(s), dtype=torch.float32) for s in ((3, 8, 6), (12, 6))]
    g = [torch.tensor(rng.standard_normal(w.shape), dtype=torch.float32) for w in w0]
    # what a hybrid optimizer does: fill defaults, normalize, check, step
    ps = [torch.nn.Parameter(w.clone()) for w in w0]
    group = {**MUON_DEFAULTS, "coefficients": "polar_express", "expert_keys": "experts", "split_sizes": (6, 6),
             "params": ps[1:], "param_names": ["qkv.w"]}
    experts = {**MUON_DEFAULTS, "expert_keys": ["experts"], "params": ps[:1], "param_names": ["experts.w"]}
    for grp in (group, experts):
        normalize_muon_group(grp)
    assert (group["safety"], group["eps"], group["expert_keys"]) == (1.02, 1e-6, ("experts",))
    state = defaultdict(dict)
    for p, gg in zip(ps, g):
        p.grad = gg.clone()
    for grp in (experts, group):
        check_muon_step(grp, state)
    assert not state  # checks change nothing
    for grp in (experts, group):
        muon_group_step(grp, state)
    # the same through the optimizer
    qs = [torch.nn.Parameter(w.clone()) for w in w0]
    opt = Muon([{"params": [("experts.w", qs[0])], "expert_keys": ("experts",)},
                {"params": [("qkv.w", qs[1])], "split_sizes": (6, 6), "coefficients": "polar_express"}])
    for q, gg in zip(qs, g):
        q.grad = gg.clone()
    opt.step()
    for p, q in zip(ps, qs):
        assert torch.equal(p, q) and torch.equal(state[p]["momentum_buffer"], opt.state[q]["momentum_buffer"])


def test_named_parameters_give_param_names():
    model = torch.nn.Sequential(torch.nn.Linear(4, 6, bias=False), torch.nn.Linear(6, 3, bias=False))
    opt = Muon(model.named_parameters())
    assert opt.param_groups[0]["param_names"] == ["0.weight", "1.weight"]


# =======================================================================================
# state_dict round trip and determinism, with banks, experts, splits
# =======================================================================================


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_round_trip_with_banks_experts_splits(dtype):
    rng = rng_for("rt", dtype)
    w0 = [torch.tensor(0.02 * rng.standard_normal(s), dtype=dtype) for s in LAYOUT_SHAPES]
    grads = [[torch.tensor(rng.standard_normal(s), dtype=dtype) for s in LAYOUT_SHAPES] for _ in range(4)]
    (pa, oa), resumed = round_trip(layout_optimizer, w0, grads)
    assert_bitwise_same((pa, oa), resumed)
    assert set(oa.state[pa[0]]) == {"momentum_buffer"}
    # determinism: the uninterrupted run again gives the same bits
    pd = [torch.nn.Parameter(w.clone()) for w in w0]
    run_steps(pd, layout_optimizer(pd), grads)
    assert all(torch.equal(a, d) for a, d in zip(pa, pd))
    assert not torch.equal(pa[0].detach(), w0[0])


def test_schedule_options_set_to_none_after_construction_resolve_as_at_construction():
    """safety / eps / eps_mode set back to None on a live group mean "from the schedule" at
    the next step, exactly as at construction."""
    rng = rng_for("none-again")
    w0, g = torch.tensor(0.02 * rng.standard_normal((6, 10))), torch.tensor(rng.standard_normal((6, 10)))
    a, b = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    oa, ob = Muon([a], coefficients="polar_express"), Muon([b], coefficients="polar_express")
    ob.param_groups[0].update(safety=None, eps=None, eps_mode=None)
    a.grad, b.grad = g.clone(), g.clone()
    oa.step()
    ob.step()
    assert torch.equal(a, b)


def test_load_state_dict_copies_the_momentum_buffer():
    """o2.load_state_dict(o1.state_dict()): stepping o2 changes nothing of o1 or of the state
    dict (torch alone would share the momentum_buffer tensors)."""
    rng = rng_for("no-alias")
    ps = layout_params(rng)
    o1 = layout_optimizer(ps)
    run_steps(ps, o1, [[torch.randn(p.shape) for p in ps]])
    sd = o1.state_dict()
    before = copy.deepcopy(sd["state"])
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    o2 = layout_optimizer(qs)
    o2.load_state_dict(sd)
    run_steps(qs, o2, [[torch.randn(p.shape) for p in ps]])
    ids = [i for g in sd["param_groups"] for i in g["params"]]
    params = ([p for g in o.param_groups for p in g["params"]] for o in (o1, o2))
    for i, p, q in zip(ids, *params):
        assert torch.equal(o1.state[p]["momentum_buffer"], before[i]["momentum_buffer"])
        assert torch.equal(sd["state"][i]["momentum_buffer"], before[i]["momentum_buffer"])
        assert not torch.equal(o2.state[q]["momentum_buffer"], before[i]["momentum_buffer"])
