"""The step of a Muon param group from its plan: the decay, the rest's batches, the stacks' chunks.

``run_plan`` steps a checked group from its ``ortho_fast.groups.muon_plan.MuonPlan``;
``ortho_fast.groups.muon.muon_group_step`` plans afresh and runs the same kernels (``run_steps``).
``stacked_chunk_step`` steps one chunk of ``ortho_fast.groups.muon.plan_stacks``.
Source: docs/performance.md, "(e)"; docs/design.md, "Muon".
"""

from __future__ import annotations

import torch

from ..functional import muon as muon_math, muon_stages as stage_math, stacked as stacked_math
from ..functional.graph_scalars import as_operand
from ..functional.newton_schulz import newton_schulz_stack
from ..functional.stacked import Workspace
from .muon_budget import writes_compute_dtype
from .muon_plan import MuonPlan, chunk_run
from .muon_stages import normuon_variances, stacked_stage_update_
from .options import MuonOptions

#: The one ``orthogonalize`` (a patched one is called instead of the stacked path's direct call).
ORTHOGONALIZE = muon_math.orthogonalize


def _kept(kept: dict | None, name, make):
    """``make()``, kept in ``kept`` (a chunk's ``Replay.cache``: views of the buffers the workspace hands
    the chunk at every step) under ``name``; None (under ``torch.compile``): made every time."""
    if kept is None:
        return make()
    hit = kept.get(name)
    if hit is None:
        hit = kept[name] = make()
    return hit


def run_plan(plan: MuonPlan, state, options: MuonOptions, workspace: Workspace, plan_stacks) -> None:
    """``muon_group_step`` of a checked group from its ``MuonPlan``: the live parameters and buffers the
    plan's check found, the stack plan and chunk views it keeps (the same operations, the same bits).
    ``plan_stacks``: the chunking (``ortho_fast.groups.muon.plan_stacks``)."""
    live, bufs, checked = plan.live(state)
    chunks, batches, stacked, sizes, positions = plan.stacks(live, plan_stacks, checked)
    run_steps((chunks, batches, stacked, sizes), state, options, plan.layout, live, [bufs[k] for k in positions],
              workspace, plan.decay_split)


def run_steps(plan, state, options: MuonOptions, layout, live, bufs, workspace: Workspace, split=None) -> None:
    """The kernels of one group step: the decay, the rest's batches, the stacks' momentum and chunks
    (``plan``: ``step_plan``'s; ``bufs``: the stacked parameters' momentum buffers, in order; ``split``:
    ``graph_scalars.split_rounded`` of the live parameters, made ahead)."""
    chunks, batches, stacked, sizes = plan
    update = options.update_kwargs()
    left = _decay_up_front(live, layout, options, split)  # the others: in ``muon_update``
    # before the stacks (at a first step their temporaries come and go before the workspace), in
    # batches within the stacks' workspace budget
    for batch in batches:
        _rest_step(state, options, layout, batch, update, left)
    if chunks:
        muon_math.update_momentum_buffers([p.grad for p in stacked], bufs, mu=options.momentum,
                                          style=options.momentum_style,  # the buffers have the parameters' dtypes
                                          split=([], bufs) if split is not None and not split[0] else None)
        if not torch.compiler.is_compiling():
            for device, nbytes in sizes.items():
                workspace.reserve(nbytes, device)
        start = 0
        for chunk in chunks:
            end = start + len(chunk.members)
            stacked_chunk_step(chunk, state, options, update, workspace, bufs[start:end])
            start = end


def _decay_up_front(live, layout, options: MuonOptions, split=None) -> set[int]:
    """``decay_by_style`` of the live (index, parameter) pairs before the step, unless the decay is
    cautious; the ids of the parameters left for ``muon_update`` to decay."""
    if options.cautious_weight_decay:
        return {id(p) for _, p in live}
    shaped = options.weight_decay_style == "adjusted_lr"  # the other styles read no shape
    return muon_math.decay_by_style([(p, layout(i, p).matrix_shapes() if shaped else ()) for i, p in live],
                                    style=options.weight_decay_style, lr=options.lr, weight_decay=options.weight_decay,
                                    adjust_lr=options.adjust_lr, extra_scale_factor=options.extra_scale_factor,
                                    split=split)


def _rest_step(state, options: MuonOptions, layout, rest, update: dict, left: set[int]) -> None:
    """One batch (``muon_budget.rest_batches``) of the parameters ``plan_stacks`` leaves out of the
    stacks: ``orthogonalize`` on their matrices, batched over the batch (``options.batched``;
    without it every batch is one parameter: its temporaries alone, as torch.optim.Muon, the
    same bits)."""
    us = muon_math.muon_momentum_foreach([p.grad for _, p in rest], [state[p]["momentum_buffer"] for _, p in rest],
                                         mu=options.momentum, nesterov=options.nesterov, style=options.momentum_style)
    items = []
    for (i, p), u in zip(rest, us):
        lay = layout(i, p)
        items.append((p, lay, stage_math.pre_orthogonalize(lay.matrices(u), equilibration=options.equilibration)))
    outs = iter(muon_math.orthogonalize([x for _, _, mats in items for x in mats], options.table,
                                        **{**options.orthogonalize_kwargs(), "banks": options.batched}))
    for p, lay, mats in items:
        variances = None if options.normuon_beta2 is None else normuon_variances(p, state, lay, options.normuon_dim)
        post = stage_math.post_orthogonalize([next(outs) for _ in mats], variances,
                                             **options.post_orthogonalize_kwargs())
        muon_math.muon_update(p, lay, post, **(update if id(p) in left else {**update, "weight_decay": 0.0}))


def stacked_chunk_step(chunk, state, options: MuonOptions, update: dict, workspace: Workspace,
                       bufs: list | None = None) -> None:
    """The Muon step of one chunk (``groups.muon.StackChunk``; its momentum buffers ``bufs``, in the members'
    order, already updated, ``functional.muon.update_momentum_buffers``; None: read from ``state``): U (Nesterov
    or the buffer) written into one (k, m, n) workspace stack, of the compute dtype where
    ``writes_compute_dtype`` (rounded once on the write) else of the parameters' dtype, MuonEq on it,
    ``orthogonalize`` of it as a scratch ``MatrixStack`` (the iteration starts in it when it has the compute
    dtype), the update as one ``_foreach_add_`` with the chunk's lr·s, or with Muon+ / NorMuon the stack times
    their per-neuron factor added in rounds in the free workspace (``stacked_stage_update_``). A fixed number of
    operations whatever the chunk's size, but for the matrices the rounds of the U write and of the update leave
    to one operation each (chunks of fewer than 4 or 5 matrices). The workspace's views, the rounds and the
    splits are made at the chunk's first step and kept while the workspace hands out the same bytes
    (``muon_plan.chunk_run``)."""
    params = [p for p, _, _ in chunk.members]
    shape = (chunk.count, chunk.m, chunk.n)
    direct = writes_compute_dtype(options, params[0].dtype)
    run = chunk_run(chunk, workspace)
    kept = getattr(run, "cache", None)
    u = run.get("momentum", shape, options.compute_dtype if direct else params[0].dtype, params[0].device)
    views = _kept(kept, "u", lambda: muon_math.split_stack(u, params))
    bufs = [state[p]["momentum_buffer"] for p in params] if bufs is None else bufs
    grads = [p.grad for p in params]
    free = run.spare(u.device)
    if kept is None:  # under torch.compile: no rounds
        rounds = None
    elif "momentum_rounds" in kept:
        rounds = kept["momentum_rounds"]
    else:
        rounds = kept["momentum_rounds"] = muon_math.momentum_into_rounds(views, grads, bufs, free,
                                                                           nesterov=options.nesterov)
    muon_math.momentum_into(views, grads, bufs, mu=options.momentum, nesterov=options.nesterov,
                            style=options.momentum_style, rounds=rounds)  # U in rounds
    pre = u if options.equilibration is None else stage_math.pre_orthogonalize(
        [u], equilibration=options.equilibration)[0]
    if muon_math.orthogonalize is ORTHOGONALIZE and pre is u:  # the stack itself (no split of the result)
        kwargs = kept.get("ns_kwargs") if kept is not None else None  # options other than lr: fixed per plan
        if kwargs is None:
            kwargs = {**options.orthogonalize_kwargs(), "workspace": run}
            kwargs.pop("banks")
            kwargs["compute_dtype"] = u.dtype if options.compute_dtype is None else options.compute_dtype
            if kept is not None:
                kept["ns_kwargs"] = kwargs
        stack = newton_schulz_stack(u, options.table, **kwargs, overwrite=True)
        outs = None
    else:  # MuonEq's result, or a patched ``orthogonalize`` (a documented patch point)
        mats = muon_math.MatrixStack(_kept(kept, "mats", lambda: [
            v.view(lay.matrix_shapes()[0]) for v, (_, lay, _) in zip(views, chunk.members)]), u, scratch=True)
        if pre is not u:
            mats = muon_math.MatrixStack(muon_math.split_stack(pre, mats), pre)
        outs = muon_math.orthogonalize(mats, options.table,
                                       **{**options.orthogonalize_kwargs(), "banks": True, "workspace": run})
        stack = getattr(outs, "stack", None)
    if kept is not None:
        run.done()
    # the rounds and splits of the result are kept only where it is a buffer the workspace hands out at every
    # step (not a new tensor: Gram Newton–Schulz, a patched ``orthogonalize``)
    kept = kept if kept is not None and any(stack is b for b in run.buffers.values()) else None
    stages = options.renormalize or options.normuon_beta2 is not None
    if stack is None:  # a plain list (a patched ``orthogonalize``): the stages per parameter, as the rest
        outs = [(stage_math.post_orthogonalize([o], None if options.normuon_beta2 is None else normuon_variances(
                    p, state, lay, options.normuon_dim), **options.post_orthogonalize_kwargs())[0] if stages else o)
                .reshape(p.shape) for o, (p, lay, _) in zip(outs, chunk.members)]
    else:
        if stages:  # Muon+ / NorMuon: one factor per neuron, applied inside the update (no float32 stack)
            stacked_stage_update_(chunk.members, stack, state, options, as_operand(update["lr"]),
                                  free=(u, run.spare(u.device)), cache=kept)  # Ô in rounds in free bytes
            return
        outs = _kept(kept, ("outs", id(stack)), lambda: muon_math.split_stack(stack, params))
    scale = muon_math.adjusted_lr_scale(options.adjust_lr, chunk.m, chunk.n) * options.extra_scale_factor
    stacked_math.add_update_(params, outs, -as_operand(update["lr"]) * scale, None if stages else u, stack,
                             cache=kept)
