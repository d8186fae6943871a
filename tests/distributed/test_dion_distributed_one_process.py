"""Dion's distributed API without a process group: the communication volumes of the Dion paper's
Table 1 (``dion_comm_volume``, and its errors), ``init_state()`` creating exactly the first
step's state, ``synchronize_for_checkpoint()`` a no-op in one process, and deepcopy / pickle
keeping the seed and the (empty) distributed plan. The sharded runs: test_dion_distributed.py.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch

import ortho_fast
from ortho_fast.distributed.volumes import dion_comm_volume
from ortho_fast.functional.dion import initial_q
from tests.distributed.dion_workers import F64, LR, SEED, seeded_tensor


def test_table1_volumes():
    """The Dion paper's Table 1 cases: data-parallel (m + n)·r, weight sharding over the working
    columns (m + 1)·r; rows sharded with CholeskyQR2: 2r² + n·r."""
    assert sum(dion_comm_volume(64, 32, 8, replicas=4).values()) == (64 + 32) * 8
    assert sum(dion_comm_volume(32, 64, 8, row_shards=(4,)).values()) == (64 + 1) * 8
    assert dion_comm_volume(64, 32, 8, row_shards=(4,), qr_method="cholesky_qr") == {"gram": 2 * 64, "R": 32 * 8}
    assert dion_comm_volume(64, 32, 8, replicas=4, replicate_mesh_grad_sync=False) == {}
    with pytest.raises(ValueError, match="r <= min"):
        dion_comm_volume(4, 3, 5)
    # Dion's aliases mean the same method; an unknown method or a count that is no count is an error
    assert dion_comm_volume(64, 32, 8, row_shards=(4,), qr_method="rcqr") == dion_comm_volume(
        64, 32, 8, row_shards=(4,), qr_method="randomized_cholesky_qr") == {"sketch": 10 * 8, "gram": 64, "finite": 1,
                                                                             "R": 32 * 8}
    for kwargs, name in ((dict(qr_method="cqr"), "qr_method"), (dict(right_factor="norm"), "right_factor"),
                         (dict(power_iters=0), "power_iters"), (dict(oversample=0.5), "oversample")):
        with pytest.raises(ValueError, match=f"^{name}:"):
            dion_comm_volume(64, 32, 8, row_shards=(4,), **kwargs)


def test_init_state_one_process():
    """init_state() creates exactly the state the first step creates (with and without a grad,
    no parameter change); the run after it is bitwise the run without it;
    synchronize_for_checkpoint() is a no-op in one process."""
    shapes = ((6, 4), (3, 7))

    def make():
        params = [torch.nn.Parameter(seeded_tensor(("init", i), s, F64)) for i, s in enumerate(shapes)]
        return params, ortho_fast.Dion(params, lr=LR, seed=SEED, rank_fraction=0.5)

    pa, oa = make()
    pb, ob = make()
    ob.init_state()
    assert all(torch.equal(a, b) for a, b in zip(pa, pb))
    for i, (p, q_shape) in enumerate(zip(pb, ((4, 2), (3, 2)))):
        st = ob.state[p]
        assert torch.equal(st["Q"], initial_q(q_shape, SEED, i, F64, "cpu"))
        assert torch.equal(st["momentum"], torch.zeros_like(p)) and int(st["step"]) == 0
    ob.synchronize_for_checkpoint()
    for step in range(2):
        for params in (pa, pb):
            for i, p in enumerate(params):
                p.grad = seeded_tensor(("init-g", i, step), p.shape, F64)
        oa.step()
        ob.step()
    for a, b in zip(pa, pb):
        assert torch.equal(a, b)
        assert all(torch.equal(oa.state[a][k], ob.state[b][k]) for k in ("momentum", "Q", "step"))


def test_deepcopy_and_pickle_step_as_the_original():
    """copy.deepcopy / pickle keep the seed and the (one-process: empty) distributed plan, which
    torch's Optimizer.__getstate__ drops: the copies step bitwise as the original."""
    params = [torch.nn.Parameter(seeded_tensor(("copy", i), s, F64)) for i, s in enumerate(((6, 4), (3, 7)))]
    opt = ortho_fast.Dion(params, lr=LR, seed=SEED, rank_fraction=0.5, qr_method="randomized_cholesky_qr")
    for step in range(2):
        for i, p in enumerate(params):
            p.grad = seeded_tensor(("copy-g", i, step), p.shape, F64)
        if step == 1:
            buffer = io.BytesIO()
            torch.save(opt, buffer)
            copies = [copy.deepcopy(opt), torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)]
        opt.step()
    for copied in copies:
        assert copied.seed == SEED
        mine = [p for g in copied.param_groups for p in g["params"]]
        for a, b in zip(params, mine):
            b.grad = a.grad.clone()
        copied.step()
        assert all(torch.equal(a, b) for a, b in zip(params, mine))
        assert all(torch.equal(opt.state[a][k], copied.state[b][k]) for a, b in zip(params, mine)
                   for k in ("momentum", "Q", "step"))
