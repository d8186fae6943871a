"""The definition Dion2's "local" layouts are checked against (as Muon's blockwise TP mode is):
one process, the same steps as ``ortho_fast.Dion2`` but the selection made shard by shard of the
selected dimension, by ``ortho_ref.dion2.dion2_local_select`` (the oracle's code, not the
distributed step's) on the slice norms computed in the run's dtype.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from ortho_fast.coefficients import resolve_coefficients, schedule_of
from ortho_fast.distributed.layout import dim_indices
from ortho_fast.functional import dion2 as dion2_math
from ortho_fast.functional.newton_schulz import resolve_compute_dtype
from ortho_fast.groups.dion2 import DION2_DEFAULTS
from ortho_ref.dion2 import dion2_local_select

from .inputs import gradient, initial_weight
from .layouts import Layout, optimizer_options
from .tensors import dtensor_placements

__all__ = ["dion2_local_reference", "selected_dim_shards"]


def selected_dim_shards(layout: Layout, mesh_shape: tuple[int, ...], shape: tuple[int, int]) -> list[np.ndarray]:
    """The index sets of the selected dimension (rows when m <= n) held at each mesh coordinate
    (distinct sets, ordered by their first index; one set when that dimension is not sharded)."""
    m, n = shape
    dim = 0 if dion2_math.dion2_select_rows(m, n) else 1
    if layout.placements is None:
        return [np.arange(shape[dim])]
    placements = dtensor_placements(layout, mesh_shape)
    sets = {}
    for coordinate in itertools.product(*(range(s) for s in mesh_shape)):
        idx = dim_indices(shape, mesh_shape, coordinate, placements)[dim].numpy()
        sets[tuple(idx.tolist())] = idx
    return sorted(sets.values(), key=lambda a: a[0] if a.size else shape[dim])


def dion2_local_reference(layout: Layout, mesh_shape: tuple[int, ...], dtype: torch.dtype, matrices, steps: int,
                          device="cpu") -> list[dict[str, list[torch.Tensor]]]:
    """Per step, "weights" and "momentum" of every matrix (float64 on the CPU) of one process
    running Dion2 with the layout's options and "local" selection over ``selected_dim_shards``:
    B = M + G; the slice norms (``dion2_slice_norms``, in ``dtype``); per shard its top
    max(1, ⌈fraction·(largest shard)⌉) (``ortho_ref.dion2.dion2_local_select``); M[S] ← ef·B[S];
    O_S = ``orthogonalize_selected``(B_S); W ← W(1 − lr·wd), W[S] −= lr·s·O_S."""
    opts = {**DION2_DEFAULTS, **optimizer_options(layout, distributed=False)}
    table = tuple(resolve_coefficients(opts["coefficients"], opts["ns_steps"]))
    named = schedule_of(opts["coefficients"])
    safety = opts["safety"] if opts["safety"] is not None else named.safety if named else 1.0
    compute_dtype, precision = resolve_compute_dtype(opts["dtype"])
    weights = [initial_weight(i, s, dtype).to(device).clone() for i, s in enumerate(matrices)]
    moms = [torch.zeros_like(w) for w in weights]
    out = []
    for step in range(steps):
        for i, shape in enumerate(matrices):
            m, n = shape
            rows = dion2_math.dion2_select_rows(m, n)
            b = dion2_math.dion2_accumulate(gradient(i, step, 0, shape, dtype).to(device).clone(), moms[i])
            norms = dion2_math.dion2_slice_norms(b, rows)
            shards = selected_dim_shards(layout, mesh_shape, shape)
            sel = torch.as_tensor(dion2_local_select(norms.double().cpu().numpy(), opts["fraction"], shards),
                                  device=b.device)
            sub = dion2_math.dion2_gather(b, sel, rows)
            ortho = dion2_math.orthogonalize_selected(sub, table, safety=safety, eps=opts["epsilon"],
                                                      compute_dtype=compute_dtype, precision=precision)
            dion2_math.dion2_error_feedback(b, sel, sub, rows, opts["ef_decay"])
            dion2_math.dion2_update(weights[i], ortho, sel, rows, lr=opts["lr"], weight_decay=opts["weight_decay"],
                                    lr_scale=dion2_math.dion2_lr_scale(opts["adjust_lr"], m, n))
        out.append({"weights": [w.to("cpu", torch.float64, copy=True) for w in weights],
                    "momentum": [mo.to("cpu", torch.float64, copy=True) for mo in moms]})
    return out
