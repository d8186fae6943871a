"""Cost of identification: ``identify_orthogonalizer`` plus the judge under the declaration found, in wall
seconds, for a float32 and a bfloat16 Newton–Schulz kernel (the goal: at most 20 s each on 2 cores), and
``identify_optimizer`` for an optimizer when ``ortho_verify.identify.optimizer`` is installed (goal: 60 s).

    python benchmarks/identify.py [--threads 1] [--quick]

``--quick``: the float32 kernel only, identified without the judge (a smoke run). The seconds are printed,
not asserted: they depend on the machine and its load.
"""

from __future__ import annotations

import functools
import importlib
import time

import torch

import ortho_fast
from _common import parser, setup
from ortho_verify import identify_orthogonalizer


def cases(quick: bool):
    """(name, callable that identifies and returns the Identification)."""
    f32 = functools.partial(ortho_fast.newton_schulz, dtype=torch.float32)
    out = [("kernel float32 (jordan)", lambda: identify_orthogonalizer(f32, judge=not quick))]
    if quick:
        return out
    bf16 = functools.partial(ortho_fast.newton_schulz, coefficients="polar_express", safety=1.02, eps=1e-6)
    out.append(("kernel bfloat16 (polar_express)", lambda: identify_orthogonalizer(bf16)))
    try:
        optimizer = importlib.import_module("ortho_verify.identify.optimizer")
    except ModuleNotFoundError:
        return out
    out.append(("optimizer torch.optim.Muon", lambda: optimizer.identify_optimizer(torch.optim.Muon)))
    return out


def main() -> None:
    args = parser("Seconds of identification plus judging").parse_args()
    setup(args)
    print(f"{'subject':34s} {'seconds':>8s}  verdict")
    for name, run in cases(args.quick):
        start = time.perf_counter()
        found = run()
        seconds = time.perf_counter() - start
        print(f"{name:34s} {seconds:8.1f}  {'PASSED' if found.passed else 'FAILED'}")


if __name__ == "__main__":
    main()
