"""CPU proxies of the GPU step, side by side with torch.optim.Muon: compute (non-view) aten operations
per step counted as the kernel launches of the eager GPU step (a ``_foreach`` operation off torch's
CUDA fast path, such as one mixing dtypes, counts one per tensor: ``_op_count.cuda_launches``; the
plain operation count beside it), the peak extra memory of the first step (state and workspace
created then) and of a later one (the peak of the bytes the step's allocations keep alive: the
analogue of ``torch.cuda.max_memory_allocated`` minus the memory before the step,
benchmarks/gpu.py's column), bytes allocated per step (in-place and ``out=`` writes allocate
nothing), the workspace the optimizer keeps between steps, the launches with the copy of ``self``
inside ``addmm`` / ``baddbmm`` and the ``multi_tensor_apply`` split of a fast ``_foreach`` call
(``_op_count.full_launches``, H100 / H200 tables), the bytes every operation but the matrix products
reads and writes per parameter entry (``_op_count.op_bytes``; the cost model: docs/performance.md,
"Bytes and the cost model"), and the CPU time of a step, over the 48 matrices of 12 GPT blocks
(fused QKV (3d, d), proj (d, d), MLP up (4d, d), MLP down (d, 4d); fp32 parameters).

Counts are taken under a ``TorchDispatchMode`` (``_op_count.CountOps``); operations in the second
step. Below d ≈ 600 (12 blocks) each shape group is one chunk (the workspace floor,
``ortho_fast.functional.stacked.MIN_WORKSPACE_BYTES``) and the counts do not depend on d; above it
the workspace budget cuts the groups into chunks (``--no-floor`` shows that regime at a small d).
The test suite bounds both (tests/ortho_fast/test_op_counts.py); this script prints them.

    python benchmarks/proxies.py [--d 256] [--layers 12] [--no-time]

``--no-time`` skips the timing and the arithmetic of the matrix products (``CountOps``'s
``skip_products``: every count is the same), so that the counts of a d = 1024 model take minutes.
"""

from __future__ import annotations

import torch

import ortho_fast
from _common import median_seconds, parser, print_table, setup
from _op_count import CountOps
from gpu import optimizers
from ortho_fast.functional import stacked


def hybrid_gpt(params: list[torch.nn.Parameter]):
    """``ortho_fast.MuonConfig().build`` over a GPT holding ``params`` (per block: fused QKV, proj,
    MLP up, MLP down) and the parameters its AdamW groups step: token and position embeddings (256
    and 64 rows), two LayerNorms per block and a final one, the head (256 rows); their gradients
    drawn here (seed 0, scale 1e-2)."""
    d, gen = params[1].shape[0], torch.Generator().manual_seed(0)
    model = torch.nn.Module()
    model.wte, model.wpe, model.h = torch.nn.Embedding(256, d), torch.nn.Embedding(64, d), torch.nn.ModuleList()
    for i in range(0, len(params), 4):
        block = torch.nn.Module()
        block.ln_1, block.ln_2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        for name, p in zip(("qkv", "proj", "up", "down"), params[i:i + 4]):
            block.register_parameter(name, p)
        model.h.append(block)
    model.ln_f, model.lm_head = torch.nn.LayerNorm(d), torch.nn.Linear(d, 256, bias=False)
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.randn(p.shape, generator=gen) * 1e-2
    return ortho_fast.MuonConfig().build(model)


#: The optimizers benchmarks/gpu.py times, by the same factories (name -> factory(params)), and
#: HybridOptimizer over the same matrices with a GPT's other parameters (more tensors than the others).
OPTIMIZERS = optimizers([]) | {"HybridOptimizer (MuonConfig, + AdamW)": hybrid_gpt}


def measure(factory, d: int, layers: int, min_run_time: float, time: bool = True) -> dict:
    gen = torch.Generator().manual_seed(0)
    shapes = [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)] * layers
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * 1e-2
    opt = factory(params)
    with CountOps(skip_products=not time) as first:
        opt.step()
    with CountOps(skip_products=not time) as counter:
        opt.step()
    workspace = getattr(opt, "workspace_nbytes", getattr(getattr(opt, "_runner", None), "workspace_nbytes", None))
    entries = sum(p.numel() for p in params)
    return {"ops": counter.ops, "aten ops": counter.aten_ops, "first peak": first.peak, "later peak": counter.peak,
            "allocated": counter.allocated, "workspace": workspace, "launches": counter.launches,
            "bytes": counter.bytes / entries, "copies": counter.gemm_copies,
            "seconds": median_seconds(opt.step, min_run_time) if time else None}


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--d", type=int, default=128, help="model width (default 128)")
    p.add_argument("--layers", type=int, default=12, help="GPT blocks (default 12: 48 matrices)")
    p.add_argument("--no-floor", action="store_true",
                   help="workspace floor 0: the chunking of models above d ≈ 600 at this d")
    p.add_argument("--no-time", action="store_true", help="counts only: no timing, products not computed")
    p.add_argument("--only", nargs="*", default=None, help="the optimizers to run, by name (torch.optim.Muon always)")
    args = p.parse_args()
    setup(args)
    if args.quick:
        args.d = 16
    if args.no_floor:
        stacked.MIN_WORKSPACE_BYTES = 0
    rows, costs, ref = [], [], None
    for name, factory in OPTIMIZERS.items():
        if args.only is not None and name != "torch.optim.Muon" and name not in args.only:
            continue
        m = measure(factory, args.d, args.layers, args.min_run_time, time=not args.no_time)
        ref = ref or m
        def ratio(key):
            return f"{m[key] / ref[key]:.2f}" if ref[key] else "-"
        ms = "-" if m["seconds"] is None else f"{m['seconds'] * 1e3:.2f}"
        def mb(key):
            return f"{m[key] / 2**20:.2f}"
        costs.append([name, str(m["ops"]), str(m["launches"]), ratio("launches"), str(m["copies"]),
                      f"{m['bytes']:.1f}", ratio("bytes")])
        rows.append([name, str(m["ops"]), ratio("ops"), str(m["aten ops"]), mb("first peak"), ratio("first peak"),
                     mb("later peak"),
                     ratio("later peak"), mb("allocated"), ratio("allocated"),
                     "-" if m["workspace"] is None else mb("workspace"), ms, ratio("seconds") if m["seconds"] else "-"])
    print_table(f"One step over {4 * args.layers} GPT matrices, d = {args.d} (ours / torch: ÷ torch.optim.Muon; "
                "peak: extra bytes kept alive at once, the first step with its state and workspace)",
                ["optimizer", "launches", "ours / torch", "compute ops", "1st step peak MB", "ours / torch",
                 "later peak MB",
                 "ours / torch", "later allocated MB", "ours / torch", "workspace MB", "ms / step", "ours / torch"],
                rows)
    print_table(f"Launches and bytes of one step, d = {args.d}, {4 * args.layers} matrices (launches: one per "
                "operation, then with the copy of self inside addmm / baddbmm and the foreach splits; bytes read and "
                "written by every operation but the matrix products, per parameter entry)",
                ["optimizer", "launches", "with copies and splits", "ours / torch", "addmm / baddbmm copies",
                 "bytes / entry", "ours / torch"], costs)


if __name__ == "__main__":
    main()
