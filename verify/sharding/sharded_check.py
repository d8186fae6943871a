"""Check anyone's distributed Muon or Dion: ``check_sharded_optimizer(factory)`` steps the same seeded matrices
on every mesh layout (``ortho_verify.sharding.SHARDED_LAYOUTS``) and in one process, and compares the full
weights step by step under the layout contract (docs/design.md, "Distributed layouts and the layout contract").
A ten-line test of a user's FSDP2 Muon, and microsoft/dion's Dion: docs/verification.md, "Distributed
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

from ..conventions import DionConventions, MuonConventions, dtype_name
from ..report.results import VerificationReport, measured
from ..tolerances import sharded_tolerance
from .analysis import input_name, layout_rows
from .compute import resolve_compute
from .crashes import BACKEND_KIND, COMBINED_KIND, crash_kind, headline
from .diagnosis import layout_pattern
from .factory_run import FactoryPlan, one_process_run
from .inputs import initial_weight
from .launch import under_torchrun
from .layouts import SHARDED_LAYOUTS, layouts_for
from .placement import state_placement as _checked_placement
from .user_launch import LaunchResult, run_layout

__all__ = ["DEFAULT_SHARDED_SHAPES", "HANG_FACTOR", "ShardedReport", "check_sharded_optimizer", "crash_kind",
           "labelled_shapes", "load_factory", "parse_shapes"]

#: (label, (m, n)) of the default matrices, the designs of distributed Muons exercised: shapes that
#: repeat (same-shape batching across ranks: Keller Jordan's, nanochat's and microsoft/dion's Muon
#: group the parameters of one shape), in counts that divide neither 2 nor 4 ranks (three 16x8)
#: or fall short of them (two 8x16), and shapes seen once; tall, wide and square (Dion's
#: orientation differs between them), then uneven (13 rows, 7 columns over 2 or 4 ranks) and with
#: empty shards (3 rows and 5 columns over 4 ranks: torch.chunk leaves the last shard empty in
#: both dims). A layout whose launch raises is rerun one shape at a time to localize the crash.
DEFAULT_SHARDED_SHAPES = (("16x8#0", (16, 8)), ("16x8#1", (16, 8)), ("16x8#2", (16, 8)), ("8x16#0", (8, 16)),
                          ("8x16#1", (8, 16)), ("12x12", (12, 12)), ("13x7", (13, 7)), ("3x5", (3, 5)))
#: A layout's launch is killed once its ranks sit idle (blocked in a collective) after HANG_FACTOR
#: times the slowest layout run so far (until one completes: the warm one-process run's time times
#: the world size), never sooner than ``hang_floor`` seconds; ranks still computing (a first-call
#: compilation) run on until ``timeout``.
HANG_FACTOR = 5.0


@dataclass
class ShardedReport(VerificationReport):
    """``VerificationReport`` of ``check_sharded_optimizer``, with the disagreements explained.

    Rows: "sharded_vs_one_process" (per layout, shape and step), "ranks_agree", "state_gathers", "layout_runs"
    and, with conventions, those of ``check_optimizer`` (docs/checks.md, "check_sharded_optimizer").

    Parameters
    ----------
    subject, results, inputs, device : str, list of CheckResult, dict, str
        As ``VerificationReport``.
    world_size : int, default 0
        Number of ranks.
    layouts : list of str
        The layouts run.
    disagreements : list of dict
        Per failing (layout, shape): "layout", "shape", "worst", "bound", "step" (the first failing) and "cause".
    patterns : list of str
        Which mesh role the failing layouts share.
    crashes : dict
        Kind of crash ("raises on empty shards", "hung", ...) -> the layouts or "layout / shape" pairs.
    compute : str, default ""
        The compute dtype judged and why.
    limits : dict
        Per layout: its per-launch time limit and its wall time, in seconds.

    Examples
    --------
    >>> from ortho_verify import ShardedReport
    >>> ShardedReport("factory", [], {}, world_size=2).inconclusive
    True
    """

    world_size: int = 0
    layouts: list = field(default_factory=list)
    disagreements: list = field(default_factory=list)
    patterns: list = field(default_factory=list)
    #: Per kind of crash ("raises on empty shards", "does not take TP placements", "raises on
    #: uneven shards", "raises on this layout", "raises on this mix of parameters", "unsupported on
    #: this backend (gloo: FEATURE)", "hung"): the layouts or "layout / shape" pairs that raised
    #: (``ortho_verify.sharding.crashes``).
    crashes: dict = field(default_factory=dict)
    #: The compute dtype judged (``compute_dtype``) and why; the bound used for each layout's rows.
    compute: str = ""
    #: Per layout: the per-launch time limit it ran under (seconds) and its wall time.
    limits: dict = field(default_factory=dict)

    def summary(self, max_rows: int = 12) -> str:
        """The layouts and shapes that disagree, by how much and why, then ``VerificationReport.summary``.

        Parameters
        ----------
        max_rows : int, default 12
            Passed on to ``VerificationReport.summary``; at most twice as many disagreements are listed.

        Returns
        -------
        str
            The summary, one item per line.
        """
        lines = [f"{len(self.layouts)} layouts at world size {self.world_size}: {', '.join(self.layouts)}"]
        if self.compute:
            lines.append(f"compute: {self.compute}")
        if self.disagreements:
            lines.append(f"disagreements ({len(self.disagreements)}):")
            for d in self.disagreements[:max_rows * 2]:
                what = d["layout"] + (f" / {d['shape']}" if d["shape"] else "")
                size = "" if d["shape"] is None else (f": rel. diff {d['worst']:.2e} (bound {d['bound']:.2g}"
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


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    """"16x8,16x8,32x16" -> ((16, 8), (16, 8), (32, 16)) (``--shapes``). Raises: ValueError naming
    shapes for anything but comma-separated MxN with M, N >= 1."""
    out = []
    for part in str(text).split(","):
        m, sep, n = part.strip().lower().partition("x")
        if not sep or not m.isdigit() or not n.isdigit() or int(m) < 1 or int(n) < 1:
            raise ValueError(f"shapes: expected comma-separated MxN (e.g. 16x8,16x8,32x16), got {text!r}")
        out.append((int(m), int(n)))
    return tuple(out)


def labelled_shapes(shapes) -> tuple[tuple[str, tuple[int, int]], ...]:
    """(label, (m, n)) pairs with unique labels: "MxN" for a shape given once, "MxN#j" for the
    j-th of a repeated one; a given label repeated gets "#j" too."""
    if shapes is None:
        return DEFAULT_SHARDED_SHAPES
    if isinstance(shapes, str):
        shapes = parse_shapes(shapes)
    out = []
    for s in shapes:
        label, shape = (s if len(s) == 2 and isinstance(s[0], str) else (None, s))
        if len(shape) != 2 or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape):
            raise ValueError(f"shapes: expected (m, n) pairs of ints >= 1 or (label, (m, n)), got {s!r}")
        out.append((label or f"{shape[0]}x{shape[1]}", tuple(shape)))
    if not out:
        raise ValueError("shapes: expected at least one (m, n)")
    labels = [lab for lab, _ in out]
    seen: dict[str, int] = {}
    unique = []
    for lab, shape in out:
        if labels.count(lab) > 1:
            unique.append((f"{lab}#{seen.get(lab, 0)}", shape))
            seen[lab] = seen.get(lab, 0) + 1
        else:
            unique.append((lab, shape))
    return tuple(unique)


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


def _oracle_rows(factory: Callable, conventions, reference: dict, shapes, dtype, steps: int) -> list:
    """``check_optimizer`` on the one-process run (its own inputs), the hyperparameters read from
    the factory's param group under the conventions' names."""
    from ..checks.optimizer_checks import check_optimizer

    names = conventions.hyperparameter_names
    missing = [names[k] for k in ("lr", "momentum", "weight_decay") if names[k] not in reference["hyper"]]
    if missing:
        return [measured("one_process_vs_oracle", "one process", "hyperparameters", math.inf, 0.0,
                         f"param_groups[0] has no {missing}: set the conventions' hyperparameter_names")]
    hyper = {k: reference["hyper"][names[k]] for k in ("lr", "momentum", "weight_decay")}
    return check_optimizer(lambda params, **_: factory(params, None), conventions, **hyper, steps=steps,
                           param_dtype=dtype, shapes=[s for _, s in shapes], statistical_matrices=0).results


def _crash_row(where: str, detail: str, kind: str, error: str):
    return dataclasses.replace(measured("layout_runs", where, detail, math.inf, 0.0, f"{kind}: {error}"),
                               kind="unsupported", cause=kind)


class _Judge:
    """One ``check_sharded_optimizer`` run: its settings, the rows so far, the crashes to classify
    once every layout has run (``crash_kind`` candidates are kept only where the runs confirm them)."""

    def __init__(self, factory, conventions, name, steps, world_size, gpu, device, tol, placement, compute, limits,
                 timeout):
        self.factory, self.conventions, self.name, self.steps, self.timeout = factory, conventions, name, steps, timeout
        self.world_size, self.gpu, self.device, self.tol = world_size, gpu, device, tol
        self.placement, self.compute, self.limits = placement, compute, limits
        self.ran: list[tuple] = []  # (layout, mesh_shape, shape) of every run that completed
        self.pending: list[tuple] = []  # (row index, candidate kind, layout, mesh_shape, shape, where, error)
        self.rows: list = []
        self.found: list = []

    def judge(self, plan: FactoryPlan, launch: LaunchResult, reference: dict) -> bool | None:
        """Rows of a completed launch; True when the weights disagree, None when no claim."""
        rows, found, numeric = layout_rows(plan, launch.runs, None, reference, self.conventions, self.tol,
                                           placement=self.placement, compute=self.compute,
                                           world_size=self.world_size)
        self.rows += rows
        self.found += found
        if launch.runs[0].get("unsupported"):
            return None
        self.ran += [(plan.layout, plan.mesh_shape, s) for _, s in plan.shapes]
        return numeric

    def crash(self, where: str, detail: str, candidate: str, lay, mesh_shape, shape, error: str) -> dict:
        """A failing "unsupported" row (its kind classified later); returns its disagreement entry."""
        self.pending.append((len(self.rows), candidate, lay, mesh_shape, shape, where, error))
        self.rows.append(_crash_row(where, detail, candidate, error))
        entry = {"layout": lay.name, "shape": where.split(" / ", 1)[1] if " / " in where else None,
                 "worst": math.inf, "bound": self.tol, "step": None, "cause": f"{candidate}: {error}"}
        self.found.append(entry)
        return entry

    def classify(self) -> dict:
        """The crashes per headline; each pending row's kind made true for what it covers."""
        crashes: dict = {}
        for idx, candidate, lay, mesh_shape, shape, where, error in self.pending:
            kind = candidate if shape is None else headline(candidate, lay, mesh_shape, shape, self.ran)
            self.rows[idx] = _crash_row(where, self.rows[idx].detail, kind, error)
            for d in self.found:
                if d["cause"] == f"{candidate}: {error}" and d["layout"] == lay.name:
                    d["cause"] = f"{kind}: {error}"
            crashes.setdefault(kind, []).append(where)
        return crashes


def _by_shape(j: _Judge, lay, mesh_shape, shapes, limit: float) -> tuple[bool, int]:
    """A layout whose combined launch raised, rerun one distinct shape at a time (every parameter
    of that shape together, with the combined run's seeds; the one-process reference of those
    parameters alone) to localize the crash. Returns (any numeric disagreement, shapes that raised)."""
    numeric, raised = False, 0
    groups: dict[tuple, list[int]] = {}
    for i, (_, shape) in enumerate(shapes):
        groups.setdefault(shape, []).append(i)
    for shape, idx in groups.items():
        sub = FactoryPlan(j.factory, lay, mesh_shape, tuple(shapes[i] for i in idx), j.name, j.steps, tuple(idx))
        launch = run_layout(sub, j.world_size, j.timeout, j.gpu, idle_timeout=limit)
        if launch.error is not None:
            raised += 1
            where = input_name(lay.name, shapes[idx[0]][0], shape) if len(idx) == 1 else \
                f"{lay.name} / {shape[0]}x{shape[1]} (all {len(idx)})"
            kind = BACKEND_KIND if launch.feature else ("hung" if launch.hung else crash_kind(lay, mesh_shape, shape))
            j.crash(where, f"factory and every step on every rank, the {shape[0]}x{shape[1]} parameters alone", kind,
                    lay, mesh_shape, None if launch.hung or launch.feature else shape, launch.error)
            continue
        reference = one_process_run(j.factory, sub.shapes, j.name, j.steps, j.device, seeds=sub.seeds)
        numeric |= bool(j.judge(sub, launch, reference))
    return numeric, raised


def check_sharded_optimizer(factory: Callable, conventions=None, *, world_size: int = 4,
                            layouts: Sequence[str] | None = None, shapes=None, dtype=torch.float64, steps: int = 3,
                            timeout: float = 120.0, device=None, state_placement: str | None = None,
                            compute_dtype=None, hang_floor: float = 5.0) -> ShardedReport:
    """Check a distributed optimizer on every mesh layout against its own one-process run.

    The same seeded matrices and gradients are stepped on each layout (DDP, FSDP, TP, HSDP and their mixes;
    ``ortho_verify.sharding.SHARDED_LAYOUTS``) in ``world_size`` forked gloo workers on CPU (NCCL on GPUs), and the
    full weights after each step are compared with the one-process run under the layout contract
    (``ortho_verify.tolerances.sharded_tolerance``; with a bfloat16 / float16 compute dtype, each step's update under
    ``sharded_compute_tolerance``). Crashes and hangs are rows of their own; details: docs/checks.md,
    "check_sharded_optimizer".

    Parameters
    ----------
    factory : callable
        ``factory(params, layout)`` builds the optimizer: ``layout`` None for the one-process run on plain
        tensors, else a ``ShardedLayout`` (``mesh``, ``placements``, ``shard_mesh``, ...); None: unsupported.
    conventions : MuonConventions or DionConventions, optional
        Also check the one-process run against the oracle (``check_optimizer``).
    world_size : int, default 4
        Number of ranks.
    layouts : sequence of str, optional
        Names (or parts of names, case-insensitive) of the layouts to run (default: every one that fits).
    shapes : sequence or str, optional
        (m, n), (label, (m, n)) or "16x8,32x16" (default ``DEFAULT_SHARDED_SHAPES``: uneven and empty shards).
    dtype : torch.dtype, default torch.float64
        The parameters' dtype: float64 or float32.
    steps : int, default 3
        Steps per layout (≥ 2 with ``DionConventions``).
    timeout : float, default 120.0
        Seconds a launch's ranks may compute before it is killed.
    device : {None, "cpu", "cuda"}, optional
        "cuda": one spawned rank per GPU with NCCL (the factory must be picklable); under torchrun, its ranks.
    state_placement : {"replicated", "sharded", "owner"}, optional
        Where the optimizer keeps its state (default: recognized per parameter).
    compute_dtype : torch.dtype or str, optional
        The dtype of the optimizer's Newton–Schulz (default: the conventions' ``ns_dtype``, else inferred).
    hang_floor : float, default 5.0
        Seconds, at least, before a launch whose ranks sit idle in a collective counts as hung.

    Returns
    -------
    ShardedReport
        The rows, ``disagreements`` with their causes, ``patterns``, ``crashes``, ``compute`` and ``limits``.

    Raises
    ------
    TypeError
        For a non-callable factory, conventions of another type, or a dtype other than float64 / float32.
    ValueError
        Naming the argument: world_size, steps, timeout, hang_floor, shapes, state_placement, compute_dtype,
        or a ``layouts`` filter matching nothing. What the factory raises in the one-process run is re-raised.

    References
    ----------
    docs/design.md, "Distributed layouts and the layout contract"; microsoft/dion's mesh names
    (``replicate_mesh``, ``outer_shard_mesh``, ``inner_shard_mesh``).

    Examples
    --------
    >>> from ortho_verify import check_sharded_optimizer
    >>> from ortho_verify.sharding import muon_factory
    >>> check_sharded_optimizer(muon_factory, world_size=2, layouts=["DDP"], shapes="16x8,8x16", steps=1).status
    'passed'
    """
    import time

    if not callable(factory):
        raise TypeError(f"factory: expected a callable factory(params, layout), got {type(factory).__name__}")
    if conventions is not None and not isinstance(conventions, (MuonConventions, DionConventions)):
        raise TypeError(f"conventions: expected MuonConventions, DionConventions or None, got "
                        f"{type(conventions).__name__}")
    name = dtype_name(dtype, ("float64", "float32"))
    first = 2 if isinstance(conventions, DionConventions) else 1
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < first:
        raise ValueError(f"steps: expected an int >= {first}, got {steps!r}")
    for arg, value in (("timeout", timeout), ("hang_floor", hang_floor)):
        if isinstance(value, bool) or not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"{arg}: expected seconds > 0, got {value!r}")
    placement = _checked_placement(state_placement)
    shapes = labelled_shapes(shapes)
    if compute_dtype is not None:
        resolve_compute(compute_dtype, None, None, name)  # ValueError naming compute_dtype, before any launch
    from ..devices import resolve_device

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
    begun = time.perf_counter()  # timed again, warm: the first run pays for imports and lazy initialization
    one_process_run(factory, shapes, name, steps, device)
    one_time = time.perf_counter() - begun
    compute = resolve_compute(compute_dtype, conventions, reference.get("type"), name)
    target = getattr(factory, "__qualname__", type(factory).__name__)
    report = ShardedReport(f"{getattr(factory, '__module__', '')}.{target} on {len(chosen)} layouts", [],
                           {}, world_size=world_size, layouts=[lay.name for lay, _ in chosen])
    report.compute = (f"{compute.dtype}, {compute.why}: " + (
        "each step's update against one process's within sharded_compute_tolerance (two evaluations of the same "
        "map in that precision, differing in reduction order)" if compute.low else
        f"the full weights against one process's within the {name} layout contract ({tol:.0e})"))
    j = _Judge(factory, conventions, name, steps, world_size, gpu, device, tol, placement, compute, report.limits,
               float(timeout))
    failing, passing, slowest, timed = [], [], world_size * one_time, False
    for lay, mesh_shape in chosen:
        limit = min(float(timeout), max(float(hang_floor), HANG_FACTOR * slowest))
        plan = FactoryPlan(factory, lay, mesh_shape, shapes, name, steps)
        started = time.perf_counter()
        launch = run_layout(plan, world_size, float(timeout), gpu, idle_timeout=limit)
        wall = time.perf_counter() - started
        report.limits[lay.name] = {"limit_s": round(limit, 1), "wall_s": round(wall, 1)}
        if launch.error is None:
            slowest = max(slowest, wall) if timed else wall
            timed = True
            numeric = j.judge(plan, launch, reference)
            if numeric is not None:
                (failing if numeric else passing).append(lay)
            continue
        if launch.hung:
            j.crash(lay.name, "factory and every step on every rank", "hung", lay, mesh_shape, None,
                    f"{launch.error.removeprefix('hung: ')} (idle limit {limit:.1f} s: {HANG_FACTOR:g}x the slowest "
                    f"layout so far, at least "
                    f"hang_floor {hang_floor:g} s; ranks still computing run on to timeout {timeout:g} s)")
            continue
        if launch.feature:
            j.crash(lay.name, "factory and every step on every rank", f"{BACKEND_KIND}", lay, mesh_shape, None,
                    f"the optimizer needs {launch.feature}, which the {launch.backend} backend lacks (run on GPUs "
                    f"with NCCL: device='cuda' or torchrun); {launch.error}")
            continue
        distinct = {s for _, s in shapes}
        if len(distinct) == 1:
            j.crash(lay.name, "factory and every step on every rank", crash_kind(lay, mesh_shape, shapes[0][1]), lay,
                    mesh_shape, shapes[0][1], launch.error)
            continue
        # the combined run's crash is the verdict; the reruns per shape only localize it
        idx = len(j.rows)
        entry = j.crash(lay.name, "factory and every step on every rank, all parameters together", COMBINED_KIND,
                        lay, mesh_shape, None, launch.error)
        numeric, raised = _by_shape(j, lay, mesh_shape, shapes, limit)
        if raised:  # shapes that raise alone account for it: the row stays, its headline in their rows
            j.pending = [p for p in j.pending if p[0] != idx]
            j.rows[idx] = _crash_row(lay.name, j.rows[idx].detail, "raises (see the rows per shape)", launch.error)
            entry["cause"] = f"raises (see the rows per shape): {launch.error}"
        (failing if numeric else passing).append(lay)
    report.crashes = j.classify()
    report.results += j.rows
    report.disagreements += j.found
    report.patterns = layout_pattern(failing, passing)
    for i, (label, shape) in enumerate(shapes):
        for lay, _ in chosen:
            arrays = {"weight0": initial_weight(i, shape, getattr(torch, name)).double().numpy()}
            how = (f"ortho_verify.sharding.initial_weight({i}, {shape}, torch.{name}); gradients "
                   f"ortho_verify.sharding.gradient({i}, step, 0, {shape}, torch.{name})")
            report.inputs[input_name(lay.name, label, shape)] = (arrays, how)
    if conventions is not None:
        report.results += _oracle_rows(factory, conventions, reference, shapes, getattr(torch, name), steps)
    return report
