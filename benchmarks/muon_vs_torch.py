"""ortho_fast.Muon.step over torch.optim.Muon.step on the matrices of a small GPT.

The parameter set is that of a GPT block stack (fused QKV, attention output, MLP up and
down projections) for d = 128 … 1024, so the step sees many shapes, each repeated once per
layer. Both optimizers run with torch.optim.Muon's defaults on identical parameters and
gradients. Columns (ratios to torch's step on the same parameters):

- ``ours / torch``: the default fast step (same-shape matrices stacked into one batched
  Newton–Schulz call, ``_foreach`` momentum and decay; within the Newton–Schulz tolerance of
  the oracle, not torch's bits), one device read per step (the finiteness check);
- ``bitwise / torch``: ``bitwise_torch=True`` (torch's bits: its 2-D calls matrix by matrix);
- ``no check / torch``: the default with ``check_finite=False`` (no device read);
- ``compiled / torch`` (``--compile``): the default step compiled with
  ``torch.compile(fullgraph=True)`` (inductor; ``check_finite=False``, which a full graph needs).

The timings are interleaved: a round times every variant and torch back to back (each timing
about ``--min-run-time`` seconds of calls, the order rotated between rounds) and takes each ratio
within the round; a repeat is the median over ``--rounds`` (default 7) rounds, the table the
median over ``--repeats`` (default 3) repeats, so a shared machine's changing load cancels as far
as it can. ``--thread-counts 1,2`` measures each thread count in turn in one process;
``--markdown`` prints a table ready for docs/performance.md.

Run: python benchmarks/muon_vs_torch.py [--quick] [--compile] [--markdown] [--repeats R] [--rounds K]
     [--thread-counts 1,2] [--sizes 128,256] [--min-run-time S] [--threads N]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from _common import parser, print_markdown, print_table, setup
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


def variants(shapes, compile_step: bool) -> dict:
    """name -> a step function; "torch" is the baseline."""
    steps = {
        "torch": torch.optim.Muon(make_params(shapes), lr=0.02).step,
        "ours": Muon(make_params(shapes), lr=0.02).step,
        "bitwise": Muon(make_params(shapes), lr=0.02, bitwise_torch=True).step,
        "no check": Muon(make_params(shapes), lr=0.02, check_finite=False).step,
    }
    if compile_step:
        torch._dynamo.reset()  # each size compiles a new optimizer's step: past 8 the recompile limit fails fullgraph
        step = torch.compile(Muon(make_params(shapes), lr=0.02, check_finite=False).step, fullgraph=True)
        step()
        step()  # the second call compiles again once the state exists
        steps["compiled"] = step
    return steps


def _calls_per_timing(fn, target: float) -> int:
    """How many calls of ``fn`` make one timing of about ``target`` seconds (after a warm-up)."""
    fn()
    start = time.perf_counter()
    fn()
    return max(1, round(target / max(time.perf_counter() - start, 1e-6)))


def measure(shapes, compile_step: bool, repeats: int, rounds: int, target: float) -> tuple[dict, float]:
    """(median ratio to torch per variant, median torch ms per step).

    Each repeat runs ``rounds`` rounds; a round times every variant once, back to back, in an
    order rotated from round to round, each timing ``k`` calls of about ``target`` seconds
    together; the round's ratios are taken within the round (adjacent timings, so a load that
    changes over seconds cancels). A repeat reports the median ratio of its rounds, the table the
    median of the repeats."""
    steps = variants(shapes, compile_step)
    names = list(steps)
    calls = {n: _calls_per_timing(steps[n], target) for n in names}
    per_repeat: dict[str, list[float]] = {n: [] for n in names if n != "torch"}
    torch_ms = []
    for _ in range(repeats):
        ratios: dict[str, list[float]] = {n: [] for n in per_repeat}
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]  # rotate: no variant always first
            times = {}
            for n in order:
                start = time.perf_counter()
                for _ in range(calls[n]):
                    steps[n]()
                times[n] = (time.perf_counter() - start) / calls[n]
            torch_ms.append(times["torch"] * 1e3)
            for n in ratios:
                ratios[n].append(times[n] / times["torch"])
        for n in per_repeat:
            per_repeat[n].append(statistics.median(ratios[n]))
    return {n: statistics.median(v) for n, v in per_repeat.items()}, statistics.median(torch_ms)


def main() -> None:
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("--compile", action="store_true", help="also time the torch.compile'd step (inductor)")
    cli.add_argument("--markdown", action="store_true", help="print a markdown table (for docs/performance.md)")
    cli.add_argument("--repeats", type=int, default=3, help="repeats; the median of their ratios is reported")
    cli.add_argument("--rounds", type=int, default=7, help="interleaved rounds per repeat (each times every variant)")
    cli.add_argument("--thread-counts", default=None,
                     help="comma-separated thread counts, e.g. 1,2 (default: --threads)")
    cli.add_argument("--sizes", default=None, help="comma-separated d_model values (default 128,256,512,768,1024)")
    args = cli.parse_args()
    setup(args)
    counts = [int(t) for t in args.thread_counts.split(",")] if args.thread_counts else [args.threads]
    configs = [(128, 4), (256, 4)] if args.quick else [(128, 4), (256, 4), (512, 4), (768, 2), (1024, 2)]
    if args.sizes:
        configs = [(d, 4 if d <= 512 else 2) for d in (int(x) for x in args.sizes.split(","))]
    repeats = 1 if args.quick else args.repeats
    columns = ["ours", "bitwise", "no check", *(["compiled"] if args.compile else [])]
    rows = []
    for threads in counts:
        torch.set_num_threads(threads)
        for d_model, n_layers in configs:
            shapes = gpt_matrices(d_model, n_layers)
            ratios, torch_ms = measure(shapes, args.compile, repeats, 1 if args.quick else args.rounds,
                                       args.min_run_time)
            rows.append([f"d={d_model}, L={n_layers}", str(len(shapes)), str(threads), f"{torch_ms:.1f}",
                         *(f"{ratios[c]:.2f}" for c in columns)])
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)  # progress: a long run on a loaded machine
    header = ["model", "matrices", "threads", "torch ms", *(f"{c} / torch" for c in columns)]
    if args.markdown:
        print_markdown(header, rows, f"median of {repeats} repeats of interleaved rounds")
    else:
        print_table(f"ortho_fast.Muon.step vs torch.optim.Muon.step (torch defaults, bf16 Newton–Schulz; median of "
                    f"{repeats} interleaved repeats)", header, rows)


if __name__ == "__main__":
    main()
