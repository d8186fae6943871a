"""The stacked Muon step's plan (chunks, rest batches, workspace sizes) is built once per group change
and reused (``ortho_fast.groups.muon_plan.MuonPlan``):
a step with the cached plan is bit for bit the step planned afresh (``muon_group_step`` without a
cache), through every change of the group — gradients missing, a parameter replaced by one of
another shape, a structural option edited, a group added, a checkpoint loaded — and a scheduler
changing lr does not replan.
"""

from __future__ import annotations

import collections

import torch

import ortho_fast
from ortho_fast.groups import muon as group_muon, muon_plan

SHAPES = [(32, 16)] * 6 + [(16, 48)] * 2 + [(24, 24)]


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]


class Twin:
    """The same groups stepped by ``muon_group_step`` with no cache: planned afresh at every step."""

    def __init__(self, opt: ortho_fast.Muon) -> None:
        self.opt = opt
        self.state = collections.defaultdict(dict)

    def step(self) -> None:
        for group in self.opt.param_groups:
            group_muon.muon_group_step(group, self.state)


def _grads(*param_lists, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for ps in zip(*param_lists):
        g = torch.randn(ps[0].shape, generator=gen)
        for p in ps:
            p.grad = None if g is None else g.clone()


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_the_cached_plan_steps_as_a_fresh_plan_through_every_group_change():
    ps, qs = _params(), _params()
    opt = ortho_fast.Muon(ps, lr=0.02, check_finite=False)
    fresh = ortho_fast.Muon(qs, lr=0.02, check_finite=False)
    twin = Twin(fresh)

    def step(seed):  # lr changed at every step, as a scheduler does
        for o in (opt, fresh):
            for group in o.param_groups:
                group["lr"] = 0.02 / (1 + seed)
        _grads(ps, qs, seed=seed)
        opt.step()
        twin.step()
        assert _same(ps, qs), seed

    step(0)
    step(1)
    opt.load_state_dict(opt.state_dict())  # the runner's caches reset
    step(2)
    ps[1].grad = qs[1].grad = None  # a gradient missing: another live set
    opt.step()
    twin.step()
    assert _same(ps, qs)
    for o in (opt, fresh):  # a parameter replaced by one of another shape
        o.param_groups[0]["params"][2] = torch.nn.Parameter(torch.ones(16, 48))
    ps[2], qs[2] = opt.param_groups[0]["params"][2], fresh.param_groups[0]["params"][2]
    step(3)
    for o in (opt, fresh):  # a structural option edited
        o.param_groups[0]["banks"] = False
    step(4)
    extra_p, extra_q = torch.nn.Parameter(torch.ones(32, 16)), torch.nn.Parameter(torch.ones(32, 16))
    opt.add_param_group({"params": [extra_p]})
    fresh.add_param_group({"params": [extra_q]})
    ps.append(extra_p)
    qs.append(extra_q)
    step(5)


def test_a_planted_stale_plan_is_caught(monkeypatch):
    """The comparison can fail: a cache that ignores a change of shape (the signature of the first
    step kept forever) steps differently from a fresh plan, or fails."""
    real = muon_plan.MuonPlan.stacks
    kept = {}

    def stale(self, live, plan_stacks, checked=False):
        if "plan" not in kept:
            kept["plan"] = real(self, live, plan_stacks, checked)
        return kept["plan"]

    monkeypatch.setattr(muon_plan.MuonPlan, "stacks", stale)
    ps, qs = _params(), _params()
    opt, fresh = ortho_fast.Muon(ps, lr=0.02), ortho_fast.Muon(qs, lr=0.02)
    twin = Twin(fresh)
    _grads(ps, qs, seed=0)
    opt.step()
    twin.step()
    for o in (opt, fresh):
        o.param_groups[0]["params"][0] = torch.nn.Parameter(torch.ones(32, 16))
    ps[0], qs[0] = opt.param_groups[0]["params"][0], fresh.param_groups[0]["params"][0]
    _grads(ps, qs, seed=1)
    twin.step()
    try:  # the stale plan steps the replaced parameter's predecessor, not the new one
        opt.step()
        caught = not _same(ps, qs)
    except KeyError:  # or finds no momentum buffer for it
        caught = True
    assert caught


def test_a_scheduler_does_not_replan(monkeypatch):
    """Five steps under a scheduler changing lr at every step plan once (``plan_stacks`` called once)."""
    calls = []
    real = group_muon.plan_stacks

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(group_muon, "plan_stacks", counted)
    ps = _params()
    opt = ortho_fast.Muon(ps, lr=0.02)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1 / (1 + t))
    for t in range(5):
        _grads(ps, seed=t)
        opt.step()
        sched.step()
    assert len(calls) == 1
    opt.param_groups[0]["ns_steps"] = 4  # a structural option: planned again
    opt.step()
    assert len(calls) == 2
