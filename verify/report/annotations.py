"""GitHub Actions annotations of an ``ortho-verify`` run: ``::error`` / ``::warning`` workflow commands.

When ``GITHUB_ACTIONS=true`` (set by GitHub's runners), ``ortho-verify`` prints, besides its
summary, one ``::error file=<report>,title=<check>::<message>`` line per failed (check, input) and
one ``::warning`` line per reason a run is inconclusive, so the failures show on the pull request
and in the run's summary. Format: GitHub's "Workflow commands for GitHub Actions", "Setting an
error message": in values ``%``, CR and LF are escaped as ``%25``, ``%0D``, ``%0A``; in properties
also ``:`` and ``,`` (``%3A``, ``%2C``).
"""

from __future__ import annotations

from collections.abc import Mapping

from .results import CheckResult, format_number, verdict, worst_per_group

__all__ = ["MAX_ANNOTATIONS", "escape_data", "escape_property", "github_annotations", "in_github_actions"]

#: GitHub shows at most 10 error annotations per step (and 50 per job); more lines are noise.
MAX_ANNOTATIONS = 10


def in_github_actions(environ: Mapping[str, str]) -> bool:
    """True when ``environ`` is a GitHub Actions runner's (``GITHUB_ACTIONS == "true"``)."""
    return environ.get("GITHUB_ACTIONS") == "true"


def escape_data(text: str) -> str:
    """The message of a workflow command: ``%``, CR, LF escaped."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A property value (file, title) of a workflow command: as ``escape_data`` plus ``:`` and ``,``."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotations(results: list[CheckResult], report_path: str, limit: int = MAX_ANNOTATIONS) -> list[str]:
    """Workflow-command lines for ``results``: ``::error`` per failed (check, input) (worst row
    first, at most ``limit``; one more line counts the rest), ``::warning`` per reason of an
    inconclusive verdict. ``report_path``: the file the annotations point to (report.md)."""
    failed = sorted((w for w, _, _ in worst_per_group(results) if not w.passed), key=lambda r: -r.ratio)
    file = escape_property(str(report_path))
    lines = [f"::error file={file},title={escape_property('ortho-verify ' + r.check)}::"
             + escape_data(f"{r.input} [{r.detail}]: error {format_number(r.error)} > tolerance "
                           f"{format_number(r.tolerance)} (error/tol {r.ratio:.3g}){' — ' + r.note if r.note else ''}")
             for r in failed[:limit]]
    if len(failed) > limit:
        lines.append(f"::error file={file},title=ortho-verify::"
                     + escape_data(f"{len(failed) - limit} more failed checks: see {report_path}"))
    status, reasons = verdict(results)
    if status == "inconclusive":
        lines += [f"::warning file={file},title=ortho-verify inconclusive::{escape_data(why)}" for why in reasons]
    return lines
