"""Kinds of failure: what a failed row is, how a report counts it, how a user accepts a side effect.

Kinds of failure (docs/verification.md, "Kinds of failure"): what a failed row is —
wrong math, a side effect, an unsupported input — how a report counts them, how a user accepts a
side effect explicitly, the user's frame of an exception, and the one cause a report leads with.

No imports from the rest of the judge (``ortho_verify.report.results`` re-exports every name).
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["FAILURE_KINDS", "INSTALLED_MARKERS", "OWN_KIND_CHECKS", "SIDE_EFFECTS", "UNSUPPORTED_CHECKS",
           "accept_side_effects", "failure_kind", "failure_kinds",
           "headline_cause", "user_frame"]

#: The kinds of failure a report counts apart (docs/verification.md, "Kinds of failure"):
#: "wrong math" — the update or the state differs from the oracle's beyond the tolerance;
#: "side effect" — the result may be right, but the code changed something it was not given to
#: change (its input, the gradient) or shares state storage with the parameter;
#: "unsupported" — the code raised (or hung) on an input it does not take (a dtype, a shape, a layout);
#: "recompile limit" — a compiled kernel hit torch.compile's recompile limit: the input was not judged (not a
#: wrong result; the fix is in the row's note, ``ortho_verify.checks.kernel_calls.RECOMPILE_LIMIT_FIX``).
FAILURE_KINDS = ("wrong math", "side effect", "unsupported", "recompile limit")

#: Checks whose failures are of their own kind, by check name.
OWN_KIND_CHECKS = {"recompile_limit": "recompile limit"}

#: Checks whose failures are side effects, by the name ``allow_side_effects`` accepts them under:
#: "grad_mutated" (``gradient_unchanged``: the optimizer wrote into p.grad), "input_mutated"
#: (``input_unchanged``: a kernel wrote into its input), "state_aliased" (``state_not_aliased``:
#: a state tensor shares storage with p or p.grad).
SIDE_EFFECTS = {"grad_mutated": "gradient_unchanged", "input_mutated": "input_unchanged",
                "state_aliased": "state_not_aliased", "grad_consumed": "gradient_kept"}

#: Checks whose failures mean the code raised or hung on the input (kind "unsupported").
UNSUPPORTED_CHECKS = ("orthogonalizer_runs", "optimizer_runs", "layout_runs")


def failure_kind(row) -> str:
    """The kind of a row (``FAILURE_KINDS``): its own ``kind`` when set, else "recompile limit" for the
    row ``recompile_limit``, "side effect" for
    the checks of ``SIDE_EFFECTS``, "unsupported" for ``UNSUPPORTED_CHECKS`` (raised, hung; "wrong
    math" when it returned a result of the wrong type or shape), "wrong math" otherwise."""
    if row.kind:
        return row.kind
    if row.check in OWN_KIND_CHECKS:
        return OWN_KIND_CHECKS[row.check]
    if row.check in SIDE_EFFECTS.values():
        return "side effect"
    if row.check in UNSUPPORTED_CHECKS:  # it ran, but returned something else than asked: wrong output
        return "wrong math" if row.note.startswith("returned") else "unsupported"
    return "wrong math"


def failure_kinds(results) -> dict[str, int]:
    """Failed rows per kind, every kind of ``FAILURE_KINDS`` present (0 when none)."""
    counts = dict.fromkeys(FAILURE_KINDS, 0)
    for r in results:
        if not r.passed:
            k = failure_kind(r)
            counts[k] = counts.get(k, 0) + 1
    return counts


def accept_side_effects(rows, allowed) -> list:
    """``rows`` with the failures of the side effects named in ``allowed`` (keys of
    ``SIDE_EFFECTS``) turned into rows that make no claim, their note saying what was accepted
    and by how much (the measurement is kept in ``extra``; ``verdict`` does not count a check
    whose rows were all accepted as inconclusive).
    Raises: ValueError naming ``allow_side_effects`` for a name outside ``SIDE_EFFECTS``."""
    allowed = set(allowed or ())
    unknown = allowed - set(SIDE_EFFECTS)
    if unknown:
        raise ValueError(f"allow_side_effects: unknown {sorted(unknown)}; expected names from {sorted(SIDE_EFFECTS)}")
    checks = {SIDE_EFFECTS[a]: a for a in allowed}
    out = []
    for r in rows:
        if r.check in checks:
            what = checks[r.check]
            note = (f"accepted ({what} in allow_side_effects): error {r.error:.3g}" + (f"; {r.note}" if r.note else "")
                    if not r.passed else f"{what} accepted by allow_side_effects; not seen here")
            r = dataclasses.replace(r, passed=True, claimed=False, cause="", note=note,
                        extra={**r.extra, "accepted_side_effect": what})
        out.append(r)
    return out


#: Path components of installed third-party code (pip, conda, distribution packages) and of code that
#: torch generates (Inductor's kernels): a frame there is never the user's.
INSTALLED_MARKERS = ("site-packages", "dist-packages", "torchinductor_")


def _installed(filename: str) -> bool:
    import os

    parts = os.path.abspath(filename).split(os.sep)
    return any(marker in part for part in parts for marker in INSTALLED_MARKERS)


def user_frame(err: BaseException, skip=("ortho_verify", "torch")) -> str:
    """"file:line in function" of the last traceback frame of ``err`` in the user's code: the
    last one outside the packages named in ``skip`` (their directories), Python's own library and any
    installed library (a path through site-packages or dist-packages, or code torch generated:
    ``INSTALLED_MARKERS``); "" when no frame is the user's (the error was raised inside libraries only)
    or ``err`` has no traceback."""
    import os
    import sys
    import sysconfig
    import traceback

    roots = []
    for name in skip:
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__file__", None):
            roots.append(os.path.dirname(os.path.abspath(mod.__file__)) + os.sep)
    stdlib = sysconfig.get_paths().get("stdlib")
    if stdlib:
        roots.append(os.path.abspath(stdlib) + os.sep)
    frames = traceback.extract_tb(getattr(err, "__traceback__", None))
    mine = [f for f in frames if not any(os.path.abspath(f.filename).startswith(r) for r in roots)
            and not f.filename.startswith("<") and not _installed(f.filename)]
    if not mine:
        return ""
    f = mine[-1]
    return f"{f.filename}:{f.lineno} in {f.name}"


def headline_cause(results) -> str:
    """The one cause a report leads with: among the failed rows with a cause, the one given by
    the most rows on non-degenerate inputs (an input named 1x1, or a row whose ``extra`` marks it
    "degenerate", never decides it), ties to the worse error/tolerance; when no failed row has one, the
    check that failed most often with its first row's note (never "" when something failed); "" when
    nothing failed."""
    counts: dict[str, list] = {}
    for r in results:
        if r.passed or not r.cause:
            continue
        degenerate = r.extra.get("degenerate") or any(t in r.input for t in ("1x1", "/1x"))
        entry = counts.setdefault(r.cause, [0, 0, 0.0])
        entry[0 if degenerate else 1] += 1
        entry[2] = max(entry[2], r.ratio if np.isfinite(r.ratio) else 1e300)
    if not counts:
        return _fallback_cause(results)
    best = max(counts.items(), key=lambda kv: (kv[1][1] > 0, kv[1][1], kv[1][2]))
    return best[0]


def _fallback_cause(results) -> str:
    """The cause of a report whose failed rows carry none: the check that failed most often, its count and
    kind, and the note (or error and tolerance) of its first failed row; "" when nothing failed."""
    failed = [r for r in results if not r.passed]
    if not failed:
        return ""
    checks: dict[str, list] = {}
    for r in failed:
        checks.setdefault(r.check, []).append(r)
    check, rows = max(checks.items(), key=lambda kv: len(kv[1]))
    first = rows[0]
    what = first.note or f"error {first.error:.3g} > tolerance {first.tolerance:.3g}"
    return (f"{check} failed ({failure_kind(first)}) on {len(rows)} row{'s' if len(rows) != 1 else ''}; first on "
            f"{first.input}: {what}")
