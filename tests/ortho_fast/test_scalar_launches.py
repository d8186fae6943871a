"""The AdamW and Lion groups of ``HybridOptimizer`` as multi-tensor steps: a fixed number of
launches per (device, dtype) of a group whatever its number of parameters, and no read of the
parameters' device, so that a step with ``check_finite=False`` waits for nothing.

Launches are counted by the CPU proxy ``CountOps`` (benchmarks/_op_count.py: a ``_foreach``
operation on CUDA's fast path counts 1, off it one per tensor); host reads by the aten operations
that wait for the device (``HOST_SYNCS`` of tests/ortho_fast/test_graph_ready.py). AdamW's step
counters are CPU tensors (torch.optim.AdamW's layout) on every device, read on the host without a
device sync; on the meta device, whose tensors hold no data, any read of a parameter-device
tensor raises, so a step that runs there reads none.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import ortho_ref
from ortho_fast import HybridOptimizer
from ortho_fast.functional.scalar import lion_update
from ortho_fast.groups import scalar
from ortho_verify import tolerances as tol
from ortho_verify.tolerances import compiled_tolerance
from tests.load_file import ROOT, load_file
from tests.ortho_fast.helpers import HYBRID_CONFIGS, fill_grads, gpt_model
from tests.ortho_fast.test_graph_ready import HOST_SYNCS, RecordOps

_OP_COUNT = load_file(ROOT / "benchmarks" / "_op_count.py", "_op_count")
CountOps = _OP_COUNT.CountOps

#: Counted operations of an AdamW step per (device, dtype): 8 ``_foreach`` kernels (decay, lerp,
#: β2 scale, addcmul, sqrt, bias correction, ε, addcdiv) and 2 on the CPU step counters (add, stack).
ADAMW_OPS = 10
#: Lion: lerp, sign, lerp, decay, add.
LION_OPS = 5
ALGORITHMS = {"adamw": (scalar.ADAMW_DEFAULTS, scalar.adamw_group_step, ADAMW_OPS),
              "lion": (scalar.LION_DEFAULTS, scalar.lion_group_step, LION_OPS)}


def _params(shapes, dtypes, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64).to(dtype)) for s, dtype in
          zip(shapes, dtypes)]
    return [torch.nn.Parameter(torch.empty_like(p, device=device)) for p in ps] if device != "cpu" else ps


def _later_step(algorithm, ps, **options):
    """Ops counted in the second step of ``algorithm``'s group step over ``ps``."""
    defaults, step, _ = ALGORITHMS[algorithm]
    group, state = {"params": ps, **defaults, **options}, collections.defaultdict(dict)
    for t in range(2):
        for p in ps:
            p.grad = torch.randn_like(p)
        if t == 0:
            step(group, state)
    with CountOps() as counter:
        step(group, state)
    return counter


SHAPE = st.lists(st.integers(1, 6), min_size=0, max_size=3).map(tuple)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
@given(shapes=st.lists(SHAPE, min_size=1, max_size=24), data=st.data())
def test_a_group_step_costs_a_fixed_number_of_launches_per_dtype(algorithm, shapes, data):
    """Property: any number of parameters of any shapes in float32 / float64, weight decay on:
    exactly the fixed count per (device, dtype), every ``_foreach`` operation on CUDA's fast path."""
    dtypes = data.draw(st.lists(st.sampled_from([torch.float32, torch.float64]), min_size=len(shapes),
                                max_size=len(shapes)))
    counter = _later_step(algorithm, _params(shapes, dtypes), weight_decay=0.1)
    assert counter.ops == ALGORITHMS[algorithm][2] * len(set(dtypes)) and not counter.slow_foreach


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_forty_parameters_cost_what_one_does(algorithm):
    """40 parameters against 1 (a step per parameter would cost 40 times as much); without weight
    decay one operation less."""
    one = _later_step(algorithm, _params([(3, 2)], [torch.float32]), weight_decay=0.1).ops
    many = _later_step(algorithm, _params([(3, 2), (5,), (), (2, 2, 2)] * 10, [torch.float32] * 40),
                       weight_decay=0.1).ops
    no_decay = _later_step(algorithm, _params([(5,)] * 40, [torch.float32] * 40), weight_decay=0.0).ops
    assert one == many == ALGORITHMS[algorithm][2] and no_decay == many - 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@given(shapes=st.lists(SHAPE, min_size=1, max_size=6), seed=st.integers(0, 2**16), wd=st.sampled_from([0.0, 0.1]))
def test_lion_group_step_equals_the_single_tensor_update_bitwise(dtype, shapes, seed, wd):
    """Property: three group steps equal ``lion_update`` on each parameter, bit for bit (AdamW:
    tests/ortho_fast/test_scalar.py against torch.optim.AdamW)."""
    ps, ref = _params(shapes, [dtype] * len(shapes), seed=seed), _params(shapes, [dtype] * len(shapes), seed=seed)
    group, state = {"params": ps, **scalar.LION_DEFAULTS, "weight_decay": wd}, collections.defaultdict(dict)
    moments = [torch.zeros_like(p) for p in ref]
    gen = torch.Generator().manual_seed(seed + 1)
    for _ in range(3):
        for p, q in zip(ps, ref):
            p.grad = q.grad = torch.randn(p.shape, generator=gen).to(dtype)
        scalar.lion_group_step(group, state)
        for q, m in zip(ref, moments):
            lion_update(q, q.grad, m, lr=group["lr"], beta1=0.9, beta2=0.99, weight_decay=wd)
    assert all(torch.equal(p, q) and torch.equal(state[p]["exp_avg"], m) for p, q, m in zip(ps, ref, moments))


def test_the_counter_sees_a_step_per_parameter():
    """The bound can fail: the single-tensor updates over 40 parameters count 40 times a group's."""
    ps = _params([(5,)] * 40, [torch.float32] * 40)
    moments = [torch.zeros_like(p) for p in ps]
    with CountOps() as counter:
        for p, m in zip(ps, moments):
            lion_update(p, torch.ones_like(p), m, lr=1e-4, beta1=0.9, beta2=0.99, weight_decay=0.1)
    assert counter.ops == 40 * LION_OPS + 40  # and the 40 ``ones_like``


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_a_group_step_reads_nothing_from_the_parameters_device(algorithm):
    """On the meta device (no data: a read of a parameter-device tensor raises) two group steps
    run; AdamW's step counters are CPU tensors there, as torch.optim.AdamW's on a GPU."""
    defaults, step, _ = ALGORITHMS[algorithm]
    ps = _params([(4, 3), (5,), ()], [torch.float32] * 3, device="meta")
    group, state = {"params": ps, **defaults}, collections.defaultdict(dict)
    for _ in range(2):
        for p in ps:
            p.grad = torch.empty_like(p)
        step(group, state)
    assert all(state[p]["exp_avg"].device.type == "meta" for p in ps)
    if algorithm == "adamw":
        assert all(state[p]["step"].device.type == "cpu" and float(state[p]["step"]) == 2 for p in ps)


def test_a_read_of_a_meta_tensor_raises():
    """The meta check can fail: ``.item()`` and ``.tolist()`` of a meta tensor raise."""
    t = torch.empty(3, device="meta")
    with pytest.raises(RuntimeError):
        t.sum().item()
    with pytest.raises(NotImplementedError):
        t.tolist()


@pytest.mark.parametrize("config", ["muon_adamw", "muon_lion"])
def test_a_later_hybrid_step_reads_nothing_back(config):
    """``HybridOptimizer`` (``MuonConfig().build``, AdamW or Lion groups) with ``check_finite=False``:
    a later step runs no operation that waits for the device, and changes the parameters."""
    model = gpt_model()
    opt = HYBRID_CONFIGS[config]().build(model)
    opt.check_finite = False
    for seed in range(2):
        fill_grads(model, seed)
        before = [p.detach().clone() for p in model.parameters()]
        with RecordOps() as mode:
            opt.step()
    assert not sorted({str(op) for op in mode.ops if op in HOST_SYNCS})
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()) if p.grad is not None)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_a_compiled_group_step_follows_a_scheduler_and_equals_the_eager_one(algorithm):
    """``torch.compile(fullgraph=True)`` (aot_eager) of a ``HybridOptimizer`` step over an AdamW /
    Lion group (the per-tensor operations under compile) against the eager multi-tensor step, an
    lr scheduler changing lr at every step: within ``compiled_tolerance`` and two graphs for four
    steps (the first step's and one with lr an input)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    shapes = [(4, 3), (5,), (), (2, 3)]
    eager_ps, compiled_ps = _params(shapes, [torch.float32] * 4), _params(shapes, [torch.float32] * 4)
    opts = [HybridOptimizer([{"params": ps, "algorithm": algorithm, "weight_decay": 0.1}], check_finite=False)
            for ps in (eager_ps, compiled_ps)]
    schedules = [torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0 / (t + 1)) for opt in opts]
    step = torch.compile(opts[1].step, fullgraph=True, backend="aot_eager")
    for t in range(4):
        gen = torch.Generator().manual_seed(t)
        for p, q in zip(eager_ps, compiled_ps):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        opts[0].step()
        step()
        for schedule in schedules:
            schedule.step()
    worst = max(float((p - q).norm() / p.norm()) for p, q in zip(eager_ps, compiled_ps))
    assert worst <= compiled_tolerance("float32") and counters["stats"]["unique_graphs"] == 2, worst


class Devices(TorchDispatchMode):
    """The devices of every tensor an operation run inside it takes or returns."""

    def __init__(self) -> None:
        super().__init__()
        self.devices: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat = list(args) + list((kwargs or {}).values()) + [out]
        for item in flat:
            for t in (item if isinstance(item, (list, tuple)) else (item,)):
                if isinstance(t, torch.Tensor):
                    self.devices.add(t.device.type)
        return out


@pytest.mark.parametrize("capturable", [False, True])
def test_a_capturable_adamw_step_runs_on_the_parameters_device_only(capturable):
    """``capturable=True`` (torch's option): counters on the parameters' device and every
    operation of a later step there (meta: no host read possible, no CPU tensor involved), so a
    CUDA graph captures all of it; without it the CPU counters take part (the check can fail)."""
    ps = _params([(4, 3), (5,), ()], [torch.float32] * 3, device="meta")
    group, state = {"params": ps, **scalar.ADAMW_DEFAULTS, "capturable": capturable}, collections.defaultdict(dict)
    for t in range(2):
        for p in ps:
            p.grad = torch.empty_like(p)
        scalar.check_adamw_step(group, state, finite=False)
        with Devices() as mode:
            scalar.adamw_group_step(group, state)
    assert mode.devices == ({"meta"} if capturable else {"meta", "cpu"})
    assert all(state[p]["step"].device.type == ("meta" if capturable else "cpu") for p in ps)


@given(seed=st.integers(0, 2**32 - 1), b1=st.floats(0.5, 0.99), b2=st.floats(0.9, 0.9999),
       lr=st.floats(1e-5, 0.1), wd=st.floats(0.0, 0.5), eps=st.sampled_from([0.0, 1e-8, 1e-6]))
def test_a_capturable_adamw_step_matches_the_oracle(seed, b1, b2, lr, wd, eps):
    """Property: float64 parameters and counters, ``capturable=True``: three steps from a
    nonzero state (t = 5) each within ``adamw_tolerances`` of ``ortho_ref.adamw_step`` (the
    bias corrections on the device in the counter's float64)."""
    gen = np.random.default_rng(seed)
    p = torch.nn.Parameter(torch.tensor(gen.standard_normal((4, 3))))
    options = dict(lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    group = {"params": [p], **scalar.ADAMW_DEFAULTS, **options, "capturable": True}
    scalar.normalize_adamw_group(group)
    st_ = {"step": torch.tensor(5.0, dtype=torch.float64), "exp_avg": torch.tensor(gen.standard_normal((4, 3))),
           "exp_avg_sq": torch.tensor(gen.standard_normal((4, 3)) ** 2)}
    state = collections.defaultdict(dict, {p: st_})
    for _ in range(3):
        w, m, v = (x.detach().numpy().copy() for x in (p, st_["exp_avg"], st_["exp_avg_sq"]))
        t = int(st_["step"])
        p.grad = torch.tensor(gen.standard_normal((4, 3)) * 10.0 ** gen.uniform(-3, 3))
        scalar.adamw_group_step(group, state)
        ref = ortho_ref.adamw_step(w, p.grad.numpy(), m, v, t, **options)
        bound = tol.adamw_tolerances(ref, w, p.grad.numpy(), m, lr=lr, betas=(b1, b2), eps=eps, dtype=torch.float64)
        for key, fast, exact in (("weight", p, ref.weight), ("exp_avg", st_["exp_avg"], ref.exp_avg),
                                 ("exp_avg_sq", st_["exp_avg_sq"], ref.exp_avg_sq)):
            assert np.all(np.abs(fast.detach().numpy() - exact) <= bound[key]), key


def test_a_capturable_that_is_not_a_bool_is_named():
    ps = _params([(3,)], [torch.float32])
    ps[0].grad = torch.ones(3)
    group = {"params": ps, **scalar.ADAMW_DEFAULTS, "capturable": "yes"}
    with pytest.raises(ValueError, match=r"^capturable: expected a bool"):
        scalar.check_adamw_step(group, {})
