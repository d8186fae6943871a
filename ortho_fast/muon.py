"""Muon (MomentUm Orthogonalized by Newton–Schulz): the ``Muon`` optimizer class.

The class only owns state and grouping: the per-tensor math is in ``ortho_fast.functional.muon``
(``muon_momentum``, ``orthogonalize``, ``muon_update``) and ``ortho_fast.functional.layout``
(``muon_layout``), the param-group contract in ``ortho_fast.groups.muon`` (``MUON_DEFAULTS``,
``normalize_muon_group``, ``check_muon_step``, ``muon_group_step``), the distributed step in
``ortho_fast.distributed.muon``. Those names stay importable from here.
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
from .functional.layout import DROPPED_NAME_COMPONENTS, MuonLayout, is_expert_name, muon_layout
from .functional.muon import (
    ADJUST_LR_MODES,
    MOMENTUM_STYLES,
    adjusted_lr_scale,
    muon_momentum,
    muon_update,
    orthogonalize,
)
from .groups.driver import SchedulerCalls, check_then_step, init_groups_if_compiling, tracks_scheduler_calls
from .groups.first_state import init_first_state
from .groups.muon import (
    MUON_DEFAULTS,
    MuonGroups,
    check_muon_step,
    default_eps_mode,
    muon_group_step,
    muon_state_algorithm,
    normalize_muon_group,
    resolve_muon_options,
)
from .groups.qk_clip import check_qk_clip_group, fill_qk_clip_keys, take_qk_clip_options
from .groups.state import (
    add_param_group_checked,
    check_group_algorithm,
    load_state_dict_checked,
    state_dict_with_dtype_names,
)

#: torch.optim.Muon's parameters after ``nesterov``, in its positional order.
TORCH_POSITIONAL = ("ns_coefficients", "eps", "ns_steps", "adjust_lr_fn")

__all__ = ["ADJUST_LR_MODES", "DROPPED_NAME_COMPONENTS", "MOMENTUM_STYLES", "MUON_DEFAULTS", "Muon", "MuonLayout",
           "adjusted_lr_scale", "check_muon_step", "default_eps_mode", "is_expert_name", "muon_group_step",
           "muon_layout", "muon_momentum", "muon_update", "normalize_muon_group", "orthogonalize",
           "resolve_muon_options", "is_mesh"]


def is_mesh(value) -> bool:
    """A DeviceMesh or a ProcessGroup, told by class name (torch.distributed is not imported)."""
    return any(c.__name__ in ("DeviceMesh", "ProcessGroup") for c in type(value).__mro__)


class Muon(SchedulerCalls, Optimizer):
    """Muon (MomentUm Orthogonalized by Newton–Schulz), one process.

    Per matrix W (m, n) of a parameter (``muon_layout``: 2-D as is, ≥ 4-D conv weights
    flattened, experts one matrix each, fused projections split) with gradient G: momentum
    (``momentum_style``, ``nesterov``), O = newton_schulz(U), W ← W·(1 − lr·weight_decay) −
    lr·s·O with s = adjusted_lr_scale(adjust_lr, m, n)·extra_scale_factor.

    Defaults follow ``torch.optim.Muon`` (lr 1e-3, weight_decay 0.1, momentum 0.95, nesterov,
    Keller Jordan's coefficients, 5 steps, eps 1e-7 clamped, bf16 Newton–Schulz, "original"
    lr adjustment). By default the step is the fast one: with bfloat16 / float16 Newton–Schulz
    (the default dtype) same-shape matrices of a group are stacked into one batched call, and
    the momentum and decay run as ``_foreach`` ops; the result is torch's step up to the
    Newton–Schulz rounding (a batched ``bmm`` differs from torch's 2-D ``addmm`` in the last
    bits; within ``ortho_verify.tolerances.ns_tolerance`` of the oracle). ``bitwise_torch=True``
    orthogonalizes matrix by matrix with torch's calls: ``Muon(params, bitwise_torch=True)`` is
    bit-identical to ``torch.optim.Muon(params)`` on CPU for any list of 2-D parameters
    (docs/performance.md, "(b)", for the speed of each). The normalization follows the schedule:
    ``eps_mode`` None is "clamp" (torch's U / max(‖U‖_F, eps)) for "jordan" and "add" (Keller
    Jordan's original U / (s‖U‖_F + eps), as microsoft/dion, Moonlight, nanochat) for every
    other schedule or table (``default_eps_mode``); ``safety`` / ``eps`` None are the named
    schedule's (1.02 / 1e-6 for "polar_express"), else 1 / 1e-7. microsoft/dion's Muon:
    ``momentum_style="classic", nesterov=False, coefficients="polar_express",
    adjust_lr="spectral_norm"`` (its normalization comes from the schedule).
    Megatron: ``momentum_style="ema", nesterov=False, coefficients="cesista5",
    adjust_lr="spectral", dtype="medium"`` plus its split_qkv as ``split_sizes``/``split_groups``.

    Args (each is also a param-group key, see ``MUON_DEFAULTS``): ``coefficients`` registry
    name or per-step rows; ``ns_steps``; ``safety``/``eps``/``eps_mode`` the normalization;
    ``dtype`` the Newton–Schulz compute dtype (``newton_schulz``); ``extra_scale_factor``;
    ``cautious_weight_decay`` decay only where sign(O) = sign(W) (Chen et al. 2025, arXiv
    2510.12402, I(u⊙x ≥ 0)); ``weight_decay_style`` (names of ``ortho_ref.muon.WEIGHT_DECAY_STYLES``)
    "decoupled" (default) W·(1 − lr·weight_decay), "adjusted_lr" W·(1 − lr·s·weight_decay) with the
    matrix's lr multiplier s (nanochat), "independent" W·(1 − weight_decay); ``banks`` None (default): stack
    equal-shaped matrices of a group
    into one batched call when ``dtype`` is bfloat16 / float16 and not ``bitwise_torch``
    (``MuonOptions.batched``), True / False: always / never;
    ``bitwise_torch`` (default False) torch.optim.Muon's bits (see above); ``gram`` Gram
    Newton–Schulz (``newton_schulz``'s ``gram``): None (default) for float32 / float64 compute (not "high")
    on matrices with max(m, n) >= 2·min(m, n) (never with ``bitwise_torch``), True always
    (float16 / float32 / float64 ``dtype`` only; ``dtype=torch.float16, gram=True`` is the float16
    Gram kernel of Dao AI Lab's gram-newton-schulz, restarting every second step), False never; ``expert_keys``
    names whose parameters are (experts, m, n) stacks (needs
    ``Muon(model.named_parameters())``); ``split_sizes``, ``split_groups``, ``num_heads``
    fused-projection splits (per group: put the QKV weights in their own param group);
    ``flatten`` for ≥ 3-D parameters that are not experts: None flattens ≥ 4-D conv weights
    and rejects 3-D (a conv1d weight or an unnamed expert stack: say which), True flattens
    them (conv1d), False treats them as batches of matrices (microsoft/dion's ``flatten``).
    Distributed (``ortho_fast.distributed.muon``; every rank constructs and steps the optimizer
    with the same parameters in the same order): ``distributed_mesh`` a 1-D DeviceMesh or a
    ProcessGroup (microsoft/dion's Muon argument): DTensor parameters sharded on it are FSDP
    (each matrix gathered to one owner rank, round-robin by parameter index, orthogonalized
    there and scattered back; the momentum stays a DTensor like the parameter), plain tensors and
    parameters replicated on it are DDP (the owner orthogonalizes, every rank receives the
    update by broadcast; gradients must already be averaged). ``tp_mesh`` a 1-D DeviceMesh of
    tensor parallelism (``Shard(0)`` colwise, ``Shard(1)`` rowwise, ``_StridedShard`` under FSDP)
    with ``tp_mode`` (Megatron / Emerging-Optimizers names): "duplicated" (all-gather, every TP
    rank orthogonalizes the whole matrix), "distributed" (Newton–Schulz on the shards, the Gram
    matrix all-reduced each step), "blockwise" (each TP shard orthogonalized alone and scaled
    by its own shape: layout-dependent by design). FSDP + TP: ``distributed_mesh=mesh["dp"],
    tp_mesh=mesh["tp"]``. FSDP, DDP and TP "duplicated" are bitwise the one-process update;
    "distributed" equal to rounding (the distributed step orthogonalizes matrix by matrix: its bits are
    those of the one-process step with ``banks=False``). Sharded parameters take no ``banks``, ``split_sizes`` /
    ``split_groups`` / ``num_heads``, ``expert_keys`` or ``flatten=False`` batches (plain and
    replicated ones take every option).
    ``capturable`` (default False; torch's option name): lr, weight_decay and momentum reach the kernels
    as 0-dim tensors on the parameters' device and the step reads nothing from the device (with
    ``check_finite=False``; the finiteness check is its one host read), so a step captured in a CUDA
    graph follows a scheduler: give ``lr`` (``weight_decay``, ``momentum``) as a 0-dim tensor on the
    parameters' device, which torch's LR schedulers write with ``fill_``; a float is copied into a
    device tensor with ``fill_`` at each step (followed in eager; a captured graph replays the value it
    captured). A tensor lr without ``capturable=True`` is refused (ValueError naming ``lr``). The
    update is eager's up to float32 roundoff (a product then a sum where eager passes the lr as a
    kernel's ``alpha``: ``ortho_fast.functional.graph_scalars``). One process only.
    ``check_finite`` (default True): every gradient must be finite, decided for the whole step by
    one fused reduction on the device and one host read (a NaN / Inf raises ValueError naming the
    parameter, before any change); False checks nothing and reads nothing from the device (a NaN
    then propagates, as in torch.optim), which ``torch.compile(opt.step, fullgraph=True)`` needs.
    Pipeline stages (nanochat's order: momentum → MuonEq → Newton–Schulz → Muon+ → NorMuon →
    update; docs/math.md, "Muon pipeline stages"; ``ortho_fast.functional.muon_stages``), each off by
    default: ``row_equilibration`` (MuonEq, arXiv 2603.28254: True / "row" rescales each row of U to
    the root-mean-square row norm, "column" the columns); ``renormalize`` (Muon+, arXiv 2602.21545:
    ‖O‖_F set to √min(m, n)); ``normuon_beta2`` (NorMuon, arXiv 2510.05491: a per-neuron EMA v of
    mean(O⊙O), O divided by √v + ``normuon_eps`` ("add", microsoft/dion) or √max(v, eps) ("clamp",
    nanochat) along ``normuon_dim`` ("row" as microsoft/dion and the paper, "by_shape" as nanochat,
    "column"), then scaled back to ‖O‖_F; state ``variance_neuron``). ``ortho_fast.NorMuon`` is this
    class with NorMuon on. The stages apply per matrix of the layout (per block, per head, per expert).
    QK-clip (MuonClip, Kimi K2 arXiv 2507.20534; ``ortho_fast.groups.qk_clip``), per group:
    ``qk_clip_threshold`` τ (None: off), ``qk_clip_alpha`` (0.5), ``qk_clip_num_heads``,
    ``qk_clip_num_kv_heads`` (GQA), ``qk_clip_layout`` (fused QKV rows: "concatenated" or
    Megatron's "grouped"), ``qk_clip_roles`` / ``qk_clip_layer`` (else read from the names:
    ``Muon(model.named_parameters(), ...)``); the model reports per-head max logits with
    ``step(qk_logits={layer: logits})`` (Motif) or ``record_max_logits(layer, logits)``, and
    after the update each head over τ has its query rows × γ^α and key rows × γ^(1−α),
    γ = τ / max logit (docs/math.md, "QK-clip (MuonClip)"); sharded weights clip their local rows
    (``ortho_fast.distributed.qk_clip``).
    State: ``momentum_buffer`` (the parameter's shape and dtype), as torch.optim.Muon, so its
    checkpoints load (missing group keys are taken from the current groups); the loaded state
    owns its tensors (``load_state_dict`` never aliases the given state dict).
    Source: Jordan et al. 2024 (Muon blog); Liu et al. arXiv 2502.16982; torch.optim.Muon.
    Raises: at construction / add_param_group / load_state_dict, ValueError / TypeError /
    UnknownScheduleError from ``normalize_muon_group``; at ``step``, the same for an option
    edited since, and ValueError for a bad gradient or state, from ``check_muon_step`` for
    every group before any parameter or state changes (distributed: on every rank, after one
    all-reduce of an error flag and of which parameters have a gradient, so a bad shard raises
    everywhere instead of hanging its peers; also a gradient or ``momentum_buffer`` not laid out
    as its parameter, and a parameter with a gradient on some ranks only — every rank must step
    the same parameters);
    at construction LayoutError (a ValueError) for a mesh or a parameter layout that cannot be
    used (``ortho_fast.distributed.muon.MuonSharding``), ValueError naming ``tp_mode`` or an option
    a sharded parameter cannot take; RuntimeError if torch.distributed is not initialized.
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
        """torch's add_param_group, then ``normalize_muon_group`` and the distributed plan of its
        parameters (``MuonSharding.add_group``); a rejected group is not added."""

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
        """torch's ``state_dict`` with dtype options as names (``state_dict_with_dtype_names``),
        and in each group that torch.optim.Muon can express (``to_torch_muon_group``: EMA
        momentum, torch's normalization, bfloat16 Newton–Schulz, one repeated coefficient row,
        an lr adjustment torch has) torch's keys ``ns_coefficients`` / ``ns_steps`` /
        ``adjust_lr_fn`` as well, so ``torch.optim.Muon.load_state_dict`` takes it and steps as
        this optimizer does. Groups torch cannot express lack those keys (torch then fails
        at its step with KeyError 'ns_coefficients')."""
        state_dict = state_dict_with_dtype_names(self)
        for saved, group in zip(state_dict["param_groups"], self.param_groups):
            torch_keys = to_torch_muon_group(group)
            if torch_keys is not None:
                saved.update(torch_keys)
        return state_dict

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load_state_dict through ``load_state_dict_checked``, checked before anything
        changes. A torch.optim.Muon group's settings are mapped (``from_torch_muon_group``:
        ``ns_coefficients``, ``ns_steps``, ``eps``, ``adjust_lr_fn`` and torch's fixed
        behaviour), other Muon keys missing from a saved group are taken from the current group;
        every saved parameter state must be a ``momentum_buffer`` of the parameter's shape, real
        floating and finite (``check_saved_state``; Dion's or AdamW's keys are rejected naming
        the key); the state dict's parameter ids and state keys must match (a checkpoint whose keys
        became strings through JSON raises, saying how to convert them: ``check_state_dict_ids``) and
        its groups may not hold another optimizer's options (torch.optim.SGD's ``dampening``:
        ``check_foreign_options``); the loaded ``momentum_buffer`` tensors are copies.
        Raises: ValueError / TypeError naming the key or option, before anything changes."""
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

        ``layer``: the layer key of its query / key weights (the last integer in their names, as
        Motif's ``qk_logits`` index, else the attention module's path, or the group's
        ``qk_clip_layer``); ``max_logits``: (num_heads,) real tensor, max over the batch of
        q·k/√d per query head. Several calls before a step keep the element-wise maximum; no host
        sync. Raises: TypeError naming ``max_logits`` (further checks at ``step``).
        Source: ``ortho_fast.groups.qk_clip.QKClipRunner.record``."""
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
        """One Muon step for every parameter with a gradient, then QK-clip of every layer with
        maximum logits (``qk_logits`` {layer: (num_heads,) tensor}, Motif's argument, and those
        given to ``record_max_logits``). Returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        init_groups_if_compiling(self)
        with self._qk_clip.around_step(self.param_groups, qk_logits, self.check_finite):
            check_then_step(self.param_groups, self.state, {"muon": self._runner}, "muon",
                            check_finite=self.check_finite)
        return loss
