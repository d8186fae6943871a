"""Newton–Schulz time over the time of one matrix product with the same FLOPs.

One quintic step on X (m, n), m <= n, costs A = XXᵀ (2m²n) + bA + cA² (2m³) + (bA + cA²)X
(2m²n) = 4m²n + 2m³ FLOPs; T steps cost T times that. The comparison GEMM is
(m, n) @ (n, k) with 2mnk equal to the whole iteration's FLOPs, k = T(2m + m²/n), in the
same dtype. A ratio of 1.0 means Newton–Schulz runs at the speed of one large GEMM (the
limit); above 1 is overhead (smaller products, the normalization, elementwise work).

Run: python benchmarks/ns_vs_gemm.py [--quick] [--min-run-time S] [--threads N]
"""

from __future__ import annotations

import torch

from _common import machine, median_seconds, parser, print_table, setup
from ortho_fast import newton_schulz

SHAPES = [(256, 1024), (512, 2048), (1024, 4096), (1024, 1024)]
DTYPES = [torch.float32, torch.bfloat16]
STEPS = 5


def ns_flops(m: int, n: int, steps: int) -> int:
    m, n = min(m, n), max(m, n)
    return steps * (4 * m * m * n + 2 * m**3)


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    setup(args)
    rows = []
    for m, n in SHAPES[:1] if args.quick else SHAPES:
        for dtype in DTYPES:
            g = torch.randn(m, n, dtype=dtype)
            k = round(ns_flops(m, n, STEPS) / (2 * m * n))
            w = torch.randn(n, k, dtype=dtype)
            t_ns = median_seconds(lambda: newton_schulz(g, "jordan", steps=STEPS, dtype=dtype), args.min_run_time)
            t_mm = median_seconds(lambda: g @ w, args.min_run_time)
            gflops = ns_flops(m, n, STEPS) / t_ns / 1e9
            rows.append([f"{m}×{n}", str(dtype).removeprefix("torch."), f"{t_ns * 1e3:.2f}",
                         f"{t_mm * 1e3:.2f}", f"{gflops:.1f}", f"{t_ns / t_mm:.2f}"])
    print_table(f"Newton–Schulz ({STEPS} steps, jordan) vs one GEMM of equal FLOPs",
                ["shape", "dtype", "NS ms", "GEMM ms", "NS GFLOP/s", "NS / GEMM"], rows)


if __name__ == "__main__":
    main()
