"""A steady-state step of the distributed Muon resolves nothing about its group: following the group
dict through the step (``scripts/follow_group.py --distributed``: maximal runs of traced lines in one
``ortho_fast`` file among frames holding the dict, ``Shard(0)`` DTensor parameters on a 1-D mesh)
passes through at most 5 files and comes back to a file at most 5 times, on every rank, for Muon,
NorMuon and the hybrid optimizer's Muon group, with a fixed lr and with an lr scheduler. The exchange
phases read the group's ``_GroupPlan`` (``ortho_fast.distributed.muon``), made with its ``MuonPlan``
when the group changes. With the phases walking the group at every step the same count on 2 ranks
was 56 stays in 4 files with 52 returns for Muon, which these bounds reject.

The same launch steps the stages with a compute dtype narrower than their factors (float32
parameters with bfloat16 Newton–Schulz and Muon+ / NorMuon; bfloat16 parameters with ``dtype=None``
and MuonEq): a non-owner receives the owner's result in the dtype the stages hand out, and every
rank equals one-process Muon bitwise (FSDP and DDP orthogonalize the very matrix one process does).
One launch of 2 gloo ranks for the module (``ortho_verify.sharding.workers.run_workers``).
"""

from __future__ import annotations

import pathlib

import pytest
import torch

from ortho_verify.sharding.workers import run_workers
from tests.load_file import load_file

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "follow_group.py"
WORLD = 2

#: The bounds the plan is held to (files and returns of one traced step), as the one-process step's.
MAX_FILES = 5
MAX_RETURNS = 5
CASES = [(name, scheduler) for name in ("muon", "normuon", "hybrid") for scheduler in (False, True)]


def _load_script():
    return load_file(SCRIPT, "follow_group", register=True)


STEPS = 3
# (name, parameter dtype, [(shape, Shard dim or None: a plain tensor)], options)
NARROW = [
    ("fsdp normuon bf16 NS", torch.float32, [((8, 12), 0), ((7, 5), 0), ((6, 9), 1)],
     dict(renormalize=True, normuon_beta2=0.9)),
    ("ddp normuon bf16 NS", torch.float32, [((8, 12), None), ((5, 3), None)], dict(normuon_beta2=0.9)),
    ("fsdp muon+ bf16 NS", torch.float32, [((8, 12), 0), ((7, 5), 1)], dict(renormalize=True)),
    ("fsdp bf16 muoneq dtype=None", torch.bfloat16, [((8, 12), 0), ((7, 5), 0)],
     dict(row_equilibration=True, dtype=None)),
    ("ddp bf16 muoneq dtype=None", torch.bfloat16, [((8, 12), None)], dict(row_equilibration=True, dtype=None)),
]


def _narrow(case, mesh) -> bool:
    """Whether the distributed run of ``case`` equals one process bitwise after every step."""
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    from ortho_fast import Muon

    _, dtype, params, options = case
    gen = torch.Generator().manual_seed(3)
    fulls = [torch.randn(shape, generator=gen).to(dtype) for shape, _ in params]
    grads = [[torch.randn(w.shape, generator=gen).to(dtype) for w in fulls] for _ in range(STEPS)]

    def laid(t, dim):
        return t.clone() if dim is None else distribute_tensor(t, mesh, [Shard(dim)], src_data_rank=None)

    ps = [torch.nn.Parameter(laid(w, d)) for w, (_, d) in zip(fulls, params)]
    refs = [torch.nn.Parameter(w.clone()) for w in fulls]
    opt = Muon(ps, lr=0.05, weight_decay=0.1, banks=False, distributed_mesh=mesh, **options)
    ref = Muon(refs, lr=0.05, weight_decay=0.1, banks=False, **options)
    same = True
    for step in range(STEPS):
        for p, q, g, (_, d) in zip(ps, refs, grads[step], params):
            p.grad, q.grad = laid(g, d), g.clone()
        opt.step()  # an error fails the launch: the other rank would wait in a collective
        ref.step()
        same &= all(torch.equal(p.full_tensor() if isinstance(p, DTensor) else p, q) for p, q in zip(ps, refs))
    return same


def _worker(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    narrow = {case[0]: _narrow(case, mesh) for case in NARROW}
    follow_group = _load_script()
    out = {(name, scheduler): follow_group.measure(name, d=4, layers=2, scheduler=scheduler, distributed=True)
           for name, scheduler in CASES}

    # the measure can fail: the group handed to the options cache and back at every check of a step
    from ortho_fast.distributed.muon import MuonSharding
    from ortho_fast.groups import muon as group_muon, options

    cache, real = options.OptionsCache(), MuonSharding.check

    def check(self, groups, state, finite=None):
        for group in groups:
            for _ in range(4):  # resolved through another file, four times (every rank alike)
                cache.entry(group, group_muon.MUON_OPTION_KEYS, group_muon.resolve_muon_options)
                real(self, [group], state, finite)

    MuonSharding.check = check
    try:
        out["planted"] = follow_group.measure("muon", d=4, layers=2, distributed=True)
    finally:
        MuonSharding.check = real
    out["narrow"] = narrow
    return out


@pytest.fixture(scope="module")
def counts() -> list[dict]:
    return run_workers(WORLD, _worker, timeout=300, idle_timeout=60)


@pytest.mark.parametrize("rank", range(WORLD))
@pytest.mark.parametrize("name, scheduler", CASES)
def test_a_distributed_step_follows_the_group_through_few_files(counts, rank, name, scheduler):
    out = counts[rank][(name, scheduler)]
    assert out["stays"], "the trace saw no frame holding the group"
    assert any(path.startswith("distributed") for path in out["files"]), out  # the distributed step was traced
    assert len(out["files"]) <= MAX_FILES, out
    assert out["returns"] <= MAX_RETURNS, out


@pytest.mark.parametrize("rank", range(WORLD))
def test_the_count_sees_a_group_passed_back_and_forth(counts, rank):
    assert counts[rank]["planted"]["returns"] > MAX_RETURNS, counts[rank]["planted"]


@pytest.mark.parametrize("rank", range(WORLD))
@pytest.mark.parametrize("name", [case[0] for case in NARROW])
def test_a_non_owner_receives_the_stages_dtype(counts, rank, name):
    assert counts[rank]["narrow"][name] is True, counts[rank]["narrow"][name]
