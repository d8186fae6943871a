"""check_sharded_optimizer on the distributed Muons people run, each verdict next to the truth of a
separate run (docs/verification.md, the table between ``<!-- sharded-public:start -->`` and
``<!-- sharded-public:end -->``).

    python scripts/sharded_public.py --muon PATH --dion PATH --nanochat PATH [--world-size 4] [--write-docs]

The checkouts (KellerJordan/Muon, microsoft/dion, karpathy/nanochat) are read from the paths
given, never copied. Per case: the check's verdict (``check_sharded_optimizer``, gloo workers),
then the truth, measured without the check's machinery: the optimizer on the layout (DTensors by
``distribute_tensor``, plain tensors for DDP) and in one process, 3 steps on the same seeded
gradients, the full weights gathered and compared (relative Frobenius): with Newton–Schulz
forced to float32 (the optimizer's Newton–Schulz replaced by a float32 one of the same
coefficients; "correct" when within the float32 layout contract, 1e-5), in its shipped
bfloat16 (the relative difference of the 3-step update), and, on sharded layouts, one process
applied to each rank's shard as a matrix of its own (how far Newton–Schulz per local shard
would be). A run that raises is the truth "raises" with its error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import re
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "verification.md"
START, END = "<!-- sharded-public:start -->", "<!-- sharded-public:end -->"
STEPS = 3
CONTRACT = 1e-5  # ortho_verify.tolerances.sharded_tolerance("float32")


def _ns32(grad, coefficients=(3.4445, -4.7750, 2.0315), steps=5, eps=1e-7, clamp=False):
    """Keller Jordan's quintic Newton–Schulz in float32 (DTensor-friendly): the float32 truth."""
    x = grad.float()
    tall = x.shape[-2] > x.shape[-1]
    x = x.mT if tall else x
    norm = torch.linalg.vector_norm(x)
    x = x / (norm.clamp(min=eps) if clamp else norm + eps)
    a, b, c = coefficients
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.mT if tall else x).to(grad.dtype)


@contextlib.contextmanager
def float32_newton_schulz(case: str):
    """The case's Newton–Schulz replaced by ``_ns32`` (module globals looked up at call time)."""
    if case.startswith("torch"):
        import torch.optim._muon as mod

        old = mod._zeropower_via_newtonschulz
        mod._zeropower_via_newtonschulz = lambda g, coef, steps, eps: _ns32(g, coef, steps, eps, clamp=True)
        try:
            yield
        finally:
            mod._zeropower_via_newtonschulz = old
    elif case.startswith("keller"):
        import muon as mod

        old = mod.zeropower_via_newtonschulz5
        mod.zeropower_via_newtonschulz5 = lambda g, steps: _ns32(g, steps=steps)
        try:
            yield
        finally:
            mod.zeropower_via_newtonschulz5 = old
    else:
        yield None


# --- factories (check_sharded_optimizer's form: factory(params, layout)) ---

def torch_muon(params, layout):
    return torch.optim.Muon(params, lr=0.02, weight_decay=0.1)


def keller_muon(params, layout):
    import muon

    if layout is None:
        return muon.SingleDeviceMuon(params, lr=0.02, weight_decay=0.1)
    return muon.Muon(params, lr=0.02, weight_decay=0.1) if layout.placements is None else None


def dion_muon(params, layout):
    import dion

    if layout is None:
        return dion.Muon(params, lr=0.02, weight_decay=0.1)
    return dion.Muon(params, distributed_mesh=layout.replicate_mesh, lr=0.02, weight_decay=0.1) \
        if layout.placements is None else None


def nanochat_muon(params, layout):
    from nanochat.optim import MuonAdamW

    if layout is not None and layout.placements is not None:
        return None
    shapes = list(dict.fromkeys(tuple(p.shape) for p in params))
    groups = [dict(kind="muon", params=[p for p in params if tuple(p.shape) == s], lr=0.02, momentum=0.95,
                   ns_steps=5, beta2=0.95, weight_decay=0.1) for s in shapes]
    return MuonAdamW(groups)


#: (name, factory, layouts, shapes, world sizes it needs at least)
CASES = (
    ("torch.optim.Muon", torch_muon, ("FSDP Shard(0)", "TP colwise", "TP rowwise", "HSDP"), "16x8,16x8,8x16,12x12"),
    ("keller Muon, mixed shapes", keller_muon, ("DDP",), "16x8,12x12,8x16"),
    ("keller Muon, repeated shapes", keller_muon, ("DDP",), "16x8,16x8,16x8,16x8,16x8"),
    ("microsoft/dion Muon", dion_muon, ("DDP",), "16x8,16x8,8x16,12x12"),
    ("nanochat MuonAdamW (distributed Muon)", nanochat_muon, ("DDP",), "16x8,16x8,16x8"),
)


# --- the truth, without the check's machinery ---

def _seeded(shape, *key):
    import hashlib

    gen = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:7], "little"))
    return torch.randn(shape, generator=gen, dtype=torch.float64).float()


def _inputs(shapes):
    weights = [_seeded(s, "w", i) / s[1] ** 0.5 for i, s in enumerate(shapes)]
    grads = [[_seeded(s, "g", i, t) for i, s in enumerate(shapes)] for t in range(STEPS)]
    return weights, grads


def _one(factory, weights, grads):
    params = [torch.nn.Parameter(w.clone()) for w in weights]
    opt = factory(params, None)
    for g in grads:
        for p, gi in zip(params, g):
            p.grad = gi.clone()
        opt.step()
    return [p.detach().clone() for p in params]


def _layout_view(name, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard

    from ortho_verify.sharding.layouts import SHARDED_LAYOUTS
    from ortho_verify.sharding.mesh_layout import sharded_layout

    lay = next(x for x in SHARDED_LAYOUTS if x.name == name)
    shape = lay.mesh_shape(world)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=lay.dims)
    codes = {"R": Replicate(), "S0": Shard(0), "S1": Shard(1)}
    placements = None if lay.placements is None else [codes[c] for c in lay.placements]
    return mesh, placements, sharded_layout(lay, mesh)


def truth_rank(rank, world, case, layout_name, shapes, mode):
    """This rank's full weights after STEPS steps (or the per-shard reference's relative difference)."""
    from torch.distributed.tensor import distribute_tensor

    name, factory = case
    weights, grads = _inputs(shapes)
    mesh, placements, view = _layout_view(layout_name, world)

    def put(t):
        return t.clone() if placements is None else distribute_tensor(t.clone(), mesh, placements)

    with float32_newton_schulz(name) if mode == "float32" else contextlib.nullcontext():
        params = [torch.nn.Parameter(put(w)) for w in weights]
        opt = factory(params, view)
        for g in grads:
            for p, gi in zip(params, g):
                p.grad = put(gi)
            opt.step()
        full = [(p.full_tensor() if placements is not None else p).detach().clone() for p in params]
        local = None
        if placements is not None and mode == "bfloat16":  # one process on each shard as a matrix of its own
            starts = [distribute_tensor(w.clone(), mesh, placements).to_local() for w in weights]
            gl = [[distribute_tensor(gi.clone(), mesh, placements).to_local() for gi in g] for g in grads]
            keep = [i for i, s in enumerate(starts) if s.numel()]
            out = _one(factory, [starts[i] for i in keep], [[g[i] for i in keep] for g in gl])
            mine = [params[i].to_local().detach() for i in keep]
            local = [float((a - b).norm() / (b - starts[i]).norm()) for a, b, i in zip(mine, out, keep)]
    return {"full": full, "local": local}


def truth(case, layout_name, shapes, world):
    """{"float32": rel. weight difference, "bfloat16": rel. 3-step update difference, "local": the
    per-shard reference's, "raised": the error} of a case on a layout."""
    from ortho_verify.sharding.workers import WorkerError, run_workers

    name, factory = case
    weights, grads = _inputs(shapes)
    out = {}
    for mode in ("float32", "bfloat16"):
        with float32_newton_schulz(name) if mode == "float32" else contextlib.nullcontext():
            try:
                one = _one(factory, weights, grads)
            except Exception as err:  # noqa: BLE001 - reported as the truth
                out["raised"] = f"one process: {type(err).__name__}: {err}"
                return out
        try:
            runs = run_workers(world, truth_rank, case, layout_name, shapes, mode, timeout=60)
        except (WorkerError, TimeoutError) as err:
            out["raised"] = re.sub(r"\s+", " ", str(err).strip().splitlines()[-1])[:160]
            return out
        full = runs[0]["full"]
        if mode == "float32":
            out["float32"] = max(float((a - b).norm() / b.norm()) for a, b in zip(full, one))
        else:
            out["bfloat16"] = max(float(((a - w) - (b - w)).norm() / (b - w).norm())
                                  for a, b, w in zip(full, one, weights))
            local = [x for r in runs for x in (r["local"] or [])]
            out["local"] = max(local) if local else None
    return out


def truth_verdict(t: dict) -> str:
    if "raised" in t:
        return "unsupported on gloo" if "getFuture" in t["raised"] else "raises"
    return "correct" if t.get("float32", 1.0) <= CONTRACT or t.get("bfloat16") == 0.0 else "wrong"


def check_verdict(report, layout_name: str) -> tuple[str, str]:
    from ortho_verify.report.results import failure_kind

    rows = [r for r in report.results if r.input == layout_name or r.input.startswith(layout_name + " / ")]
    failed = [r for r in rows if not r.passed]
    ratio = max((r.ratio for r in rows if r.check == "sharded_vs_one_process"), default=float("nan"))
    if not failed:
        return "pass", f"{ratio:.2f}"
    kinds = sorted({r.cause or failure_kind(r) for r in failed})
    return "FAIL: " + ", ".join(kinds), f"{ratio:.2f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--muon", type=Path, required=True, help="a KellerJordan/Muon checkout")
    parser.add_argument("--dion", type=Path, required=True, help="a microsoft/dion checkout")
    parser.add_argument("--nanochat", type=Path, required=True, help="a karpathy/nanochat checkout")
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--only", action="append", help="cases whose name contains this (repeatable)")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/verification.md")
    parser.add_argument("--out", type=Path, default=Path("ortho-verify-out") / "sharded_public.json")
    args = parser.parse_args(argv)
    for p in (args.muon, args.dion, args.nanochat):
        if not p.is_dir():
            parser.error(f"{p}: not a directory")
        sys.path.insert(0, str(p))
    from ortho_verify import check_sharded_optimizer
    from ortho_verify.sharding.layouts import SHARDED_LAYOUTS

    fits = {lay.name for lay in SHARDED_LAYOUTS if lay.mesh_shape(args.world_size) is not None}
    rows, begun = [], time.perf_counter()
    for name, factory, layouts, shapes in CASES:
        if args.only and not any(o.lower() in name.lower() for o in args.only):
            continue
        layouts = [x for x in layouts if x in fits]
        if not layouts:
            continue
        started = time.perf_counter()
        report = check_sharded_optimizer(factory, world_size=args.world_size, layouts=layouts, shapes=shapes,
                                         dtype=torch.float32, steps=STEPS)
        parsed = [tuple(map(int, s.split("x"))) for s in shapes.split(",")]
        for lay in layouts:
            t = truth((name, factory), lay, parsed, args.world_size)
            verdict, ratio = check_verdict(report, lay)
            rows.append({"optimizer": name, "layout": lay, "shapes": shapes, "check": verdict, "worst_ratio": ratio,
                         "compute": report.compute.split(",")[0], "truth": truth_verdict(t), **t})
            print(rows[-1], flush=True)
        print(f"  {name}: {time.perf_counter() - started:.0f} s", flush=True)
    given = sys.argv[1:] if argv is None else argv  # checkout and output paths written as PATH: no machine path
    command = " ".join("PATH" if a.startswith("/") else a for a in given)
    meta = {"command": f"python scripts/sharded_public.py {command}",
            "world_size": args.world_size, "torch": torch.__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d", time.gmtime()), "elapsed_s": round(time.perf_counter() - begun)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    table = markdown(rows, meta)
    print(table)
    if args.write_docs:
        text = DOC.read_text()
        i, j = text.index(START) + len(START), text.index(END)
        DOC.write_text(text[:i] + "\n" + table + "\n" + text[j:])
    return 0 if all(_agrees(r) for r in rows) else 1


def _agrees(r: dict) -> bool:
    """The check's verdict is the truth's: pass where the truth is correct, a failure otherwise (a
    backend row where the truth is unsupported on gloo)."""
    if r["truth"] == "correct":
        return r["check"] == "pass"
    if r["truth"] == "unsupported on gloo":
        return "unsupported on this backend" in r["check"]
    return r["check"] != "pass"


def _num(x) -> str:
    return "—" if x is None else f"{x:.1e}"


def markdown(rows, meta) -> str:
    lines = [f"Written by `{meta['command']}` ({meta['date']}, torch {meta['torch']}, gloo, world size "
             f"{meta['world_size']}, {meta['elapsed_s']} s). Truth columns: a separate run, full weights after "
             f"{STEPS} steps against one process: with Newton–Schulz forced to float32 (relative weight difference; "
             "correct within 1e-5), in the shipped precision (relative difference of the 3-step update), and one "
             "process per local shard (what Newton–Schulz per shard would give).", "",
             "| optimizer | layout | shapes | check (compute) | worst ratio | truth: float32 | truth: shipped | per "
             "shard | truth | agree |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        truth = r["truth"] + (f" ({r['raised']})" if r.get("raised") else "")
        lines.append(f"| {r['optimizer']} | {r['layout']} | {r['shapes']} | {r['check']} ({r['compute']}) | "
                     f"{r['worst_ratio']} | {_num(r.get('float32'))} | {_num(r.get('bfloat16'))} | "
                     f"{_num(r.get('local'))} | {truth} | {'yes' if _agrees(r) else 'NO'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
