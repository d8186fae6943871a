"""How far a param group's dict travels through ``ortho_fast`` during one steady-state step.

Builds an optimizer over the 48 matrices of 12 GPT blocks (d = 4 by default: fused QKV (3d, d),
proj (d, d), MLP up (4d, d), MLP down (d, 4d); float32, one param group), runs three steps (state,
workspace and plans made), then traces a fourth with ``sys.settrace``. Of the traced line events
only those of frames that hold the group dict (an argument or local that *is* the group) in an
``ortho_fast`` source file are kept; a "stay" is a maximal run of them in one file, a "return" a
stay in a file an earlier stay was in. Prints the stays (file and line events), the files and the
returns: the fewer, the more of the group's handling is resolved into a plan before the step.

    python scripts/follow_group.py [--optimizer muon|normuon|hybrid|dion|dion2] [--d 4] [--layers 12] [--scheduler]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

import ortho_fast

PACKAGE = os.path.dirname(os.path.abspath(ortho_fast.__file__))


def build(name: str, params: list[torch.nn.Parameter]):
    """The optimizer ``name`` over ``params`` (one param group)."""
    if name == "muon":
        return ortho_fast.Muon(params, lr=0.02)
    if name == "normuon":
        return ortho_fast.NorMuon(params, lr=0.02)
    if name == "hybrid":
        return ortho_fast.HybridOptimizer([{"params": params, "algorithm": "muon", "lr": 0.02}])
    if name == "dion":
        return ortho_fast.Dion(params, lr=0.02)
    if name == "dion2":
        return ortho_fast.Dion2(params, lr=0.02)
    raise ValueError(f"--optimizer: expected muon, normuon, hybrid, dion or dion2, got {name!r}")


def follow(step, group: dict) -> list[tuple[str, int]]:
    """Run ``step()`` under ``sys.settrace``: the stays (file relative to the package, line events) of
    ``group`` in ``ortho_fast`` frames holding it."""
    stays: list[list] = []

    def holds(frame) -> bool:
        return any(v is group for v in frame.f_locals.values())

    def local(frame, event, arg):
        if event == "line" and holds(frame):
            path = os.path.relpath(frame.f_code.co_filename, PACKAGE)
            if stays and stays[-1][0] == path:
                stays[-1][1] += 1
            else:
                stays.append([path, 1])
        return local

    def call(frame, event, arg):
        filename = os.path.abspath(frame.f_code.co_filename)
        return local if filename.startswith(PACKAGE + os.sep) else None

    sys.settrace(call)
    try:
        step()
    finally:
        sys.settrace(None)
    return [(path, count) for path, count in stays]


def measure(name: str, d: int = 4, layers: int = 12, scheduler: bool = False) -> dict:
    """Stays, files and returns of one steady-state step of optimizer ``name`` (see the module docstring);
    ``scheduler``: a ``LambdaLR`` sets a new lr after every step (the traced step's lr is new)."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)] * layers
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    opt = build(name, params)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1 / (1 + t)) if scheduler else None
    for _ in range(3):
        opt.step()
        if sched is not None:
            sched.step()
    stays = follow(opt.step, opt.param_groups[0])
    seen: set[str] = set()
    returns = 0
    for path, _ in stays:
        returns += path in seen
        seen.add(path)
    return {"stays": stays, "files": sorted(seen), "returns": returns}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--optimizer", default="muon", choices=("muon", "normuon", "hybrid", "dion", "dion2"))
    p.add_argument("--d", type=int, default=4)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--scheduler", action="store_true", help="a LambdaLR changes lr at every step")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    out = measure(args.optimizer, args.d, args.layers, args.scheduler)
    for path, count in out["stays"]:
        print(f"  {path}: {count} line events")
    print(f"{args.optimizer}: {len(out['stays'])} stays, {len(out['files'])} files, {out['returns']} returns")


if __name__ == "__main__":
    main()
