"""``ortho-verify sharding --optimizer package.module:factory``: ``check_sharded_optimizer`` from
the command line (one report per world size and dtype, printed and written as JSON)."""

from __future__ import annotations

import json
import math

import torch

__all__ = ["optimizer_main"]


def optimizer_main(args, dtypes) -> int:
    """Run ``check_sharded_optimizer(load_factory(args.optimizer), ...)`` for every world size and
    dtype of ``args`` (``--layout`` filters, ``--timeout`` the most per layout, ``--hang-floor``,
    ``--shapes``, ``--state-placement``, ``--compute-dtype``); print each summary, write
    ``args.out / "sharded_optimizer.json"``; returns 0 if every report passed, else 1 (2 when the
    factory cannot be imported, or ``--layout`` matches nothing)."""
    from ..report.tables import print_plain
    from ..report.terminal import terminal_width
    from .sharded_check import check_sharded_optimizer, load_factory

    try:
        factory = load_factory(args.optimizer)
    except (ImportError, AttributeError, ValueError) as err:
        print(f"ortho-verify sharding: error: --optimizer: {type(err).__name__}: {err}")
        return 2
    reports, ok = [], True
    for n in args.world_size:
        for dtype in dtypes:
            try:
                report = check_sharded_optimizer(factory, world_size=n, layouts=args.layout,
                                                 dtype=getattr(torch, dtype), timeout=min(args.timeout, 1e9),
                                                 shapes=getattr(args, "shapes", None),
                                                 state_placement=getattr(args, "state_placement", None),
                                                 compute_dtype=getattr(args, "compute_dtype", None),
                                                 hang_floor=getattr(args, "hang_floor", 5.0))
            except ValueError as err:
                print(f"ortho-verify sharding: error: {err}")
                return 2
            print(f"== world size {n}, {dtype}")
            print_plain(report.summary(), terminal_width())
            ok &= report.passed
            reports.append({"world_size": n, "dtype": dtype, "status": report.status,
                            "verdict": report.verdict_text, "kinds": report.kinds, "crashes": report.crashes,
                            "compute": report.compute, "limits": report.limits,
                            "disagreements": report.disagreements, "patterns": report.patterns,
                            "results": [r.as_dict() for r in report.results]})
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "sharded_optimizer.json"
    path.write_text(json.dumps({"optimizer": args.optimizer, "reports": reports}, indent=2,
                               default=lambda x: None if isinstance(x, float) and math.isnan(x) else str(x)))
    print(f"{'all passed' if ok else 'FAILED'}; report: {path}")
    return 0 if ok else 1
