"""``capturable=True`` (torch's option) for Muon, NorMuon, Dion2 and HybridOptimizer's Muon / Dion2
groups: lr, weight decay and momentum (Dion2: ``ef_decay``) reach the kernels as 0-dim tensors on the
parameters' device, the step reads nothing from the device, and a scheduler changing lr every step is
followed, to float32 roundoff of the eager step.

Tolerance: ``ortho_verify.tolerances.compiled_tolerance("float32")`` (1e-5 relative, Frobenius). The
capturable step is the eager algorithm in the same precision; where eager passes a scalar as a
kernel's ``alpha`` it forms the product first and adds it (``ortho_fast.functional.graph_scalars``),
which rounds one intermediate more: two computed values of one exact step, the situation whose
bound ``compiled_tolerance`` derives (fused or reordered elementwise roundings, ≲ 2c·√d·u).
Host reads are counted as the aten operations behind ``.item()``, ``float()``, ``bool()`` of a
tensor (``tests.ortho_fast.test_graph_ready.HOST_SYNCS``) under a ``TorchDispatchMode``.
"""

from __future__ import annotations

import collections

import pytest
import torch

import ortho_fast
from ortho_fast.functional import stacked
from ortho_fast.groups import muon as group_muon
from ortho_verify.tolerances import compiled_tolerance
from tests.ortho_fast.test_graph_ready import HOST_SYNCS, RecordOps

#: Six (32, 16) matrices: one stacked chunk whose momentum and update run in rounds; (16, 48) x2: a
#: second stack; (24, 24): a lone shape (the rest's 2-D step).
SHAPES = [(32, 16)] * 6 + [(16, 48)] * 2 + [(24, 24)]
TOL = compiled_tolerance("float32")


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]


def _hybrid(ps, capturable, lr):
    return ortho_fast.HybridOptimizer([
        {"params": ps[:6], "algorithm": "muon", "lr": lr(0.02), "capturable": capturable},
        {"params": ps[6:8], "algorithm": "dion2", "lr": lr(0.01), "capturable": capturable},
        {"params": ps[8:], "algorithm": "muon", "lr": lr(0.02), "capturable": capturable, "normuon_beta2": 0.95},
    ], check_finite=False)


BUILDERS = {
    "muon": lambda ps, c, lr: ortho_fast.Muon(ps, lr=lr(0.02), capturable=c, check_finite=False),
    "muon_classic": lambda ps, c, lr: ortho_fast.Muon(ps, lr=lr(0.02), momentum_style="classic",
                                                      weight_decay_style="adjusted_lr", capturable=c,
                                                      check_finite=False),
    "muon_float32": lambda ps, c, lr: ortho_fast.Muon(ps, lr=lr(0.02), dtype=torch.float32, capturable=c,
                                                      check_finite=False),
    "muon_cautious_independent": lambda ps, c, lr: ortho_fast.Muon(ps, lr=lr(0.02), cautious_weight_decay=True,
                                                                   weight_decay_style="independent", capturable=c,
                                                                   check_finite=False),
    "normuon": lambda ps, c, lr: ortho_fast.NorMuon(ps, lr=lr(0.02), capturable=c, check_finite=False),
    "dion2": lambda ps, c, lr: ortho_fast.Dion2(ps, lr=lr(0.01), capturable=c, check_finite=False),
    "hybrid": _hybrid,
}


def _run(name: str, capturable: bool, tensor_lr: bool = False, steps: int = 4, lr_factor: float = 1.0,
         mode_factory=None, schedule=lambda t: 1.0 / (1.0 + 0.5 * t)):
    """``steps`` steps with a LambdaLR (``schedule``) changing lr at every step; returns (W0, W, what the
    modes saw)."""
    ps = _params()
    start = [p.detach().clone() for p in ps]

    def lr(value):
        value *= lr_factor
        return torch.tensor(value) if tensor_lr else value

    opt = BUILDERS[name](ps, capturable, lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    gen = torch.Generator().manual_seed(1)
    seen = []
    for _ in range(steps):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen)
        if mode_factory is None:
            opt.step()
        else:
            with mode_factory() as mode:
                opt.step()
            seen.append(mode)
        sched.step()
    return start, ps, seen


def _moved(a, b, start) -> float:
    """max over parameters of ‖(A − W0) − (B − W0)‖_F / ‖B − W0‖_F: the displacement, stricter than W itself."""
    return max(float(torch.linalg.norm(x.detach() - y.detach()) / torch.linalg.norm(y.detach() - w))
               for x, y, w in zip(a, b, start))


@pytest.mark.parametrize("name", list(BUILDERS))
def test_capturable_equals_eager_with_a_scheduler(name):
    """capturable=True (float lr copied into the device tensor, and a tensor lr the scheduler fills)
    equals capturable=False within ``compiled_tolerance`` on the displacement W − W0 after four steps
    of a changing lr; the float and tensor forms of the capturable step agree bit for bit."""
    start, eager, _ = _run(name, False)
    _, device_float, _ = _run(name, True)
    _, device_tensor, _ = _run(name, True, tensor_lr=True)
    assert _moved(device_float, eager, start) <= TOL
    assert all(torch.equal(a, b) for a, b in zip(device_float, device_tensor))


@pytest.mark.parametrize("name", ["muon", "dion2"])
def test_a_wrong_lr_is_caught(name):
    """The comparison can fail: the capturable twin with a 1e-4 larger lr exceeds the tolerance; and
    the scheduler is followed: without it (a constant lr) the result differs beyond it too."""
    start, eager, _ = _run(name, False)
    _, planted, _ = _run(name, True, tensor_lr=True, lr_factor=1 + 1e-4)
    assert _moved(planted, eager, start) > TOL
    _, frozen, _ = _run(name, True, tensor_lr=True, schedule=lambda t: 1.0)  # a graph replaying its first lr
    assert _moved(frozen, eager, start) > TOL


def test_the_rounds_and_stacks_run_in_the_checked_steps(monkeypatch):
    """The sizes above reach the stacked step's rounds (momentum and update), so the comparison covers them."""
    calls = collections.Counter()
    for fn in ("momentum_rounds", "update_rounds"):
        real = getattr(stacked, fn)

        def counted(*args, _real=real, _fn=fn, **kwargs):
            out = _real(*args, **kwargs)
            calls[_fn] += out is not None
            return out

        monkeypatch.setattr(stacked, fn, counted)
    monkeypatch.setattr(ortho_fast.functional.muon, "momentum_rounds", stacked.momentum_rounds)
    _run("muon", True, steps=2)
    assert calls["momentum_rounds"] > 0 and calls["update_rounds"] > 0, calls


@pytest.mark.parametrize("name", list(BUILDERS))
def test_a_capturable_step_reads_nothing_from_the_device(name):
    """Steady state (steps 2-4) with check_finite=False: no ``.item()`` / ``float()`` / ``bool()`` of a tensor."""
    _, _, seen = _run(name, True, tensor_lr=True, mode_factory=RecordOps)
    synced = [sorted({str(op) for op in mode.ops if op in HOST_SYNCS}) for mode in seen[1:]]
    assert synced == [[], [], []], synced


def test_the_read_counter_sees_a_read():
    """The count can fail: with check_finite=True the step's one finiteness read is seen at each step."""
    ps = _params()
    opt = ortho_fast.Muon(ps, lr=torch.tensor(0.02), capturable=True)
    for _ in range(2):
        for p in ps:
            p.grad = torch.randn_like(p)
        with RecordOps() as mode:
            opt.step()
        assert sum(op in HOST_SYNCS for op in mode.ops) == 1


@pytest.mark.parametrize("build", [
    lambda ps, lr: ortho_fast.Muon(ps, lr=lr),
    lambda ps, lr: ortho_fast.NorMuon(ps, lr=lr),
    lambda ps, lr: ortho_fast.Dion2(ps, lr=lr),
    lambda ps, lr: ortho_fast.HybridOptimizer([{"params": ps, "algorithm": "muon", "lr": lr}]),
    lambda ps, lr: ortho_fast.HybridOptimizer([{"params": ps, "algorithm": "dion2", "lr": lr}]),
])
def test_a_tensor_lr_without_capturable_is_refused(build):
    """A tensor lr with capturable=False raises ValueError naming ``lr`` (never synced silently)."""
    with pytest.raises(ValueError, match=r"(^|: )lr: a tensor lr needs capturable=True"):
        build(_params()[:2], torch.tensor(0.02))


def test_a_tensor_lr_set_after_construction_is_refused_before_any_change():
    """A tensor written into a non-capturable group is refused at the step, naming ``lr``, before any change."""
    ps = _params()[:2]
    opt = ortho_fast.Muon(ps, lr=0.02)
    for p in ps:
        p.grad = torch.randn_like(p)
    before = [p.detach().clone() for p in ps]
    opt.param_groups[0]["lr"] = torch.tensor(0.01)
    with pytest.raises(ValueError, match=r"^lr: a tensor lr needs capturable=True"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, ps)) and not opt.state


@pytest.mark.parametrize("key", ["lr", "weight_decay", "momentum"])
def test_a_device_hyperparameter_must_be_a_0_dim_tensor_on_the_parameters_device(key):
    """A tensor of another shape raises TypeError naming the key; one on another device ValueError at the step."""
    ps = _params()[:2]
    with pytest.raises(TypeError, match=rf"^{key}: expected a 0-dim real floating tensor"):
        ortho_fast.Muon(ps, capturable=True, **{key: torch.tensor([0.02])})
    opt = ortho_fast.Muon(ps, capturable=True, **{key: torch.tensor(0.02, device="meta")})
    for p in ps:
        p.grad = torch.randn_like(p)
    with pytest.raises(ValueError, match=rf"^{key}: a tensor {key} must be on the parameters' device"):
        opt.step()


def test_dion_says_it_cannot_be_captured():
    """Dion and a HybridOptimizer Dion group refuse capturable=True, naming ``capturable``."""
    p = torch.nn.Parameter(torch.randn(8, 8))
    with pytest.raises(ValueError, match=r"^capturable: Dion cannot be captured"):
        ortho_fast.Dion([p], capturable=True)
    with pytest.raises(ValueError, match=r"capturable: Dion cannot be captured"):
        ortho_fast.HybridOptimizer([{"params": [p], "algorithm": "dion", "capturable": True}])


def test_capturable_is_a_bool():
    with pytest.raises(TypeError, match=r"^capturable: expected a bool"):
        ortho_fast.Muon(_params()[:2], capturable=1)


def test_capturable_false_is_the_default_group_key():
    """The option is a Muon group key (saved in the state dict), False by default."""
    assert group_muon.MUON_DEFAULTS["capturable"] is False
    assert ortho_fast.Muon(_params()[:2]).state_dict()["param_groups"][0]["capturable"] is False


@pytest.mark.parametrize("name", ["muon", "dion2"])
def test_a_capturable_checkpoint_resumes_bit_for_bit(name):
    """state_dict / load_state_dict keep ``capturable`` and the state: a resumed copy steps as the original."""
    ps, twin = _params(), _params()
    opt, resumed = BUILDERS[name](ps, True, torch.tensor), BUILDERS[name](twin, True, torch.tensor)
    for p in ps:
        p.grad = torch.randn_like(p)
    opt.step()
    resumed.load_state_dict(opt.state_dict())
    for q, p in zip(twin, ps):
        q.data.copy_(p.detach())
    assert resumed.param_groups[0]["capturable"] is True
    for p, q in zip(ps, twin):
        p.grad = torch.randn_like(p)
        q.grad = p.grad.clone()
    opt.step()
    resumed.step()
    assert all(torch.equal(p, q) for p, q in zip(ps, twin))
