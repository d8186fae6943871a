"""Tests for ortho_fast.Muon's options: every option against the float64 oracle
(ortho_ref.muon_step composed per matrix: splits per block, experts per expert, conv weights
flattened), parameter banks, the param-group contract, torch.optim.Muon checkpoints,
state_dict round trips, determinism and the error contract.

Tolerances come from verify.tolerances; bitwise equality is asserted where the same torch
operations run in the same order.
"""

from __future__ import annotations

import copy
import inspect
import math
import zlib
from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_ref
from ortho_fast import (
    MUON_DEFAULTS,
    Muon,
    adjusted_lr_scale,
    check_muon_step,
    is_expert_name,
    muon_group_step,
    muon_layout,
    newton_schulz,
    normalize_muon_group,
)
from ortho_fast.muon import ADJUST_LR_MODES
from verify import tolerances as tol


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


# =======================================================================================
# The oracle, composed per matrix
# =======================================================================================

#: Options of one float64 comparison (Muon keyword -> value); ``dtype`` is always float64.
BASE = dict(lr=0.02, weight_decay=0.1, momentum=0.9, nesterov=True, momentum_style="ema", coefficients="jordan",
            eps_mode="add", adjust_lr="original", extra_scale_factor=1.0, cautious_weight_decay=False)


def _reference(w, g, m, opts, dtype: str = "float64"):
    """ortho_ref.muon_step on one matrix, with the tolerances of verify.tolerances for a fast
    step computed in ``dtype`` (float32 / float64)."""
    sched = ortho_ref.SCHEDULES[opts["coefficients"]]
    table = ortho_ref.schedule(opts["coefficients"])
    ref = ortho_ref.muon_step(
        w, g, m, lr=opts["lr"], mu=opts["momentum"], nesterov=opts["nesterov"], momentum_style=opts["momentum_style"],
        coefficients=table, safety=sched.safety, eps=sched.eps, eps_mode=opts["eps_mode"], adjust_lr=opts["adjust_lr"],
        weight_decay=opts["weight_decay"], extra_scale_factor=opts["extra_scale_factor"],
        cautious_weight_decay=opts["cautious_weight_decay"],
    )
    sigma_hat = ortho_ref.normalized_singular_values(ref.ns_input, safety=sched.safety, eps=sched.eps,
                                                     eps_mode=opts["eps_mode"])
    ns_tol = tol.ns_tolerance(sigma_hat, table, w.shape, dtype)
    w_tol = tol.muon_tolerance(ns_tol, ref.lr_scale, opts["lr"], float(np.linalg.norm(w)),
                               float(np.linalg.norm(ref.update)), dtype)
    if opts["cautious_weight_decay"]:
        w_tol += tol.cautious_weight_decay_tolerance(w, ref.update, ns_tol, opts["lr"], opts["weight_decay"])
    m_tol = tol.momentum_tolerance(float(np.linalg.norm(g)), float(np.linalg.norm(m)), dtype)
    return ref, w_tol, m_tol


def _check_against_reference(w_new, m_new, w0, g, m0, matrices, opts) -> None:
    """Every matrix of a parameter against the oracle. ``w_new`` etc. are numpy arrays in the
    parameter's *matrix view* ((m, n) or (E, m, n)); ``matrices`` index that view, one matrix
    each, and must cover every entry exactly once."""
    cover = np.zeros(w0.shape, dtype=int)
    for idx in matrices:
        cover[idx] += 1
        ref, w_tol, m_tol = _reference(w0[idx], g[idx], m0[idx], opts)
        w_err = np.linalg.norm(w_new[idx] - ref.weight)
        m_err = np.linalg.norm(m_new[idx] - ref.momentum)
        assert w_err <= w_tol, f"{opts} {w0[idx].shape}: weight error {w_err:.3e} > {w_tol:.3e}"
        assert m_err <= m_tol, f"momentum error {m_err:.3e} > {m_tol:.3e}"
    assert np.all(cover == 1), "the matrices must partition the parameter"


def _run_one_step(shapes, opts, rng, *, view_shapes=None, names=None, group_extra=None, **muon_kw):
    """One float64 Muon step with a nonzero momentum buffer; returns per parameter
    (w_new, m_new, w0, g, m0) as numpy arrays reshaped to ``view_shapes``."""
    w0 = [0.02 * rng.standard_normal(s) for s in shapes]
    g = [rng.standard_normal(s) for s in shapes]
    m0 = [0.5 * rng.standard_normal(s) for s in shapes]
    ps = [torch.nn.Parameter(torch.tensor(w)) for w in w0]
    params = list(zip(names, ps)) if names else ps
    group = [{"params": params, **(group_extra or {})}]
    opt = Muon(group, dtype=torch.float64, **opts, **muon_kw)
    for p, m, gg in zip(ps, m0, g):
        opt.state[p]["momentum_buffer"] = torch.tensor(m)
        p.grad = torch.tensor(gg)
    opt.step()
    view_shapes = view_shapes or shapes
    return [tuple(a.reshape(vs) for a in (p.detach().numpy(), opt.state[p]["momentum_buffer"].numpy(), w, gg, m))
            for p, w, gg, m, vs in zip(ps, w0, g, m0, view_shapes)]


ROWS = (slice(None),)


def _run(ps, opt, grads) -> None:
    """One optimizer step per entry of ``grads`` (a list of per-parameter gradients)."""
    for gs in grads:
        for p, g in zip(ps, gs):
            p.grad = g.clone()
        opt.step()


# =======================================================================================
# Every option in float64 against the oracle
# =======================================================================================


@pytest.mark.parametrize("adjust_lr", ADJUST_LR_MODES)
@pytest.mark.parametrize("extra_scale_factor", [1.0, 0.2])
@pytest.mark.parametrize("cautious", [False, True])
def test_lr_modes_extra_scale_and_cautious_decay_match_reference(adjust_lr, extra_scale_factor, cautious):
    opts = {**BASE, "adjust_lr": adjust_lr, "extra_scale_factor": extra_scale_factor, "cautious_weight_decay": cautious}
    rng = _rng("modes", adjust_lr, extra_scale_factor, cautious)
    for w_new, m_new, w0, g, m0 in _run_one_step([(24, 16), (16, 24), (20, 20)], opts, rng):
        _check_against_reference(w_new, m_new, w0, g, m0, [ROWS], opts)


@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(1, 24), n=st.integers(1, 24),
    style=st.sampled_from(["ema", "classic"]), nesterov=st.booleans(),
    adjust_lr=st.sampled_from(ADJUST_LR_MODES), extra=st.floats(0.05, 5.0),
    cautious=st.booleans(), coefficients=st.sampled_from(sorted(ortho_ref.SCHEDULES)),
    eps_mode=st.sampled_from(["add", "clamp"]), wd=st.sampled_from([0.0, 0.1, 2.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_options_property_against_reference(m, n, style, nesterov, adjust_lr, extra, cautious, coefficients,
                                            eps_mode, wd, seed):
    opts = dict(lr=0.03, weight_decay=wd, momentum=0.9, nesterov=nesterov, momentum_style=style,
                coefficients=coefficients, eps_mode=eps_mode, adjust_lr=adjust_lr, extra_scale_factor=extra,
                cautious_weight_decay=cautious)
    (out,) = _run_one_step([(m, n)], opts, np.random.default_rng(seed))
    _check_against_reference(*out, [ROWS], opts)


def test_adjusted_lr_scale_equals_oracle_transcription():
    """The two independent transcriptions of the lr modes give the same floats."""
    for mode in ADJUST_LR_MODES:
        for m, n in ((8, 2), (2, 8), (5, 5), (768, 3072)):
            assert adjusted_lr_scale(mode, m, n) == ortho_ref.lr_scale(mode, m, n), (mode, m, n)
    assert adjusted_lr_scale("spectral", 4, 16) == 4.0  # Megatron "spectral" is √max(m, n) ...
    assert adjusted_lr_scale("spectral_norm", 4, 16) == 0.5  # ... dion's "spectral_norm" is √(m/n)


def test_megatron_spectral_times_point_two_is_match_rms_adamw_bitwise():
    rng = _rng("spectral-0.2")
    w0, g = 0.02 * rng.standard_normal((12, 20)), rng.standard_normal((12, 20))

    def run(**kw):
        p = torch.nn.Parameter(torch.tensor(w0, dtype=torch.float32))
        p.grad = torch.tensor(g, dtype=torch.float32)
        Muon([p], lr=0.02, **kw).step()
        return p.detach()

    assert torch.equal(run(adjust_lr="spectral", extra_scale_factor=0.2), run(adjust_lr="match_rms_adamw"))
    assert not torch.equal(run(adjust_lr="spectral"), run(adjust_lr="match_rms_adamw"))


# =======================================================================================
# Cautious weight decay: the convention, pinned
# =======================================================================================


def test_cautious_decay_mask_convention():
    """Decay exactly where sign(O)·sign(W) >= 0, with O the orthogonalized update and W the
    weight before the step (Chen et al. 2025, I(u⊙x >= 0)). A zero gradient row gives an
    exactly zero row of O, which the >= decays (a strict > would not).
    Compared bitwise with the formula evaluated by torch on the same O."""
    rng = _rng("cwd")
    w0 = torch.tensor(0.05 * rng.standard_normal((10, 14)), dtype=torch.float32)
    g = torch.tensor(rng.standard_normal((10, 14)), dtype=torch.float32)
    g[2] = 0.0
    lr, wd = 0.1, 0.5
    p = torch.nn.Parameter(w0.clone())
    p.grad = g.clone()
    Muon([p], lr=lr, weight_decay=wd, momentum=0.0, nesterov=False, cautious_weight_decay=True).step()
    o = newton_schulz(g, dtype=torch.bfloat16)  # momentum 0, no nesterov: U = G
    mask = o.sign() * w0.sign() >= 0
    expected = torch.where(mask, w0 * (1 - lr * wd), w0)
    expected.add_(o, alpha=-lr * adjusted_lr_scale("original", 10, 14))
    assert torch.equal(p.detach(), expected)
    assert 0 < int(mask.sum()) < mask.numel()  # both kinds of entries occur: the test can fail
    assert not o[2].any() and torch.equal(p.detach()[2], w0[2] * (1 - lr * wd))
    decoupled = torch.nn.Parameter(w0.clone())
    decoupled.grad = g.clone()
    Muon([decoupled], lr=lr, weight_decay=wd, momentum=0.0, nesterov=False).step()
    assert not torch.equal(decoupled.detach(), p.detach())


def test_oracle_cautious_decay_on_a_known_update():
    """The oracle's own convention on a case solved by hand: U = G = 3·I gives the polar factor
    O = I exactly; W's (0, 0) entry opposes O (no decay), the off-diagonal O entries are 0
    (decayed, the >=), (1, 1) agrees (decayed)."""
    w = np.array([[-0.5, 0.25], [0.5, 0.75]])
    lr, wd, extra = 0.1, 0.5, 0.2
    out = ortho_ref.muon_step(w, 3.0 * np.eye(2), np.zeros((2, 2)), lr=lr, mu=0.0, nesterov=False,
                              orthogonalizer="polar", weight_decay=wd, adjust_lr="spectral",
                              extra_scale_factor=extra, cautious_weight_decay=True)
    assert np.array_equal(out.update, np.eye(2))
    assert out.lr_scale == math.sqrt(2) * extra
    decayed = w * (1 - lr * wd)
    expected = np.array([[w[0, 0], decayed[0, 1]], [decayed[1, 0], decayed[1, 1]]]) - lr * out.lr_scale * np.eye(2)
    assert np.array_equal(out.weight, expected)


# =======================================================================================
# Layouts: conv flattening, experts, fused projections
# =======================================================================================


@pytest.mark.parametrize("shape", [(8, 3, 3, 3), (6, 4, 5), (4, 10, 1, 1)])
def test_conv_weights_flattened_match_reference(shape):
    opts = {**BASE, "adjust_lr": "spectral_norm", "cautious_weight_decay": True}
    flat = (shape[0], math.prod(shape[1:]))
    (out,) = _run_one_step([shape], opts, _rng("conv", shape), view_shapes=[flat])
    _check_against_reference(*out, [ROWS], opts)


def test_channels_last_conv_weight_same_bits_as_contiguous():
    rng = _rng("channels-last")
    w0 = torch.tensor(0.02 * rng.standard_normal((8, 3, 3, 3)), dtype=torch.float32)
    g = torch.tensor(rng.standard_normal((8, 3, 3, 3)), dtype=torch.float32)
    results = []
    for fmt in (torch.contiguous_format, torch.channels_last):
        p = torch.nn.Parameter(w0.clone().to(memory_format=fmt))
        opt = Muon([p], lr=0.02)
        for _ in range(2):
            p.grad = g.clone().to(memory_format=fmt)
            opt.step()
        assert p.is_contiguous(memory_format=fmt)
        results.append(p.detach().contiguous())
    assert torch.equal(*results)


def test_experts_match_per_expert_reference():
    """(E, m, n) and (E, m, k, l) expert weights matched by name (also under torch.compile's
    ``_orig_mod``) are orthogonalized per expert; ``shared_experts`` is not an expert key match."""
    opts = {**BASE, "adjust_lr": "match_rms_adamw"}
    names = ["_orig_mod.layers.0.mlp.experts.w1", "layers.0.mlp.experts.w2", "layers.0.mlp.shared_experts.w1"]
    shapes = [(3, 8, 12), (2, 6, 4, 2), (8, 12)]
    views = [(3, 8, 12), (2, 6, 8), (8, 12)]
    outs = _run_one_step(shapes, opts, _rng("experts"), view_shapes=views, names=names, expert_keys=("experts",))
    for out, (e, *_) in zip(outs[:2], shapes):
        _check_against_reference(*out, [(i,) for i in range(e)], opts)
    _check_against_reference(*outs[2], [ROWS], opts)


def test_expert_name_matching():
    assert is_expert_name("model.layers.3.mlp.experts.gate_up_proj", ["experts"])
    assert is_expert_name("_orig_mod.layers.3._checkpoint_wrapped_module.mlp.experts.w", ["mlp.experts"])
    assert not is_expert_name("model.layers.3.mlp.shared_experts.w", ["experts"])
    assert not is_expert_name("model.layers.3.mlp.w", ["experts"])


def _split_rows(sizes, groups=1, heads=None):
    """Row-index arrays of each matrix, built directly from the definition (not muon_layout):
    block j of each of ``groups`` repetitions gathered group-major, then cut into heads."""
    per, out = sum(sizes), []
    for j, s in enumerate(sizes):
        off = sum(sizes[:j])
        rows = np.concatenate([r * per + off + np.arange(s) for r in range(groups)])
        h = 1 if heads is None else (heads if isinstance(heads, int) else heads[j])
        out += [(rows[i * len(rows) // h:(i + 1) * len(rows) // h],) for i in range(h)]
    return out


SPLITS = [
    dict(split_sizes=(8, 4, 4)),  # fused QKV with GQA: q, k, v blocks
    dict(split_sizes=(8, 4, 4), num_heads=(4, 2, 2)),  # ... per head (head dim 2)
    dict(split_sizes=(6, 6, 6), num_heads=3),  # MHA, one int for every block
    dict(split_sizes=(4, 2, 2), split_groups=2),  # Megatron split_qkv: 2 query groups
    dict(split_sizes=(4, 2, 2), split_groups=2, num_heads=(4, 2, 2)),  # ... per head
    dict(split_sizes=(10, 6)),  # fused gate/up projection
]


@pytest.mark.parametrize("split", SPLITS, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_splits_match_per_block_reference(split):
    opts = {**BASE, "adjust_lr": "spectral", "cautious_weight_decay": True}
    rows = sum(split["split_sizes"]) * split.get("split_groups", 1)
    (out,) = _run_one_step([(rows, 12)], opts, _rng("split", repr(split)), group_extra=split)
    matrices = _split_rows(split["split_sizes"], split.get("split_groups", 1), split.get("num_heads"))
    _check_against_reference(*out, matrices, opts)


@st.composite
def split_layouts(draw):
    """(split_sizes, split_groups, num_heads per block, experts or 0): heads divide each
    gathered block."""
    sizes = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    groups = draw(st.integers(1, 3))
    heads = tuple(draw(st.sampled_from([h for h in range(1, groups * s + 1) if (groups * s) % h == 0])) for s in sizes)
    return sizes, groups, heads, draw(st.sampled_from([0, 2]))


@settings(max_examples=25, deadline=None)
@given(layout=split_layouts(), n=st.integers(1, 10), cautious=st.booleans(),
       adjust_lr=st.sampled_from(ADJUST_LR_MODES), seed=st.integers(0, 2**32 - 1))
def test_split_layouts_property_against_per_block_reference(layout, n, cautious, adjust_lr, seed):
    """Random block sizes, repetitions (Megatron groups), heads and expert stacks: every
    per-head matrix against the oracle, with its own lr scale."""
    sizes, groups, heads, experts = layout
    opts = {**BASE, "adjust_lr": adjust_lr, "cautious_weight_decay": cautious}
    m = groups * sum(sizes)
    shape = (experts, m, n) if experts else (m, n)
    kw = dict(names=["experts.w"], expert_keys=("experts",)) if experts else {}
    (out,) = _run_one_step([shape], opts, np.random.default_rng(seed), split_sizes=sizes, split_groups=groups,
                           num_heads=heads, **kw)
    blocks = _split_rows(sizes, groups, heads)
    matrices = [(e, rows) for e in range(experts) for (rows,) in blocks] if experts else blocks
    _check_against_reference(*out, matrices, opts)


def test_split_expert_weights_per_expert_and_block():
    """split_sizes on (E, 2·f, d) expert weights (fused gate/up) split every expert's rows."""
    opts = dict(BASE)
    (out,) = _run_one_step([(3, 10, 6)], opts, _rng("split-experts"), names=["experts.w13"],
                           expert_keys=("experts",), split_sizes=(5, 5))
    matrices = [(e, rows) for e in range(3) for (rows,) in _split_rows((5, 5))]
    _check_against_reference(*out, matrices, opts)


# =======================================================================================
# Parameter banks
# =======================================================================================


BANK_SHAPES = [(12, 20), (12, 20), (20, 12), (3, 12, 20), (9, 7)]
BANK_NAMES = ["a.w", "b.w", "c.w", "experts.w", "d.w"]


def _bank_run(banks: bool, dtype: torch.dtype):
    """One step (zero initial momentum) on five parameters; returns (params, optimizer, w0, grads)."""
    rng = _rng("banks", dtype)
    w0 = [torch.tensor(0.02 * rng.standard_normal(s), dtype=dtype) for s in BANK_SHAPES]
    grads = [torch.tensor(rng.standard_normal(s), dtype=dtype) for s in BANK_SHAPES]
    ps = [torch.nn.Parameter(w.clone()) for w in w0]
    opt = Muon(list(zip(BANK_NAMES, ps)), lr=0.02, banks=banks, dtype=dtype, expert_keys=("experts",))
    _run(ps, opt, [grads])
    return ps, opt, w0, grads


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_banks_equal_unbanked(dtype):
    """Banks stack the 12 x 20 matrices (two 2-D parameters and three experts) into one batched
    call; the 20 x 12 one is its own bank, the lone 9 x 7 keeps its own call. Momentum is
    elementwise: bitwise equal. The weights are not bitwise (bmm vs addmm, measured: float32
    differs in the last bits): each side is within muon_tolerance of the oracle, so the two
    are within twice it of each other (triangle inequality). The lone member: bitwise."""
    (pa, oa, w0, grads), (pb, ob, _, _) = _bank_run(False, dtype), _bank_run(True, dtype)
    name = str(dtype).replace("torch.", "")
    opts = {**BASE, "weight_decay": 0.1, "momentum": 0.95}
    for a, b, w, g in zip(pa, pb, w0, grads):
        assert torch.equal(oa.state[a]["momentum_buffer"], ob.state[b]["momentum_buffer"])
        mats = zip(*(t.detach().double().numpy().reshape(-1, *a.shape[-2:]) for t in (a, b, w, g)))
        for wa, wb, wi, gi in mats:
            ref, w_tol, _ = _reference(wi, gi, np.zeros_like(gi), opts, name)
            assert np.linalg.norm(wa - ref.weight) <= w_tol and np.linalg.norm(wb - ref.weight) <= w_tol
            assert np.linalg.norm(wa - wb) <= 2 * w_tol
    assert torch.equal(pa[4], pb[4])


def test_banks_lone_members_bitwise_and_parity_unaffected():
    """With every shape distinct, banks change nothing (each member keeps its 2-D call)."""
    rng = _rng("lone")
    shapes = [(8, 12), (12, 8), (10, 10)]
    w0 = [torch.tensor(0.02 * rng.standard_normal(s), dtype=torch.float32) for s in shapes]
    runs = []
    for banks in (False, True):
        ps = [torch.nn.Parameter(w.clone()) for w in w0]
        opt = Muon(ps, lr=0.02, banks=banks, eps_mode="clamp")
        for p in ps:
            p.grad = torch.ones_like(p) + p.detach()
        opt.step()
        runs.append(ps)
    assert all(torch.equal(a, b) for a, b in zip(*runs))


# =======================================================================================
# torch.optim.Muon: parity with many equal shapes, and its checkpoints
# =======================================================================================


def test_torch_parity_with_equal_shapes_and_torch_checkpoint():
    """Defaults (banks off) with several 16 x 24 parameters stay bitwise equal to torch; a
    torch.optim.Muon state_dict loads (Muon keys it lacks come from the current groups, its
    lr replaces ours) and the next steps stay bitwise equal to torch's uninterrupted run."""
    rng = _rng("torch-ckpt")
    w0 = [torch.tensor(0.02 * rng.standard_normal((16, 24)), dtype=torch.float32) for _ in range(3)]
    grads = [[torch.tensor(rng.standard_normal((16, 24)), dtype=torch.float32) for _ in w0] for _ in range(4)]
    ps_ref, ps_fast, ps_t = ([torch.nn.Parameter(w.clone()) for w in w0] for _ in range(3))
    _run(ps_ref, torch.optim.Muon(ps_ref, lr=0.02), grads)
    _run(ps_fast, Muon(ps_fast, lr=0.02, eps_mode="clamp"), grads)
    assert all(torch.equal(a, b) for a, b in zip(ps_ref, ps_fast))
    o_t = torch.optim.Muon(ps_t, lr=0.02)
    _run(ps_t, o_t, grads[:2])
    ps_load = [torch.nn.Parameter(p.detach().clone()) for p in ps_t]
    o_load = Muon(ps_load, lr=0.5, eps_mode="clamp")
    o_load.load_state_dict(copy.deepcopy(o_t.state_dict()))
    assert o_load.param_groups[0]["lr"] == 0.02 and o_load.param_groups[0]["coefficients"] == "jordan"
    _run(ps_load, o_load, grads[2:])
    assert all(torch.equal(a, b) for a, b in zip(ps_ref, ps_load))


# =======================================================================================
# The param-group contract
# =======================================================================================


def test_defaults_are_the_constructor_defaults_and_group_functions_drive_muon():
    sig = inspect.signature(Muon.__init__)
    assert {k: sig.parameters[k].default for k in MUON_DEFAULTS} == MUON_DEFAULTS
    rng = _rng("contract")
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

LAYOUT_SHAPES = [(4, 8, 6), (18, 6), (18, 6), (8, 3, 3, 3), (6, 10)]
LAYOUT_NAMES = ["moe.experts.w1", "attn0.qkv.weight", "attn1.qkv.weight", "conv.weight", "mlp.weight"]


def _layout_optimizer(ps):
    named = list(zip(LAYOUT_NAMES, ps))
    return Muon([{"params": [named[i] for i in (0, 3, 4)]},
                 {"params": [named[1], named[2]], "split_sizes": (6, 6, 6), "num_heads": (3, 3, 3)}],
                lr=0.02, banks=True, expert_keys=("experts",), cautious_weight_decay=True, adjust_lr="spectral",
                extra_scale_factor=0.2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_round_trip_with_banks_experts_splits(dtype):
    rng = _rng("rt", dtype)
    w0 = [torch.tensor(0.02 * rng.standard_normal(s), dtype=dtype) for s in LAYOUT_SHAPES]
    grads = [[torch.tensor(rng.standard_normal(s), dtype=dtype) for s in LAYOUT_SHAPES] for _ in range(4)]
    pa = [torch.nn.Parameter(w.clone()) for w in w0]
    oa = _layout_optimizer(pa)
    _run(pa, oa, grads)
    pb = [torch.nn.Parameter(w.clone()) for w in w0]
    ob = _layout_optimizer(pb)
    _run(pb, ob, grads[:2])
    saved = copy.deepcopy(ob.state_dict())
    pc = [torch.nn.Parameter(p.detach().clone()) for p in pb]
    oc = _layout_optimizer(pc)
    oc.load_state_dict(saved)
    _run(pc, oc, grads[2:])
    for a, c in zip(pa, pc):
        assert torch.equal(a, c)
        assert torch.equal(oa.state[a]["momentum_buffer"], oc.state[c]["momentum_buffer"])
    # determinism: the uninterrupted run again gives the same bits
    pd = [torch.nn.Parameter(w.clone()) for w in w0]
    _run(pd, _layout_optimizer(pd), grads)
    assert all(torch.equal(a, d) for a, d in zip(pa, pd))
    assert not torch.equal(pa[0].detach(), w0[0])


# =======================================================================================
# Bad input: clear errors, nothing changed
# =======================================================================================

P2 = [torch.nn.Parameter(torch.ones(6, 4))]


@pytest.mark.parametrize(
    "make, exc, key",
    [
        (lambda: Muon([torch.nn.Parameter(torch.ones(5))]), ValueError, "params"),
        (lambda: Muon([torch.nn.Parameter(torch.ones(()))]), ValueError, "params"),
        (lambda: Muon([torch.nn.Parameter(torch.ones(4, 0))]), ValueError, "params"),
        (lambda: Muon(P2, split_sizes=(2, 3)), ValueError, "split_sizes"),
        (lambda: Muon(P2, split_sizes=(3, 3, 0)), ValueError, "split_sizes"),
        (lambda: Muon(P2, split_sizes=(2, 1), split_groups=3), ValueError, "split_sizes"),
        (lambda: Muon(P2, split_groups=2), ValueError, "split_groups"),
        (lambda: Muon(P2, split_sizes=(3, 3), num_heads=2), ValueError, "num_heads"),
        (lambda: Muon(P2, split_sizes=(3, 3), num_heads=(1, 1, 1)), ValueError, "num_heads"),
        (lambda: Muon(P2, split_sizes=(2, 1), split_groups=2, num_heads=(3, 1)), ValueError, "num_heads"),
        (lambda: Muon(P2, split_sizes=3), TypeError, "split_sizes"),
        (lambda: Muon(P2, expert_keys=("experts",)), ValueError, "expert_keys"),
        (lambda: Muon([("layer.experts.w", P2[0])], expert_keys=("experts",)), ValueError, "expert_keys"),
        (lambda: Muon(P2, expert_keys=(3,)), TypeError, "expert_keys"),
        (lambda: Muon(P2, coefficients="no_such_schedule"), KeyError, "coefficients"),
        (lambda: Muon(P2, coefficients=[[1.0, 2.0]]), ValueError, "coefficients"),
        (lambda: Muon(P2, adjust_lr="spectral_nrom"), ValueError, "adjust_lr"),
        (lambda: Muon(P2, extra_scale_factor=0.0), ValueError, "extra_scale_factor"),
        (lambda: Muon(P2, cautious_weight_decay=1), TypeError, "cautious_weight_decay"),
        (lambda: Muon(P2, banks="yes"), TypeError, "banks"),
        (lambda: Muon(P2, dtype=torch.int32), TypeError, "dtype"),
        (lambda: Muon(P2, dtype="low"), TypeError, "dtype"),
        (lambda: Muon([torch.nn.Parameter(torch.ones(4, 3, dtype=torch.complex64))]), TypeError, "params"),
    ],
)
def test_bad_construction_raises_naming_the_key(make, exc, key):
    with pytest.raises(exc, match=rf"^['\"]?{key}:"):
        make()


def test_rejected_param_group_is_not_added():
    opt = Muon([torch.nn.Parameter(torch.ones(6, 4))])
    with pytest.raises(ValueError, match="^split_sizes:"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(6, 4))], "split_sizes": (5,)})
    assert len(opt.param_groups) == 1


def _layout_params(rng):
    return [torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(s), dtype=torch.float32))
            for s in LAYOUT_SHAPES]


def _clone(v):
    return v.clone() if isinstance(v, torch.Tensor) else v


def _same(a, b) -> bool:
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def _snapshot(ps, opt):
    return [p.detach().clone() for p in ps], {id(p): {k: _clone(v) for k, v in s.items()} for p, s in opt.state.items()}


def _assert_same(ps, opt, snap):
    params, state = snap
    assert all(torch.equal(p.detach(), q) for p, q in zip(ps, params))
    assert {id(p) for p in opt.state} == set(state)
    for p, s in opt.state.items():
        assert set(s) == set(state[id(p)]) and all(_same(v, state[id(p)][k]) for k, v in s.items())


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("where", [0, 2, 4])  # experts, a split QKV weight, a plain weight
def test_nonfinite_grad_with_layouts_changes_nothing(bad, where):
    rng = _rng("nonfinite-layouts")
    ps = _layout_params(rng)
    opt = _layout_optimizer(ps)
    _run(ps, opt, [[torch.randn(p.shape) for p in ps]])
    for p in ps:
        p.grad = torch.randn(p.shape)
    ps[where].grad.view(-1)[3] = bad
    snap = _snapshot(ps, opt)
    with pytest.raises(ValueError, match=r"^grad of '"):
        opt.step()
    _assert_same(ps, opt, snap)


@pytest.mark.parametrize("bad_buffer", [torch.zeros(4, 8), torch.zeros(4, 8, 6, dtype=torch.float64), "buf"])
def test_bad_momentum_buffer_changes_nothing(bad_buffer):
    rng = _rng("bad-buffer")
    ps = _layout_params(rng)
    opt = _layout_optimizer(ps)
    _run(ps, opt, [[torch.randn(p.shape) for p in ps]])
    opt.state[ps[0]]["momentum_buffer"] = bad_buffer
    for p in ps:
        p.grad = torch.randn(p.shape)
    snap = _snapshot(ps, opt)
    with pytest.raises(ValueError, match=r"^momentum_buffer:"):
        opt.step()
    _assert_same(ps, opt, snap)


def test_group_changed_after_construction_is_checked_before_any_change():
    """A split setting edited on a live group (as a scheduler might) is caught by the check
    pass, before the first group steps."""
    rng = _rng("edited")
    ps = _layout_params(rng)
    opt = _layout_optimizer(ps)
    for p in ps:
        p.grad = torch.randn(p.shape)
    opt.param_groups[1]["split_sizes"] = (6, 6, 5)
    snap = _snapshot(ps, opt)
    with pytest.raises(ValueError, match="^split_sizes:"):
        opt.step()
    _assert_same(ps, opt, snap)


def test_muon_layout_shapes():
    lay = muon_layout((3, 8, 6, 2), expert=True, split_sizes=(4, 2, 2), num_heads=(2, 1, 1))
    assert (lay.batch, lay.m, lay.n) == ((3,), 8, 12)
    assert lay.matrix_shapes() == [(3, 2, 2, 12), (3, 2, 12), (3, 2, 12)]
    assert muon_layout((5, 7)).matrix_shapes() == [(5, 7)]  # the 2-D path of torch.optim.Muon


def test_compute_dtype_settings():
    """dtype=None computes in the parameter's dtype; Megatron's "medium" is bfloat16."""
    rng = _rng("compute-dtype")
    w0 = torch.tensor(0.02 * rng.standard_normal((12, 18)))
    g = torch.tensor(rng.standard_normal((12, 18)))

    def run(dtype):
        p = torch.nn.Parameter(w0.clone())
        p.grad = g.clone()
        Muon([p], lr=0.02, dtype=dtype).step()
        return p.detach()

    assert torch.equal(run(None), run(torch.float64))
    assert torch.equal(run("medium"), run(torch.bfloat16))
    assert not torch.equal(run(None), run("medium"))
