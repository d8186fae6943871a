"""Result types of the judge: one comparison (``CheckResult``), the verdict over many, ``VerificationReport``, the
report files (``report.json``, ``report.md``); numpy only (docs/checks.md, "Rows and reports")."""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..kinds import (
    FAILURE_KINDS,
    SIDE_EFFECTS,
    UNSUPPORTED_CHECKS,
    accept_side_effects,
    failure_kind,
    failure_kinds,
    headline_cause,
    user_frame,
)

__all__ = [
    "FAILURE_KINDS", "REPORT_SCHEMA_VERSION", "SIDE_EFFECTS", "UNSUPPORTED_CHECKS", "CheckResult", "headline_cause",
    "Failure", "VerificationReport",
    "accept_side_effects", "error_feedback_table", "failure_kind", "failure_kinds", "format_number",
    "format_worst_ratio",
    "measured", "no_claim", "ratio_text", "user_frame", "verdict_text", "no_claim_summary", "report_body", "summary",
    "verdict", "worst_per_group", "write_reports",
]


@dataclass
class CheckResult:
    """One measured comparison: ``ratio`` = error / tolerance (tolerance 0, an exact check: 0 if it holds, else inf).

    ``passed``, ``claimed`` (evidence), ``status``, ``extra``, ``cause``, ``kind``: docs/checks.md, "Rows and reports".
    """

    check: str
    input: str
    detail: str
    error: float
    tolerance: float
    passed: bool
    note: str = ""
    extra: dict = field(default_factory=dict)
    claimed: bool = True
    cause: str = ""
    kind: str = ""

    @property
    def ratio(self) -> float:
        if self.tolerance > 0:
            return self.error / self.tolerance
        return 0.0 if self.error <= 0 else math.inf  # exact check: held (a margin error < 0 included) or not

    @property
    def status(self) -> str:
        """"fail", "pass" (a claim that held) or "no claim" (passed vacuously)."""
        return "fail" if not self.passed else "pass" if self.claimed else "no claim"

    def as_dict(self) -> dict:
        return {**asdict(self), "kind": failure_kind(self), "ratio": self.ratio, "status": self.status}


def measured(check: str, case_name: str, detail: str, error, tolerance, note: str = "",
             extra: dict | None = None, informative: bool = True) -> CheckResult:
    """A ``CheckResult`` that passes iff error <= tolerance (NaN fails). It is a claim unless it
    passed with an infinite tolerance or with ``informative`` False (see ``CheckResult``)."""
    error, tolerance = float(error), float(tolerance)
    passed = bool(error <= tolerance)
    return CheckResult(check, case_name, detail, error, tolerance, passed, note, extra or {},
                       not passed or (informative and math.isfinite(tolerance)))


def no_claim(check: str, case_name: str, detail: str, why: str, extra: dict | None = None) -> CheckResult:
    """A row for a comparison that was not made (error 0, tolerance inf): ``why`` is its note."""
    return CheckResult(check, case_name, detail, 0.0, math.inf, True, why, extra or {}, False)


def verdict(results) -> tuple[str, list[str]]:
    """("passed" | "failed" | "inconclusive", reasons) of a list of ``CheckResult``.

    failed: some row failed. inconclusive (nothing failed, but not evidence of correctness): no
    row made a claim, or some check made no claim on any of its inputs; the reasons name each
    such check with its row count and the note of its first row. passed: otherwise.
    """
    results = list(results)
    if any(not r.passed for r in results):
        return "failed", []
    families: dict[str, list[CheckResult]] = {}
    for r in results:
        families.setdefault(r.check, []).append(r)
    reasons = [f"{check}: no claim on any of its {len(rows)} rows ({rows[0].note or 'no note'})"
               for check, rows in families.items() if not any(r.claimed for r in rows)
               and not all("accepted_side_effect" in r.extra or r.extra.get("supplementary") for r in rows)]
    if not results:
        reasons = ["no check was run"]
    elif not reasons and not any(r.claimed for r in results):
        reasons = [f"no row made a claim ({results[0].note or 'no note'})"]
    return ("inconclusive" if reasons else "passed"), reasons


def verdict_text(results) -> str:
    """The verdict in words with the kinds of failure that made it: "passed", "inconclusive", or
    e.g. "failed: side effect (3 rows)" / "failed: wrong math (2 rows), unsupported (1 row)"."""
    status, _ = verdict(results)
    if status != "failed":
        return status
    kinds = [f"{k} ({n} row{'s' if n != 1 else ''})" for k, n in failure_kinds(results).items() if n]
    return "failed: " + ", ".join(kinds)


def ratio_text(r: CheckResult) -> str:
    """A row's error/tolerance as the report's lines show it: "accepted" for a side effect accepted by
    ``allow_side_effects``, "failed (exact check)" / "failed (raised)" for a failed row without a finite
    ratio (tolerance 0, or an infinite error: it raised, hung or returned the wrong shape), "no claim" for
    an infinite ratio that passed, else 3 significant digits."""
    if "accepted_side_effect" in r.extra:
        return "accepted"
    if math.isfinite(r.ratio):
        return f"{r.ratio:.3g}"
    if r.passed:
        return "no claim"
    return "failed (raised)" if r.note.startswith(("raised", "did not return")) or "raised" in r.note[:40] else \
        "failed (exact check)"


def format_number(x: float) -> str:
    """A number of the report tables: 3 significant digits, "0", "inf" or "nan"."""
    if math.isinf(x) or math.isnan(x):
        return str(x)
    return f"{x:.2e}" if x else "0"


def worst_per_group(results: list[CheckResult]) -> list[tuple[CheckResult, int, int]]:
    """(worst result, passed count, total) per (check, input), in first-seen order; a failure
    before a claim before a row that made no claim; "passed" counts rows with status "pass"."""
    groups: "OrderedDict[tuple[str, str], list[CheckResult]]" = OrderedDict()
    for r in results:
        groups.setdefault((r.check, r.input), []).append(r)
    return [(max(rs, key=lambda r: (not r.passed, r.claimed, r.ratio)), sum(r.status == "pass" for r in rs), len(rs))
            for rs in groups.values()]


def summary(results: list[CheckResult], seconds: dict | None = None) -> dict:
    """Counts (passed, failed, no_claim: rows that passed vacuously), the verdict
    (``verdict``) with its reasons, and per check (``by_check``, first-seen order) its counts
    (total, passed, failed, no_claim), the worst error/tolerance ratio of its claimed rows
    (``worst_ratio``, 0 when none) and where it occurred (``worst``: input, detail, ratio, or None),
    ``exact`` (True when every claimed row has tolerance 0: a bitwise or no-slack check, whose
    ratio is 0 or inf) and ``seconds``: ``seconds[check]`` (wall seconds the run spent on the check,
    measured by the caller, e.g. ``ortho-verify``), None when not given."""
    by_check: dict[str, dict] = {}
    for r in results:
        s = by_check.setdefault(r.check, {"total": 0, "passed": 0, "failed": 0, "no_claim": 0, "worst_ratio": 0.0,
                                          "worst": None, "exact": True,
                                          "seconds": None if seconds is None else round(seconds.get(r.check, 0.0), 3)})
        s["total"] += 1
        s["exact"] = s["exact"] and (not r.claimed or r.tolerance == 0)
        s["passed"] += int(r.status == "pass")
        s["failed"] += int(not r.passed)
        s["no_claim"] += int(r.status == "no claim")
        if r.claimed and (s["worst"] is None or r.ratio > s["worst_ratio"]):
            s["worst_ratio"] = r.ratio
            s["worst"] = {"input": r.input, "detail": r.detail, "ratio": r.ratio}
    for s in by_check.values():
        s["exact"] = s["exact"] and s["worst"] is not None
    status, reasons = verdict(results)
    return {
        "total": len(results),
        "passed": sum(r.status == "pass" for r in results),
        "failed": sum(not r.passed for r in results),
        "no_claim": sum(r.status == "no claim" for r in results),
        "verdict": status,
        "kinds": failure_kinds(results),
        "verdict_text": verdict_text(results),
        "inconclusive": reasons,
        "by_check": by_check,
    }


def error_feedback_table(results: list[CheckResult]) -> list[str]:
    """Markdown lines comparing Dion with and without error feedback, from the ``ef_bookkeeping``
    rows: per input, rank and dtype, the fraction of Σ G_t that no term accounts for (rounding
    with error feedback; the dropped gradient without it) and the largest fraction of B_t outside
    span P_t. Empty when there are no such rows."""
    rows: "OrderedDict[tuple, dict]" = OrderedDict()
    for r in results:
        if r.check == "ef_bookkeeping" and "lost_fraction" in r.extra:
            key = (r.input, r.extra["rank"], r.detail.split("/")[2] if r.detail.count("/") >= 2 else "")
            rows.setdefault(key, {})["on" if r.extra["error_feedback"] else "off"] = r.extra
    if not rows:
        return []
    lines = ["## Error feedback: on vs off", "",
             "Dion over T steps from M = 0: the part of the summed gradient that neither the momentum nor the "
             "applied steps account for, ‖Σ G − M_T − (1 − μ) Σ P Rᵀ‖ / ‖Σ G‖ (rounding with error feedback; "
             "what is lost without it), and ‖(I − PPᵀ)B‖ / ‖B‖ at the last step (what the step leaves outside its "
             "rank-r subspace; with error feedback B carries the earlier residual).", "",
             "| input | rank | dtype | lost, EF on | lost, EF off | outside span P at step T (on / off) |",
             "|---|---|---|---|---|---|"]
    for (inp, rank, dtype), modes in rows.items():
        on, off = modes.get("on", {}), modes.get("off", {})
        lines.append(f"| {inp} | {rank} | {dtype} | {format_number(on.get('lost_fraction', math.nan))} | "
                     f"{format_number(off.get('lost_fraction', math.nan))} | "
                     f"{format_number(on.get('outside_fraction', math.nan))} / "
                     f"{format_number(off.get('outside_fraction', math.nan))} |")
    return lines + [""]


#: Version of the layout of ``report.json`` (docs/verification.md, "report.json"). 1: every row under
#: "results" (unversioned); 2: summary, one entry per (check, input), failures in full, rows that
#: made no claim summarized per check, every row only when asked (``all_rows``).
REPORT_SCHEMA_VERSION = 2
#: Distinct notes kept per check in the no-claim summary of the reports.
NO_CLAIM_NOTES = 3


def _row(r: CheckResult) -> dict:
    """A row of report.json: the fields of ``CheckResult.as_dict`` (an infinite tolerance is written
    as ``Infinity``, as Python's json module does)."""
    return r.as_dict()


def no_claim_summary(results: list[CheckResult]) -> dict:
    """Per check with rows that made no claim: {"rows": count, "notes": first distinct notes
    (at most ``NO_CLAIM_NOTES``)}."""
    out: dict[str, dict] = {}
    for r in results:
        if r.status == "no claim":
            entry = out.setdefault(r.check, {"rows": 0, "notes": []})
            entry["rows"] += 1
            if r.note not in entry["notes"] and len(entry["notes"]) < NO_CLAIM_NOTES:
                entry["notes"].append(r.note)
    return out


def format_worst_ratio(entry: dict) -> str:
    """The worst error/tolerance of a ``summary`` ``by_check`` entry as the tables show it: "exact"
    for a passing check whose claims all have tolerance 0 (its ratio is 0 by definition), else 3
    decimals ("inf" for a failed exact check)."""
    if entry.get("exact") and not entry["failed"]:
        return "exact"
    return f"{entry['worst_ratio']:.3f}"


def report_body(results: list[CheckResult], meta: dict, all_rows: bool = False, seconds: dict | None = None) -> dict:
    """The content of ``report.json`` (schema ``REPORT_SCHEMA_VERSION``): ``meta``, ``summary``
    (``summary``, with ``seconds`` per check when given), ``groups`` (per (check, input): counts and its worst row,
    ``worst_per_group``), ``failures`` (every failed row in full), ``no_claim`` (``no_claim_summary``) and, with
    ``all_rows``, ``results`` (every row)."""
    groups = []
    for worst, ok, total in worst_per_group(results):
        rows = [r for r in results if r.check == worst.check and r.input == worst.input] if not worst.passed else []
        groups.append({"check": worst.check, "input": worst.input, "total": total, "passed": ok,
                       "failed": sum(not r.passed for r in rows), "worst": {k: v for k, v in _row(worst).items()
                                                                            if k not in ("check", "input")}})
    body = {"schema": "ortho-verify-report", "schema_version": REPORT_SCHEMA_VERSION, "meta": meta,
            "summary": summary(results, seconds), "groups": groups,
            "failures": [_row(r) for r in results if not r.passed],
            "no_claim": no_claim_summary(results)}
    if all_rows:
        body["results"] = [_row(r) for r in results]
    return body


def _md_row(r: CheckResult) -> str:
    return (f"| {r.check} | {r.input} | {r.detail} | {format_number(r.error)} | {format_number(r.tolerance)} | "
            f"{r.ratio:.3f} | {r.status if r.passed else 'FAIL (' + failure_kind(r) + ')'} | {r.note} |")


def write_reports(results: list[CheckResult], out_dir: Path, meta: dict, plots=(), all_rows: bool = False,
                  seconds: dict | None = None) -> tuple[Path, Path]:
    """Write ``report.json`` (``report_body``) and ``report.md`` (verdict, run metadata, summary
    per check, every failure in full, the no-claim summary, the error-feedback comparison, the
    ``plots`` (paths relative to ``out_dir``), the worst row per check and input and, with
    ``all_rows``, every row) to ``out_dir`` (created); returns both paths. ``seconds``: wall seconds
    per check (``summary``), a column of the summary when given.
    Raises: OSError if ``out_dir`` cannot be created or written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    body = report_body(results, meta, all_rows, seconds)
    summ = body["summary"]
    json_path = out_dir / "report.json"
    json_path.write_text(json.dumps(body, indent=1, default=str))
    lines = [
        "# ortho-verify report",
        "",
        f"{summ['passed']} of {summ['total']} checks passed, {summ['failed']} failed, {summ['no_claim']} made no claim "
        f"(passed vacuously: not compared, or a tolerance that cannot reject a wrong result). Verdict: "
        f"{summ['verdict_text']}.",
        "",
        "Failures by kind: " + ", ".join(f"{k} {n}" for k, n in summ["kinds"].items()) + ".",
        "",
        *[f"- nothing compared — {why}" for why in summ["inconclusive"]],
        "## Run",
        "",
    ]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    timed = seconds is not None
    lines += ["", "## Summary by check", "",
              "| check | passed | failed | no claim | total | worst error/tolerance | worst input |"
              + (" seconds |" if timed else ""), "|---|---|---|---|---|---|---|" + ("---|" if timed else "")]
    for name, s in summ["by_check"].items():
        where = f"{s['worst']['input']} ({s['worst']['detail']})" if s["worst"] else ""
        lines.append(f"| {name} | {s['passed']} | {s['failed']} | {s['no_claim']} | {s['total']} | "
                     f"{format_worst_ratio(s)} | {where} |" + (f" {s['seconds']:.1f} |" if timed else ""))
    head = ["| check | input | detail | error | tolerance | error/tol | result | note |",
            "|---|---|---|---|---|---|---|---|"]
    failed = [r for r in results if not r.passed]
    if failed:
        lines += ["", f"## Failures ({len(failed)})", "", *head, *map(_md_row, failed)]
    if body["no_claim"]:
        lines += ["", "## Rows that made no claim", "", "| check | rows | notes |", "|---|---|---|"]
        lines += [f"| {c} | {e['rows']} | {'; '.join(e['notes'])} |" for c, e in body["no_claim"].items()]
    lines += [""] + error_feedback_table(results)
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).as_posix()})" for p in plots] + [""]
    lines += ["## Worst case per check and input", "", "| check | input | detail | error/tol | result |",
              "|---|---|---|---|---|"]
    for worst, ok, total in worst_per_group(results):
        shown = f"FAIL {total - ok}/{total}" if not worst.passed else f"{ok}/{total} passed" if ok else \
            f"no claim ({total})"
        lines.append(f"| {worst.check} | {worst.input} | {worst.detail} | {worst.ratio:.3f} | {shown} |")
    if all_rows:
        lines += ["", "## Every check", "", *head, *map(_md_row, results)]
    md_path = out_dir / "report.md"
    md_path.write_text("\n".join(lines) + "\n")
    return json_path, md_path


@dataclass
class Failure:
    """A failed check with what reproduces it: ``inputs`` maps names to float64 arrays (the
    matrix given to an orthogonalizer; the initial weight and gradients of an optimizer run),
    ``provenance`` says how they were built."""

    result: CheckResult
    inputs: dict
    provenance: str


@dataclass
class VerificationReport:
    """Result of ``check_orthogonalizer`` / ``check_optimizer``: every measured row and the verdict.

    ``status`` is "passed", "failed" or "inconclusive" (nothing failed, but some check made no claim on any
    input, or nothing was compared: not ``passed``); ``bool(report)`` is ``report.passed``.

    Parameters
    ----------
    subject : str
        What was checked, e.g. "newton_schulz (jordan, float32)".
    results : list of CheckResult
        Every row: error, tolerance and ratio error/tolerance per input.
    inputs : dict
        Input name -> (arrays, provenance): what reproduces each failure.
    device : str, default ""
        Where it ran (device, torch and CUDA versions; not in ``subject``: baselines hold across machines) or "".

    Examples
    --------
    >>> from ortho_verify import VerificationReport
    >>> from ortho_verify.api import measured
    >>> VerificationReport("kernel", [measured("ns_vs_ns_map", "input 0", "float32", 1e-9, 1e-6)], {}).status
    'passed'
    """

    subject: str
    results: list
    inputs: dict
    device: str = ""

    @property
    def status(self) -> str:
        """"passed", "failed" or "inconclusive" (see the class docstring)."""
        return verdict(self.results)[0]

    @property
    def passed(self) -> bool:
        """True iff nothing failed and every check made at least one claim (status "passed")."""
        return self.status == "passed"

    @property
    def inconclusive(self) -> bool:
        """True iff nothing failed but the report is no evidence (status "inconclusive")."""
        return self.status == "inconclusive"

    def __bool__(self) -> bool:
        return self.passed

    @property
    def kinds(self) -> dict[str, int]:
        """Failed rows per kind of failure (``FAILURE_KINDS``: "wrong math", "side effect",
        "unsupported"), each counted apart."""
        return failure_kinds(self.results)

    @property
    def cause(self) -> str:
        """The one cause the report leads with (``ortho_verify.kinds.headline_cause``: the cause of
        the most failed rows on non-degenerate inputs); "" when none is known."""
        return headline_cause(self.results)

    @property
    def verdict_text(self) -> str:
        """The verdict with the kinds that made it, e.g. "failed: side effect (3 rows)"."""
        return verdict_text(self.results)

    @property
    def failures(self) -> list[Failure]:
        """The failed results, each with its reproducing input."""
        return [Failure(r, *self.inputs.get(r.input, ({}, ""))) for r in self.results if not r.passed]

    @property
    def worst_ratio(self) -> float:
        """Largest error/tolerance over the claimed results (0 when there are none)."""
        return max((r.ratio for r in self.results if r.claimed), default=0.0)

    def summary(self, max_rows: int = 12) -> str:
        """Plain-text verdict: counts, the worst case per check, the first failures and no-claim rows.

        Parameters
        ----------
        max_rows : int, default 12
            At most this many failures, and as many no-claim rows, are listed.

        Returns
        -------
        str
            The summary, one item per line; failures with the provenance that reproduces them.
        """
        status, reasons = verdict(self.results)
        counts = {k: sum(r.status == k for r in self.results) for k in ("pass", "fail", "no claim")}
        kinds = ", ".join(f"{k}: {n}" for k, n in failure_kinds(self.results).items() if n)
        finite = [r.ratio for r in self.results if r.claimed and math.isfinite(r.ratio)]
        unmeasured = sorted({r.check for r in self.results if not r.passed and not math.isfinite(r.ratio)})
        head = (f"{self.subject}: {status.upper()}{f' ({kinds})' if kinds else ''} — {counts['pass']} of "
                f"{len(self.results)} checks passed, "
                f"{counts['fail']} failed, {counts['no claim']} made no claim; worst error/tolerance "
                f"{max(finite, default=0.0):.3g}" + (f" (failed without a ratio: {', '.join(unmeasured)})"
                                                     if unmeasured else ""))
        lines = [head] + ([f"  ran on {self.device}"] if self.device else []) + \
            [f"  nothing compared — {why}" for why in reasons]
        if self.cause:
            lines.append(f"likely cause: {self.cause}")
        by_check: dict[str, CheckResult] = {}
        for worst, _, _ in worst_per_group(self.results):
            key = (not worst.passed, worst.claimed, worst.ratio)
            old = by_check.get(worst.check)
            if old is None or key > (not old.passed, old.claimed, old.ratio):
                by_check[worst.check] = worst
        lines.append("worst case per check:")
        lines += [f"  {r.check}: {ratio_text(r)} ({r.input}; {r.detail}){'  FAIL' if not r.passed else ''}"
                  f"{'' if r.claimed else '  no claim'}{' — ' + r.note if r.note else ''}" for r in by_check.values()]
        fails = self.failures
        if fails:
            lines.append(f"failures ({len(fails)}):")
            for f in fails[:max_rows]:
                lines.append(f"  [{failure_kind(f.result)}] {f.result.check} on {f.result.input} [{f.result.detail}]: "
                             f"error {f.result.error:.3g} > "
                             f"tolerance {f.result.tolerance:.3g}{' — ' + f.result.note if f.result.note else ''}")
                lines.append(f"    reproduce: {f.provenance}")
            if len(fails) > max_rows:
                lines.append(f"  ... and {len(fails) - max_rows} more")
        vacuous = [r for r in self.results if r.status == "no claim"]
        if vacuous:
            lines.append(f"no claim ({len(vacuous)}: passed vacuously, not counted as evidence):")
            lines += [f"  {r.check} on {r.input} — {r.note}" for r in vacuous[:max_rows]]
            if len(vacuous) > max_rows:
                lines.append(f"  ... and {len(vacuous) - max_rows} more")
        return "\n".join(lines)

    def assert_passed(self) -> None:
        """Raise AssertionError with ``summary()`` unless the report passed."""
        if not self.passed:
            raise AssertionError(self.summary())

    def save(self, out_dir) -> Path:
        """Write report.json, report.md, provenance.json and failures.npz (the failures' inputs) to ``out_dir``.

        Parameters
        ----------
        out_dir : str or os.PathLike
            The folder (created if missing).

        Returns
        -------
        pathlib.Path
            ``out_dir``.
        """
        out = Path(out_dir)
        write_reports(self.results, out, {"subject": self.subject}, all_rows=True)
        arrays = {f"{f.result.input}/{k}": v for f in self.failures for k, v in f.inputs.items()}
        if arrays:
            np.savez(out / "failures.npz", **arrays)
        (out / "provenance.json").write_text(json.dumps({k: v[1] for k, v in self.inputs.items()}, indent=2))
        return out
