"""Production use: the step compiles with ``torch.compile(fullgraph=True)`` (CPU inductor here; the
same code on CUDA) and equals the eager step; a step reads the device at most once (the fused
finiteness check), and not at all with ``check_finite=False``.

Host syncs are counted as calls of ``aten._local_scalar_dense`` — the op behind ``.item()``,
``bool(t)``, ``float(t)`` — under a ``TorchDispatchMode``.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ortho_fast
from ortho_verify.tolerances import compiled_tolerance


class CountSyncs(TorchDispatchMode):
    """Counts the device reads (``aten._local_scalar_dense``) of the operations run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _params(shapes, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64).to(dtype)) for s in shapes]
    return ps


def _grads(ps, seed):
    gen = torch.Generator().manual_seed(seed)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype)


SHAPES = [(24, 16), (16, 40), (24, 16), (8, 8)]


def _builders(dtype):
    """name -> (shapes, build(params, check_finite) -> optimizer); nothing is called before compiling
    (the state is created by ``_init_group``, which dynamo runs outside the graph)."""
    def muon(ps, check_finite):
        return ortho_fast.Muon(ps, lr=0.02, dtype=dtype, check_finite=check_finite)

    def dion(ps, check_finite):
        return ortho_fast.Dion(ps, lr=0.02, rank_fraction=0.5, check_finite=check_finite)

    def hybrid(ps, check_finite):
        groups = [{"params": ps[:2], "algorithm": "muon", "dtype": dtype},
                  {"params": ps[2:4], "algorithm": "dion", "rank_fraction": 0.5},
                  {"params": ps[4:], "algorithm": "lion"}]
        return ortho_fast.HybridOptimizer(groups, check_finite=check_finite)

    def normuon(ps, check_finite):
        return ortho_fast.NorMuon(ps, lr=0.02, dtype=dtype, check_finite=check_finite)

    def dion2(ps, check_finite):
        return ortho_fast.Dion2(ps, lr=0.02, dtype=dtype, check_finite=check_finite)

    def muon_cautious(ps, check_finite):  # every parameter takes the rest step, in budgeted batches
        return ortho_fast.Muon(ps, lr=0.02, dtype=dtype, check_finite=check_finite, cautious_weight_decay=True)

    return {"muon": (SHAPES, muon), "muon_cautious": (SHAPES, muon_cautious), "dion": (SHAPES, dion),
            "hybrid": (SHAPES + [(7,), (3, 5)], hybrid),
            "normuon": (SHAPES, normuon), "dion2": (SHAPES, dion2)}


def _state(opt):
    return [t.detach().clone() for group in opt.param_groups for p in group["params"]
            for t in (p, *(v for v in opt.state[p].values() if torch.is_tensor(v) and v.is_floating_point()))]


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    scale = torch.linalg.vector_norm(b).item()
    return torch.linalg.vector_norm(a - b).item() / (scale if scale > 0 else 1.0)


def _compiled_from_the_first_step(name, backend):
    """Eager and compiled (fullgraph, from the first step: nothing called before) copies stepped 3
    times in float32 (float32 Newton–Schulz): (worst relative difference of parameters and state,
    worst relative difference of the displacement ‖W_c − W_e‖ / ‖W_e − W_0‖, graphs compiled)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    dtype = torch.float32
    shapes, build = _builders(dtype)[name]
    eager_ps, compiled_ps = _params(shapes, dtype), _params(shapes, dtype)
    start = [p.detach().clone() for p in eager_ps]
    eager, compiled = build(eager_ps, False), build(compiled_ps, False)
    step = torch.compile(compiled.step, fullgraph=True, backend=backend)
    for t in range(3):
        _grads(eager_ps, t)
        _grads(compiled_ps, t)
        eager.step()
        step()
    worst = max(_relative(c, e) for c, e in zip(_state(compiled), _state(eager)))
    moved = max(_relative(c - w, e - w) for c, e, w in zip(compiled_ps, eager_ps, start))
    return worst, moved, counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("name",
                         ["dion", *(pytest.param(n, marks=pytest.mark.slow) for n in ("muon", "dion2", "hybrid"))])
def test_compiled_step_equals_eager_step(name):
    """fullgraph inductor on CPU from the first step (Dion's Q0 and every state created by
    ``_init_group`` outside the graph), float32 end to end, three steps, one graph. The state is
    held to ``compiled_tolerance`` relative to its size; the displacement W − W_0 too, relative to
    its own size (stricter: the weights' rounding, u‖W‖ per step, is then a part of it)."""
    worst, moved, graphs = _compiled_from_the_first_step(name, "inductor")
    assert worst <= compiled_tolerance("float32") and moved <= compiled_tolerance("float32"), (worst, moved)
    assert graphs == 1, graphs


def test_a_planted_difference_is_caught():
    """The comparison can fail: the compiled twin with a 1e-4 larger lr."""
    torch._dynamo.reset()
    shapes, build = _builders(torch.float32)["dion2"]
    eager_ps, compiled_ps = _params(shapes, torch.float32), _params(shapes, torch.float32)
    start = [p.detach().clone() for p in eager_ps]
    eager, compiled = build(eager_ps, False), build(compiled_ps, False)
    compiled.param_groups[0]["lr"] *= 1 + 1e-4
    step = torch.compile(compiled.step, fullgraph=True, backend="eager")
    _grads(eager_ps, 0)
    _grads(compiled_ps, 0)
    eager.step()
    step()
    assert max(_relative(c - w, e - w) for c, e, w in zip(compiled_ps, eager_ps, start)) > compiled_tolerance("float32")


def _instances_before_the_recompile_limit(make, trials: int = 10) -> int:
    """Build a new optimizer per trial (a sweep), compile its step (fullgraph, eager backend: the
    limit is dynamo's, whatever the backend) and step it 3 times; the trials that ran before
    dynamo's recompile limit stopped one."""
    torch._dynamo.reset()
    for trial in range(trials):
        ps = _params([(16, 8), (8, 8)], torch.float32, trial)
        step = torch.compile(make(ps).step, fullgraph=True, backend="eager")
        try:
            for t in range(3):
                _grads(ps, t)
                step()
        except Exception as error:  # torch._dynamo.exc.FailOnRecompileLimitHit
            assert "recompile" in type(error).__name__.lower() or "recompile" in str(error).lower(), error
            return trial
    return trials


@pytest.mark.slow
@pytest.mark.parametrize("name", ["Muon", "Dion", "Dion2", "HybridOptimizer"])
def test_a_sweep_compiles_as_many_optimizers_as_torch(name):
    """One graph per optimizer, as torch.optim.Muon: the state exists before the first trace."""
    ours = _instances_before_the_recompile_limit(
        lambda ps: getattr(ortho_fast, name)(ps if name != "HybridOptimizer" else [{"params": ps, "algorithm": "muon"}],
                                             check_finite=False))
    theirs = _instances_before_the_recompile_limit(lambda ps: torch.optim.Muon(ps, lr=0.02))
    assert ours >= theirs >= 7, (ours, theirs)


def _count(opt) -> int:
    with CountSyncs() as mode:
        opt.step()
    return mode.count


@pytest.mark.parametrize("name", ["muon", "dion", "hybrid"])
@pytest.mark.parametrize("copies", [1, 3])
def test_a_step_reads_the_device_once_or_never(name, copies):
    """One fused finiteness check per step whatever the number of parameters (``check_finite``
    default), none with ``check_finite=False``; the steps still run (the state changes)."""
    shapes, build = _builders(torch.float32)[name]
    for check_finite, expected in ((True, 1), (False, 0)):
        ps = _params(shapes * copies if name != "hybrid" else shapes, torch.float32)
        opt = build(ps, check_finite)
        _grads(ps, 1)
        before = _state(opt)
        assert _count(opt) == expected, (check_finite, copies)
        assert any(not torch.equal(a, b) for a, b in zip(before, _state(opt)))


def test_a_nonfinite_gradient_is_still_named_with_one_read():
    ps = _params(SHAPES, torch.float32)
    opt = ortho_fast.Muon(ps, lr=0.02)
    _grads(ps, 2)
    ps[2].grad[3, 4] = float("nan")
    snapshot = copy.deepcopy(opt.state_dict()), [p.detach().clone() for p in ps]
    with pytest.raises(ValueError, match=r"^grad of parameter 2 \(shape \(24, 16\)\): contains NaN"):
        opt.step()
    assert all(torch.equal(p, q) for p, q in zip(ps, snapshot[1])) and opt.state_dict()["state"] == {}


@pytest.mark.parametrize("bad", ["float64", "int64"])
@pytest.mark.parametrize("name", ["muon", "hybrid"])
def test_a_gradient_of_another_dtype_raises_before_any_change(name, bad):
    """A float64 / int64 gradient on the second parameter: nothing (the first one's momentum
    included) changes."""
    shapes, build = _builders(torch.float32)[name]
    ps = _params(shapes, torch.float32)
    opt = build(ps, True)
    _grads(ps, 3)
    opt.step()
    _grads(ps, 4)
    ps[1].grad_dtype = None  # torch 2.13 refuses a gradient of another dtype unless told to accept any
    ps[1].grad = ps[1].grad.to(torch.float64) if bad == "float64" else torch.ones(ps[1].shape, dtype=torch.int64)
    before = _state(opt)
    with pytest.raises((ValueError, TypeError), match="grad"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, _state(opt)))


def _schedule(opt):
    """An LR schedule that changes every group's lr at every step."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0 / (t + 1))


def _compiled_run(name, *, when, backend, steps=3, seed=0):
    """Eager and compiled copies of one optimizer with a scheduler each (the compiled one's
    created ``when`` = "before" or "after" compiling), stepped side by side; returns the worst
    relative difference of parameters and state, and the number of graphs dynamo compiled."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    shapes, build = _builders(torch.float32)[name]
    eager_ps, compiled_ps = _params(shapes, torch.float32, seed), _params(shapes, torch.float32, seed)
    eager, compiled = build(eager_ps, False), build(compiled_ps, False)
    eager_schedule = _schedule(eager)
    compiled_schedule = _schedule(compiled) if when == "before" else None
    step = torch.compile(compiled.step, fullgraph=True, backend=backend)
    compiled_schedule = compiled_schedule or _schedule(compiled)
    for t in range(steps):
        _grads(eager_ps, t)
        _grads(compiled_ps, t)
        eager.step()
        step()
        eager_schedule.step()
        compiled_schedule.step()
    assert compiled.param_groups[0]["lr"] == eager.param_groups[0]["lr"] != 0.02 * (1 if name != "hybrid" else 0.05)
    return max(_relative(c, e) for c, e in zip(_state(compiled), _state(eager))), counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("name", ["muon", "muon_cautious", "normuon", "dion2", "dion", "hybrid"])
def test_compiled_step_follows_a_scheduler_created_before_compiling(name):
    """fullgraph with an LR scheduler created first (a scheduler wraps ``opt.step`` in a function dynamo
    skips) and changing lr at every step: the AOT graph (aot_eager: inductor's input, without code
    generation) gives the eager step's values, and two graphs serve three steps — the first step's
    (no state yet) and one where lr is an input (an lr given as ``alpha=`` or a ``_foreach`` scalar
    was a constant: one graph per step, ``ortho_fast.functional.graph_scalars``). Inductor and a
    scheduler created after compiling: the slow test."""
    worst, graphs = _compiled_run(name, when="before", backend="aot_eager", steps=3)
    assert worst <= compiled_tolerance("float32") and graphs == 2, (worst, graphs)


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("name", ["muon", "normuon", "dion2", "dion", "hybrid"])
def test_compiled_step_follows_a_scheduler_with_inductor(name, when):
    worst, graphs = _compiled_run(name, when=when, backend="inductor", steps=4, seed=1)
    assert worst <= compiled_tolerance("float32") and graphs == 2, (worst, graphs)


@pytest.mark.parametrize("name", ["muon", pytest.param("dion2", marks=pytest.mark.slow)])
def test_two_optimizers_compiled_in_one_process(name):
    """The second compile of the same step code with other option values (dynamo then makes floats
    that differ symbolic: lr, here) still traces, and each compiled optimizer equals its eager twin."""
    torch._dynamo.reset()
    shapes, build = _builders(torch.float32)[name]
    runs = []
    for lr in (0.02, 0.005):
        ps_e, ps_c = _params(shapes, torch.float32, 3), _params(shapes, torch.float32, 3)
        eager, compiled = build(ps_e, False), build(ps_c, False)
        for opt in (eager, compiled):
            opt.param_groups[0]["lr"] = lr
        runs.append((ps_e, ps_c, eager, torch.compile(compiled.step, fullgraph=True, backend="eager"), compiled))
    for t in range(2):
        for ps_e, ps_c, eager, step, _ in runs:
            _grads(ps_e, t)
            _grads(ps_c, t)
            eager.step()
            step()
    for ps_e, ps_c, eager, _, compiled in runs:
        assert max(_relative(c, e) for c, e in zip(_state(compiled), _state(eager))) <= compiled_tolerance("float32")


def test_compiling_with_check_finite_names_the_fix():
    """The finiteness check's one host read cannot be traced: the error says so and names
    ``check_finite=False`` (instead of dynamo's "data-dependent expression")."""
    torch._dynamo.reset()
    ps = _params(SHAPES, torch.float32)
    opt = ortho_fast.Muon(ps, lr=0.02, dtype=torch.float32)
    _grads(ps, 0)
    with pytest.raises(Exception, match="check_finite=False"):
        torch.compile(opt.step, fullgraph=True, backend="eager")()


@pytest.mark.parametrize("name", ["muon", "normuon", "dion2", "dion", "hybrid"])
def test_a_scheduler_keeps_the_step_and_its_order_warning(name):
    """A scheduler leaves the step unwrapped (dynamo can trace it) and still warns when
    ``scheduler.step()`` comes before any ``optimizer.step()``, and only then."""
    shapes, build = _builders(torch.float32)[name]
    ps = _params(shapes, torch.float32)
    opt = build(ps, True)
    step = type(opt).step
    schedule = _schedule(opt)
    assert "step" not in vars(opt) and type(opt).step is step
    with pytest.warns(UserWarning, match=r"before `optimizer.step\(\)`"):
        schedule.step()
    _grads(ps, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.step()
        schedule.step()
