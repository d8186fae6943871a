"""Names of the systems our users come from, mapped onto ours: one alias table per optimizer and
per configuration, and the mapping of torch.optim.Muon's param groups (its checkpoints) in both
directions.

Each ``Alias`` says which option of ours another system's name sets, how its value converts
(``adjust_lr_fn=None`` is torch's "original"; ``use_polar_express=False`` is "cesista5") and where
the name comes from. ``FIXED`` lists options that exist elsewhere but have no counterpart here:
they are accepted only at the values whose behaviour is ours (``cqr_warmup_steps``, ignored by
microsoft/dion itself; ``use_triton=False``), and rejected otherwise with the reason. The tables
are documented, one row per name, in docs/compatibility.md; the facts about each system are in
docs/design.md, "Systems our users come from".
Sources (read, not copied): torch ``torch/optim/_muon.py``; microsoft/dion ``dion/dion.py``,
``dion/muon.py``; allenai/OLMo-core ``src/olmo_core/optim/{dion,muon}.py``; NVIDIA Megatron-LM
``megatron/core/optimizer/optimizer_config.py`` and ``emerging_optimizers.py``.
"""

from __future__ import annotations

import contextlib
import difflib
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import torch

from .documents import doc_reference

__all__ = [
    "Alias", "DION2_ALIASES", "DION_ALIASES", "DION_CONFIG_ALIASES", "FIXED", "FixedOption", "MUON_ALIASES",
    "MUON_CONFIG_ALIASES",
    "TORCH_MUON_GROUP_KEYS", "TORCH_MUON_SEMANTICS", "VALUE_ALIASES", "aliases_used", "apply_aliases",
    "canonical_group", "named_as_given",
    "canonical_value", "check_fixed", "check_fixed_in_group", "from_torch_muon_group",
    "is_torch_muon_group", "mixed_precision_dtypes", "reject_unknown", "suggest", "to_torch_muon_group",
]


def _same(value):
    return value


@dataclass(frozen=True)
class Alias:
    """Another system's name for one of our options.

    ``name`` the other system's spelling; ``option`` ours; ``source`` the system; ``convert``
    their value -> ours (raises ValueError naming ``name`` for a value with no counterpart);
    ``implies`` options of ours set as well when still at None (torch's ``ns_coefficients``
    implies torch's normalization ``eps_mode="clamp"``).
    """

    name: str
    option: str
    source: str
    convert: Callable[[Any], Any] = _same
    implies: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class FixedOption:
    """An option of another system with no counterpart here: accepted only where ``allowed(value)``
    (the behaviour is ours), else ValueError with ``reason``."""

    name: str
    source: str
    allowed: Callable[[Any], bool]
    reason: str


#: Keller Jordan's row, torch.optim.Muon's default ``ns_coefficients``.
_JORDAN_ROW = (3.4445, -4.7750, 2.0315)
_TORCH = "torch.optim.Muon"
_DION = "microsoft/dion Dion"
_DION_MUON = "microsoft/dion Muon"
_OLMO = "OLMo-core"
_EMERGING = "NVIDIA Emerging-Optimizers Muon"
_MEGATRON = "Megatron-LM OptimizerConfig"


def _ns_coefficients(value):
    """torch's single (a, b, c) row -> our coefficients: "jordan" for Keller Jordan's row (the registry name
    keeps torch's bits), else the row itself (one row: 5 steps unless ``ns_steps``, torch's convention)."""
    try:
        row = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"ns_coefficients: expected a tuple of three numbers (a, b, c), got {value!r}") from None
    if len(row) != 3:
        raise ValueError(f"ns_coefficients: expected exactly three coefficients (a, b, c), got {value!r}")
    return "jordan" if row == _JORDAN_ROW else row


def _adjust_lr_fn(value):
    """torch's ``adjust_lr_fn``: None means "original" there (√max(1, m/n)), not our None (1)."""
    if value is None or value == "original":
        return "original"
    if value == "match_rms_adamw":
        return value
    raise ValueError(f"adjust_lr_fn: expected None, 'original' or 'match_rms_adamw' (torch.optim.Muon), got {value!r}")


#: Values another system spells differently for an option of the same name: microsoft/dion's
#: and OLMo-core's ``adjust_lr="rms_norm"`` is 0.2·√max(m, n), our "match_rms_adamw".
VALUE_ALIASES: dict[str, dict[Any, Any]] = {"adjust_lr": {"rms_norm": "match_rms_adamw"}}


def canonical_value(key: str, value):
    """``value`` of option ``key`` in our spelling (``VALUE_ALIASES``)."""
    table = VALUE_ALIASES.get(key)
    if table is not None and isinstance(value, str) and value in table:
        return table[value]
    return value


def _use_polar_express(value):
    if not isinstance(value, bool):
        raise ValueError(f"use_polar_express: expected a bool, got {value!r}")
    return "polar_express" if value else "cesista5"


#: Emerging-Optimizers ``coefficient_type`` -> our registry (see ``ortho_fast.coefficients``).
_COEFFICIENT_TYPES = {"simple": "jordan", "quintic": "cesista5", "cubic": "cubic"}


def _coefficient_type(value):
    if value in _COEFFICIENT_TYPES:
        return _COEFFICIENT_TYPES[value]
    if value == "polar_express":
        raise ValueError("coefficient_type: Emerging-Optimizers' 'polar_express' (paper rows rounded to 4 decimals, "
                         ">= 8 steps) is not this registry's 'polar_express' (microsoft/dion's rows); pass its rows "
                         "as coefficients=[(a, b, c), ...]")
    raise ValueError(f"coefficient_type: expected one of {sorted(_COEFFICIENT_TYPES)}, got {value!r}")


def _betas_pair(name: str):
    def convert(value):
        try:
            b1, b2 = (float(v) for v in value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: expected two numbers (beta1, beta2), got {value!r}") from None
        if not all(0.0 <= b <= 1.0 for b in (b1, b2)):
            raise ValueError(f"{name}: expected values in [0, 1], got {value!r}")
        return (b1, b2)
    return convert


def _scalar_optimizer(value):
    if value in ("adam", "adamw"):
        return "adamw"
    if value == "lion":
        return "lion"
    raise ValueError(f"muon_scalar_optimizer: expected 'adam' or 'lion', got {value!r}")


MUON_ALIASES: tuple[Alias, ...] = (
    Alias("ns_coefficients", "coefficients", _TORCH, _ns_coefficients, implies=(("eps_mode", "clamp"),)),
    Alias("adjust_lr_fn", "adjust_lr", _TORCH, _adjust_lr_fn),
    Alias("mu", "momentum", _DION_MUON),
    Alias("epsilon", "eps", _DION_MUON),
    Alias("cautious_wd", "cautious_weight_decay", _DION_MUON),
    Alias("muon_beta2", "normuon_beta2", "microsoft/dion NorMuon"),
    Alias("use_polar_express", "coefficients", _DION_MUON, _use_polar_express),
    Alias("coefficient_type", "coefficients", _EMERGING, _coefficient_type),
    Alias("num_ns_steps", "ns_steps", _EMERGING),
    Alias("scale_mode", "adjust_lr", _EMERGING),
    Alias("fp32_matmul_prec", "dtype", _EMERGING),
    Alias("muon_momentum", "momentum", _MEGATRON),
    Alias("muon_nesterov", "nesterov", _MEGATRON),
    Alias("muon_coefficient_type", "coefficients", _MEGATRON, _coefficient_type),
    Alias("muon_num_ns_steps", "ns_steps", _MEGATRON),
    Alias("muon_scale_mode", "adjust_lr", _MEGATRON),
    Alias("muon_fp32_matmul_prec", "dtype", _MEGATRON),
    Alias("muon_extra_scale_factor", "extra_scale_factor", _MEGATRON),
    Alias("muon_tp_mode", "tp_mode", _MEGATRON),
)

DION_ALIASES: tuple[Alias, ...] = (
    Alias("rcqr_oversample", "oversample", _DION),
)

_DION2 = "microsoft/dion Dion2"

#: microsoft/dion ``Dion2``'s names that differ from ours (its other names are ours: lr,
#: fraction, ef_decay, weight_decay, epsilon, adjust_lr with "rms_norm" as a value alias,
#: flatten, selection_scope, distributed_mesh).
DION2_ALIASES: tuple[Alias, ...] = (
    Alias("use_polar_express", "coefficients", _DION2, _use_polar_express),
)

#: ``MuonConfig``: the Muon names, OLMo-core's ``MuonConfig`` and Megatron's scalar-side names.
MUON_CONFIG_ALIASES: tuple[Alias, ...] = MUON_ALIASES + (
    Alias("betas", "scalar_betas", _OLMO, _betas_pair("betas")),
    Alias("adam_eps", "scalar_eps", _MEGATRON),
    Alias("muon_scalar_optimizer", "scalar_algorithm", _MEGATRON, _scalar_optimizer),
)

#: ``DionConfig``: the Dion names and OLMo-core's ``DionConfig``.
DION_CONFIG_ALIASES: tuple[Alias, ...] = DION_ALIASES


def _is(expected):
    return lambda value: value is expected or (type(value) is type(expected) and value == expected)


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _valid_betas(value) -> bool:
    try:
        return _betas_pair("betas")(value) is not None
    except ValueError:
        return False


_BETAS_REASON = ("expected two numbers in [0, 1]; microsoft/dion uses them for its AdamW / Lion groups, which run "
                 "in HybridOptimizer here (this optimizer has none, so they change nothing)")

def _newton_schulz_kernel_options(source) -> tuple[FixedOption, ...]:
    """microsoft/dion's kernel switches (its Muon and Dion2 share them), accepted at the value
    that computes what ortho_fast computes."""
    return (
        FixedOption("use_triton", source, _is(False), "no Triton kernels here; the Newton–Schulz kernels are "
                    "chosen by ortho_fast (set it to False)"),
        FixedOption("use_gram_newton_schulz", source, _is(False), "set it to False: ortho_fast's own option is "
                    "gram (None chooses Gram Newton–Schulz in float32 / float64; in bfloat16, microsoft/dion's "
                    "default, its error exceeds the Newton–Schulz tolerance, so gram=True needs dtype=torch.float16 or "
                    "torch.float32)"),
        FixedOption("newton_schulz_func", source, _is(None), "a custom function cannot be checked; pass its "
                    "coefficient rows as coefficients=[(a, b, c), ...]"),
    )


FIXED: dict[str, tuple[FixedOption, ...]] = {
    "muon": (
        FixedOption("betas", _DION_MUON, _valid_betas, _BETAS_REASON),
        *_newton_schulz_kernel_options(_DION_MUON),
        FixedOption("split_qkv", _EMERGING, _is(False), "put the fused QKV weights in their own param group with "
                    "split_sizes=(q, k, v) (and split_groups / num_heads)"),
        FixedOption("muon_split_qkv", _MEGATRON, _is(False), "put the fused QKV weights in their own param group "
                    "with split_sizes=(q, k, v) (and split_groups / num_heads)"),
        FixedOption("muon_use_syrk", _MEGATRON, _is(False), "the symmetric Gram product is chosen by ortho_fast "
                    "(set it to False)"),
    ),
    "dion": (
        FixedOption("betas", _DION, _valid_betas, _BETAS_REASON),
        FixedOption("cqr_warmup_steps", _DION, lambda v: v is None or _is_count(v),
                    "expected a non-negative integer (microsoft/dion ignores it; so does ortho_fast)"),
    ),
}
FIXED["dion2"] = (
    FixedOption("betas", _DION2, _valid_betas, _BETAS_REASON),
    *_newton_schulz_kernel_options(_DION2),
    FixedOption("triton_post_ortho", _DION2, _is(False), "the fused single-rounding update kernel is not ours: the "
                "update here rounds as dion2_post_orthogonalize does (set it to False)"),
    FixedOption("verbose", _DION2, lambda v: isinstance(v, bool), "expected a bool (it only prints the selected "
                "dimension; the rule is ortho_fast.functional.dion2.dion2_select_rows)"),
)
FIXED["muon_config"] = tuple(f for f in FIXED["muon"] if f.name != "betas")
FIXED["dion_config"] = tuple(f for f in FIXED["dion"] if f.name != "betas")


def suggest(name: str, known: Iterable[str]) -> str:
    """'; did you mean 'x'?' for the closest of ``known`` (difflib), or ''."""
    close = difflib.get_close_matches(name, sorted(set(known)), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def reject_unknown(names: Iterable[str], known: Iterable[str], where: str) -> None:
    """Raise TypeError (Python's error for an unexpected keyword) for the first of ``names``,
    with the closest known name. Source: docs/compatibility.md."""
    known = list(known)
    for name in names:
        raise TypeError(f"{where}: unexpected keyword argument {name!r}{suggest(name, known)} "
                        f"(the names accepted are listed in {doc_reference('compatibility.md')})")


def check_fixed(name: str, value, table: str) -> bool:
    """True if ``name`` is a ``FIXED[table]`` option (then its value was checked).
    Raises: ValueError naming the option and the reason for a value whose behaviour is not ours."""
    for fixed in FIXED[table]:
        if fixed.name == name:
            if not fixed.allowed(value):
                raise ValueError(f"{name}: {value!r} has no counterpart in ortho_fast ({fixed.source}): {fixed.reason}")
            return True
    return False


def check_fixed_in_group(group: Mapping[str, Any], table: str) -> None:
    """``check_fixed`` for every ``FIXED[table]`` name a param group holds (a group given to
    ``add_param_group`` or a saved one: microsoft/dion's groups carry ``betas``).
    Raises: ValueError naming the option, as ``check_fixed``."""
    for fixed in FIXED[table]:
        if fixed.name in group:
            check_fixed(fixed.name, group[fixed.name], table)


def _equal(a, b) -> bool:
    """Equal by value, sequences (tuples, lists, tensors) compared as nested lists."""
    a, b = _as_floats(a), _as_floats(b)
    return type(a) is type(b) and a == b or (not isinstance(a, bool) and not isinstance(b, bool)
                                             and isinstance(a, (int, float)) and isinstance(b, (int, float)) and a == b)


def _as_floats(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_as_floats(v) for v in value]
    return value


def _set_option(target: dict, alias: Alias, value) -> None:
    """``target[alias.option] = value`` and the alias's ``implies`` where still None."""
    target[alias.option] = value
    for implied, implied_value in alias.implies:
        if target.get(implied) is None:
            target[implied] = implied_value


def _canonical_values(target: dict) -> dict:
    """Value aliases (``VALUE_ALIASES``, e.g. adjust_lr "rms_norm") replaced by ours, in place."""
    for key in VALUE_ALIASES:
        if key in target:
            target[key] = canonical_value(key, target[key])
    return target


def apply_aliases(given: Mapping[str, Any], aliases: Iterable[Alias], options: dict[str, Any],
                  defaults: Mapping[str, Any], *, fixed: str | None = None, where: str = "") -> dict[str, Any]:
    """Map other systems' names in ``given`` onto ``options`` (our names, as the caller has them).

    For each alias in ``given``: its converted value goes to ``options[alias.option]``; its
    ``implies`` are set where still None. An option of ours that the caller set (it differs from
    ``defaults``) and an alias for it with another value conflict, as do two aliases for the same
    option with different values (an explicit value equal to the default cannot be told from the
    default: the alias wins). ``fixed``: the ``FIXED`` table whose names are accepted (checked,
    then dropped). Returns ``options`` (changed in place).
    Raises: TypeError for a name that is neither ours nor an alias nor fixed, with the closest
    name; ValueError naming both names for a conflict, or naming the alias for a bad value.
    """
    table = {a.name: a for a in aliases}
    unknown = [k for k in given if k not in table and not (fixed and any(f.name == k for f in FIXED[fixed]))]
    reject_unknown(unknown, list(options) + list(table) + [f.name for f in FIXED.get(fixed or "", ())], where)
    set_by: dict[str, str] = {}
    for name, value in given.items():
        if fixed and name not in table and check_fixed(name, value, fixed):
            continue
        alias = table[name]
        new = alias.convert(value)
        key = alias.option
        if key in set_by:
            if not _equal(options[key], new):
                raise ValueError(f"{name}: conflicts with {set_by[key]} (both set {key!r}: {value!r} vs "
                                 f"{given[set_by[key]]!r}); give one of them")
        elif key in defaults and not _equal(options[key], defaults[key]) and not _equal(options[key], new):
            raise ValueError(f"{name}: conflicts with {key} (the same option, from {alias.source}): {value!r} vs "
                             f"{options[key]!r}; give one of them")
        _set_option(options, alias, new)
        set_by[key] = name
    return _canonical_values(options)


def canonical_group(group: dict, aliases: Iterable[Alias]) -> dict:
    """Other systems' names in a param group -> ours, in place (``implies`` set where None).
    Keys that are neither are left alone (schedulers add their own, e.g. ``initial_lr``).
    Raises: ValueError naming both keys when an alias and our key (or two aliases) disagree,
    or naming the alias for a value with no counterpart."""
    set_by: dict[str, str] = {}
    for alias in aliases:
        if alias.name not in group:
            continue
        value = group.pop(alias.name)
        new = alias.convert(value)
        key = alias.option
        if key in group and not _equal(group[key], new):
            other = set_by.get(key, key)
            raise ValueError(f"{alias.name}: conflicts with {other} in the param group (both set {key!r}: "
                             f"{value!r} vs {group[key]!r}); give one of them")
        _set_option(group, alias, new)
        set_by[key] = alias.name
    return _canonical_values(group)


def aliases_used(given: Mapping[str, Any], aliases: Iterable[Alias]) -> dict[str, str]:
    """{our option: the other system's name the caller gave for it} (``given``: keywords or a
    param group, before ``apply_aliases`` / ``canonical_group`` map them)."""
    return {a.option: a.name for a in aliases if isinstance(given, Mapping) and a.name in given}


@contextlib.contextmanager
def named_as_given(used: Mapping[str, str]):
    """Errors of the block that start with one of our option names (``"momentum: ..."``) are
    raised again naming the caller's own name for it (``"mu (momentum here): ..."``, ``used``
    from ``aliases_used``), so a user who passed microsoft/dion's ``mu`` reads ``mu``."""
    try:
        yield
    except (ValueError, TypeError) as err:
        message = str(err)
        prefix = re.match(r"(param group \d+ \(\w+\): )?", message).group(0)  # HybridOptimizer's label
        key, sep, rest = message[len(prefix):].partition(":")
        if not sep or key not in used:
            raise
        try:
            renamed = type(err)(f"{prefix}{used[key]} ({key} here):{rest}")
        except Exception:  # an exception class that cannot be rebuilt from a message
            raise err from None
        raise renamed.with_traceback(err.__traceback__) from None


def mixed_precision_dtypes(config) -> dict[str, torch.dtype | None]:
    """microsoft/dion's ``DionMixedPrecisionConfig`` (an object or a dict with ``momentum_dtype``,
    ``Q_dtype``, ``variance_dtype``) -> ``{"momentum_dtype": ..., "q_dtype": ...}``.
    Raises: TypeError for another field; ValueError for a ``variance_dtype`` (Adam's variance:
    ``Dion`` here runs Dion groups only; ``HybridOptimizer`` keeps AdamW state in the parameter's
    dtype as torch.optim.AdamW)."""
    fields = dict(config) if isinstance(config, Mapping) else {
        k: getattr(config, k) for k in ("momentum_dtype", "Q_dtype", "variance_dtype") if hasattr(config, k)}
    extra = sorted(set(fields) - {"momentum_dtype", "Q_dtype", "variance_dtype"})
    if extra:
        raise TypeError(f"mixed_precision_config: unexpected field {extra[0]!r}; expected momentum_dtype, Q_dtype, "
                        "variance_dtype (microsoft/dion DionMixedPrecisionConfig)")
    if fields.get("variance_dtype") is not None:
        raise ValueError("mixed_precision_config.variance_dtype: Adam's variance has no place in ortho_fast.Dion "
                         "(Dion groups only); set it to None")
    return {"momentum_dtype": fields.get("momentum_dtype"), "q_dtype": fields.get("Q_dtype")}


# ---------------------------------------------------------------------------------------------
# torch.optim.Muon param groups (its checkpoints), both directions
# ---------------------------------------------------------------------------------------------

#: The keys of a torch.optim.Muon param group that are not ours.
TORCH_MUON_GROUP_KEYS = ("ns_coefficients", "adjust_lr_fn")

#: What torch.optim.Muon does that our options make explicit: EMA momentum, X₀ = U / max(‖U‖_F,
#: eps), bfloat16 Newton–Schulz, no extra scale, plain decoupled weight decay, no pipeline stage.
TORCH_MUON_SEMANTICS: dict[str, Any] = dict(momentum_style="ema", safety=1.0, eps_mode="clamp", dtype=torch.bfloat16,
                                            extra_scale_factor=1.0, cautious_weight_decay=False,
                                            weight_decay_style="decoupled",
                                            row_equilibration=False, renormalize=False, normuon_beta2=None)


def is_torch_muon_group(group: Mapping[str, Any]) -> bool:
    """A saved group written by torch.optim.Muon (its keys, none of ours for the same settings)."""
    return any(k in group for k in TORCH_MUON_GROUP_KEYS) and "coefficients" not in group


def from_torch_muon_group(group: dict) -> dict:
    """A torch.optim.Muon param group (a checkpoint's) -> ours, in place: ``ns_coefficients`` /
    ``ns_steps`` -> ``coefficients`` / ``ns_steps``, ``adjust_lr_fn`` -> ``adjust_lr``, ``eps`` as
    is, torch's fixed behaviour (``TORCH_MUON_SEMANTICS``) made explicit and ``bitwise_torch=True``
    (torch's 2-D calls matrix by matrix), so the next step is torch's, bit for bit on CPU. A group of ours that also
    carries torch's keys (written by ``to_torch_muon_group``, or one torch has saved again) must agree with them.
    Raises: ValueError naming the torch key and ours when they disagree, or a torch value with no
    counterpart."""
    if is_torch_muon_group(group):
        row = group.pop("ns_coefficients", _JORDAN_ROW)
        group["coefficients"] = _ns_coefficients(row)
        group["adjust_lr"] = _adjust_lr_fn(group.pop("adjust_lr_fn", None))
        group.update(TORCH_MUON_SEMANTICS)
        group["bitwise_torch"] = True  # torch's calls matrix by matrix: the next steps are torch's bits
        return group
    present = {k: group[k] for k in TORCH_MUON_GROUP_KEYS if k in group}
    if not present:
        return group
    expected = to_torch_muon_group(group)
    for key, value in present.items():
        if expected is None or not _equal(expected.get(key), value):
            ours = "coefficients" if key == "ns_coefficients" else "adjust_lr"
            raise ValueError(f"{key}: {value!r} disagrees with this group's {ours}={group.get(ours)!r} (a torch.optim."
                             f"Muon key edited after it was saved?); give one of them")
        del group[key]
    return group


def to_torch_muon_group(group: Mapping[str, Any]) -> dict | None:
    """The torch.optim.Muon keys expressing a group of ours (``ns_coefficients``, ``ns_steps``,
    ``eps``, ``adjust_lr_fn``), or None where torch cannot express it: momentum other than EMA,
    a normalization other than U / max(‖U‖_F, eps), Newton–Schulz outside bfloat16, a table
    whose rows differ, an lr adjustment torch lacks, an extra scale, cautious weight decay,
    splits / heads. ``group`` holds resolved options (after ``normalize_muon_group``)."""
    from .coefficients import resolve_coefficients

    for key, value in TORCH_MUON_SEMANTICS.items():
        if key in group and not _equal(group[key], value):
            return None
    if group.get("adjust_lr") not in ("original", "shape_scaling", "match_rms_adamw"):
        return None
    if group.get("split_sizes") is not None or group.get("num_heads") is not None:
        return None
    try:
        table = resolve_coefficients(group["coefficients"], group.get("ns_steps"))
    except (KeyError, TypeError, ValueError):
        return None
    if any(row != table[0] for row in table) or not all(math.isfinite(v) for v in table[0]):
        return None
    adjust = "match_rms_adamw" if group["adjust_lr"] == "match_rms_adamw" else "original"
    return {"ns_coefficients": tuple(table[0]), "ns_steps": len(table), "eps": group["eps"], "adjust_lr_fn": adjust}
