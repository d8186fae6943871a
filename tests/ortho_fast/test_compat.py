"""Drop-in names (``ortho_fast.compat``): torch.optim.Muon's, microsoft/dion's Dion and Muon,
Emerging-Optimizers' / Megatron's and OLMo-core's names give the optimizer our names give
(bitwise), conflicting names raise naming both, unknown names raise with the closest name,
options with no counterpart here are accepted only where the behaviour is ours.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from ortho_fast import Dion, DionConfig, Muon, MuonConfig
from ortho_fast.compat import DION_ALIASES, FIXED, MUON_ALIASES, MUON_CONFIG_ALIASES
from tests.ortho_fast.helpers import gradient_matrix, rng_for
from tests.round_trip import run_steps

SHAPES = ((12, 8), (8, 12), (10, 10))


def _problem(key, steps: int = 3, shapes=SHAPES):
    rng = rng_for("compat", key)
    w0 = [torch.tensor(0.02 * rng.standard_normal(s), dtype=torch.float32) for s in shapes]
    grads = [[torch.tensor(gradient_matrix(s, rng), dtype=torch.float32) for s in shapes] for _ in range(steps)]
    return w0, grads


def _run(make, w0, grads):
    ps = [torch.nn.Parameter(w.clone()) for w in w0]
    run_steps(ps, make(ps), grads)
    return ps


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


# =======================================================================================
# torch.optim.Muon's names
# =======================================================================================

TORCH_KWARGS = st.fixed_dictionaries({}, optional={
    "lr": st.sampled_from([1e-3, 0.02]),
    "weight_decay": st.sampled_from([0.0, 0.1]),
    "momentum": st.sampled_from([0.9, 0.95]),
    "nesterov": st.booleans(),
    "ns_coefficients": st.sampled_from([(3.4445, -4.7750, 2.0315), (3.0, -3.2, 1.2), (1.5, -0.5, 0.0)]),
    "eps": st.sampled_from([1e-7, 1e-3]),
    "ns_steps": st.integers(1, 6),
    "adjust_lr_fn": st.sampled_from([None, "original", "match_rms_adamw"]),
})


@settings(max_examples=12, deadline=None)
@given(kwargs=TORCH_KWARGS)
def test_torch_muon_keywords_give_torch_muon_bitwise(kwargs):
    """Any torch.optim.Muon keyword call works unchanged and steps bitwise as torch's (its
    custom rows keep torch's normalization U / max(‖U‖_F, eps))."""
    w0, grads = _problem("torch-kw")
    ours = _run(lambda ps: Muon(ps, **kwargs), w0, grads)
    torchs = _run(lambda ps: torch.optim.Muon(ps, **kwargs), w0, grads)
    assert _same(ours, torchs)


def test_torch_muon_positional_order():
    args = (0.02, 0.05, 0.9, False, (3.0, -3.2, 1.2), 1e-6, 4, "match_rms_adamw")
    w0, grads = _problem("torch-pos")
    assert _same(_run(lambda ps: Muon(ps, *args), w0, grads), _run(lambda ps: torch.optim.Muon(ps, *args), w0, grads))
    with pytest.raises(TypeError, match="positional"):
        Muon([torch.nn.Parameter(w0[0])], *args, "extra")
    with pytest.raises(TypeError, match="multiple values for argument 'eps'"):
        Muon([torch.nn.Parameter(w0[0])], *args[:6], eps=1e-7)


# =======================================================================================
# microsoft/dion's, Emerging-Optimizers' and Megatron's Muon names
# =======================================================================================

@pytest.mark.parametrize("foreign, ours", [
    (dict(mu=0.9, epsilon=1e-8, cautious_wd=True, use_polar_express=True, adjust_lr="rms_norm", nesterov=False,
          use_triton=False, use_gram_newton_schulz=False, newton_schulz_func=None, betas=(0.9, 0.95)),
     dict(momentum=0.9, eps=1e-8, cautious_weight_decay=True, coefficients="polar_express",
          adjust_lr="match_rms_adamw", nesterov=False)),
    (dict(use_polar_express=False), dict(coefficients="cesista5")),
    (dict(coefficient_type="quintic", num_ns_steps=6, scale_mode="spectral", fp32_matmul_prec="highest",
          extra_scale_factor=0.5, split_qkv=False),
     dict(coefficients="cesista5", ns_steps=6, adjust_lr="spectral", dtype="highest", extra_scale_factor=0.5)),
    (dict(muon_momentum=0.9, muon_nesterov=False, muon_coefficient_type="simple", muon_num_ns_steps=4,
          muon_scale_mode="unit_rms_norm", muon_fp32_matmul_prec="medium", muon_extra_scale_factor=2.0,
          muon_split_qkv=False, muon_use_syrk=False),
     dict(momentum=0.9, nesterov=False, coefficients="jordan", ns_steps=4, adjust_lr="unit_rms_norm",
          dtype="medium", extra_scale_factor=2.0)),
])
def test_foreign_muon_names_step_as_ours(foreign, ours):
    w0, grads = _problem("dion-muon")
    assert _same(_run(lambda ps: Muon(ps, lr=0.02, **foreign), w0, grads),
                 _run(lambda ps: Muon(ps, lr=0.02, **ours), w0, grads))


@pytest.mark.parametrize("kwargs, message", [
    (dict(momentum=0.9, mu=0.8), r"^mu: conflicts with momentum"),
    (dict(mu=0.9, muon_momentum=0.8), r"^muon_momentum: conflicts with mu"),
    (dict(coefficients="polar_express", ns_coefficients=(3.0, -3.2, 1.2)),
     r"^ns_coefficients: conflicts with coefficients"),
    (dict(use_polar_express=True, coefficient_type="quintic"), r"conflicts with use_polar_express"),
    (dict(adjust_lr="spectral_norm", adjust_lr_fn="match_rms_adamw"), r"^adjust_lr_fn: conflicts with adjust_lr"),
])
def test_conflicting_names_raise_naming_both(kwargs, message):
    p = torch.nn.Parameter(torch.zeros(4, 6))
    with pytest.raises(ValueError, match=message):
        Muon([p], **kwargs)


def test_the_same_value_under_two_names_is_accepted():
    p = torch.nn.Parameter(torch.zeros(4, 6))
    assert Muon([p], momentum=0.9, mu=0.9).defaults["momentum"] == 0.9


@pytest.mark.parametrize("kwargs, message", [
    (dict(ns_coefficent=(1, 2, 3)), r"'ns_coefficent'; did you mean 'ns_coefficients'"),
    (dict(nesterof=True), r"did you mean 'nesterov'"),
    (dict(rank_fraction=0.5), r"unexpected keyword argument 'rank_fraction'"),
])
def test_unknown_names_raise_with_the_closest_name(kwargs, message):
    with pytest.raises(TypeError, match=message):
        Muon([torch.nn.Parameter(torch.zeros(4, 6))], **kwargs)


@pytest.mark.parametrize("kwargs, name", [
    (dict(use_triton=True), "use_triton"), (dict(use_gram_newton_schulz=True), "use_gram_newton_schulz"),
    (dict(newton_schulz_func=lambda x, epsilon: x), "newton_schulz_func"), (dict(split_qkv=True), "split_qkv"),
    (dict(muon_use_syrk=True), "muon_use_syrk"), (dict(coefficient_type="polar_express"), "coefficient_type"),
    (dict(adjust_lr_fn="spectral_norm"), "adjust_lr_fn"), (dict(ns_coefficients=(1.0, 2.0)), "ns_coefficients"),
    (dict(betas=(0.9, 2.0)), "betas"),
])
def test_options_without_our_behaviour_are_rejected(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}: "):
        Muon([torch.nn.Parameter(torch.zeros(4, 6))], **kwargs)


def test_dion_muon_positional_mesh_is_explained():
    class DeviceMesh:  # what the check looks at: the class name
        pass

    with pytest.raises(TypeError, match="^lr: .*distributed_mesh"):
        Muon([torch.nn.Parameter(torch.zeros(4, 6))], DeviceMesh())


def test_group_aliases_and_foreign_group_options():
    w0, grads = _problem("groups")
    a = _run(lambda ps: Muon([{"params": ps, "mu": 0.9, "adjust_lr": "rms_norm"}]), w0, grads)
    b = _run(lambda ps: Muon([{"params": ps, "momentum": 0.9, "adjust_lr": "match_rms_adamw"}]), w0, grads)
    assert _same(a, b)
    p = torch.nn.Parameter(torch.zeros(4, 6))
    with pytest.raises(ValueError, match="^rank_fraction: an option of dion"):
        Muon([{"params": [p], "rank_fraction": 0.5}])
    with pytest.raises(ValueError, match="^algorithm: Muon runs 'muon' groups only"):
        Muon([{"params": [p], "algorithm": "adamw"}])
    with pytest.raises(ValueError, match="^algorithm: Dion runs 'dion' groups only"):
        Dion([{"params": [p], "algorithm": "adamw"}])
    with pytest.raises(ValueError, match="^mu: conflicts with momentum"):
        Muon([{"params": [p], "mu": 0.9, "momentum": 0.8}])


# =======================================================================================
# microsoft/dion's Dion
# =======================================================================================

def test_dion_positional_order_and_names_of_microsoft_dion():
    w0, grads = _problem("dion")
    pos = (None, None, None, True, 0.5, 2, 0.02, 0.9, (0.9, 0.95), 0.05, 1e-7, 1, "rcqr", 150, 1.5,
           {"momentum_dtype": torch.float64, "Q_dtype": None, "variance_dtype": None})
    ours = dict(rank_fraction=0.5, rank_multiple_of=2, lr=0.02, mu=0.9, weight_decay=0.05, epsilon=1e-7,
                power_iters=1, qr_method="randomized_cholesky_qr", oversample=1.5, momentum_dtype=torch.float64)
    assert _same(_run(lambda ps: Dion(ps, *pos, seed=3), w0, grads),
                 _run(lambda ps: Dion(ps, seed=3, **ours), w0, grads))
    p = torch.nn.Parameter(torch.zeros(4, 6))
    with pytest.raises(TypeError, match="^replicate_mesh: got 0.01; Dion's positional order"):
        Dion([p], 0.01)
    with pytest.raises(ValueError, match="^rcqr_oversample: conflicts with oversample"):
        Dion([p], oversample=2.0, rcqr_oversample=1.5)
    with pytest.raises(ValueError, match="^cqr_warmup_steps: "):
        Dion([p], cqr_warmup_steps=-1)
    with pytest.raises(ValueError, match="variance_dtype"):
        Dion([p], mixed_precision_config={"variance_dtype": torch.float32})
    with pytest.raises(ValueError, match="^mixed_precision_config: its q_dtype"):
        Dion([p], q_dtype=torch.float32, mixed_precision_config={"Q_dtype": torch.float64})
    with pytest.raises(TypeError, match="did you mean 'rank_fraction'"):
        Dion([p], rank_fracton=0.5)


# =======================================================================================
# Configs: OLMo-core's and Megatron's names
# =======================================================================================

def test_configs_take_olmo_core_and_megatron_names():
    olmo = MuonConfig(lr=0.01, mu=0.9, betas=(0.9, 0.95), weight_decay=0.1, cautious_wd=True, nesterov=False,
                      adjust_lr="rms_norm", flatten=True, use_triton=False)
    assert (olmo.momentum, olmo.scalar_betas, olmo.adjust_lr) == (0.9, (0.9, 0.95), "match_rms_adamw")
    assert olmo.muon_options == {"cautious_weight_decay": True, "flatten": True}
    megatron = MuonConfig(muon_momentum=0.9, muon_coefficient_type="quintic", muon_num_ns_steps=6,
                          muon_scale_mode="spectral", muon_fp32_matmul_prec="high", muon_tp_mode="distributed",
                          muon_extra_scale_factor=2.0, muon_split_qkv=False,
                          muon_scalar_optimizer="lion", adam_eps=1e-6)
    assert (megatron.coefficients, megatron.ns_steps, megatron.adjust_lr, megatron.tp_mode, megatron.scalar_algorithm,
            megatron.scalar_eps) == ("cesista5", 6, "spectral", "distributed", "lion", 1e-6)
    assert megatron.muon_options == {"dtype": "high", "extra_scale_factor": 2.0}
    assert DionConfig(rcqr_oversample=1.5, cqr_warmup_steps=10).dion_options == {"oversample": 1.5}
    with pytest.raises(ValueError, match="^mu: conflicts with momentum"):
        MuonConfig(mu=0.9, momentum=0.8)
    with pytest.raises(TypeError, match="did you mean 'rank_fraction'"):
        DionConfig(rank_fracton=0.5)
    with pytest.raises(ValueError, match="^muon_split_qkv: "):
        MuonConfig(muon_split_qkv=True)
    with pytest.raises(ValueError, match="^flatten: given both"):
        MuonConfig(flatten=True, muon_options={"flatten": False})


def test_configs_built_from_aliases_equal_configs_from_our_names():
    a = MuonConfig(mu=0.9, cautious_wd=True, muon_scale_mode="spectral_norm")
    b = MuonConfig(momentum=0.9, adjust_lr="spectral_norm", muon_options={"cautious_weight_decay": True})
    assert a == b


def test_alias_tables_name_options_that_exist():
    from ortho_fast.groups.dion import DION_DEFAULTS
    from ortho_fast.groups.muon import MUON_DEFAULTS

    assert {a.option for a in MUON_ALIASES} <= set(MUON_DEFAULTS) | {"tp_mode"}
    assert {a.option for a in DION_ALIASES} <= set(DION_DEFAULTS)
    config_fields = set(MuonConfig.__dataclass_fields__)
    assert {a.option for a in MUON_CONFIG_ALIASES} <= set(MUON_DEFAULTS) | config_fields
    names = [a.name for a in MUON_CONFIG_ALIASES] + [f.name for f in FIXED["muon_config"]]
    assert len(names) == len(set(names))


def test_every_name_of_the_tables_is_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "compatibility.md").read_text()
    tables = MUON_CONFIG_ALIASES + DION_ALIASES
    names = {a.name for a in tables} | {f.name for fixed in FIXED.values() for f in fixed}
    missing = sorted(n for n in names if f"`{n}`" not in doc)
    assert not missing, missing
