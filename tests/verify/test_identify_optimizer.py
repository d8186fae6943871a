"""identify_optimizer: correct optimizers written differently are identified as their conventions and
pass; every planted optimizer ends not PASSED, or is identified as the other convention it plants (the
field named); bad input gets a ValueError naming what was probed."""

from __future__ import annotations

import functools

import pytest
import torch

import ortho_fast
from ortho_verify.conventions import MuonConventions
from ortho_verify.identify.optimizer import identify_optimizer
from ortho_verify.planted.bugs import PLANTED_BUGS
from ortho_verify.planted.muon import PLANTS, JordanStyleMuon, TorchStyleMuon, planted
from tests.load_file import load_file


def _fields(conv: MuonConventions, names) -> dict:
    return {n: getattr(conv, n) for n in names}


def test_torch_muon_is_identified_as_its_own_conventions_and_passes():
    found = identify_optimizer(torch.optim.Muon)
    conv = found.declaration
    assert found.fits and not found.differences, found.summary()
    assert _fields(conv, ("momentum_style", "nesterov", "nesterov_form", "coefficients", "eps_mode", "adjust_lr",
                          "weight_decay_style", "cautious_weight_decay", "momentum_state_key")) == dict(
        momentum_style="ema", nesterov=True, nesterov_form="mix", coefficients="jordan", eps_mode="clamp",
        adjust_lr="original", weight_decay_style="decoupled", cautious_weight_decay=False,
        momentum_state_key="momentum_buffer")
    assert found.passed, found.summary()
    assert "MuonConventions(" in found.snippet and "check_optimizer" in found.snippet
    assert all(e.margin > 2 for e in found.evidence if e.field in ("coefficients", "adjust_lr", "nesterov",
                                                                    "weight_decay_style")), found.summary()


def test_jordan_style_is_identified_with_eps_added():
    found = identify_optimizer(JordanStyleMuon, judge=False)
    assert found.fits and found.declaration.eps_mode == "add", found.summary()


@pytest.mark.parametrize("options, expected", [
    (dict(momentum_style="classic", nesterov=False, coefficients="polar_express", adjust_lr="spectral_norm"),
     dict(momentum_style="classic", nesterov=False, coefficients="polar_express", adjust_lr="spectral_norm")),
    (dict(adjust_lr="match_rms_adamw", cautious_weight_decay=True),
     dict(adjust_lr="match_rms_adamw", cautious_weight_decay=True)),
    (dict(momentum_style="classic", coefficients="cesista5", adjust_lr=None),
     dict(momentum_style="classic", nesterov=True, coefficients="cesista5", adjust_lr=None)),
])
def test_ortho_fast_option_sets_are_identified_from_a_factory(options, expected):
    found = identify_optimizer(functools.partial(ortho_fast.Muon, **options), judge=False)
    assert found.fits and not found.differences, found.summary()
    assert _fields(found.declaration, expected) == expected, found.summary()


@pytest.mark.slow
@pytest.mark.parametrize("options", [dict(momentum_style="classic", nesterov=False, coefficients="polar_express",
                                          adjust_lr="spectral_norm"),
                                     dict(adjust_lr="match_rms_adamw", cautious_weight_decay=True)])
def test_ortho_fast_option_sets_pass_the_judge(options):
    assert identify_optimizer(functools.partial(ortho_fast.Muon, **options)).passed


#: Plants that are another convention of the space (a correct optimizer of that convention): the
#: identification must name that field with the planted value.
CONVENTION_PLANTS = {
    "safety 1.01 for 1.02": ("safety", 1.01),
    "NorMuon as Muon": ("normuon_beta2", 0.95),
    "eps added, clamp declared": ("eps_mode", "add"),
    "lr scale match_rms_adamw for original": ("adjust_lr", "match_rms_adamw"),
    "Nesterov as g + mu*buf": ("nesterov_form", "full_grad"),
    "weight decay with the adjusted lr": ("weight_decay_style", "adjusted_lr"),
    "weight decay coupled into the gradient": ("weight_decay_style", "l2"),
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_every_plant_fails_or_is_identified_as_the_convention_it_plants(plant):
    factory, declared = planted(plant)
    found = identify_optimizer(factory, judge=plant not in CONVENTION_PLANTS)
    if plant in CONVENTION_PLANTS:
        field, value = CONVENTION_PLANTS[plant]
        assert getattr(found.declaration, field) == value != getattr(declared, field), found.summary()
        return
    assert not found.passed, found.summary()
    failed_rows = [r.check for r in found.report.results if not r.passed]
    assert found.differences or failed_rows, found.summary()  # the cause names the field or the failing row


def test_tuple_hyperparameter_and_consumed_gradient():
    class BetasMuon(JordanStyleMuon):
        def __init__(self, params, lr=0.02, betas=(0.95, 0.99), weight_decay=0.1):
            super().__init__(params, lr=lr, momentum=betas[0], weight_decay=weight_decay)

        @torch.no_grad()
        def step(self, closure=None):
            super().step(closure)
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad = None

    found = identify_optimizer(BetasMuon)
    assert found.declaration.hyperparameter_names["momentum"] == "betas[0]"
    assert found.fits and not found.passed, found.summary()  # the side effect is named, never accepted for the user
    assert set(found.report.kinds) >= {"side effect"} and found.report.kinds["wrong math"] == 0
    assert {r.check for r in found.report.results if not r.passed} == {"gradient_kept"}
    assert "allow_side_effects={'grad_consumed'}" in found.snippet


def test_wrong_decay_is_not_fitted():
    found = identify_optimizer(planted("weight decay applied twice")[0], judge=False)
    assert not found.fits and any("weight decay" in d for d in found.differences)


@pytest.mark.parametrize("thing, words", [
    (lambda params, **kw: object(), "without step"),
    (lambda params, **kw: 1 / 0, "ZeroDivisionError"),
    (type("Inert", (TorchStyleMuon,), {"step": lambda self, closure=None: None}), "did not move"),
])
def test_not_an_optimizer_raises_naming_what_was_probed(thing, words):
    with pytest.raises(ValueError, match="optimizer: probed") as info:
        identify_optimizer(thing, judge=False)
    assert words in str(info.value)


@pytest.mark.parametrize("bug", [b for b in PLANTED_BUGS if b.kind == "optimizer"], ids=lambda b: b.name)
def test_planted_optimizer_bugs_are_not_passed_from_identification_alone(bug):
    found = identify_optimizer(bug.make())
    if bug.name == "lr scale of the wrong mode":  # a correct optimizer of another convention: named
        assert found.declaration.adjust_lr == "spectral_norm" != bug.conventions.adjust_lr
        return
    assert not found.passed, found.summary()


def test_dion_written_differently_passes_and_a_planted_dion_does_not():
    from ortho_verify.planted.dion import FreeSignDion

    found = identify_optimizer(FreeSignDion)
    assert found.kind == "dion" and found.passed, found.summary()
    assert found.declaration.error_feedback and found.declaration.orientation == "min_side"
    never = identify_optimizer(functools.partial(FreeSignDion, transpose=False), judge=False)
    assert never.declaration.orientation == "never_transpose", never.summary()
    assert not identify_optimizer(functools.partial(FreeSignDion, roll_q=True)).passed


def test_dion_and_dion2_of_ortho_fast():
    dion = identify_optimizer(ortho_fast.Dion)
    assert dion.kind == "dion" and dion.passed and dion.declaration.q_state_key == "Q", dion.summary()
    dion2 = identify_optimizer(ortho_fast.Dion2)
    assert dion2.kind == "dion2" and dion2.passed, dion2.summary()


@pytest.mark.parametrize("kwargs, name", [(dict(judge="yes"), "judge"), (dict(seed=-1), "seed"),
                                          (dict(seed=1.5), "seed")])
def test_bad_arguments_raise_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name):
        identify_optimizer(TorchStyleMuon, **kwargs)
    with pytest.raises(ValueError, match="optimizer"):
        identify_optimizer(42)


def test_signature_without_a_momentum_keyword_raises_naming_it():
    class NoMomentum(TorchStyleMuon):
        def __init__(self, params, lr=0.02, weight_decay=0.1):
            super().__init__(params, lr=lr, weight_decay=weight_decay)

    with pytest.raises(ValueError, match="momentum"):
        identify_optimizer(NoMomentum)


def test_identify_optimizers_script_writes_its_table(tmp_path):
    """scripts/identify_optimizers.py without checkouts: torch.optim.Muon's row between the markers."""
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "identify_optimizers.py"
    script = load_file(path, "identify_optimizers")
    doc = tmp_path / "doc.md"
    doc.write_text(f"before\n{script.START}\nold\n{script.END}\nafter\n")
    assert script.main(["--write", str(doc)]) == 0
    text = doc.read_text()
    assert "old" not in text and text.startswith("before") and text.rstrip().endswith("after")
    assert "| torch.optim.Muon |" in text and "| PASSED |" in text and "`torch`: equal" in text


@pytest.mark.parametrize("mode", ["rms_norm", None])
def test_dion2_scale_is_read_from_the_weights(mode):
    found = identify_optimizer(functools.partial(ortho_fast.Dion2, adjust_lr=mode), judge=False)
    assert found.declaration.adjust_lr == mode, found.summary()
