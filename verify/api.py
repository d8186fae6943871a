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
import threading
from typing import Callable

import torch

from ortho_verify.arrays import as_float64 as _as_f64
from ortho_verify.checks.diagnoses import with_cause
from ortho_verify.checks.newton_schulz import compare_ns_output
from ortho_verify.checks.statistical import (StatisticalBatch, compare_ns_statistics, statistical_batch,
                                             statistical_batches)
from ortho_verify.conventions import (DION, ORTHO_MUON, TORCH_MUON, DionConventions, MuonConventions, dtype_name,
                                      table_and_normalization)
from ortho_verify.examples import DTYPES, MAX_SCALE, SpectralExample, build_example
from ortho_verify.optimizer_checks import DEFAULT_SHAPES, check_optimizer, optimizer_inputs
from ortho_verify.results import (CheckResult, Failure, VerificationReport, accept_side_effects, measured,
                                  user_frame)

__all__ = [
    "DEFAULT_SHAPES", "DEFAULT_SPECS", "DEFAULT_TIMEOUT_S", "DION", "DionConventions", "Failure", "MuonConventions",
    "ORTHO_MUON", "call_with_timeout", "check_orthogonalizer_statistics",
    "TORCH_MUON", "VerificationReport", "check_optimizer", "check_orthogonalizer", "check_orthogonalizer_example",
    "default_examples", "dtype_name", "optimizer_inputs", "REPLAY_HINT", "replay_example",
]


def _ns_dtype_name(dtype) -> str:
    """The compute dtype of an orthogonalizer check: float64, float32 or bfloat16 (the dtypes of
    ``ortho_verify.strategies.DTYPES``, whose inputs and tolerances are defined); TypeError otherwise
    (float16 included: its range would need inputs of their own)."""
    return dtype_name(dtype, DTYPES)


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
                     max_batch_dims: int | None = None) -> list[SpectralExample]:
    """The inputs ``check_orthogonalizer`` uses by default (``DEFAULT_SPECS``), deterministic
    for a seed; example i is drawn with seed ``seed + i``. ``batched=False`` leaves out the
    inputs with batch dimensions; ``max_batch_dims=b`` those with more than b (1: a kernel that
    takes (m, n) or (b, m, n) only). Raises: TypeError for a dtype other than float64 / float32 /
    bfloat16; ValueError for a negative max_batch_dims."""
    name = _ns_dtype_name(dtype)
    limit = _batch_limit(batched, max_batch_dims)
    return [build_example(kind, params, shape=shape, scale=MAX_SCALE[name] if scale == "max" else scale, dtype=name,
                          seed=seed + i) for i, (kind, params, shape, scale) in enumerate(DEFAULT_SPECS)
            if limit is None or len(shape) - 2 <= limit]


#: Default seconds one call of the checked kernel may take before ``check_orthogonalizer``
#: fails the example (generous: a 37 × 16 float32 call takes well under a second on one core).
DEFAULT_TIMEOUT_S = 120.0


def call_with_timeout(fn: Callable, x, timeout_s: float | None):
    """``fn(x)`` in a daemon thread, waiting at most ``timeout_s`` seconds (None: no limit, in
    this thread). Returns ("ok", value), ("raised", exception) or ("timeout", None); a call that
    times out is abandoned (a thread cannot be killed; it ends with the process).
    Raises: ValueError naming timeout_s when it is not positive."""
    if timeout_s is None:
        try:
            return "ok", fn(x)
        except Exception as err:  # reported as a failed check
            return "raised", err
    if not timeout_s > 0:
        raise ValueError(f"timeout_s: expected > 0 or None, got {timeout_s!r}")
    box: dict = {}

    def run():
        try:
            box["ok"] = fn(x)
        except Exception as err:  # reported as a failed check
            box["raised"] = err

    worker = threading.Thread(target=run, daemon=True, name="ortho-verify-example")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return "timeout", None
    return ("ok", box["ok"]) if "ok" in box else ("raised", box.get("raised"))


def _batched_hint(x: torch.Tensor) -> str:
    """The note's advice when fn raised on an input with batch dims ("" for a matrix)."""
    return (f"; raised on a batched {tuple(x.shape)} input (leading dims are independent matrices): pass "
            "batched=False if your kernel is 2-D only, max_batch_dims=1 if it takes (b, m, n) at most") if x.ndim > 2 else ""


def check_orthogonalizer_example(fn: Callable, example: SpectralExample, *, coefficients="jordan", dtype=None,
                                 steps: int | None = None, safety: float | None = None, eps: float | None = None,
                                 eps_mode: str = "add", record: list | None = None,
                                 timeout_s: float | None = DEFAULT_TIMEOUT_S) -> list[CheckResult]:
    """Run ``fn`` on one ``SpectralExample`` and compare each matrix of the result with
    ``ortho_ref.ns_map`` (``ortho_verify.checks.compare_ns_output``), for use in hypothesis tests.

    ``dtype`` (default the example's): the compute dtype ``fn`` declares. Other arguments as
    ``check_orthogonalizer``. Rows: ``orthogonalizer_runs`` (fn raised; on a batched input the
    note says so and points to ``batched=False``), ``input_unchanged`` (fn modified its input;
    tolerance 0), ``output_shape``, then per matrix ``ns_vs_ns_map``, ``spread_in_band`` (and
    ``ns_projected_singular_values`` for bfloat16). ``timeout_s``: seconds fn may take
    (``DEFAULT_TIMEOUT_S``; None: no limit); past it ``orthogonalizer_runs`` fails with "did not
    return within ..." instead of hanging (``call_with_timeout``).
    Raises: TypeError for a dtype other than float64 / float32 / bfloat16.
    """
    name = _ns_dtype_name(example.dtype if dtype is None else dtype)
    table, safety, eps = table_and_normalization(coefficients, steps, safety, eps)
    x = example.tensor()
    pristine = x.clone()
    status, out = call_with_timeout(fn, x, timeout_s)
    if status == "timeout":
        return [with_cause(measured("orthogonalizer_runs", example.name, "fn(input)", math.inf, 0.0,
                                    f"did not return within {timeout_s:g} s"),
                           f"the kernel did not return within timeout_s = {timeout_s:g} s (a hang or an endless loop)")]
    if status == "raised":  # a crash is a failed check, reported with its input
        err = out
        hint = _batched_hint(x)
        frame = user_frame(err)  # issue 25: name the user's frame that raised
        return [measured("orthogonalizer_runs", example.name, "fn(input)", math.inf, 0.0,
                         f"raised {err!r}{' at ' + frame if frame else ''}{hint}")]
    rows = [measured("input_unchanged", example.name, "fn must not modify its input",
                     float((x.double() - pristine.double()).abs().max()), 0.0)]
    if not isinstance(out, torch.Tensor) or out.shape != x.shape:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return rows + [measured("output_shape", example.name, f"expected {tuple(x.shape)}", math.inf, 0.0, f"got {shape}")]
    result = _as_f64(out).reshape(-1, *x.shape[-2:])
    for case, fast in zip(example.cases(), result):
        rows += compare_ns_output(fast, case.matrix, table, safety=safety, eps=eps, eps_mode=eps_mode, dtype=name,
                                  input_name=case.name, detail=f"{name}, {len(table)} steps", record=record)
    return rows


def check_orthogonalizer_statistics(fn: Callable, batch: StatisticalBatch, *, coefficients="jordan", dtype=None,
                                    steps: int | None = None, safety: float | None = None, eps: float | None = None,
                                    eps_mode: str = "add", batched: bool = True,
                                    timeout_s: float | None = DEFAULT_TIMEOUT_S) -> list[CheckResult]:
    """Run ``fn`` on a ``StatisticalBatch`` (one (J, m, n) call when ``batched``, else J calls of
    (m, n)) and return the row ``ns_mean_deviation`` (``ortho_verify.checks.compare_ns_statistics``;
    docs/verification.md, "Statistical power in low precision"), or ``orthogonalizer_runs`` failed
    when fn raised or timed out. ``dtype``: bfloat16, float16 or float32 (the batch's values must
    be representable in it: ``statistical_batch(..., dtype)``). Other arguments as
    ``check_orthogonalizer``.
    Raises: TypeError for a dtype outside the statistical model's (float64 has none)."""
    name = dtype_name(dtype, ("bfloat16", "float16", "float32"))
    table, safety, eps = table_and_normalization(coefficients, steps, safety, eps)
    x = torch.from_numpy(batch.matrices).to(getattr(torch, name))
    calls = [x] if batched else list(x)
    outs = []
    for one in calls:
        status, out = call_with_timeout(fn, one, timeout_s)
        if status != "ok" or not isinstance(out, torch.Tensor) or out.shape != one.shape:
            why = f"did not return within {timeout_s:g} s" if status == "timeout" else \
                f"raised {out!r}{' at ' + user_frame(out) if user_frame(out) else ''}{_batched_hint(one)}" \
                if status == "raised" else \
                f"returned {type(out).__name__} of the wrong shape"
            return [measured("orthogonalizer_runs", batch.name, "fn(statistical batch)", math.inf, 0.0, why)]
        outs.append(_as_f64(out))
    fast = outs[0] if batched else torch.stack([torch.from_numpy(o) for o in outs]).numpy()
    return [compare_ns_statistics(fast, batch.matrices, table, safety=safety, eps=eps, dtype=name, eps_mode=eps_mode,
                                  input_name=batch.name, detail=f"{name}, {len(table)} steps")]


def check_orthogonalizer(fn: Callable, *, coefficients="jordan", dtype=torch.float32, steps: int | None = None,
                         safety: float | None = None, eps: float | None = None, eps_mode: str = "add",
                         examples: list[SpectralExample] | None = None, seed: int = 0,
                         batched: bool = True, max_batch_dims: int | None = None,
                         timeout_s: float | None = DEFAULT_TIMEOUT_S, statistical: bool | None = None,
                         allow_side_effects=()) -> VerificationReport:
    """Check a Newton–Schulz function against the exact oracle.

    ``fn`` maps a (..., m, n) tensor to its Newton–Schulz result of the same shape (leading dims
    are independent matrices, each normalized by its own Frobenius norm). It is called on
    ``default_examples(dtype, seed)`` (every spectrum family of ``ortho_verify.strategies``, tall / wide
    / square / batched, scales 1e-30 to ``MAX_SCALE``, ‖G‖_F ≈ 1.6e-5 where eps matters; with
    ``batched=False`` only the 2-D ones, for a kernel that takes one (m, n) matrix; with
    ``max_batch_dims=1`` at most one batch dim, for a kernel that takes (m, n) or (b, m, n)), given in
    the compute ``dtype`` itself (float64, float32 or bfloat16: the kernel sees the tensors it sees
    in training, so in-place work on its input is caught by ``input_unchanged``), and each output matrix is compared with ``ortho_ref.ns_map`` for the
    declared ``coefficients`` (a registry name or a (T, 3) table; ``steps`` truncates / extends
    it), normalization X₀ = G/(safety‖G‖_F + eps) (``eps_mode="clamp"``: /max(safety‖G‖_F, eps);
    defaults from the named schedule, else 1 and 1e-7) and compute ``dtype`` (float64, float32:
    Frobenius ``ns_tolerance``; bfloat16: per-direction singular values). ``timeout_s``: seconds
    one call of ``fn`` may take (default ``DEFAULT_TIMEOUT_S``; None: no limit): a call past it
    fails its example (``orthogonalizer_runs``, "did not return within ...") and the check goes on.
    ``statistical`` (bfloat16 and float32; default: True unless ``examples`` are given, which are
    then the only inputs, or ``batched=False`` / ``max_batch_dims=0``): also the row ``ns_mean_deviation`` on each
    batch of ``ortho_verify.checks.statistical.STATISTICAL_SPECS`` (256 matrices of one spectrum: the
    mean signed deviation per direction at a false-alarm probability of 1e-6;
    ``check_orthogonalizer_statistics``); its batches are given as (J, m, n) when ``max_batch_dims``
    allows one batch dim, else one matrix per call.
    Failed rows carry a ``cause`` in words (``CheckResult.cause``, also at the head of the note).
    ``allow_side_effects``: e.g. {"input_mutated"} accepts a kernel that writes into its input
    (``ortho_verify.results.accept_side_effects``; issue 25); kinds of failure: ``report.kinds``.
    Returns: ``VerificationReport`` (``status`` passed / failed / inconclusive, ``failures`` with
    reproducing inputs, ratios; bfloat16 rows whose tolerance admits the zero output make no claim).
    Raises: TypeError for a dtype other than float64 / float32 / bfloat16 (float16 included);
    ValueError for an unknown schedule, a bad table, a negative ``max_batch_dims``, or no example
    left (``examples`` empty, or only batched ones with ``batched=False``) — exceptions raised by ``fn`` are reported as failed
    checks instead.
    Source: the polynomial view of Newton–Schulz, Amsel et al. 2025 (arXiv 2505.16932), Sec. 2.
    """
    name = _ns_dtype_name(dtype)
    table_and_normalization(coefficients, steps, safety, eps)  # validate before running anything
    accept_side_effects([], allow_side_effects)  # ValueError naming allow_side_effects
    limit = _batch_limit(batched, max_batch_dims)
    # default: on with the default inputs, for kernels that take a batch (a (J, m, n) batch is one
    # input of the report; a 2-D-only kernel's report holds matrices only unless it asks for them)
    statistical = (examples is None and limit != 0) if statistical is None else statistical
    examples = default_examples(name, seed, batched, max_batch_dims) if examples is None else \
        [ex for ex in examples if limit is None or ex.matrix.ndim - 2 <= limit]
    if not examples:
        raise ValueError("examples: expected at least one SpectralExample (2-D when batched=False)")
    results, inputs = [], {}
    for ex in examples:
        rows = check_orthogonalizer_example(fn, ex, coefficients=coefficients, dtype=name, steps=steps, safety=safety,
                                            eps=eps, eps_mode=eps_mode, timeout_s=timeout_s)
        results += rows
        for case in ex.cases():  # the matrices fn received (rounded to the input dtype)
            inputs[case.name] = ({"input": case.matrix}, ex.provenance + REPLAY_HINT)
        inputs.setdefault(ex.name, ({"input": _as_f64(ex.tensor())}, ex.provenance + REPLAY_HINT))  # a whole batch
    if statistical and name in ("bfloat16", "float32"):
        for batch in statistical_batches(name, seed):
            results += check_orthogonalizer_statistics(fn, batch, coefficients=coefficients, dtype=name, steps=steps,
                                                       safety=safety, eps=eps, eps_mode=eps_mode,
                                                       batched=limit is None or limit >= 1, timeout_s=timeout_s)
            inputs[batch.name] = ({"input": batch.matrices}, batch.provenance + REPLAY_HINT)
    subject = f"{getattr(fn, '__name__', type(fn).__name__)} ({coefficients if isinstance(coefficients, str) else 'table'}, {name})"
    return VerificationReport(subject, accept_side_effects(results, allow_side_effects), inputs)


#: Appended to the provenance of every input of ``check_orthogonalizer``: how to replay a failure
#: (a Python comment, so the provenance stays an expression that rebuilds the input).
REPLAY_HINT = "  # replay: ortho_verify.replay_example(fn, failure, <the check's arguments>)"

#: The provenance calls ``replay_example`` rebuilds (no other code is evaluated).
_REBUILDERS = {"ortho_verify.strategies.build_example": build_example,
               "ortho_verify.examples.build_example": build_example,
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
    ``check_orthogonalizer`` and must be the ones the report was made with.
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
        rows = check_orthogonalizer_statistics(fn, built, dtype=dtype if dtype is not None else args[4], **options)
    else:
        rows = check_orthogonalizer_example(fn, built, dtype=dtype, **options)
    chosen = [r for r in rows if (check is None or r.check == check) and (input_name is None or r.input == input_name)]
    return chosen or rows
