"""Check anyone's distributed Muon or Dion: ``check_sharded_optimizer(factory)`` steps the same
seeded matrices on every mesh layout (DDP, FSDP Shard(0) / Shard(1), TP colwise / rowwise, HSDP,
FSDP + TP with ``_StridedShard``, HSDP + TP; ``ortho_verify.sharding.SHARDED_LAYOUTS``) and in one
process, and compares the full weights step by step under the layout contract
(``ortho_verify.tolerances.sharded_tolerance``; docs/design.md, "Distributed layouts and the
layout contract"). A ten-line test of a user's FSDP2 Muon::

    import torch
    from ortho_verify import check_sharded_optimizer
    from my_project import DistributedMuon

    def factory(params, layout):       # layout None: one process on plain tensors
        mesh = None if layout is None else layout.shard_mesh
        return DistributedMuon(params, lr=0.02, distributed_mesh=mesh)

    def test_muon_every_layout():
        report = check_sharded_optimizer(factory, world_size=4)
        assert report.passed, report.summary()

The full section, with microsoft/dion's Dion constructor: docs/verification.md, "Distributed
optimizers". Command line: ``ortho-verify sharding --optimizer package.module:factory``.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ortho_verify.conventions import DionConventions, MuonConventions, dtype_name
from ortho_verify.results import VerificationReport, measured
from ortho_verify.sharding.analysis import input_name, layout_rows
from ortho_verify.sharding.diagnosis import layout_pattern
from ortho_verify.sharding.factory_run import FactoryPlan, layout_rank_run, one_process_run
from ortho_verify.sharding.inputs import initial_weight
from ortho_verify.sharding.launch import under_torchrun
from ortho_verify.sharding.layouts import SHARDED_LAYOUTS, layouts_for
from ortho_verify.tolerances import sharded_tolerance
from ortho_verify.workers import WorkerError, run_workers

__all__ = ["DEFAULT_SHARDED_SHAPES", "ShardedReport", "check_sharded_optimizer", "load_factory"]

#: (label, (m, n)) of the default matrices, those every layout divides first: tall, wide and
#: square (Dion's orientation differs between them), then uneven (13 rows, 7 columns over 2 or 4
#: ranks) and with empty shards (3 rows and 5 columns over 4 ranks: torch.chunk leaves the last
#: shard empty in both dims). A layout whose launch raises is judged shape by shape, so an
#: optimizer that cannot take the last two is still judged on the first three.
DEFAULT_SHARDED_SHAPES = (("tall", (16, 8)), ("wide", (8, 16)), ("square", (12, 12)), ("uneven", (13, 7)),
                          ("empty shards", (3, 5)))


@dataclass
class ShardedReport(VerificationReport):
    """``VerificationReport`` of ``check_sharded_optimizer`` with the disagreements explained.

    ``results``: rows "sharded_vs_one_process" (per layout, shape and step: relative Frobenius
    difference of the full weights, tolerance the layout contract), "ranks_agree" (every rank's
    full weights bitwise equal rank 0's), "state_gathers" (the assembled state has one process's
    keys and shapes: a checkpoint moves between layouts), "layout_runs" (the factory raised, hung,
    lost the placements; "no claim" when it returned None) and, with conventions, the rows of
    ``check_optimizer`` on the one-process run. ``disagreements``: per failing (layout, shape)
    a dict with "layout", "shape", "worst", "bound", "step" (the first failing one) and "cause";
    ``patterns``: which mesh role the failing layouts share; ``layouts``: the layouts run.
    """

    world_size: int = 0
    layouts: list = field(default_factory=list)
    disagreements: list = field(default_factory=list)
    patterns: list = field(default_factory=list)
    #: Per kind of crash ("raises on empty shards", "does not take TP placements", "raises on
    #: uneven shards", "raises on this layout"): the "layout / shape" pairs that raised (``crash_kind``).
    crashes: dict = field(default_factory=dict)

    def summary(self, max_rows: int = 12) -> str:
        """The layouts and shapes that disagree, by how much and why, then ``VerificationReport.summary``."""
        lines = [f"{len(self.layouts)} layouts at world size {self.world_size}: {', '.join(self.layouts)}"]
        if self.disagreements:
            lines.append(f"disagreements ({len(self.disagreements)}):")
            for d in self.disagreements[:max_rows * 2]:
                what = d["layout"] + (f" / {d['shape']}" if d["shape"] else "")
                size = "" if d["shape"] is None else (f": rel. diff {d['worst']:.2e} (bound {d['bound']:.0e}"
                                                       + (f", from step {d['step']})" if d["step"] else ")"))
                lines.append(f"  {what}{size} — {d['cause']}")
            if len(self.disagreements) > max_rows * 2:
                lines.append(f"  ... and {len(self.disagreements) - max_rows * 2} more (report.disagreements)")
        lines += [f"pattern: {p}" for p in self.patterns]
        for kind, where in self.crashes.items():
            lines.append(f"crashes: {kind} ({len(where)}: {', '.join(where[:6])}{', ...' if len(where) > 6 else ''})")
        return "\n".join(lines + [super().summary(max_rows)])


def load_factory(path: str) -> Callable:
    """The factory named by ``"package.module:attribute"`` (attribute may be dotted).
    Raises: ValueError naming ``path`` without a ':'; ImportError / AttributeError from the import."""
    if not isinstance(path, str) or ":" not in path:
        raise ValueError(f"optimizer: expected 'package.module:factory', got {path!r}")
    module, _, attr = path.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"optimizer: {path!r} is not callable")
    return obj


def _shapes(shapes) -> tuple[tuple[str, tuple[int, int]], ...]:
    if shapes is None:
        return DEFAULT_SHARDED_SHAPES
    out = []
    for s in shapes:
        label, shape = (s if len(s) == 2 and isinstance(s[0], str) else (None, s))
        if len(shape) != 2 or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape):
            raise ValueError(f"shapes: expected (m, n) pairs of ints >= 1 or (label, (m, n)), got {s!r}")
        out.append((label or f"{shape[0]}x{shape[1]}", tuple(shape)))
    if not out:
        raise ValueError("shapes: expected at least one (m, n)")
    return tuple(out)


def _select(world_size: int, names) -> list:
    """Layouts of ``SHARDED_LAYOUTS`` fitting ``world_size``; a name equal to a layout's (case
    aside) selects that layout alone, any other selects every layout containing it."""
    fit = layouts_for(world_size, catalogue=SHARDED_LAYOUTS)
    if names is None:
        return fit
    if isinstance(names, str):
        names = [names]
    wanted = {n.lower() for n in names}
    exact = {lay.name.lower() for lay, _ in fit} & wanted
    loose = wanted - exact
    return [(lay, shape) for lay, shape in fit
            if lay.name.lower() in exact or any(n in lay.name.lower() for n in loose)]


def _last_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else type(err).__name__


def _user_frame_in(text: str) -> str:
    """"file:line in function" of the last traceback frame in ``text`` (a worker's formatted
    traceback) outside ortho_verify, torch and Python's own library (else outside torch and the
    library: the judge's own planted optimizers); "" when there is none."""
    import re
    import sysconfig

    skip = [os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
            os.path.dirname(os.path.abspath(__file__)) + os.sep]
    stdlib = sysconfig.get_paths().get("stdlib")
    if stdlib:
        skip.append(os.path.abspath(stdlib) + os.sep)
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', text)

    def outside(roots):
        return [f for f in frames if not f[0].startswith("<") and not any(
            os.path.abspath(f[0]).startswith(r) and "site-packages" not in os.path.abspath(f[0])[len(r):] for r in roots)]

    mine = outside(skip) or outside([r for r in skip if r != skip[1]])  # else the judge's own planted code
    return f"{mine[-1][0]}:{mine[-1][1]} in {mine[-1][2]}" if mine else ""


def _run_layout(plan: FactoryPlan, world_size: int, timeout: float, gpu: bool = False
                ) -> tuple[list | None, str | None]:
    """Every rank's result of ``layout_rank_run`` (forked gloo workers; spawned NCCL workers, one
    per GPU, with ``gpu``; or in-process under torchrun), or None and the message of a raising or
    hanging rank."""
    if under_torchrun():
        import torch.distributed as dist

        try:
            mine = layout_rank_run(dist.get_rank(), world_size, plan)
        except Exception as err:  # noqa: BLE001 - every rank reports; a rank stuck in a collective cannot be freed
            mine = {"error": f"rank {dist.get_rank()}: {type(err).__name__}: {err}"}
        everyone = [None] * world_size
        dist.all_gather_object(everyone, mine)
        errors = [r["error"] for r in everyone if "error" in r]
        return (None, errors[0]) if errors else (everyone, None)
    try:
        if gpu:
            from ortho_verify.sharding.launch import run_gpu_workers

            return run_gpu_workers(world_size, layout_rank_run, plan, timeout=timeout), None
        return run_workers(world_size, layout_rank_run, plan, timeout=timeout), None
    except TimeoutError as err:
        return None, f"hung: {err}"
    except WorkerError as err:
        frame = _user_frame_in(str(err))
        return None, f"raised: {str(err).splitlines()[0]} {_last_line(err)}" + (f" at {frame}" if frame else "")


def _split(size: int, parts: int) -> tuple[bool, bool]:
    """(some shard empty, shards uneven) of ``size`` split in ``parts`` as torch.chunk / DTensor do."""
    if parts <= 1:
        return False, False
    chunk = -(-size // parts)
    return -(-size // chunk) < parts, size % parts != 0


def crash_kind(layout, mesh_shape, shape) -> str:
    """What a crash of ``layout`` on a matrix of ``shape`` says about the optimizer, from the
    layout and shape alone (never the message: a user's internal error names neither): "raises on
    empty shards" when a sharded dim leaves a rank an empty shard (torch.chunk), else "does not take
    TP placements" when the layout has a TP mesh dim, else "raises on uneven shards" when a sharded
    dim does not divide, else "raises on this layout"."""
    parts = {0: 1, 1: 1}
    for code, size in zip(layout.placements or (), mesh_shape or ()):
        if code != "R":
            parts[int(code[-1])] *= size
    empty = any(_split(shape[d], parts[d])[0] for d in (0, 1))
    uneven = any(_split(shape[d], parts[d])[1] for d in (0, 1))
    if empty:
        return "raises on empty shards"
    if "tp" in layout.dims:
        return "does not take TP placements"
    return "raises on uneven shards" if uneven else "raises on this layout"


def _by_shape(factory, lay, mesh_shape, shapes, name, steps, world_size, timeout, conventions, tol, device, gpu):
    """A layout whose launch raised, judged shape by shape (one launch each, the one-process
    reference of that shape alone): rows, disagreements, whether any disagree, and the crashes
    [(kind, "layout / shape")] of the shapes that raised (their ``layout_runs`` rows say which)."""
    rows, found, numeric, crashes = [], [], False, []
    for label, shape in shapes:
        sub = FactoryPlan(factory, lay, mesh_shape, ((label, shape),), name, steps)
        runs, error = _run_layout(sub, world_size, timeout, gpu)
        if error is not None:
            why = crash_kind(lay, mesh_shape, shape)
            where = input_name(lay.name, label, shape)
            rows.append(dataclasses.replace(
                measured("layout_runs", where, "factory and every step on every rank", math.inf, 0.0, f"{why}: {error}"),
                kind="unsupported", cause=why))
            found.append({"layout": lay.name, "shape": f"{label} {shape[0]}x{shape[1]}", "worst": math.inf,
                          "bound": tol, "step": None, "cause": f"{why}: {error}"})
            crashes.append((why, where))
            continue
        reference = one_process_run(factory, ((label, shape),), name, steps, device)
        r, f, num = layout_rows(sub, runs, None, reference, conventions, tol)
        rows += r
        found += f
        numeric |= num
    return rows, found, numeric, crashes


def _oracle_rows(factory: Callable, conventions, reference: dict, shapes, dtype, steps: int) -> list:
    """``check_optimizer`` on the one-process run (its own inputs), the hyperparameters read from
    the factory's param group under the conventions' names."""
    from ortho_verify.optimizer_checks import check_optimizer

    names = conventions.hyperparameter_names
    missing = [names[k] for k in ("lr", "momentum", "weight_decay") if names[k] not in reference["hyper"]]
    if missing:
        return [measured("one_process_vs_oracle", "one process", "hyperparameters", math.inf, 0.0,
                         f"param_groups[0] has no {missing}: set the conventions' hyperparameter_names")]
    hyper = {k: reference["hyper"][names[k]] for k in ("lr", "momentum", "weight_decay")}
    return check_optimizer(lambda params, **_: factory(params, None), conventions, **hyper, steps=steps,
                           param_dtype=dtype, shapes=[s for _, s in shapes], statistical_matrices=0).results


def check_sharded_optimizer(factory: Callable, conventions=None, *, world_size: int = 4,
                            layouts: Sequence[str] | None = None, shapes=None, dtype=torch.float64, steps: int = 3,
                            timeout: float = 120.0, device=None) -> ShardedReport:
    """Check a distributed optimizer on every mesh layout against its own one-process run.

    ``factory(params, layout)`` builds the optimizer: ``layout`` None for the one-process run on
    plain ``torch.nn.Parameter`` tensors; else a ``ShardedLayout`` (``name``, ``mesh``,
    ``placements``, ``replicate_mesh`` / ``outer_shard_mesh`` / ``inner_shard_mesh``: 1-D
    sub-meshes or None, microsoft/dion's names; ``process_group`` for DDP-style optimizers;
    ``shard_mesh``), with the parameters DTensors of those placements (plain replicated tensors
    for DDP). It may return None for a layout it does not support (a "no claim" row).
    Each parameter (m, n) of ``shapes`` (default ``DEFAULT_SHARDED_SHAPES``) starts from the same
    seeded full tensor in ``dtype`` (float64 or float32) and gets the same gradients on every rank
    (``ortho_verify.sharding.initial_weight`` / ``gradient``) for ``steps`` steps.
    ``layouts``: names of ``SHARDED_LAYOUTS`` entries that fit ``world_size`` (case-insensitive;
    a full name selects that layout alone, a part of a name every layout containing it). ``conventions``: ``MuonConventions`` / ``DionConventions``: the one-process run is
    also checked against the oracle (``check_optimizer``, hyperparameters from its param group),
    and a Dion's disagreement is replayed in both orientations (``ortho_verify.sharding.diagnosis``).
    Each layout runs as its own launch of ``world_size`` forked gloo workers on CPU (killed after
    ``timeout`` seconds; a raising, hanging or placement-losing layout gives a failing row and the
    others still run); under torchrun in-process on the launched ranks (NCCL on GPUs; no
    ``timeout`` there: a rank that never joins a collective blocks the job).
    A layout whose launch raises is run again shape by shape: the optimizer is judged on the shapes
    it takes, and each shape that raises gets a failing ``layout_runs`` row of kind "unsupported"
    classified by the layout and shape (``crash_kind``: "raises on empty shards", "does not take TP
    placements", ...; summed up in ``report.crashes``).
    ``device``: None or "cpu" (gloo workers on CPU, as above) or "cuda": one spawned rank per GPU
    (rank r on cuda:r) with the NCCL backend, the parameters built on the CPU in float64, rounded
    to ``dtype`` and moved (the factory must then be picklable: defined at module level); under
    torchrun the launched ranks are used as they are.
    Returns: ``ShardedReport`` (rows, ``disagreements`` with their causes, ``patterns``, ``crashes``;
    ``summary()``).
    Raises: TypeError for a non-callable factory, conventions of another type, or a dtype other
    than float64 / float32; ValueError for world_size < 1, steps < 1 (< 2 with DionConventions),
    timeout <= 0, bad shapes or a ``layouts`` filter matching nothing. What the factory raises in
    the one-process run is re-raised (there is nothing to compare with).
    """
    if not callable(factory):
        raise TypeError(f"factory: expected a callable factory(params, layout), got {type(factory).__name__}")
    if conventions is not None and not isinstance(conventions, (MuonConventions, DionConventions)):
        raise TypeError(f"conventions: expected MuonConventions, DionConventions or None, got "
                        f"{type(conventions).__name__}")
    name = dtype_name(dtype, ("float64", "float32"))
    first = 2 if isinstance(conventions, DionConventions) else 1
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < first:
        raise ValueError(f"steps: expected an int >= {first}, got {steps!r}")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout: expected seconds > 0, got {timeout!r}")
    shapes = _shapes(shapes)
    from ortho_verify.devices import resolve_device

    dev = resolve_device(device)  # TypeError / ValueError naming device
    gpu = dev.type == "cuda" and not under_torchrun()
    if gpu and torch.cuda.device_count() < world_size:
        raise ValueError(f"device: 'cuda' runs one rank per GPU: world_size {world_size} needs {world_size} GPUs, "
                         f"{torch.cuda.device_count()} available")
    if under_torchrun():
        import torch.distributed as dist

        if not dist.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            dist.init_process_group(backend)
        world_size = dist.get_world_size()
    chosen = _select(world_size, layouts)
    if not chosen:
        raise ValueError(f"layouts: no layout matches {list(layouts or [])} at world size {world_size}")
    tol = sharded_tolerance(name)
    device = "cuda" if (under_torchrun() and torch.cuda.is_available()) or gpu else "cpu"
    reference = one_process_run(factory, shapes, name, steps, device)
    target = getattr(factory, "__qualname__", type(factory).__name__)
    report = ShardedReport(f"{getattr(factory, '__module__', '')}.{target} on {len(chosen)} layouts", [],
                           {}, world_size=world_size, layouts=[lay.name for lay, _ in chosen])
    failing, passing, by_shape = [], [], set()
    for lay, mesh_shape in chosen:
        plan = FactoryPlan(factory, lay, mesh_shape, shapes, name, steps)
        runs, error = _run_layout(plan, world_size, timeout, gpu)
        if error is not None and len(shapes) > 1 and not error.startswith("hung"):
            # judged on the shapes it runs; the ones that raise are classified by layout and shape
            rows, found, numeric, crashes = _by_shape(factory, lay, mesh_shape, shapes, name, steps, world_size,
                                                      timeout, conventions, tol, device, gpu)
            by_shape.add(lay.name)
            for why, where in crashes:
                report.crashes.setdefault(why, []).append(where)
            if len(crashes) < len(shapes):
                (failing if numeric else passing).append(lay)
        else:
            rows, found, numeric = layout_rows(plan, runs, error, reference, conventions, tol)
            if error is not None and not error.startswith("hung"):
                why = crash_kind(lay, mesh_shape, shapes[0][1]) if len(shapes) == 1 else "raises on this layout"
                report.crashes.setdefault(why, []).append(lay.name)
                rows = [dataclasses.replace(r, kind="unsupported") if r.check == "layout_runs" and not r.passed
                        else r for r in rows]
            if error is None and not (runs and runs[0].get("unsupported")):
                (failing if numeric else passing).append(lay)
        report.results += rows
        report.disagreements += found
    report.patterns = layout_pattern(failing, passing)
    for i, (label, shape) in enumerate(shapes):
        for lay, _ in chosen:
            k = 0 if lay.name in by_shape else i  # a layout run shape by shape gave each shape index 0
            arrays = {"weight0": initial_weight(k, shape, getattr(torch, name)).double().numpy()}
            how = (f"ortho_verify.sharding.initial_weight({k}, {shape}, torch.{name}); gradients "
                   f"ortho_verify.sharding.gradient({k}, step, 0, {shape}, torch.{name})")
            report.inputs[input_name(lay.name, label, shape)] = (arrays, how)
    if conventions is not None:
        report.results += _oracle_rows(factory, conventions, reference, shapes, getattr(torch, name), steps)
    return report
