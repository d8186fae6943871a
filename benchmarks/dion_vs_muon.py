"""Dion step time over Muon step time for rank fractions 1, 1/4, 1/16 at 1024 × 4096.

One float32 parameter of shape (1024, 4096) with a fixed gradient. Muon runs 5 Newton–
Schulz steps (torch.optim.Muon's defaults, bf16 and float32 compute); Dion runs one power
iteration with each QR method ``ortho_fast.functional.qr.QR_METHODS`` provides. Each Dion timing
is divided by the Muon timings taken in the same run.

Run: python benchmarks/dion_vs_muon.py [--quick] [--min-run-time S] [--threads N]
"""

from __future__ import annotations

import torch

from _common import median_seconds, parser, print_table, setup
from ortho_fast import Dion, Muon
from ortho_fast.functional.qr import QR_METHODS

SHAPE = (1024, 4096)
RANK_FRACTIONS = (1.0, 1 / 4, 1 / 16)


def param(shape) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(shape, generator=gen) * 0.02)
    p.grad = torch.randn(shape, generator=gen)
    return p


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    setup(args)
    shape = (256, 1024) if args.quick else SHAPE
    t_muon = {dt: median_seconds(Muon([param(shape)], lr=0.02, dtype=dt).step, args.min_run_time)
              for dt in (torch.bfloat16, torch.float32)}
    rows = [[f"Muon ({str(dt).removeprefix('torch.')} NS)", "", f"{t * 1e3:.1f}", "", ""]
            for dt, t in t_muon.items()]
    for qr_method in QR_METHODS:
        for fraction in RANK_FRACTIONS:
            opt = Dion([param(shape)], lr=0.01, rank_fraction=fraction, qr_method=qr_method)
            t = median_seconds(opt.step, args.min_run_time)
            rows.append([f"Dion {qr_method}", f"1/{round(1 / fraction)}", f"{t * 1e3:.1f}",
                         f"{t / t_muon[torch.bfloat16]:.3f}", f"{t / t_muon[torch.float32]:.3f}"])
    print_table(f"Dion vs Muon step, one float32 parameter {shape[0]}×{shape[1]}",
                ["optimizer", "rank fraction", "ms / step", "÷ Muon bf16", "÷ Muon fp32"], rows)


if __name__ == "__main__":
    main()
