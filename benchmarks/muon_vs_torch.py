"""ortho_fast.Muon.step over torch.optim.Muon.step on the matrices of a small GPT.

The parameter set is that of a GPT block stack (fused QKV, attention output, MLP up and
down projections) for a few widths, so the step sees many shapes. Both optimizers run with
torch.optim.Muon's defaults (ours with ``eps_mode="clamp"``, the bit-identical setting) on
identical parameters and gradients, timed one right after the other. ``banks=True``
(same-shape matrices stacked into one batched Newton–Schulz call; not bit-identical to
torch, within the Newton–Schulz tolerance) is timed in the same run, and so are
``check_finite=False`` (no device read in the step) and, with ``--compile``, the step compiled
with ``torch.compile(fullgraph=True)`` (inductor; ``check_finite=False``, which a full graph needs).

Run: python benchmarks/muon_vs_torch.py [--quick] [--compile] [--min-run-time S] [--threads N]
"""

from __future__ import annotations

import torch

from _common import median_seconds, parser, print_table, setup
from ortho_fast import Muon


def gpt_matrices(d_model: int, n_layers: int) -> list[tuple[int, int]]:
    """(fan_out, fan_in) of every 2-D weight in the blocks of a GPT (no embeddings/head)."""
    per_block = [(3 * d_model, d_model), (d_model, d_model), (4 * d_model, d_model), (d_model, 4 * d_model)]
    return per_block * n_layers


def make_params(shapes) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    params = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.randn(shape, generator=gen) * 0.02)
        p.grad = torch.randn(shape, generator=gen)
        params.append(p)
    return params


def main() -> None:
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("--compile", action="store_true", help="also time the torch.compile'd step (inductor)")
    args = cli.parse_args()
    setup(args)
    configs = [(128, 4), (256, 4)] if args.quick else [(128, 4), (256, 4), (512, 4), (768, 2)]
    rows = []
    for d_model, n_layers in configs:
        shapes = gpt_matrices(d_model, n_layers)
        ours = Muon(make_params(shapes), lr=0.02, eps_mode="clamp")
        banked = Muon(make_params(shapes), lr=0.02, eps_mode="clamp", banks=True)
        theirs = torch.optim.Muon(make_params(shapes), lr=0.02)
        t_ours = median_seconds(ours.step, args.min_run_time)
        t_banks = median_seconds(banked.step, args.min_run_time)
        unchecked = Muon(make_params(shapes), lr=0.02, eps_mode="clamp", check_finite=False)
        t_unchecked = median_seconds(unchecked.step, args.min_run_time)
        t_torch = median_seconds(theirs.step, args.min_run_time)
        row = [f"d={d_model}, L={n_layers}", str(len(shapes)), f"{t_ours * 1e3:.1f}", f"{t_torch * 1e3:.1f}",
               f"{t_ours / t_torch:.2f}", f"{t_banks / t_torch:.2f}", f"{t_unchecked / t_torch:.2f}"]
        if args.compile:
            compiled = Muon(make_params(shapes), lr=0.02, eps_mode="clamp", check_finite=False)
            step = torch.compile(compiled.step, fullgraph=True)
            step()
            step()  # the second call compiles again once the state exists
            row.append(f"{median_seconds(step, args.min_run_time) / t_torch:.2f}")
        rows.append(row)
    print_table("ortho_fast.Muon.step vs torch.optim.Muon.step (torch defaults, bf16 Newton–Schulz)",
                ["model", "matrices", "ours ms", "torch ms", "ours / torch", "banks / torch",
                 "no check / torch", *(["compiled / torch"] if args.compile else [])], rows)


if __name__ == "__main__":
    main()
