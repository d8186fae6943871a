"""Check someone else's implementation: ``check_orthogonalizer`` (a kernel) and ``check_optimizer``.

Both run the implementation on inputs with known spectra, compare every result with the exact oracle
(``ortho_ref``) under the tolerances of ``ortho_verify.tolerances``, and return a ``VerificationReport``.
A ten-line pytest test: docs/verification.md, "Five minutes: a test for your Newton–Schulz function".
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from .checks.diagnoses import with_cause
from .checks.kernel_calls import (
    DEFAULT_TIMEOUT_S,
    RECOMPILE_LIMIT_FIX,
    call_with_timeout,
    check_examples,
    check_seed,
    is_recompile_limit,
    raised_row,
)
from .checks.newton_schulz import compare_ns_output
from .checks.optimizer_checks import DEFAULT_SHAPES, check_optimizer, optimizer_inputs
from .checks.orientation import confined_cause
from .checks.statistical import STATISTICAL_SPECS, StatisticalBatch, compare_ns_statistics, statistical_batch
from .conventions import (
    DION,
    ORTHO_MUON,
    TORCH_MUON,
    DionConventions,
    MuonConventions,
    dtype_name,
    table_and_normalization,
)
from .devices import describe_device, device_label, resolve_device
from .inputs.arrays import as_float64 as _as_f64
from .inputs.examples import DTYPES, MAX_SCALE, SpectralExample, build_example
from .report.results import CheckResult, Failure, VerificationReport, accept_side_effects, measured
from .tolerances import NS_FORMS, validate_restarts

__all__ = [
    "DEFAULT_SHAPES", "DEFAULT_SPECS", "DEFAULT_TIMEOUT_S", "DION", "DionConventions", "Failure", "MuonConventions",
    "ORTHO_MUON", "RECOMPILE_LIMIT_FIX", "call_with_timeout", "check_orthogonalizer_statistics", "compute_name",
    "is_recompile_limit",
    "TORCH_MUON", "VerificationReport", "check_optimizer", "check_orthogonalizer", "check_orthogonalizer_example",
    "default_examples", "dtype_name", "input_scale", "optimizer_inputs", "REPLAY_HINT",
]


def _ns_dtype_name(dtype) -> str:
    """The input dtype of an orthogonalizer check: float64, float32, bfloat16 or float16 (the dtypes of
    ``ortho_verify.inputs.examples.DTYPES``, whose inputs are defined); "high" is float32 (TF32 products);
    TypeError otherwise."""
    return "float32" if isinstance(dtype, str) and dtype in ("high", "tf32") else dtype_name(dtype, DTYPES)


def compute_name(dtype, compute_dtype=None) -> str:
    """The compute precision the kernel is judged with: ``compute_dtype`` when given, else ``dtype``'s;
    "high" / "tf32" name TF32 (float32 storage, products of 10-bit operands, float32 accumulation).
    One of ``ortho_verify.tolerances.COMPUTE_PRECISIONS``.
    Raises: TypeError naming compute_dtype (or dtype) for anything else."""
    value, argument = (dtype, "dtype") if compute_dtype is None else (compute_dtype, "compute_dtype")
    if isinstance(value, str) and value in ("high", "tf32"):
        return "tf32"
    return dtype_name(value, DTYPES, argument)


#: float16's range for the default inputs (largest finite 65504, smallest normal 2⁻¹⁴ ≈ 6.1e-5):
#: scales outside [1e-3, MAX_SCALE["float16"]] are clipped into it when the input or the compute
#: dtype is float16 (a 1e-30 matrix is 0 in float16; at ‖G‖_F = 1e-3 the entries of a 20 × 12
#: input are ≈ 6e-5, still normal). The ‖G‖_F = 1e-5 input stays: its entries are subnormal but
#: exact as the kernel receives them, and it is where eps = 1e-7 is a 1% scale.
FLOAT16_MIN_SCALE = 1e-3


def input_scale(scale, name: str, compute: str) -> float:
    """A default spec's scale for an input dtype ``name`` and compute precision ``compute``."""
    limit = min(MAX_SCALE[name], MAX_SCALE.get(compute, MAX_SCALE["float32"]))
    value = limit if scale == "max" else min(scale, limit)
    if "float16" in (name, compute) and value < 1e-10:
        return FLOAT16_MIN_SCALE
    return value


def _shape_key(shape) -> tuple:
    """Grouping key of an input shape: (m, n) first, then the batch dims (compiled kernels recompile
    per distinct shape; grouped inputs make each shape's compilation happen once, in a row)."""
    return tuple(shape[-2:]) + tuple(shape[:-2])


def _check_shapes(shapes) -> list[tuple[int, ...]] | None:
    """``shapes=`` as a list of int tuples ((m, n) or (*batch, m, n)); None passes through.
    Raises: ValueError naming shapes."""
    if shapes is None:
        return None
    try:
        out = [tuple(int(d) for d in sh) for sh in shapes]
    except (TypeError, ValueError):
        raise ValueError(f"shapes: expected a list of (m, n) or (*batch, m, n) tuples, got {shapes!r}") from None
    if not out or any(len(sh) < 2 or min(sh) < 1 for sh in out):
        raise ValueError(f"shapes: expected a non-empty list of (m, n) or (*batch, m, n) tuples of dims >= 1, "
                         f"got {shapes!r}")
    return out


#: (family, parameters, shape, scale) of the default inputs: every family, tall / wide /
#: square, uneven row counts (a shard-offset bug needs m % shards != 0), one and two batch dims
#: with per-matrix scales, 1 × 1 and 1 × n, the extreme scales (scale "max" = MAX_SCALE), and
#: ‖G‖_F ≈ 1.6e-5, where the normalization's eps matters (eps = 1e-3 for 1e-7 shrinks σ̂ 60-fold;
#: in bfloat16 only this input catches it).
DEFAULT_SPECS = (
    ("geometric", {"log_cond": 2.0}, (37, 16), 1.0),
    ("geometric", {"log_cond": 2.0}, (12, 29), 1.0),
    ("geometric", {"log_cond": 1.0}, (24, 24), 1.0),
    ("geometric", {"log_cond": 1.0}, (3, 22, 10), 1.0),
    ("geometric", {"log_cond": 1.0}, (2, 2, 6, 9), 1.0),
    ("geometric", {"log_cond": 8.0}, (20, 20), 1.0),
    ("clustered", {"clusters": 3, "log_cond": 2.0, "spread": 1e-3}, (30, 18), 1.0),
    ("rank_deficient", {"rank_fraction": 0.5, "log_cond": 2.0}, (18, 26), 1.0),
    ("dynamic_range", {"log_cond": 20.0}, (16, 16), 1.0),
    ("flat", {}, (28, 12), 1.0),
    ("two_level", {"top_fraction": 0.5, "log_gap": 3.0}, (14, 22), 1.0),
    ("geometric", {"log_cond": 1.0}, (17, 9), 1e-30),
    ("geometric", {"log_cond": 1.0}, (9, 17), "max"),
    ("geometric", {"log_cond": 0.0}, (1, 1), 3.0),
    ("geometric", {"log_cond": 0.0}, (1, 6), 1.0),
    ("geometric", {"log_cond": 1.0}, (20, 12), 1e-5),
)


def _batch_limit(batched: bool, max_batch_dims: int | None) -> int | None:
    """The largest number of leading batch dims to feed: None (any), from ``max_batch_dims``
    or ``batched`` (False: 0). Raises: ValueError naming max_batch_dims for a negative value."""
    if max_batch_dims is not None:
        if not (isinstance(max_batch_dims, int) and max_batch_dims >= 0):
            raise ValueError(f"max_batch_dims: expected an integer >= 0 or None, got {max_batch_dims!r}")
        return max_batch_dims if batched else 0
    return None if batched else 0


def default_examples(dtype="float32", seed: int = 0, batched: bool = True,
                     max_batch_dims: int | None = None, *, compute_dtype=None,
                     shapes=None) -> list[SpectralExample]:
    """The inputs ``check_orthogonalizer`` uses by default (``DEFAULT_SPECS``), deterministic for a seed.

    Example i has seed ``seed + i``; the list is grouped by shape (a compiled kernel compiles once per shape).
    With float16 on either side the scales stay in float16's range (``FLOAT16_MIN_SCALE``, ``MAX_SCALE``).

    Parameters
    ----------
    dtype : torch.dtype or str, default "float32"
        The input dtype: float64, float32, bfloat16 or float16.
    seed : int, default 0
        Seed of the first example.
    batched, max_batch_dims : bool, int, default True, None
        False: no batched inputs; at most ``max_batch_dims`` leading batch dimensions.
    compute_dtype : torch.dtype or str, optional
        The precision the kernel computes in, when it differs from ``dtype``.
    shapes : list of tuple of int, optional
        ``(m, n)`` or ``(*batch, m, n)``: every spec drawn at each of these shapes instead of its own.

    Returns
    -------
    list of SpectralExample
        Each with its matrix (or batch) in ``dtype`` and its provenance.

    Raises
    ------
    TypeError
        If ``dtype`` is not float64, float32, bfloat16 or float16.
    ValueError
        If ``max_batch_dims`` is negative or ``shapes`` is malformed.

    References
    ----------
    docs/checks.md, "check_orthogonalizer"; ``ortho_verify.strategies`` (the spectrum families).

    Examples
    --------
    >>> from ortho_verify import default_examples
    >>> all(ex.matrix.ndim == 2 for ex in default_examples("float32", batched=False))
    True
    """
    name = _ns_dtype_name(dtype)
    compute = compute_name(dtype, compute_dtype)
    limit = _batch_limit(batched, max_batch_dims)
    wanted = _check_shapes(shapes)
    out = []
    for i, (kind, params, shape, scale) in enumerate(DEFAULT_SPECS):
        for sh in [shape] if wanted is None else wanted:
            if limit is None or len(sh) - 2 <= limit:
                out.append(build_example(kind, params, shape=sh, scale=input_scale(scale, name, compute), dtype=name,
                                         seed=seed + i))
    return sorted(out, key=lambda ex: _shape_key(ex.matrix.shape))  # stable: spec order within a shape


def _to_host(out: torch.Tensor) -> torch.Tensor:
    """A kernel's output on the CPU (the oracle's side), synchronizing the device."""
    return out.detach().cpu() if out.device.type != "cpu" else out


def check_orthogonalizer_example(fn: Callable, example: SpectralExample, *, coefficients="jordan", dtype=None,
                                 steps: int | None = None, safety: float | None = None, eps: float | None = None,
                                 eps_mode: str = "add", record: list | None = None,
                                 timeout_s: float | None = DEFAULT_TIMEOUT_S, compute_dtype=None,
                                 form: str = "standard", restarts=None, device=None) -> list[CheckResult]:
    """Run ``fn`` on one ``SpectralExample`` and compare each output matrix with ``ortho_ref.ns_map``.

    The building block of ``check_orthogonalizer`` for hypothesis tests: rows ``orthogonalizer_runs``,
    ``input_unchanged``, ``output_shape``, then per matrix ``ns_vs_ns_map`` and ``spread_in_band`` (docs/checks.md).

    Parameters
    ----------
    fn : callable
        Maps a ``(..., m, n)`` tensor to its Newton–Schulz result of the same shape.
    example : SpectralExample
        The input (``default_examples``, ``ortho_verify.strategies``).
    coefficients, dtype, steps, safety, eps, eps_mode : optional
        As ``check_orthogonalizer``; ``dtype`` defaults to the example's.
    record : list, optional
        If given, each compared matrix's measurements are appended to it.
    timeout_s, compute_dtype, form, restarts, device : optional
        As ``check_orthogonalizer``.

    Returns
    -------
    list of CheckResult
        One row per check and matrix.

    Raises
    ------
    TypeError
        If ``dtype`` is not float64, float32, bfloat16, float16 or "high".
    ValueError
        If ``form``, ``restarts`` or ``device`` is invalid.

    References
    ----------
    Amsel et al. 2025, "The Polar Express", arXiv 2505.16932, Sec. 2.

    Examples
    --------
    >>> from ortho_verify import check_orthogonalizer_example, default_examples
    >>> import ortho_fast
    >>> rows = check_orthogonalizer_example(lambda g: ortho_fast.newton_schulz(g, dtype=g.dtype),
    ...                                     default_examples("float32")[0])
    >>> all(row.passed for row in rows)
    True
    """
    compute = compute_name(example.dtype if dtype is None else dtype, compute_dtype)
    table, safety, eps = table_and_normalization(coefficients, steps, safety, eps)
    form, restarts = _form(form, restarts, len(table))
    dev = resolve_device(device)
    x = example.tensor().to(dev)
    pristine = x.clone()
    status, out = call_with_timeout(fn, x, timeout_s)
    if status == "timeout":
        return [with_cause(measured("orthogonalizer_runs", example.name, "fn(input)", math.inf, 0.0,
                                    f"did not return within {timeout_s:g} s"),
                           f"the kernel did not return within timeout_s = {timeout_s:g} s (a hang or an endless loop)")]
    if status == "raised":  # a crash is a failed check, reported with its input
        return [raised_row(out, x, example.name, "fn(input)")]
    rows = [measured("input_unchanged", example.name, "fn must not modify its input",
                     float((_to_host(x).double() - _to_host(pristine).double()).abs().max()), 0.0)]
    if not isinstance(out, torch.Tensor) or out.shape != x.shape:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return rows + [measured("output_shape", example.name, f"expected {tuple(x.shape)}", math.inf, 0.0,
                                f"got {shape}")]
    result = _as_f64(_to_host(out)).reshape(-1, *x.shape[-2:])
    detail = f"{compute}{'' if form == 'standard' else f' gram restarts {list(restarts)}'}, {len(table)} steps" + \
        ("" if dev.type == "cpu" else f", {dev}")
    for case, fast in zip(example.cases(), result):
        rows += compare_ns_output(fast, case.matrix, table, safety=safety, eps=eps, eps_mode=eps_mode, dtype=compute,
                                  input_name=case.name, detail=detail, record=record, form=form, restarts=restarts)
    return rows


def _form(form: str, restarts, steps: int) -> tuple[str, tuple[int, ...]]:
    """(form, restarts) checked: form in ``NS_FORMS``; restarts only with "gram" (0-based step indices).
    Raises: ValueError naming form or restarts."""
    if form not in NS_FORMS:
        raise ValueError(f"form: expected one of {NS_FORMS}, got {form!r}")
    if form == "standard" and restarts:
        raise ValueError(f"restarts: only a Gram kernel restarts (form='gram'), got restarts={restarts!r} with "
                         "form='standard'")
    return form, validate_restarts(restarts, steps)


def check_orthogonalizer_statistics(fn: Callable, batch: StatisticalBatch, *, coefficients="jordan", dtype=None,
                                    steps: int | None = None, safety: float | None = None, eps: float | None = None,
                                    eps_mode: str = "add", batched: bool = True,
                                    timeout_s: float | None = DEFAULT_TIMEOUT_S, compute_dtype=None,
                                    device=None, form: str = "standard", restarts=None) -> list[CheckResult]:
    """``ns_mean_deviation`` of ``fn`` on a ``StatisticalBatch`` (one (J, m, n) call when ``batched``, else J calls),
    or ``orthogonalizer_runs`` failed; arguments as ``check_orthogonalizer`` (docs/checks.md,
    "check_orthogonalizer"). Raises: TypeError for a dtype outside bfloat16 / float16 / float32; ValueError for a
    bad form or restarts.
    """
    name = dtype_name(dtype, ("bfloat16", "float16", "float32"))
    compute = name if compute_dtype is None else dtype_name(compute_dtype, ("bfloat16", "float16", "float32"),
                                                            "compute_dtype")
    table, safety, eps = table_and_normalization(coefficients, steps, safety, eps)
    form, restarts = _form(form, restarts, len(table))
    dev = resolve_device(device)
    x = torch.from_numpy(batch.matrices).to(getattr(torch, name)).to(dev)
    calls = [x] if batched else list(x)
    outs = []
    for one in calls:
        status, out = call_with_timeout(fn, one, timeout_s)
        if status == "raised":
            return [raised_row(out, one, batch.name, "fn(statistical batch)")]
        if status != "ok" or not isinstance(out, torch.Tensor) or out.shape != one.shape:
            why = f"did not return within {timeout_s:g} s" if status == "timeout" else \
                f"returned {type(out).__name__} of the wrong shape"
            return [measured("orthogonalizer_runs", batch.name, "fn(statistical batch)", math.inf, 0.0, why)]
        outs.append(_as_f64(_to_host(out)))
    fast = outs[0] if batched else torch.stack([torch.from_numpy(o) for o in outs]).numpy()
    return [compare_ns_statistics(fast, batch.matrices, table, safety=safety, eps=eps, dtype=compute,
                                  eps_mode=eps_mode, input_name=batch.name, form=form, restarts=restarts,
                                  detail=f"{compute}{'' if form == 'standard' else f' gram restarts {list(restarts)}'}"
                                         f", {len(table)} steps" + ("" if dev.type == "cpu" else f", {dev}"))]


def check_orthogonalizer(fn: Callable, *, coefficients="jordan", dtype=torch.float32, steps: int | None = None,
                         safety: float | None = None, eps: float | None = None, eps_mode: str = "add",
                         examples: list[SpectralExample] | None = None, seed: int = 0,
                         batched: bool = True, max_batch_dims: int | None = None,
                         timeout_s: float | None = DEFAULT_TIMEOUT_S, statistical: bool | None = None,
                         compute_dtype=None, form: str = "standard", restarts=None, shapes=None,
                         device=None, allow_side_effects=()) -> VerificationReport:
    """Check a Newton–Schulz function against the exact oracle.

    ``fn(G)`` runs on inputs of every spectrum family, shape and scale (``default_examples``) and each output
    matrix is compared with ``ortho_ref.ns_map``, the declared schedule applied to X₀ = G / (safety·‖G‖_F + eps):
    in the Frobenius norm in float64 / float32, per singular direction and statistically in bfloat16, float16
    and TF32 (docs/tolerances.md). Inputs, options and rows in detail: docs/checks.md, "check_orthogonalizer".

    Parameters
    ----------
    fn : callable
        Maps a ``(..., m, n)`` tensor to its Newton–Schulz result (same shape; leading dims independent).
    coefficients : str or (T, 3) sequence of float, default "jordan"
        A schedule name of ``ortho_ref.SCHEDULES`` or the per-step odd-quintic rows (a, b, c).
    dtype : torch.dtype or str, default torch.float32
        The input dtype: float64, float32, bfloat16, float16 or "high" (TF32: float32 storage).
    steps, safety, eps : int, float, float, optional
        Step count, safety divisor and eps of the normalization (default: the schedule's, else T, 1, 1e-7).
    eps_mode : {"add", "clamp"}, default "add"
        X₀ = G / (safety·‖G‖_F + eps), or G / max(safety·‖G‖_F, eps) as torch.optim.Muon.
    examples, seed : list of SpectralExample, int, default None, 0
        Inputs replacing ``default_examples(dtype, seed)``; the seed of the default inputs.
    batched, max_batch_dims : bool, int, default True, None
        False: 2-D inputs only; at most ``max_batch_dims`` leading batch dimensions.
    timeout_s : float or None, default DEFAULT_TIMEOUT_S
        Seconds one call may take; past it the example fails ``orthogonalizer_runs``. None: no limit.
    statistical : bool, optional
        Add ``ns_mean_deviation`` on batches of 256 matrices (default: on for the default inputs).
    compute_dtype : torch.dtype or str, optional
        The precision ``fn`` computes in when it differs from ``dtype`` (e.g. bfloat16 on float32 inputs).
    form, restarts : {"standard", "gram"}, sequence of int, default "standard", ()
        "gram": Gram Newton–Schulz with X ← QX, R ← XXᵀ before the 0-based ``restarts`` steps.
    shapes : list of tuple of int, optional
        ``(m, n)`` or ``(*batch, m, n)`` shapes at which the default families are drawn (compiled kernels).
    device : str or torch.device, optional
        Where ``fn`` runs (default CPU); outputs return to the CPU, where the oracle runs.
    allow_side_effects : iterable of str, default ()
        Side effects accepted explicitly, e.g. ``{"input_mutated"}``: their rows make no claim.

    Returns
    -------
    VerificationReport
        ``status`` "passed", "failed" or "inconclusive"; ``failures`` with reproducing inputs; ``kinds``.

    Raises
    ------
    TypeError
        If ``fn`` is not callable or a dtype is not one of the above (before ``fn`` runs).
    ValueError
        If the schedule, a batch limit, ``form``, ``restarts``, ``shapes``, ``device`` or ``allow_side_effects``
        is invalid, or no example is left. What ``fn`` raises is a failed row, not raised.

    References
    ----------
    Amsel et al. 2025, "The Polar Express", arXiv 2505.16932, Sec. 2; Dao AI Lab, gram-newton-schulz (2025).

    Examples
    --------
    >>> from ortho_verify import check_orthogonalizer
    >>> import ortho_fast
    >>> report = check_orthogonalizer(lambda g: ortho_fast.newton_schulz(g, dtype=g.dtype), coefficients="jordan")
    >>> report.status
    'passed'
    """
    if not callable(fn):  # before any work: None is a missing argument, not a failing kernel
        raise TypeError(f"fn: expected a callable mapping a (..., m, n) tensor to its Newton–Schulz result, got "
                        f"{type(fn).__name__}")
    name = _ns_dtype_name(dtype)
    compute = compute_name(dtype, compute_dtype)
    table, _, _ = table_and_normalization(coefficients, steps, safety, eps)  # validate before running anything
    form, restarts = _form(form, restarts, len(table))
    dev = resolve_device(device)
    wanted = _check_shapes(shapes)
    accept_side_effects([], allow_side_effects)  # ValueError naming allow_side_effects
    limit = _batch_limit(batched, max_batch_dims)
    # default: on with the default inputs, for kernels that take a batch (a (J, m, n) batch is one
    # input of the report; a 2-D-only kernel's report holds matrices only unless it asks for them)
    statistical = (examples is None and limit != 0) if statistical is None else statistical
    check_examples(examples)
    check_seed(seed)
    examples = default_examples(name, seed, batched, max_batch_dims, compute_dtype=compute_dtype, shapes=wanted) \
        if examples is None else [ex for ex in examples if limit is None or ex.matrix.ndim - 2 <= limit]
    if not examples:
        raise ValueError("examples: expected at least one SpectralExample (2-D when batched=False)")
    options = dict(coefficients=coefficients, steps=steps, safety=safety, eps=eps, eps_mode=eps_mode,
                   timeout_s=timeout_s)
    results, inputs, shapes = [], {}, {}
    for ex in examples:
        rows = check_orthogonalizer_example(fn, ex, dtype=name, compute_dtype=compute, form=form, restarts=restarts,
                                            device=dev, **options)
        results += rows
        shapes[ex.name] = (*ex.matrix.shape[-2:], ex.matrix.ndim - 2)
        for case in ex.cases():  # the matrices fn received (rounded to the input dtype)
            inputs[case.name] = ({"input": case.matrix}, ex.provenance + REPLAY_HINT)
            shapes[case.name] = (*ex.matrix.shape[-2:], ex.matrix.ndim - 2)
        inputs.setdefault(ex.name, ({"input": _as_f64(ex.tensor())}, ex.provenance + REPLAY_HINT))  # a whole batch
    if statistical and name in STATISTICAL_INPUTS and compute in STATISTICAL_INPUTS:
        stat_shape = None if wanted is None else wanted[0][-2:]
        for batch in _statistical_batches(name, compute, seed, stat_shape):
            results += check_orthogonalizer_statistics(fn, batch, dtype=name, compute_dtype=compute, device=dev,
                                                       batched=limit is None or limit >= 1, form=form,
                                                       restarts=restarts, **options)
            inputs[batch.name] = ({"input": batch.matrices}, batch.provenance + REPLAY_HINT)
    kernel = f"{compute}" + ("" if compute == name else f" on {name} inputs") + \
        ("" if form == "standard" else f", gram restarts {list(restarts)}")
    subject = f"{getattr(fn, '__name__', type(fn).__name__)} " \
              f"({coefficients if isinstance(coefficients, str) else 'table'}, {kernel})"
    results = confined_cause(results, shapes)  # one orientation / one number of batch dims: said in the cause
    return VerificationReport(subject, accept_side_effects(results, allow_side_effects), inputs,
                              device_label(describe_device(dev)))


#: Input dtypes and compute precisions with a statistical row (``ortho_verify.tolerances.statistical``).
STATISTICAL_INPUTS = ("bfloat16", "float16", "float32")


def _statistical_batches(name: str, compute: str, seed: int, shape=None) -> list[StatisticalBatch]:
    """``statistical_batches(name, seed)``, at ``shape`` (m, n) when given, without the ‖G‖_F = 1.6e-5
    batch when float16 is the input or compute dtype (its entries fall below float16's normal range,
    which the statistical model does not cover)."""
    out = []
    for i, (lc, sh, norm, count) in enumerate(STATISTICAL_SPECS):
        if norm is not None and "float16" in (name, compute):
            continue
        out.append(statistical_batch(lc, tuple(shape) if shape is not None else sh, norm, count, name, seed + 1000 + i))
    return out


#: Appended to the provenance of every input of ``check_orthogonalizer``: how to replay a failure
#: (a Python comment, so the provenance stays an expression that rebuilds the input).
REPLAY_HINT = "  # replay: ortho_verify.replay_example(fn, failure, <the check's arguments>)"
