"""Calling the checked kernel: in a worker thread with a time limit (``call_with_timeout``), with the
caller's dynamo settings carried into that thread, telling torch.compile's recompile-limit
failure (not a wrong result) from the kernel's own exceptions (``is_recompile_limit``), the row of a
kernel that raised (``raised_row``) and the check of ``examples=`` (``check_examples``).
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

__all__ = ["DEFAULT_TIMEOUT_S", "RECOMPILE_LIMIT_FIX", "call_with_timeout", "check_examples", "check_seed",
           "is_recompile_limit",
           "raised_row"]

#: Default seconds one call of the checked kernel may take before ``check_orthogonalizer``
#: fails the example (generous: a 37 × 16 float32 call takes well under a second on one core).
DEFAULT_TIMEOUT_S = 120.0


def call_with_timeout(fn: Callable, x, timeout_s: float | None):
    """``fn(x)`` in a daemon thread, waiting at most ``timeout_s`` seconds (None: no limit, in
    this thread). Returns ("ok", value), ("raised", exception) or ("timeout", None) — a kernel that calls
    ``sys.exit`` is "raised" with its SystemExit, it does not end the judge; a call that
    times out is abandoned (a thread cannot be killed; it ends with the process).
    Raises: ValueError naming timeout_s when it is not positive."""
    if timeout_s is None:
        try:
            return "ok", fn(x)
        except (Exception, SystemExit) as err:  # reported as a failed check (sys.exit in a kernel included)
            return "raised", err
    if not timeout_s > 0:
        raise ValueError(f"timeout_s: expected > 0 or None, got {timeout_s!r}")
    box: dict = {}
    carried = _dynamo_settings()

    def run():
        try:
            with _with_dynamo_settings(carried):
                box["ok"] = fn(x)
        except BaseException as err:  # reported as a failed check; SystemExit (sys.exit in fn) included
            box["raised"] = err

    worker = threading.Thread(target=run, daemon=True, name="ortho-verify-example")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return "timeout", None
    if "ok" in box:
        return "ok", box["ok"]
    return "raised", box.get("raised") or RuntimeError("the call ended without a result or an exception")


def _dynamo_settings() -> dict | None:
    """The caller's ``torch._dynamo.config`` values (None when dynamo was never imported). dynamo's
    settings are thread-local (torch 2.13: ``recompile_limit = 64`` set in the main thread reads 8 in
    another), so ``call_with_timeout`` carries them into its worker thread: a user's raised
    ``recompile_limit`` must hold where the judge calls the kernel."""
    import sys

    if "torch._dynamo" not in sys.modules:
        return None
    return sys.modules["torch._dynamo"].config.get_config_copy()


def _with_dynamo_settings(settings: dict | None):
    """A context that applies the caller's dynamo settings (``_dynamo_settings``) in this thread:
    ``torch._dynamo.config.patch`` with the values that differ here."""
    import contextlib
    import sys

    if not settings:
        return contextlib.nullcontext()
    config = sys.modules["torch._dynamo"].config
    here = config.get_config_copy()
    missing = object()
    changed = {k: v for k, v in settings.items() if here.get(k, missing) != v}
    return config.patch(changed) if changed else contextlib.nullcontext()


#: What to do when a compiled kernel hits torch.compile's recompile limit (the row ``recompile_limit``).
RECOMPILE_LIMIT_FIX = ("not a wrong result: torch.compile recompiled the kernel for each new input shape and hit "
                       "dynamo's recompile limit, so this input was not judged. Fix: raise "
                       "torch._dynamo.config.recompile_limit (cache_size_limit before torch 2.6), compile with "
                       "dynamic=True or torch._dynamo.mark_dynamic(x, ...), or pass shapes=[...] to check the "
                       "shapes the kernel is compiled for")

_RECOMPILE_NAMES = ("FailOnRecompileLimitHit", "RecompileLimitExceeded", "CacheLimitExceeded")
_RECOMPILE_TEXT = ("recompile_limit", "cache_size_limit", "recompile limit", "cache size limit")


def is_recompile_limit(err: BaseException) -> bool:
    """True for torch dynamo's recompile-limit failure (``torch._dynamo.exc.FailOnRecompileLimitHit``,
    older ``RecompileLimitExceeded`` / ``CacheLimitExceeded``, or any exception whose message names
    ``recompile_limit`` / ``cache_size_limit``), also when wrapped (``__cause__`` / ``__context__``)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if type(err).__name__ in _RECOMPILE_NAMES or any(t in str(err) for t in _RECOMPILE_TEXT):
            return True
        err = err.__cause__ or err.__context__
    return False


def _batched_hint(x) -> str:
    """The note's advice when fn raised on an input with batch dims ("" for a matrix)."""
    if x.ndim <= 2:
        return ""
    return (f"; raised on a batched {tuple(x.shape)} input (leading dims are independent matrices): pass "
            "batched=False if your kernel is 2-D only, max_batch_dims=1 if it takes (b, m, n) at most")


def raised_row(err: BaseException, x, input_name: str, what: str):
    """The failed ``CheckResult`` for an fn that raised ``err`` on the tensor ``x``: ``recompile_limit`` (its own
    kind, with the fix) or ``orthogonalizer_runs``, whose note names the exception and the user's frame that
    raised it (``ortho_verify.kinds.user_frame``: never a frame of torch or an installed library)."""
    import math

    from ..report.results import measured, user_frame
    from .diagnoses import with_cause

    if is_recompile_limit(err):
        return with_cause(measured("recompile_limit", input_name, what, math.inf, 0.0,
                                   f"raised {type(err).__name__} on shape {tuple(x.shape)}"), RECOMPILE_LIMIT_FIX)
    frame = user_frame(err)
    where = f" at {frame}" if frame else (" (every frame of its traceback is in torch or an installed library)"
                                          if getattr(err, "__traceback__", None) is not None else "")
    return measured("orthogonalizer_runs", input_name, what, math.inf, 0.0, f"raised {err!r}{where}{_batched_hint(x)}")


def check_examples(examples) -> None:
    """``examples=`` is None or a list / tuple of ``SpectralExample``. Raises: TypeError naming examples and the
    expected type (a bare tensor or array is the common mistake: wrap it with ``build_example``)."""
    from ..inputs.examples import SpectralExample

    if examples is None:
        return
    if not isinstance(examples, (list, tuple)):
        raise TypeError("examples: expected a list of ortho_verify.inputs.examples.SpectralExample (from "
                        f"default_examples or build_example), got {type(examples).__name__}")
    bad = [type(ex).__name__ for ex in examples if not isinstance(ex, SpectralExample)]
    if bad:
        raise TypeError("examples: expected a list of ortho_verify.inputs.examples.SpectralExample (from "
                        "default_examples or build_example; a tensor of your own is not one), got an element of type "
                        f"{bad[0]}")


def check_seed(seed) -> int:
    """``seed`` if it is an integer >= 0 (numpy's generators take no negative seed); ValueError
    naming ``seed`` otherwise, before any work."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected an integer >= 0, got {seed!r}")
    return int(seed)
