"""Argument checks for the fast side (``ortho_fast.validation``): clear errors naming the argument,
raised before any state changes. Shared by the functional core, the group layer and the distributed step."""

from __future__ import annotations

import math
import sys

import torch


def check_matrix_tensor(x, name: str, *, min_ndim: int = 2) -> torch.Tensor:
    """Check that ``x`` is a non-empty floating tensor with at least ``min_ndim`` dims.

    Raises: TypeError (not a tensor, integer / bool / complex dtype); ValueError (too few
    dims, an empty matrix dimension).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape (..., m, n), got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point dtype (bfloat16/float16/float32/float64), got {x.dtype}")
    if x.ndim < min_ndim:
        raise ValueError(f"{name}: expected a tensor with at least {min_ndim} dims (..., m, n), got shape "
                         f"{tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(x.shape)}")
    return x


def is_dtensor(t) -> bool:
    """isinstance(t, DTensor) without importing torch.distributed.tensor (0.4 s) when no DTensor
    can exist yet (none does before that module is imported)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (a view sharing storage), or ``t`` itself."""
    return t.to_local() if is_dtensor(t) else t


def check_finite(x: torch.Tensor, name: str) -> None:
    """Raise ValueError if ``x`` holds NaN or Inf (one reduction, one host sync).

    ``torch.aminmax`` propagates NaN and returns ±Inf when present, so the two extremes are
    finite iff every entry is; it is one pass without the boolean temporary of
    ``isfinite(x).all()`` (measured 10× faster on a 1024² float32 CPU tensor). A DTensor is
    checked on this rank's local shard: its own min/max all-reduce would drop a NaN of one shard
    (and costs a collective); distributed callers make the verdict global themselves.
    """
    x = local_tensor(x)
    if x.numel() == 0:
        return
    lo, hi = torch.aminmax(x)
    if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
        raise ValueError(f"{name}: contains NaN or Inf; expected finite values")


def check_grad(p: torch.Tensor, name: str, algorithm: str, finite) -> None:
    """Check ``p.grad`` (not None) as a matrix optimizer's step reads it: dense and real, of the
    parameter's shape, dtype and device; finite when ``finite`` is True (now, one host sync), added
    to ``finite`` when it is a ``FiniteCheck`` (decided by the caller), not checked when False.
    ``name``: how the error names the parameter. Raises ValueError starting with "grad" and naming
    ``algorithm`` and the parameter. Changes nothing."""
    g = p.grad
    if g.is_sparse or torch.is_complex(g):
        raise ValueError(f"grad: {algorithm} expects dense real gradients ({name})")
    if g.shape != p.shape:
        raise ValueError(f"grad: expected shape {tuple(p.shape)}, got {tuple(g.shape)} ({name})")
    if g.dtype != p.dtype or g.device != p.device:
        raise ValueError(f"grad: expected dtype {p.dtype} on {p.device} (the parameter's), got {g.dtype} on "
                         f"{g.device} ({name})")
    if finite is True:
        check_finite(g, f"grad of {name}")
    elif isinstance(finite, FiniteCheck):
        finite.add(g, f"grad of {name}")


def check_param_shaped_state(state, p: torch.Tensor, key: str, name: str) -> None:
    """Check ``state[p][key]`` where present: a tensor of the parameter's shape and dtype (a momentum
    buffer). Raises ValueError starting with ``key`` and naming the parameter. Changes nothing."""
    buf = state[p].get(key) if p in state else None
    if buf is not None and (not isinstance(buf, torch.Tensor) or buf.shape != p.shape or buf.dtype != p.dtype):
        got = (tuple(buf.shape), buf.dtype) if isinstance(buf, torch.Tensor) else type(buf).__name__
        raise ValueError(f"{key}: expected a tensor of shape {tuple(p.shape)} and dtype {p.dtype}, got {got} ({name})")


def finite_flag(x: torch.Tensor) -> torch.Tensor:
    """A 0-dim bool tensor on ``x``'s device: whether every entry of ``x`` (a DTensor: this rank's
    shard) is finite. No host sync (``check_finite`` without the decision); exact."""
    x = local_tensor(x)
    if x.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=x.device)
    lo, hi = torch.aminmax(x)
    return torch.isfinite(lo) & torch.isfinite(hi)


def max_abs(xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """max|x| of each non-empty floating tensor of ``xs`` (0-dim, its dtype; NaN if x holds a
    NaN, +Inf if it holds ±Inf, else finite: exact, no overflow), by one ``_foreach_norm(ord=inf)``
    per (device, dtype) group: on CUDA one fast-path call per group (3 launches), where a reduction
    per tensor would launch once per tensor. No host sync."""
    if not xs:
        return []
    dtype, device = xs[0].dtype, xs[0].device
    for x in xs:
        if x.dtype != dtype or x.device != device:
            break
    else:  # one (device, dtype): the maxima in order, no grouping
        return list(torch._foreach_norm(xs, math.inf))
    groups: dict[tuple, list[int]] = {}
    for i, x in enumerate(xs):
        groups.setdefault((x.device, x.dtype), []).append(i)
    out: list = [None] * len(xs)
    for indices in groups.values():
        for i, norm in zip(indices, torch._foreach_norm([xs[i] for i in indices], math.inf)):
            out[i] = norm
    return out


def screenable(x) -> bool:
    """Whether ``FiniteCheck.add_screened`` takes ``x`` as it is: a plain ``torch.Tensor`` (not a
    DTensor), floating, with at least one entry (what ``FiniteCheck.error`` would otherwise check
    per tensor)."""
    return type(x) is torch.Tensor and x.is_floating_point() and x.numel() > 0


class _Screened(tuple):
    """A block of ``FiniteCheck.add_screened``: (tensors, names, prefix)."""


class FiniteCheck:
    """The finiteness checks of one optimizer step, decided together: ``add(tensor, name)`` for
    each gradient (no host sync), then ``error()`` takes max|x| of every tensor (``max_abs``:
    one ``_foreach_norm(ord=inf)`` per (device, dtype); NaN and ±Inf propagate into it, finite
    entries cannot overflow it, so it is finite iff every entry is), reduces them on the device
    into one number (the largest maximum: NaN or +Inf as soon as one tensor holds one) and reads
    it once — one host sync per step, however many parameters — and only
    when that number is not finite reads the maxima one by one to name the first tensor that is not.
    Source: the found-inf reduction of torch.amp's GradScaler (one flag per step); the inf-norm
    reduction of torch's ``_foreach_norm`` (aten/src/ATen/native/cuda/ForeachReduceOp.cu,
    NaN-propagating max)."""

    def __init__(self) -> None:
        self.items: list = []  # (tensor, name) pairs and ``_Screened`` blocks, in the order added
        self.prefix = ""  # put in front of the names added next ("param group i (alg): ")

    def add(self, x: torch.Tensor, name: str) -> None:
        self.items.append((x, self.prefix + name))

    def add_screened(self, xs: list[torch.Tensor], names: list[str]) -> None:
        """``add(x, name)`` for every pair of tensors the caller screened (``screenable``) — read as
        they are, with no check per tensor at ``error`` (a plan's step: screened when its check of
        that gradient was made)."""
        if xs:
            self.items.append(_Screened((xs, names, self.prefix)))

    def _tensors(self) -> tuple[list[torch.Tensor], list[str]]:
        """The tensors to reduce (local shards of DTensors, complex ones as real pairs; empty and
        integer ones left out: finite) and their names, in the order added."""
        tensors, names = [], []
        for item in self.items:
            if type(item) is _Screened:
                xs, block_names, prefix = item
                tensors += xs
                names += [prefix + name for name in block_names]
                continue
            x, name = item
            if type(x) is not torch.Tensor:  # a DTensor: its local shard
                x = local_tensor(x)
            if not x.is_floating_point():
                if not x.is_complex():  # integers and booleans: always finite
                    continue
                x = torch.view_as_real(x)  # finite iff its real and imaginary parts are
            if x.numel():  # empty: finite
                tensors.append(x)
                names.append(name)
        return tensors, names

    def error(self) -> ValueError | None:
        """None if every added tensor is finite, else the ValueError ``check_finite`` raises for
        the first one that is not (naming it). One host sync (none with nothing added or only
        empty / non-floating tensors; more only when some tensor is not finite)."""
        items = self.items
        if len(items) == 1 and type(items[0]) is _Screened:  # one plan's gradients: as they are
            tensors, names = items[0][0], None
        else:
            tensors, names = self._tensors()
        if not tensors:
            return None
        maxima = max_abs(tensors)
        try:  # the maxima on one device (the usual case): stacked as they are
            stacked = torch.stack(maxima)
        except RuntimeError:  # on several devices: moved to the first one's
            device = maxima[0].device
            stacked = torch.stack([m if m.device == device else m.to(device) for m in maxima])
        # the largest maximum: NaN if one is NaN (max propagates it), +Inf if one is; exact, no overflow
        if math.isfinite(stacked.max().item()):
            return None
        if names is None:
            names = self._tensors()[1]
        for name, m in zip(names, maxima):  # rare: name the first that is not finite
            if not bool(torch.isfinite(m)):
                return ValueError(f"{name}: contains NaN or Inf; expected finite values")
        return None


def check_hyper(value, name: str, *, low: float = 0.0, high: float | None = None, low_open: bool = False) -> float:
    """Check a scalar hyperparameter is a finite real number within [low, high] (``low_open``:
    (low, high]); returns it as float. Strings are not numbers here (float("1e-3") would pass).

    Raises: ValueError naming ``name``.
    """
    try:
        if isinstance(value, (str, bytes)):
            raise TypeError
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a real number, got {value!r}") from None
    ok = x == x and abs(x) != float("inf") and (x > low if low_open else x >= low) and (high is None or x <= high)
    if not ok:
        hi = "inf" if high is None else high
        raise ValueError(f"{name}: expected a finite value in {'(' if low_open else '['}{low}, {hi}], got {value!r}")
    return x


def check_count(value, name: str, low: int = 1) -> int:
    """Check an integer option (not a bool) is >= ``low``; returns it.

    Raises: ValueError naming ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
    return value


def check_choice(value, name: str, choices) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name}: expected one of {tuple(choices)}, got {value!r}")


def check_filled(group: dict, defaults, algorithm: str) -> None:
    """Raise ValueError naming the first key of ``defaults`` missing from a param group."""
    missing = [k for k in defaults if k not in group]
    if missing:
        raise ValueError(f"{missing[0]}: missing from the {algorithm} param group (fill it from its defaults)")


def check_bool_option(group: dict, key: str) -> None:
    """TypeError naming ``key`` unless ``group[key]`` is a bool."""
    if not isinstance(group[key], bool):
        raise TypeError(f"{key}: expected a bool, got {group[key]!r}")


def int_tuple_option(value, key: str, allow_int: bool):
    """None, an int (if allowed) or a sequence -> None, the int, or a tuple; TypeError otherwise."""
    if value is None or (allow_int and isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        what = "None, an integer or a sequence of integers" if allow_int else "None or a sequence of integers"
        raise TypeError(f"{key}: expected {what}, got {value!r}")
    return tuple(value)
