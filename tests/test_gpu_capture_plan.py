"""The plan of benchmarks/gpu.py's CUDA-graph capture check, checked on the CPU (the capture itself
needs a GPU): at its size (``CAPTURE_SIZE``, workspace floor off) every shape group of Muon,
NorMuon, Dion2 and the HybridOptimizer's Muon group is cut into several chunks, and the momentum,
update and product rounds (``ortho_fast.functional.stacked``) each take a round; the lr changes
before every replay. A plan at the old size (d = 256 × 2 layers, the floor on) reaches none of
the rounds, which the last test shows, so these checks can fail.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

import ortho_fast.functional.muon as functional_muon
from ortho_fast.functional import stacked
from tests.load_file import ROOT, load_file

gpu = load_file(ROOT / "benchmarks" / "gpu.py", "gpu_bench")

ROUNDS = ("momentum_rounds", "update_rounds", "product_rounds")


@contextmanager
def spied(monkeypatch):
    """Counts of the rounds that returned a plan (a round taken) and of the workspace's chunks
    (a ``Workspace.get`` that starts a new frame)."""
    seen = {name: 0 for name in ROUNDS} | {"chunks": 0}

    def wrap(name, fn):
        def spy(*args, **kwargs):
            out = fn(*args, **kwargs)
            seen[name] += bool(out)
            return out
        return spy

    for name in ROUNDS:
        monkeypatch.setattr(stacked, name, wrap(name, getattr(stacked, name)))
    monkeypatch.setattr(functional_muon, "momentum_rounds", stacked.momentum_rounds)
    get = stacked.Workspace.get

    def counting_get(self, name, shape, dtype, device):
        names, _ = self._frame.get(torch.device(device), (frozenset(), 0))
        seen["chunks"] += not names or name in names
        return get(self, name, shape, dtype, device)

    monkeypatch.setattr(stacked.Workspace, "get", counting_get)
    yield seen


def _steps(name: str, size, monkeypatch, floor: int = 0) -> dict:
    monkeypatch.setattr(gpu, "CAPTURE_SIZE", size)
    monkeypatch.setattr(stacked, "MIN_WORKSPACE_BYTES", floor)
    weights, _, builders = gpu.capture_plan(torch.device("cpu"))
    ps = [torch.nn.Parameter(w.clone()) for w in weights]
    opt = builders[name](ps)
    gen = torch.Generator().manual_seed(0)
    with spied(monkeypatch) as seen:
        for lr in gpu.capture_lrs()[:2]:
            gpu.set_lr(opt, lr)
            for p in ps:
                p.grad = torch.randn(p.shape, generator=gen)
            opt.step()
    return seen


SHAPES = 4  # distinct GPT matrix shapes: more chunks than shapes means a shape group was cut


@pytest.mark.parametrize("name, rounds", [
    ("Muon", ("momentum_rounds", "update_rounds")),
    ("NorMuon", ("product_rounds",)),  # its factors in rounds; U and the update without (nesterov=False)
    ("HybridOptimizer (stacked Muon + capturable AdamW + Lion)", ("momentum_rounds", "update_rounds")),
    ("Dion2", ()),
])
def test_the_capture_plan_reaches_the_chunks_and_rounds(name, rounds, monkeypatch):
    seen = _steps(name, gpu.CAPTURE_SIZE, monkeypatch)
    # counted at the first step: later steps replay each chunk's workspace views (``groups.muon_plan.Replay``)
    assert seen["chunks"] > SHAPES, seen
    for r in rounds:
        assert seen[r] > 0, (r, seen)


def test_the_old_plan_reaches_no_round(monkeypatch):
    """d = 256 × 2 layers with the floor on: each shape one matrix, no chunk cut, no round."""
    seen = _steps("Muon", (256, 2), monkeypatch, floor=stacked.MIN_WORKSPACE_BYTES)
    assert seen["update_rounds"] == seen["momentum_rounds"] == 0 and seen["chunks"] <= SHAPES


def test_the_lr_changes_before_every_replay():
    lrs = gpu.capture_lrs()
    assert len(lrs) == gpu.CAPTURE_REPLAYS + 1 and len(set(lrs)) == len(lrs) and min(lrs) > 0


def test_set_lr_writes_a_tensor_lr_in_place_and_assigns_a_float():
    lr = torch.tensor(0.1)

    class Opt:
        param_groups = [{"lr": lr}, {"lr": 0.5}]

    gpu.set_lr(Opt, 0.25)
    assert Opt.param_groups[0]["lr"] is lr and float(lr) == 0.25 and Opt.param_groups[1]["lr"] == 0.25
