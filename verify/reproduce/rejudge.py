"""``ortho-verify reproduce --rejudge RESULTS``: the claims and trends of a stored ``results.json``
judged again with the current decision rules (``statistics``, ``claims``, ``trend``), no run repeated.
The losses, curves, costs and configuration are the stored run's; only the verdicts, their power and
the report's text change."""

from __future__ import annotations

import copy
import datetime
import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

from .claims import evaluate_claims
from .scaling import size_trends

__all__ = ["load_results", "rejudge"]


def load_results(path: Path) -> dict:
    """A ``results.json`` written by ``write_report``. Raises: ValueError naming ``path`` when it is not
    a reproduction's results (no ``evaluation`` / ``claims``); OSError when it cannot be read."""
    results = json.loads(Path(path).read_text())
    if not isinstance(results, dict) or not {"evaluation", "claims", "config"} <= set(results):
        raise ValueError(f"--rejudge {path}: not the results.json of ortho-verify reproduce (expected the keys "
                         "'evaluation', 'claims', 'config')")
    return results


def rejudge(results: Mapping, command: str = "ortho-verify reproduce --rejudge") -> dict:
    """A copy of ``results`` with every claim (of the whole run and of each size) and every trend judged
    again (``evaluate_claims``, ``size_trends``; the run's ``mode``, "study" when it has none), and
    ``rejudged`` {"command", "date"} recording it."""
    out = copy.deepcopy(dict(results))
    mode = out.get("mode", "study")
    for r in [out, *out.get("sizes", [])]:
        r["mode"] = mode
        r["claims"] = [asdict(c) for c in evaluate_claims(r)]
    if out.get("sizes"):
        out["trends"] = size_trends(out["sizes"])
        if mode == "measurement":
            for t in out["trends"]:
                t["verdict"] = "measured"
    out["rejudged"] = {"command": command, "date": datetime.date.today().isoformat()}
    return out
