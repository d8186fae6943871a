"""Measure what the README's commands cost and write every timing of the docs from the measurement.

Runs, each as a new process, as a new user would: ``ortho-verify`` with an empty gradient cache
(the first run trains the byte-level GPT), ``ortho-verify`` again (cache warm), ``ortho-verify
--quick`` with an empty cache and again warm, ``ortho-verify --quick --threads 2`` (warm), and the
test suite (``python -m pytest -q -p no:cacheprovider``; ``--skip-pytest`` leaves it out and keeps
the previous measurement). Wall seconds (``time.perf_counter``) and CPU seconds (user + system of
the child, ``resource.getrusage(RUSAGE_CHILDREN)``: less affected by other processes on a shared
machine) per command, the phases and seconds per check from each run's report.json.

    python scripts/timings.py                  # measure and print the JSON
    python scripts/timings.py --write-docs     # and rewrite the marked regions and verify/cli/timings.json
    python scripts/timings.py --only reproduce_quick --write-docs   # one command; the others kept

``--write-docs`` replaces the text between ``<!-- timings:NAME:start -->`` and
``<!-- timings:NAME:end -->`` in README.md and docs/*.md with ``render(timings)[NAME]``, and writes
``verify/cli/timings.json`` (the numbers ``ortho-verify --help`` quotes) and, from the test suite's
``--durations=0``, ``tests/file_seconds.json`` (the seconds of each test file, which orders them
for the test processes: tests/conftest.py). No timing in those files is typed
by hand: tests/test_timings_doc.py checks that the regions exist and that the writer round-trips.
Run time: about 2 minutes plus the test suite (5 minutes) on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Files whose marked regions ``--write-docs`` rewrites.
DOC_FILES = ("README.md", "docs/verification.md", "docs/tolerances.md")
#: The generated data file with the numbers of ``ortho-verify --help`` (read by ``ortho_verify.cli.measured``).
MEASURED_FILE = ROOT / "verify" / "cli" / "timings.json"
#: A run's temporary folders, which the data file writes as ``$TMP`` (no machine path ships).
TEMPORARY = re.compile(r"/\S*?/ortho-timings-[A-Za-z0-9_]+")
START, END = "<!-- timings:{}:start -->", "<!-- timings:{}:end -->"
REGION = re.compile(r"<!-- timings:([a-z0-9-]+):start -->(.*?)<!-- timings:([a-z0-9-]+):end -->", re.S)
#: (key, label, ortho-verify arguments, fresh gradient cache) in the order they run.
VERIFY_RUNS = (
    ("default_first", "`ortho-verify`, first run (trains the GPT)", [], True),
    ("default", "`ortho-verify` (gradients cached)", [], False),
    ("quick_first", "`ortho-verify --quick`, first run (trains the GPT)", ["--quick"], True),
    ("quick", "`ortho-verify --quick` (gradients cached)", ["--quick"], False),
    ("quick_threads2", "`ortho-verify --quick --threads 2` (gradients cached)", ["--quick", "--threads", "2"], False),
)
PYTEST_LABEL = "`pytest` (the test suite, default markers)"
#: (key, factory) of ``ortho-verify sharding --optimizer ortho_verify.sharding:<factory> --world-size 4``, timed.
SHARDING_RUNS = (("sharding_muon", "muon_factory"), ("sharding_dion", "dion_factory"))
#: (key, label, ``ortho-verify`` arguments) of the reproduction's commands, timed with a fresh run cache.
REPRODUCE_RUNS = (("reproduce_quick", "`ortho-verify reproduce --quick`", ["reproduce", "--quick"]),)


def timed(argv: list[str], env: dict | None = None, parse=None) -> dict:
    """Run ``argv`` in the repository root; its wall and CPU seconds (user + system) and exit code
    (``parse``: a function of the whole output, its value kept as "parsed")."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"argv": " ".join(argv[2:] if argv[1] == "-m" else argv), "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "rc": proc.returncode, "tail": proc.stdout[-2000:], "date": datetime.date.today().isoformat(),
            "cores": os.cpu_count(), **({"parsed": parse(proc.stdout)} if parse else {})}


def _where_of(run: dict, t: dict) -> str:
    """Where and when one command was timed: its own date (a command timed alone by ``--only``), else the run's."""
    return (f"{run.get('cores', t['cores'])} CPU cores, {run.get('date', t['date'])}, measured by "
            "`python scripts/timings.py --write-docs`")


#: The test of the committed docs against the committed measurement: the run is about to rewrite both.
CONSISTENCY_TEST = ("tests/test_timings_doc.py::"
                    "test_the_committed_docs_are_the_writer_s_output_of_the_committed_measurement")


#: Where ``--write-docs`` writes the seconds of each test file (``file_seconds``): tests/conftest.py
#: starts the heaviest files first, so that the two test processes finish together.
FILE_SECONDS = ROOT / "tests" / "file_seconds.json"
_DURATION = re.compile(r"^([\d.]+)s (?:call|setup|teardown)\s+([^\s:]+)", re.M)


def file_seconds(output: str) -> dict[str, float]:
    """Seconds per test file from ``pytest --durations=0`` output (setup, call and teardown summed;
    the lines of 5 ms or more, which pytest prints), heaviest first."""
    seconds: dict[str, float] = {}
    for value, path in _DURATION.findall(output):
        seconds[path] = seconds.get(path, 0.0) + float(value)
    return {k: round(v, 1) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])}


def measure_pytest() -> dict:
    """The test suite as CI runs it (default markers and hypothesis profile), timed, with the seconds
    of each test file (``--durations=0``, kept as "file_seconds")."""
    run = timed([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0", "--deselect",
                 CONSISTENCY_TEST], parse=file_seconds)
    counts = re.findall(r"^=*\s*(\d+ passed.*?) in [\d.]+s", run["tail"], re.M)
    run["file_seconds"] = run.pop("parsed")
    run.update(label=PYTEST_LABEL, tests=counts[-1] if counts else "",
               load_at_start=[round(x, 2) for x in os.getloadavg()],
               date=datetime.date.today().isoformat())
    return {k: v for k, v in run.items() if k != "tail" or run["rc"]}


def measure_reproduce(work: Path) -> dict:
    """Every command of ``REPRODUCE_RUNS``, timed in ``work`` with a fresh run cache (``ORTHO_CACHE_DIR``):
    key -> its ``timed`` entry with ``label``."""
    out = {}
    for key, label, args in REPRODUCE_RUNS:
        env = dict(os.environ, ORTHO_CACHE_DIR=str(work / f"cache-{key}"))
        load = [round(x, 2) for x in os.getloadavg()]
        run = timed([sys.executable, "-m", "ortho_verify", *args, "--out", str(work / key)], env=env)
        run.update(label=label, date=datetime.date.today().isoformat(), cores=os.cpu_count(), load_at_start=load)
        out[key] = {k: v for k, v in run.items() if k != "tail" or run["rc"]}
    return out


def measure_only(keys: list[str], previous: dict) -> dict:
    """The commands ``keys`` (of ``REPRODUCE_RUNS`` and ``SHARDING_RUNS``) timed now, every other
    measurement kept from ``previous``. Raises: ValueError naming a key that cannot be measured alone."""
    alone = {k for k, *_ in REPRODUCE_RUNS} | {k for k, _ in SHARDING_RUNS}
    unknown = [k for k in keys if k not in alone]
    if unknown:
        raise ValueError(f"--only: {unknown} cannot be measured alone; expected some of {sorted(alone)}")
    work = Path(tempfile.mkdtemp(prefix="ortho-timings-"))
    fresh = {}
    if any(k in keys for k, *_ in REPRODUCE_RUNS):
        fresh.update(measure_reproduce(work))
    fresh.update(measure_sharding(work, [k for k in keys if k in dict(SHARDING_RUNS)]))
    fresh = {k: v for k, v in fresh.items() if k in keys}
    return {**previous, "commands": {**previous.get("commands", {}), **fresh}}


def measure_sharding(work: Path, keys=None) -> dict:
    """``ortho-verify sharding`` of each factory of ``SHARDING_RUNS`` (those in ``keys``; None: all), timed."""
    out = {}
    for key, factory in SHARDING_RUNS:
        if keys is not None and key not in keys:
            continue
        run = timed([sys.executable, "-m", "ortho_verify", "sharding", "--optimizer",
                     f"ortho_verify.sharding:{factory}",
                     "--world-size", "4", "--out", str(work / key)])
        out[key] = {k: v for k, v in run.items() if k != "tail" or run["rc"]}
    return out


def measure(skip_pytest: bool = False, previous: dict | None = None) -> dict:
    """Every command of ``VERIFY_RUNS``, ``SHARDING_RUNS``, ``REPRODUCE_RUNS`` and the test suite, timed
    (see the module docstring); ``skip_pytest`` keeps the test suite's entry of ``previous`` (if any)."""
    out: dict = {"date": datetime.date.today().isoformat(), "cores": os.cpu_count(),
                 "load_at_start": [round(x, 2) for x in os.getloadavg()], "python": platform.python_version(),
                 "commands": {}}
    work = Path(tempfile.mkdtemp(prefix="ortho-timings-"))
    cache = None
    for key, label, args, fresh in VERIFY_RUNS:
        if fresh:
            cache = work / f"cache-{key}"
        folder = work / key
        run = timed([sys.executable, "-m", "ortho_verify", *args, "--cache-dir", str(cache), "--out", str(folder)])
        run["label"] = label
        report = json.loads((folder / "report.json").read_text()) if (folder / "report.json").exists() else {}
        meta = report.get("meta", {})
        run["phases_s"] = meta.get("phases_s", {})
        run["train_s"] = round((meta.get("training") or {}).get("train_seconds", 0.0), 1) if fresh else 0.0
        run["rows"] = report.get("summary", {}).get("total", 0)
        if key == "default":
            by_check = report.get("summary", {}).get("by_check", {})
            out["checks_s"] = {name: entry.get("seconds") for name, entry in by_check.items()}
            out["checks"] = {name: {k: entry.get(k) for k in ("total", "no_claim", "worst_ratio", "exact")}
                             for name, entry in by_check.items()}
            out["inputs"] = {"total": meta.get("inputs", 0), "real": meta.get("real_inputs", 0),
                             "seed": meta.get("seed")}
        out["commands"][key] = {k: v for k, v in run.items() if k != "tail"}
        if run["rc"] != 0:
            out["commands"][key]["tail"] = run["tail"]
    out["commands"].update(measure_sharding(work))
    out["commands"].update(measure_reproduce(work))
    if skip_pytest and previous and "pytest" in previous.get("commands", {}):
        out["commands"]["pytest"] = previous["commands"]["pytest"]
    elif not skip_pytest:
        out["commands"]["pytest"] = measure_pytest()
    return out


#: What a check's row of the default run's table says beyond its name (docs/tolerances.md, "Measured").
CHECK_NOTES = {
    "golden": "float64 oracle vs 50-digit golden files",
    "ns_vs_ns_map": "float64, float32 Frobenius; bfloat16 sorted singular values",
    "ns_projected_singular_values": "bfloat16",
    "muon_vs_reference": "torch, microsoft/dion, Moonlight, Megatron, nanochat option sets",
    "muon_layout_vs_reference": "QKV split, banks",
    "dion_variant_vs_reference": "QR methods, Orth-Dion, power_iters 2, bf16 params / fp32 state",
}


def checks_table(t: dict) -> str:
    """The default run's rows per check (from ``measure()``'s "checks" and "inputs"): the counts
    and the worst error/tolerance over the rows that claim ("exact" checks: 0, bitwise)."""
    checks, inputs = t.get("checks", {}), t.get("inputs", {})
    if not checks:
        return "\n(not measured)\n"
    total = sum(c["total"] or 0 for c in checks.values())
    no_claim = sum(c["no_claim"] or 0 for c in checks.values())
    rows = ["| check | checks | no claim | worst error/tolerance |", "|---|---|---|---|"]
    for name, c in checks.items():
        label = f"{name} ({CHECK_NOTES[name]})" if name in CHECK_NOTES else name
        worst = ("0 (bitwise)" if c.get("exact") else "—" if c.get("worst_ratio") is None
                 else f"{c['worst_ratio']:.3f}")
        rows.append(f"| {label} | {c['total']} | {c['no_claim']} | {worst} |")
    head = (f"`ortho-verify` (default run, seed {inputs.get('seed', 0)}, {inputs.get('total', '?')} inputs, "
            f"{inputs.get('real', '?')} of them real gradients of the GPT on the pinned corpus): {total} checks, "
            f"{no_claim} of them without a claim; {t['cores']} CPU cores, {t['date']}, measured by "
            "`python scripts/timings.py --write-docs`. Worst error/tolerance over the rows that claim:")
    return "\n".join(["", head, "", *rows, ""])


def _seconds(x: float) -> str:
    return f"{x:.0f} s" if x >= 10 else f"{x:.1f} s"


def render(t: dict) -> dict[str, str]:
    """The text of every marked region, from a ``measure()`` dict: region name -> markdown."""
    c = t["commands"]
    where = f"{t['cores']} CPU cores, {t['date']}, measured by `python scripts/timings.py --write-docs`"
    rows = ["| command | wall | CPU (user + system) |", "|---|---|---|"]
    for key, label, _, _ in VERIFY_RUNS:
        if key in c:
            rows.append(f"| {label} | {_seconds(c[key]['wall_s'])} | {_seconds(c[key]['cpu_s'])} |")
    if "pytest" in c:
        rows.append(f"| {PYTEST_LABEL}: {c['pytest'].get('tests', '')} | {_seconds(c['pytest']['wall_s'])} | "
                    f"{_seconds(c['pytest']['cpu_s'])} |")
    phases = ", ".join(f"{k} {_seconds(v)}" for k, v in c["default_first"]["phases_s"].items())
    load = c.get("pytest", {}).get("load_at_start")
    pytest_load = f", {load[0]:g} at the start of pytest" if load else ""
    when = c.get("pytest", {}).get("date")
    if when and when != t["date"]:  # the suite measured alone (--pytest-only), on its own date
        pytest_load += f" (the test suite measured {when})"
    table = "\n".join(["", *rows, "",
                       f"{where}; load average {t['load_at_start'][0]:g} at the start{pytest_load} (a machine shared "
                       f"with other work inflates wall time more than CPU time). Phases of the first run: {phases}; "
                       "the seconds of every check are in report.md and report.json (`summary.by_check.*.seconds`).",
                       ""])
    stages = sum(v or 0.0 for k, v in t.get("checks_s", {}).items() if k.startswith("muon_stages"))
    return {
        "capture": f"{_seconds(c['default_first']['train_s'])} the first time ({where})",
        "commands": table,
        "quick": f"{_seconds(c['quick']['wall_s'])} with the gradients cached, {_seconds(c['quick_first']['wall_s'])} "
                 f"the first time ({where})",
        "default-cached": f"{_seconds(c['default']['wall_s'])} with the model cached ({where})",
        "statistical-rows": f"{_seconds(t.get('checks_s', {}).get('ns_mean_deviation') or 0.0)} of the default run "
                            f"({where})",
        "stage-rows": f"{_seconds(stages)} of the default run ({where})",
        "default-checks": checks_table(t),
        "reproduce-quick": _reproduce_text(c.get("reproduce_quick"), t),
        "sharding": (f"{_seconds(c['sharding_muon']['wall_s'])} for ortho_fast's Muon and "
                     f"{_seconds(c['sharding_dion']['wall_s'])} for its Dion ({_where_of(c['sharding_muon'], t)}: "
                     "`ortho-verify sharding "
                     "--optimizer ortho_verify.sharding:muon_factory --world-size 4`, and `dion_factory`)"
                     if "sharding_muon" in c and "sharding_dion" in c else "(not measured)"),
    }


def _reproduce_text(run: dict | None, t: dict) -> str:
    """The ``reproduce-quick`` region: wall and CPU time, with the date, cores and load of its own run
    (``--only`` measures it apart from the others)."""
    if not run:
        return "(not measured)"
    load = run.get("load_at_start") or t["load_at_start"]
    return (f"{_seconds(run['wall_s'])} wall, {_seconds(run['cpu_s'])} CPU on {run.get('cores', t['cores'])} CPU "
            f"cores with a fresh run cache, load average {load[0]:g} at its start, {run.get('date', t['date'])}, "
            "measured by `python scripts/timings.py`")


def rewrite(text: str, regions: dict[str, str]) -> str:
    """``text`` with the content of every marked region replaced by ``regions[name]``.
    Raises: ValueError for a start marker without its end, an end without a start, or a region
    whose name ``regions`` lacks (naming it)."""
    starts, ends = re.findall(r"<!-- timings:([a-z0-9-]+):start -->", text), re.findall(
        r"<!-- timings:([a-z0-9-]+):end -->", text)
    for match in REGION.finditer(text):
        if match.group(1) != match.group(3):
            raise ValueError(f"timings region {match.group(1)!r} ends with the marker of {match.group(3)!r}")
    if starts != ends:
        raise ValueError(f"timings markers unmatched: starts {starts}, ends {ends}")
    for name in starts:
        if name not in regions:
            raise ValueError(f"timings region {name!r} has no value (known: {sorted(regions)})")
    return REGION.sub(lambda m: START.format(m.group(1)) + regions[m.group(1)] + END.format(m.group(1)), text)


def regions_of(text: str) -> dict[str, str]:
    """The current content of every marked region of ``text``."""
    return {m.group(1): m.group(2) for m in REGION.finditer(text)}


def portable(value):
    """``value`` (the measurement) with every temporary folder of the run written as ``$TMP``."""
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [portable(v) for v in value]
    return TEMPORARY.sub("$TMP", value) if isinstance(value, str) else value


def data_text(t: dict) -> str:
    """The text of ``verify/cli/timings.json``: the measurement, portable, as indented JSON."""
    return json.dumps(portable(t), indent=1, ensure_ascii=False) + "\n"


def write_docs(t: dict, root: Path = ROOT) -> list[Path]:
    """Rewrite the marked regions of ``DOC_FILES`` under ``root``, ``verify/cli/timings.json`` and
    (with a test suite measured now) ``tests/file_seconds.json``; the changed paths."""
    changed = []
    files = t.get("commands", {}).get("pytest", {}).pop("file_seconds", None)
    if files:
        path = root / FILE_SECONDS.relative_to(ROOT)
        path.write_text(json.dumps(files, indent=1) + "\n")
        changed.append(path)
    regions = render(t)
    for name in DOC_FILES:
        path = root / name
        text = path.read_text()
        new = rewrite(text, regions)
        if new != text:
            path.write_text(new)
            changed.append(path)
    data = root / MEASURED_FILE.relative_to(ROOT)
    data.write_text(data_text(t))
    return changed + [data]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true",
                        help="rewrite the marked regions and verify/cli/timings.json")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--skip-pytest", action="store_true",
                       help="do not run the test suite (keep its previous measurement from verify/cli/timings.json)")
    which.add_argument("--pytest-only", action="store_true",
                       help="run only the test suite; keep the other measurements from verify/cli/timings.json")
    which.add_argument("--only", metavar="KEYS",
                       help="measure only these commands (comma-separated; of "
                            f"{', '.join(k for k, *_ in REPRODUCE_RUNS)}) and keep the others from "
                            "verify/cli/timings.json")
    which.add_argument("--from-json", type=Path, metavar="FILE",
                       help="measure nothing: take the measurement this script printed to FILE (the test suite's "
                            "from verify/cli/timings.json when FILE has none)")
    args = parser.parse_args(argv)
    from ortho_verify.cli.measured import TIMINGS as previous
    if args.only:
        try:
            t = measure_only(args.only.split(","), previous)
        except ValueError as err:
            parser.error(str(err))
    elif args.from_json:
        t = json.loads(args.from_json.read_text())
        if "pytest" not in t["commands"] and "pytest" in previous.get("commands", {}):
            t["commands"]["pytest"] = previous["commands"]["pytest"]
    elif args.pytest_only:  # the other commands' numbers stay; with none yet, only verify/cli/timings.json is written
        t = {**previous, "commands": {**previous.get("commands", {}), "pytest": measure_pytest()}}
        if "default_first" not in t["commands"]:
            print(json.dumps(t, indent=1))
            t["commands"]["pytest"].pop("file_seconds", None)
            MEASURED_FILE.write_text(data_text(t))
            return 1 if t["commands"]["pytest"]["rc"] else 0
    else:
        t = measure(args.skip_pytest, previous)
    print(json.dumps(t, indent=1))
    failed = [k for k, v in t["commands"].items() if v.get("rc")]
    if failed:
        print(f"not written: {failed} exited non-zero", file=sys.stderr)
        return 1
    if args.write_docs:
        for path in write_docs(t):
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
