"""Dion2's step memory (``ortho_fast.groups.dion2``): a shape group is cut into chunks whose
stacks and Newton–Schulz buffers fit Muon's workspace budget (``stacked.workspace_budget``) and
live in a workspace kept between steps, so no step holds a temporary the size of all the
parameters. Measured with the CPU proxy of ``torch.cuda.max_memory_allocated`` (benchmarks/_op_count.py,
``CountOps.peak``) against torch.optim.Muon on the same GPT matrices: a later step within
``MEMORY_BOUND`` × torch's later step (its temporaries for one matrix), a first step within
``MEMORY_BOUND`` × torch's first (its momentum and those temporaries) where the workspace floor
does not bind (models from about d = 600 × 12 blocks; set to 0 here so that d = 32 stands for
them, as tests/ortho_fast/test_op_counts.py does for Muon). A planner that keeps one chunk per
shape fails both; any chunking gives the same bits.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_fast
from ortho_fast.functional import stacked
from ortho_fast.groups import dion2 as dion2_groups
from tests.ortho_fast.test_op_counts import BUILDERS, MEMORY_BOUND, gpt_shapes, step_peaks


def _ratios(shapes, steps: int = 2) -> tuple[float, float]:
    """(first-step, later-step) peak of Dion2 over torch.optim.Muon's on ``shapes``."""
    ours = step_peaks(BUILDERS["dion2"], shapes, steps=steps)
    torch_ = step_peaks(BUILDERS["torch"], shapes, steps=steps)
    return ours[0] / torch_[0], ours[-1] / torch_[-1]


@pytest.mark.parametrize("layers", [12, 24])
def test_a_later_step_peaks_within_the_bound_of_torchs(layers):
    """With the default floor (a small model's group is one chunk, its buffers kept in the
    workspace) a later step allocates only the norms and indices of a chunk."""
    assert _ratios(gpt_shapes(32, layers))[1] <= MEMORY_BOUND


@pytest.mark.parametrize("layers", [12, 24])
def test_a_first_step_peaks_within_the_bound_of_torchs(layers, monkeypatch):
    monkeypatch.setattr(stacked, "MIN_WORKSPACE_BYTES", 0)
    first, later = _ratios(gpt_shapes(32, layers))
    assert first <= MEMORY_BOUND and later <= MEMORY_BOUND


def test_one_chunk_per_shape_fails_the_bound(monkeypatch):
    """The planted planner (every shape group one chunk, the whole group stacked) breaks the
    first-step bound the budget keeps."""
    monkeypatch.setattr(stacked, "MIN_WORKSPACE_BYTES", 0)
    monkeypatch.setattr(dion2_groups, "dion2_chunks", lambda params, options, budget: [params])
    assert _ratios(gpt_shapes(32, 12))[0] > MEMORY_BOUND


@settings(max_examples=5, deadline=None)
@given(st.integers(2, 8), st.integers(6, 24))
def test_any_gpt_width_and_depth_peaks_within_the_bound(eighths, layers):
    """Property: GPT blocks of width d = 8·k and 6 to 24 layers, floor off: both steps within
    the bound."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stacked, "MIN_WORKSPACE_BYTES", 0)
        first, later = _ratios(gpt_shapes(8 * eighths, layers))
    assert first <= MEMORY_BOUND and later <= MEMORY_BOUND


def _run(shapes, floor: int, steps: int = 3, **kw):
    gen = torch.Generator().manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=kw.pop("param_dtype", torch.float32)))
          for s in shapes]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stacked, "MIN_WORKSPACE_BYTES", floor)
        opt = ortho_fast.Dion2(ps, lr=0.02, **kw)
        for _ in range(steps):
            for p in ps:
                p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            opt.step()
    return [p.detach() for p in ps] + [opt.state[p]["momentum"] for p in ps]


@pytest.mark.parametrize("shapes, kw", [
    (gpt_shapes(16, 4), {}),
    (gpt_shapes(16, 4), {"dtype": torch.float32, "fraction": 0.5}),
    ([(12, 40), (40, 12), (12, 40), (3, 8, 6), (3, 8, 6), (5, 5)], {"flatten": True}),
    ([(3, 8, 6), (3, 8, 6), (24, 10)] * 2, {}),
    (gpt_shapes(16, 3), {"param_dtype": torch.bfloat16}),
])
def test_chunks_keep_the_bits(shapes, kw):
    """Cut into one-matrix chunks (floor 0) or kept whole (a floor above the model), every
    parameter and momentum buffer is the same, bit for bit: the chunk only batches the same
    per-matrix arithmetic."""
    chunked = _run(shapes, 0, **dict(kw))
    whole = _run(shapes, 1 << 40, **dict(kw))
    assert all(torch.equal(a, b) for a, b in zip(chunked, whole))


def test_the_workspace_is_reused_across_steps(monkeypatch):
    monkeypatch.setattr(stacked, "MIN_WORKSPACE_BYTES", 0)
    gen = torch.Generator().manual_seed(3)
    ps = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in gpt_shapes(32, 6)]
    opt = ortho_fast.Dion2(ps, lr=0.02)
    pointers = []
    for _ in range(3):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
        pointers.append(opt._runner.workspace.data_ptrs())
    assert pointers[0] == pointers[1] == pointers[2] and opt._runner.workspace_nbytes > 0


@given(st.integers(1, 30), st.integers(4, 64), st.integers(4, 64), st.integers(0, 1 << 22))
def test_every_chunk_fits_the_budget_unless_it_is_one_matrix(count, m, n, budget):
    """Property: ``dion2_chunks`` keeps the order and every parameter, and a chunk of more than
    one matrix costs at most the budget (workspace and small temporaries)."""
    ps = [torch.empty(m, n) for _ in range(count)]
    options = dion2_groups.resolve_dion2_options(dict(dion2_groups.DION2_DEFAULTS, params=ps))
    chunks = dion2_groups.dion2_chunks(ps, options, budget)
    assert [id(p) for c in chunks for p in c] == [id(p) for p in ps]
    rows = m <= n
    k = dion2_groups.dion2_math.dion2_num_selected(options.fraction, m if rows else n)
    for c in chunks:
        cost = (dion2_groups.dion2_chunk_nbytes(len(c), m, n, k, rows, torch.float32, torch.bfloat16)
                + dion2_groups.dion2_small_nbytes(len(c), m, n, k, rows, torch.float32))
        assert len(c) == 1 or cost <= budget
    # and as large as the budget allows: one more matrix would not fit
    for c, nxt in zip(chunks, chunks[1:]):
        more = (dion2_groups.dion2_chunk_nbytes(len(c) + 1, m, n, k, rows, torch.float32, torch.bfloat16)
                + dion2_groups.dion2_small_nbytes(len(c) + 1, m, n, k, rows, torch.float32))
        assert more > budget


@pytest.mark.parametrize("shapes", [gpt_shapes(16, 4), [(3, 8, 6)] * 5])
def test_the_per_matrix_update_keeps_the_bits_of_the_batched_one(shapes):
    """The sparse update by one ``scatter_add_`` per matrix (``stacked.LAUNCH_BYTES`` = 0: the batched
    form never pays) and by the batched fill / scatter / ``_foreach_add_`` (a launch weighing
    everything) give the same parameters bit for bit (w + (−0.0) is w)."""
    results = []
    for weight in (0, 1 << 60):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(stacked, "LAUNCH_BYTES", weight)
            results.append(_run(shapes, 0))
    assert all(torch.equal(a, b) for a, b in zip(*results))


@pytest.mark.parametrize("c, m, n, pays", [
    (12, 128, 512, True),    # a d = 128 GPT's MLP group: 9 launches saved, 12.6 MB more traffic
    (12, 768, 768, True),    # d = 768 proj: 9 launches (141 MB) against 113 MB
    (3, 32, 32, False),      # 3 matrices: no launch saved
    (5, 3072, 768, False),   # d = 768 MLP chunk: 2 launches (31 MB) against 151 MB
])
def test_the_batched_update_pays_where_its_launches_outweigh_its_bytes(c, m, n, pays):
    """``batched_update_pays``: (c − 3)·``stacked.LAUNCH_BYTES`` against the 4 passes over the stack less
    one over the selected quarter (meta tensors: only shapes count)."""
    stack = torch.empty(c, m, n, device="meta")
    sub = torch.empty(c, m // 4 if m <= n else m, n if m <= n else n // 4, device="meta")
    assert dion2_groups.batched_update_pays(stack, sub) is pays
