"""Verdicts of check_optimizer: the weight decay judged with power (a zero-gradient decay probe), a
Muon that does not skip None gradients, the parameter a raising step names, out-of-range
hyperparameters, a consumed gradient, nested state keys and tuple hyperparameter names."""

from __future__ import annotations

import functools

import pytest
import torch

from ortho_verify import tolerances as tol
from ortho_verify.checks.optimizer_checks import check_optimizer
from ortho_verify.conventions import MuonConventions
from ortho_verify.planted.muon import (
    JORDAN_CONVENTIONS,
    TORCH_STYLE_CONVENTIONS,
    JordanStyleMuon,
    TorchStyleMuon,
    planted,
)

F32 = dict(param_dtype=torch.float32, steps=2)


class NoneGradMuon(JordanStyleMuon):
    """Keller Jordan's single-device Muon's loop, which steps every parameter without skipping a None
    gradient (``p.grad`` is used as given), written here; ``consume`` sets p.grad to None after the step;
    ``nested`` keeps the momentum under state[p]["muon"]["buf"]; ``betas`` takes μ as betas[0]."""

    def __init__(self, params, lr=0.02, momentum=0.95, weight_decay=0.1, *, consume=False, nested=False,
                 betas=None):
        super().__init__(params, lr=lr, momentum=momentum if betas is None else betas[0], weight_decay=weight_decay)
        self.consume, self.nested = consume, nested

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad  # no None check: a parameter without a gradient raises below
                state = self.state[p].setdefault("muon", {}) if self.nested else self.state[p]
                buf = state.setdefault("buf" if self.nested else "momentum_buffer", torch.zeros_like(p))
                buf.lerp_(g, 1 - group["momentum"])
                u = g.lerp(buf, group["momentum"])
                x = u.bfloat16()
                tall = x.size(-2) > x.size(-1)
                x = x.mT if tall else x
                x = x / (x.norm() + 1e-7)
                for _ in range(5):
                    gram = x @ x.mT
                    x = 3.4445 * x + (-4.7750 * gram + 2.0315 * gram @ gram) @ x
                x = x.mT if tall else x
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(x.to(p.dtype), alpha=-group["lr"] * max(1, p.size(-2) / p.size(-1)) ** 0.5)
                if self.consume:
                    p.grad = None


def _failed(report):
    return [r for r in report.results if not r.passed]


@pytest.mark.parametrize("plant", ["weight decay applied twice", "weight decay with the adjusted lr",
                                   "weight decay coupled into the gradient"])
def test_wrong_weight_decay_fails_and_is_named(plant):
    factory, conv = planted(plant)
    report = check_optimizer(factory, conv, **F32)
    assert not report.passed
    decay = [r for r in _failed(report) if r.check == "muon_weight_decay"]
    assert decay and "decay" in decay[0].cause


def test_weight_decay_power_is_stated_and_bfloat16_makes_no_claim():
    assert tol.weight_decay_power(0.02, 0.1, "float32") <= tol.WEIGHT_DECAY_POWER_LIMIT
    assert tol.weight_decay_power(0.02, 0.1, "bfloat16") > 1
    report = check_optimizer(TorchStyleMuon, TORCH_STYLE_CONVENTIONS, param_dtype=torch.bfloat16, steps=1)
    rows = [r for r in report.results if r.check == "muon_weight_decay"]
    assert rows and all(not r.claimed for r in rows) and "power" not in rows[0].cause


def test_weight_decay_just_beyond_the_power_fails_and_within_passes():
    """A decay factor off by twice the row's power fails; the correct decay written as W − (lr·wd)·W passes."""
    lr, wd = 0.02, 0.1
    power = tol.weight_decay_power(lr, wd, "float32")

    class Off(TorchStyleMuon):
        def __init__(self, params, off=0.0, **kw):
            super().__init__(params, **kw)
            self.off = off

        @torch.no_grad()
        def step(self, closure=None):
            super().step(closure)
            for group in self.param_groups:
                for p in group["params"]:
                    p.mul_(1 - self.off * group["lr"] * group["weight_decay"])

    assert not check_optimizer(functools.partial(Off, off=2 * power), TORCH_STYLE_CONVENTIONS, lr=lr,
                               weight_decay=wd, **F32).passed
    assert check_optimizer(functools.partial(Off, off=0.0), TORCH_STYLE_CONVENTIONS, lr=lr, weight_decay=wd,
                           **F32).passed


def test_declared_styles_pass_their_own_optimizer():
    factory, _ = planted("weight decay with the adjusted lr")
    assert check_optimizer(factory, MuonConventions(eps_mode="clamp", weight_decay_style="adjusted_lr"), **F32).passed
    factory, _ = planted("weight decay coupled into the gradient")
    assert check_optimizer(factory, MuonConventions(eps_mode="clamp", weight_decay_style="l2"), **F32).passed


def test_muon_without_none_check_passes_with_grad_mutated_accepted():
    report = check_optimizer(NoneGradMuon, JORDAN_CONVENTIONS, allow_side_effects={"grad_mutated"})
    assert report.passed, [(r.check, r.input, r.cause) for r in _failed(report)]


def test_raising_row_names_the_parameter_that_raised():
    class RaisesOnSquare(TorchStyleMuon):
        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.shape[0] == p.shape[1]:
                        raise RuntimeError("square parameters are not supported")
            return super().step(closure)

    report = check_optimizer(RaisesOnSquare, TORCH_STYLE_CONVENTIONS, **F32)
    rows = [r for r in report.results if r.check == "optimizer_runs"]
    assert rows and rows[0].input.startswith("30x30")


@pytest.mark.parametrize("name,value", [("momentum", 1.5), ("momentum", -0.1), ("lr", 0.0), ("lr", float("nan")),
                                        ("weight_decay", -1.0), ("momentum", "0.9")])
def test_out_of_range_hyperparameter_raises_naming_it(name, value):
    with pytest.raises(ValueError, match=name):
        check_optimizer(TorchStyleMuon, TORCH_STYLE_CONVENTIONS, **{name: value})


def test_consumed_gradient_is_its_own_side_effect():
    factory = functools.partial(NoneGradMuon, consume=True)
    report = check_optimizer(factory, JORDAN_CONVENTIONS, **F32)
    failed = {r.check for r in _failed(report)}
    assert failed == {"gradient_kept"}, failed
    assert check_optimizer(factory, JORDAN_CONVENTIONS, allow_side_effects={"grad_consumed"}, **F32).passed


def test_nested_state_key_and_tuple_hyperparameter():
    conv = MuonConventions(eps_mode="add", momentum_state_key=("muon", "buf"),
                           hyperparameter_names={"lr": "lr", "momentum": "betas[0]", "weight_decay": "weight_decay"},
                           extra_kwargs={"betas": (0.9, 0.999)})
    factory = functools.partial(NoneGradMuon, nested=True)
    report = check_optimizer(factory, conv, **F32)
    assert report.passed and any(r.check == "muon_momentum" and r.claimed for r in report.results)
    wrong = check_optimizer(factory, conv, momentum=0.5, **F32)  # the tuple entry carries μ: 0.5 is seen
    assert wrong.passed


def test_gram_newton_schulz_declared_in_muon_conventions():
    """ortho_fast.Muon(gram=True) is Gram Newton–Schulz with restarts (2, 4): declared with form / restarts."""
    import ortho_fast
    from ortho_fast.functional.newton_schulz import gram_restarts

    conv = MuonConventions(eps_mode="clamp", form="gram", restarts=gram_restarts(5), ns_dtype=torch.float16)
    report = check_optimizer(functools.partial(ortho_fast.Muon, gram=True, dtype=torch.float16), conv, steps=2)
    assert report.passed, report.summary()
    assert any("gram" in str(r.extra) or r.check.startswith("muon_update/") for r in report.results)
    with pytest.raises(ValueError, match="restarts"):
        MuonConventions(restarts=(2,))
    with pytest.raises(ValueError, match="form"):
        MuonConventions(form="polar")
