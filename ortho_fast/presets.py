"""``optimizer_preset``: an optimizer configured as another system's current matrix step.

Each preset names the ``ortho_fast`` optimizer class and the options that reproduce one system's
current step for matrix parameters (the scalar / embedding side is the user's: give those
parameters to AdamW or use ``HybridOptimizer``). Every value is taken from the system's source,
named beside it (repository, file, the values). The table is in docs/compatibility.md, "Presets";
the judge keeps its own independent table (``ortho_verify.presets``) and a test asserts that the
two agree on every preset.

Each preset was measured against its system's own code (``scripts/preset_compare.py``;
docs/compatibility.md, "Presets measured against their systems"). A preset whose options or class
this build lacks (``Preset.requires``) raises NotImplementedError naming what is missing.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterable, Mapping

import torch

from .compat import MUON_ALIASES
from .groups.muon import MUON_DEFAULTS
from .groups.qk_clip import QK_CLIP_DEFAULTS
from .muon import Muon

__all__ = ["PRESETS", "Preset", "optimizer_preset", "preset_names"]


@dataclass(frozen=True)
class Preset:
    """One system's current matrix step: the ``ortho_fast`` class (its name in the package),
    the constructor options, the source, and the options / classes it needs that may be missing
    from this version (``requires``: names of ``Muon`` options or of ``ortho_fast`` classes)."""

    name: str
    optimizer: str
    options: Mapping = field(default_factory=dict)
    source: str = ""
    requires: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("torch", "Muon", dict(
        lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True, momentum_style="ema", coefficients="jordan",
        ns_steps=5, eps=1e-7, eps_mode="clamp", adjust_lr="original", dtype=torch.bfloat16, bitwise_torch=True),
        "pytorch/pytorch torch/optim/_muon.py (torch.optim.Muon defaults: lr 1e-3, weight_decay 0.1, momentum "
        "0.95, nesterov True, ns_coefficients (3.4445, -4.7750, 2.0315), eps 1e-7 clamped, ns_steps 5, "
        "adjust_lr_fn None = 'original', bf16 Newton-Schulz; bitwise_torch: its bits, matrix by matrix)"),
    Preset("microsoft-dion-muon", "Muon", dict(
        lr=0.01, weight_decay=0.01, momentum=0.95, nesterov=False, momentum_style="classic",
        coefficients="polar_express", eps=1e-8, adjust_lr="spectral_norm", cautious_weight_decay=False,
        flatten=False, dtype=torch.bfloat16),
        "microsoft/dion dion/muon.py Muon.__init__ at 0a059a4 (lr 0.01, mu 0.95, weight_decay 0.01, cautious_wd "
        "False, epsilon 1e-8 - passed to polar_express as its eps: X / (1.02||X|| + 1e-8) -, nesterov False, "
        "adjust_lr 'spectral_norm', flatten False, use_polar_express True); M <- mu*M + G"),
    Preset("moonlight", "Muon", dict(
        lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True, momentum_style="classic", coefficients="jordan",
        ns_steps=5, eps=1e-7, eps_mode="add", adjust_lr="match_rms_adamw", dtype=torch.bfloat16),
        "MoonshotAI/Moonlight examples/toy_train.py Muon (lr 1e-3, wd 0.1, momentum 0.95, nesterov True, "
        "ns_steps 5; buf.mul_(momentum).add_(g); X / (||X|| + 1e-7); lr * 0.2*sqrt(max(A, B)))"),
    Preset("megatron", "Muon", dict(
        lr=3e-4, weight_decay=0.01, momentum=0.95, nesterov=False, momentum_style="ema", coefficients="cesista5",
        ns_steps=5, eps_mode="clamp", adjust_lr="spectral", extra_scale_factor=1.0, dtype="medium"),
        "NVIDIA/Megatron-LM megatron/core/optimizer/optimizer_config.py OptimizerConfig (muon_momentum 0.95, "
        "muon_use_nesterov False, weight_decay 0.01 decoupled, muon_scale_mode 'spectral', muon_fp32_matmul_prec "
        "'medium', muon_num_ns_steps 5, muon_split_qkv True) and megatron/core/optimizer/muon.py "
        "TensorParallelMuon (lr 3e-4: OptimizerConfig has none, coefficient_type 'quintic', extra_scale_factor "
        "1.0); NVIDIA/Emerging-Optimizers (EMA momentum, clamped normalization). split_qkv: pass split_sizes / "
        "split_groups as overrides"),
    Preset("nanochat", "Muon", dict(
        lr=0.02, weight_decay=0.28, momentum=0.95, nesterov=True, momentum_style="ema",
        coefficients="polar_express", ns_steps=5, safety=1.01, eps=1e-6, eps_mode="add", adjust_lr="original",
        cautious_weight_decay=True, weight_decay_style="adjusted_lr", dtype=torch.bfloat16, row_equilibration=True,
        renormalize=True, normuon_beta2=0.9, normuon_dim="by_shape", normuon_eps=1e-10, normuon_eps_mode="clamp"),
        "karpathy/nanochat nanochat/optim.py muon_step_fused at 92d63d4 (2026-07-03): nesterov lerp momentum "
        "0.95 -> MuonEq row equilibration -> Polar Express X/(1.01||X|| + 1e-6), 5 steps, bf16 -> Muon+ "
        "renormalization sqrt(min(m, n)) -> NorMuon variance reduction beta2 0.9 (v = mean of squares over the "
        "last dim when m >= n, else over rows: 'by_shape'; 1/sqrt(max(v, 1e-10)): 'clamp') -> cautious weight "
        "decay with the adjusted lr (p -= lr*g + lr*wd*p*mask, lr = matrix_lr * sqrt(max(1, m/n)): "
        "weight_decay_style 'adjusted_lr'); nanochat/gpt.py setup_optimizer (matrix_lr 0.02, beta2 0.9), "
        "scripts/base_train.py (--weight-decay 0.28, before its batch-size scaling)",
        requires=("row_equilibration", "renormalize", "normuon_beta2", "weight_decay_style")),
    Preset("motif", "Muon", dict(
        lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True, momentum_style="classic", coefficients="cesista5",
        ns_steps=5, eps=1e-7, eps_mode="add", adjust_lr="match_rms_adamw", dtype=torch.bfloat16,
        qk_clip_threshold=100.0, qk_clip_alpha=0.5),
        "MotifTechnologies optimizer muon.py Muon (lr 1e-3, weight_decay 0.1, momentum 0.95, nesterov True, "
        "ns_steps 5, buf.mul_(momentum).add_(g), quintic (4.0848, -6.8946, 2.9270)... in bf16 with "
        "X/(||X|| + 1e-7), lr * 0.2*sqrt(max(A, B)); clip_config threshold 100, scale sqrt(threshold/logit) "
        "on q and k). QK-clip is on once qk_clip_num_heads is given (Motif's default q_indices [] clips nothing)"),
    Preset("microsoft-dion-normuon", "NorMuon", dict(
        lr=0.01, mu=0.95, muon_beta2=0.95, weight_decay=0.01, cautious_wd=False, epsilon=1e-8, nesterov=False,
        adjust_lr="spectral_norm", flatten=False),
        "microsoft/dion dion/normuon.py NorMuon.__init__ at 0a059a4 (lr 0.01, mu 0.95, muon_beta2 0.95, "
        "weight_decay 0.01, cautious_wd False, epsilon 1e-8 - Polar Express's eps -, nesterov False, adjust_lr "
        "'spectral_norm', flatten False, Polar Express; variance sqrt(v) + 1e-8)",
        requires=("NorMuon",)),
    Preset("microsoft-dion-dion2", "Dion2", dict(
        lr=0.01, fraction=0.25, ef_decay=0.95, weight_decay=0.01, adjust_lr="spectral_norm", flatten=False,
        selection_scope="local"),
        "microsoft/dion dion/dion2.py Dion2.__init__ (lr 0.01, fraction 0.25, ef_decay 0.95, weight_decay 0.01, "
        "adjust_lr 'spectral_norm', flatten False, Polar Express, selection_scope 'local')",
        requires=("Dion2",)),
)}


def preset_names() -> tuple[str, ...]:
    """Every preset name, in table order."""
    return tuple(PRESETS)


def _class_of(preset: Preset):
    if preset.optimizer == "Muon":
        return Muon
    cls = getattr(sys.modules[__package__], preset.optimizer, None)  # NorMuon, Dion2
    if cls is None:
        raise NotImplementedError(f"optimizer_preset({preset.name!r}): needs ortho_fast.{preset.optimizer}, which "
                                  "this version of ortho_fast does not have")
    return cls


def _accepted(cls) -> set[str] | None:
    """Keyword names a constructor takes (None: it takes any, **kwargs without a table)."""
    sig = inspect.signature(cls.__init__)
    names = {n for n, p in sig.parameters.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    names.discard("self")
    names.discard("params")
    if cls is Muon or issubclass(cls, Muon):
        return names | set(MUON_DEFAULTS) | set(QK_CLIP_DEFAULTS) | {a.name for a in MUON_ALIASES}
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return names


def optimizer_preset(name: str, params: Iterable, **overrides):
    """An ``ortho_fast`` optimizer configured as system ``name``'s current matrix step.

    The values and their sources are in ``ortho_fast.presets.PRESETS`` and docs/compatibility.md,
    "Presets". "motif" turns QK-clip on (τ = 100) only when ``qk_clip_num_heads`` is given, as Motif
    clips only the heads its ``clip_config`` names.

    Parameters
    ----------
    name : str
        One of ``preset_names()``: "torch", "microsoft-dion-muon", "moonlight", "megatron", "nanochat",
        "motif", "microsoft-dion-normuon", "microsoft-dion-dion2".
    params : iterable of Tensor, (name, Tensor) pairs or dict
        As the optimizer takes them (``model.named_parameters()`` gives QK-clip roles and expert names).
    **overrides
        Any constructor option of that optimizer, replacing the preset's (``lr``, ``distributed_mesh``, ...).

    Returns
    -------
    Muon, NorMuon or Dion2
        The configured optimizer.

    Raises
    ------
    ValueError
        An unknown ``name`` (the message lists the presets), or a bad value from the constructor.
    TypeError
        An override the optimizer does not take, naming the preset and the option.
    NotImplementedError
        A preset whose options or class this version lacks (``Preset.requires``).

    References
    ----------
    torch.optim.Muon; microsoft/dion ``Muon`` / ``NorMuon`` / ``Dion2``; Liu et al. 2025 (Moonlight),
    arXiv 2502.16982; Megatron-LM / NVIDIA-NeMo Emerging-Optimizers; karpathy/nanochat; Motif's Muon.

    Examples
    --------
    >>> import torch, ortho_fast
    >>> w = torch.nn.Parameter(torch.randn(8, 4))
    >>> opt = ortho_fast.optimizer_preset("microsoft-dion-muon", [w], lr=0.02)
    >>> type(opt).__name__, opt.param_groups[0]["coefficients"]
    ('Muon', 'polar_express')
    """
    if name not in PRESETS:
        raise ValueError(f"name: unknown optimizer preset {name!r}; known: {list(PRESETS)}")
    preset = PRESETS[name]
    cls = _class_of(preset)
    accepted = _accepted(cls)
    if accepted is not None:
        missing = [r for r in preset.requires if r not in accepted and r != preset.optimizer]
        if missing:
            raise NotImplementedError(f"optimizer_preset({name!r}): needs the {preset.optimizer} options {missing} "
                                      "(Muon pipeline stages), which this version of ortho_fast does not have")
        unknown = sorted(k for k in overrides if k not in accepted)
        if unknown:
            raise TypeError(f"optimizer_preset({name!r}): unknown option {unknown[0]!r} for {preset.optimizer}; "
                            f"options: {sorted(accepted)}")
    options = dict(preset.options)
    for alias in MUON_ALIASES if cls is Muon or issubclass(cls, Muon) else ():
        if alias.name in overrides:  # another system's name for an option replaces the preset's value of it
            options.pop(alias.option, None)
    options.update(overrides)
    if name == "motif" and options.get("qk_clip_num_heads") is None and "qk_clip_threshold" not in overrides:
        options["qk_clip_threshold"] = None
    return cls(params, **options)
