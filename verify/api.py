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

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

import ortho_fast
import ortho_ref
from ortho_verify import error_feedback
from ortho_verify import tolerances as tol
from ortho_verify.checks import CheckResult, as_float64 as _as_f64, compare_ns_output, dion_reference_rows, measured, verdict
from ortho_verify.spectra import matrix_with_spectrum
from ortho_verify.strategies import DTYPES, MAX_SCALE, SpectralExample, build_example

__all__ = [
    "DION", "DionConventions", "Failure", "MuonConventions", "ORTHO_MUON", "TORCH_MUON", "VerificationReport",
    "check_optimizer", "check_orthogonalizer", "check_orthogonalizer_example", "default_examples",
]

_NAMES = {torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def dtype_name(dtype, allowed=tuple(tol.UNIT_ROUNDOFF), argument: str = "dtype") -> str:
    """'float64' / 'float32' / 'bfloat16' / 'float16' for a torch dtype or such a name, if in
    ``allowed``; TypeError naming ``argument`` otherwise."""
    name = _NAMES.get(dtype, dtype)
    if name not in allowed:
        raise TypeError(f"{argument}: expected one of {sorted(allowed)} (torch dtype or name), got {dtype!r}")
    return name


def _ns_dtype_name(dtype) -> str:
    """The compute dtype of an orthogonalizer check: float64, float32 or bfloat16 (the dtypes of
    ``ortho_verify.strategies.DTYPES``, whose inputs and tolerances are defined); TypeError otherwise
    (float16 included: its range would need inputs of their own)."""
    return dtype_name(dtype, DTYPES)


def _coarser(*names: str) -> str:
    """The dtype with the largest unit roundoff: the precision a chain of operations ends up with."""
    return max(names, key=tol.unit_roundoff)


def _table_and_normalization(coefficients, steps, safety, eps) -> tuple[np.ndarray, float, float]:
    """(T, 3) table and (safety, eps): a registry name's own defaults unless overridden."""
    if isinstance(coefficients, str):
        if coefficients not in ortho_ref.SCHEDULES:
            raise ValueError(f"coefficients: unknown schedule {coefficients!r}; known: {sorted(ortho_ref.SCHEDULES)}")
        sched = ortho_ref.SCHEDULES[coefficients]
        table = ortho_ref.schedule(coefficients, steps)
        return table, sched.safety if safety is None else safety, sched.eps if eps is None else eps
    table = np.asarray(coefficients, dtype=np.float64)
    if table.ndim != 2 or table.shape[1] != 3 or len(table) == 0:
        raise ValueError(f"coefficients: expected a schedule name or a (T, 3) table, got shape {table.shape}")
    if steps is not None:
        table = np.concatenate([table[:steps], np.repeat(table[-1:], max(0, steps - len(table)), axis=0)])
    return table, 1.0 if safety is None else safety, 1e-7 if eps is None else eps


@dataclass(frozen=True)
class MuonConventions:
    """What a Muon-like optimizer computes, so that ``check_optimizer`` can build its reference.

    momentum_style: "ema" (M ← μM + (1−μ)G; torch.optim.Muon, Keller Jordan, nanochat) or
    "classic" (M ← μM + G; microsoft/dion, Moonlight); nesterov: U = mix of G and M as
    ``ortho_ref.muon_step``; coefficients: schedule name or (T, 3) table, ns_steps, safety, eps,
    eps_mode ("add": /(s‖U‖_F + eps), "clamp": /max(s‖U‖_F, eps) as torch.optim.Muon);
    adjust_lr: "original" √max(1, m/n) | "match_rms_adamw" 0.2√max(m, n) | "spectral_norm" √(m/n)
    | None; ns_dtype: the dtype the Newton–Schulz iteration runs in; momentum_state_key: the
    ``optimizer.state[p]`` key of the momentum buffer (None if it has none: the reference then
    tracks its own); hyperparameter_names: constructor keyword for each of lr, momentum,
    weight_decay; extra_kwargs: further constructor keywords.
    Weight decay is decoupled, W ← W(1 − lr·wd) with the unscaled lr (torch, dion, Moonlight).
    """

    momentum_style: str = "ema"
    nesterov: bool = True
    coefficients: object = "jordan"
    ns_steps: int | None = None
    safety: float | None = None
    eps: float | None = None
    eps_mode: str = "add"
    adjust_lr: str | None = "original"
    ns_dtype: torch.dtype = torch.bfloat16
    momentum_state_key: str | None = "momentum_buffer"
    hyperparameter_names: dict = field(default_factory=lambda: {"lr": "lr", "momentum": "momentum",
                                                                "weight_decay": "weight_decay"})
    extra_kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class DionConventions:
    """What a Dion-like optimizer computes (Ahn et al., arXiv 2504.05295, Algorithm 1, as
    ``ortho_ref.dion_step``): error_feedback (M ← B − (1−μ)PRᵀ, else μPRᵀ), epsilon of the
    column normalization, power_iters; the ``optimizer.state[p]`` keys of the momentum (m, n)
    and the right factor Q (min(m, n), r); constructor keywords for lr, momentum (μ) and
    weight_decay, and extra_kwargs. The update is −lr·√(m/n)·PQᵀ with decoupled weight decay."""

    error_feedback: bool = True
    epsilon: float = 1e-8
    power_iters: int = 1
    momentum_state_key: str = "momentum"
    q_state_key: str = "Q"
    hyperparameter_names: dict = field(default_factory=lambda: {"lr": "lr", "momentum": "mu",
                                                                "weight_decay": "weight_decay"})
    extra_kwargs: dict = field(default_factory=dict)


#: torch.optim.Muon's own conventions (defaults: EMA momentum, Nesterov, Keller Jordan's
#: coefficients, eps 1e-7 clamped, bf16 Newton–Schulz, adjust_lr_fn None = "original").
TORCH_MUON = MuonConventions(eps_mode="clamp")
#: ortho_fast.Muon's defaults: torch's, including the clamped normalization that
#: ``ortho_fast.default_eps_mode("jordan")`` resolves to.
ORTHO_MUON = MuonConventions(eps_mode="clamp")
#: ortho_fast.Dion and microsoft/dion's Dion (state keys "momentum" and "Q", μ keyword "mu").
DION = DionConventions()


@dataclass
class Failure:
    """A failed check with what reproduces it: ``inputs`` maps names to float64 arrays (the
    matrix given to an orthogonalizer; the initial weight and gradients of an optimizer run),
    ``provenance`` says how they were built."""

    result: CheckResult
    inputs: dict
    provenance: str


@dataclass
class VerificationReport:
    """Result of ``check_orthogonalizer`` / ``check_optimizer``.

    ``results``: every CheckResult (error, tolerance, ratio = error/tolerance per case);
    ``inputs``: input name -> (arrays, provenance). ``bool(report)`` is ``report.passed``.
    ``status`` (``ortho_verify.checks.verdict``): "passed", "failed", or "inconclusive" — nothing
    failed but some check made no claim on any input (e.g. every Dion step ill-posed in the
    dtype), or nothing was compared at all; an inconclusive report is not ``passed``.
    """

    subject: str
    results: list
    inputs: dict

    @property
    def status(self) -> str:
        """"passed", "failed" or "inconclusive" (see the class docstring)."""
        return verdict(self.results)[0]

    @property
    def passed(self) -> bool:
        """True iff nothing failed and every check made at least one claim (status "passed")."""
        return self.status == "passed"

    @property
    def inconclusive(self) -> bool:
        """True iff nothing failed but the report is no evidence (status "inconclusive")."""
        return self.status == "inconclusive"

    def __bool__(self) -> bool:
        return self.passed

    @property
    def failures(self) -> list[Failure]:
        """The failed results, each with its reproducing input."""
        return [Failure(r, *self.inputs.get(r.input, ({}, ""))) for r in self.results if not r.passed]

    @property
    def worst_ratio(self) -> float:
        """Largest error/tolerance over the claimed results (0 when there are none)."""
        return max((r.ratio for r in self.results if r.claimed), default=0.0)

    def summary(self, max_rows: int = 12) -> str:
        """Plain-text verdict with the counts of passed / failed / no-claim rows, why an
        inconclusive report is one, the worst case per check, the first failures with
        provenance and the first rows that made no claim (at most ``max_rows`` of each)."""
        from ortho_verify.report import worst_per_group

        status, reasons = verdict(self.results)
        counts = {k: sum(r.status == k for r in self.results) for k in ("pass", "fail", "no claim")}
        head = (f"{self.subject}: {status.upper()} — {counts['pass']} of {len(self.results)} checks passed, "
                f"{counts['fail']} failed, {counts['no claim']} made no claim; worst error/tolerance "
                f"{self.worst_ratio:.3g}")
        lines = [head] + [f"  nothing compared — {why}" for why in reasons]
        by_check: dict[str, CheckResult] = {}
        for worst, _, _ in worst_per_group(self.results):
            key = (not worst.passed, worst.claimed, worst.ratio)
            old = by_check.get(worst.check)
            if old is None or key > (not old.passed, old.claimed, old.ratio):
                by_check[worst.check] = worst
        lines.append("worst case per check:")
        lines += [f"  {r.check}: {r.ratio:.3g} ({r.input}; {r.detail}){'  FAIL' if not r.passed else ''}"
                  f"{'' if r.claimed else '  no claim'}{' — ' + r.note if r.note else ''}" for r in by_check.values()]
        fails = self.failures
        if fails:
            lines.append(f"failures ({len(fails)}):")
            for f in fails[:max_rows]:
                lines.append(f"  {f.result.check} on {f.result.input} [{f.result.detail}]: error {f.result.error:.3g} > "
                             f"tolerance {f.result.tolerance:.3g}{' — ' + f.result.note if f.result.note else ''}")
                lines.append(f"    reproduce: {f.provenance}")
            if len(fails) > max_rows:
                lines.append(f"  ... and {len(fails) - max_rows} more")
        vacuous = [r for r in self.results if r.status == "no claim"]
        if vacuous:
            lines.append(f"no claim ({len(vacuous)}: passed vacuously, not counted as evidence):")
            lines += [f"  {r.check} on {r.input} — {r.note}" for r in vacuous[:max_rows]]
            if len(vacuous) > max_rows:
                lines.append(f"  ... and {len(vacuous) - max_rows} more")
        return "\n".join(lines)

    def assert_passed(self) -> None:
        """Raise AssertionError with ``summary()`` unless the report passed."""
        if not self.passed:
            raise AssertionError(self.summary())

    def save(self, out_dir) -> Path:
        """Write ``report.json``, ``report.md`` (``ortho_verify.report``) and ``failures.npz`` (the
        reproducing inputs of the failures, keyed ``<input>/<array>``) to ``out_dir``; returns it."""
        from ortho_verify.report import write_reports

        out = Path(out_dir)
        write_reports(self.results, out, {"subject": self.subject})
        arrays = {f"{f.result.input}/{k}": v for f in self.failures for k, v in f.inputs.items()}
        if arrays:
            np.savez(out / "failures.npz", **arrays)
        (out / "provenance.json").write_text(json.dumps({k: v[1] for k, v in self.inputs.items()}, indent=2))
        return out


# --- orthogonalizers ------------------------------------------------------------------------

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


def default_examples(dtype="float32", seed: int = 0, batched: bool = True) -> list[SpectralExample]:
    """The inputs ``check_orthogonalizer`` uses by default (``DEFAULT_SPECS``), deterministic
    for a seed; example i is drawn with seed ``seed + i``. ``batched=False`` leaves out the
    inputs with batch dimensions. Raises: TypeError for a dtype other than float64 / float32 /
    bfloat16."""
    name = _ns_dtype_name(dtype)
    return [build_example(kind, params, shape=shape, scale=MAX_SCALE[name] if scale == "max" else scale, dtype=name,
                          seed=seed + i) for i, (kind, params, shape, scale) in enumerate(DEFAULT_SPECS)
            if batched or len(shape) == 2]


def check_orthogonalizer_example(fn: Callable, example: SpectralExample, *, coefficients="jordan", dtype=None,
                                 steps: int | None = None, safety: float | None = None, eps: float | None = None,
                                 eps_mode: str = "add", record: list | None = None) -> list[CheckResult]:
    """Run ``fn`` on one ``SpectralExample`` and compare each matrix of the result with
    ``ortho_ref.ns_map`` (``ortho_verify.checks.compare_ns_output``), for use in hypothesis tests.

    ``dtype`` (default the example's): the compute dtype ``fn`` declares. Other arguments as
    ``check_orthogonalizer``. Rows: ``orthogonalizer_runs`` (fn raised; on a batched input the
    note says so and points to ``batched=False``), ``input_unchanged`` (fn modified its input;
    tolerance 0), ``output_shape``, then per matrix ``ns_vs_ns_map``, ``spread_in_band`` (and
    ``ns_projected_singular_values`` for bfloat16).
    Raises: TypeError for a dtype other than float64 / float32 / bfloat16.
    """
    name = _ns_dtype_name(example.dtype if dtype is None else dtype)
    table, safety, eps = _table_and_normalization(coefficients, steps, safety, eps)
    x = example.tensor()
    pristine = x.clone()
    try:
        out = fn(x)
    except Exception as err:  # a crash is a failed check, reported with its input
        hint = (f"; raised on a batched {tuple(x.shape)} input (leading dims are independent matrices): pass "
                "batched=False if your kernel is 2-D only") if x.ndim > 2 else ""
        return [measured("orthogonalizer_runs", example.name, "fn(input)", math.inf, 0.0, f"raised {err!r}{hint}")]
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


def check_orthogonalizer(fn: Callable, *, coefficients="jordan", dtype=torch.float32, steps: int | None = None,
                         safety: float | None = None, eps: float | None = None, eps_mode: str = "add",
                         examples: list[SpectralExample] | None = None, seed: int = 0,
                         batched: bool = True) -> VerificationReport:
    """Check a Newton–Schulz function against the exact oracle.

    ``fn`` maps a (..., m, n) tensor to its Newton–Schulz result of the same shape (leading dims
    are independent matrices, each normalized by its own Frobenius norm). It is called on
    ``default_examples(dtype, seed)`` (every spectrum family of ``ortho_verify.strategies``, tall / wide
    / square / batched, scales 1e-30 to ``MAX_SCALE``, ‖G‖_F ≈ 1.6e-5 where eps matters; with
    ``batched=False`` only the 2-D ones, for a kernel that takes one (m, n) matrix), given in
    float64 when ``dtype`` is float64, else float32, and each output matrix is compared with ``ortho_ref.ns_map`` for the
    declared ``coefficients`` (a registry name or a (T, 3) table; ``steps`` truncates / extends
    it), normalization X₀ = G/(safety‖G‖_F + eps) (``eps_mode="clamp"``: /max(safety‖G‖_F, eps);
    defaults from the named schedule, else 1 and 1e-7) and compute ``dtype`` (float64, float32:
    Frobenius ``ns_tolerance``; bfloat16: per-direction singular values).
    Returns: ``VerificationReport`` (``status`` passed / failed / inconclusive, ``failures`` with
    reproducing inputs, ratios; bfloat16 rows whose tolerance admits the zero output make no claim).
    Raises: TypeError for a dtype other than float64 / float32 / bfloat16 (float16 included);
    ValueError for an unknown schedule, a bad table, or no example left (``examples`` empty, or
    only batched ones with ``batched=False``) — exceptions raised by ``fn`` are reported as failed
    checks instead.
    Source: the polynomial view of Newton–Schulz, Amsel et al. 2025 (arXiv 2505.16932), Sec. 2.
    """
    name = _ns_dtype_name(dtype)
    _table_and_normalization(coefficients, steps, safety, eps)  # validate before running anything
    examples = default_examples(name, seed, batched) if examples is None else \
        [ex for ex in examples if batched or ex.matrix.ndim == 2]
    if not examples:
        raise ValueError("examples: expected at least one SpectralExample (2-D when batched=False)")
    results, inputs = [], {}
    for ex in examples:
        rows = check_orthogonalizer_example(fn, ex, coefficients=coefficients, dtype=name, steps=steps, safety=safety,
                                            eps=eps, eps_mode=eps_mode)
        results += rows
        for case in ex.cases():  # the matrices fn received (rounded to the input dtype)
            inputs[case.name] = ({"input": case.matrix}, ex.provenance)
        inputs.setdefault(ex.name, ({"input": _as_f64(ex.tensor())}, ex.provenance))  # a whole batch
    subject = f"{getattr(fn, '__name__', type(fn).__name__)} ({coefficients if isinstance(coefficients, str) else 'table'}, {name})"
    return VerificationReport(subject, results, inputs)


# --- optimizers -----------------------------------------------------------------------------

#: Parameter shapes of ``check_optimizer``: tall, wide and square, each with a row count that
#: 4 does not divide (sharding bugs), small enough for a fast check.
DEFAULT_SHAPES = ((37, 16), (12, 29), (30, 30))


def _default_conventions(optimizer):
    if optimizer is torch.optim.Muon:
        return TORCH_MUON
    if optimizer is ortho_fast.Muon:
        return ORTHO_MUON
    if optimizer is ortho_fast.Dion:
        return DION
    raise TypeError(f"conventions: required for {getattr(optimizer, '__name__', optimizer)!r} "
                    "(MuonConventions or DionConventions describing what it computes)")


def _optimizer_inputs(shapes, steps: int, cond: float, seed: int) -> list[tuple[np.ndarray, list[np.ndarray]]]:
    """Per shape: initial weight N(0, 0.02²) and ``steps`` gradients with singular values
    geomspace(1, 1/cond) and Haar vectors (condition number ``cond``: bfloat16 tolerances stay sharp)."""
    rng = np.random.default_rng(seed)
    out = []
    for m, n in shapes:
        s = np.geomspace(1.0, 1.0 / cond, min(m, n))
        out.append((0.02 * rng.standard_normal((m, n)), [matrix_with_spectrum(s, m, n, rng) for _ in range(steps)]))
    return out


def check_optimizer(optimizer, conventions=None, *, lr: float = 0.02, momentum: float = 0.95,
                    weight_decay: float = 0.1, steps: int = 3, param_dtype=torch.float32,
                    shapes=DEFAULT_SHAPES, cond: float = 10.0, seed: int = 0) -> VerificationReport:
    """Check a Muon- or Dion-like optimizer step by step against the oracle.

    ``optimizer``: a class or factory called as ``optimizer(params, **{names[k]: v}, **extra_kwargs)``
    with the lr, momentum and weight_decay given here under the conventions' keyword names.
    ``conventions``: ``MuonConventions`` or ``DionConventions`` (default for torch.optim.Muon,
    ortho_fast.Muon and ortho_fast.Dion: ``TORCH_MUON``, ``ORTHO_MUON``, ``DION``).
    One parameter per shape in ``shapes`` (param_dtype), ``steps`` steps with well-conditioned
    gradients (``cond``). Each step is compared from the optimizer's own state before it:
    Muon: the update O = (W(1 − lr·wd) − W_new)/(lr·s) against ns_map(U) of ``ortho_ref.muon_step``
    (``compare_ns_output`` in the coarser of ns_dtype and param_dtype, with the weight's rounding
    as extra allowance; checks ``muon_update/...``) and the momentum buffer (``muon_momentum``);
    Dion (from step 2: Q_0 is the optimizer's own draw): weight, momentum and Q against
    ``ortho_ref.dion_step`` (``dion_vs_reference``, ``ortho_verify.tolerances.dion_variant_tolerances``
    with B, P, R in the momentum state's dtype, as microsoft/dion's mixed precision) where P is
    determined by B in that dtype — not with bfloat16 state (δ_P ≈ 0.9), where the step is left
    out and said so in the notes — and at every step the invariants that need no P
    (``ortho_verify.error_feedback.observed_step_rows``: ``dion_update_structure``,
    ``dion_momentum_split``).
    Returns: ``VerificationReport`` (``status`` passed / failed / inconclusive); each failure
    carries the initial weight and gradients.
    Raises: TypeError without conventions for an unknown class or for a dtype outside float64 /
    float32 / bfloat16 / float16; ValueError for steps < 1 (Dion: < 2), lr <= 0, or when the state
    lacks a declared key (after the first step).
    """
    conventions = _default_conventions(optimizer) if conventions is None else conventions
    if not isinstance(conventions, (MuonConventions, DionConventions)):
        raise TypeError(f"conventions: expected MuonConventions or DionConventions, got {type(conventions).__name__}")
    first = 2 if isinstance(conventions, DionConventions) else 1  # Dion: Q_0 is observed after step 1
    if not isinstance(steps, int) or steps < first:
        raise ValueError(f"steps: expected an integer >= {first}, got {steps!r}")
    if not lr > 0:
        raise ValueError(f"lr: expected > 0 (the update is recovered by dividing by lr), got {lr!r}")
    pdt = dtype_name(param_dtype, argument="param_dtype")
    inputs = _optimizer_inputs(shapes, steps, cond, seed)
    params = [torch.nn.Parameter(torch.tensor(w0, dtype=param_dtype)) for w0, _ in inputs]
    names = conventions.hyperparameter_names
    opt = optimizer(params, **{names["lr"]: lr, names["momentum"]: momentum, names["weight_decay"]: weight_decay},
                    **conventions.extra_kwargs)
    target = getattr(optimizer, "func", optimizer)  # functools.partial: the class it wraps
    subject = f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', type(target).__name__)}"
    labels = [f"{m}x{n}" for m, n in shapes]
    report_inputs = {f"{label} step {t + 1}": ({"weight0": w0, **{f"grad{i + 1}": g for i, g in enumerate(gs)}},
                                               f"ortho_verify.api._optimizer_inputs({tuple(shapes)}, {steps}, {cond}, {seed})")
                     for label, (w0, gs) in zip(labels, inputs) for t in range(steps)}
    step = _muon_step_rows if isinstance(conventions, MuonConventions) else _dion_step_rows
    tracked = [None] * len(params)
    results = []
    for t in range(steps):
        before = [(_as_f64(p), {k: _as_f64(v) for k, v in opt.state.get(p, {}).items() if isinstance(v, torch.Tensor)})
                  for p in params]
        grads = []
        for p, (_, gs) in zip(params, inputs):
            p.grad = torch.tensor(gs[t], dtype=param_dtype)
            grads.append(_as_f64(p.grad))
        opt.step()
        for i, p in enumerate(params):
            rows, tracked[i] = step(opt, p, conventions, before[i], grads[i], tracked[i], t, lr=lr, mu=momentum,
                                    wd=weight_decay, pdt=pdt, name=f"{labels[i]} step {t + 1}")
            results += rows
    return VerificationReport(f"{subject} ({type(conventions).__name__})", results, report_inputs)


def _state(opt, p, key: str) -> np.ndarray:
    state = opt.state.get(p, {})
    if key not in state:
        raise ValueError(f"conventions: optimizer.state[p] has no {key!r} (keys: {sorted(state)}); "
                         "set the conventions' state key")
    return _as_f64(state[key])


def _muon_step_rows(opt, p, conv: MuonConventions, before, grad, tracked, t, *, lr, mu, wd, pdt, name):
    w_prev, state_prev = before
    key = conv.momentum_state_key
    m_prev = state_prev.get(key) if key else None
    if m_prev is None:
        m_prev = np.zeros_like(w_prev) if tracked is None else tracked
    table, safety, eps = _table_and_normalization(conv.coefficients, conv.ns_steps, conv.safety, conv.eps)
    ref = ortho_ref.muon_step(w_prev, grad, m_prev, lr=lr, mu=mu, nesterov=conv.nesterov,
                              momentum_style=conv.momentum_style, coefficients=table, safety=safety, eps=eps,
                              eps_mode=conv.eps_mode, adjust_lr=conv.adjust_lr, weight_decay=wd)
    w_new = _as_f64(p)
    step = lr * ref.lr_scale
    measured_update = (w_prev * (1 - lr * wd) - w_new) / step
    u = tol.unit_roundoff(pdt) + tol.U64
    extra = 4 * u * (float(np.linalg.norm(w_prev)) + step * float(np.linalg.norm(ref.update))) / step
    rows = compare_ns_output(measured_update, ref.ns_input, table, safety=safety, eps=eps, eps_mode=conv.eps_mode,
                             dtype=_coarser(dtype_name(conv.ns_dtype, argument="conventions.ns_dtype"), pdt),
                             input_name=name,
                             detail=f"update (W(1-lr wd) - W_new)/(lr s), s = {ref.lr_scale:.4g}", extra=extra,
                             prefix="muon_update/")
    if key:
        rows.append(measured("muon_momentum", name, f"state[{key!r}]", np.linalg.norm(_state(opt, p, key) - ref.momentum),
                             tol.momentum_tolerance(float(np.linalg.norm(grad)), float(np.linalg.norm(m_prev)), pdt)))
    return rows, ref.momentum


def _dion_step_rows(opt, p, conv: DionConventions, before, grad, tracked, t, *, lr, mu, wd, pdt, name):
    w_prev, state_prev = before
    if t == 0:  # Q_0 is the optimizer's own random draw: observable only after the first step
        for key in (conv.momentum_state_key, conv.q_state_key):
            _state(opt, p, key)  # the declared state exists (ValueError otherwise)
        return [], None
    m_prev, q_prev = state_prev[conv.momentum_state_key], state_prev[conv.q_state_key]
    m_dt, q_dt = (dtype_name(opt.state[p][k].dtype, argument=f"optimizer.state[p][{k!r}]")
                  for k in (conv.momentum_state_key, conv.q_state_key))
    ref = ortho_ref.dion_step(w_prev, grad, m_prev, q_prev, lr=lr, mu=mu, weight_decay=wd, epsilon=conv.epsilon,
                              power_iters=conv.power_iters, error_feedback=conv.error_feedback)
    # B, P, R in the momentum's dtype (microsoft/dion's mixed precision): float32 state with
    # bfloat16 parameters keeps P determined; bfloat16 state does not (δ_P ≈ 0.9).
    bounds = tol.dion_variant_tolerances(ref, q_prev, lr=lr, mu=mu, weight=w_prev, dtype=m_dt, param_dtype=pdt,
                                         q_dtype=q_dt, error_feedback=conv.error_feedback, epsilon=conv.epsilon,
                                         power_iters=conv.power_iters, grad_norm=float(np.linalg.norm(grad)))
    w_new, m_new, q_new = _as_f64(p), _state(opt, p, conv.momentum_state_key), _state(opt, p, conv.q_state_key)
    detail = f"rank {q_prev.shape[1]}/{min(w_prev.shape)}/{pdt}" + (f" state {m_dt}" if m_dt != pdt else "")
    rows = dion_reference_rows(name, detail, ref, q_prev, w_prev, lr=lr, mu=mu, dtype=m_dt, bounds=bounds,
                               error_feedback=conv.error_feedback, weight=w_new, momentum=m_new, Q=q_new)
    # A comparison that was not made is said in the invariant rows' notes, not as a row of its own:
    # the invariants below are the evidence for such a step.
    note = "" if rows[0].claimed else f"reference not compared: {rows[0].note}"
    invariants = error_feedback.observed_step_rows(
        name, detail, weight=w_prev, weight_new=w_new, momentum=m_prev, grad=grad, momentum_new=m_new, q_new=q_new,
        lr=lr, mu=mu, weight_decay=wd, dtype=_coarser(pdt, m_dt, q_dt), error_feedback=conv.error_feedback, note=note)
    return [r for r in rows if r.claimed] + invariants, None
