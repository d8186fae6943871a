"""The CPU proxies of the GPU step's launch count and workspace: compute (non-view) aten operations
and the bytes of the tensors they allocate, counted under a ``TorchDispatchMode`` in the second
step (the state exists) over the 48 matrices of 12 GPT blocks (fused QKV (3d, d), proj (d, d),
MLP up (4d, d), MLP down (d, 4d)) at a small width d: the count depends on the number of matrices
and shapes, not on d.

The bounds are issue 23's: microsoft/dion's counts on the same 48 matrices (Muon 262 before its
compiled graphs fuse further, NorMuon 322, Dion2 466); torch.optim.Muon counts 1106 here (one 2-D
call chain per matrix), which the first test pins so that the counter is known to count.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import ortho_fast
from ortho_fast.functional.stacked import Workspace

_SPEC = importlib.util.spec_from_file_location(
    "_op_count", Path(__file__).resolve().parents[2] / "benchmarks" / "_op_count.py")
_OP_COUNT = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_OP_COUNT)
#: The counter benchmarks/proxies.py prints with (one definition for both).
CountOps = _OP_COUNT.CountOps

#: microsoft/dion's compute ops per step over the same 48 matrices (issue 23).
BOUNDS = {"muon": 262, "muon_no_check": 262, "normuon": 322, "dion2": 466}


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
    record: 1106 (issue 23's count), over every bound below."""
    counter, _ = second_step("torch")
    assert counter.ops == 1106
    assert counter.ops > max(BOUNDS.values())


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_a_step_over_48_matrices_stays_under_the_bound(name):
    counter, _ = second_step(name)
    assert counter.ops <= BOUNDS[name], counter.ops


@pytest.mark.parametrize("name", ["muon_no_check", "normuon_no_check"])
def test_the_stacked_step_costs_the_same_for_twice_the_layers(name):
    """The stacked step runs a fixed number of operations per shape (chunks of up to
    ``MAX_STACK_ELEMENTS`` entries): 24 blocks cost what 12 do (without the finiteness check,
    which screens each gradient with one sum)."""
    assert second_step(name, layers=24)[0].ops == second_step(name, layers=12)[0].ops


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
        pointers.append(sorted(t.data_ptr() for t in workspace._flat.values()))
    assert opt.workspace_nbytes == workspace.nbytes > 0 and pointers[1] == pointers[2] == pointers[0]
    assert counter.allocated < second_step("torch")[0].allocated
