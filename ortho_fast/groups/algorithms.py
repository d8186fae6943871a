"""The param-group algorithms an optimizer here can run: each one's option defaults, its
group functions and its one-process ``GroupRunner``."""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple

from .dion import DION_DEFAULTS, DionGroups, check_dion_step, dion_group_step, normalize_dion_group
from .dion2 import DION2_DEFAULTS, Dion2Groups, check_dion2_step, dion2_group_step, normalize_dion2_group
from .driver import GroupRunner
from .muon import MUON_DEFAULTS, MuonGroups, check_muon_step, muon_group_step, normalize_muon_group
from .scalar import (
    ADAMW_DEFAULTS,
    LION_DEFAULTS,
    ElementwiseGroups,
    adamw_group_step,
    check_adamw_step,
    check_lion_step,
    lion_group_step,
    normalize_adamw_group,
    normalize_lion_group,
)


class Algorithm(NamedTuple):
    """One param-group algorithm: its option defaults and its three group functions."""

    defaults: Mapping[str, object]
    normalize: Callable[[dict], None]
    check: Callable[[dict, Mapping], None]
    step: Callable[..., None]


#: The algorithms a group may name. "dion"'s step also takes ``seed`` and ``first_index``.
ALGORITHMS: dict[str, Algorithm] = {
    "muon": Algorithm(MUON_DEFAULTS, normalize_muon_group, check_muon_step, muon_group_step),
    "dion": Algorithm(DION_DEFAULTS, normalize_dion_group, check_dion_step, dion_group_step),
    "dion2": Algorithm(DION2_DEFAULTS, normalize_dion2_group, check_dion2_step, dion2_group_step),
    "adamw": Algorithm(ADAMW_DEFAULTS, normalize_adamw_group, check_adamw_step, adamw_group_step),
    "lion": Algorithm(LION_DEFAULTS, normalize_lion_group, check_lion_step, lion_group_step),
}
MATRIX_ALGORITHMS = ("muon", "dion", "dion2")
SCALAR_ALGORITHMS = ("adamw", "lion")


def local_runners(seed: int) -> dict[str, GroupRunner]:
    """A fresh one-process runner per algorithm (options cached per runner); ``seed`` for Dion."""
    return {"muon": MuonGroups(), "dion": DionGroups(seed), "dion2": Dion2Groups(),
            "adamw": ElementwiseGroups(check_adamw_step, adamw_group_step),
            "lion": ElementwiseGroups(check_lion_step, lion_group_step)}
