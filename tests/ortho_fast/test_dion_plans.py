"""Dion and Dion2 plan a group once per change of the group, not once per step.

A group's plan (``groups.dion2.plan_dion2_group`` / ``groups.dion.plan_dion_group``: chunks,
layouts, names, workspace sizes, step keyword arguments) is made at the first step and kept while
the group holds the same parameters with gradients and the same options but lr / weight_decay /
ef_decay (Dion: lr / mu / weight_decay), which a scheduler changes at every step. It is made again
after ``add_param_group`` (for the new group), ``load_state_dict`` and a changed option. The steps
taken from a kept plan equal, bit for bit, steps planned afresh every time (a twin whose plans are
dropped before each step), so a plan that missed a change shows up as a difference.
"""

from __future__ import annotations

import pytest
import torch

import ortho_fast
from ortho_fast.groups import dion as dion_groups, dion2 as dion2_groups

SHAPES = [(12, 4), (4, 4), (16, 4), (4, 16)] * 2

CASES = {
    "dion2": (dion2_groups, "plan_dion2_group", lambda ps, **kw: ortho_fast.Dion2(ps, lr=0.02, **kw), "fraction",
              0.5),
    "dion": (dion_groups, "plan_dion_group", lambda ps, **kw: ortho_fast.Dion(ps, lr=0.02, **kw), "right_factor",
             "qr"),
}


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]


def _grads(ps, step: int) -> None:
    gen = torch.Generator().manual_seed(100 + step)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=gen)


def _count(monkeypatch, module, name: str) -> list:
    """A list that every call of ``module.name`` appends to (the function still runs)."""
    calls, real = [], getattr(module, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, counting)
    return calls


@pytest.fixture
def counted(request, monkeypatch):
    """(the case, a list the number of plans made is appended to)."""
    module, name, build, key, value = CASES[request.param]
    return (build, key, value), _count(monkeypatch, module, name)


@pytest.mark.parametrize("name", list(CASES))
def test_options_are_resolved_once_under_a_scheduler(name, monkeypatch):
    """The options (validation, the coefficient table) are resolved when the plan is made, not at
    every step a scheduler changes lr (the options cache alone resolved them again at every step)."""
    module, _, build, _, _ = CASES[name]
    calls = _count(monkeypatch, module, f"resolve_{name}_options")
    ps = _params()
    opt = build(ps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1 / (1 + t))
    calls.clear()  # construction validates the group
    for step in range(4):
        _grads(ps, step)
        opt.step()
        scheduler.step()
    assert len(calls) == 1


@pytest.mark.parametrize("counted", list(CASES), indirect=True)
def test_a_group_is_planned_once_over_steps_under_a_scheduler(counted):
    (build, _, _), calls = counted
    ps = _params()
    opt = build(ps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1 / (1 + t))
    for step in range(4):
        _grads(ps, step)
        opt.step()
        scheduler.step()
    assert len(calls) == 1


@pytest.mark.parametrize("counted", list(CASES), indirect=True)
def test_add_param_group_load_state_dict_and_a_changed_option_plan_again(counted):
    (build, key, value), calls = counted
    ps, extra = _params(), _params(1)[:2]
    opt = build(ps)
    _grads(ps, 0)
    opt.step()
    opt.step()
    assert len(calls) == 1
    opt.add_param_group({"params": extra})
    _grads(ps + extra, 1)
    opt.step()
    assert len(calls) == 2  # the first group's plan kept; the new group planned once (its check and step)
    opt.step()
    assert len(calls) == 2
    opt.load_state_dict(opt.state_dict())
    opt.step()
    assert len(calls) == 4  # both groups (their dicts replaced)
    opt.param_groups[0][key] = value
    opt.step()
    assert len(calls) == 5


def _twin_run(build, key, value, *, drop_plans: bool):
    """Five steps with an lr schedule and ``key`` set to ``value`` before the fourth; plans dropped
    before every step with ``drop_plans``. Returns the parameters."""
    ps = _params()
    opt = build(ps)
    for step in range(5):
        _grads(ps, step)
        opt.param_groups[0]["lr"] = 0.02 / (1 + step)
        if step == 3:
            opt.param_groups[0][key] = value
        if drop_plans:
            opt._runner.step_plans.clear()
        opt.step()
    return [p.detach().clone() for p in ps]


@pytest.mark.parametrize("name", list(CASES))
def test_kept_plans_step_as_fresh_plans(name):
    _, _, build, key, value = CASES[name]
    kept = _twin_run(build, key, value, drop_plans=False)
    fresh = _twin_run(build, key, value, drop_plans=True)
    assert all(torch.equal(a, b) for a, b in zip(kept, fresh))


@pytest.mark.parametrize("name", list(CASES))
def test_a_plan_that_misses_a_changed_option_is_caught(name, monkeypatch):
    """Planted: a plan that never notices a change (``holds`` always True) steps the old option
    after the change, and the comparison with fresh plans fails."""
    module, _, build, key, value = CASES[name]
    fresh = _twin_run(build, key, value, drop_plans=True)
    plan_class = module.Dion2Plan if name == "dion2" else module.DionPlan
    monkeypatch.setattr(plan_class, "holds", lambda self, group, live: True)
    stale = _twin_run(build, key, value, drop_plans=False)
    assert not all(torch.equal(a, b) for a, b in zip(stale, fresh))


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_lr_after_planning_raises_before_any_change(name):
    _, _, build, _, _ = CASES[name]
    ps = _params()
    opt = build(ps)
    _grads(ps, 0)
    opt.step()
    before = [p.detach().clone() for p in ps]
    state = {k: v.clone() for k, v in opt.state[ps[0]].items()}
    opt.param_groups[0]["lr"] = -1.0
    with pytest.raises(ValueError, match="^lr"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, ps))
    assert all(torch.equal(v, opt.state[ps[0]][k]) for k, v in state.items())
    opt.param_groups[0]["lr"] = 0.01
    opt.step()  # the plan still serves once the lr is valid again


def _changed_after_kept_checks(bad: str):
    """A Dion2 optimizer stepped three times with the same gradient tensors (its checks kept from the
    second step), then one gradient or momentum changed as ``bad`` says, keeping the tensor objects
    where it can (``.data`` replaced, an entry written): (optimizer, params, what must stay unchanged)."""
    ps = _params()
    opt = ortho_fast.Dion2(ps, lr=0.02)
    _grads(ps, 0)
    for _ in range(3):
        opt.step()
    p = ps[3]
    if bad == "dtype":
        p.grad.data = p.grad.data.double()
    elif bad == "shape":
        p.grad.data = torch.zeros(5, 4)
    elif bad == "momentum":
        opt.state[p]["momentum"] = torch.zeros(5, 4)
    else:
        p.grad[0, 0] = float("nan")
    kept = [q.detach().clone() for q in ps] + [opt.state[q]["momentum"].clone() for q in ps if q is not p]
    return opt, ps, kept


BAD = {"dtype": "^grad: expected dtype", "shape": "^grad: expected shape", "momentum": "^momentum: expected",
       "nan": "contains NaN or Inf"}


@pytest.mark.parametrize("bad", list(BAD))
def test_kept_dion2_checks_catch_a_change_after_planning(bad):
    """The per-parameter checks a Dion2 plan keeps (``Dion2Plan.check_live``) are done again when a
    gradient or momentum changes shape, dtype or identity, and the finiteness screen sees every
    gradient at every step: the step raises, naming it, and changes nothing."""
    opt, ps, kept = _changed_after_kept_checks(bad)
    with pytest.raises(ValueError, match=BAD[bad]):
        opt.step()
    now = [q.detach() for q in ps] + [opt.state[q]["momentum"] for q in ps if q is not ps[3]]
    assert all(torch.equal(a, b) for a, b in zip(kept, now))


def test_kept_dion2_checks_that_ignore_a_change_miss_it(monkeypatch):
    """Planted: checks kept by the gradient's identity alone (not its shape and dtype) let a gradient
    whose ``.data`` became float64 through, so the test above can fail."""
    real = dion2_groups.Dion2Plan.check_live

    def by_identity(self, state, finite):
        if self.checked and all(c is not None for c in self.checked):
            return
        real(self, state, finite)
    monkeypatch.setattr(dion2_groups.Dion2Plan, "check_live", by_identity)
    opt, _, _ = _changed_after_kept_checks("dtype")
    opt.step()  # stepped on the float64 gradient, no error naming it
