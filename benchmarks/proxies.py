"""CPU proxies of the GPU step (issue 23), side by side with torch.optim.Muon: compute (non-view)
aten operations per step (the kernel launches of the eager GPU step), bytes allocated per step
(outputs of the allocating operations; in-place and ``out=`` writes allocate nothing), the
workspace the optimizer keeps between steps, and the CPU time of a step, over the 48 matrices of
12 GPT blocks (fused QKV (3d, d), proj (d, d), MLP up (4d, d), MLP down (d, 4d); fp32 parameters).

Counts are taken in the second step (the state exists) under a ``TorchDispatchMode``; they depend
on the number and shapes of the matrices, not on d (except where a shape group exceeds one
workspace chunk, ``ortho_fast.functional.stacked.MAX_STACK_ELEMENTS``). The test suite bounds the
counts (tests/ortho_fast/test_op_counts.py); this script prints them.

    python benchmarks/proxies.py [--d 256] [--layers 12]
"""

from __future__ import annotations

import torch

from _common import median_seconds, parser, print_table, setup
from _op_count import CountOps
from gpu import optimizers


#: The optimizers benchmarks/gpu.py times, by the same factories (name -> factory(params)).
OPTIMIZERS = optimizers([])


def measure(factory, d: int, layers: int, min_run_time: float) -> tuple[int, int, int | None, float]:
    gen = torch.Generator().manual_seed(0)
    shapes = [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)] * layers
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * 1e-2
    opt = factory(params)
    with CountOps() as first:
        opt.step()
    with CountOps() as counter:
        opt.step()
    workspace = getattr(opt, "workspace_nbytes", None)  # Muon / NorMuon
    seconds = median_seconds(opt.step, min_run_time)
    return counter.ops, first.allocated, counter.allocated, workspace, seconds


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--d", type=int, default=128, help="model width (default 128)")
    p.add_argument("--layers", type=int, default=12, help="GPT blocks (default 12: 48 matrices)")
    args = p.parse_args()
    setup(args)
    if args.quick:
        args.d = 16
    rows, ref = [], None
    for name, factory in OPTIMIZERS.items():
        ops, first, allocated, workspace, seconds = measure(factory, args.d, args.layers, args.min_run_time)
        ref = ref or (ops, first, allocated, seconds)
        rows.append([name, str(ops), f"{ops / ref[0]:.2f}", f"{first / 2**20:.2f}", f"{first / ref[1]:.2f}",
                     f"{allocated / 2**20:.2f}", f"{allocated / ref[2]:.2f}",
                     "-" if workspace is None else f"{workspace / 2**20:.2f}", f"{seconds * 1e3:.2f}",
                     f"{seconds / ref[3]:.2f}"])
    print_table(f"One step over {4 * args.layers} GPT matrices, d = {args.d} (ours / torch: ÷ torch.optim.Muon; "
                "allocated: bytes returned by allocating ops, the first step with its state and workspace)",
                ["optimizer", "compute ops", "ours / torch", "1st step allocated MB", "ours / torch",
                 "later step allocated MB", "ours / torch", "workspace MB", "ms / step", "ours / torch"], rows)


if __name__ == "__main__":
    main()
