"""ortho_fast's Muon pipeline stages and ortho_fast.NorMuon: the fast step against the oracle's
composition (float64 / float32 / bfloat16, drawn shapes and options), layouts (splits, heads,
batches) per block, microsoft/dion's constructor names, state dicts round trip bitwise."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_fast
from ortho_fast import Muon, NorMuon
from ortho_fast.normuon import NORMUON_DEFAULTS
from ortho_verify.checks.stages import check_muon_stages
from ortho_verify.registry import STAGE_CONFIGS
from tests.ortho_fast.helpers import stage_case
from tests.round_trip import assert_bitwise_same, round_trip


def _case(m, n, cond=1e2, seed=0):
    return stage_case("normuon", m, n, seed, cond)


@pytest.mark.parametrize("config", list(STAGE_CONFIGS))
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(24, 16), (12, 30)])
def test_registry_stage_configs_match_the_oracle(config, dtype, shape):
    rows = check_muon_stages(_case(*shape), config, dtype)
    assert rows and all(r.passed for r in rows), [(r.detail, r.error, r.tolerance) for r in rows if not r.passed]


@settings(deadline=None, max_examples=25)
@given(st.integers(1, 20), st.integers(1, 20), st.floats(0.0, 4.0), st.integers(0, 2**16),
       st.sampled_from([False, True, "column"]), st.booleans(), st.sampled_from([None, 0.0, 0.5, 0.95]),
       st.sampled_from(["row", "column", "by_shape"]), st.sampled_from(["add", "clamp"]),
       st.sampled_from(["float64", "float32"]))
def test_drawn_options_match_the_oracle(m, n, log_cond, seed, eq, renorm, beta2, dim, eps_mode, dtype):
    options = dict(STAGE_CONFIGS["microsoft/dion NorMuon"], row_equilibration=eq, renormalize=renorm,
                   normuon_beta2=beta2, normuon_dim=dim, normuon_eps_mode=eps_mode)
    STAGE_CONFIGS["drawn"] = options
    try:
        rows = check_muon_stages(_case(m, n, 10.0 ** log_cond, seed), "drawn", dtype)
    finally:
        del STAGE_CONFIGS["drawn"]
    assert all(r.passed for r in rows), [(r.detail, r.error, r.tolerance) for r in rows if not r.passed]


def _grads(shapes, steps, seed=0):
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(s) for s in shapes] for _ in range(steps)]


ALL_STAGES = dict(row_equilibration=True, renormalize=True, normuon_beta2=0.9, normuon_dim="by_shape",
                  normuon_eps=1e-10, normuon_eps_mode="clamp")


@pytest.mark.parametrize("make", [
    lambda ps: NorMuon(ps, lr=0.02, dtype=torch.float32),
    lambda ps: Muon(ps, lr=0.02, dtype=torch.float32, cautious_weight_decay=True, **ALL_STAGES),
])
def test_state_dict_round_trip_is_bitwise(make):
    shapes = [(6, 4), (3, 8)]
    w0 = [np.random.default_rng(9).standard_normal(s) for s in shapes]
    a, b = round_trip(make, w0, _grads(shapes, 4), dtype=torch.float32)
    assert_bitwise_same(a, b)
    assert all("variance_neuron" in a[1].state[p] for p in a[0])


def test_variance_state_matches_microsoft_dion_layout():
    p, q = torch.nn.Parameter(torch.randn(6, 4)), torch.nn.Parameter(torch.randn(3, 5, 4))
    opt = NorMuon([p, q], lr=0.01)
    p.grad, q.grad = torch.randn(6, 4), torch.randn(3, 5, 4)
    opt.step()
    assert opt.state[p]["variance_neuron"].shape == (6, 1)  # dion: zeros_like(param[..., 0:1])
    assert opt.state[q]["variance_neuron"].shape == (3, 5, 1)  # flatten=False: a batch of (5, 4) matrices
    assert opt.state[p]["variance_neuron"].dtype == p.dtype


def test_split_blocks_equal_separate_parameters():
    """NorMuon with split_sizes runs per block, as separate parameters would (microsoft/dion's
    split_sizes contract); the state is the blocks' second moments concatenated."""
    rng = np.random.default_rng(4)
    w, g = rng.standard_normal((10, 6)), rng.standard_normal((10, 6))
    fused = torch.nn.Parameter(torch.tensor(w))
    parts = [torch.nn.Parameter(torch.tensor(w[:4])), torch.nn.Parameter(torch.tensor(w[4:]))]
    kw = dict(lr=0.02, dtype=torch.float64, **ALL_STAGES)
    o1 = Muon([fused], split_sizes=(4, 6), **kw)
    o2 = Muon(parts, **kw)
    for _ in range(2):
        fused.grad = torch.tensor(g)
        parts[0].grad, parts[1].grad = torch.tensor(g[:4]), torch.tensor(g[4:])
        o1.step()
        o2.step()
    assert torch.equal(fused.detach(), torch.cat([parts[0].detach(), parts[1].detach()]))
    v = o1.state[fused]["variance_neuron"]
    assert v.shape == (6 + 6,)  # by_shape: the wide 4x6 block per column (1, 6), the square 6x6 per row (6, 1)
    assert torch.equal(v, torch.cat([o2.state[q]["variance_neuron"].reshape(-1) for q in parts]))


def test_stages_off_is_plain_muon_bitwise():
    shapes = [(6, 4)]
    w0 = [np.random.default_rng(1).standard_normal(s) for s in shapes]
    grads = _grads(shapes, 3)
    a, _ = round_trip(lambda ps: Muon(ps, lr=0.02), w0, grads, dtype=torch.float32)
    b, _ = round_trip(lambda ps: Muon(ps, lr=0.02, row_equilibration=False, renormalize=False, normuon_beta2=None),
                      w0, grads, dtype=torch.float32)
    assert_bitwise_same(a, b)


# ---------------------------------------------------------------------------------------
# microsoft/dion's constructor
# ---------------------------------------------------------------------------------------

P = [torch.nn.Parameter(torch.ones(6, 4))]


def test_defaults_are_microsoft_dion_normuon():
    opt = NorMuon(P)
    for key, value in NORMUON_DEFAULTS.items():
        assert opt.defaults[key] == value, key


def test_dion_positional_and_keyword_names():
    a = NorMuon(P, None, 0.02, 0.9, 0.8, (0.9, 0.95), 0.1, True, 1e-7, True, "rms_norm", True)
    b = NorMuon(P, lr=0.02, momentum=0.9, normuon_beta2=0.8, weight_decay=0.1, cautious_weight_decay=True, eps=1e-7,
                nesterov=True, adjust_lr="match_rms_adamw", flatten=True)
    c = NorMuon(P, lr=0.02, mu=0.9, muon_beta2=0.8, weight_decay=0.1, cautious_wd=True, epsilon=1e-7, nesterov=True,
                adjust_lr="rms_norm", flatten=True, use_polar_express=True, use_triton=False)
    for key in ("lr", "momentum", "normuon_beta2", "weight_decay", "cautious_weight_decay", "eps", "nesterov",
                "adjust_lr", "flatten", "coefficients"):
        assert a.defaults[key] == b.defaults[key] == c.defaults[key], key
    assert NorMuon(P, use_polar_express=False).defaults["coefficients"] == "cesista5"


@pytest.mark.parametrize("make, exc, key", [
    (lambda: NorMuon(P, muon_beta2=1.0), ValueError, "muon_beta2"),  # the name the user gave
    (lambda: NorMuon(P, normuon_beta2=None), ValueError, "normuon_beta2"),
    (lambda: NorMuon(P, normuon_beta2="0.9"), ValueError, "normuon_beta2"),
    (lambda: NorMuon(P, normuon_dim="neuron"), ValueError, "normuon_dim"),
    (lambda: NorMuon(P, normuon_eps_mode="max"), ValueError, "normuon_eps_mode"),
    (lambda: NorMuon(P, normuon_eps=-1.0), ValueError, "normuon_eps"),
    (lambda: NorMuon(P, normuon_eps=0.0, normuon_eps_mode="clamp"), ValueError, "normuon_eps"),
    (lambda: NorMuon(P, mu=0.9, momentum=0.8), ValueError, "mu"),
    (lambda: NorMuon(P, muon_beta2=0.9, normuon_beta2=0.8), ValueError, "muon_beta2"),
    (lambda: Muon(P, row_equilibration="diagonal"), ValueError, "row_equilibration"),
    (lambda: Muon(P, renormalize="yes"), TypeError, "renormalize"),
    (lambda: NorMuon(P, None, 0.1, 0.9, 0.9, (0.9, 0.95), 0.0, False, 1e-8, False, None, False, "extra"),
     TypeError, "NorMuon"),
])
def test_bad_options_raise_naming_the_key(make, exc, key):
    with pytest.raises(exc, match=rf"^['\"]?{key}"):
        make()


def _stepped(make=lambda ps: NorMuon(ps, lr=0.02, dtype=torch.float32)):
    p = torch.nn.Parameter(torch.randn(6, 4, generator=torch.Generator().manual_seed(0)))
    opt = make([p])
    p.grad = torch.randn(6, 4)
    opt.step()
    return p, opt


@pytest.mark.parametrize("bad, match", [
    (lambda v: torch.zeros(4, 1), "variance_neuron"),
    (lambda v: v.double(), "variance_neuron"),
    (lambda v: [0.0] * 6, "variance_neuron"),
])
def test_bad_variance_state_raises_before_any_change(bad, match):
    p, opt = _stepped()
    opt.state[p]["variance_neuron"] = bad(opt.state[p]["variance_neuron"])
    before = (p.detach().clone(), opt.state[p]["momentum_buffer"].clone())
    p.grad = torch.randn(6, 4)
    with pytest.raises(ValueError, match=match):
        opt.step()
    assert torch.equal(p.detach(), before[0]) and torch.equal(opt.state[p]["momentum_buffer"], before[1])


def test_variance_with_normuon_off_raises():
    p, opt = _stepped()
    opt.param_groups[0]["normuon_beta2"] = None
    p.grad = torch.randn(6, 4)
    with pytest.raises(ValueError, match="variance_neuron"):
        opt.step()


@pytest.mark.parametrize("corrupt, match", [
    (lambda st: st.update(variance_neuron=torch.zeros(6, 2)), "variance_neuron"),
    (lambda st: st.pop("variance_neuron"), "variance_neuron"),
    (lambda st: st.update(variance_neuron=torch.full((6, 1), float("nan"))), "variance_neuron"),
    (lambda st: st.update(exp_avg=torch.zeros(6, 4)), "exp_avg"),
])
def test_bad_checkpoint_rejected_before_any_change(corrupt, match):
    p, opt = _stepped()
    saved = opt.state_dict()
    corrupt(saved["state"][0])
    q, fresh = _stepped()
    before = {k: v.clone() for k, v in fresh.state[q].items()}
    with pytest.raises(ValueError, match=match):
        fresh.load_state_dict(saved)
    assert all(torch.equal(before[k], fresh.state[q][k]) for k in before)


def test_normuon_group_state_dict_has_no_torch_keys():
    """torch.optim.Muon cannot express a stage: its keys are left out (its load then fails clearly)."""
    _, opt = _stepped(lambda ps: Muon(ps, lr=0.02, normuon_beta2=0.9))
    assert "ns_coefficients" not in opt.state_dict()["param_groups"][0]
    _, plain = _stepped(lambda ps: Muon(ps, lr=0.02))
    assert "ns_coefficients" in plain.state_dict()["param_groups"][0]


def test_exported():
    assert ortho_fast.NorMuon is NorMuon and "NorMuon" in ortho_fast.__all__
