"""Check someone else's implementation: ``check_orthogonalizer`` and ``check_optimizer``.

Both run the implementation on inputs with known spectra, compare every result with the exact
oracle (``ortho_ref``) under the tolerances of ``ortho_verify.tolerances``, and return a
``VerificationReport``: ``passed`` (False too when the report is inconclusive: nothing failed
but some check compared nothing), the ``failures`` with the input that reproduces each, and
error/tolerance for every case. A ten-line pytest test (``batched=False`` for a kernel that
takes one (m, n) matrix only)::

    import torch
    from ortho_verify import check_orthogonalizer

    def my_newton_schulz(g):                      # (..., m, n) -> (..., m, n)
        ...

    def test_my_newton_schulz():
        report = check_orthogonalizer(my_newton_schulz, coefficients="jordan", dtype=torch.float32)
        assert report.passed, report.summary()
"""

from __future__ import annotations

import ast
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
    "default_examples", "dtype_name", "input_scale", "optimizer_inputs", "REPLAY_HINT", "replay_example",
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
    """The inputs ``check_orthogonalizer`` uses by default (``DEFAULT_SPECS``), deterministic
    for a seed; example i is drawn with seed ``seed + i``, grouped by shape ((m, n), then batch
    dims; a compiled kernel compiles once per shape). ``batched=False`` leaves out the
    inputs with batch dimensions; ``max_batch_dims=b`` those with more than b (1: a kernel that
    takes (m, n) or (b, m, n) only). ``shapes`` (a list of (m, n) or (*batch, m, n)): every spec's
    family and scale drawn at each of these shapes instead of its own (spec i at shape j with seed
    ``seed + i``), for a kernel compiled for a few shapes. ``compute_dtype``: the precision the
    kernel computes in, when it differs from the input ``dtype``; with float16 on either side the
    scales are clipped into float16's range (``FLOAT16_MIN_SCALE``, ``MAX_SCALE``).
    Raises: TypeError for a dtype other than float64 / float32 / bfloat16 / float16; ValueError for a
    negative max_batch_dims or bad shapes."""
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
    """Run ``fn`` on one ``SpectralExample`` and compare each matrix of the result with
    ``ortho_ref.ns_map`` (``ortho_verify.checks.compare_ns_output``), for use in hypothesis tests.

    ``dtype`` (default the example's): the compute dtype ``fn`` declares. Other arguments as
    ``check_orthogonalizer``. Rows: ``orthogonalizer_runs`` (fn raised; on a batched input the
    note says so and points to ``batched=False``), ``input_unchanged`` (fn modified its input;
    tolerance 0), ``output_shape``, then per matrix ``ns_vs_ns_map``, ``spread_in_band`` (and
    ``ns_projected_singular_values`` for bfloat16 / float16 / tf32), or ``recompile_limit`` (a compiled
    kernel hit dynamo's recompile limit: not judged, the fix in the note). ``timeout_s``: seconds fn may take
    (``DEFAULT_TIMEOUT_S``; None: no limit); past it ``orthogonalizer_runs`` fails with "did not
    return within ..." instead of hanging (``call_with_timeout``). ``compute_dtype``, ``form``,
    ``restarts``, ``device``: as ``check_orthogonalizer`` (the input is made on the CPU and moved to
    ``device``; the output is moved back).
    Raises: TypeError for a dtype other than float64 / float32 / bfloat16 / float16 ("high": tf32);
    ValueError for a bad form, restarts or device.
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
    """Run ``fn`` on a ``StatisticalBatch`` (one (J, m, n) call when ``batched``, else J calls of
    (m, n)) and return the row ``ns_mean_deviation`` (``ortho_verify.checks.compare_ns_statistics``;
    docs/verification.md, "Statistical power in low precision"), or ``orthogonalizer_runs`` failed
    when fn raised or timed out. ``dtype``: bfloat16, float16 or float32 (the batch's values must
    be representable in it: ``statistical_batch(..., dtype)``). ``compute_dtype``: the precision
    the kernel computes in when it differs from ``dtype`` (the input dtype; bfloat16, float16 or
    float32). ``device``: where fn runs (the batch is moved there, the outputs back). ``form="gram"``
    with ``restarts``: a Gram kernel, judged with its own rounding model (``gram_rounding_moments``).
    Other arguments as ``check_orthogonalizer``.
    Raises: TypeError for a dtype outside the statistical model's (float64 and tf32 have none);
    ValueError for a bad form or restarts."""
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

    ``fn`` maps a (..., m, n) tensor to its Newton–Schulz result of the same shape (leading dims
    are independent matrices, each normalized by its own Frobenius norm). It is called on
    ``default_examples(dtype, seed)`` (every spectrum family of ``ortho_verify.strategies``, tall / wide
    / square / batched, scales 1e-30 to ``MAX_SCALE``, ‖G‖_F ≈ 1.6e-5 where eps matters; with
    ``batched=False`` only the 2-D ones, for a kernel that takes one (m, n) matrix; with
    ``max_batch_dims=1`` at most one batch dim, for a kernel that takes (m, n) or (b, m, n)), grouped by
    shape, given in the input ``dtype`` (float64, float32, bfloat16 or float16: the kernel sees the
    tensors it sees in training, so in-place work on its input is caught by ``input_unchanged``), and
    each output matrix is compared with ``ortho_ref.ns_map`` for the
    declared ``coefficients`` (a registry name or a (T, 3) table; ``steps`` truncates / extends
    it), normalization X₀ = G/(safety‖G‖_F + eps) (``eps_mode="clamp"``: /max(safety‖G‖_F, eps);
    defaults from the named schedule, else 1 and 1e-7) and the compute precision: ``compute_dtype``
    when given (a kernel that takes float32 and computes in bfloat16 is judged with bfloat16's
    model: ``dtype=torch.float32, compute_dtype=torch.bfloat16``), else ``dtype``; "high" (as
    ``dtype`` or ``compute_dtype``) is TF32: float32 storage, products of 10-bit operands. float64,
    float32: Frobenius ``ns_tolerance``; bfloat16, float16, tf32: per-direction singular values
    (docs/tolerances.md). With float16 on either side the scales stay in float16's range
    (``FLOAT16_MIN_SCALE`` to ``MAX_SCALE["float16"]``).
    ``form="gram"``: the kernel is Gram Newton–Schulz (iterates R = XXᵀ and Q, touching X only at the
    ``restarts``, 0-based step indices before which X ← QX and R ← XXᵀ, e.g. ``(2,)`` for Dao AI Lab's
    gram-newton-schulz; default none), the same map judged with the Gram rounding model
    (``ns_gram_singular_value_tolerances`` / ``ns_gram_tolerance``).
    ``shapes``: a list of (m, n) or (*batch, m, n): the default families drawn at these shapes only,
    for a kernel compiled for a few shapes (``torch.compile(dynamic=False)``); a kernel that hits
    dynamo's recompile limit fails the row ``recompile_limit`` with the fix, not a wrong-result row.
    ``device`` (str or torch.device, default CPU): where fn runs; the inputs are made on the CPU in
    float64, rounded to ``dtype``, moved there, and the outputs moved back to the CPU, where the oracle
    runs; the report's subject names the device, its name and the torch / CUDA versions.
    ``timeout_s``: seconds one call of ``fn`` may take (default ``DEFAULT_TIMEOUT_S``; None: no
    limit): a call past it fails its example (``orthogonalizer_runs``, "did not return within ...")
    and the check goes on.
    ``statistical`` (computing in bfloat16, float16 or float32, either form; default: True unless
    ``examples`` are given, which are then the only inputs, or ``batched=False`` / ``max_batch_dims=0``):
    also the row ``ns_mean_deviation`` on each batch of ``ortho_verify.checks.statistical.STATISTICAL_SPECS``
    (256 matrices of one spectrum: the mean signed deviation per direction at a false-alarm probability
    of 1e-6; ``check_orthogonalizer_statistics``; in float16 without the ‖G‖_F = 1.6e-5 batch, whose
    entries are subnormal; a Gram kernel's row uses its own rounding model, ``gram_rounding_moments``
    with the declared ``restarts``); its batches are given as (J, m, n) when ``max_batch_dims`` allows one
    batch dim, else one matrix per call; with ``shapes`` they take the first shape's (m, n).
    Failed rows carry a ``cause`` in words (``CheckResult.cause``, also at the head of the note).
    ``allow_side_effects``: e.g. {"input_mutated"} accepts a kernel that writes into its input
    (``ortho_verify.report.results.accept_side_effects``); kinds of failure: ``report.kinds``.
    Returns: ``VerificationReport`` (``status`` passed / failed / inconclusive, ``failures`` with
    reproducing inputs, ratios; low-precision rows whose tolerance admits the zero output make no claim).
    Raises: TypeError for an ``fn`` that is not callable (None: nothing to check) or a dtype /
    compute_dtype other than float64 / float32 / bfloat16 / float16 / "high"; ValueError for an
    unknown schedule, a bad table, a negative ``max_batch_dims``, a bad ``form`` / ``restarts`` /
    ``shapes``, an unusable ``device`` (all before fn is called), or no example left (``examples``
    empty, or only batched ones with ``batched=False``) — exceptions raised by ``fn`` are reported as
    failed checks instead.
    Source: the polynomial view of Newton–Schulz, Amsel et al. 2025 (arXiv 2505.16932), Sec. 2;
    Gram Newton–Schulz: Dao AI Lab, gram-newton-schulz (2025).
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

#: The provenance calls ``replay_example`` rebuilds (no other code is evaluated).
_REBUILDERS = {"ortho_verify.strategies.build_example": build_example,
               "ortho_verify.inputs.examples.build_example": build_example,
               "ortho_verify.checks.statistical.statistical_batch": statistical_batch,
               "ortho_verify.api.optimizer_inputs": optimizer_inputs}


def _parse_provenance(provenance: str):
    """(function name, args, kwargs) of a provenance call, parsed with ``ast`` (literals only).
    Raises: ValueError naming provenance for anything else."""
    try:
        call = ast.parse(provenance.strip(), mode="eval").body
        name = ast.unparse(call.func) if isinstance(call, ast.Call) else None
        if name not in _REBUILDERS:
            raise ValueError(name)
        args = [ast.literal_eval(a) for a in call.args]
        kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    except (SyntaxError, ValueError) as err:
        raise ValueError(f"provenance: expected a call of one of {sorted(_REBUILDERS)} with literal arguments, "
                         f"got {provenance!r}") from err
    return name, args, kwargs


def replay_example(fn, failure, *, check: str | None = None, input_name: str | None = None, coefficients="jordan",
                   dtype=None, steps: int | None = None, safety: float | None = None, eps: float | None = None,
                   eps_mode: str = "add", timeout_s: float | None = DEFAULT_TIMEOUT_S, conventions=None,
                   compute_dtype=None, form: str = "standard", restarts=None, device=None,
                   **optimizer_arguments) -> list[CheckResult]:
    """Replay one failure of a report: rebuild its input from the provenance, run ``fn`` on it
    again and return the rows of the same check on the same input (the same error and tolerance
    for a deterministic ``fn``). docs/verification.md, "Replaying a failure".

    ``failure``: a ``Failure`` of ``report.failures`` (check and input taken from it) or its
    provenance string (then ``check`` and ``input_name`` select the rows; None: every row).
    ``fn``: the kernel (orthogonalizer failures: inputs of ``build_example`` or
    ``statistical_batch``) or the optimizer class (failures of ``check_optimizer``: inputs of
    ``optimizer_inputs``, with ``conventions`` and any of its other arguments such as lr,
    param_dtype in ``optimizer_arguments``). The other arguments are those of
    ``check_orthogonalizer`` (``compute_dtype``, ``form``, ``restarts``, ``device`` included) and
    must be the ones the report was made with.
    Returns: the matching ``CheckResult`` rows (all rows of the replayed input if none match).
    Raises: ValueError naming provenance when it is not a call this function rebuilds (it never
    evaluates other code); TypeError for a bad dtype, as the checks.
    """
    if isinstance(failure, Failure):
        provenance, check, input_name = failure.provenance, check or failure.result.check, \
            input_name or failure.result.input
    else:
        provenance = str(failure)
    name, args, kwargs = _parse_provenance(provenance)
    built = _REBUILDERS[name](*args, **kwargs)
    options = dict(coefficients=coefficients, steps=steps, safety=safety, eps=eps, eps_mode=eps_mode,
                   timeout_s=timeout_s)
    if name.endswith("optimizer_inputs"):
        shapes, steps_run, cond, seed = (list(args) + [kwargs.get(k) for k in ("shapes", "steps", "cond", "seed")])[:4]
        rows = check_optimizer(fn, conventions, shapes=shapes, steps=steps_run, cond=cond, seed=seed,
                               **optimizer_arguments).results
    elif isinstance(built, StatisticalBatch):
        rows = check_orthogonalizer_statistics(fn, built, dtype=args[4], device=device, form=form, restarts=restarts,
                                               compute_dtype=compute_name(args[4] if dtype is None else dtype,
                                                                          compute_dtype), **options)
    else:
        rows = check_orthogonalizer_example(fn, built, dtype=dtype, compute_dtype=compute_dtype, form=form,
                                            restarts=restarts, device=device, **options)
    chosen = [r for r in rows if (check is None or r.check == check) and (input_name is None or r.input == input_name)]
    return chosen or rows
