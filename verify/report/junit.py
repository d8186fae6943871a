"""JUnit XML of an ``ortho-verify`` run (``--junit-xml FILE``): one test case per check and input.

The layout is the common JUnit schema that CI systems read (Jenkins, GitLab, GitHub test
reporters; the ``testsuites``/``testsuite``/``testcase``/``failure``/``skipped`` elements of
Ant's JUnit report, as pytest's ``--junit-xml`` writes them): a ``testsuite`` named after the run,
one ``testcase`` per (check, input) with ``classname`` = the check and ``name`` = the input, a
``failure`` element when a row of it failed (message: the worst row; text: every failed row), a
``skipped`` element when none of its rows made a claim (message: the first row's note).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from .results import CheckResult, format_number, worst_per_group

__all__ = ["junit_tree", "write_junit_xml"]


def _line(r: CheckResult) -> str:
    return (f"{r.check} on {r.input} [{r.detail}]: error {format_number(r.error)}, tolerance "
            f"{format_number(r.tolerance)}, error/tol {r.ratio:.3g}{' — ' + r.note if r.note else ''}")


def junit_tree(results: list[CheckResult], suite: str = "ortho-verify", elapsed_s: float = 0.0) -> ET.ElementTree:
    """The JUnit XML tree of ``results`` (see the module docstring). ``elapsed_s``: the suite's
    ``time`` attribute in seconds (test cases carry time 0: checks are not timed one by one)."""
    groups: dict[tuple[str, str], list[CheckResult]] = {}
    for r in results:
        groups.setdefault((r.check, r.input), []).append(r)
    root = ET.Element("testsuites", name=suite)
    element = ET.SubElement(root, "testsuite", name=suite)
    failures = skipped = 0
    for worst, ok, total in worst_per_group(results):
        rows = groups[(worst.check, worst.input)]
        case = ET.SubElement(element, "testcase", classname=worst.check, name=worst.input, time="0")
        if not worst.passed:
            failures += 1
            failed = [r for r in rows if not r.passed]
            node = ET.SubElement(case, "failure", message=_line(worst), type="tolerance exceeded")
            node.text = f"{len(failed)} of {total} rows failed:\n" + "\n".join(_line(r) for r in failed)
        elif not worst.claimed:
            skipped += 1
            ET.SubElement(case, "skipped", message=f"no claim on {total} rows: {worst.note or 'no note'}")
        else:
            ET.SubElement(case, "system-out").text = f"{ok} of {total} rows passed; worst: {_line(worst)}"
    stats = {"tests": str(len(element)), "failures": str(failures), "errors": "0", "skipped": str(skipped),
             "time": f"{elapsed_s:.3f}"}
    element.attrib.update(stats)
    root.attrib.update({k: v for k, v in stats.items() if k != "skipped"})
    return ET.ElementTree(root)


def write_junit_xml(results: list[CheckResult], path, suite: str = "ortho-verify", elapsed_s: float = 0.0) -> Path:
    """Write ``junit_tree(results, suite, elapsed_s)`` to ``path`` (UTF-8, with an XML declaration;
    parent folders created); returns the path. Raises: OSError if it cannot be written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tree = junit_tree(results, suite, elapsed_s)
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)
    return path
