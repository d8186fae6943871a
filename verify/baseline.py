"""Regression baselines for ``ortho-verify --baseline FILE``.

A baseline is a JSON file with the error/tolerance ratio of every claimed check of a run
(rows that made no claim are left out: a check that stops making its claim shows as missing),
keyed by (check, input, detail), the run's mode (quick, real inputs, seed) and a SHA-256 per
golden file of the oracle (``ortho_ref/golden/data``) over what it asserts — function,
arguments, digits and the stored arrays — not the sidecar's date, versions or mpmath backend. ``compare`` turns a new run into
``baseline_regression`` rows (one per check name, the worst key), a ``baseline_coverage`` row
(checks of the baseline missing from a run of the same mode) and a ``baseline_golden_files``
row (golden files changed or removed). A ratio regresses when
r_new > max(BASELINE_GROWTH·r_old, BASELINE_FLOOR) (``ortho_verify.tolerances``: 2 and 0.1).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np

from ortho_verify.results import CheckResult, measured
from ortho_verify.tolerances import BASELINE_FLOOR, BASELINE_GROWTH

__all__ = ["FORMAT", "GOLDEN_DIR", "allowed_ratio", "compare", "golden_hashes", "load", "write"]

FORMAT = 2  # 2: golden files hashed by content (``golden_hashes``), no-claim rows left out
GOLDEN_DIR = Path(__file__).resolve().parents[1] / "ortho_ref" / "golden" / "data"
_MODE_KEYS = ("quick", "real_inputs_used", "seed")


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


def write(path, results: list[CheckResult], mode: dict, golden_dir: Path | None = None) -> Path:
    """Write the baseline of ``results`` to ``path`` (JSON; parent folders created).

    ``mode``: the run's {"quick", "real_inputs_used", "seed"}. Raises: ValueError if a result
    failed (a baseline records a passing state).
    """
    failed = [r for r in results if not r.passed]
    if failed:
        raise ValueError(f"results: {len(failed)} checks failed (first: {_key(failed[0])}); "
                         "a baseline records a passing run")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"format": FORMAT, "margin": {"growth": BASELINE_GROWTH, "floor": BASELINE_FLOOR},
            "mode": {k: mode.get(k) for k in _MODE_KEYS}, "golden_files": golden_hashes(golden_dir),
            "ratios": {k: (v if math.isfinite(v) else "inf") for k, v in sorted(_ratios(results).items())}}
    path.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    return path


def load(path) -> dict:
    """Read a baseline; ValueError naming the file for a wrong format or missing fields."""
    body = json.loads(Path(path).read_text())
    if body.get("format") != FORMAT or not isinstance(body.get("ratios"), dict):
        raise ValueError(f"baseline {path}: expected format {FORMAT} with a 'ratios' table")
    body["ratios"] = {k: float(v) for k, v in body["ratios"].items()}
    return body


def allowed_ratio(old: float) -> float:
    """The largest new ratio that is not a regression: max(BASELINE_GROWTH·old, BASELINE_FLOOR)."""
    return max(BASELINE_GROWTH * old, BASELINE_FLOOR)


def compare(results: list[CheckResult], baseline: dict, mode: dict, golden_dir: Path | None = None) -> list[CheckResult]:
    """Rows comparing a run with a loaded baseline (see the module docstring).

    ``baseline_regression`` per check name present in both: error = the new ratio of the key with
    the largest new/allowed, tolerance = its allowed ratio, the old ratio in the note.
    ``baseline_coverage`` (only when the run's mode equals the baseline's; otherwise there is no
    claim to make, and every row's note says so): error = number of baseline keys absent from
    this run, tolerance 0; a row that made a claim in the baseline and none now counts as absent. ``baseline_golden_files``: error = number of golden files whose
    content (``golden_hashes``) changed or that were removed since the baseline, tolerance 0.
    """
    old, new = baseline["ratios"], _ratios(results)
    worst: dict[str, tuple[float, str]] = {}
    for key, ratio in new.items():
        if key in old:
            check = key.split(" | ", 1)[0]
            score = ratio / allowed_ratio(old[key])
            if check not in worst or score > worst[check][0]:
                worst[check] = (score, key)
    rows = []
    for check, (_, key) in sorted(worst.items()):
        _, inp, detail = key.split(" | ", 2)
        rows.append(measured("baseline_regression", inp, f"{check}: {detail}", new[key], allowed_ratio(old[key]),
                             f"baseline ratio {old[key]:.3g}; fails above max({BASELINE_GROWTH:g} x baseline, "
                             f"{BASELINE_FLOOR:g})"))
    same_mode = all(baseline.get("mode", {}).get(k) == mode.get(k) for k in _MODE_KEYS)
    missing = sorted(set(old) - set(new))
    counts = f"{len(set(old) & set(new))} compared, {len(set(new) - set(old))} new"
    if same_mode:
        rows.append(measured("baseline_coverage", "baseline", "checks of the baseline present in this run",
                             len(missing), 0.0,
                             (f"missing: {missing[0]}{' ...' if len(missing) > 1 else ''}; " if missing else "")
                             + counts))
    then, now = baseline.get("golden_files", {}), golden_hashes(golden_dir)
    changed = sorted(name for name, digest in then.items() if now.get(name) != digest)
    rows.append(measured("baseline_golden_files", "ortho_ref/golden", "golden files unchanged since the baseline",
                         len(changed), 0.0, f"changed or removed: {', '.join(changed)}" if changed else
                         f"{len(then)} files, {len(set(now) - set(then))} added"))
    if not same_mode:
        for row in rows:
            row.note += f"; run mode differs from the baseline's: coverage not enforced ({counts})"
    return rows
