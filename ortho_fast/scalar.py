"""AdamW and Lion as param-group algorithms: the names live in ``ortho_fast.groups.scalar`` (the
param-group layer) and ``ortho_fast.functional.scalar`` (the per-tensor math); they stay importable here."""

from .functional.scalar import adamw_update, lion_update
from .groups.scalar import (
    ADAMW_DEFAULTS,
    LION_DEFAULTS,
    adamw_group_step,
    check_adamw_step,
    check_lion_step,
    lion_group_step,
    normalize_adamw_group,
    normalize_lion_group,
    resolve_adamw_options,
    resolve_lion_options,
)

__all__ = ["ADAMW_DEFAULTS", "LION_DEFAULTS", "adamw_group_step", "adamw_update", "check_adamw_step",
           "check_lion_step", "lion_group_step", "lion_update", "normalize_adamw_group", "normalize_lion_group",
           "resolve_adamw_options", "resolve_lion_options"]
