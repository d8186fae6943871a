"""One plan per Muon param group, resolved when the group changes, run by every step.

``MuonPlan`` holds what a step of one group reads that does not change from step to step: the
resolved options (``MuonOptions``), each parameter's name and layout, the checks that passed for
each gradient (kept while the gradient, its momentum buffer and its second moment are the same
tensors of the same shape, dtype and device), the stack plan (chunks, rest batches, workspace
sizes: ``muon_budget.step_plan``, kept while the same parameters have gradients) and, per chunk,
the views of the workspace its step uses (``chunk_run``: kept while the workspace hands out the same
bytes). ``ortho_fast.groups.muon.MuonGroups`` builds one at construction, ``add_param_group``,
``load_state_dict`` (``reset``) and whenever an option of the group changes; an lr, weight decay or
momentum set by a scheduler only replaces those scalars (``with_scalars``). A step then checks the
gradients and runs the kernels. Nothing here holds the group dict but the plan's identity check.
Source: docs/performance.md, "(d)", "The plan of a step".
"""

from __future__ import annotations

import weakref

import torch

from ..functional import stacked as stacked_math
from ..functional.graph_scalars import split_rounded
from ..validation import check_grad, check_param_shaped_state, screenable
from .muon_budget import step_plan
from .muon_stages import VARIANCE_KEY, check_stage_state
from .options import MuonOptions


class Replay:
    """A ``stacked.Workspace`` seen by one chunk's step: the first run forwards every ``get`` and
    ``spare`` to the workspace and records what it handed out; later runs get the recorded views (the
    workspace hands a chunk the same bytes at every step while its pools stay: ``key``, the workspace's
    ``generation``)."""

    def __init__(self, workspace: stacked_math.Workspace) -> None:
        self.workspace = workspace
        self.key = getattr(workspace, "generation", None)
        self.buffers: dict[tuple, torch.Tensor] = {}
        self.spares: list = []
        self.next_spare = 0
        self.recorded = False
        self.cache: dict = {}  # what the chunk's step derives from these views (rounds, splits)

    def start(self) -> Replay:
        self.next_spare = 0
        return self

    def done(self) -> None:
        self.recorded = True

    def get(self, name: str, shape, dtype: torch.dtype, device) -> torch.Tensor:
        key = (name, tuple(shape), dtype)
        hit = self.buffers.get(key)
        if hit is None or not self.recorded:
            hit = self.buffers[key] = self.workspace.get(name, shape, dtype, device)
        return hit

    def spare(self, device) -> torch.Tensor | None:
        i = self.next_spare
        self.next_spare += 1
        if self.recorded and i < len(self.spares):
            return self.spares[i]
        out = self.workspace.spare(device)
        self.spares[i:i + 1] = [out]
        return out

    def data_ptrs(self) -> list[int]:
        return self.workspace.data_ptrs()


def chunk_run(chunk, workspace: stacked_math.Workspace) -> Replay | stacked_math.Workspace:
    """The ``Replay`` of ``chunk`` on ``workspace`` (made again when the workspace's pools changed);
    the workspace itself under ``torch.compile``."""
    if torch.compiler.is_compiling():
        return workspace
    run = chunk.views.get("run")
    if run is None or run.workspace is not workspace or run.key != getattr(workspace, "generation", None):
        run = chunk.views["run"] = Replay(workspace)
    return run.start()


class MuonPlan:
    """The plan of one Muon param group (see the module docstring). ``options``: the group's resolved
    options; ``values``: the group's option values it was resolved from (``MUON_OPTION_KEYS``' order),
    compared by identity at every step; ``frozen``: value snapshots of the options that may change in
    place (lists, dicts), compared by value; ``names``: how errors name each parameter;
    ``layout_of(i, p)``: the layout of parameter i (``groups.muon.param_layout``)."""

    def __init__(self, group: dict, options: MuonOptions, values: tuple, frozen: dict, names: list[str],
                 layout_of) -> None:
        self.group = group  # held: its id is not reused while the plan is kept
        self.options = options
        self.values = values
        self.frozen = frozen
        self.params = tuple(group["params"])
        self.names = names
        self.grad_names = [f"grad of {name}" for name in self.names]
        self.pairs = list(enumerate(self.params))  # (index, parameter), as the live list holds them
        self._layout_of = layout_of
        self.layout_cache: dict = {}  # index -> (parameter, shape, layout), as ``cached_layout``
        self.checked: list = [None] * len(self.params)
        self.stack_key = None
        self.stack_plan = None
        self.decay_split = None  # ``split_rounded`` of the live parameters
        self.epoch = 0  # counts the changes of a parameter's shape, dtype, device or contiguity
        self.ready = None  # what the last check found: (live, momentum buffers), for the step after it

    def with_scalars(self, options: MuonOptions, values: tuple) -> MuonPlan:
        """The plan with new lr / weight decay / momentum (the rest kept); returns itself."""
        self.options = options
        self.values = values
        return self

    def layout(self, i: int, p: torch.Tensor):
        """The layout of parameter ``i`` (kept while it is the same tensor of the same shape)."""
        hit = self.layout_cache.get(i)
        if hit is not None and hit[0] is p and hit[1] == p.shape:
            return hit[2]
        lay = self._layout_of(i, p)
        self.layout_cache[i] = (p, p.shape, lay)
        return lay

    def check(self, state, finite) -> None:
        """``check_muon_step``'s per-parameter checks, done again only for a parameter whose gradient,
        momentum buffer or second moment is another tensor, or has another shape, dtype or device, than
        when it last passed; every gradient goes to ``finite`` (a ``FiniteCheck``; False: not checked).
        Records the live parameters and their buffers for the step. Raises as ``check_muon_step``."""
        self.ready = None
        live, bufs, grads, grad_names = [], [], [], []
        checked, names, options = self.checked, self.names, self.options
        screened = True  # every gradient ``screenable``: one ``FiniteCheck.add_screened`` block
        for pair, name, grad_name in zip(self.pairs, names, self.grad_names):
            i, p = pair
            g = p.grad
            if g is None:
                continue
            st = state.get(p)
            buf = var = None
            if st:
                buf, var = st.get("momentum_buffer"), st.get(VARIANCE_KEY)
            sig = (p.shape, p.dtype, p.device, p.is_contiguous(), g.shape, g.dtype, g.device, g.layout)
            hit = checked[i]
            if hit is None or hit[0]() is not g or hit[1] is not buf or hit[2] is not var or hit[3] != sig:
                check_grad(p, name, "Muon", False)
                check_param_shaped_state(state, p, "momentum_buffer", name)
                check_stage_state(st or {}, p, self.layout(i, p), options, name)
                if hit is None or hit[3] != sig:  # what the stack plan depends on
                    self.epoch += 1
                hit = checked[i] = (weakref.ref(g), buf, var, sig, screenable(g))
            screened = screened and hit[4]
            grads.append(g)
            grad_names.append(grad_name)
            live.append(pair)
            bufs.append(buf)
        if finite:
            if screened:
                finite.add_screened(grads, grad_names)
            else:
                for g, grad_name in zip(grads, grad_names):
                    finite.add(g, grad_name)
        self.ready = (live, bufs)

    def live(self, state) -> tuple[list, list, bool]:
        """The live (index, parameter) pairs and their momentum buffers, created as zeros where missing
        (from the check of this step when there was one)."""
        ready, self.ready = self.ready, None
        from_check = ready is not None
        if ready is None:
            live = [(i, p) for i, p in enumerate(self.params) if p.grad is not None]
            ready = (live, [state[p].get("momentum_buffer") for _, p in live])
        live, bufs = ready
        if any(b is None for b in bufs):
            for k, ((_, p), buf) in enumerate(zip(live, bufs)):
                if buf is None:
                    buf = state[p].get("momentum_buffer")
                if buf is None:
                    buf = state[p]["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                bufs[k] = buf
        return live, bufs, from_check

    def stacks(self, live, plan_stacks, checked: bool = False):
        """The stack plan of the live parameters (``muon_budget.step_plan``), made again when another set
        of parameters has gradients or one changed shape, dtype, device or contiguity (``checked``: the
        check of this step saw every live parameter, so its ``epoch`` tells whether one changed)."""
        key = (self.epoch, tuple(i for i, _ in live)) if checked else tuple(
            (i, p.shape, p.dtype, p.device, p.is_contiguous()) for i, p in live)
        if self.stack_plan is None or key != self.stack_key or torch.compiler.is_compiling():
            chunks, batches, stacked, sizes = step_plan(live, self.layout, self.options, plan_stacks)
            where = {i: k for k, (i, _) in enumerate(live)}
            positions = [where[i] for chunk in chunks for _, _, i in chunk.members]
            self.stack_plan = (chunks, batches, stacked, sizes, positions)
            self.decay_split = split_rounded([p for _, p in live])
            self.stack_key = key
        return self.stack_plan

