"""Identify public Newton–Schulz kernels with no declaration given (``ortho_verify.identify_orthogonalizer``),
and write the table of docs/compatibility.md, "Identified with no declaration: kernels".

The kernels' code is not in this repository: check each system out yourself (any directory) and pass its
root; torch.optim.Muon's kernel is the installed torch's. Each kernel is called as its optimizer calls it
by default (the command column says how), on the CPU, with torch.compile disabled (eager).

    python scripts/identify_public.py --kernels keller=PATH dion=PATH emerging=PATH moonlight=PATH \\
        nanochat=PATH gram=PATH [--write-docs]

A PATH without its .git (an exported archive) may carry its commit: ``keller=PATH@857d1ad``.

Sources: KellerJordan/Muon ``muon.py`` ``zeropower_via_newtonschulz5``; torch ``torch/optim/_muon.py``
``_zeropower_via_newtonschulz``; microsoft/dion ``dion/polar_express.py`` ``polar_express`` (its Muon's default,
``use_polar_express=True``) and ``dion/muon.py`` ``zeropower_via_newtonschulz5`` (``use_polar_express=False``);
NVIDIA-NeMo/Emerging-Optimizers ``orthogonalized_optimizers/muon_utils.py`` ``newton_schulz`` (its Muon's
defaults: "quintic", 5 steps, ``fp32_matmul_prec="medium"``); MoonshotAI/Moonlight ``examples/toy_train.py``
``zeropower_via_newtonschulz5``; karpathy/nanochat ``nanochat/optim.py`` ``muon_step_fused`` (its Polar Express
statements only, built at run time from the checkout: the step also equilibrates rows, renormalizes and scales
by a second moment, which are no part of the kernel); Dao-AILab/gram-newton-schulz ``GramNewtonSchulz`` (its
defaults; its CuTeDSL kernels and torch.compile off). modded-nanogpt's ``polar_express`` runs Triton kernels
and is not run on the CPU.
"""

from __future__ import annotations

import argparse
import ast
import functools
import os
import re
import subprocess
import sys
import textwrap
import typing

if __name__ == "__main__":  # eager when run; a test that imports this file keeps its process's dynamo
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
typing.override = getattr(typing, "override", lambda f: f)  # Python 3.12's, used by Emerging-Optimizers

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import preset_compare as pc  # noqa: E402  (the systems' loaders: load_defs, stub_absl)
from ortho_fast.functional.newton_schulz import float32_matmul_precision  # noqa: E402
from ortho_verify import identify_orthogonalizer  # noqa: E402
from ortho_verify.identify.snippet import format_value  # noqa: E402

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "compatibility.md")
START, END = "<!-- identify:kernels:start -->", "<!-- identify:kernels:end -->"
SYSTEMS = ("torch", "keller", "dion", "emerging", "moonlight", "nanochat", "gram")


#: Commit labels given on the command line (PATH@COMMIT) for checkouts without their .git (an archive).
COMMITS: dict[str, str] = {}


def _commit(root: str | None) -> str:
    if root is None:
        return f"torch {torch.__version__}"
    if os.path.abspath(root) in COMMITS:
        return COMMITS[os.path.abspath(root)]
    try:
        out = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        return out
    except (OSError, subprocess.CalledProcessError):
        return os.path.basename(os.path.abspath(root))


def _import(root: str, name: str):
    sys.path.insert(0, root)
    try:
        return __import__(name, fromlist=["_"])
    finally:
        sys.path.remove(root)


def _nanochat_kernel(root: str):
    """nanochat's Polar Express as ``muon_step_fused`` runs it on a bfloat16 copy of the Nesterov mix: its two
    statements (normalize by 1.01‖X‖_F + 1e-6; the tall / wide loops over ``polar_express_coeffs[:ns_steps]``),
    taken from the checkout's source at run time, ``ns_steps`` = 5 (its default)."""
    path = os.path.join(root, "nanochat", "optim.py")
    tree = ast.parse(open(path).read())
    fused = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "muon_step_fused")
    loop = next(i for i, n in enumerate(fused.body) if "polar_express_coeffs" in ast.unparse(n))
    coeffs = next(n for n in tree.body
                  if isinstance(n, ast.Assign) and "polar_express_coeffs" in ast.unparse(n.targets))
    source = "\n".join([ast.unparse(coeffs), "def kernel(g, ns_steps=5):", "    X = g.bfloat16()",
                        textwrap.indent(ast.unparse(fused.body[loop - 1]), "    "),
                        textwrap.indent(ast.unparse(fused.body[loop]), "    "), "    return X"])
    env = {"torch": torch}
    exec(compile(source, path, "exec"), env)
    return env["kernel"]


def kernels(paths: dict) -> list[tuple[str, str, str, object]]:
    """(system, commit, command, kernel) for every system whose checkout is given (torch: always)."""
    out = []
    from torch.optim import _muon

    coefficients = tuple(getattr(_muon, n, d) for n, d in (("DEFAULT_A", 3.4445), ("DEFAULT_B", -4.7750),
                                                           ("DEFAULT_C", 2.0315)))
    eps = getattr(_muon, "EPS", 1e-7)
    out.append(("torch.optim.Muon", _commit(None),
                f"partial(torch.optim._muon._zeropower_via_newtonschulz, ns_coefficients={coefficients}, "
                f"ns_steps=5, eps={eps:g})",
                functools.partial(_muon._zeropower_via_newtonschulz, ns_coefficients=coefficients, ns_steps=5,
                                  eps=eps)))
    if "keller" in paths:
        muon = _import(paths["keller"], "muon")
        out.append(("KellerJordan/Muon", _commit(paths["keller"]), "partial(muon.zeropower_via_newtonschulz5, steps=5)",
                    functools.partial(muon.zeropower_via_newtonschulz5, steps=5)))
    if "dion" in paths:
        pe = _import(paths["dion"], "dion.polar_express")
        dm = _import(paths["dion"], "dion.muon")
        out.append(("microsoft/dion Muon", _commit(paths["dion"]), "dion.polar_express.polar_express",
                    pe.polar_express))
        out.append(("microsoft/dion Muon, use_polar_express=False", _commit(paths["dion"]),
                    "dion.muon.zeropower_via_newtonschulz5", dm.zeropower_via_newtonschulz5))
    if "emerging" in paths:
        pc.stub_absl()
        root = paths["emerging"]
        if sys.version_info < (3, 12):  # one Python 3.12 annotation line (registry.py): run from a rewritten copy
            import shutil
            import tempfile

            dst = os.path.join(tempfile.mkdtemp(), "emerging")
            shutil.copytree(root, dst, ignore=shutil.ignore_patterns(".git"))
            reg = os.path.join(dst, "emerging_optimizers", "registry.py")
            src = open(reg).read()
            open(reg, "w").write(re.sub(r"def (\w+)\[(\w+)[^\]]*\]\((.*?)\)\s*->[^:]*:", r"\2 = object\ndef \1(\3):",
                                        src))
            root = dst
        utils = _import(root, "emerging_optimizers.orthogonalized_optimizers.muon_utils")

        def emerging(x):
            with float32_matmul_precision("medium"):  # its Muon's default fp32_matmul_prec, set around the call
                return utils.newton_schulz(x, steps=5, coefficient_type="quintic")

        out.append(("NVIDIA Emerging-Optimizers Muon", _commit(paths["emerging"]),
                    "muon_utils.newton_schulz(x, steps=5, coefficient_type='quintic') under "
                    "set_float32_matmul_precision('medium')", emerging))
    if "moonlight" in paths:
        moon = pc.load_defs(os.path.join(paths["moonlight"], "examples", "toy_train.py"),
                            {"zeropower_via_newtonschulz5"}, {"torch": torch})
        out.append(("MoonshotAI/Moonlight", _commit(paths["moonlight"]),
                    "partial(toy_train.zeropower_via_newtonschulz5, steps=5)",
                    functools.partial(moon.zeropower_via_newtonschulz5, steps=5)))
    if "nanochat" in paths:
        out.append(("karpathy/nanochat", _commit(paths["nanochat"]),
                    "muon_step_fused's Polar Express statements, ns_steps=5", _nanochat_kernel(paths["nanochat"])))
    if "gram" in paths:
        gns = _import(paths["gram"], "gram_newton_schulz.gram_newton_schulz")
        out.append(("Dao-AILab/gram-newton-schulz", _commit(paths["gram"]),
                    "GramNewtonSchulz(ns_use_kernels=False, compile_kwargs=None)",
                    gns.GramNewtonSchulz(ns_use_kernels=False, compile_kwargs=None)))
    return out


def declaration_text(decl: dict) -> str:
    """The declaration as keyword arguments, a table shortened to its first row."""
    parts = []
    for k, v in decl.items():
        if k == "coefficients" and not isinstance(v, str):
            v = f"<{len(v)}-row table, first {tuple(round(x, 4) for x in v[0])}>"
            parts.append(f"{k}={v}")
        else:
            parts.append(f"{k}={format_value(v)}")
    return ", ".join(parts)


def table(rows) -> list[str]:
    lines = ["| system (commit) | kernel as called | declaration found | verdict | differences / judge's cause |",
             "|---|---|---|---|---|"]
    for system, commit, command, found in rows:
        why = "; ".join(found.differences) or (found.report.cause if found.report is not None else "")
        lines.append(f"| {system} ({commit}) | `{command}` | `{declaration_text(found.declaration)}` | "
                     f"{'PASSED' if found.passed else 'FAILED'} | {why.replace('|', '/')} |")
    return lines


def write_docs(lines: list[str], command: str) -> None:
    text = open(DOC).read()
    if START not in text or END not in text:
        raise SystemExit(f"{DOC}: the markers {START} / {END} are missing")
    body = [f"Generated by `{command}` (CPU, eager, torch {torch.__version__}).", "", *lines]
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    open(DOC, "w").write(head + START + "\n" + "\n".join(body) + "\n" + END + tail)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", nargs="*", default=[], metavar="SYSTEM=PATH[@COMMIT]",
                    help=f"checkouts, SYSTEM one of {', '.join(s for s in SYSTEMS if s != 'torch')}")
    ap.add_argument("--write-docs", action="store_true", help=f"write the table between the markers of {DOC}")
    args = ap.parse_args(argv)
    paths = {}
    for item in args.kernels:
        name, sep, path = item.partition("=")
        path, _, commit = path.partition("@")
        if not sep or name not in SYSTEMS or not os.path.isdir(path):
            ap.error(f"--kernels {item!r}: expected SYSTEM=PATH[@COMMIT] with SYSTEM in {SYSTEMS[1:]} and PATH a "
                     "folder")
        paths[name] = path
        if commit:
            COMMITS[os.path.abspath(path)] = commit
    torch.set_num_threads(1)
    rows = []
    for system, commit, command, kernel in kernels(paths):
        found = identify_orthogonalizer(kernel)
        print(f"== {system} ({commit}): {'PASSED' if found.passed else 'FAILED'}")
        print(found.summary())
        rows.append((system, commit, command, found))
    lines = table(rows)
    print("\n".join(lines))
    if args.write_docs:
        shown = " ".join(f"{k}=<{k} checkout>" for k in paths)  # the commits are in the table
        write_docs(lines, f"python scripts/identify_public.py --kernels {shown} --write-docs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
