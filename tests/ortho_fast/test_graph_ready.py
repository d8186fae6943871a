"""A step ready for CUDA-graph capture: with ``check_finite=False``, a Muon / NorMuon / Dion2 step
after the first (state and workspace exist) reads nothing back to the host and allocates its
workspace nowhere new. A CUDA graph replays the kernels of the captured step on the captured
addresses; a host read (``.item()``, ``bool(t)``, ``nonzero``) inside it fails the capture, and a
buffer allocated again would move. benchmarks/gpu.py captures and replays the step on a GPU; this
is its CPU proxy: the aten operations of the step, recorded under a ``TorchDispatchMode``.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ortho_fast

#: The aten operations that wait for the device: a read of a value to the host, or an output whose
#: shape depends on the data.
HOST_SYNCS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default,
              torch.ops.aten.nonzero.default, torch.ops.aten.item.default, torch.ops.aten.equal.default,
              torch.ops.aten.masked_select.default, torch.ops.aten.unique_consecutive.default,
              torch.ops.aten._unique2.default}


class RecordOps(TorchDispatchMode):
    """Records the aten operations run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


BUILDERS = {
    "muon": lambda ps: ortho_fast.Muon(ps, lr=0.02, check_finite=False),
    "normuon": lambda ps: ortho_fast.NorMuon(ps, lr=0.02, check_finite=False),
    "dion2": lambda ps: ortho_fast.Dion2(ps, lr=0.02, check_finite=False),
}


def _steps(name: str, steps: int = 3):
    d = 16
    gen = torch.Generator().manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)] * 3]
    opt = BUILDERS[name](ps)
    records = []
    for _ in range(steps):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen)
        with RecordOps() as mode:
            opt.step()
        records.append((mode.ops, getattr(opt, "workspace_nbytes", None),
                        opt._runner.workspace.data_ptrs() if name != "dion2" else None))
    return records


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_a_later_step_reads_nothing_back_to_the_host(name):
    for ops, _, _ in _steps(name)[1:]:
        synced = sorted({str(op) for op in ops if op in HOST_SYNCS})
        assert not synced, synced


@pytest.mark.parametrize("name", ["muon", "normuon"])
def test_a_later_step_runs_the_same_operations_on_the_same_workspace(name):
    """The second and third steps run the same operations (what the graph captured is what an
    eager step would run) and keep the workspace where the first step put it."""
    (_, nbytes, ptrs), (ops2, nbytes2, ptrs2), (ops3, nbytes3, ptrs3) = _steps(name)
    assert ops2 == ops3
    assert nbytes == nbytes2 == nbytes3 > 0 and ptrs == ptrs2 == ptrs3


def test_the_recorder_sees_a_host_read():
    """The check can fail: a step that reads a value back is caught."""
    with RecordOps() as mode:
        bool(torch.ones(2).sum() > 1)
    assert torch.ops.aten._local_scalar_dense.default in mode.ops or torch.ops.aten.is_nonzero.default in mode.ops
