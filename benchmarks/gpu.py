"""The GPU tables in one command: every ortho optimizer against torch.optim.Muon on GPT
blocks, the Newton–Schulz rate against the dense GEMM peak, Gram against standard Newton–Schulz,
and a CUDA-graph capture of the step.

Run on a CUDA machine from a plain checkout (no install, no network, torch >= 2.7, a few minutes)::

    PYTHONPATH=. python benchmarks/gpu.py
    PYTHONPATH=. python benchmarks/gpu.py --compare mypkg.factories:dion_muon   # any factory(params)

``--dry-run`` runs every section on the CPU at tiny sizes (the test suite does, so it cannot rot);
its numbers mean nothing. Only torch and the package are imported (plain markdown output).

Sections (every ratio from timings taken in this one process, one after the other):

1. GEMM peak: bf16 ``mm`` of 8192² (TFLOP/s), the floor's denominator.
2. Steps: per size (d × layers: 768 × 12, 1024 × 24, 2048 × 24; fp32 parameters, 4 matrices per
   block: fused QKV (3d, d), proj (d, d), MLP up (4d, d), MLP down (d, 4d)), per optimizer: ms per
   step (CUDA events around each step after warm-up steps, the median), ÷ torch.optim.Muon, and the
   peak extra memory of the first step (``torch.cuda.max_memory_allocated`` minus the memory
   allocated before it: the state it creates, the workspace and every temporary) and of a later
   step, in MB, ÷ torch's; the Muon rows also print the workspace the optimizer keeps between
   steps. The floor: the Newton–Schulz FLOPs of one step (5 steps × (4m²n + 2m³) per m ≤ n
   matrix) at the measured GEMM peak.
3. bf16 ``newton_schulz`` on 2048² / 4096² / (64, 1024, 4096) as a % of the GEMM peak.
4. Gram against standard Newton–Schulz at aspect ratios 4–16: float32 against float32, and float16
   Gram (``gram=True, dtype=torch.float16``) against the default bfloat16 standard steps; then a
   Dion2 step (d = 1024, 24 layers) with each (its selected submatrices have aspect ratios 4–16).
5. CUDA graph: Muon / NorMuon / Dion2 and a HybridOptimizer (a stacked Muon group, capturable
   AdamW, Lion) with ``check_finite=False`` (and ``capturable=True`` where an optimizer takes it)
   captured with ``torch.cuda.graph`` after warm-up at d = 256 × 6 layers with the workspace floor
   off (every chunk and round path runs: ``CAPTURE_SIZE``), the lr changed before every replay as a
   scheduler would, compared bit for bit with an eager twin given the same lr changes (and with
   one whose lr never changed: a graph that replays its captured lr matches that one).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a plain checkout: no install needed
import ortho_fast  # noqa: E402
from ortho_fast.functional.newton_schulz import newton_schulz  # noqa: E402

SIZES = [(768, 12), (1024, 24), (2048, 24)]
DRY_SIZES = [(16, 2)]


def gpt_shapes(d: int, layers: int) -> list[tuple[int, int]]:
    return [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)] * layers


def optimizers(extra: list[str]) -> dict:
    """name -> factory(params); ``extra`` adds "module:factory" entries."""
    table = {} if not hasattr(torch.optim, "Muon") else {  # torch.optim.Muon: torch >= 2.9
        "torch.optim.Muon": lambda ps: torch.optim.Muon(ps, lr=0.02)}
    table |= {
        "Muon": lambda ps: ortho_fast.Muon(ps, lr=0.02),
        "Muon check_finite=False": lambda ps: ortho_fast.Muon(ps, lr=0.02, check_finite=False),
        "Muon bitwise_torch": lambda ps: ortho_fast.Muon(ps, lr=0.02, bitwise_torch=True),
        "NorMuon": lambda ps: ortho_fast.NorMuon(ps, lr=0.02),
        "Dion2": lambda ps: ortho_fast.Dion2(ps, lr=0.02),
        "Dion": lambda ps: ortho_fast.Dion(ps, lr=0.02),
    }
    for spec in extra:
        module, _, attr = spec.partition(":")
        if not attr:
            raise SystemExit(f"--compare: expected package.module:factory, got {spec!r}")
        table[spec] = getattr(importlib.import_module(module), attr)
    return table


class Clock:
    """Seconds of one call: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def time(self, fn) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def median(self, fn, warmup: int, repeats: int) -> float:
        for _ in range(warmup):
            fn()
        return statistics.median(self.time(fn) for _ in range(repeats))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    print(f"\n### {title}\n")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for r in rows:
        print("| " + " | ".join(r) + " |")


def gemm_peak(device: torch.device, clock: Clock, n: int, args) -> float:
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    seconds = clock.median(lambda: torch.mm(a, b), args.warmup, args.repeats)
    return 2 * n**3 / seconds


def ns_flops(shapes) -> float:
    """Newton–Schulz multiply-adds ×2 of one Muon step (5 quintic steps on the small side)."""
    total = 0.0
    for m, n in shapes:
        k, d = min(m, n), max(m, n)
        total += 5 * (4 * k * k * d + 2 * k**3)
    return total


def peak_extra(device: torch.device, fn) -> float | None:
    """Peak bytes allocated during fn() above those allocated before it (CUDA only)."""
    if device.type != "cuda":
        return None
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    sync(device)
    return torch.cuda.max_memory_allocated(device) - before


def workspace_bytes(opt) -> int | None:
    """``Muon.workspace_nbytes`` (NorMuon too); None for other optimizers."""
    return getattr(opt, "workspace_nbytes", None)


def steps_section(device, clock, peak, args) -> None:
    sizes = DRY_SIZES if args.dry_run else SIZES
    for d, layers in sizes:
        shapes = gpt_shapes(d, layers)
        gen = torch.Generator(device="cpu").manual_seed(0)
        weights = [torch.randn(s, generator=gen).to(device) for s in shapes]
        grads = [torch.randn(s, generator=gen).to(device) * 1e-2 for s in shapes]
        floor_ms = ns_flops(shapes) / peak * 1e3
        rows, reference = [], None
        for name, factory in optimizers(args.compare).items():
            params = [torch.nn.Parameter(w.clone()) for w in weights]
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt = factory(params)
            first = peak_extra(device, opt.step)
            later = peak_extra(device, opt.step)
            ms = clock.median(opt.step, args.warmup, args.repeats) * 1e3
            if reference is None:
                reference = (ms, first, later)
            mb = lambda b: "n/a" if b is None else f"{b / 2**20:.1f}"  # noqa: E731
            ratio = lambda a, b: "n/a" if a is None or not b else f"{a / b:.2f}x"  # noqa: E731
            ws = workspace_bytes(opt)
            rows.append([name, f"{ms:.2f}", ratio(ms, reference[0]), mb(first), ratio(first, reference[1]),
                         mb(later), ratio(later, reference[2]), "-" if ws is None else mb(ws)])
            del opt, params
        table(f"Step, d = {d}, {layers} layers ({len(shapes)} matrices, fp32 parameters); Newton–Schulz floor "
              f"{floor_ms:.2f} ms at {peak / 1e12:.3g} TFLOP/s",
              ["optimizer", "ms / step", "÷ torch", "first step extra MB", "÷ torch", "later step extra MB", "÷ torch",
               "workspace MB"], rows)


def ns_rate_section(device, clock, peak, args) -> None:
    cases = [(32, 32, 1), (16, 64, 4)] if args.dry_run else [(2048, 2048, 1), (4096, 4096, 1), (1024, 4096, 64)]
    rows = []
    for m, n, batch in cases:
        x = torch.randn(batch, m, n, device=device) if batch > 1 else torch.randn(m, n, device=device)
        seconds = clock.median(lambda: newton_schulz(x, dtype=torch.bfloat16), args.warmup, args.repeats)
        flops = batch * ns_flops([(m, n)])
        rows.append([f"({batch}, {m}, {n})" if batch > 1 else f"({m}, {n})", f"{seconds * 1e3:.2f}",
                     f"{flops / seconds / 1e12:.1f}", f"{100 * flops / seconds / peak:.0f}%"])
    table("bf16 newton_schulz against the dense GEMM rate", ["input", "ms", "TFLOP/s", "% of GEMM peak"], rows)


#: Gram against standard Newton–Schulz: (label, standard kernel, Gram kernel) keyword sets of
#: ``newton_schulz``. float32 against float32 (the automatic Gram path), and the fast pair: float16
#: Gram (``gram=True, dtype=torch.float16``, restarts ``gram_restarts``) against the default bfloat16
#: standard steps — the pair the speed goal is about (Gram >= 1.5x faster from aspect ratio 4).
GRAM_PAIRS = (
    ("float32 vs float32", dict(dtype=torch.float32, gram=False), dict(dtype=torch.float32, gram=True)),
    ("float16 Gram vs bfloat16", dict(dtype=torch.bfloat16, gram=False), dict(dtype=torch.float16, gram=True)),
)


def gram_section(device, clock, args) -> None:
    cases = [(16, 64, 2), (16, 128, 1)] if args.dry_run else \
        [(1024, 4096, 1), (2048, 8192, 1), (512, 2048, 16), (512, 4096, 8), (256, 4096, 16)]
    rows = []
    for m, n, batch in cases:
        x = torch.randn(batch, m, n, device=device)
        for label, standard_kw, gram_kw in GRAM_PAIRS:
            plain = clock.median(lambda: newton_schulz(x, **standard_kw), args.warmup, args.repeats)
            gram = clock.median(lambda: newton_schulz(x, **gram_kw), args.warmup, args.repeats)
            rows.append([f"({batch}, {m}, {n})", f"{n / m:g}", label, f"{plain * 1e3:.2f}", f"{gram * 1e3:.2f}",
                         f"{plain / gram:.2f}x"])
    note = "" if device.type == "cuda" else " (CPU: float16 products have no fast CPU kernel; not representative)"
    table("Gram against standard Newton–Schulz from aspect ratio 4 (goal: float16 Gram >= 1.5x bfloat16)" + note,
          ["input", "aspect", "kernels", "standard ms", "Gram ms", "speed-up"], rows)
    dion2_gram_rows(device, clock, args, note)


#: Dion2 steps with each kernel on its selected submatrices (fraction 0.25 of GPT blocks: aspect ratios 4–16):
#: the default (bfloat16 standard steps) and the float16 Gram kernel (``gram=True, dtype=torch.float16``).
DION2_GRAM_KERNELS = (("default (bfloat16)", {}), ("float16 Gram", dict(dtype=torch.float16, gram=True)))


def dion2_gram_rows(device, clock, args, note: str) -> None:
    d, layers = DRY_SIZES[0] if args.dry_run else SIZES[1]
    shapes = gpt_shapes(d, layers)
    gen = torch.Generator(device="cpu").manual_seed(2)
    weights = [torch.randn(s, generator=gen).to(device) for s in shapes]
    grads = [torch.randn(s, generator=gen).to(device) * 1e-2 for s in shapes]
    rows, reference = [], None
    for label, kw in DION2_GRAM_KERNELS:
        params = [torch.nn.Parameter(w.clone()) for w in weights]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt = ortho_fast.Dion2(params, lr=0.02, **kw)
        ms = clock.median(opt.step, args.warmup, args.repeats) * 1e3
        reference = ms if reference is None else reference
        rows.append([label, f"{ms:.2f}", f"{reference / ms:.2f}x"])
        del opt, params
    table(f"Dion2 step with Gram Newton–Schulz, d = {d}, {layers} layers ({len(shapes)} matrices)" + note,
          ["kernel", "ms / step", "speed-up over the default"], rows)


#: The capture check's model: d × layers of GPT blocks, with the workspace floor off
#: (``stacked.MIN_WORKSPACE_BYTES = 0``) so that, at a size a capture takes seconds, every shape
#: group is cut into several chunks and the momentum, update and product rounds run, as above
#: d ≈ 600 (tests/test_gpu_capture_plan.py checks that on the CPU).
CAPTURE_SIZE = (256, 6)
#: Replays of the captured step, each after the lr is changed (as a scheduler would).
CAPTURE_REPLAYS = 4


def capture_lrs(replays: int = CAPTURE_REPLAYS) -> list[float]:
    """The lr of each step of the capture check: the warm-up / capture step's, then a new one per
    replay (a decay of 15% a step, every value distinct)."""
    return [0.02 * (1 - 0.15 * t) for t in range(replays + 1)]


def _capture_kw(cls, device, lr: float = 0.02) -> dict:
    """``check_finite=False``, and where the optimizer takes ``capturable`` (Muon, NorMuon, Dion2):
    ``capturable=True`` with ``lr`` a 0-dim tensor on ``device`` (lr, weight decay and momentum then
    live on the device; ``set_lr`` writes the tensor in place, so the replayed graph reads the new
    value); else ``lr`` a float."""
    import inspect

    if "capturable" in inspect.signature(cls).parameters:
        return {"check_finite": False, "capturable": True, "lr": torch.tensor(lr, device=device)}
    return {"check_finite": False, "lr": lr}


def capture_plan(device) -> tuple[list[torch.Tensor], int, dict]:
    """The capture check's parameters and optimizers: the ``CAPTURE_SIZE`` GPT matrices (drawn
    on the CPU, seed 1, then moved) followed by four vectors (LayerNorm-like weights, for the
    HybridOptimizer's AdamW and Lion groups), the number of matrices, and name -> builder(params)
    (Muon, NorMuon and Dion2 over the matrices; HybridOptimizer with the matrices in one stacked
    Muon group, capturable AdamW and Lion on the vectors)."""
    d, layers = CAPTURE_SIZE
    shapes = gpt_shapes(d, layers)
    gen = torch.Generator(device="cpu").manual_seed(1)
    weights = [torch.randn(s, generator=gen).to(device) for s in shapes]
    weights += [1 + 0.1 * torch.randn(d, generator=gen).to(device) for _ in range(4)]
    k = len(shapes)
    builders = {
        "Muon": lambda ps: ortho_fast.Muon(ps[:k], **_capture_kw(ortho_fast.Muon, device)),
        "NorMuon": lambda ps: ortho_fast.NorMuon(ps[:k], **_capture_kw(ortho_fast.NorMuon, device)),
        "Dion2": lambda ps: ortho_fast.Dion2(ps[:k], **_capture_kw(ortho_fast.Dion2, device)),
        # AdamW's bias corrections read host-side step counters unless its group is capturable; the
        # capturable groups' lr a device tensor (``set_lr`` fills it), Lion's a float
        "HybridOptimizer (stacked Muon + capturable AdamW + Lion)": lambda ps: ortho_fast.HybridOptimizer(
            [{"params": ps[:k], "algorithm": "muon", "capturable": True, "lr": torch.tensor(0.02, device=device)},
             {"params": ps[k:k + 2], "algorithm": "adamw", "capturable": True,
              "lr": torch.tensor(0.02, device=device)},
             {"params": ps[k + 2:], "algorithm": "lion", "lr": 0.02}], check_finite=False),
    }
    return weights, k, builders


def set_lr(opt, lr: float) -> None:
    """Every group's lr set to ``lr``: written into a tensor lr (what a captured graph reads),
    assigned where it is a float."""
    for group in opt.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def graph_section(device, args) -> None:
    if device.type != "cuda":
        table("CUDA graph capture of the step (check_finite=False)", ["optimizer", "result"],
              [["all", "n/a: no CUDA device (dry run)"]])
        return
    from ortho_fast.functional import stacked

    floor, stacked.MIN_WORKSPACE_BYTES = stacked.MIN_WORKSPACE_BYTES, 0
    try:
        rows = capture_rows(device)
    finally:
        stacked.MIN_WORKSPACE_BYTES = floor
    d, layers = CAPTURE_SIZE
    table(f"CUDA graph capture of the step (d = {d}, {layers} layers, workspace floor off, {CAPTURE_REPLAYS} "
          "replays, the lr changed before each)", ["optimizer", "replay against eager (same lr changes)"], rows)


def capture_rows(device) -> list[list[str]]:
    weights, _, builders = capture_plan(device)
    gen = torch.Generator(device="cpu").manual_seed(2)
    lrs = capture_lrs()
    grads = [[torch.randn(w.shape, generator=gen).to(device) for w in weights] for _ in lrs]
    rows = []
    for name, build in builders.items():
        try:
            eager_ps = [torch.nn.Parameter(w.clone()) for w in weights]
            frozen_ps = [torch.nn.Parameter(w.clone()) for w in weights]  # eager, lr never changed
            graph_ps = [torch.nn.Parameter(w.clone()) for w in weights]
            eager, frozen, captured = build(eager_ps), build(frozen_ps), build(graph_ps)
            static = [torch.zeros_like(w) for w in weights]
            for p, s in zip(graph_ps, static):
                p.grad = s
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up: state and workspace allocated outside the graph
                for s, g in zip(static, grads[0]):
                    s.copy_(g)
                captured.step()
            torch.cuda.current_stream().wait_stream(side)
            for twin, ps in ((eager, eager_ps), (frozen, frozen_ps)):
                for p, g in zip(ps, grads[0]):
                    p.grad = g.clone()
                twin.step()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured.step()
            for lr, step_grads in zip(lrs[1:], grads[1:]):
                set_lr(captured, lr)
                set_lr(eager, lr)
                for s, g in zip(static, step_grads):
                    s.copy_(g)
                graph.replay()
                for twin, ps in ((eager, eager_ps), (frozen, frozen_ps)):
                    for p, g in zip(ps, step_grads):
                        p.grad = g.clone()
                    twin.step()
            torch.cuda.synchronize()
            same = all(torch.equal(a, b) for a, b in zip(eager_ps, graph_ps))
            worst = max(float((a - b).norm() / b.norm()) for a, b in zip(eager_ps, graph_ps))
            stale = all(torch.equal(a, b) for a, b in zip(frozen_ps, graph_ps))
            rows.append([name, "bitwise equal to eager" if same else
                         f"differs: worst relative {worst:.1e}" + ("; replays the captured lr" if stale else "")])
        except Exception as err:  # report, do not stop the other sections
            rows.append([name, f"capture failed: {type(err).__name__}: {str(err).splitlines()[0][:160]}"])
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: checks the script runs")
    p.add_argument("--compare", action="append", default=[], metavar="package.module:factory",
                   help="also time factory(params) (repeatable)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--skip", action="append", default=[], choices=["steps", "ns", "gram", "graph"])
    args = p.parse_args(argv)
    if args.dry_run:
        device = torch.device("cpu")
        args.warmup, args.repeats = 1, 1
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        raise SystemExit("no CUDA device: run with --dry-run for the CPU smoke run")
    torch.manual_seed(0)
    clock = Clock(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (dry run: numbers mean nothing)"
    print(f"# ortho GPU benchmark: {name}, torch {torch.__version__}")
    size = 64 if args.dry_run else 8192
    peak = gemm_peak(device, clock, size, args)
    print(f"\nbf16 GEMM peak (mm of {size}²): {peak / 1e12:.3g} TFLOP/s")
    if "steps" not in args.skip:
        steps_section(device, clock, peak, args)
    if "ns" not in args.skip:
        ns_rate_section(device, clock, peak, args)
    if "gram" not in args.skip:
        gram_section(device, clock, args)
    if "graph" not in args.skip:
        graph_section(device, args)
    print("\nGoals: Muon ≤ 0.30x / 0.40x / 0.70x torch at the three sizes; peak extra memory of a "
          "Muon / NorMuon step ≤ 1.1x torch's; bf16 newton_schulz ≥ 85% of the GEMM peak from 2048-wide; Gram "
          "≥ 1.5x standard at aspect ratio 4; the captured step equal to eager.")


if __name__ == "__main__":
    main()
