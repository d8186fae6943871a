"""How far a param group's dict travels through ``ortho_fast`` during one steady-state step.

Builds an optimizer over the 48 matrices of 12 GPT blocks (d = 4 by default: fused QKV (3d, d),
proj (d, d), MLP up (4d, d), MLP down (d, 4d); float32, one param group), runs three steps (state,
workspace and plans made), then traces a fourth with ``sys.settrace``. Of the traced line events
only those of frames that hold the group dict (an argument or local that *is* the group) in an
``ortho_fast`` source file are kept; a "stay" is a maximal run of them in one file, a "return" a
stay in a file an earlier stay was in. Prints the stays (file and line events), the files and the
returns: the fewer, the more of the group's handling is resolved into a plan before the step.

``--distributed`` steps the distributed optimizer instead: the parameters are DTensors ``Shard(0)``
on a 1-D DeviceMesh over every rank of the default process group (``distributed_mesh``; FSDP for
Muon / NorMuon / hybrid / Dion2, ``outer_shard_mesh`` for Dion); run as a script it makes a one-rank
gloo process group when none is initialized.

    python scripts/follow_group.py [--optimizer muon|normuon|hybrid|dion|dion2] [--d 4] [--layers 12] [--scheduler]
                                   [--distributed]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

import ortho_fast

PACKAGE = os.path.dirname(os.path.abspath(ortho_fast.__file__))


def build(name: str, params: list[torch.nn.Parameter], mesh=None):
    """The optimizer ``name`` over ``params`` (one param group); ``mesh``: the 1-D DeviceMesh the
    parameters are sharded on (None: one process)."""
    muon = {} if mesh is None else {"distributed_mesh": mesh}
    dion = {} if mesh is None else {"outer_shard_mesh": mesh}
    if name == "muon":
        return ortho_fast.Muon(params, lr=0.02, **muon)
    if name == "normuon":
        return ortho_fast.NorMuon(params, lr=0.02, **muon)
    if name == "hybrid":
        return ortho_fast.HybridOptimizer([{"params": params, "algorithm": "muon", "lr": 0.02}], **muon)
    if name == "dion":
        return ortho_fast.Dion(params, lr=0.02, **dion)
    if name == "dion2":
        return ortho_fast.Dion2(params, lr=0.02, **muon)
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


def measure(name: str, d: int = 4, layers: int = 12, scheduler: bool = False, distributed: bool = False) -> dict:
    """Stays, files and returns of one steady-state step of optimizer ``name`` (see the module docstring);
    ``scheduler``: a ``LambdaLR`` sets a new lr after every step (the traced step's lr is new);
    ``distributed``: the parameters and gradients are ``Shard(0)`` DTensors on a 1-D DeviceMesh over
    the default process group's ranks (which must be initialized), the same full tensors on every rank."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)] * layers
    full = [(torch.randn(s, generator=gen), torch.randn(s, generator=gen)) for s in shapes]
    mesh = None
    if distributed:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        if not dist.is_initialized():
            raise RuntimeError("distributed: initialize the default process group first (torch.distributed)")
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        full = [tuple(distribute_tensor(t, mesh, [Shard(0)]) for t in pair) for pair in full]
    params = [torch.nn.Parameter(w) for w, _ in full]
    for p, (_, g) in zip(params, full):
        p.grad = g
    opt = build(name, params, mesh)
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
    p.add_argument("--distributed", action="store_true",
                   help="the distributed step: Shard(0) DTensors on a 1-D mesh (a one-rank gloo group if none)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    made = False
    if args.distributed:
        import torch.distributed as dist

        if not dist.is_initialized():
            store = os.path.join(tempfile.mkdtemp(prefix="follow-group-"), "store")
            dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
            made = True
    try:
        out = measure(args.optimizer, args.d, args.layers, args.scheduler, args.distributed)
    finally:
        if made:
            dist.destroy_process_group()
    for path, count in out["stays"]:
        print(f"  {path}: {count} line events")
    mode = " (distributed)" if args.distributed else ""
    print(f"{args.optimizer}{mode}: {len(out['stays'])} stays, {len(out['files'])} files, {out['returns']} returns")


if __name__ == "__main__":
    main()
