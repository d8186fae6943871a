"""ortho_fast.Muon's layouts against the float64 oracle, one matrix at a time: conv weights
flattened, ``flatten=False`` batches, expert stacks (per expert), fused projections split per
block and per head (Megatron's split_qkv groups), and parameter banks (one batched call for
equal shapes, bitwise the definition of a bank); ``muon_layout``'s shapes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from ortho_fast import Muon, newton_schulz
from ortho_fast.functional.layout import is_expert_name, muon_layout
from ortho_fast.functional.muon import ADJUST_LR_MODES, muon_momentum
from ortho_fast.param_assignment import normalize_name
from tests.ortho_fast.helpers import (
    BASE,
    ROWS,
    check_against_muon_reference,
    muon_reference,
    rng_for,
    run_one_muon_step,
)
from tests.round_trip import run_steps

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
    (out,) = run_one_muon_step([shape], opts, rng_for("conv", shape), view_shapes=[flat], flatten=flatten)
    check_against_muon_reference(*out, [ROWS], opts)


@pytest.mark.parametrize("shape", [(6, 4, 5), (2, 3, 4, 5)])
def test_flatten_false_is_a_batch_of_matrices(shape):
    """flatten=False (microsoft/dion's default): every (shape[-2], shape[-1]) slice is its own
    matrix with its own norm and lr scale."""
    opts = {**BASE, "adjust_lr": "spectral_norm"}
    batch = math.prod(shape[:-2])
    (out,) = run_one_muon_step([shape], opts, rng_for("batch", shape),
                               view_shapes=[(batch, *shape[-2:])], flatten=False)
    check_against_muon_reference(*out, [(i,) for i in range(batch)], opts)


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
    rng = rng_for("channels-last")
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
    outs = run_one_muon_step(shapes, opts, rng_for("experts"), view_shapes=views, names=names, expert_keys=("experts",))
    for out, (e, *_) in zip(outs[:2], shapes):
        check_against_muon_reference(*out, [(i,) for i in range(e)], opts)
    check_against_muon_reference(*outs[2], [ROWS], opts)


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
        normalize_name(None)


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
    (out,) = run_one_muon_step([(rows, 12)], opts, rng_for("split", repr(split)), group_extra=split)
    matrices = _split_rows(split["split_sizes"], split.get("split_groups", 1), split.get("num_heads"))
    check_against_muon_reference(*out, matrices, opts)


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
    (out,) = run_one_muon_step([shape], opts, np.random.default_rng(seed), split_sizes=sizes, split_groups=groups,
                           num_heads=heads, **kw)
    blocks = _split_rows(sizes, groups, heads)
    matrices = [(e, rows) for e in range(experts) for (rows,) in blocks] if experts else blocks
    check_against_muon_reference(*out, matrices, opts)


def test_split_expert_weights_per_expert_and_block():
    """split_sizes on (E, 2·f, d) expert weights (fused gate/up) split every expert's rows."""
    opts = dict(BASE)
    (out,) = run_one_muon_step([(3, 10, 6)], opts, rng_for("split-experts"), names=["experts.w13"],
                           expert_keys=("experts",), split_sizes=(5, 5))
    matrices = [(e, rows) for e in range(3) for (rows,) in _split_rows((5, 5))]
    check_against_muon_reference(*out, matrices, opts)


# =======================================================================================
# Parameter banks
# =======================================================================================


BANK_SHAPES = [(12, 20), (12, 20), (20, 12), (3, 12, 20), (9, 7)]
BANK_NAMES = ["a.w", "b.w", "c.w", "experts.w", "d.w"]


def _bank_run(banks: bool, dtype: torch.dtype):
    """One step (zero initial momentum) on five parameters; returns (params, optimizer, w0, grads)."""
    rng = rng_for("banks", dtype)
    w0 = [torch.tensor(0.02 * rng.standard_normal(s), dtype=dtype) for s in BANK_SHAPES]
    grads = [torch.tensor(rng.standard_normal(s), dtype=dtype) for s in BANK_SHAPES]
    ps = [torch.nn.Parameter(w.clone()) for w in w0]
    opt = Muon(list(zip(BANK_NAMES, ps)), lr=0.02, banks=banks, dtype=dtype, expert_keys=("experts",))
    run_steps(ps, opt, [grads])
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
            ref, w_tol, _ = muon_reference(wi, gi, np.zeros_like(gi), opts, name)
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
    rng = rng_for("lone")
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


def test_muon_layout_shapes():
    lay = muon_layout((3, 8, 6, 2), expert=True, split_sizes=(4, 2, 2), num_heads=(2, 1, 1))
    assert (lay.batch, lay.m, lay.n) == ((3,), 8, 12)
    assert lay.matrix_shapes() == [(3, 2, 2, 12), (3, 2, 12), (3, 2, 12)]
    assert muon_layout((5, 7)).matrix_shapes() == [(5, 7)]  # the 2-D path of torch.optim.Muon
