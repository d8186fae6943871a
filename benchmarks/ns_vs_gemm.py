"""Newton–Schulz time over the time of one matrix product with the same FLOPs.

One plain quintic step on X (m, n), m <= n, costs A = XXᵀ (2m²n) + bA + cA² (2m³) + (bA + cA²)X
(2m²n) = 4m²n + 2m³ FLOPs; T steps cost T times that. The comparison GEMM is
(m, n) @ (n, k) with 2mnk equal to the plain iteration's FLOPs, k = T(2m + m²/n), in the
same dtype. A ratio of 1.0 means Newton–Schulz runs at the speed of one large GEMM (the
limit of the plain iteration); above 1 is overhead (smaller products, the normalization,
elementwise work). Columns:

- ``plain / GEMM``: ``newton_schulz(..., gram=False)``, the plain steps;
- ``default / GEMM``: ``newton_schulz`` as called by default (``gram=None``): Gram Newton–Schulz
  (``gram_iterate``) for float32 / float64 when max(m, n) >= 2·min(m, n), the plain steps
  otherwise (bfloat16 always plain). Gram Newton–Schulz does fewer FLOPs than the plain
  iteration, so it can go below 1.0.

The timings of one row are interleaved (``--rounds`` rounds of plain, default and GEMM back to
back, each ``--min-run-time`` seconds of calls; the median ratio over the rounds is reported).

Run: python benchmarks/ns_vs_gemm.py [--quick] [--min-run-time S] [--threads N] [--thread-counts 1,2]
     [--rounds K] [--markdown]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from _common import parser, print_markdown, print_table, setup
from ortho_fast import newton_schulz

SHAPES = [(256, 1024), (512, 2048), (2048, 512), (1024, 4096), (1024, 1024)]
DTYPES = [torch.float32, torch.bfloat16]
STEPS = 5


def ns_flops(m: int, n: int, steps: int) -> int:
    m, n = min(m, n), max(m, n)
    return steps * (4 * m * m * n + 2 * m**3)


def seconds_per_call(fn, target: float) -> float:
    """Seconds per call of ``fn`` over about ``target`` seconds of calls (after one warm-up call)."""
    fn()
    start = time.perf_counter()
    fn()
    calls = max(1, round(target / max(time.perf_counter() - start, 1e-6)))
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main() -> None:
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("--thread-counts", default=None,
                     help="comma-separated thread counts, e.g. 1,2 (default: --threads)")
    cli.add_argument("--rounds", type=int, default=3, help="interleaved rounds per row (median ratio reported)")
    cli.add_argument("--markdown", action="store_true", help="print a markdown table (for docs/performance.md)")
    args = cli.parse_args()
    setup(args)
    counts = [int(t) for t in args.thread_counts.split(",")] if args.thread_counts else [args.threads]
    rows = []
    for threads in counts:
        torch.set_num_threads(threads)
        for m, n in SHAPES[:1] if args.quick else SHAPES:
            for dtype in DTYPES:
                g = torch.randn(m, n, dtype=dtype)
                k, d = min(m, n), max(m, n)
                a = torch.randn(k, d, dtype=dtype)
                w = torch.randn(d, round(ns_flops(m, n, STEPS) / (2 * k * d)), dtype=dtype)
                fns = {"plain": lambda: newton_schulz(g, "jordan", steps=STEPS, dtype=dtype, gram=False),
                       "default": lambda: newton_schulz(g, "jordan", steps=STEPS, dtype=dtype),
                       "gemm": lambda: a @ w}
                ratios: dict[str, list[float]] = {"plain": [], "default": []}
                plain_ms = []
                for r in range(args.rounds):
                    names = list(fns)[r % 3:] + list(fns)[:r % 3]
                    t = {name: seconds_per_call(fns[name], args.min_run_time) for name in names}
                    plain_ms.append(t["plain"] * 1e3)
                    for name in ratios:
                        ratios[name].append(t[name] / t["gemm"])
                rows.append([f"{m}×{n}", str(dtype).removeprefix("torch."), str(threads),
                             f"{statistics.median(plain_ms):.2f}",
                             *(f"{statistics.median(ratios[name]):.2f}" for name in ratios)])
                print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    header = ["shape", "dtype", "threads", "plain ms", "plain / GEMM", "default / GEMM"]
    if args.markdown:
        print_markdown(header, rows, f"median of {args.rounds} interleaved rounds")
    else:
        print_table(f"Newton–Schulz ({STEPS} steps, jordan) vs one GEMM of the plain iteration's FLOPs",
                    header, rows)


if __name__ == "__main__":
    main()
