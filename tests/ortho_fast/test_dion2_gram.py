"""Gram Newton–Schulz on Dion2's selected submatrix (``Dion2(..., gram=...)``, Muon's option): the float16
kernel with its restarts within the judge's Gram tolerance of the oracle (and a planted kernel without
restarts caught), float32 Gram within the Dion2 judge's tolerance, the automatic rule, the same option
through ``HybridOptimizer`` and ``param_groups``, Muon's errors for bad settings (naming ``gram``, changing
nothing) and state dicts round-tripping it."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_fast
import ortho_ref
from ortho_fast.functional import dion2 as dion2_math
from ortho_fast.functional.newton_schulz import frobenius_normalize_, gram_iterate, gram_restarts, power_of_two_scale
from ortho_fast.groups.dion2 import DION2_DEFAULTS
from ortho_verify.checks import compare_ns_output
from ortho_verify.checks.dion2 import compare_dion2_step
from ortho_verify.inputs.spectra import matrix_with_spectrum


def _planted_gradient(m: int, n: int, k: int, rng: np.random.Generator, flat: bool):
    """An (m, n) gradient whose k selected slices (rows when m <= n, else columns; at random
    positions) form A with singular values 3·[1 … 0.05] geometric (or all 3: ``flat``), the other
    entries 1e-3·N(0, 1): every L1 norm of A's slices is far above the rest, so the selection is A's
    and every direction of A is resolved in float16. Returns (gradient, selected indices, rows)."""
    rows = m <= n
    size, other = (m, n) if rows else (n, m)
    selected = np.sort(rng.choice(size, k, replace=False))
    spectrum = 3.0 * (np.ones(k) if flat else np.geomspace(1.0, 0.05, k))
    a = matrix_with_spectrum(spectrum, k, other, rng)
    g = 1e-3 * rng.standard_normal((size, other))
    g[selected] = a
    return (g if rows else g.T), selected, rows


def _one_step(g: np.ndarray, k: int, **options) -> tuple[torch.nn.Parameter, ortho_fast.Dion2]:
    """One Dion2 step from zero float32 weights with lr 1, no decay, no lr scaling: W₁ = −O_S on the
    selected slices exactly (the orthogonalized submatrix cast to float32 and negated), 0 elsewhere."""
    p = torch.nn.Parameter(torch.zeros(g.shape, dtype=torch.float32))
    fraction = k / min(g.shape)
    opt = ortho_fast.Dion2([p], lr=1.0, weight_decay=0.0, adjust_lr=None, fraction=fraction, **options)
    p.grad = torch.from_numpy(g).to(torch.float32)
    opt.step()
    return p, opt


def _judge_gram_float16(g, selected, rows, p, schedule) -> list:
    """The judge's float16 Gram rows (``form="gram"``, our restarts) for the update on the selected
    slices, against ns_map of the selected submatrix as the optimizer held it (float32)."""
    table = ortho_ref.schedule(schedule)
    sched = ortho_ref.SCHEDULES[schedule]
    held = torch.from_numpy(g).to(torch.float32).double().numpy()
    a = held[selected] if rows else held[:, selected]
    w = -p.detach().double().numpy()
    update = w[selected] if rows else w[:, selected]
    return compare_ns_output(update, a, table, safety=sched.safety, eps=DION2_DEFAULTS["epsilon"],
                             dtype="float16", input_name=f"{a.shape}", detail=f"Dion2 float16 gram {schedule}",
                             form="gram", restarts=gram_restarts(len(table)))


SHAPES = st.sampled_from([(16, 64), (64, 16), (32, 96), (24, 24), (12, 120)])


@settings(deadline=None, max_examples=12)
@given(shape=SHAPES, fraction=st.sampled_from([0.125, 0.25, 0.5]), flat=st.booleans(),
       schedule=st.sampled_from(["polar_express", "you6", "jordan", "cesista5"]), seed=st.integers(0, 2**31))
def test_float16_gram_update_is_within_the_judge_gram_tolerance(shape, fraction, flat, schedule, seed):
    """The float16 Gram update of the selected submatrix passes the judge's Gram rows (every direction
    claimed), and the selection and momentum pass the Dion2 judge's rows."""
    rng = np.random.default_rng(seed)
    k = max(1, int(np.ceil(fraction * min(shape))))
    g, selected, rows = _planted_gradient(*shape, k, rng, flat)
    p, opt = _one_step(g, k, dtype=torch.float16, gram=True, coefficients=schedule, ef_decay=0.5)
    judged = _judge_gram_float16(g, selected, rows, p, schedule)
    assert all(r.passed for r in judged), [r for r in judged if not r.passed]
    assert all(r.claimed for r in judged if r.check == "ns_projected_singular_values")
    w = p.detach().double().numpy()
    off = np.delete(w, selected, axis=0 if rows else 1)
    assert not off.any()  # nothing written off the selection
    dion2_rows = compare_dion2_step("planted", "float16 gram", np.zeros(shape), g.astype(np.float32).astype(float),
                                    np.zeros(shape), w, opt.state[p]["momentum"].double().numpy(),
                                    dict(lr=1.0, weight_decay=0.0, adjust_lr=None, fraction=k / min(shape),
                                         coefficients=schedule, ef_decay=0.5), "float32")
    checked = [r for r in dion2_rows if r.check == "dion2_selection" or r.detail.endswith("momentum")]
    assert len(checked) == 2 and all(r.passed for r in checked), checked


def _no_restart_kernel(sub, table, *, safety, eps, compute_dtype, precision=None, gram=None, workspace=None):
    """A planted Dion2 kernel: our float16 Gram iteration with its restarts left out."""
    beta = power_of_two_scale(sub)
    x = frobenius_normalize_((sub / beta).to(compute_dtype), beta, safety, eps, "add")
    return gram_iterate(x, table, tall=sub.shape[-2] > sub.shape[-1], restarts=())


@pytest.mark.parametrize("shape, k, flat", [((16, 96), 4, True), ((64, 16), 8, False)])
def test_a_planted_kernel_without_restarts_is_caught(monkeypatch, shape, k, flat):
    """The same check on the same input fails once the restarts are left out (you6: 6–41× measured)."""
    g, selected, rows = _planted_gradient(*shape, k, np.random.default_rng(7), flat)
    p, _ = _one_step(g, k, dtype=torch.float16, gram=True, coefficients="you6")
    assert all(r.passed for r in _judge_gram_float16(g, selected, rows, p, "you6"))
    monkeypatch.setattr(dion2_math, "orthogonalize_selected", _no_restart_kernel)
    p, _ = _one_step(g, k, dtype=torch.float16, gram=True, coefficients="you6")
    judged = _judge_gram_float16(g, selected, rows, p, "you6")
    assert any(not r.passed and r.error > 2 * r.tolerance for r in judged), judged


@settings(deadline=None, max_examples=12)
@given(shape=SHAPES, fraction=st.sampled_from([0.125, 0.25, 0.5, 1.0]), gram=st.sampled_from([True, None]),
       schedule=st.sampled_from(["polar_express", "cesista5"]), seed=st.integers(0, 2**31))
def test_float32_gram_step_passes_the_dion2_judge(shape, fraction, gram, schedule, seed):
    """Every row of the Dion2 judge (selection, weight, momentum) for a float32 step with Gram
    Newton–Schulz forced (True) or automatic (None: Gram from aspect ratio 2)."""
    rng = np.random.default_rng(seed)
    w0, m0, g = 0.02 * rng.standard_normal(shape), rng.standard_normal(shape), rng.standard_normal(shape)
    options = dict(lr=0.05, fraction=fraction, coefficients=schedule)
    p = torch.nn.Parameter(torch.tensor(w0, dtype=torch.float32))
    opt = ortho_fast.Dion2([p], dtype=torch.float32, gram=gram, **options)
    opt.state[p]["momentum"] = torch.tensor(m0, dtype=torch.float32)
    p.grad = torch.tensor(g, dtype=torch.float32)
    w_held, m_held, g_held = (t.double().numpy() for t in (p.detach(), opt.state[p]["momentum"], p.grad))
    opt.step()
    rows = compare_dion2_step("drawn", "float32 gram", w_held, g_held, m_held, p.detach().double().numpy(),
                              opt.state[p]["momentum"].double().numpy(), options, "float32")
    assert rows and all(r.passed for r in rows), [r for r in rows if not r.passed]


def _updates(shape, **options) -> torch.Tensor:
    """W₁ = −O_S from zero weights (float64 parameters for float64 compute: no rounding to float32)."""
    gen = torch.Generator().manual_seed(3)
    param_dtype = torch.float64 if options.get("dtype") is torch.float64 else torch.float32
    p = torch.nn.Parameter(torch.zeros(shape, dtype=param_dtype))
    opt = ortho_fast.Dion2([p], lr=1.0, weight_decay=0.0, adjust_lr=None, fraction=0.25, **options)
    p.grad = torch.randn(shape, generator=gen, dtype=param_dtype)
    opt.step()
    return p.detach().clone()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_gram_option_chooses_the_kernel(dtype):
    """gram=True takes the Gram kernel (not the plain steps); None takes it in float32 / float64 on the
    selected (k, n) submatrix from aspect ratio 2 (here 4 × 64) and never in float16; the default
    bfloat16 step is unchanged by gram=None."""
    gram, plain, auto = (_updates((16, 64), dtype=dtype, gram=v) for v in (True, False, None))
    assert not torch.equal(gram, plain)
    assert torch.equal(auto, gram if dtype in (torch.float32, torch.float64) else plain)
    square = [_updates((4, 4), dtype=dtype, gram=v) for v in (False, None)]  # k = 1 of 4 rows: aspect 4
    assert torch.equal(square[1], _updates((4, 4), dtype=dtype, gram=dtype != torch.float16))
    assert torch.equal(_updates((16, 64)), _updates((16, 64), gram=False))


@pytest.mark.parametrize("kw, error, match", [
    (dict(gram=True), ValueError, "^gram: .*float16, float32 or float64"),
    (dict(gram=True, dtype="medium"), ValueError, "^gram: .*float16, float32 or float64"),
    (dict(gram=True, dtype="high"), ValueError, "^gram: .*TF32"),
    (dict(gram=True, dtype=None), ValueError, "^gram: .*torch.float16"),
    (dict(gram="float16", dtype=torch.float16), TypeError, "^gram: "),
    (dict(gram=1, dtype=torch.float32), TypeError, "^gram: "),
])
def test_bad_gram_settings_name_the_key_and_change_nothing(kw, error, match):
    """Muon's errors, at construction, add_param_group, load_state_dict and before a step."""
    with pytest.raises(error, match=match):
        ortho_fast.Dion2([torch.nn.Parameter(torch.randn(8, 32))], **kw)
    with pytest.raises(error, match=match.replace("^", r"^param group 0 \(dion2\): ")):
        ortho_fast.HybridOptimizer([{"params": [torch.nn.Parameter(torch.randn(8, 32))], "algorithm": "dion2", **kw}])
    p = torch.nn.Parameter(torch.randn(8, 32))
    opt = ortho_fast.Dion2([p], dtype=torch.float32, gram=True)
    p.grad = torch.randn(8, 32)
    opt.step()
    before = (p.detach().clone(), copy.deepcopy(opt.state_dict()))
    full = {"dtype": torch.bfloat16, **kw}  # the Dion2 default dtype where kw gives none
    with pytest.raises(error, match=match):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.randn(4, 4))], **full})
    assert len(opt.param_groups) == 1
    saved = copy.deepcopy(before[1])
    saved["param_groups"][0].update(full)
    with pytest.raises(error, match=match):
        opt.load_state_dict(saved)
    kept = {key: opt.param_groups[0][key] for key in full}
    opt.param_groups[0].update(full)  # an option edited between steps
    with pytest.raises(error, match=match):
        opt.step()
    opt.param_groups[0].update(kept)
    after = opt.state_dict()
    assert torch.equal(p.detach(), before[0]) and after["param_groups"] == before[1]["param_groups"]
    assert torch.equal(after["state"][0]["momentum"], before[1]["state"][0]["momentum"])


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_state_dict_round_trips_gram(dtype):
    gen = torch.Generator().manual_seed(5)
    params = [torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in ((8, 40), (40, 8))]
    opt = ortho_fast.Dion2(params, lr=0.05, dtype=dtype, gram=True)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    opt.step()
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    again = ortho_fast.Dion2(copies, lr=0.05)  # built with the defaults: gram None, bfloat16
    again.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert again.param_groups[0]["gram"] is True and again.param_groups[0]["dtype"] is dtype
    for ps, o in ((params, opt), (copies, again)):
        g2 = torch.Generator().manual_seed(6)
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g2)
        o.step()
    assert all(torch.equal(a, b) for a, b in zip(params, copies))


def _gpt_like(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 64, bias=False), torch.nn.Linear(64, 16, bias=True))


def test_hybrid_and_param_groups_take_gram_per_group():
    """A "dion2" group with gram=True in float16 steps bitwise as Dion2 with the same options; param_groups'
    matrix_options and overrides set it per group; a Dion group rejects it (Dion has no Newton–Schulz)."""
    a, b = _gpt_like(0), _gpt_like(0)
    options = dict(lr=0.02, dtype=torch.float16, gram=True)
    groups = ortho_fast.param_groups(a, algorithm="dion2", lr=0.02, matrix_options=dict(dtype=torch.float16, gram=True))
    matrix = [g for g in groups if g["algorithm"] == "dion2"]
    assert len(matrix) == 1 and matrix[0]["gram"] is True
    hybrid = ortho_fast.HybridOptimizer(groups)
    alone = ortho_fast.Dion2([b[0].weight, b[1].weight], weight_decay=0.01, **options)
    for step in range(2):
        gen = torch.Generator().manual_seed(step)
        for pa, pb in zip(a.parameters(), b.parameters()):
            pa.grad = torch.randn(pa.shape, generator=gen)
            pb.grad = pa.grad.clone()
        hybrid.step(), alone.step()
    assert torch.equal(a[0].weight, b[0].weight) and torch.equal(a[1].weight, b[1].weight)
    split = ortho_fast.param_groups(a, algorithm="dion2", overrides=[("0.weight", {"gram": False})])
    assert sorted(str(g.get("gram", "unset")) for g in split if g["algorithm"] == "dion2") == ["False", "unset"]
    with pytest.raises(ValueError, match=r"^param group 0 \(dion\): gram: an option of .*dion2.*not of dion"):
        ortho_fast.HybridOptimizer([{"params": [torch.nn.Parameter(torch.randn(8, 8))], "algorithm": "dion",
                                     "gram": True}])


def test_a_checkpoint_without_gram_loads_with_the_current_groups_gram():
    """A Dion2 state dict written before the option existed (no "gram" key) loads: the group keeps the
    current group's gram (None for a default-built optimizer), as a Muon state dict does."""
    p = torch.nn.Parameter(torch.randn(8, 32))
    opt = ortho_fast.Dion2([p])
    p.grad = torch.randn(8, 32)
    opt.step()
    saved = copy.deepcopy(opt.state_dict())
    del saved["param_groups"][0]["gram"]
    q = torch.nn.Parameter(p.detach().clone())
    again = ortho_fast.Dion2([q])
    again.load_state_dict(saved)
    assert again.param_groups[0]["gram"] is None
    assert torch.equal(again.state[q]["momentum"], opt.state[p]["momentum"])
