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

__all__ = ["DION2_POSITIONAL", "DION2_STATE", "Dion2"]

#: microsoft/dion ``Dion2``'s parameters after ``flatten``, in its positional order.
DION2_POSITIONAL = ("use_triton", "use_polar_express", "use_gram_newton_schulz", "newton_schulz_func", "verbose",
                    "triton_post_ortho", "selection_scope")

#: The per-parameter state of Dion2 as ``load_state_dict`` checks it: ``momentum`` of the
#: parameter's shape (microsoft/dion's key).
DION2_STATE = STATE_SPECS["dion2"]


class Dion2(SchedulerCalls, Optimizer):
    """Dion2: Muon-style orthogonalized updates of a selected fraction of the rows or columns.

    Per matrix W (m, n) with gradient G and momentum M: B = M + G; of the min(m, n) slices of the shorter
    dimension the k = max(1, ⌈fraction·min(m, n)⌉) largest in L1 norm form S; M ← B with M[S] ← ef_decay·B[S];
    O_S = newton_schulz(B_S); W ← W·(1 − lr·wd), W[S] ← W[S] − lr·s·O_S. The signature is microsoft/dion's,
    in its positional order; docs/optimizers.md, "Dion2", explains every option.

    Parameters
    ----------
    params : iterable of Tensor, (name, Tensor) pairs or dict
        The ≥ 2-D parameters or param groups.
    distributed_mesh : 1-D DeviceMesh or ProcessGroup, optional
        The data-parallel axis (FSDP2 ``Shard(0)``, or DDP of replicated parameters).
    lr, fraction, ef_decay : float or 0-dim Tensor, float, float, default 0.01, 0.25, 0.95
        Learning rate; the fraction of slices updated; the decay of the selected slices' momentum.
    betas : (float, float), default (0.9, 0.95)
        microsoft/dion's AdamW / Lion betas: validated, unused (those groups run in ``HybridOptimizer``).
    weight_decay, epsilon : float, default 0.01, 1e-8
        Decoupled weight decay; the Newton–Schulz normalization's epsilon.
    adjust_lr : {"spectral_norm", "match_rms_adamw", None}, default "spectral_norm"
        The lr scale s: √(m/n), 0.2·√max(m, n) (microsoft/dion's "rms_norm") or 1.
    flatten : bool, default False
        ≥ 3-D parameters as (shape[0], prod(rest)); False: batches of matrices.
    *dion_positional
        microsoft/dion's further positional arguments, from ``use_triton`` to ``selection_scope``.
    coefficients, ns_steps, safety : str or rows, int, float, default "polar_express", None, None
        The Newton–Schulz schedule; None: the schedule's steps and safety (1.02 for "polar_express").
    dtype : torch.dtype or str, default torch.bfloat16
        The Newton–Schulz compute dtype.
    selection_scope : {"local", "global"}, default "local"
        A top-k per shard of the selected dimension (microsoft/dion) or one per matrix.
    gram : bool, optional
        Gram Newton–Schulz on the selected submatrix, as ``Muon``'s ``gram``.
    tp_mesh, replicate_mesh : 1-D DeviceMesh, optional
        Tensor-parallel axis; the replicate axis of HSDP.
    check_finite, capturable : bool, default True, False
        Check every gradient finite (one host read); hyperparameters as device tensors for CUDA graphs.
    **aliases
        microsoft/dion's keywords (``use_polar_express``, ``verbose``, ...); an unknown one raises TypeError.

    Raises
    ------
    ValueError, TypeError
        A bad option, parameter, gradient or state, naming it, before any parameter or state changes.
    LayoutError, RuntimeError
        A mesh or DTensor layout the distributed step cannot use; torch.distributed not initialized.

    References
    ----------
    microsoft/dion ``dion/dion2.py``; docs/math.md, "Dion2".

    Examples
    --------
    >>> import torch, ortho_fast
    >>> w = torch.nn.Parameter(torch.randn(8, 4))
    >>> opt = ortho_fast.Dion2([w], lr=0.01, fraction=0.5)
    >>> w.grad = torch.randn(8, 4)
    >>> opt.step()
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
        """Add a param group (microsoft/dion's names mapped), then validate its options.

        A group may say ``algorithm="dion2"`` (microsoft/dion's); a group naming another algorithm or
        holding another algorithm's option (Dion's ``rank_fraction``, Muon's ``momentum``) is rejected.

        Parameters
        ----------
        param_group : dict
            ``params`` and any option of the constructor.

        Raises
        ------
        ValueError, TypeError
            A bad option or parameter, naming it; a rejected group is not added.
        """
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
        """torch's ``state_dict``, with the ``dtype`` option written as its name.

        Returns
        -------
        dict
            ``{"state": {index: {"momentum": Tensor}}, "param_groups": [dict, ...]}``.
        """
        return state_dict_with_dtype_names(self)

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state dict, checked before anything changes; the loaded tensors are copies.

        Each saved group is completed from the current one, mapped (microsoft/dion's names) and
        normalized; the ids and state keys must match (JSON's string keys raise) and the groups hold no
        other optimizer's options (a Muon state dict's ``momentum``).

        Parameters
        ----------
        state_dict : dict
            As ``state_dict`` returns: every parameter state a finite ``momentum`` of the parameter's shape.

        Raises
        ------
        ValueError, TypeError
            A bad group option, parameter id or state entry, naming the key, before anything changes.
        """
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
        """One Dion2 step for every parameter with a gradient; every group is checked before any changes.

        Parameters
        ----------
        closure : callable, optional
            Re-evaluates the model and returns the loss (torch.optim's ``closure``).

        Returns
        -------
        Tensor or None
            The closure's loss, or None without a closure.
        """
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
