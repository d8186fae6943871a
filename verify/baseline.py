"""Regression baselines for ``ortho-verify --baseline FILE``.

A baseline is a JSON file with the error/tolerance ratio of every check of a run, keyed by
(check, input, detail), the run's mode (quick, real inputs, seed) and the SHA-256 of the
oracle's golden files (``ortho_ref/golden/data``). ``compare`` turns a new run into
``baseline_regression`` rows (one per check name, the worst key), a ``baseline_coverage`` row
(checks of the baseline missing from a run of the same mode) and a ``baseline_golden_files``
row (golden files changed or removed). A ratio regresses when
r_new > max(BASELINE_GROWTH·r_old, BASELINE_FLOOR) (``verify.tolerances``: 2 and 0.1).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from verify.checks import CheckResult, measured
from verify.tolerances import BASELINE_FLOOR, BASELINE_GROWTH

__all__ = ["FORMAT", "GOLDEN_DIR", "allowed_ratio", "compare", "golden_hashes", "load", "write"]

FORMAT = 1
GOLDEN_DIR = Path(__file__).resolve().parents[1] / "ortho_ref" / "golden" / "data"
_MODE_KEYS = ("quick", "real_inputs_used", "seed")


def _key(r: CheckResult) -> str:
    return f"{r.check} | {r.input} | {r.detail}"


def golden_hashes(directory: Path | None = None) -> dict[str, str]:
    """SHA-256 of every file under the golden directory (relative path -> hex); {} if absent."""
    root = GOLDEN_DIR if directory is None else Path(directory)
    if not root.is_dir():
        return {}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _ratios(results: list[CheckResult]) -> dict[str, float]:
    """Worst ratio per key (a key measured twice keeps its larger ratio); inf stored as a string."""
    out: dict[str, float] = {}
    for r in results:
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
    ``baseline_coverage``: error = number of baseline keys absent from this run, tolerance 0 when
    the modes are equal (else reported, not failed). ``baseline_golden_files``: error = number
    of golden files changed or removed since the baseline, tolerance 0.
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
    rows.append(measured("baseline_coverage", "baseline", "checks of the baseline present in this run",
                         len(missing), 0.0 if same_mode else math.inf,
                         (f"missing: {missing[0]}{' ...' if len(missing) > 1 else ''}; " if missing else "")
                         + f"{len(set(old) & set(new))} compared, {len(set(new) - set(old))} new"
                         + ("" if same_mode else "; run mode differs from the baseline's: not enforced")))
    then, now = baseline.get("golden_files", {}), golden_hashes(golden_dir)
    changed = sorted(name for name, digest in then.items() if now.get(name) != digest)
    rows.append(measured("baseline_golden_files", "ortho_ref/golden", "golden files unchanged since the baseline",
                         len(changed), 0.0, f"changed or removed: {', '.join(changed)}" if changed else
                         f"{len(then)} files, {len(set(now) - set(then))} added"))
    return rows
