"""The parameters the stacked Muon step leaves out (cautious weight decay: all of them; split heads;
lone shapes) run in batches within the stacks' workspace budget
(``ortho_fast.groups.muon_budget.rest_batches``): above the workspace floor their first step
peaks within ``MEMORY_BOUND`` × torch.optim.Muon's, as the stacked step does (it was 3.65× for
cautious weight decay and 3.62× for split heads, d = 64 × 12 blocks, when the rest ran at once).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

import ortho_fast
from ortho_fast.functional import stacked
from ortho_fast.functional.muon import cautious_decay_factor
from ortho_fast.groups.muon import MUON_DEFAULTS, param_layout, resolve_muon_options
from ortho_fast.groups.muon_budget import rest_batches, rest_nbytes
from tests.ortho_fast.test_op_counts import BUILDERS, MEMORY_BOUND, gpt_shapes, step_peaks

#: Optimizers whose parameters all go to the rest step (or most of them: heads split the rows).
REST_BUILDERS = {
    "muon_cautious": lambda ps: ortho_fast.Muon(ps, lr=0.02, cautious_weight_decay=True),
    "normuon_cautious": lambda ps: ortho_fast.NorMuon(ps, lr=0.02, cautious_weight_decay=True),
    "muon_heads": lambda ps: ortho_fast.Muon(ps, lr=0.02, num_heads=4),
}


def _ratio(name: str, shapes) -> float:
    return step_peaks(REST_BUILDERS[name], shapes, steps=1)[0] / step_peaks(BUILDERS["torch"], shapes, steps=1)[0]


@settings(max_examples=8)  # fixed: each example is two counted first steps (about 1 s)
@example(2, 6, "normuon_cautious")  # the worst seen: 1.087 (1.153 before the cautious mask's cheaper temporaries)
@given(st.integers(2, 6), st.integers(6, 12), st.sampled_from(sorted(REST_BUILDERS)))
def test_the_rest_step_peaks_within_the_bound(eighths, layers, name):
    """Property: GPT blocks of width d = 8·k ≤ 48, 6 to 12 layers (the slow profiles draw as many
    more), floor off (the regime of models from
    about d = 600): the first step of an optimizer whose parameters take the rest step peaks within
    the bound."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stacked, "MIN_WORKSPACE_BYTES", 0)
        assert _ratio(name, gpt_shapes(8 * eighths, layers)) <= MEMORY_BOUND


@given(st.lists(st.sampled_from([(12, 8), (8, 12), (16, 16), (4, 2, 6, 5)]), min_size=1, max_size=12),
       st.integers(0, 20_000), st.booleans())
def test_rest_batches_keep_order_and_budget(shapes, budget, batched):
    """Property: the batches are the rest in order, each within the budget unless it is one
    parameter; without batching every parameter is its own batch."""
    params = [torch.zeros(s) for s in shapes]
    group = {**MUON_DEFAULTS, "params": params, "banks": batched or None,
             **({} if batched else {"bitwise_torch": True})}
    options = resolve_muon_options(group)
    def layout(i, p):
        return param_layout(group, options, i, p)
    rest = list(enumerate(params))
    batches = rest_batches(rest, layout, options, budget)
    assert [item for batch in batches for item in batch] == rest
    for batch in batches:
        assert len(batch) == 1 or (options.batched and sum(rest_nbytes(p, layout(i, p), options)
                                                           for i, p in batch) <= budget)
    if not options.batched:
        assert all(len(batch) == 1 for batch in batches)


@given(st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]), st.integers(0, 2**16),
       st.floats(1e-6, 0.5))
def test_the_cautious_mask_keeps_the_bits_of_signs(dtype, seed, decay):
    """Property: ``cautious_decay_factor`` (boolean comparisons, about 5 bytes per entry) gives
    ``W.mul_(factor)`` the bits of ``torch.where(sign(O)·sign(W) >= 0, W·(1 − decay), W)``, zeros
    and negative zeros included."""
    gen = torch.Generator().manual_seed(seed)
    o = torch.randn(9, 7, generator=gen).to(dtype)
    w = torch.randn(9, 7, generator=gen).to(dtype)
    o[0, :3], w[1, :3], o[2, 0], w[3, 0] = 0.0, 0.0, -0.0, -0.0
    want = torch.where(o.sign() * w.sign() >= 0, w * (1 - decay), w)
    got = w.clone().mul_(cautious_decay_factor(o, w, decay))
    assert got.dtype == want.dtype and torch.equal(got, want)
