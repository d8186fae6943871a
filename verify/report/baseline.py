"""Regression baselines for ``ortho-verify --baseline FILE``.

A baseline is a JSON file with the error/tolerance ratio of every claimed check of a run
(rows that made no claim are left out: a check that stops making its claim shows as missing),
keyed by (check, input, detail), the run's mode (quick, real inputs, seed) and a SHA-256 per
golden file of the oracle (``ortho_ref/golden/data``) over what it asserts — function,
arguments, digits and the stored arrays — not the sidecar's date, versions or mpmath backend. ``compare`` turns a new
run into ``baseline_regression`` rows (one per check name, the worst key), a ``baseline_coverage`` row
(checks of the baseline missing from a run of the same mode) and a ``baseline_golden_files``
row (golden files changed or removed). A ratio regresses when
r_new > max(BASELINE_GROWTH·r_old, BASELINE_FLOOR) (``ortho_verify.tolerances``: 2 and 0.1).

Inputs: the baseline records the identity of the real-gradient corpus (``ortho_verify.inputs.corpus
.corpus_identity``: name, size, SHA-256). When a run's corpus differs, its real-input rows are not
compared (they measure other matrices) and one ``baseline_inputs`` row that made no claim says so —
the run's verdict is "inconclusive" (exit 1), never a regression.

A user's own report (``check_orthogonalizer`` / ``check_optimizer``): ``save_baseline`` and
``compare_with_baseline`` (docs/verification.md, "Regression CI with a baseline"); the pytest
fixture ``ortho_baseline`` keeps one file per test, keyed by the full test id (``baseline_path_for_test``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import numpy as np

from ..tolerances import BASELINE_FLOOR, BASELINE_GROWTH
from .results import CheckResult, VerificationReport, measured, no_claim

__all__ = ["BASELINE_FOLDER", "FORMAT", "GOLDEN_DIR", "READABLE_FORMATS", "allowed_ratio", "compare",
           "compare_with_baseline", "golden_hashes", "load", "save_baseline", "baseline_path_for_test", "write"]

#: 2: golden files hashed by content (``golden_hashes``), no-claim rows left out; 3: the identity of
#: the real-gradient corpus ("inputs"), any run mode (a user's report: its subject).
FORMAT = 3
#: Formats ``load`` reads (a format-2 baseline has no corpus identity: its real inputs are not compared).
READABLE_FORMATS = (2, 3)
GOLDEN_DIR = Path(__file__).resolve().parents[2] / "ortho_ref" / "golden" / "data"
#: The folder of the ``ortho_baseline`` fixture's files, beside each test file.
BASELINE_FOLDER = "ortho-baselines"


def _safe_name(name: str) -> str:
    """A file name for a test id: every run of characters outside [A-Za-z0-9_.-] becomes "_"."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "baseline"


def baseline_path_for_test(test_file, test_id: str, *, folder=None, rootpath=None) -> Path:
    """The baseline file of one test for the ``ortho_baseline`` fixture, keyed by the full test id.

    ``test_file``: the test's module (pytest's ``request.node.path``); ``test_id``: the test's
    id within it (the node id after the file: ``"TestKernel::test_drift[float32]"``), or the name
    a test gave. Default: ``<folder of test_file>/ortho-baselines/<module stem>/<test id>.json`` —
    anchored at the test file, so the same test finds the same file whatever the working
    directory or pytest's rootdir, and same-named tests in other modules or folders get their own.
    ``folder`` (``--ortho-baseline-dir``): ``<folder>/<test file relative to rootpath, without
    .py>/<test id>.json`` (the path of a test file outside rootpath: from its anchor, e.g. "/").
    Characters outside [A-Za-z0-9_.-] of the test id become "_".
    Source: pytest-regressions keeps its data files beside the test module the same way.
    """
    test_file = Path(test_file)
    name = f"{_safe_name(test_id)}.json"
    if folder is None:
        return test_file.parent / BASELINE_FOLDER / test_file.stem / name
    try:
        relative = test_file.with_suffix("").relative_to(Path(rootpath)) if rootpath is not None else None
    except ValueError:
        relative = None
    if relative is None:
        relative = test_file.with_suffix("").relative_to(test_file.anchor)
    return Path(folder) / relative / name


def legacy_baseline_path(test_name: str, *, folder=None, rootpath=None) -> Path:
    """Where the ``ortho_baseline`` fixture kept a baseline before it was keyed by the full test id:
    ``<folder or <rootpath>/ortho-baselines>/<test name>.json`` (``test_name``: pytest's
    ``request.node.name``, or the name a test gave; characters outside [A-Za-z0-9_.-] become "_").
    Only read, to name the file to move when the current path (``baseline_path_for_test``) has none."""
    base = Path(folder) if folder is not None else Path(rootpath if rootpath is not None else ".") / BASELINE_FOLDER
    return base / f"{_safe_name(test_name)}.json"


def _key(r: CheckResult) -> str:
    return f"{r.check} | {r.input} | {r.detail}"


#: Sidecar fields a golden file's hash covers: what the stored values mean. The others (date,
#: generator, mpmath / numpy versions and backend, provenance, the stored tolerance) describe how
#: and when the file was made and may change when the same data is regenerated.
GOLDEN_FIELDS = ("function", "arguments", "digits", "inputs", "outputs")


def _golden_digest(root: Path, name: str) -> str:
    """SHA-256 over the ``GOLDEN_FIELDS`` of ``name``.json (canonical JSON) and every array of
    ``name``.npz (name, dtype, shape, bytes, in name order); over the raw bytes of both files when
    they cannot be read as a golden pair (a corrupted file still changes the digest)."""
    h = hashlib.sha256()
    try:
        meta = json.loads((root / f"{name}.json").read_text())
        h.update(json.dumps({k: meta.get(k) for k in GOLDEN_FIELDS}, sort_keys=True).encode())
        with np.load(root / f"{name}.npz", allow_pickle=False) as data:
            for key in sorted(data.files):
                a = np.ascontiguousarray(data[key])
                h.update(f"{key}|{a.dtype.str}|{a.shape}".encode())
                h.update(a.tobytes())
    except (OSError, ValueError):
        h = hashlib.sha256(b"unreadable")
        for path in (root / f"{name}.json", root / f"{name}.npz"):
            h.update(path.read_bytes() if path.is_file() else b"missing")
    return h.hexdigest()


def golden_hashes(directory: Path | None = None) -> dict[str, str]:
    """Content digest (``_golden_digest``) of every golden file (a ``<name>.json`` with its
    ``<name>.npz``) in the golden directory: name -> hex; {} if the directory is absent."""
    root = GOLDEN_DIR if directory is None else Path(directory)
    if not root.is_dir():
        return {}
    return {p.stem: _golden_digest(root, p.stem) for p in sorted(root.glob("*.json"))}


def _ratios(results: list[CheckResult]) -> dict[str, float]:
    """Worst ratio per key of the claimed rows (a key measured twice keeps its larger ratio)."""
    out: dict[str, float] = {}
    for r in results:
        if r.claimed:
            out[_key(r)] = max(out.get(_key(r), 0.0), r.ratio)
    return out


def write(path, results: list[CheckResult], mode: dict, golden_dir: Path | None = None, *, inputs: dict | None = None,
          golden: bool = True) -> Path:
    """Write the baseline of ``results`` to ``path`` (JSON; parent folders created).

    ``mode``: what must match for coverage to be enforced (the CLI's {"quick", "real_inputs_used",
    "seed"}; a user's report: {"subject"}). ``inputs``: {"corpus": ``corpus_identity`` or None,
    "real_inputs": names of the inputs trained on it} of the run. ``golden``: record the oracle's golden files
    (``golden_hashes``). Raises: ValueError if a result failed (a baseline records a passing state); OSError if the
    file cannot be written.
    """
    failed = [r for r in results if not r.passed]
    if failed:
        raise ValueError(f"results: {len(failed)} checks failed (first: {_key(failed[0])}); "
                         "a baseline records a passing run")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"format": FORMAT, "margin": {"growth": BASELINE_GROWTH, "floor": BASELINE_FLOOR},
            "mode": dict(mode), "inputs": dict(inputs or {"corpus": None}),
            "golden_files": golden_hashes(golden_dir) if golden else None,
            "ratios": {k: (v if math.isfinite(v) else "inf") for k, v in sorted(_ratios(results).items())}}
    path.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    return path


def load(path) -> dict:
    """Read a baseline written by ``write``.

    Raises: OSError if the file cannot be read; ValueError naming the file when it is not JSON,
    not a JSON object, of another format, or its "ratios" is not a table of numbers.
    """
    try:
        body = json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"baseline {path}: not JSON ({err})") from None
    if not isinstance(body, dict):
        raise ValueError(f"baseline {path}: expected a JSON object written by --update-baseline, got a "
                         f"{type(body).__name__}")
    if body.get("format") not in READABLE_FORMATS or not isinstance(body.get("ratios"), dict):
        raise ValueError(f"baseline {path}: expected format {FORMAT} with a 'ratios' table (got format "
                         f"{body.get('format')!r}); write it again with --update-baseline")
    try:
        body["ratios"] = {str(k): float(v) for k, v in body["ratios"].items()}
    except (TypeError, ValueError):
        raise ValueError(f"baseline {path}: 'ratios' must map keys to numbers") from None
    if not isinstance(body.get("mode", {}), dict):
        raise ValueError(f"baseline {path}: 'mode' must be a JSON object")
    return body


def allowed_ratio(old: float) -> float:
    """The largest new ratio that is not a regression: max(BASELINE_GROWTH·old, BASELINE_FLOOR)."""
    return max(BASELINE_GROWTH * old, BASELINE_FLOOR)


def _corpus_note(then, now) -> str:
    def name(c):
        return "none recorded" if not c else f"{c.get('name')} ({str(c.get('sha256'))[:12]}…)"
    return f"baseline corpus {name(then)}, this run {name(now)}"


def compare(results: list[CheckResult], baseline: dict, mode: dict, golden_dir: Path | None = None, *,
            inputs: dict | None = None, real_inputs=(), golden: bool = True) -> list[CheckResult]:
    """Rows comparing a run with a loaded baseline (see the module docstring).

    ``baseline_regression`` per check name present in both: error = the new ratio of the key with
    the largest new/allowed, tolerance = its allowed ratio, the old ratio in the note.
    ``baseline_coverage`` (only when the run's ``mode`` equals the baseline's; otherwise there is no
    claim to make, and every row's note says so): error = number of baseline keys absent from
    this run, tolerance 0; a row that made a claim in the baseline and none now counts as absent.
    ``baseline_golden_files`` (when ``golden``): error = number of golden files whose content
    (``golden_hashes``) changed or that were removed since the baseline, tolerance 0.
    ``baseline_inputs`` (a row that makes no claim, so the verdict is "inconclusive"): when the
    run's ``inputs["corpus"]`` differs from the baseline's, the rows on ``real_inputs`` (input
    names trained on the corpus) are left out of every comparison and this row says why.
    """
    old, new = dict(baseline["ratios"]), _ratios(results)
    stored_inputs = baseline.get("inputs") or {}
    then_corpus, now_corpus = stored_inputs.get("corpus"), (inputs or {}).get("corpus")
    then_real = set(stored_inputs.get("real_inputs") or ())
    rows = []
    real_inputs = set(real_inputs)
    baseline_had_real = bool(then_real) or bool(baseline.get("mode", {}).get("real_inputs_used"))
    if real_inputs and baseline_had_real and then_corpus != now_corpus:
        def on_real(key):
            return key.split(" | ")[1] in real_inputs | then_real
        skipped = sum(on_real(k) for k in new)
        new = {k: v for k, v in new.items() if not on_real(k)}
        old = {k: v for k, v in old.items() if not on_real(k)}
        rows.append(no_claim("baseline_inputs", "baseline", "real-gradient corpus of the baseline and of this run",
                             f"different real-gradient inputs: {_corpus_note(then_corpus, now_corpus)}; {skipped} "
                             "real-input rows not compared. Write the baseline again with --update-baseline on "
                             "this version, or use --no-real for a baseline that needs no corpus"))
    worst: dict[str, tuple[float, str]] = {}
    for key, ratio in new.items():
        if key in old:
            check = key.split(" | ", 1)[0]
            score = ratio / allowed_ratio(old[key])
            if check not in worst or score > worst[check][0]:
                worst[check] = (score, key)
    for check, (_, key) in sorted(worst.items()):
        _, inp, detail = key.split(" | ", 2)
        rows.append(measured("baseline_regression", inp, f"{check}: {detail}", new[key], allowed_ratio(old[key]),
                             f"baseline ratio {old[key]:.3g}; fails above max({BASELINE_GROWTH:g} x baseline, "
                             f"{BASELINE_FLOOR:g})"))
    stored_mode = baseline.get("mode", {})
    same_mode = all(stored_mode.get(k) == mode.get(k) for k in set(stored_mode) | set(mode))
    missing = sorted(set(old) - set(new))
    counts = f"{len(set(old) & set(new))} compared, {len(set(new) - set(old))} new"
    if same_mode:
        rows.append(measured("baseline_coverage", "baseline", "checks of the baseline present in this run",
                             len(missing), 0.0,
                             (f"missing: {missing[0]}{' ...' if len(missing) > 1 else ''}; " if missing else "")
                             + counts))
    if golden:
        then, now = baseline.get("golden_files") or {}, golden_hashes(golden_dir)
        changed = sorted(name for name, digest in then.items() if now.get(name) != digest)
        rows.append(measured("baseline_golden_files", "ortho_ref/golden", "golden files unchanged since the baseline",
                             len(changed), 0.0, f"changed or removed: {', '.join(changed)}" if changed else
                             f"{len(then)} files, {len(set(now) - set(then))} added"))
    if not same_mode:
        for row in rows:
            if row.check != "baseline_inputs":
                row.note += f"; run mode differs from the baseline's: coverage not enforced ({counts})"
    return rows


def save_baseline(report: VerificationReport, path) -> Path:
    """Write the baseline of a user's ``check_orthogonalizer`` / ``check_optimizer`` report
    (``write`` with mode {"subject": report.subject}, no golden files) to ``path``.
    Raises: ValueError if the report has a failed row; OSError if ``path`` cannot be written."""
    return write(path, report.results, {"subject": report.subject}, golden=False)


def compare_with_baseline(report: VerificationReport, path) -> VerificationReport:
    """A new ``VerificationReport``: ``report``'s rows plus the baseline rows of ``compare``
    (regression per check, coverage) against the baseline at ``path`` (``save_baseline``).
    Its ``passed`` is False when a ratio regressed or a check of the baseline is missing.
    Raises: OSError if ``path`` cannot be read, ValueError if it is not a baseline (``load``)."""
    rows = compare(report.results, load(path), {"subject": report.subject}, golden=False)
    return VerificationReport(report.subject, [*report.results, *rows], report.inputs, report.device)
