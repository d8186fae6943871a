"""Dion2: the ``Dion2`` optimizer class (microsoft/dion's ``Dion2``, its constructor names).

The class only owns state and grouping: the per-tensor math is in ``ortho_fast.functional.dion2``,
the param-group contract in ``ortho_fast.groups.dion2``. docs/math.md, "Dion2".
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch.optim import Optimizer

from .coefficients import CoefficientsLike
from .compat import (
    DION2_ALIASES,
    FIXED,
    aliases_used,
    apply_aliases,
    canonical_group,
    check_fixed_in_group,
    named_as_given,
)
from .groups.dion2 import DION2_DEFAULTS, Dion2Groups, normalize_dion2_group
from .groups.driver import (
    SchedulerCalls,
    check_then_step,
    init_groups_if_compiling,
    one_algorithm,
    tracks_scheduler_calls,
)
from .groups.first_state import init_first_state
from .groups.state import (
    STATE_SPECS,
    add_param_group_checked,
    check_group_algorithm,
    load_state_dict_checked,
    state_dict_with_dtype_names,
)
from .validation import is_dtensor

__all__ = ["DION2_DEFAULTS", "DION2_POSITIONAL", "DION2_STATE", "Dion2"]

#: microsoft/dion ``Dion2``'s parameters after ``flatten``, in its positional order.
DION2_POSITIONAL = ("use_triton", "use_polar_express", "use_gram_newton_schulz", "newton_schulz_func", "verbose",
                    "triton_post_ortho", "selection_scope")

#: The per-parameter state of Dion2 as ``load_state_dict`` checks it: ``momentum`` of the
#: parameter's shape (microsoft/dion's key).
DION2_STATE = STATE_SPECS["dion2"]


class Dion2(SchedulerCalls, Optimizer):
    """Dion2 (microsoft/dion): Muon-style orthogonalized updates of a selected fraction of the
    rows or columns, with error feedback on the selected slices.

    Per matrix W (m, n) with gradient G and momentum M: B = M + G; the N = min(m, n) slices of
    the shorter dimension (rows when m <= n) are ranked by L1 norm and the k = max(1,
    ⌈fraction·N⌉) largest form S; M ← B with M[S] ← ef_decay·B[S]; O_S = Newton–Schulz(B_S) on the
    (k, n) or (m, k) submatrix only; W ← W·(1 − lr·weight_decay), W[S] ← W[S] − lr·s·O_S with
    s = √(m/n) ("spectral_norm"), 0.2·√max(m, n) ("rms_norm" = our "match_rms_adamw") or 1 (None).

    Args, in microsoft/dion's positional order ``Dion2(params, distributed_mesh, lr, fraction,
    ef_decay, betas, weight_decay, epsilon, adjust_lr, flatten, use_triton, use_polar_express,
    use_gram_newton_schulz, newton_schulz_func, verbose, triton_post_ortho, selection_scope)``
    with its defaults (lr 0.01, fraction 0.25, ef_decay 0.95, weight_decay 0.01, epsilon 1e-8,
    "spectral_norm", flatten False, Polar Express, selection_scope "local"): ``betas`` is
    validated and unused (its AdamW / Lion groups run in ``HybridOptimizer`` here);
    ``use_polar_express=False`` is ``coefficients="cesista5"``; ``use_triton``,
    ``use_gram_newton_schulz``, ``triton_post_ortho`` must be False and ``newton_schulz_func``
    None, ``verbose`` any bool (docs/compatibility.md). Ours: ``coefficients`` / ``ns_steps`` /
    ``safety`` (None: the schedule's, 1.02 for "polar_express") / ``dtype`` (Newton–Schulz compute
    dtype, bfloat16 as microsoft/dion), ``gram`` (Muon's: Gram Newton–Schulz on the selected
    submatrix; None (default) for float32 / float64 compute from aspect ratio 2, so never in the
    default bfloat16; True always, with ``dtype`` torch.float16 (Dao AI Lab's gram-newton-schulz
    kernel, microsoft/dion's ``use_gram_newton_schulz``, restarting every second step),
    torch.float32 or torch.float64 only; False never), ``check_finite`` and ``capturable`` (as ``Muon``: lr,
    weight_decay and ef_decay as 0-dim device tensors; one process only). ``flatten``: ≥ 3-D
    parameters as (shape[0], prod(rest)); False: batches of matrices.
    ``selection_scope``: "global" (one top-k per matrix: every layout equals one process) or
    "local" (a top-k per shard of the selected dimension, microsoft/dion's default: layout
    dependent by design; on one process, or when that dimension is not sharded, "global").
    Distributed (``ortho_fast.distributed.dion2``; every rank builds and steps the optimizer with
    the same parameters in the same order): ``distributed_mesh`` a 1-D DeviceMesh (FSDP2's
    ``Shard(0)``, or replicated parameters: DDP) or a ProcessGroup (DDP of plain tensors, whose
    gradients are already averaged), ``tp_mesh`` a 1-D DeviceMesh of tensor parallelism (colwise
    ``Shard(0)``, rowwise ``Shard(1)``, ``_StridedShard`` under FSDP), ``replicate_mesh`` the
    replicate dim of HSDP (whole replicas; joins the cross-rank agreement only). The slices are
    chosen by the global shape on every layout; "global" selection equals one process on every
    layout (up to the summation order of the L1 norms, which matters only at near-ties).
    State: ``momentum`` (the parameter's shape and dtype), as microsoft/dion; state dicts
    round-trip bitwise and ``load_state_dict`` checks every saved entry before anything changes.
    Source: microsoft/dion ``dion/dion2.py``; docs/math.md, "Dion2".
    Raises: at construction / ``add_param_group`` / ``load_state_dict``, ValueError / TypeError
    naming the option or "params"; TypeError for an unknown keyword (with the closest name);
    at ``step``, ValueError for a bad gradient or state or an option edited since, before any
    parameter or state changes (distributed: on every rank, after one agreement of an error flag,
    the parameters, the options and which parameters have gradients: ``comm.raise_together``);
    distributed construction: LayoutError (a ValueError) for a mesh that is not 1-D, overlaps
    another or lacks this rank, a DTensor sharded on a mesh dim the optimizer was not given, or a
    sharded ndim > 2 parameter without ``flatten``; ValueError for a DTensor without any mesh;
    RuntimeError if torch.distributed is not initialized.
    """

    def __init__(
        self,
        params: Iterable,
        distributed_mesh=None,
        lr: float = 0.01,
        fraction: float = 0.25,
        ef_decay: float = 0.95,
        betas: tuple[float, float] = (0.9, 0.95),
        weight_decay: float = 0.01,
        epsilon: float = 1e-8,
        adjust_lr: str | None = "spectral_norm",
        flatten: bool = False,
        *dion_positional,
        coefficients: CoefficientsLike = "polar_express",
        ns_steps: int | None = None,
        safety: float | None = None,
        dtype: torch.dtype | str | None = torch.bfloat16,
        selection_scope: str = "local",
        gram: bool | None = None,
        tp_mesh=None,
        replicate_mesh=None,
        check_finite: bool = True,
        capturable: bool = False,
        **aliases,
    ) -> None:
        if len(dion_positional) > len(DION2_POSITIONAL):
            raise TypeError(f"Dion2: takes at most {10 + len(DION2_POSITIONAL)} positional arguments "
                            f"(microsoft/dion's order), got {10 + len(dion_positional)}")
        options = dict(lr=lr, fraction=fraction, ef_decay=ef_decay, weight_decay=weight_decay, epsilon=epsilon,
                       adjust_lr=adjust_lr, flatten=flatten, coefficients=coefficients, ns_steps=ns_steps,
                       safety=safety, dtype=dtype, selection_scope=selection_scope, gram=gram, capturable=capturable)
        for name, value in zip(DION2_POSITIONAL, dion_positional):
            if name == "selection_scope":
                options[name] = value
            elif name in aliases:
                raise TypeError(f"Dion2: got multiple values for argument {name!r}")
            else:
                aliases[name] = value
        aliases["betas"] = betas
        used = aliases_used(aliases, DION2_ALIASES)
        apply_aliases(aliases, DION2_ALIASES, options, DION2_DEFAULTS, fixed="dion2", where="Dion2")
        if not isinstance(check_finite, bool):
            raise TypeError(f"check_finite: expected a bool, got {check_finite!r}")
        with named_as_given(used):
            normalize_dion2_group({**options, "params": []})
        self.check_finite = check_finite
        self._sharding = None
        if any(x is not None for x in (distributed_mesh, tp_mesh, replicate_mesh)) and capturable is True:
            raise ValueError("capturable: the distributed step (distributed_mesh / tp_mesh / replicate_mesh) reads its "
                             "plan on the host; capturable=True is for the one-process step")
        if any(x is not None for x in (distributed_mesh, tp_mesh, replicate_mesh)):
            from .distributed.dion2 import Dion2Sharding

            self._sharding = Dion2Sharding(distributed_mesh, tp_mesh, replicate_mesh)
        self._runner = self._sharding or Dion2Groups()
        super().__init__(params, options)

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_runner": self._runner, "_sharding": self._sharding,
                "check_finite": self.check_finite}

    def add_param_group(self, param_group: dict) -> None:
        """torch's add_param_group (microsoft/dion's names mapped), then ``normalize_dion2_group``;
        a rejected group is not added. A group may say ``algorithm="dion2"`` (microsoft/dion's); a group
        naming another algorithm or holding another algorithm's option (Dion's ``rank_fraction``, Muon's
        ``momentum``) raises ValueError naming it (``check_group_algorithm``)."""
        if isinstance(param_group, dict):
            param_group = canonical_group(dict(param_group), DION2_ALIASES)

        def normalize(group: dict) -> None:
            check_fixed_in_group(group, "dion2")  # microsoft/dion's betas, use_triton, ...: checked, unused
            fixed = {f.name for f in FIXED["dion2"]}  # another algorithm's option (rank_fraction, momentum): rejected
            check_group_algorithm({k: v for k, v in group.items() if k not in fixed}, "dion2", "Dion2")
            normalize_dion2_group(group)
            if self._sharding is not None:
                self._sharding.add_group(group)
            elif any(is_dtensor(p) for p in group["params"]):
                raise ValueError("params: DTensor parameters need the mesh they are sharded on (distributed_mesh / "
                                 "tp_mesh)")

        add_param_group_checked(self, param_group, normalize)

    def state_dict(self) -> dict:
        """torch's ``state_dict`` with the ``dtype`` option written as its name."""
        return state_dict_with_dtype_names(self)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load_state_dict, checked before anything changes: each saved group completed
        from the current one, mapped (microsoft/dion's names) and normalized; each saved
        parameter state a ``momentum`` of the parameter's shape, real floating and finite
        (another optimizer's keys rejected naming the key); the state dict's ids and state keys must
        match (``check_state_dict_ids``: JSON's string keys raise) and its groups hold no other
        optimizer's options (a Muon state dict's ``momentum``: ``check_foreign_options``); the
        loaded tensors are copies. Raises: ValueError / TypeError naming the key, before any change."""
        def spec(i: int, saved: dict, current: dict):
            canonical_group(saved, DION2_ALIASES)
            return DION2_DEFAULTS, lambda trial: (check_fixed_in_group(trial, "dion2"), normalize_dion2_group(trial))

        # each saved state checked against STATE_SPECS["dion2"] before any change; a distributed
        # optimizer agrees on the verdict across ranks first (``load_state_dict_checked``)
        load_state_dict_checked(self, state_dict, spec, algorithm_of=lambda group: "dion2")
        self._runner.reset()

    @tracks_scheduler_calls
    @torch.no_grad()
    def step(self, closure=None):
        """One Dion2 step for every parameter with a gradient. Returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        init_groups_if_compiling(self)
        check_then_step(self.param_groups, self.state, {"dion2": self._runner}, one_algorithm("dion2"),
                        check_finite=self.check_finite)
        return loss

    def _init_group(self, group: dict) -> None:
        """The ``momentum`` zeros the first step creates for the parameters with a gradient of every group
        (``group``: the first), one process only; run by dynamo outside the graph (``init_groups_if_compiling``)."""
        for each in self.param_groups if self._sharding is None else ():
            init_first_state(each, self.state, "dion2")
