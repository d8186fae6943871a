"""The fast default Muon step and ``bitwise_torch``: the default stacks same-shape matrices into
one batched Newton–Schulz call (``newton_schulz_stacked``) and is within the oracle's tolerance
(``muon_tolerance`` of ``ortho_ref.muon_step``, bfloat16 Newton–Schulz), not torch's bits;
``bitwise_torch=True`` is bitwise torch.optim.Muon on GPT-like parameter sets with repeated
shapes; ``banks`` overrides the rule either way; both modes compile (fullgraph); the options
are checked naming the key.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_ref
from ortho_fast import Muon
from ortho_fast.functional.muon import (
    decay_weights,
    momentum_into,
    muon_momentum,
    muon_momentum_foreach,
    update_momentum_buffers,
)
from ortho_fast.functional.newton_schulz import newton_schulz_resolved, newton_schulz_stacked
from ortho_fast.groups.muon import resolve_muon_options
from ortho_verify import tolerances as tol
from ortho_verify.tolerances import compiled_tolerance
from tests.ortho_fast.helpers import BASE, gradient_matrix, muon_reference, rng_for

#: a GPT block's 2-D weights at d = 8, twice: fused QKV (tall), attention out, MLP up (tall), down (wide)
GPT_SHAPES = [(24, 8), (8, 8), (32, 8), (8, 32)] * 2


def _weights_and_grads(shapes, seed, steps=3):
    rng = rng_for("fast-path", seed)
    w0 = [torch.tensor(0.02 * rng.standard_normal(s), dtype=torch.float32) for s in shapes]
    grads = [[torch.tensor(gradient_matrix(s, rng), dtype=torch.float32) for s in shapes] for _ in range(steps)]
    return w0, grads


def _run(opt_factory, w0, grads):
    ps = [torch.nn.Parameter(w.clone()) for w in w0]
    opt = opt_factory(ps)
    for step in grads:
        for p, g in zip(ps, step):
            p.grad = g.clone()
        opt.step()
    return ps, opt


def test_bitwise_torch_equals_torch_muon_with_repeated_shapes():
    w0, grads = _weights_and_grads(GPT_SHAPES, "bitwise")
    ref, o_ref = _run(lambda ps: torch.optim.Muon(ps, lr=0.02), w0, grads)
    ours, o_ours = _run(lambda ps: Muon(ps, lr=0.02, bitwise_torch=True), w0, grads)
    for a, b in zip(ref, ours):
        assert torch.equal(a, b)
        assert torch.equal(o_ref.state[a]["momentum_buffer"], o_ours.state[b]["momentum_buffer"])


def test_default_stacks_and_is_within_the_oracle_tolerance():
    """One step from zero momentum: the default stacks same-shape bf16 matrices (``batched``;
    ``bitwise_torch`` does not, so the bitwise test above is not vacuous) and each matrix is
    within ``muon_tolerance`` of ``ortho_ref.muon_step`` for bfloat16 Newton–Schulz; the momenta
    equal torch's (elementwise, same kernels). Whether the stacked weights also equal torch's bits
    depends on the platform's batched kernels: not asserted either way."""
    w0, grads = _weights_and_grads(GPT_SHAPES, "default", steps=1)
    ref, o_ref = _run(lambda ps: torch.optim.Muon(ps, lr=0.02), w0, grads)
    ours, o_ours = _run(lambda ps: Muon(ps, lr=0.02), w0, grads)
    assert resolve_muon_options(o_ours.param_groups[0]).batched
    assert not resolve_muon_options(Muon(ours, lr=0.02, bitwise_torch=True).param_groups[0]).batched
    opts = {**BASE, "weight_decay": 0.1, "momentum": 0.95, "eps_mode": "clamp"}
    for a, b, w, g in zip(ref, ours, w0, grads[0]):
        assert torch.equal(o_ref.state[a]["momentum_buffer"], o_ours.state[b]["momentum_buffer"])
        wi, gi = w.double().numpy(), g.double().numpy()
        oracle, w_tol, _ = muon_reference(wi, gi, np.zeros_like(gi), opts, "bfloat16")
        assert np.linalg.norm(b.detach().double().numpy() - oracle.weight) <= w_tol


@pytest.mark.parametrize("banks, bitwise, batched", [
    (None, False, True), (None, True, False), (False, False, False), (True, True, True)])
def test_banks_overrides_the_default_rule(banks, bitwise, batched):
    """``banks`` None follows ``bitwise_torch`` (bfloat16 Newton–Schulz); False is torch's
    per-matrix path (torch's bits); True batches even with ``bitwise_torch`` (the user asked for it)."""
    w0, grads = _weights_and_grads(GPT_SHAPES, "banks", steps=1)
    ref, _ = _run(lambda ps: torch.optim.Muon(ps, lr=0.02), w0, grads)
    ours, opt = _run(lambda ps: Muon(ps, lr=0.02, banks=banks, bitwise_torch=bitwise), w0, grads)
    assert resolve_muon_options(opt.param_groups[0]).batched == batched
    if not batched:
        assert all(torch.equal(a, b) for a, b in zip(ref, ours))


@settings(deadline=None, max_examples=25)
@given(m=st.integers(1, 24), n=st.integers(1, 24), counts=st.lists(st.integers(1, 3), min_size=1, max_size=3),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 2**32 - 1))
def test_stacked_newton_schulz_is_within_ns_tolerance_per_matrix(m, n, counts, dtype, seed):
    """Any number of (c, m, n) inputs stacked: each matrix within ``ns_tolerance`` of
    ``ortho_ref.ns_map`` of its own (the stack shares no normalization between matrices)."""
    rng = np.random.default_rng(seed)
    scales = 10.0 ** rng.uniform(-3, 3, size=sum(counts))  # each matrix its own size
    mats, k = [], 0
    for c in counts:
        mats.append(torch.stack([torch.from_numpy(gradient_matrix((m, n), rng, scale=scales[k + j]))
                                 for j in range(c)]))
        k += c
    table = ortho_ref.schedule("jordan")
    outs = newton_schulz_stacked(mats, table, safety=1.0, eps=1e-7, eps_mode="add", compute_dtype=dtype)
    for x, o in zip(mats, outs):
        assert o.shape == x.shape and o.dtype == dtype
        for a, b in zip(x.numpy(), o.double().numpy()):
            exact = ortho_ref.ns_map(a, table, safety=1.0, eps=1e-7)
            bound = tol.ns_tolerance(ortho_ref.normalized_singular_values(a, eps=1e-7), table, a.shape, str(dtype))
            assert np.linalg.norm(b - exact) <= bound


def test_stacked_equals_one_batched_call_and_overflow_is_safe():
    """``newton_schulz_stacked`` on several inputs is bitwise the batched ``newton_schulz`` of their
    concatenation; a float32 input with entries of 1e30 (‖U‖_F² overflows) gives the same bits as
    the input scaled down by a power of two."""
    rng = np.random.default_rng(3)
    mats = [torch.from_numpy(rng.standard_normal((c, 6, 10))).float() for c in (1, 2)]
    table = ortho_ref.schedule("jordan")
    kw = dict(safety=1.0, eps=1e-7, eps_mode="clamp", compute_dtype=torch.bfloat16)
    outs = newton_schulz_stacked(mats, table, **kw)
    whole = newton_schulz_resolved(torch.cat(mats), table, **kw)
    assert torch.equal(torch.cat(outs), whole)
    huge = newton_schulz_stacked([m * 2.0**100 for m in mats], table, **kw)
    assert all(torch.equal(a, b) for a, b in zip(huge, outs))


def test_foreach_momentum_and_decay_are_bitwise_the_per_tensor_ops():
    rng = rng_for("foreach")
    grads = [torch.tensor(rng.standard_normal(s), dtype=torch.float32) for s in GPT_SHAPES]
    for style in ("ema", "classic"):
        for nesterov in (True, False):
            bufs_a = [torch.tensor(rng.standard_normal(g.shape), dtype=torch.float32) for g in grads]
            bufs_b = [b.clone() for b in bufs_a]
            us = muon_momentum_foreach(grads, bufs_a, mu=0.9, nesterov=nesterov, style=style)
            for g, a, b, u in zip(grads, bufs_a, bufs_b, us):
                assert torch.equal(u, muon_momentum(g, b, mu=0.9, nesterov=nesterov, style=style))
                assert torch.equal(a, b)
    ws = [g.clone() for g in grads]
    decay_weights(ws, lr=0.02, weight_decay=0.1)
    assert all(torch.equal(w, g.clone().mul_(1 - 0.02 * 0.1)) for w, g in zip(ws, grads))
    with pytest.raises(ValueError, match="style"):
        muon_momentum_foreach(grads, bufs_a, mu=0.9, nesterov=True, style="adam")


@pytest.mark.parametrize("mode", [{"banks": True}, {"bitwise_torch": True}], ids=["stacked", "bitwise"])
def test_both_paths_compile_fullgraph_and_equal_eager(mode):
    """The stacked path (forced in float32 by ``banks=True``: the default stacks in bfloat16, whose
    compiled roundings are not float32's) and torch's per-matrix path, compiled with inductor."""
    torch._dynamo.reset()
    w0, grads = _weights_and_grads(GPT_SHAPES[:4] + GPT_SHAPES[:2], "compile")
    eager, _ = _run(lambda ps: Muon(ps, lr=0.02, dtype=torch.float32, check_finite=False, **mode), w0, grads)
    ps = [torch.nn.Parameter(w.clone()) for w in w0]
    opt = Muon(ps, lr=0.02, dtype=torch.float32, check_finite=False, **mode)
    step = torch.compile(opt.step, fullgraph=True, backend="inductor")
    for gs in grads:
        for p, g in zip(ps, gs):
            p.grad = g.clone()
        step()
    worst = max(float((a.detach() - b.detach()).norm() / b.detach().norm()) for a, b in zip(ps, eager))
    assert worst <= compiled_tolerance("float32"), worst


def test_default_stacks_only_in_half_precision():
    """The rule of ``MuonOptions.batched``: float32 / float64 Newton–Schulz keeps the per-matrix
    path by default (no measurable gain there), so with ``gram=False`` it is the ``bitwise_torch``
    step bit for bit; ``gram=None`` (the default) changes exactly the matrices with aspect ratio
    >= 2 (Gram Newton–Schulz)."""
    w0, grads = _weights_and_grads(GPT_SHAPES, "float32", steps=2)
    for dtype in (torch.float32, None):
        a, _ = _run(lambda ps: Muon(ps, lr=0.02, dtype=dtype, gram=False), w0, grads)
        b, _ = _run(lambda ps: Muon(ps, lr=0.02, dtype=dtype, bitwise_torch=True), w0, grads)
        c, _ = _run(lambda ps: Muon(ps, lr=0.02, dtype=dtype, banks=True, gram=False), w0, grads)
        d, _ = _run(lambda ps: Muon(ps, lr=0.02, dtype=dtype), w0, grads)
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        assert not all(torch.equal(x, y) for x, y in zip(a, c))
        for x, y, w in zip(a, d, w0):
            rectangular = max(w.shape) >= 2 * min(w.shape)
            assert torch.equal(x, y) != rectangular, w.shape


@pytest.mark.parametrize("kw, key",
                         [({"bitwise_torch": 1}, "bitwise_torch"), ({"bitwise_torch": None}, "bitwise_torch"),
                                     ({"banks": "yes"}, "banks"), ({"banks": 0}, "banks")])
def test_bad_mode_options_name_the_key(kw, key):
    with pytest.raises(TypeError, match=key):
        Muon([torch.nn.Parameter(torch.zeros(4, 4))], **kw)
    opt = Muon([torch.nn.Parameter(torch.zeros(4, 4))])
    opt.param_groups[0].update(kw)
    opt.param_groups[0]["params"][0].grad = torch.ones(4, 4)
    with pytest.raises(TypeError, match=key):
        opt.step()
    assert torch.equal(opt.param_groups[0]["params"][0].detach(), torch.zeros(4, 4))


@pytest.mark.parametrize("style", ["ema", "classic"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_momentum_written_into_a_stack_is_bitwise_the_per_tensor_ops(style, nesterov):
    """The stacked step's momentum (buffers updated with ``update_momentum_buffers``, U written into
    one stack with ``momentum_into``) gives ``muon_momentum``'s buffers and U bit for bit."""
    rng = rng_for("stack-momentum")
    shapes = GPT_SHAPES[:2] * 3  # (24, 8) and (8, 8) interleaved: the stack holds every entry in order
    grads = [torch.tensor(rng.standard_normal(s), dtype=torch.float32) for s in shapes]
    bufs_a = [torch.tensor(rng.standard_normal(s), dtype=torch.float32) for s in shapes]
    bufs_b = [b.clone() for b in bufs_a]
    stack = torch.full((sum(g.numel() for g in grads),), float("nan"))
    views, start = [], 0
    for g in grads:
        views.append(stack[start:start + g.numel()].view(g.shape))
        start += g.numel()
    update_momentum_buffers(grads, bufs_a, mu=0.9, style=style)
    momentum_into(views, grads, bufs_a, mu=0.9, nesterov=nesterov, style=style)
    for g, a, b, v in zip(grads, bufs_a, bufs_b, views):
        assert torch.equal(v, muon_momentum(g, b, mu=0.9, nesterov=nesterov, style=style))
        assert torch.equal(a, b)


def test_chunks_of_a_shape_group_step_as_one_stack(monkeypatch):
    """Cutting a shape group into chunks of ``MAX_STACK_ELEMENTS`` entries (here at most 2 matrices
    of (24, 8): four chunks) changes which matrices share a batched call, not what each matrix
    gets: every batched product computes each matrix on its own, so the parameters are bit for
    bit those of the one-stack step (and every one of them moved)."""
    import ortho_fast.groups.muon as group_muon

    shapes = [(24, 8), (24, 8), (8, 8)] * 3 + [(24, 8)] * 2  # (24, 8): 8, four chunks of 2
    w0, grads = _weights_and_grads(shapes, "chunks")
    whole, opt = _run(lambda ps: Muon(ps, lr=0.02), w0, grads)
    monkeypatch.setattr(group_muon, "MAX_STACK_ELEMENTS", 2 * 24 * 8)
    chunked, small = _run(lambda ps: Muon(ps, lr=0.02), w0, grads)
    assert small.workspace_nbytes < opt.workspace_nbytes
    for a, b, w in zip(chunked, whole, w0):
        assert not torch.equal(a, w) and torch.equal(a, b), tuple(w.shape)
