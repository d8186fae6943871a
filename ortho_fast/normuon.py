"""NorMuon (Li et al., arXiv 2510.05491): Muon with a per-neuron second moment of the orthogonalized update.

``NorMuon`` is ``ortho_fast.Muon`` with the NorMuon stage on and microsoft/dion's ``NorMuon``
defaults and constructor (``dion/normuon.py``): its argument names (``mu``, ``muon_beta2``,
``epsilon``, ``cautious_wd``, ``use_polar_express``, ...) through ``ortho_fast.compat``'s aliases,
its positional order after ``params``, its state key ``variance_neuron``. Every Muon option (the
other pipeline stages included) is accepted by keyword. The math is
``ortho_fast.functional.muon_stages.normuon_normalize``; docs/math.md, "Muon pipeline stages".
"""

from __future__ import annotations

from typing import Iterable

from .compat import MUON_ALIASES
from .muon import Muon

__all__ = ["NORMUON_DEFAULTS", "NorMuon"]

#: NorMuon's defaults where they differ from ``Muon``'s: microsoft/dion ``NorMuon`` (lr 0.01, mu 0.95,
#: muon_beta2 0.95, weight_decay 0.01, nesterov False, adjust_lr "spectral_norm", flatten False,
#: Polar Express, classic momentum M ← μM + G as its ``muon_update_pre_orthogonalize``, the
#: second moment per row with √v + 1e-8).
NORMUON_DEFAULTS: dict[str, object] = {
    "lr": 0.01,
    "momentum": 0.95,
    "normuon_beta2": 0.95,
    "weight_decay": 0.01,
    "nesterov": False,
    "momentum_style": "classic",
    "coefficients": "polar_express",
    "adjust_lr": "spectral_norm",
    "flatten": False,
    "normuon_dim": "row",
    "normuon_eps": 1e-8,
    "normuon_eps_mode": "add",
}

#: microsoft/dion ``NorMuon.__init__``'s positional order after ``params``.
DION_POSITIONAL = ("distributed_mesh", "lr", "mu", "muon_beta2", "betas", "weight_decay", "cautious_wd", "epsilon",
                   "nesterov", "adjust_lr", "flatten")


class NorMuon(Muon):
    """NorMuon: Muon with per-neuron second-moment normalization, with microsoft/dion's signature.

    Per matrix: momentum, O = newton_schulz(U), v ← β₂v + (1 − β₂)·mean(O⊙O) per neuron, O ⊘ (√v + eps)
    scaled back to ‖O‖_F, then Muon's update. ``NorMuon`` is ``Muon`` with ``normuon_beta2`` set and
    microsoft/dion's positional order and defaults (``NORMUON_DEFAULTS``); docs/optimizers.md, "NorMuon".

    Parameters
    ----------
    params : iterable of Tensor, (name, Tensor) pairs or dict
        The parameters or param groups, as ``Muon``'s.
    *positional
        microsoft/dion's order: ``distributed_mesh, lr, mu, muon_beta2, betas, weight_decay, cautious_wd,
        epsilon, nesterov, adjust_lr, flatten``.
    **options
        Any keyword of ``Muon`` or microsoft/dion's ``NorMuon`` (defaults: lr 0.01, normuon_beta2 0.95, ...).

    Raises
    ------
    TypeError
        Too many positional arguments, or an unknown name (with the closest one).
    ValueError
        A bad value, naming the option (``normuon_beta2`` None or outside [0, 1)); and what ``Muon`` raises.

    References
    ----------
    Li et al. 2025, "NorMuon", arXiv 2510.05491; microsoft/dion ``dion/normuon.py``.

    Examples
    --------
    >>> import torch, ortho_fast
    >>> w = torch.nn.Parameter(torch.randn(8, 4))
    >>> opt = ortho_fast.NorMuon([w], lr=0.02)
    >>> w.grad = torch.randn(8, 4)
    >>> opt.step()
    """

    def __init__(self, params: Iterable, *positional, **options) -> None:
        if len(positional) > len(DION_POSITIONAL):
            raise TypeError(f"NorMuon: takes at most {1 + len(DION_POSITIONAL)} positional arguments (microsoft/dion's "
                            f"order), got {1 + len(positional)}")
        for name, value in zip(DION_POSITIONAL, positional):
            if name in options:
                raise TypeError(f"NorMuon: got multiple values for argument {name!r}")
            options[name] = value
        aliased = {a.option for a in MUON_ALIASES if a.name in options}
        for key, value in NORMUON_DEFAULTS.items():
            if key not in options and key not in aliased:
                options[key] = value
        beta2 = options.get("normuon_beta2", options.get("muon_beta2", 0.95))
        if beta2 is None:
            raise ValueError("normuon_beta2: NorMuon needs a number in [0, 1); normuon_beta2=None is plain Muon "
                             "(use ortho_fast.Muon)")
        super().__init__(params, **options)
