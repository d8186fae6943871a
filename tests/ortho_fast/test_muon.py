"""Tests for ortho_fast.Muon's options: every option against the float64 oracle
(ortho_ref.muon_step composed per matrix: splits per block, experts per expert, conv weights
flattened), parameter banks, the param-group contract, torch.optim.Muon checkpoints,
state_dict round trips, determinism and the error contract.

Tolerances come from ortho_verify.tolerances; bitwise equality is asserted where the same torch
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

import ortho_fast
import ortho_ref
from ortho_fast import (
    MUON_DEFAULTS,
    Muon,
    adjusted_lr_scale,
    check_muon_step,
    is_expert_name,
    muon_group_step,
    muon_layout,
    muon_momentum,
    newton_schulz,
    normalize_muon_group,
)
from ortho_fast.muon import ADJUST_LR_MODES
from ortho_verify import tolerances as tol
from tests.round_trip import assert_bitwise_same, round_trip


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


# =======================================================================================
# The oracle, composed per matrix
# =======================================================================================

#: Options of one float64 comparison (Muon keyword -> value); ``dtype`` is always float64.
#: Optional keys: ``ns_steps``, ``safety``, ``eps`` (None or absent: the schedule's), ``eps_mode``
#: (None: the documented default), ``coefficients`` a name or a user table of rows.
BASE = dict(lr=0.02, weight_decay=0.1, momentum=0.9, nesterov=True, momentum_style="ema", coefficients="jordan",
            eps_mode="add", adjust_lr="original", extra_scale_factor=1.0, cautious_weight_decay=False)


def _normalization(opts):
    """(table, safety, eps, eps_mode) the oracle runs for ``opts``, from the oracle's own
    transcription and the documented rules (written here, not taken from ortho_fast):
    a named schedule's rows (``ortho_ref.schedule``) and normalization, a user table's rows with
    its last row repeated past its end, safety 1 / eps 1e-7 for tables, eps_mode "clamp" for
    "jordan" (torch.optim.Muon) and "add" otherwise."""
    coefficients, steps = opts["coefficients"], opts.get("ns_steps")
    if isinstance(coefficients, str):
        sched = ortho_ref.SCHEDULES[coefficients]
        table, safety, eps = ortho_ref.schedule(coefficients, steps), sched.safety, sched.eps
    else:
        rows = [tuple(r) for r in coefficients]
        t = len(rows) if steps is None else steps
        table, safety, eps = np.array(rows[:t] + rows[-1:] * max(0, t - len(rows))), 1.0, 1e-7
    safety = safety if opts.get("safety") is None else opts["safety"]
    eps = eps if opts.get("eps") is None else opts["eps"]
    eps_mode = opts.get("eps_mode") or ("clamp" if coefficients == "jordan" else "add")
    return table, safety, eps, eps_mode


def _reference(w, g, m, opts, dtype: str = "float64"):
    """ortho_ref.muon_step on one matrix, with the tolerances of ortho_verify.tolerances for a fast
    step computed in ``dtype`` (float32 / float64)."""
    table, safety, eps, eps_mode = _normalization(opts)
    ref = ortho_ref.muon_step(
        w, g, m, lr=opts["lr"], mu=opts["momentum"], nesterov=opts["nesterov"], momentum_style=opts["momentum_style"],
        coefficients=table, safety=safety, eps=eps, eps_mode=eps_mode, adjust_lr=opts["adjust_lr"],
        weight_decay=opts["weight_decay"], extra_scale_factor=opts["extra_scale_factor"],
        cautious_weight_decay=opts["cautious_weight_decay"],
    )
    sigma_hat = ortho_ref.normalized_singular_values(ref.ns_input, safety=safety, eps=eps, eps_mode=eps_mode)
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


@settings(deadline=None)
@given(
    m=st.integers(1, 24), n=st.integers(1, 24),
    style=st.sampled_from(["ema", "classic"]), nesterov=st.booleans(),
    adjust_lr=st.sampled_from(ADJUST_LR_MODES), extra=st.floats(0.05, 5.0),
    cautious=st.booleans(), coefficients=st.sampled_from(sorted(ortho_ref.SCHEDULES)),
    eps_mode=st.sampled_from([None, "add", "clamp"]), wd=st.sampled_from([0.0, 0.1, 2.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_options_property_against_reference(m, n, style, nesterov, adjust_lr, extra, cautious, coefficients,
                                            eps_mode, wd, seed):
    opts = dict(lr=0.03, weight_decay=wd, momentum=0.9, nesterov=nesterov, momentum_style=style,
                coefficients=coefficients, eps_mode=eps_mode, adjust_lr=adjust_lr, extra_scale_factor=extra,
                cautious_weight_decay=cautious)
    (out,) = _run_one_step([(m, n)], opts, np.random.default_rng(seed))
    _check_against_reference(*out, [ROWS], opts)


#: A user table (not in the registry) of two rows: X <- aX + (bA + cA²)X.
USER_ROWS = [(3.0, -3.2, 1.2), (2.0, -1.5, 0.5)]


#: (options, the options a fast side that ignored them would run instead).
NORMALIZATION_CASES = [
    (dict(safety=1.3), {}), (dict(eps=0.5), {}), (dict(eps=0.5, eps_mode="clamp"), dict(eps=0.5)),
    (dict(eps=0.0), {}), (dict(ns_steps=3), {}),
    (dict(coefficients="polar_express_paper", ns_steps=8), dict(coefficients="polar_express_paper")),
    (dict(coefficients="you6"), dict(coefficients="you6", ns_steps=5)),
    (dict(coefficients="polar_express", safety=1.0, eps=1e-7), dict(coefficients="polar_express")),
    (dict(coefficients=USER_ROWS), {}),
    (dict(coefficients=USER_ROWS, ns_steps=4, eps_mode=None),
     dict(coefficients=USER_ROWS, ns_steps=4, eps_mode="clamp")),
    (dict(coefficients="cesista5", eps_mode=None), dict(coefficients="cesista5", eps_mode="clamp")),
    (dict(eps_mode=None), dict(eps_mode="add")),  # "jordan": torch's clamp
]


@pytest.mark.parametrize("extra, ignored", NORMALIZATION_CASES, ids=[repr(c[0]) for c in NORMALIZATION_CASES])
def test_normalization_steps_and_tables_match_reference(extra, ignored):
    """Muon's safety, eps, eps_mode (and its default), ns_steps and a user table against
    ortho_ref.muon_step with the same values (tall, wide, square; ‖U‖_F ≈ 1, so eps = 0.5
    matters). Each option must be applied: the oracle run with ``ignored`` instead is farther
    than the tolerance, so the comparison can fail."""
    opts = {**BASE, **extra}
    outs = _run_one_step([(12, 8), (8, 12), (10, 10)], opts, _rng("normalization", repr(extra)))
    for w_new, m_new, w0, g, m0 in outs:
        _check_against_reference(w_new, m_new, w0, g, m0, [ROWS], opts)
    w_new, _, w0, g, m0 = outs[0]
    ref, w_tol, _ = _reference(w0, g, m0, {**BASE, **ignored})
    assert np.linalg.norm(w_new - ref.weight) > w_tol, "the option changed nothing: this test could not fail"


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


@pytest.mark.parametrize("shape, flatten", [((8, 3, 3, 3), None), ((4, 10, 1, 1), None), ((6, 4, 5), True),
                                           ((8, 3, 3, 3), True)])
def test_conv_weights_flattened_match_reference(shape, flatten):
    """conv2d weights flattened by default (Keller Jordan, Moonlight); conv1d (3-D) with
    flatten=True (microsoft/dion): one (out, in·k) matrix."""
    opts = {**BASE, "adjust_lr": "spectral_norm", "cautious_weight_decay": True}
    flat = (shape[0], math.prod(shape[1:]))
    (out,) = _run_one_step([shape], opts, _rng("conv", shape), view_shapes=[flat], flatten=flatten)
    _check_against_reference(*out, [ROWS], opts)


@pytest.mark.parametrize("shape", [(6, 4, 5), (2, 3, 4, 5)])
def test_flatten_false_is_a_batch_of_matrices(shape):
    """flatten=False (microsoft/dion's default): every (shape[-2], shape[-1]) slice is its own
    matrix with its own norm and lr scale."""
    opts = {**BASE, "adjust_lr": "spectral_norm"}
    batch = math.prod(shape[:-2])
    (out,) = _run_one_step([shape], opts, _rng("batch", shape), view_shapes=[(batch, *shape[-2:])], flatten=False)
    _check_against_reference(*out, [(i,) for i in range(batch)], opts)


def test_three_dim_parameter_needs_expert_keys_or_flatten():
    """A 3-D parameter no expert key matches is ambiguous (conv1d weight, or an expert stack
    whose name was missed): an error naming both ways out, not a silent (E, m·n) matrix.
    Experts are one matrix per expert whatever ``flatten`` says."""
    p = torch.nn.Parameter(torch.ones(3, 8, 6))
    with pytest.raises(ValueError, match=r"^params: 'moe\.expert\.w'.*expert_keys.*flatten=True"):
        Muon([("moe.expert.w", p)], expert_keys=("experts",))
    with pytest.raises(ValueError, match="^params:.*expert_keys.*flatten=True"):
        Muon([p])
    with pytest.raises(TypeError, match="^flatten:"):
        Muon([p], flatten="yes")
    for flatten in (None, True, False):
        layout = muon_layout((3, 8, 6), expert=True, flatten=flatten)
        assert (layout.batch, layout.m, layout.n) == ((3,), 8, 6)
    assert muon_layout((3, 8, 6), flatten=True).matrix_shapes() == [(3, 48)]
    assert muon_layout((2, 3, 8, 6), flatten=False).matrix_shapes() == [(2, 3, 8, 6)]


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
    assert is_expert_name("mlp.experts.w", "experts") and not is_expert_name("a.b.w", "ab")  # a str is one key
    with pytest.raises(TypeError, match="^name:"):
        is_expert_name(3, ["experts"])
    with pytest.raises(TypeError, match="^expert_keys:"):
        is_expert_name("mlp.experts.w", [None])
    with pytest.raises(TypeError, match="^name:"):
        ortho_fast.normalize_name(None)


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


@settings(deadline=None)
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
    call; the 20 x 12 one and the 9 x 7 one are banks of one and keep their own 2-D call.
    Momentum is elementwise: bitwise equal. The weights are not bitwise equal to the unbanked
    run (bmm vs addmm, measured: float32 differs in the last bits); both are within
    muon_tolerance of the oracle, and the banked weights are bitwise the definition of a
    bank: one newton_schulz call on the concatenated members, then each parameter's update."""
    (pa, oa, w0, grads), (pb, ob, _, _) = _bank_run(False, dtype), _bank_run(True, dtype)
    name = str(dtype).replace("torch.", "")
    opts = {**BASE, "weight_decay": 0.1, "momentum": 0.95, "eps_mode": None}
    for a, b, w, g in zip(pa, pb, w0, grads):
        assert torch.equal(oa.state[a]["momentum_buffer"], ob.state[b]["momentum_buffer"])
        mats = zip(*(t.detach().double().numpy().reshape(-1, *a.shape[-2:]) for t in (a, b, w, g)))
        for wa, wb, wi, gi in mats:
            ref, w_tol, _ = _reference(wi, gi, np.zeros_like(gi), opts, name)
            assert np.linalg.norm(wa - ref.weight) <= w_tol and np.linalg.norm(wb - ref.weight) <= w_tol
    members = [0, 1, 3]  # a.w, b.w, experts.w (3 experts): every 12 x 20 matrix, in group order
    us = [muon_momentum(grads[i], torch.zeros_like(grads[i]), mu=0.95, nesterov=True, style="ema") for i in members]
    bank = newton_schulz(torch.cat([u.reshape(-1, 12, 20) for u in us]), dtype=dtype, eps_mode="clamp")
    for i, o in zip(members, bank.split([1, 1, 3])):
        expected = w0[i].clone().mul_(1 - 0.02 * 0.1).add_(o.reshape(w0[i].shape), alpha=-0.02)
        assert torch.equal(pb[i].detach(), expected)
    assert torch.equal(pa[2], pb[2]) and torch.equal(pa[4], pb[4])


def test_banks_lone_members_bitwise_and_parity_unaffected():
    """With every shape distinct, banks change nothing (each member keeps its 2-D call)."""
    rng = _rng("lone")
    shapes = [(8, 12), (12, 8), (10, 10)]
    w0 = [torch.tensor(0.02 * rng.standard_normal(s), dtype=torch.float32) for s in shapes]
    runs = []
    for banks in (False, True):
        ps = [torch.nn.Parameter(w.clone()) for w in w0]
        opt = Muon(ps, lr=0.02, banks=banks)
        for p in ps:
            p.grad = torch.ones_like(p) + p.detach()
        opt.step()
        runs.append(ps)
    assert all(torch.equal(a, b) for a, b in zip(*runs))


# =======================================================================================
# torch.optim.Muon: parity with many equal shapes, and its checkpoints
# =======================================================================================


def test_torch_parity_with_equal_shapes_and_torch_checkpoint():
    """Plain defaults (banks off, eps_mode resolved to torch's clamp) with several 16 x 24
    parameters stay bitwise equal to torch; a torch.optim.Muon state_dict loads (Muon keys it
    lacks come from the current groups, its lr replaces ours) and the next steps stay bitwise
    equal to torch's uninterrupted run."""
    rng = _rng("torch-ckpt")
    w0 = [torch.tensor(0.02 * rng.standard_normal((16, 24)), dtype=torch.float32) for _ in range(3)]
    grads = [[torch.tensor(rng.standard_normal((16, 24)), dtype=torch.float32) for _ in w0] for _ in range(4)]
    ps_ref, ps_fast, ps_t = ([torch.nn.Parameter(w.clone()) for w in w0] for _ in range(3))
    _run(ps_ref, torch.optim.Muon(ps_ref, lr=0.02), grads)
    _run(ps_fast, Muon(ps_fast, lr=0.02), grads)
    assert all(torch.equal(a, b) for a, b in zip(ps_ref, ps_fast))
    o_t = torch.optim.Muon(ps_t, lr=0.02)
    _run(ps_t, o_t, grads[:2])
    ps_load = [torch.nn.Parameter(p.detach().clone()) for p in ps_t]
    o_load = Muon(ps_load, lr=0.5)
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
    (pa, oa), resumed = round_trip(_layout_optimizer, w0, grads)
    assert_bitwise_same((pa, oa), resumed)
    assert set(oa.state[pa[0]]) == {"momentum_buffer"}
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
        (lambda: Muon(P2, coefficients="no_such_schedule"), ValueError, "coefficients"),
        (lambda: Muon(P2, ns_steps=0), ValueError, "ns_steps"),
        (lambda: Muon(P2, ns_steps=2.0), ValueError, "ns_steps"),
        (lambda: Muon(P2, eps_mode="max"), ValueError, "eps_mode"),
        (lambda: Muon(P2, expert_keys=None), TypeError, "expert_keys"),
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


@pytest.mark.parametrize("key, value, exc", [
    ("split_sizes", (6, 6, 5), ValueError), ("split_sizes", 3, TypeError), ("coefficients", "nope", ValueError),
    ("coefficients", [[1.0, 2.0]], ValueError), ("ns_steps", 0, ValueError), ("lr", float("nan"), ValueError),
    ("lr", "0.02", ValueError), ("weight_decay", -1.0, ValueError), ("momentum", float("inf"), ValueError),
    ("eps", -1.0, ValueError), ("safety", 0.0, ValueError), ("eps_mode", "max", ValueError),
    ("momentum_style", "adam", ValueError), ("adjust_lr", "sqrt", ValueError), ("dtype", torch.int32, TypeError),
    ("nesterov", 1, TypeError), ("flatten", "no", TypeError), ("extra_scale_factor", 0.0, ValueError),
])
def test_option_edited_after_construction_is_checked_before_any_change(key, value, exc):
    """An option of the second group edited on the live group (as a scheduler or a user
    might) is caught by the check pass: a clear error naming it, and every parameter and
    momentum buffer of both groups bitwise unchanged (none written with NaN)."""
    rng = _rng("edited")
    ps = _layout_params(rng)
    opt = _layout_optimizer(ps)
    _run(ps, opt, [[torch.randn(p.shape) for p in ps]])  # momentum buffers exist
    for p in ps:
        p.grad = torch.randn(p.shape)
    opt.param_groups[1][key] = value
    snap = _snapshot(ps, opt)
    with pytest.raises(exc, match=rf"^['\"]?{key}:"):
        opt.step()
    _assert_same(ps, opt, snap)


def test_schedule_options_set_to_none_after_construction_resolve_as_at_construction():
    """safety / eps / eps_mode set back to None on a live group mean "from the schedule" at
    the next step, exactly as at construction."""
    rng = _rng("none-again")
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
    rng = _rng("no-alias")
    ps = _layout_params(rng)
    o1 = _layout_optimizer(ps)
    _run(ps, o1, [[torch.randn(p.shape) for p in ps]])
    sd = o1.state_dict()
    before = copy.deepcopy(sd["state"])
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    o2 = _layout_optimizer(qs)
    o2.load_state_dict(sd)
    _run(qs, o2, [[torch.randn(p.shape) for p in ps]])
    ids = [i for g in sd["param_groups"] for i in g["params"]]
    params = ([p for g in o.param_groups for p in g["params"]] for o in (o1, o2))
    for i, p, q in zip(ids, *params):
        assert torch.equal(o1.state[p]["momentum_buffer"], before[i]["momentum_buffer"])
        assert torch.equal(sd["state"][i]["momentum_buffer"], before[i]["momentum_buffer"])
        assert not torch.equal(o2.state[q]["momentum_buffer"], before[i]["momentum_buffer"])


def test_load_state_dict_rejects_a_bad_saved_group_before_any_change():
    rng = _rng("bad-saved")
    ps = _layout_params(rng)
    opt = _layout_optimizer(ps)
    _run(ps, opt, [[torch.randn(p.shape) for p in ps]])
    sd = copy.deepcopy(opt.state_dict())
    sd["param_groups"][1]["coefficients"] = "nope"
    groups_before = copy.deepcopy([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups])
    snap = _snapshot(ps, opt)
    with pytest.raises(ValueError, match="^coefficients:"):
        opt.load_state_dict(sd)
    _assert_same(ps, opt, snap)
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == groups_before


def test_muon_momentum_rejects_an_unknown_style():
    buf = torch.zeros(3, 4)
    with pytest.raises(ValueError, match=r"^style: expected one of \('ema', 'classic'\)"):
        muon_momentum(torch.ones(3, 4), buf, mu=0.9, nesterov=True, style="bogus")
    assert not buf.any()


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
