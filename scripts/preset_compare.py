"""Measure each ``ortho_fast.optimizer_preset`` against its system's own code (docs/compatibility.md,
"Presets measured against their systems").

The systems' code is not in this repository: check each out yourself (any directory) and pass its
root. One process, float32 parameters on CPU, 3 steps, a tall (64, 32), a wide (32, 64) and a square
(48, 48) matrix, the same gradients on both sides; printed per preset and shape:
‖W_ours − W_system‖_F / ‖W_system‖_F (the weights) and / ‖W_system − W_0‖_F (the update).

    python scripts/preset_compare.py --dion PATH --nanochat PATH --moonlight PATH --emerging PATH [--fp32 | --fp64]

``--fp32``: both sides' Newton–Schulz in float32 (the systems' copies, made in a temporary
directory, have their bfloat16 casts replaced by float32; ours get ``dtype=torch.float32``), which
separates conventions from bfloat16 rounding. ``--fp64``: float64 parameters and gradients, both
sides computing in float64 (the copies' bfloat16 casts made float64; ours ``dtype=torch.float64``),
which separates conventions from float32 rounding (a system that computes some quantities in
float32 whatever its input, as nanochat's stage norms ``X.float()``, keeps that rounding). torch.optim.Muon is
the installed torch's (native
run only: the preset is bitwise). Emerging-Optimizers needs Python 3.12 syntax in one line of
``registry.py`` and ``absl``; on 3.11 the copy's type-parameter line is rewritten and absl's
logging replaced by no-ops (their runtime behaviour is unchanged). Sources: microsoft/dion
``dion/{muon,normuon,dion2}.py``; karpathy/nanochat ``nanochat/optim.py``; MoonshotAI/Moonlight
``examples/toy_train.py``; NVIDIA-NeMo/Emerging-Optimizers ``orthogonalized_optimizers/muon.py``.
"""

from __future__ import annotations

import argparse
import ast
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import types
import typing

if __name__ == "__main__":  # eager when run; a test that imports this file keeps its process's dynamo
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
typing.override = getattr(typing, "override", lambda f: f)

import torch  # noqa: E402

import ortho_fast  # noqa: E402

SHAPES = {"tall": (64, 32), "wide": (32, 64), "square": (48, 48)}
STEPS = 3


def problem(seed: int = 0, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    w0 = [torch.randn(s, generator=g).to(dtype) for s in SHAPES.values()]
    grads = [[torch.randn(s, generator=g).to(dtype) for s in SHAPES.values()] for _ in range(STEPS)]
    return w0, grads


def run(make, w0, grads):
    params = [torch.nn.Parameter(w.clone()) for w in w0]
    opt = make(params)
    for gs in grads:
        for p, gr in zip(params, gs):
            p.grad = gr.clone()
        opt.step()
    return [p.detach().clone() for p in params]


def compare(make_ours, make_theirs, dtype: torch.dtype = torch.float32):
    """{shape: (relative difference of the weights, of the update)}."""
    w0, grads = problem(dtype=dtype)
    ours, theirs = run(make_ours, w0, grads), run(make_theirs, w0, grads)
    return {k: (float((o - t).norm() / t.norm()), float((o - t).norm() / (t - w).norm()))
            for k, o, t, w in zip(SHAPES, ours, theirs, w0)}


def fp32_copy(root: str, tmp: str, wide: bool = False) -> str:
    """A copy of checkout ``root`` whose bfloat16 casts are float32 ones (float64 ones with ``wide``)."""
    dst = os.path.join(tmp, os.path.basename(os.path.abspath(root)))
    shutil.copytree(root, dst, ignore=shutil.ignore_patterns(".git"))
    for dirpath, _, files in os.walk(dst):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                src = open(path).read()
                new = src.replace(".bfloat16()", ".double()" if wide else ".float()").replace(
                    "torch.bfloat16", "torch.float64" if wide else "torch.float32")
                if new != src:
                    open(path, "w").write(new)
    return dst


def fresh_import(root: str, name: str):
    for k in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[k]
    sys.path.insert(0, root)
    try:
        return __import__(name)
    finally:
        sys.path.remove(root)


def load_defs(path: str, names: set, env: dict):
    """Only the named top-level definitions of a script (its other imports need not be installed)."""
    tree = ast.parse(open(path).read())
    mod = types.ModuleType(os.path.basename(path))
    mod.__dict__.update(env)
    body = [n for n in tree.body if getattr(n, "name", None) in names]
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), mod.__dict__)
    return mod


def stub_absl() -> None:
    absl, alog = types.ModuleType("absl"), types.ModuleType("absl.logging")
    for n in ("debug", "info", "warning", "error", "log_first_n", "log_every_n", "vlog", "fatal"):
        setattr(alog, n, lambda *a, **k: None)
    for n in ("DEBUG", "INFO", "WARNING", "ERROR", "FATAL"):
        setattr(alog, n, getattr(logging, n, 0))
    absl.logging = alog
    sys.modules.setdefault("absl", absl)
    sys.modules.setdefault("absl.logging", alog)


def emerging_copy(root: str, tmp: str) -> str:
    dst = os.path.join(tmp, "emerging")
    if not os.path.exists(dst):
        shutil.copytree(root, dst, ignore=shutil.ignore_patterns(".git"))
    if sys.version_info < (3, 12):
        path = os.path.join(dst, "emerging_optimizers", "registry.py")
        src = open(path).read()
        # def f[T: Bound](...) -> R:  ->  T = object; def f(...):  (annotations only)
        open(path, "w").write(re.sub(r"def (\w+)\[(\w+)[^\]]*\]\((.*?)\)\s*->[^:]*:", r"\2 = object\ndef \1(\3):", src))
    return dst


def systems(args, tmp: str) -> dict:
    """{preset: (factory of the system's optimizer, the preset's overrides)}."""
    fp32, wide = args.fp32 or args.fp64, args.fp64
    ours = {"dtype": torch.float64 if wide else torch.float32} if fp32 else {}
    out = {}
    if not fp32:
        out["torch"] = (lambda ps: torch.optim.Muon(ps), {})
    if args.dion:
        dion = fresh_import(fp32_copy(args.dion, tmp, wide) if fp32 else args.dion, "dion")
        out["microsoft-dion-muon"] = (lambda ps: dion.Muon(ps), ours)
        out["microsoft-dion-normuon"] = (lambda ps: dion.NorMuon(ps), ours)
        out["microsoft-dion-dion2"] = (lambda ps: dion.Dion2(ps), ours)
    if args.moonlight:
        root = fp32_copy(args.moonlight, tmp, wide) if fp32 else args.moonlight
        moon = load_defs(os.path.join(root, "examples", "toy_train.py"), {"zeropower_via_newtonschulz5", "Muon"},
                         {"torch": torch, "math": math})
        out["moonlight"] = (lambda ps: moon.Muon(muon_params=ps), ours)
    if args.emerging:
        stub_absl()
        fresh_import(emerging_copy(args.emerging, tmp), "emerging_optimizers")
        sys.path.insert(0, os.path.join(tmp, "emerging"))
        from emerging_optimizers.orthogonalized_optimizers.muon import Muon as EOMuon

        if wide:
            raise SystemExit("--fp64: Emerging-Optimizers' fp32_matmul_prec has no float64 setting; run it with --fp32")
        prec = "highest" if fp32 else "medium"
        out["megatron"] = (lambda ps: EOMuon(ps, fp32_matmul_prec=prec), {"dtype": prec})
    if args.nanochat:
        sys.path.insert(0, args.nanochat)
        import nanochat.optim as nco

        def nanochat(ps):
            # its CUDA default is bfloat16; any other value runs its step in the parameters' dtype
            nco.COMPUTE_DTYPE = (torch.float64 if wide else torch.float32) if fp32 else torch.bfloat16
            return nco.MuonAdamW([dict(kind="muon", params=[p], lr=0.02, momentum=0.95, ns_steps=5, beta2=0.9,
                                       weight_decay=0.28) for p in ps])  # gpt.py setup_optimizer's Muon groups

        out["nanochat"] = (nanochat, ours)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("dion", "nanochat", "moonlight", "emerging"):
        ap.add_argument(f"--{name}", help=f"path of a {name} checkout")
    precision = ap.add_mutually_exclusive_group()
    precision.add_argument("--fp32", action="store_true", help="both sides' Newton-Schulz in float32")
    precision.add_argument("--fp64", action="store_true", help="float64 parameters, both sides in float64")
    args = ap.parse_args(argv)
    dtype = torch.float64 if args.fp64 else torch.float32
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'preset':24s} " + "  ".join(f"{k:>19s}" for k in SHAPES) + "   (weights / update)")
        for name, (theirs, over) in systems(args, tmp).items():
            rows = compare(lambda ps: ortho_fast.optimizer_preset(name, ps, **over), theirs, dtype)
            print(f"{name:24s} " + "  ".join(f"{w:.2e} / {u:.2e}" for w, u in rows.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
