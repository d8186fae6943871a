"""``ortho-verify identify module:attr``: identify a Newton–Schulz kernel or a Muon / Dion optimizer
with no declaration given, judge it under the declaration found, print ``Identification.summary()``.

A callable on tensors goes to ``identify_orthogonalizer``; an optimizer class (a subclass of
``torch.optim.Optimizer``) or a factory that builds one goes to
``ortho_verify.identify.optimizer.identify_optimizer``. Exit codes: 0 passed, 1 failed, 2 usage error
(a module or attribute that does not import, an object that is neither a kernel nor an optimizer).
docs/identification.md, "The command line".
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import textwrap
from pathlib import Path

from ..cli.arguments import EXIT_FAILED, EXIT_PASSED, EXIT_USAGE, SuggestingParser, check_output_file

__all__ = ["build_parser", "identification_json", "main", "resolve", "wrap"]


def build_parser() -> argparse.ArgumentParser:
    """The ``ortho-verify identify`` command line."""
    parser = SuggestingParser(
        prog="ortho-verify identify",
        description="Identify what a Newton–Schulz kernel or a Muon / Dion optimizer computes from designed inputs "
                    "alone, then judge it under the declaration found.",
        epilog="Exit codes: 0 passed (a registered declaration fits and the judge passed); 1 failed; 2 usage error.")
    parser.add_argument("target", metavar="module:attr",
                        help="the kernel (a callable on (..., m, n) tensors), or an optimizer class or factory, "
                             "e.g. my_package.muon:newton_schulz (the current folder is importable)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE",
                        help="write the identification (declaration, evidence, differences, verdict) to FILE")
    parser.add_argument("--seed", type=int, default=0, help="seed of the probes and the judge's inputs (default 0)")
    parser.add_argument("--no-judge", action="store_true",
                        help="identify only, without the judge (exit 0 when a known declaration fits every probe)")
    parser.add_argument("--device", default=None, metavar="DEVICE", help="where the kernel runs (default: cpu)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    return parser


def resolve(target: str):
    """The object named by "module:attr" (attr may be dotted), importing the module with the current
    folder on ``sys.path``. Raises: ValueError naming the target when it does not resolve."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{target!r}: expected module:attr, e.g. my_package.muon:newton_schulz")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(module_name)
    except Exception as err:  # a module that does not import is a usage error, named
        raise ValueError(f"{target!r}: cannot import {module_name!r} ({type(err).__name__}: {err})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{target!r}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _plain(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return repr(value)


def identification_json(found, target: str) -> dict:
    """The identification as JSON-ready data: target, kind, verdict, fits, declaration (dtypes as names),
    snippet, evidence (field, value, measured, runner-up, margin, tolerance, note), differences, and the
    judge's verdict text and cause."""
    decl = found.declaration if isinstance(found.declaration, dict) else \
        {k: v for k, v in vars(found.declaration).items()} if hasattr(found.declaration, "__dict__") else \
        repr(found.declaration)
    return {"target": target, "kind": found.kind, "verdict": "passed" if found.passed else "failed",
            "fits": found.fits, "declaration": _plain(decl), "snippet": found.snippet,
            "evidence": [_plain({"field": e.field, "value": e.value, "measured": e.measured, "runner_up": e.runner_up,
                                 "runner_up_measured": e.runner_up_measured, "margin": e.margin,
                                 "tolerance": e.tolerance, "note": e.note}) for e in found.evidence],
            "differences": list(found.differences),
            "judge": None if found.report is None else {"verdict": found.report.verdict_text,
                                                        "cause": found.report.cause}}


def wrap(text: str, width: int) -> str:
    """Each line of ``text`` wrapped to ``width`` columns, continuation lines indented two spaces more."""
    out = []
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        out += textwrap.wrap(line, width=width, subsequent_indent=" " * (indent + 2), break_long_words=True,
                             break_on_hyphens=False) or [""]
    return "\n".join(out)


def _is_optimizer_class(obj) -> bool:
    import torch

    return isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer)


def identify(obj, args):
    """``identify_orthogonalizer`` or ``identify_optimizer`` on ``obj`` (see the module docstring).
    Raises: ValueError when ``obj`` is neither (the message names what was probed and what came back)."""
    from .kernel import identify_orthogonalizer

    if not callable(obj):
        raise ValueError(f"{type(obj).__name__} is not callable: expected a kernel, an optimizer class or a factory")
    if not _is_optimizer_class(obj):
        try:
            return identify_orthogonalizer(obj, judge=not args.no_judge, seed=args.seed, device=args.device)
        except ValueError as kernel_error:
            try:
                optimizer = importlib.import_module("ortho_verify.identify.optimizer")
            except ModuleNotFoundError:
                raise kernel_error from None
            try:
                return optimizer.identify_optimizer(obj, judge=not args.no_judge, seed=args.seed)
            except (TypeError, ValueError) as optimizer_error:
                raise ValueError(f"neither a kernel nor an optimizer: {kernel_error}; as an optimizer factory: "
                                 f"{optimizer_error}") from None
    try:
        optimizer = importlib.import_module("ortho_verify.identify.optimizer")
    except ModuleNotFoundError:
        raise ValueError("optimizer identification (ortho_verify.identify.optimizer) is not installed") from None
    return optimizer.identify_optimizer(obj, judge=not args.no_judge, seed=args.seed)


def main(argv: list[str] | None = None) -> int:
    """Run ``ortho-verify identify``; returns the exit code (0 passed, 1 failed, 2 usage error)."""
    import torch

    from ..report.terminal import terminal_width

    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    check_output_file(parser, "--json", args.json)
    if args.threads < 1:
        parser.error(f"--threads {args.threads}: expected an integer >= 1")
    try:
        obj = resolve(args.target)
    except ValueError as err:
        parser.error(str(err))
    previous = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        found = identify(obj, args)
    except (TypeError, ValueError) as err:
        print(wrap(f"ortho-verify identify: error: {args.target}: {err}", terminal_width()), file=sys.stderr)
        return EXIT_USAGE
    finally:
        torch.set_num_threads(previous)
    print(wrap(found.summary(), terminal_width()))
    if args.json is not None:
        args.json.write_text(json.dumps(identification_json(found, args.target), indent=1))
    ok = found.passed if found.report is not None else found.fits and not found.differences  # --no-judge
    return EXIT_PASSED if ok else EXIT_FAILED
