"""Identify public Muon / Dion implementations with no declaration (``ortho_verify.identify_optimizer``)
and write the table of docs/compatibility.md, "Identified with no declaration: optimizers".

The systems' code is not in this repository: check each out yourself (any directory) and pass its
root; they are loaded as ``scripts/preset_compare.py`` loads them (Moonlight's two definitions only,
Emerging-Optimizers with its Python 3.12 line rewritten in a temporary copy and absl stubbed).

    python scripts/identify_optimizers.py --dion PATH --jordan PATH --emerging PATH --moonlight PATH \\
        --nanochat PATH [--time] [--write docs/compatibility.md]

Each row: the call identified, the declaration found (the fields that differ from ``MuonConventions()``),
the verdict (``Identification.passed``; the differences or the judge's cause when not), and with
``--time`` the seconds of identification plus judging. Without a path a system is left out (torch.optim.Muon
is the installed torch's).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":  # the systems torch.compile their steps: eager when run, not when a test imports this
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402

import preset_compare as pc  # noqa: E402  (the systems' loaders)
from ortho_verify.conventions import MuonConventions  # noqa: E402
from ortho_verify.identify.optimizer import identify_optimizer  # noqa: E402
from ortho_verify.report.results import verdict_text  # noqa: E402

START, END = "<!-- identify:optimizers:start -->", "<!-- identify:optimizers:end -->"

#: The hand-written declaration of each system (``ortho_verify.presets.JUDGE_PRESETS``), where there is one.
PRESETS = {"torch.optim.Muon": "torch", "microsoft/dion Muon": "microsoft-dion-muon",
           "microsoft/dion NorMuon": "microsoft-dion-normuon", "microsoft/dion Dion2": "microsoft-dion-dion2",
           "NVIDIA Emerging-Optimizers Muon": "megatron", "MoonshotAI/Moonlight Muon": "moonlight",
           "karpathy/nanochat MuonAdamW": "nanochat"}
#: Fields that name things rather than say what is computed (taken from the identification).
_NAMING = ("hyperparameter_names", "extra_kwargs", "momentum_state_key", "normuon_state_key")


def factories(args, tmp: str) -> dict:
    """{label: (call shown in the table, factory)}; each factory takes params and keyword hyperparameters."""
    out = {"torch.optim.Muon": ("identify_optimizer(torch.optim.Muon)", torch.optim.Muon)}
    if args.dion:
        dion = pc.fresh_import(args.dion, "dion")
        out["microsoft/dion Muon"] = ("identify_optimizer(dion.Muon)", dion.Muon)
        out["microsoft/dion NorMuon"] = ("identify_optimizer(dion.NorMuon)", dion.NorMuon)
        out["microsoft/dion Dion2"] = ("identify_optimizer(dion.Dion2)", dion.Dion2)
        out["microsoft/dion Dion"] = ("identify_optimizer(dion.Dion)", dion.Dion)
    if args.jordan:
        jordan = pc.fresh_import(args.jordan, "muon")
        out["KellerJordan/Muon SingleDeviceMuon"] = ("identify_optimizer(muon.SingleDeviceMuon)",
                                                     jordan.SingleDeviceMuon)
    if args.emerging:
        pc.stub_absl()
        pc.fresh_import(pc.emerging_copy(args.emerging, tmp), "emerging_optimizers")
        sys.path.insert(0, os.path.join(tmp, "emerging"))
        from emerging_optimizers.orthogonalized_optimizers.muon import Muon as EOMuon

        out["NVIDIA Emerging-Optimizers Muon"] = ("identify_optimizer(emerging_optimizers...muon.Muon)", EOMuon)
    if args.moonlight:
        import math

        moon = pc.load_defs(os.path.join(args.moonlight, "examples", "toy_train.py"),
                            {"zeropower_via_newtonschulz5", "Muon"}, {"torch": torch, "math": math})

        def moonlight(params, lr=1e-3, momentum=0.95, wd=0.1):  # its constructor takes muon_params=
            return moon.Muon(muon_params=list(params), lr=lr, momentum=momentum, wd=wd)

        out["MoonshotAI/Moonlight Muon"] = ("identify_optimizer(moonlight)  # Muon(muon_params=params, lr, "
                                            "momentum, wd)", moonlight)
    if args.nanochat:
        sys.path.insert(0, args.nanochat)
        import nanochat.optim as nco

        def nanochat(params, lr=0.02, momentum=0.95, weight_decay=0.28):  # gpt.py's Muon groups
            nco.COMPUTE_DTYPE = torch.bfloat16
            return nco.MuonAdamW([dict(kind="muon", params=[p], lr=lr, momentum=momentum, ns_steps=5, beta2=0.9,
                                       weight_decay=weight_decay) for p in params])  # a group per shape

        out["karpathy/nanochat MuonAdamW"] = ("identify_optimizer(nanochat)  # MuonAdamW([dict(kind='muon', "
                                              "params=[p], ...) for p in params])", nanochat)
    return out


def declaration_text(decl) -> str:
    if not isinstance(decl, MuonConventions):
        return repr(decl)
    default = MuonConventions()
    fields = [f"{f}={getattr(decl, f)!r}" for f in decl.__dataclass_fields__
              if getattr(decl, f) != getattr(default, f)]
    return "MuonConventions(" + ", ".join(fields).replace("torch.", "torch.") + ")"


def hand_written(label: str, factory, found) -> str:
    """The hand-written declaration against the one found: "equal", or the fields that differ and
    the verdict of ``check_optimizer`` under the hand-written one (its names and parameter dtypes taken
    from the identification)."""
    import dataclasses

    from ortho_verify.checks.optimizer_checks import check_optimizer
    from ortho_verify.presets import preset_conventions

    if label not in PRESETS:
        return "—"
    preset = preset_conventions(PRESETS[label])
    if type(preset) is not type(found.declaration) or not isinstance(preset, MuonConventions):
        same = type(preset) is type(found.declaration) and all(
            getattr(preset, f) == getattr(found.declaration, f) for f in preset.__dataclass_fields__
            if f not in _NAMING)
        return f"`{PRESETS[label]}`: " + ("equal" if same else "differs")
    preset = dataclasses.replace(preset, **{f: getattr(found.declaration, f) for f in _NAMING})
    diff = [f for f in preset.__dataclass_fields__ if f not in _NAMING and _resolved(preset, f) !=
            _resolved(found.declaration, f)]
    if not diff:
        return f"`{PRESETS[label]}`: equal"
    dtypes = next((e.value for e in found.evidence if e.field == "param_dtypes"), ())
    status = check_optimizer(factory, preset, **({} if "bfloat16" in dtypes else {"param_dtype": torch.float32})).status
    return (f"`{PRESETS[label]}`: differs in " + ", ".join(f"{f} ({getattr(preset, f)!r})" for f in diff) +
            f"; {status} under it")


def _resolved(conv, field: str):
    """A field's value, None eps / ns_steps / safety written out as the schedule's own."""
    import ortho_ref

    value = getattr(conv, field)
    if value is None and field in ("eps", "safety", "ns_steps") and isinstance(conv.coefficients, str):
        sched = ortho_ref.SCHEDULES[conv.coefficients]
        return {"eps": sched.eps, "safety": sched.safety, "ns_steps": len(ortho_ref.schedule(conv.coefficients))}[field]
    return value


def row(label: str, call: str, factory) -> tuple[str, float]:
    start = time.perf_counter()
    try:
        found = identify_optimizer(factory)
    except ValueError as err:
        return f"| {label} | `{call}` | — | not identified: {str(err)[:160]} | — |", time.perf_counter() - start
    seconds = time.perf_counter() - start
    if found.passed:
        verdict = "PASSED"
    elif found.differences:
        verdict = "FAILED: " + found.differences[0][:200].replace("|", "/")
    else:
        verdict = verdict_text(found.report.results) + ": " + (getattr(found.report, "cause", "") or "")[:200]
    return (f"| {label} | `{call}` | `{declaration_text(found.declaration)}` | {verdict} | "
            f"{hand_written(label, factory, found)} |"), seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("dion", "jordan", "emerging", "moonlight", "nanochat"):
        ap.add_argument(f"--{name}", help=f"path of a {name} checkout")
    ap.add_argument("--time", action="store_true", help="print the seconds of identification + judging per row")
    ap.add_argument("--write", help="the Markdown file whose identify:optimizers block is rewritten")
    args = ap.parse_args(argv)
    lines = ["| implementation | command | declaration found | verdict | hand-written (ortho_verify.presets) |",
             "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for label, (call, factory) in factories(args, tmp).items():
            text, seconds = row(label, call, factory)
            lines.append(text)
            print(text + (f"  ({seconds:.1f} s)" if args.time else ""), flush=True)
    threads = torch.get_num_threads()
    lines.append("")
    lines.append(f"Written by `scripts/identify_optimizers.py` (torch {torch.__version__}, {threads} threads, CPU).")
    if args.write:
        text = open(args.write).read()
        if START not in text or END not in text:
            raise SystemExit(f"--write: {args.write} has no {START} ... {END} block")
        head, rest = text.split(START, 1)
        _, tail = rest.split(END, 1)
        open(args.write, "w").write(head + START + "\n" + "\n".join(lines) + "\n" + END + tail)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
