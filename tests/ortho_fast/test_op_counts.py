"""The CPU proxies of the GPU step's launch count and memory: compute (non-view) aten operations
counted as the CUDA launches they make (a ``_foreach`` operation off torch's fast path, such as one
mixing dtypes, one per tensor: ``CountOps``, tests/ortho_fast/test_launch_rule.py),
the bytes of the tensors they allocate and the peak of the bytes those keep alive, counted under a
``TorchDispatchMode`` (``benchmarks/_op_count.py``) over the 48 matrices of 12 GPT blocks (fused
QKV (3d, d), proj (d, d), MLP up (4d, d), MLP down (d, 4d)) at a small width d.

The bounds are microsoft/dion's operation counts on the same 48 matrices in the second
step (Muon 262 before its compiled graphs fuse further, NorMuon 322, Dion2 466); torch.optim.Muon
counts 1106 here (one 2-D call chain per matrix), which the first test pins so that the counter is
known to count. Memory: the peak extra bytes of a Muon / NorMuon first step (state and workspace
created then) at most 1.1× torch.optim.Muon's (``MEMORY_BOUND``), whose peak the memory tests pin
to its momentum plus one matrix's temporaries.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_fast
from ortho_fast.functional import stacked
from ortho_fast.functional.stacked import Workspace
from tests.load_file import ROOT, load_file
from tests.strategies import profile_examples

_OP_COUNT = load_file(ROOT / "benchmarks" / "_op_count.py", "_op_count")
#: The counter benchmarks/proxies.py prints with (one definition for both).
CountOps = _OP_COUNT.CountOps

#: microsoft/dion's compute ops per step over the same 48 matrices.
BOUNDS = {"muon": 262, "muon_no_check": 262, "normuon": 322, "dion2": 466}
#: A Muon / NorMuon step's peak extra memory over torch.optim.Muon's.
MEMORY_BOUND = 1.1


def gpt_params(d: int = 32, layers: int = 12, seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)] * layers
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]


BUILDERS = {
    "torch": lambda ps: torch.optim.Muon(ps, lr=0.02),
    "muon": lambda ps: ortho_fast.Muon(ps, lr=0.02),
    "muon_no_check": lambda ps: ortho_fast.Muon(ps, lr=0.02, check_finite=False),
    "normuon": lambda ps: ortho_fast.NorMuon(ps, lr=0.02),
    "normuon_no_check": lambda ps: ortho_fast.NorMuon(ps, lr=0.02, check_finite=False),
    "dion2": lambda ps: ortho_fast.Dion2(ps, lr=0.02),
}


def second_step(name: str, **kw) -> tuple[CountOps, object]:
    ps = gpt_params(**kw)
    opt = BUILDERS[name](ps)
    gen = torch.Generator().manual_seed(1)
    for t in range(2):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen)
        if t == 0:
            opt.step()
            continue
        with CountOps() as counter:
            opt.step()
    return counter, opt


def test_the_counter_counts_torch_muons_per_matrix_calls():
    """torch.optim.Muon: per matrix 5 steps × 3 products and 8 elementwise ops, plus its profiler
    record: 1106 (torch.optim.Muon's count), over every bound below."""
    counter, _ = second_step("torch")
    assert counter.ops == 1106
    assert counter.ops > max(BOUNDS.values())


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_a_step_over_48_matrices_stays_under_the_bound(name):
    counter, _ = second_step(name)
    assert counter.ops <= BOUNDS[name], counter.ops


@pytest.mark.parametrize("name", ["muon_no_check", "normuon_no_check"])
def test_the_stacked_step_costs_at_most_one_op_per_added_matrix(name):
    """The stacked step runs a fixed number of launches per chunk of a shape group (a small
    model's group is one chunk, ``stacked.MIN_WORKSPACE_BYTES``; the update's cast in rounds)
    plus at most one per matrix (U written into the bfloat16 stack with its cast): 24 blocks cost
    at most 48 launches more than 12."""
    assert second_step(name, layers=24)[0].ops - second_step(name, layers=12)[0].ops <= 48


def test_the_workspace_is_reused_and_the_step_allocates_less_than_torch():
    """The second step allocates no new workspace (the same buffers, the same bytes) and its other
    allocations stay under torch.optim.Muon's for the same step."""
    ps = gpt_params()
    opt = ortho_fast.Muon(ps, lr=0.02)
    workspace: Workspace = opt._runner.workspace
    gen = torch.Generator().manual_seed(2)
    pointers = []
    for _ in range(3):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen)
        with CountOps() as counter:
            opt.step()
        pointers.append(workspace.data_ptrs())
    assert opt.workspace_nbytes == workspace.nbytes > 0 and pointers[1] == pointers[2] == pointers[0]
    assert counter.allocated < second_step("torch")[0].allocated


def step_peaks(build, shapes, seed: int = 0, steps: int = 2) -> tuple[int, ...]:
    """Peak extra bytes (``CountOps.peak``) of each of the first ``steps`` steps of ``build(params)``."""
    gen = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    opt = build(ps)
    peaks = []
    for _ in range(steps):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen)
        with CountOps() as counter:
            opt.step()
        peaks.append(counter.peak)
    return tuple(peaks)


def gpt_shapes(d: int, layers: int) -> list[tuple[int, int]]:
    return [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)] * layers


def test_the_peak_counter_sees_torch_muons_momentum_and_one_matrix():
    """torch.optim.Muon's first step peaks at its momentum buffers (created then) plus the
    temporaries of its largest matrix, byte for byte; a later step at the temporaries alone."""
    shapes = gpt_shapes(16, 2) + [(40, 24)]
    first, later = step_peaks(BUILDERS["torch"], shapes)
    temporaries = max(stacked.torch_temporaries_nbytes(m, n, torch.float32) for m, n in shapes)
    assert later == temporaries
    assert first == sum(4 * m * n for m, n in shapes) + temporaries


def _ratio(name: str, shapes) -> float:
    return step_peaks(BUILDERS[name], shapes)[0] / step_peaks(BUILDERS["torch"], shapes)[0]


@pytest.mark.parametrize("name", ["muon", "normuon"])
@pytest.mark.parametrize("layers", [12, 24])
def test_a_first_step_peaks_within_the_bound_of_torchs(name, layers, monkeypatch):
    """Above the workspace floor (models from about d = 600 × 12 GPT blocks; the floor is set to 0
    here so that d = 32 stands for them) the first step's peak extra memory stays within
    ``MEMORY_BOUND`` × torch.optim.Muon's, and the default budget keeps it there."""
    assert stacked.MEMORY_RATIO <= MEMORY_BOUND
    monkeypatch.setattr(stacked, "MIN_WORKSPACE_BYTES", 0)
    assert _ratio(name, gpt_shapes(32, layers)) <= MEMORY_BOUND


def test_a_chunk_cut_by_the_element_cap_stays_within_the_bound(monkeypatch):
    """Where ``MAX_STACK_ELEMENTS`` binds before the budget (the largest models: d = 2048 × 24),
    each chunk holds at most that many entries and the peak stays within the bound."""
    import ortho_fast.groups.muon as group_muon

    monkeypatch.setattr(stacked, "MIN_WORKSPACE_BYTES", 0)
    monkeypatch.setattr(group_muon, "MAX_STACK_ELEMENTS", 2 * 4 * 32 * 32)
    shapes = gpt_shapes(32, 12)
    assert _ratio("muon", shapes) <= MEMORY_BOUND
    ps = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    opt = BUILDERS["muon"](ps)
    for p in ps:
        p.grad = torch.randn(p.shape)
    opt.step()
    assert 0 < opt.workspace_nbytes <= stacked.chunk_nbytes(2, 4 * 32, 32, None, torch.bfloat16)


def test_a_small_model_keeps_one_chunk_per_shape_under_the_floor():
    """Below the floor the budget is ``MIN_WORKSPACE_BYTES``: each shape group of a d = 32 model is
    one chunk (the launch counts above) and the workspace stays under the floor."""
    _, opt = second_step("muon_no_check")
    sizes = {(m, n): 12 for m, n in gpt_shapes(32, 1)}
    largest = max(stacked.chunk_nbytes(k, m, n, None, torch.bfloat16) for (m, n), k in sizes.items())
    assert opt.workspace_nbytes == largest <= stacked.MIN_WORKSPACE_BYTES


@settings(deadline=None, **profile_examples(3))  # each example counts a whole GPT's first step
@given(st.integers(2, 8), st.integers(6, 24), st.sampled_from(["muon", "normuon"]))
def test_any_gpt_width_and_depth_peaks_within_the_bound(eighths, layers, name):
    """Property: GPT blocks of width d = 8·k and 6 to 24 layers peak within the bound at their
    first step, floor off (a third of the profile's examples: ``--hypothesis-profile ortho-deep``
    draws more)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stacked, "MIN_WORKSPACE_BYTES", 0)
        assert _ratio(name, gpt_shapes(8 * eighths, layers)) <= MEMORY_BOUND
