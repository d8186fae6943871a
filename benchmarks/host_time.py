"""Host time of a step, side by side with torch.optim.Muon: the 48 matrices of 12 GPT blocks at a
width d where the arithmetic is negligible (d = 4 by default: fused QKV (3d, d), proj (d, d), MLP up
(4d, d), MLP down (d, 4d); fp32 parameters), one thread, so what is timed is the Python and the
dispatch of a step, the floor of a launch-bound GPU step. Every optimizer steps the same gradients;
the median of ``torch.utils.benchmark``'s blocked autorange, taken for every optimizer back to back in
each of ``--rounds`` rounds (the order rotated), printed as the median ms and the median of the
within-round ratio to torch.optim.Muon (goals: docs/performance.md, (d)). ``--thread-time``: the
CPU time of this thread over ``--steps`` steps instead (``time.thread_time``: what another process
on the machine takes from the wall clock is left out; for A/B runs on a shared machine).

    python benchmarks/host_time.py [--d 4] [--layers 12] [--threads 1] [--rounds 5] [--thread-time]
"""

from __future__ import annotations

import statistics
import time

import torch

import ortho_fast
from _common import median_seconds, parser, print_table, setup


def variants() -> dict:
    """name -> factory(params): torch.optim.Muon, then ortho_fast's optimizers (and the flags that
    change the host work: ``check_finite``, ``capturable`` with a tensor lr, an lr scheduler)."""
    def scheduled(ps):
        opt = ortho_fast.Muon(ps, lr=0.02)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1 / (1 + t))

        class Stepper:  # opt.step then the scheduler's, as a training loop calls them
            def step(self):
                opt.step()
                sched.step()
        return Stepper()

    return {
        "torch.optim.Muon": lambda ps: torch.optim.Muon(ps, lr=0.02),
        "Muon": lambda ps: ortho_fast.Muon(ps, lr=0.02),
        "Muon check_finite=False": lambda ps: ortho_fast.Muon(ps, lr=0.02, check_finite=False),
        "Muon capturable (tensor lr)": lambda ps: ortho_fast.Muon(ps, lr=torch.tensor(0.02), capturable=True,
                                                                  check_finite=False),
        "Muon + LambdaLR": scheduled,
        "NorMuon": lambda ps: ortho_fast.NorMuon(ps, lr=0.02),
        "Dion2": lambda ps: ortho_fast.Dion2(ps, lr=0.02),
        "HybridOptimizer (one Muon group)": lambda ps: ortho_fast.HybridOptimizer(
            [{"params": ps, "algorithm": "muon", "lr": 0.02}]),
    }


def thread_seconds(fn, steps: int) -> float:
    """Seconds of this thread's CPU time per call of ``fn()``, over ``steps`` calls after one."""
    fn()
    start = time.thread_time()
    for _ in range(steps):
        fn()
    return (time.thread_time() - start) / steps


def main(argv=None) -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--d", type=int, default=4, help="model width (default 4)")
    p.add_argument("--layers", type=int, default=12, help="GPT blocks (default 12)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of every variant back to back (default 5)")
    p.add_argument("--thread-time", action="store_true", help="time by the thread's CPU time (time.thread_time)")
    p.add_argument("--steps", type=int, default=150, help="steps per timing with --thread-time (default 150)")
    p.set_defaults(threads=1)
    args = p.parse_args(argv)
    setup(args)
    d = args.d
    shapes = [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)] * (1 if args.quick else args.layers)
    steppers = {}
    for name, build in variants().items():
        gen = torch.Generator().manual_seed(0)
        ps = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
        for q in ps:
            q.grad = torch.randn(q.shape, generator=gen)
        opt = build(ps)
        for _ in range(3):  # state and workspace created, the plan built
            opt.step()
        steppers[name] = opt.step
    names = list(steppers)
    seconds = {name: [] for name in names}
    ratios = {name: [] for name in names}
    for r in range(1 if args.quick else args.rounds):  # each round times all, the order rotated
        order = names[r % len(names):] + names[:r % len(names)]
        timed = {name: thread_seconds(steppers[name], args.steps) if args.thread_time else
                 median_seconds(steppers[name], args.min_run_time / max(1, args.rounds)) for name in order}
        for name in names:
            seconds[name].append(timed[name])
            ratios[name].append(timed[name] / timed[names[0]])
    rows = [[name, f"{statistics.median(seconds[name]) * 1e3:.3f}", f"{statistics.median(ratios[name]):.2f}"]
            for name in names]
    clock = "thread CPU time" if args.thread_time else "wall clock"
    print_table(f"host time of a step: {len(shapes)} matrices, d = {d}, {clock} (ratios: median over rounds of "
                f"the ratio within a round)", ["optimizer", "ms", "÷ torch"], rows)


if __name__ == "__main__":
    main()
