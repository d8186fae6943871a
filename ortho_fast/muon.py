"""Muon (MomentUm Orthogonalized by Newton–Schulz): the ``Muon`` optimizer class.

The class only owns state and grouping: the per-tensor math is in ``ortho_fast.functional.muon``
(``muon_momentum``, ``orthogonalize``, ``muon_update``) and ``ortho_fast.functional.layout``
(``muon_layout``), the param-group contract in ``ortho_fast.groups.muon`` (``MUON_DEFAULTS``,
``normalize_muon_group``, ``check_muon_step``, ``muon_group_step``), the distributed step in
``ortho_fast.distributed.muon``; import those names from there.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch
from torch.optim import Optimizer

from .coefficients import CoefficientsLike
from .compat import (
    MUON_ALIASES,
    aliases_used,
    apply_aliases,
    canonical_group,
    check_fixed_in_group,
    from_torch_muon_group,
    named_as_given,
    to_torch_muon_group,
)
from .groups.driver import SchedulerCalls, check_then_step, init_groups_if_compiling, tracks_scheduler_calls
from .groups.first_state import init_first_state
from .groups.muon import MUON_DEFAULTS, MuonGroups, muon_state_algorithm, normalize_muon_group
from .groups.qk_clip import check_qk_clip_group, fill_qk_clip_keys, take_qk_clip_options
from .groups.state import (
    add_param_group_checked,
    check_group_algorithm,
    load_state_dict_checked,
    state_dict_with_dtype_names,
)

#: torch.optim.Muon's parameters after ``nesterov``, in its positional order.
TORCH_POSITIONAL = ("ns_coefficients", "eps", "ns_steps", "adjust_lr_fn")

__all__ = ["Muon", "is_mesh"]


def is_mesh(value) -> bool:
    """A DeviceMesh or a ProcessGroup, told by class name (torch.distributed is not imported)."""
    return any(c.__name__ in ("DeviceMesh", "ProcessGroup") for c in type(value).__mro__)


class Muon(SchedulerCalls, Optimizer):
    """Muon (MomentUm Orthogonalized by Newton–Schulz), one process or distributed.

    Per matrix W (m, n) of a parameter with gradient G: momentum U, O = newton_schulz(U), W ← W·(1 − lr·wd)
    − lr·s·O with s = adjusted_lr_scale(adjust_lr, m, n)·extra_scale_factor. Defaults are torch.optim.Muon's;
    every option is also a param-group key, explained in docs/optimizers.md, "Muon".

    Parameters
    ----------
    params : iterable of Tensor, (name, Tensor) pairs or dict
        The parameters or param groups; names (``model.named_parameters()``) feed ``expert_keys`` and QK-clip.
    lr, weight_decay, momentum : float or 0-dim Tensor, default 1e-3, 0.1, 0.95
        Learning rate, decoupled weight decay, momentum coefficient (a Tensor needs ``capturable=True``).
    nesterov : bool, default True
        Orthogonalize the Nesterov mix of G and M (U = G + μ(M − G) or G + μM) instead of M.
    *torch_positional
        torch.optim.Muon's positional ``ns_coefficients, eps, ns_steps, adjust_lr_fn``.
    momentum_style : {"ema", "classic"}, default "ema"
        torch's momentum M ← M + (1 − μ)(G − M), or microsoft/dion's M ← μM + G.
    coefficients : str or sequence of (a, b, c), default "jordan"
        A schedule of ``ortho_fast.COEFFICIENTS`` or per-step odd-quintic rows.
    ns_steps, safety, eps, eps_mode : int, float, float, {"clamp", "add"}, default None
        Steps and normalization X₀ = U / max(‖U‖_F, eps) or U / (safety·‖U‖_F + eps); None: the schedule's.
    adjust_lr, extra_scale_factor : str or None, float, default "original", 1.0
        The per-matrix lr multiplier s ("original" √max(1, m/n), "spectral_norm" √(m/n), ...) and a factor on it.
    cautious_weight_decay, weight_decay_style : bool, str, default False, "decoupled"
        Decay only where sign(O) = sign(W); "decoupled", "adjusted_lr" or "independent" decay.
    dtype, banks, bitwise_torch, gram : torch.dtype or str, bool or None, bool, bool or None
        Newton–Schulz compute dtype (bfloat16), stacking (None), torch's bits (False), Gram Newton–Schulz (None).
    expert_keys, split_sizes, split_groups, num_heads, flatten : layout options, default (), None, 1, None, None
        Which matrices a parameter holds: expert stacks, fused-projection splits, ≥ 3-D parameters.
    row_equilibration, renormalize : bool or {"row", "column"}, bool, default False, False
        MuonEq (arXiv 2603.28254) on U; Muon+ (arXiv 2602.21545): ‖O‖_F set to √min(m, n).
    normuon_beta2, normuon_eps, normuon_eps_mode, normuon_dim : float or None, float, str, str
        NorMuon (arXiv 2510.05491), off while ``normuon_beta2`` is None (1e-8, "add", "row").
    distributed_mesh, tp_mesh, tp_mode : DeviceMesh or ProcessGroup, DeviceMesh, str, default None, None, "duplicated"
        Data-parallel (FSDP / DDP) and tensor-parallel axes; "duplicated", "distributed" or "blockwise" TP.
    check_finite, capturable : bool, default True, False
        Check every gradient finite (one host read); hyperparameters as device tensors for CUDA graphs.
    **aliases
        torch's, microsoft/dion's and Megatron's names (``mu``, ``ns_coefficients``, ...) and ``qk_clip_*``.

    Raises
    ------
    ValueError, TypeError, UnknownScheduleError
        A bad option, parameter, gradient or state, naming it, before any parameter or state changes.
    LayoutError, RuntimeError
        A mesh or parameter layout the distributed step cannot use; torch.distributed not initialized.

    References
    ----------
    Jordan et al. 2024, "Muon" (blog; KellerJordan/Muon); Liu et al. 2025, "Muon is Scalable for LLM
    Training" (Moonlight), arXiv 2502.16982; ``torch.optim.Muon``; microsoft/dion ``dion/muon.py``.

    Examples
    --------
    >>> import torch, ortho_fast
    >>> w = torch.nn.Parameter(torch.randn(8, 4))
    >>> opt = ortho_fast.Muon([w], lr=0.02)
    >>> w.grad = torch.randn(8, 4)
    >>> opt.step()
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        *torch_positional,
        momentum_style: str = "ema",
        coefficients: CoefficientsLike = "jordan",
        ns_steps: int | None = None,
        safety: float | None = None,
        eps: float | None = None,
        eps_mode: str | None = None,
        adjust_lr: str | None = "original",
        extra_scale_factor: float = 1.0,
        cautious_weight_decay: bool = False,
        weight_decay_style: str = "decoupled",
        dtype: torch.dtype | str | None = torch.bfloat16,
        banks: bool | None = None,
        bitwise_torch: bool = False,
        gram: bool | None = None,
        expert_keys: Sequence[str] = (),
        split_sizes: Sequence[int] | None = None,
        split_groups: int = 1,
        num_heads: int | Sequence[int] | None = None,
        flatten: bool | None = None,
        row_equilibration: bool | str = False,
        renormalize: bool = False,
        normuon_beta2: float | None = None,
        normuon_eps: float = 1e-8,
        normuon_eps_mode: str = "add",
        normuon_dim: str = "row",
        distributed_mesh=None,
        tp_mesh=None,
        tp_mode: str = "duplicated",
        check_finite: bool = True,
        capturable: bool = False,
        **aliases,
    ) -> None:
        if is_mesh(lr):
            raise TypeError("lr: got a DeviceMesh / ProcessGroup: microsoft/dion's Muon takes distributed_mesh "
                            "second; here the positional order is torch.optim.Muon's (params, lr, weight_decay, "
                            "momentum, nesterov, ...): pass distributed_mesh=... by keyword")
        if len(torch_positional) > len(TORCH_POSITIONAL):
            raise TypeError(f"Muon: takes at most {5 + len(TORCH_POSITIONAL)} positional arguments (torch.optim."
                            f"Muon's order), got {5 + len(torch_positional)}")
        given = dict(zip(TORCH_POSITIONAL, torch_positional))
        qk_clip = take_qk_clip_options(aliases)  # the qk_clip_* keywords (ortho_fast.groups.qk_clip)
        options = dict(
            lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov, momentum_style=momentum_style,
            coefficients=coefficients, ns_steps=ns_steps, safety=safety, eps=eps, eps_mode=eps_mode,
            adjust_lr=adjust_lr, extra_scale_factor=extra_scale_factor, cautious_weight_decay=cautious_weight_decay,
            weight_decay_style=weight_decay_style, dtype=dtype, banks=banks, bitwise_torch=bitwise_torch, gram=gram,
            expert_keys=expert_keys,
            split_sizes=split_sizes,
            split_groups=split_groups, num_heads=num_heads, flatten=flatten, row_equilibration=row_equilibration,
            renormalize=renormalize, normuon_beta2=normuon_beta2, normuon_eps=normuon_eps,
            normuon_eps_mode=normuon_eps_mode, normuon_dim=normuon_dim, distributed_mesh=distributed_mesh,
            tp_mesh=tp_mesh, tp_mode=tp_mode, capturable=capturable,
        )
        for name in ("eps", "ns_steps"):  # torch's positional order, our keyword names
            if name in given:
                if options[name] is not None:
                    raise TypeError(f"Muon: got multiple values for argument {name!r}")
                options[name] = given.pop(name)
        for name, value in given.items():
            if name in aliases:
                raise TypeError(f"Muon: got multiple values for argument {name!r}")
            aliases[name] = value
        used = aliases_used(aliases, MUON_ALIASES)  # errors name the user's names (mu, not momentum)
        apply_aliases(aliases, MUON_ALIASES, options, {**MUON_DEFAULTS, "distributed_mesh": None, "tp_mesh": None,
                                                        "tp_mode": "duplicated"}, fixed="muon", where="Muon")
        distributed_mesh, tp_mesh, tp_mode = (options.pop(k) for k in ("distributed_mesh", "tp_mesh", "tp_mode"))
        defaults = {**options, **qk_clip}
        with named_as_given(used):
            normalize_muon_group({**defaults, "params": []})
            check_qk_clip_group({**defaults, "params": []})  # the defaults themselves, before any group
        from .distributed.muon import MuonSharding
        from .distributed.qk_clip import sharded_qk_clip_runner

        if not isinstance(check_finite, bool):
            raise TypeError(f"check_finite: expected a bool, got {check_finite!r}")
        self.check_finite = check_finite
        self._sharding = MuonSharding(distributed_mesh, tp_mesh, tp_mode)
        if self._sharding.active and capturable is True:
            raise ValueError("capturable: the distributed step (distributed_mesh / tp_mesh) reads its plan on the "
                             "host; capturable=True is for the one-process step")
        self._runner = self._sharding if self._sharding.active else MuonGroups()
        self._qk_clip = sharded_qk_clip_runner(self._sharding)
        super().__init__(params, defaults)

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_sharding": self._sharding, "_runner": self._runner,
                "check_finite": self.check_finite, "_qk_clip": self._qk_clip}

    def add_param_group(self, param_group: dict) -> None:
        """Add a param group: torch's checks, then the group's options validated and its distributed plan made.

        Parameters
        ----------
        param_group : dict
            ``params`` and any option of the constructor (torch's and microsoft/dion's names accepted).

        Raises
        ------
        ValueError, TypeError
            A bad option or parameter, naming it; a rejected group is not added.
        """

        def normalize(group: dict) -> None:
            check_group_algorithm(group, "muon", "Muon")
            check_fixed_in_group(group, "muon")  # microsoft/dion's betas, use_triton, ...: checked, unused
            normalize_muon_group(group)
            check_qk_clip_group(group)
            self._sharding.add_group(group)

        used = aliases_used(param_group, MUON_ALIASES)
        if isinstance(param_group, dict):
            param_group = canonical_group(dict(param_group), MUON_ALIASES)
        with named_as_given(used):
            add_param_group_checked(self, param_group, normalize)

    def state_dict(self) -> dict:
        """torch's ``state_dict``, with torch.optim.Muon's keys in every group it can express.

        Dtype options are written as names; a group torch.optim.Muon can express (EMA momentum, torch's
        normalization, bfloat16 Newton–Schulz, one repeated coefficient row, an lr adjustment torch has)
        also carries ``ns_coefficients`` / ``ns_steps`` / ``adjust_lr_fn``, so torch loads it and steps
        as this optimizer does (docs/optimizers.md, "State and checkpoints").

        Returns
        -------
        dict
            ``{"state": {index: {"momentum_buffer": Tensor}}, "param_groups": [dict, ...]}``.
        """
        state_dict = state_dict_with_dtype_names(self)
        for saved, group in zip(state_dict["param_groups"], self.param_groups):
            torch_keys = to_torch_muon_group(group)
            if torch_keys is not None:
                saved.update(torch_keys)
        return state_dict

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state dict of this class or of torch.optim.Muon, checked before anything changes.

        A torch.optim.Muon group's settings are mapped; Muon keys missing from a saved group are taken
        from the current group; the loaded ``momentum_buffer`` tensors are copies (docs/optimizers.md,
        "State and checkpoints").

        Parameters
        ----------
        state_dict : dict
            As ``state_dict`` returns: every parameter state a finite ``momentum_buffer`` of its shape.

        Raises
        ------
        ValueError, TypeError
            A bad group option, parameter id or state entry, naming the key, before anything changes.
        """
        def spec(i: int, saved: dict, current: dict):
            used = aliases_used(saved, MUON_ALIASES)
            canonical_group(from_torch_muon_group(fill_qk_clip_keys(saved, current)), MUON_ALIASES)
            check_group_algorithm(saved, "muon", "Muon")

            def normalize(trial: dict) -> None:
                with named_as_given(used):
                    check_fixed_in_group(trial, "muon")
                    normalize_muon_group(trial)
                    check_qk_clip_group(trial)

            return MUON_DEFAULTS, normalize

        load_state_dict_checked(self, state_dict, spec, algorithm_of=muon_state_algorithm)
        self._runner.reset()

    def record_max_logits(self, layer, max_logits: torch.Tensor) -> None:
        """Report one attention layer's per-head maximum logits for the next ``step``'s QK-clip.

        Several calls before a step keep the element-wise maximum; no host synchronization.

        Parameters
        ----------
        layer : int or str
            The layer key of its query / key weights (the last integer in their names, as Motif's
            ``qk_logits`` index, else the attention module's path, or the group's ``qk_clip_layer``).
        max_logits : (num_heads,) real Tensor
            The maximum over the batch of q·k/√d per query head.

        Raises
        ------
        TypeError
            ``max_logits`` is not a real tensor (further checks at ``step``).

        References
        ----------
        Kimi K2, arXiv 2507.20534, Algorithm 1 (MuonClip); ``ortho_fast.groups.qk_clip.QKClipRunner.record``.
        """
        self._qk_clip.record(layer, max_logits)

    def _init_group(self, group: dict) -> None:
        """The state the first step creates for the parameters with a gradient of every group (``group``:
        the first; ``ortho_fast.groups.first_state.init_first_state``: ``momentum_buffer`` zeros, NorMuon's
        ``variance_neuron``), one process only; run by dynamo outside the graph (``init_groups_if_compiling``)."""
        for each in self.param_groups if not self._sharding.active else ():
            init_first_state(each, self.state, "muon", self._runner)

    @property
    def workspace_nbytes(self) -> int:
        """Bytes of the buffers the stacked step keeps between steps (``ortho_fast.functional.stacked.
        Workspace``: its largest chunk, within ``stacked.workspace_budget``; 0 before the first step,
        on the ``bitwise_torch`` path and in the distributed step)."""
        workspace = getattr(self._runner, "workspace", None)
        return 0 if workspace is None else workspace.nbytes

    @property
    def qk_clip_factors(self) -> dict:
        """{layer: γ per key group (device tensor)} of the last step's QK-clip (1.0: not clipped), for logging."""
        return dict(self._qk_clip.last_factors)

    @tracks_scheduler_calls
    @torch.no_grad()
    def step(self, closure=None, qk_logits=None):
        """One Muon step for every parameter with a gradient, then QK-clip of the layers with logits.

        Every group is checked first (gradients, state, options), so a bad one raises before any
        parameter or state changes.

        Parameters
        ----------
        closure : callable, optional
            Re-evaluates the model and returns the loss (torch.optim's ``closure``).
        qk_logits : dict of {layer: (num_heads,) Tensor}, optional
            Per-head maximum logits for QK-clip (Motif's argument), with those of ``record_max_logits``.

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
        with self._qk_clip.around_step(self.param_groups, qk_logits, self.check_finite):
            check_then_step(self.param_groups, self.state, {"muon": self._runner}, "muon",
                            check_finite=self.check_finite)
        return loss
