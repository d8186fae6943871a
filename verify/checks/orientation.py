"""A failure confined to one orientation (tall, wide, square) or one number of batch dims: the cause says
so, instead of the per-row diagnosis (which, seeing one input at a time, blames the map or the table).

Used by ``check_orthogonalizer`` after its rows are made. docs/verification.md, "Diagnoses".
"""

from __future__ import annotations

from ..kinds import failure_kind
from .diagnoses import with_cause
from .replay_causes import RESHAPED_CAUSE, STORED_PRECISION_CAUSE

#: Row causes from a replay (``ortho_verify.checks.replay_causes``): kept after the confined cause.
REPLAY_CAUSES = (RESHAPED_CAUSE, STORED_PRECISION_CAUSE)

__all__ = ["confined_cause", "orientation"]

_ADVICE = {"tall": "the kernel handles tall inputs differently: a transpose to the wide side not undone, or undone "
                   "with reshape / view instead of a transpose",
           "wide": "the kernel handles wide inputs differently (e.g. transposes them when it should not)",
           "square": "the kernel handles square inputs differently (e.g. a branch on m < n vs m > n that misses m = n)"}


def orientation(m: int, n: int) -> str:
    """"tall" (m > n), "wide" (m < n) or "square"."""
    return "tall" if m > n else "wide" if m < n else "square"


def _confined(failed: dict, passed: dict) -> str | None:
    """The one key all failures share, when at least half the inputs of that key failed and inputs of
    other keys passed; None otherwise. ``failed`` / ``passed``: key -> input names (passed: with no failed row)."""
    if len(failed) != 1:
        return None
    key = next(iter(failed))
    most = len(failed[key]) >= len(passed.get(key, ()))  # at least half its inputs (a 1e-30 input may pass)
    return key if most and any(k != key and v for k, v in passed.items()) else None


def confined_cause(rows: list, shapes: dict) -> list:
    """``rows`` with the cause of their failed rows replaced when the failed rows (wrong math or unsupported)
    on inputs of ``shapes`` (input name -> (m, n, number of batch dims)) are exactly the inputs of one
    orientation, or of one number of batch dims: at least half of its inputs failed, no input of the others
    did and some passed. Rows on
    inputs outside ``shapes`` (e.g. the statistical batches) neither decide nor change."""
    judged = [r for r in rows if r.input in shapes and failure_kind(r) in ("wrong math", "unsupported")]
    fail_o, pass_o, fail_b, pass_b = {}, {}, {}, {}
    for r in judged:
        m, n, b = shapes[r.input]
        o = orientation(m, n)
        if not r.passed:
            fail_o.setdefault(o, set()).add(r.input)
            fail_b.setdefault(b, set()).add(r.input)
        elif r.claimed:
            pass_o.setdefault(o, set()).add(r.input)
            pass_b.setdefault(b, set()).add(r.input)
    failed_inputs = {r.input for r in judged if not r.passed}
    pass_o = {k: v - failed_inputs for k, v in pass_o.items()}
    pass_b = {k: v - failed_inputs for k, v in pass_b.items()}
    cause = ""
    o = _confined(fail_o, pass_o)
    if o is not None:
        others = " and ".join(sorted(k for k in pass_o if pass_o[k] and k != o))
        cause = (f"only {o} inputs fail ({len(fail_o[o])} of them); {others} inputs pass: {_ADVICE[o]}")
    else:
        b = _confined(fail_b, pass_b)
        if b is not None:
            others = ", ".join(str(k) for k in sorted(pass_b) if pass_b[k] and k != b)
            cause = (f"only inputs with {b} batch dim{'s' if b != 1 else ''} fail ({len(fail_b[b])} of them); inputs "
                     f"with {others} pass: the leading dims are not handled as independent matrices"
                     + (f" (pass max_batch_dims={max(pass_b)} if the kernel takes no more)" if b > max(pass_b) else ""))
    if not cause:
        return rows
    return [with_cause(r, _combined(cause, r.cause)) if (not r.passed and r.input in shapes
                                                         and failure_kind(r) in ("wrong math", "unsupported"))
            else r for r in rows]


def _combined(confined: str, row_cause: str) -> str:
    """The confined cause, followed by the row's own cause when a replay found it (a replay's answer —
    e.g. "reshaped, not transposed, back" — is more specific than the orientation advice; a fit's is not)."""
    replayed = row_cause and any(row_cause.startswith(c.split("{")[0]) for c in REPLAY_CAUSES)
    return f"{confined}; replay: {row_cause}" if replayed else confined
