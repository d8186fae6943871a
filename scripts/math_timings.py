"""The measured numbers of docs/math.md: the mpmath tier's cost and Muon's banks (bits and speed).

(a) ``ortho_ref.polar`` at ``digits`` on a random square matrix (standard normal entries, seed 0),
timed in a fresh process with mpmath's pure-Python backend (``MPMATH_NOGMPY=1``) and, when gmpy2
is installed (the ``fast`` extra), with gmpy2: 64 × 64 at 50 digits and 16 × 16 at 1000 digits.
(b) Banks: ``ortho_fast.newton_schulz`` on a (4, m, n) batch (``bmm``) against the same four
matrices one by one (2-D ``addmm``), for 7 shapes and three dtypes: in how many shapes the bits
differ and by how much at most.
(c) Banks: one ``ortho_fast.Muon`` step (bfloat16 Newton–Schulz, one torch thread) with
``banks=False`` and ``banks=True``, the median of ``--repeats`` steps after one warm-up step.

    python scripts/math_timings.py            # prints (a), (b) and (c); about a minute on one core
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

POLAR_CASES = ((64, 50), (16, 1000))
BIT_SHAPES = ((8, 8), (16, 16), (32, 16), (16, 32), (64, 64), (96, 32), (128, 128))
SPEED_CASES = ((24, 128, 128), (48, 64, 256), (6, 512, 512))


def _polar_seconds(n: int, digits: int, gmpy: bool) -> float:
    code = ("import time, numpy as np, ortho_ref; a = np.random.default_rng(0).standard_normal(({n}, {n})); "
            "t = time.perf_counter(); ortho_ref.polar(a, digits={d}); print(time.perf_counter() - t)")
    env = dict(os.environ)
    env.pop("MPMATH_NOGMPY", None)
    if not gmpy:
        env["MPMATH_NOGMPY"] = "1"
    out = subprocess.run([sys.executable, "-c", code.format(n=n, d=digits)], env=env, check=True,
                         capture_output=True, text=True)
    return float(out.stdout.split()[-1])


def polar_timings() -> None:
    """(a): seconds of ``ortho_ref.polar`` per backend."""
    try:
        import gmpy2  # noqa: F401
        backends = (False, True)
    except ImportError:
        backends = (False,)
    for n, digits in POLAR_CASES:
        for gmpy in backends:
            print(f"polar {n} x {n} at {digits} digits, {'gmpy2' if gmpy else 'pure Python'}: "
                  f"{_polar_seconds(n, digits, gmpy):.1f} s")


def bank_bits() -> None:
    """(b): batched against one-by-one Newton–Schulz, bit for bit."""
    import torch

    import ortho_fast

    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        differ, worst = 0, 0.0
        for m, n in BIT_SHAPES:
            g = torch.randn(4, m, n, generator=gen, dtype=torch.float64)
            batched = ortho_fast.newton_schulz(g, dtype=dtype, gram=False).double()
            single = torch.stack([ortho_fast.newton_schulz(x, dtype=dtype, gram=False) for x in g]).double()
            gap = (batched - single).abs().max().item()
            differ, worst = differ + (gap > 0), max(worst, gap)
        print(f"bmm vs addmm, {dtype}: bits differ in {differ} of {len(BIT_SHAPES)} shapes, by up to {worst:.2g}")


def bank_speed(repeats: int) -> None:
    """(c): milliseconds of one Muon step without and with banks."""
    import torch

    import ortho_fast

    torch.set_num_threads(1)
    for count, m, n in SPEED_CASES:
        ms = []
        for banks in (False, True):
            params = [torch.nn.Parameter(torch.randn(m, n)) for _ in range(count)]
            for p in params:
                p.grad = torch.randn(m, n)
            opt = ortho_fast.Muon(params, lr=0.02, banks=banks)
            opt.step()
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                opt.step()
                times.append(time.perf_counter() - t)
            ms.append(1e3 * statistics.median(times))
        print(f"Muon step, {count} x ({m}, {n}), bfloat16 NS, one thread: banks=False {ms[0]:.1f} ms, "
              f"banks=True {ms[1]:.1f} ms")


def main(argv=None) -> None:
    """Print (a), (b) and (c) of the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="timed Muon steps per case (median)")
    args = parser.parse_args(argv)
    polar_timings()
    bank_bits()
    bank_speed(args.repeats)


if __name__ == "__main__":
    main()
