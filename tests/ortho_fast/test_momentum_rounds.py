"""The stacked step's momentum write in rounds (``functional.muon.momentum_into`` with ``free``,
``stacked.momentum_rounds``) against the per-matrix write it replaces: the bits of one
``torch.lerp(G, M, μ, out=U)`` / ``torch.add(G, M, alpha=μ, out=U)`` per matrix (U computed in the
gradients' dtype, rounded once into the bfloat16 stack), in fewer CUDA launches as the CPU proxy
counts them (benchmarks/_op_count.py), with no memory beyond the workspace the step already holds
(``stacked.Workspace.spare``: the bytes after the momentum stack, free before Newton–Schulz).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

import ortho_fast
import ortho_fast.functional.muon as muon_math
from ortho_fast.functional import stacked
from ortho_fast.functional.muon import momentum_into, split_stack
from ortho_fast.functional.stacked import Workspace
from tests.load_file import ROOT, load_file

_OP_COUNT = load_file(ROOT / "benchmarks" / "_op_count.py", "_op_count")
CountOps = _OP_COUNT.CountOps

CPU = torch.device("cpu")


def per_matrix_u(out_dtype, grads, bufs, *, mu, nesterov, style):
    """The write the rounds replace, one call per matrix (U of the gradients' dtype rounded once)."""
    out = [torch.empty(g.shape, dtype=out_dtype) for g in grads]
    for o, g, b in zip(out, grads, bufs):
        if not nesterov:
            o.copy_(b)
        elif style == "ema":
            torch.lerp(g, b, mu, out=o)
        else:
            torch.add(g, b, alpha=mu, out=o)
    return out


def chunk(counts, m, n, grad_dtype, out_dtype, extra, seed):
    """A workspace laid out as the stacked step's: the (k, m, n) momentum stack of ``out_dtype``
    first, then ``extra`` spare bytes (filled with NaN bytes: a round must not read stale
    scratch); gradients and buffers of shapes (c, m, n) / (m, n) per count c, of ``grad_dtype``."""
    gen = torch.Generator().manual_seed(seed)
    like = [torch.empty((c, m, n) if c > 1 else (m, n)) for c in counts]
    k = sum(counts)
    workspace = Workspace()
    workspace.reserve(-(-k * m * n * out_dtype.itemsize // stacked.ALIGN) * stacked.ALIGN + extra, CPU)
    u = workspace.get("momentum", (k, m, n), out_dtype, CPU)
    u.fill_(float("nan"))
    free = workspace.spare(CPU)
    free.fill_(0xFF)  # NaN in float32 / bfloat16
    grads = [(torch.randn(t.shape, generator=gen) * 3).to(grad_dtype) for t in like]
    bufs = [(torch.randn(t.shape, generator=gen) * 3).to(grad_dtype) for t in like]
    return u, split_stack(u, like), free, grads, bufs


@given(st.lists(st.integers(1, 3), min_size=1, max_size=10), st.integers(1, 9), st.integers(1, 9),
       st.sampled_from(["ema", "classic"]), st.booleans(), st.sampled_from([torch.float32, torch.bfloat16]),
       st.sampled_from([0.0, 0.5, 0.9, 0.95, 0.3]), st.integers(0, 4 * 30 * 81 + 1024), st.integers(0, 2**16))
def test_the_write_in_rounds_has_the_bits_of_the_per_matrix_write(counts, m, n, style, nesterov, grad_dtype, mu,
                                                                  extra, seed):
    """Property: for any chunk (odd shapes, parameters of one or several matrices, any spare bytes
    from none to more than the whole chunk in float32), ``momentum_into`` with the workspace's
    spare bytes writes the bits of the per-matrix write into the bfloat16 stack, for both
    momentum styles, with and without Nesterov, float32 and bfloat16 gradients; it changes
    neither gradients nor buffers, and never launches more than the per-matrix write (one launch
    per parameter), and fewer where the spare bytes hold four parameters' U in the gradients'
    dtype (three launches a round)."""
    u, views, free, grads, bufs = chunk(counts, m, n, grad_dtype, torch.bfloat16, extra, seed)
    grads0, bufs0 = [g.clone() for g in grads], [b.clone() for b in bufs]
    expected = per_matrix_u(torch.bfloat16, grads, bufs, mu=mu, nesterov=nesterov, style=style)
    with CountOps() as counter:
        momentum_into(views, grads, bufs, mu=mu, nesterov=nesterov, style=style, free=free)
    for v, e, g, g0, b, b0 in zip(views, expected, grads, grads0, bufs, bufs0):
        assert torch.equal(v.view(torch.int16), e.view(torch.int16))  # bits, NaN-safe
        assert torch.equal(g, g0) and torch.equal(b, b0)
    per_matrix = len(counts) if grad_dtype != torch.bfloat16 and nesterov else (1 if not nesterov else 2)
    assert counter.ops <= per_matrix
    fits = free.numel() // (max(counts) * m * n * grad_dtype.itemsize)  # parameters the first round holds
    if nesterov and grad_dtype == torch.float32 and len(counts) >= 4 and fits >= 4:
        assert counter.ops < len(counts)


@pytest.mark.parametrize("style", ["ema", "classic"])
def test_a_chunk_in_its_own_workspace_writes_u_in_two_rounds(style):
    """12 fused-QKV matrices (96, 32) in exactly their chunk's workspace (``chunk_nbytes``: the
    momentum stack, the second stack and the polynomial): the spare bytes hold 8 of the 12 float32
    U (12·3072·2 + 12·1024·2 bytes), so two rounds, 6 launches where the per-matrix write was 12."""
    k, m, n = 12, 96, 32
    workspace = Workspace()
    workspace.reserve(stacked.chunk_nbytes(k, m, n, None, torch.bfloat16), CPU)
    u = workspace.get("momentum", (k, m, n), torch.bfloat16, CPU)
    free = workspace.spare(CPU)
    assert free.numel() == stacked.chunk_nbytes(k, m, n, None, torch.bfloat16) - k * m * n * 2
    gen = torch.Generator().manual_seed(5)
    grads = [torch.randn(m, n, generator=gen) for _ in range(k)]
    bufs = [torch.randn(m, n, generator=gen) for _ in range(k)]
    expected = per_matrix_u(torch.bfloat16, grads, bufs, mu=0.95, nesterov=True, style=style)
    with CountOps() as counter:
        momentum_into(list(u.unbind(0)), grads, bufs, mu=0.95, nesterov=True, style=style, free=free)
    assert all(torch.equal(o, e) for o, e in zip(u.unbind(0), expected))
    assert counter.ops == 6


@pytest.mark.parametrize("spare_matrices, launches", [(4, 3 + 2), (3, 6), (6, 3)])
def test_matrices_after_the_last_round_keep_their_own_write(spare_matrices, launches):
    """6 matrices (8, 4), spare bytes for ``spare_matrices`` float32 U (128 bytes each): a round of
    4 or more costs 3 launches and the 2 matrices after it one each (5); spare bytes for 3 make no
    round (6, the per-matrix write); for all 6 one round (3). The bits of the per-matrix write."""
    k, m, n = 6, 8, 4
    workspace = Workspace()
    workspace.reserve(stacked.ALIGN + spare_matrices * m * n * 4, CPU)  # the stack: 384 bytes, aligned to 512
    u = workspace.get("momentum", (k, m, n), torch.bfloat16, CPU)
    u.fill_(float("nan"))
    gen = torch.Generator().manual_seed(7)
    grads = [torch.randn(m, n, generator=gen) for _ in range(k)]
    bufs = [torch.randn(m, n, generator=gen) for _ in range(k)]
    expected = per_matrix_u(torch.bfloat16, grads, bufs, mu=0.9, nesterov=True, style="ema")
    with CountOps() as counter:
        momentum_into(list(u.unbind(0)), grads, bufs, mu=0.9, nesterov=True, style="ema", free=workspace.spare(CPU))
    assert all(torch.equal(o, e) for o, e in zip(u.unbind(0), expected))
    assert counter.ops == launches


def test_spare_bytes_leave_the_frame_unchanged():
    """``spare`` is the pool after the frame's buffers, and asking for it moves no later buffer:
    "stack_b" is placed where it is without it (the same address every step)."""
    plain, asked = Workspace(), Workspace()
    for workspace in (plain, asked):
        workspace.reserve(stacked.chunk_nbytes(5, 7, 3, None, torch.bfloat16), CPU)
        workspace.get("momentum", (5, 7, 3), torch.bfloat16, CPU)
    free = asked.spare(CPU)
    pool_end = asked.data_ptrs()[0] + asked.nbytes
    assert free.data_ptr() == asked.data_ptrs()[0] + stacked.ALIGN and free.data_ptr() + free.numel() == pool_end
    b_plain = plain.get("stack_b", (5, 7, 3), torch.bfloat16, CPU)
    b_asked = asked.get("stack_b", (5, 7, 3), torch.bfloat16, CPU)
    assert b_asked.data_ptr() - asked.data_ptrs()[0] == b_plain.data_ptr() - plain.data_ptrs()[0]
    assert asked.nbytes == plain.nbytes and Workspace().spare(CPU) is None


def test_no_rounds_in_bytes_shared_with_the_destination_or_a_gradient():
    """Spare bytes that overlap the stack written or a gradient are refused (the per-matrix write
    runs, with its bits, and the gradient keeps its values)."""
    k, m, n = 8, 4, 4
    pool = torch.zeros(4 * k * m * n * 4, dtype=torch.uint8)
    u = pool[:k * m * n * 2].view(torch.bfloat16).view(k, m, n)
    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(m, n, generator=gen) for _ in range(k)]
    bufs = [torch.randn(m, n, generator=gen) for _ in range(k)]
    keep = list(u.unbind(0)) + grads + bufs
    assert stacked.momentum_rounds(pool, grads, keep) is None
    assert stacked.momentum_rounds(grads[3].view(-1).view(torch.uint8), grads, keep) is None
    assert stacked.momentum_rounds(bufs[5].view(-1).view(torch.uint8), grads, keep) is None
    assert stacked.momentum_rounds(pool[k * m * n * 2:], grads, keep) is not None
    grads0 = [g.clone() for g in grads]
    expected = per_matrix_u(torch.bfloat16, grads, bufs, mu=0.9, nesterov=True, style="ema")
    momentum_into(list(u.unbind(0)), grads, bufs, mu=0.9, nesterov=True, style="ema", free=pool)
    assert all(torch.equal(o, e) for o, e in zip(u.unbind(0), expected))
    assert all(torch.equal(g, g0) for g, g0 in zip(grads, grads0))


def _steps(build, steps=3, d=16):
    gen = torch.Generator().manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s, generator=gen))
          for s in [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)] * 6]
    opt = build(ps)
    for _ in range(steps):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    return [p.detach().clone() for p in ps], opt


BUILDS = {
    "muon": lambda ps: ortho_fast.Muon(ps, lr=0.02),
    "muon_classic": lambda ps: ortho_fast.Muon(ps, lr=0.02, momentum_style="classic", check_finite=False),
    "normuon_nesterov": lambda ps: ortho_fast.NorMuon(ps, lr=0.02, nesterov=True),
}


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_the_stacked_step_with_rounds_has_the_bits_of_the_per_matrix_write(name, monkeypatch):
    """Three steps of a GPT's 24 matrices: the parameters bit for bit those of the step whose
    momentum is written per matrix (``Workspace.spare`` giving nothing), the rounds having run."""
    calls = []
    real = muon_math.momentum_rounds
    monkeypatch.setattr(muon_math, "momentum_rounds", lambda *a: calls.append(1) or real(*a))
    with_rounds, opt = _steps(BUILDS[name])
    assert calls
    monkeypatch.setattr(Workspace, "spare", lambda self, device: None)
    per_matrix, plain = _steps(BUILDS[name])
    assert all(torch.equal(a, b) for a, b in zip(with_rounds, per_matrix))
    assert opt.workspace_nbytes == plain.workspace_nbytes


def test_bitwise_torch_steps_never_write_u_in_rounds(monkeypatch):
    """``bitwise_torch=True`` keeps torch.optim.Muon's per-matrix calls: no round is planned, and
    the parameters are torch.optim.Muon's bit for bit."""
    calls = []
    monkeypatch.setattr(muon_math, "momentum_rounds", lambda *a: calls.append(1))
    ours, _ = _steps(lambda ps: ortho_fast.Muon(ps, lr=0.02, bitwise_torch=True))
    theirs, _ = _steps(lambda ps: torch.optim.Muon(ps, lr=0.02))
    assert not calls and all(torch.equal(a, b) for a, b in zip(ours, theirs))
