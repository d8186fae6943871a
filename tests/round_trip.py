"""The checkpoint round trip shared by the optimizer tests: k steps, ``state_dict``, load into a
fresh optimizer on cloned parameters, continue — against the uninterrupted run."""

from __future__ import annotations

import copy

import torch


def run_steps(params, opt, grads, dtype=None) -> None:
    """One ``opt.step()`` per entry of ``grads`` (per-parameter arrays or tensors, as ``dtype``)."""
    for step in grads:
        for p, g in zip(params, step):
            p.grad = torch.as_tensor(g, dtype=dtype).clone()
        opt.step()


def round_trip(make_opt, w0, grads, *, dtype=None, split: int = 2):
    """Run ``make_opt`` over all ``grads`` from weights ``w0``, and again with a save after
    ``split`` steps and a load into a fresh optimizer on cloned parameters.
    Returns ((params, opt) uninterrupted, (params, opt) resumed)."""
    def fresh():
        return [torch.nn.Parameter(torch.as_tensor(w, dtype=dtype).clone()) for w in w0]

    pa = fresh()
    oa = make_opt(pa)
    run_steps(pa, oa, grads, dtype)
    pb = fresh()
    ob = make_opt(pb)
    run_steps(pb, ob, grads[:split], dtype)
    saved = copy.deepcopy(ob.state_dict())
    pc = [torch.nn.Parameter(p.detach().clone()) for p in pb]
    oc = make_opt(pc)
    oc.load_state_dict(saved)
    run_steps(pc, oc, grads[split:], dtype)
    return (pa, oa), (pc, oc)


def assert_bitwise_same(run_a, run_b) -> None:
    """Parameters, state keys and every state tensor of two (params, opt) runs are bitwise equal."""
    (pa, oa), (pb, ob) = run_a, run_b
    for a, b in zip(pa, pb, strict=True):
        assert torch.equal(a, b)
        assert set(oa.state[a]) == set(ob.state[b])
        for k, v in oa.state[a].items():
            assert torch.equal(v, ob.state[b][k]) if isinstance(v, torch.Tensor) else v == ob.state[b][k], k
