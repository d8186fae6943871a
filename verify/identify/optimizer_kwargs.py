"""Constructor keywords of an optimizer under declared hyperparameter names, a name inside a tuple
included (``"betas[0]"``: the first entry of the ``betas`` keyword, its other entries kept from the
declaration's ``extra_kwargs`` or the signature's default), and the signature of a class or factory."""

from __future__ import annotations

import functools
import inspect
import re

__all__ = ["constructor_kwargs", "signature_defaults", "split_name"]

_INDEXED = re.compile(r"^([A-Za-z_][A-Za-z_0-9]*)\[(\d+)\]$")


def split_name(name: str) -> tuple[str, int | None]:
    """("betas", 0) for "betas[0]", ("lr", None) for "lr".
    Raises: ValueError naming ``hyperparameter_names`` for a name that is neither."""
    if not isinstance(name, str):
        raise ValueError(f"hyperparameter_names: expected keyword names (str), got {name!r}")
    match = _INDEXED.match(name)
    if match:
        return match.group(1), int(match.group(2))
    if not name.isidentifier():
        raise ValueError(f"hyperparameter_names: expected a keyword ('lr') or a tuple entry ('betas[0]'), got {name!r}")
    return name, None


def signature_defaults(optimizer) -> dict:
    """{keyword: default} of a class's ``__init__`` or a factory's signature (``functools.partial``:
    its own keywords override), ``inspect.Parameter.empty`` for a keyword without default; {} when
    there is no signature to read."""
    keywords = {}
    target = optimizer
    while isinstance(target, functools.partial):
        keywords = {**target.keywords, **keywords}
        target = target.func
    try:
        sig = inspect.signature(target.__init__ if inspect.isclass(target) else target)
    except (TypeError, ValueError):
        return dict(keywords)
    out = {name: par.default for name, par in sig.parameters.items()
           if par.kind in (par.POSITIONAL_OR_KEYWORD, par.KEYWORD_ONLY) and name not in ("self", "params")}
    return {**out, **keywords}


def constructor_kwargs(optimizer, names: dict, values: dict, extra_kwargs: dict) -> dict:
    """The keywords to call ``optimizer(params, **kwargs)`` with: ``values[k]`` under ``names[k]``
    for each hyperparameter k, a tuple entry ("betas[0]") written into that tuple, and
    ``extra_kwargs``.
    Raises: ValueError naming ``hyperparameter_names`` for a tuple entry whose tuple has no value
    (neither in ``extra_kwargs`` nor a signature default) or is too short."""
    kwargs = dict(extra_kwargs)
    defaults = None
    for key, value in values.items():
        base, index = split_name(names[key])
        if index is None:
            kwargs[base] = value
            continue
        if base not in kwargs:
            defaults = signature_defaults(optimizer) if defaults is None else defaults
            default = defaults.get(base, inspect.Parameter.empty)
            if default is inspect.Parameter.empty or default is None:
                raise ValueError(f"hyperparameter_names: {names[key]!r} names an entry of {base!r}, which has no "
                                 "default; give the whole tuple in extra_kwargs")
            kwargs[base] = default
        entries = list(kwargs[base])
        if index >= len(entries):
            raise ValueError(f"hyperparameter_names: {names[key]!r} is past the end of {base}={tuple(entries)!r}")
        entries[index] = value
        kwargs[base] = tuple(entries)
    return kwargs
