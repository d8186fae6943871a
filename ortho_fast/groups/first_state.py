"""The state a first one-process step creates, made ahead of it: what ``_init_group`` of each
optimizer runs under ``torch.compile`` (``ortho_fast.groups.driver.init_groups_if_compiling``), so
the state exists before dynamo traces the step and the first compiled step shares its graph with the
later ones. Each algorithm's tensors are those its group step would create, for the parameters
with a gradient, existing entries kept: Muon ``momentum_buffer`` (and NorMuon's ``variance_neuron``),
Dion2 ``momentum``, AdamW ``step`` / ``exp_avg`` / ``exp_avg_sq``, Lion ``exp_avg``. Dion's (its Q0
from the seeded generator) is ``ortho_fast.dion.init_dion_groups``.
"""

from __future__ import annotations

import torch

from .muon_stages import normuon_variances


def init_first_state(group: dict, state, algorithm: str, muon_groups=None) -> None:
    """Create the missing first-step state of ``group``'s parameters with a gradient (see the module
    docstring). ``muon_groups``: the optimizer's ``MuonGroups`` (its plans: options and layouts), for
    Muon groups. Other algorithms (Dion: ``init_dion_groups``) are left to their step."""
    live = [(i, p) for i, p in enumerate(group["params"]) if p.grad is not None]
    if algorithm == "muon" and muon_groups is not None:
        plan = muon_groups.plan(group)
        for i, p in live:
            if "momentum_buffer" not in state[p]:
                state[p]["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
            if plan.options.normuon_beta2 is not None:
                normuon_variances(p, state, plan.layout(i, p), plan.options.normuon_dim)
    elif algorithm == "dion2":
        for _, p in live:
            if "momentum" not in state[p]:
                state[p]["momentum"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
    elif algorithm == "adamw":
        for _, p in live:
            st = state[p]
            if len(st) == 0:  # as ``adamw_group_step`` (not capturable: the counter on the CPU)
                scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
                capturable = group.get("capturable") is True
                st["step"] = torch.zeros((), dtype=scalar, device=p.device if capturable else "cpu")
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    elif algorithm == "lion":
        for _, p in live:
            if "exp_avg" not in state[p]:
                state[p]["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
