"""What a crash of a user's distributed optimizer says (``check_sharded_optimizer``): the frame it
came from (the user's code, or torch's for torch's own optimizers; never the judge's), whether the
backend lacks a feature the optimizer needs (``backend_feature``), and the headline of each crash
(``crash_kind``), made true for every layout and shape it covers (``headline``)."""

from __future__ import annotations

import os
import re
import sysconfig

import torch

__all__ = ["BACKEND_KIND", "COMBINED_KIND", "backend_feature", "crash_kind", "headline", "split", "user_frame_in"]

#: The crash kind of a combined launch that raised while every shape, run on its own, ran.
COMBINED_KIND = "raises on this mix of parameters"
#: The crash kind of a missing backend feature (``backend_feature``).
BACKEND_KIND = "unsupported on this backend"

_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_JUDGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB = os.path.abspath(sysconfig.get_paths().get("stdlib") or "/nonexistent") + os.sep
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _judge_own(path: str) -> bool:
    """A module of the judge other than its planted optimizers (which stand for a user's code)."""
    return path.startswith(_JUDGE) and not os.path.basename(path).startswith("planted")


def _stdlib(path: str) -> bool:
    return path.startswith(_STDLIB) and "site-packages" not in path[len(_STDLIB):]


def user_frame_in(text: str) -> str:
    """"file:line in function" of the frame a crash is reported at, from a formatted traceback
    ``text``: the innermost frame of the user's code (outside torch, Python's library and the
    judge; the judge's planted optimizers count as a user's); where the crash is inside torch
    with no user frame on the stack (torch's own optimizer stepped by the judge), the innermost
    frame under ``torch/optim``, else the innermost torch frame. Never one of the judge's own
    modules (``factory_run.py``, ``workers.py``). "" when no frame qualifies."""
    frames = [(os.path.abspath(f), line, fn) for f, line, fn in _FRAME.findall(text) if not f.startswith("<")]
    outside = [f for f in frames if not _judge_own(f[0]) and not _stdlib(f[0])]
    users = [f for f in outside if not f[0].startswith(_TORCH)]
    optim = [f for f in outside if f[0].startswith(_TORCH + "optim" + os.sep)
             and os.path.basename(f[0]) != "optimizer.py"]
    pick = users or optim or outside
    return f"{pick[-1][0]}:{pick[-1][1]} in {pick[-1][2]}" if pick else ""


_MISSING = re.compile(r"([A-Za-z_][\w:.]*(?:\(\))?)\s+(?:is\s+)?not\s+(?:implemented|supported)", re.IGNORECASE)


def backend_feature(text: str, backend: str) -> str:
    """The feature a raised error says ``backend`` lacks ("Work::getFuture" for gloo's async work
    without a future: nanochat's DistMuon), or "". Read from the error text: a "X not
    implemented" / "X is not supported" naming a ``Work`` / ``ProcessGroup`` / backend method,
    or a message naming the backend with "not implemented" / "not supported"."""
    for match in _MISSING.finditer(text):
        name = match.group(1)
        if "::" in name or name.lower().startswith(("work", "processgroup", backend.lower())):
            return name
    for line in text.splitlines():
        low = line.lower()
        if backend.lower() in low and ("not implemented" in low or "not supported" in low):
            return line.strip()[-160:]
    return ""


def split(size: int, parts: int) -> tuple[bool, bool]:
    """(some shard empty, shards uneven) of ``size`` split in ``parts`` as torch.chunk / DTensor do."""
    if parts <= 1:
        return False, False
    chunk = -(-size // parts)
    return -(-size // chunk) < parts, size % parts != 0


def _parts(layout, mesh_shape) -> dict[int, int]:
    parts = {0: 1, 1: 1}
    for code, size in zip(layout.placements or (), mesh_shape or ()):
        if code != "R":
            parts[int(code[-1])] *= size
    return parts


def shape_traits(layout, mesh_shape, shape) -> tuple[bool, bool]:
    """(some rank gets an empty shard, some sharded dim does not divide) of ``shape`` on ``layout``."""
    parts = _parts(layout, mesh_shape)
    return (any(split(shape[d], parts[d])[0] for d in (0, 1)), any(split(shape[d], parts[d])[1] for d in (0, 1)))


def crash_kind(layout, mesh_shape, shape) -> str:
    """What a crash of ``layout`` on a matrix of ``shape`` may say about the optimizer, from the
    layout and shape alone (never the message: a user's internal error names neither): "raises on
    empty shards" when a sharded dim leaves a rank an empty shard (torch.chunk), else "does not take
    TP placements" when the layout has a TP mesh dim, else "raises on uneven shards" when a sharded
    dim does not divide, else "raises on this layout". A candidate: ``headline`` keeps it only
    where the other runs confirm it."""
    empty, uneven = shape_traits(layout, mesh_shape, shape)
    if empty:
        return "raises on empty shards"
    if "tp" in layout.dims:
        return "does not take TP placements"
    return "raises on uneven shards" if uneven else "raises on this layout"


def headline(kind: str, layout, mesh_shape, shape, ran: list[tuple]) -> str:
    """``kind`` (``crash_kind``'s candidate) if the runs that did not raise confirm it, else
    "raises on this layout". ``ran``: (layout, mesh_shape, shape) of every run that completed.
    "raises on empty shards" needs a shape without empty shards to have run on this layout;
    "raises on uneven shards" an evenly sharded shape on this layout; "does not take TP
    placements" this shape on a layout without a TP dim."""
    here = [s for lay, _, s in ran if lay.name == layout.name]
    if kind == "raises on empty shards":
        ok = any(not shape_traits(layout, mesh_shape, s)[0] for s in here)
    elif kind == "raises on uneven shards":
        ok = any(not any(shape_traits(layout, mesh_shape, s)) for s in here)
    elif kind == "does not take TP placements":
        ok = any("tp" not in lay.dims and s == tuple(shape) for lay, _, s in ran)
    else:
        return kind
    return kind if ok else "raises on this layout"
