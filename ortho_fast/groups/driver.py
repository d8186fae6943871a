"""The one check-then-step driver of every optimizer here (``Muon``, ``Dion``, ``HybridOptimizer``).

An optimizer is a list of param groups, each run by the ``GroupRunner`` of its algorithm. A step
first checks every group — all of them, before any parameter or state changes — then steps them
in group order. Runners that communicate (the distributed Muon and Dion) check their own groups
on every rank together (``ortho_fast.distributed.comm.raise_together``); the groups of runners
that do not communicate are checked locally and, in a distributed optimizer, the verdict is
shared through ``agree`` (one all-reduce of an error flag) before the communicating checks, so a
gradient that one rank rejects raises on every rank instead of leaving its peers waiting in a
collective. Source: torch.optim's ``Optimizer.step`` contract; docs/design.md, "Layers and
import rules".
"""

from __future__ import annotations

import functools
from typing import Callable, Mapping, Sequence

import torch

from ..validation import FiniteCheck

#: Errors a group check raises for bad input (everything else is a bug and propagates as is).
INPUT_ERRORS = (ValueError, TypeError, KeyError)


class GroupRunner:
    """How one optimizer runs the param groups of one algorithm.

    ``check(groups, state, finite)``: raise for anything invalid in these groups (options, gradients,
    state), changing nothing; the gradients' finiteness goes to ``finite`` (a ``FiniteCheck``
    the driver decides once per step; None: not checked); ``step(group, state, first_index)``: one step of a checked
    group, whose first parameter has index ``first_index`` among this algorithm's parameters (Dion
    seeds its Q0 and sketches by it); ``reset()`` after the groups were replaced. ``communicates``: whether ``check``
    makes its verdict global itself (then the driver runs it on every rank after the local checks).
    """

    communicates = False

    def check(self, groups: Sequence[dict], state, finite: FiniteCheck | None = None) -> None:
        raise NotImplementedError

    def step(self, group: dict, state, first_index: int) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Forget what was cached about the groups (their dicts were replaced: ``load_state_dict``): the
        options (``cache``), the step plans (``step_plans``), the device scalars of capturable groups
        (``scalars``). The distributed runners' per-parameter ``plans`` are built with the optimizer and
        kept."""
        for held in (getattr(self, "cache", None), getattr(self, "step_plans", None), getattr(self, "scalars", None)):
            if held is not None:
                held.clear()


def tracks_scheduler_calls(step: Callable) -> Callable:
    """Decorate an optimizer's ``step`` so that it records its own call for the LR schedulers.

    A ``torch.optim.lr_scheduler.LRScheduler`` replaces ``opt.step`` by a wrapper that sets
    ``opt._opt_called`` (to warn when ``scheduler.step()`` runs first) unless the step already
    carries ``_wrapped_by_lr_sched``; dynamo never traces that wrapper (``lr_scheduler.py`` is in
    its force-skipped files), so ``torch.compile(opt.step, fullgraph=True)`` of an optimizer whose
    scheduler was created before compiling failed with "function marked as skipped". The step
    marked here sets ``_opt_called`` itself and carries the mark, so the scheduler leaves it as
    it is: the same warnings, a step dynamo traces. Source: ``LRScheduler.__init__``'s
    ``patch_track_step_called`` (torch 2.13)."""

    @functools.wraps(step)
    def wrapper(self, *args, **kwargs):
        calls = getattr(self, "_step_calls", None)
        if calls is not None:
            calls[0] = True  # a list item: dynamo replays it after a compiled step (an attribute store it drops)
        else:
            self._opt_called = True
        return step(self, *args, **kwargs)

    wrapper._wrapped_by_lr_sched = True
    return wrapper


class SchedulerCalls:
    """Mixin of the optimizers whose ``step`` is ``tracks_scheduler_calls``: ``_opt_called`` (what an LR
    scheduler reads to warn when ``scheduler.step()`` comes first) is the item of a list made at
    construction, which a compiled step sets too (dynamo drops a compiled step's attribute stores on
    an optimizer, so the scheduler warned after every compiled step)."""

    def _patch_step_function(self) -> None:  # torch.optim.Optimizer.__init__ / __setstate__ call it
        self.__dict__.setdefault("_step_calls", [False])
        super()._patch_step_function()

    @property
    def _opt_called(self) -> bool:
        calls = self.__dict__.get("_step_calls")
        return bool(calls and calls[0])

    @_opt_called.setter
    def _opt_called(self, value: bool) -> None:
        self.__dict__.setdefault("_step_calls", [False])[0] = bool(value)


def init_groups_if_compiling(optimizer) -> None:
    """Under ``torch.compile``: ``optimizer._init_group(optimizer.param_groups[0])``, which creates the
    state a first step would, for every group (for the parameters with a gradient; made at one call:
    a state entry made at a later call of a step with several groups left a guard on a tensor that
    dynamo had not kept, and the next step compiled again). Dynamo runs a
    method of that name of a ``torch.optim.Optimizer`` eagerly, outside the graph, and marks the state
    static (``torch/_dynamo/variables/optimizer.py``, ``OptimizerVariable``, as for torch.optim's own
    optimizers): the graph of the first compiled step is the later steps' graph (one graph per
    optimizer, not two: a sweep that builds a new optimizer per trial reaches dynamo's recompile limit
    no sooner than torch.optim's), and state made from a seeded generator (Dion's Q0) is created eagerly.
    Eager steps do nothing here (their state is created after the checks, so a rejected step changes
    nothing)."""
    if torch.compiler.is_compiling() and optimizer.param_groups:
        optimizer._init_group(optimizer.param_groups[0])


def compile_hint_error() -> RuntimeError:
    """The error of a step compiled with ``check_finite=True`` (dynamo cannot trace the one host
    read of the finiteness check: a data-dependent branch)."""
    return RuntimeError(
        "check_finite=True reads one flag from the device per step (the gradients' finiteness), which "
        "torch.compile cannot put in a graph; construct the optimizer with check_finite=False to compile its "
        "step (a NaN / Inf gradient then propagates, as in torch.optim), or call the step uncompiled")


def one_algorithm(name: str) -> Callable[[dict], str]:
    """``check_then_step``'s ``algorithm_of`` for an optimizer of one algorithm: every group is ``name``'s."""
    def algorithm_of(group: dict) -> str:
        return name
    return algorithm_of


def labelled(index: int, algorithm: str, fn: Callable, *args, **kwargs):
    """Call fn; a ValueError / TypeError / KeyError gets "param group i (algorithm): " in front
    (same type; the original chained as its cause)."""
    try:
        return fn(*args, **kwargs)
    except INPUT_ERRORS as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        raise type(err)(f"param group {index} ({algorithm}): {message}") from err


def check_then_step(groups: Sequence[dict], state, runners: Mapping[str, GroupRunner],
                    algorithm_of: Callable[[dict], str] | str, *, label: bool = False,
                    agree: Callable[[BaseException | None], None] | None = None, check_finite: bool = True) -> None:
    """Check every group, then step every group (the step of ``Muon``, ``Dion`` and ``HybridOptimizer``).

    Args: ``runners`` the runner of each algorithm; ``algorithm_of(group)`` a group's algorithm (a string:
    every group's);
    ``label`` prefix errors with "param group i (algorithm): "; ``agree`` (distributed optimizers)
    called once with the first local error or None after the non-communicating groups (if any)
    were checked: it raises on every rank if any rank found an error (``raise_together``).
    Raises: the first error found, before any parameter or state changes (with ``agree``: on
    every rank).
    """
    if check_finite and torch.compiler.is_compiling():
        raise compile_hint_error()
    error, checked_local = None, False
    finite = FiniteCheck() if check_finite else None
    # the algorithms first (a name, or ``algorithm_of`` mapped without a Python frame holding a group); the
    # loops below index the groups, so no frame here holds one while the runners check and step them
    algorithms = [algorithm_of] * len(groups) if isinstance(algorithm_of, str) else list(map(algorithm_of, groups))
    communicating: dict[str, list[int]] = {}
    for i, algorithm in enumerate(algorithms):
        runner = runners[algorithm]
        if runner.communicates:
            communicating.setdefault(algorithm, []).append(i)
            continue
        checked_local = True
        if finite is not None:
            finite.prefix = f"param group {i} ({algorithm}): " if label else ""
        try:
            if label:
                labelled(i, algorithm, runner.check, groups[i:i + 1], state, finite)
            else:
                runner.check(groups[i:i + 1], state, finite)
        except INPUT_ERRORS as err:
            if agree is None:
                raise
            error = error or err
    if finite is not None and error is None:
        error = finite.error()  # one host sync for every local gradient
        if error is not None and agree is None:
            raise error
    if agree is not None and checked_local:
        agree(error)
    for algorithm, indices in communicating.items():
        runners[algorithm].check([groups[i] for i in indices], state, FiniteCheck() if check_finite else None)
    first_index: dict[str, int] = {}
    for i, algorithm in enumerate(algorithms):
        start = first_index.get(algorithm, 0)
        runners[algorithm].step(groups[i], state, start)
        first_index[algorithm] = start + len(groups[i]["params"])


def describe_groups(groups: Sequence[dict], **extra) -> dict[str, str]:
    """What every rank of a distributed optimizer must agree on, as texts
    (``ortho_fast.distributed.comm.raise_together``'s ``digest``): "parameters" — per group, each
    parameter's global shape, dtype, placements and name; "options" — per group, every option
    value (``extra`` adds its keyword values, e.g. the seed or the TP mode)."""
    parameters, options = [], []
    for group in groups:
        names = group.get("param_names") or [None] * len(group["params"])
        parameters.append([(tuple(p.shape), str(p.dtype), tuple(map(str, getattr(p, "placements", ()))), name)
                           for p, name in zip(group["params"], names)])
        options.append(sorted((k, repr(v)) for k, v in group.items() if k not in ("params", "param_names")))
    return {"parameters": repr(parameters), "options": repr((options, sorted(extra.items())))}
