"""Dion2 checks of ``ortho-verify``: one ``ortho_fast.Dion2`` step per configuration of
``DION2_CONFIGS`` (``ortho_verify.registry``) against ``ortho_ref.dion2.dion2_step``.

The selection is a gauge where slice norms nearly tie: ``compare_dion2_step`` first infers the
fast selection from the fast momentum (or update), accepts it when it is a valid top-k within
the norm tolerances (``dion2_selection_violation`` ≤ 0), and compares weight and momentum with
the oracle conditioned on that selection. docs/math.md, "Dion2"; docs/tolerances.md, "Dion2".
"""

from __future__ import annotations

import math

import numpy as np
import torch

import ortho_fast
import ortho_ref
from ortho_fast.groups.dion2 import DION2_DEFAULTS
from ortho_ref.dion2 import dion2_num_selected, dion2_step

from .. import registry
from ..inputs.arrays import TORCH_DTYPES, as_float64, case_array
from ..inputs.spectra import MatrixCase
from ..report.results import CheckResult, measured, no_claim
from ..tolerances.dion2 import dion2_norm_tolerances, dion2_selection_violation, dion2_step_tolerances

__all__ = ["DION2_CONFIGS", "check_dion2", "check_dion2_optimizer", "compare_dion2_step", "dion2_inputs",
           "fast_dion2_step", "infer_selection",
           "reference_options"]

#: Dion2 option sets (``ortho_verify.registry.DION2_CONFIGS``): name -> ``ortho_fast.Dion2`` keywords.
DION2_CONFIGS = registry.DION2_CONFIGS


def reference_options(options: dict) -> dict:
    """``ortho_fast.Dion2`` keywords -> ``dion2_step`` keywords (defaults of ``DION2_DEFAULTS``):
    the coefficient table and safety of the named schedule, ``epsilon`` as eps, "match_rms_adamw"
    as microsoft/dion's "rms_norm"."""
    opts = {**DION2_DEFAULTS, **options}
    coefficients = opts["coefficients"]
    named = ortho_ref.SCHEDULES.get(coefficients) if isinstance(coefficients, str) else None
    table = ortho_ref.schedule(coefficients, opts["ns_steps"]) if named else np.asarray(coefficients, dtype=float)
    safety = opts["safety"] if opts["safety"] is not None else named.safety if named else 1.0
    adjust = {"match_rms_adamw": "rms_norm"}.get(opts["adjust_lr"], opts["adjust_lr"])
    return dict(lr=opts["lr"], fraction=opts["fraction"], ef_decay=opts["ef_decay"], weight_decay=opts["weight_decay"],
                adjust_lr=adjust, coefficients=table, safety=safety, eps=opts["epsilon"])


def fast_dion2_step(options: dict, dtype: str, w0: np.ndarray, m0: np.ndarray, g: np.ndarray):
    """One ``ortho_fast.Dion2`` step with ``options`` in ``dtype`` (parameters, state and
    Newton–Schulz), from float64 arrays; returns (weight, momentum) float64."""
    tdt = TORCH_DTYPES[dtype]
    p = torch.nn.Parameter(torch.tensor(w0, dtype=tdt))
    opt = ortho_fast.Dion2([p], **{**options, "dtype": tdt})
    opt.state[p]["momentum"] = torch.tensor(m0, dtype=tdt)
    p.grad = torch.tensor(g, dtype=tdt)
    opt.step()
    return as_float64(p), as_float64(opt.state[p]["momentum"])


def infer_selection(w0: np.ndarray, g: np.ndarray, m0: np.ndarray, weight: np.ndarray, momentum: np.ndarray,
                    ref_options: dict, rows: bool, k: int) -> np.ndarray:
    """The k slices a fast step most plausibly selected, ascending.

    Evidence per slice: with ef_decay away from 1, ‖M_fast − B‖ / ‖(1 − ef_decay)·B‖ on the slice
    (≈ 1 selected, ≈ 0 not); with ef_decay ≈ 1, the size of the fast update on the slice,
    ‖W_fast − W(1 − lr·wd)‖ / (lr·s) (≈ a row of an orthogonalized matrix, or rounding).
    Shapes: (m, n) float64 arrays; returns (k,) int64.
    """
    axis = 1 if rows else 0
    b = m0 + g
    ef = ref_options["ef_decay"]
    if abs(1.0 - ef) > 1e-2:
        denom = np.linalg.norm((1.0 - ef) * b, axis=axis)
        evidence = np.linalg.norm(momentum - b, axis=axis) / np.where(denom > 0, denom, np.inf)
    else:
        decayed = w0 * (1.0 - ref_options["lr"] * ref_options["weight_decay"])
        evidence = np.linalg.norm(weight - decayed, axis=axis)
    return np.sort(np.argsort(-evidence, kind="stable")[:k])


def compare_dion2_step(case_name: str, detail: str, w0: np.ndarray, g: np.ndarray, m0: np.ndarray,
                       weight: np.ndarray, momentum: np.ndarray, options: dict, dtype: str) -> list[CheckResult]:
    """Rows "dion2_selection", "dion2_vs_reference" weight and momentum for one fast Dion2 step
    (``weight`` / ``momentum`` after it, float64) from ``w0``, ``g``, ``m0`` with ``ortho_fast.Dion2``
    keywords ``options`` in ``dtype`` (one process: "local" and "global" coincide).

    The selection row: ``dion2_selection_violation`` of the inferred fast selection, bound 0. The
    weight / momentum rows compare with the oracle conditioned on that selection when it is
    valid (a near-tie broken otherwise: noted), else on the oracle's own (the weight then fails too).
    """
    ref_opts = reference_options(options)
    ref = dion2_step(w0, g, m0, **ref_opts)
    size = ref.norms.size
    k = dion2_num_selected(ref_opts["fraction"], size)
    fast_sel = infer_selection(w0, g, m0, weight, momentum, ref_opts, ref.rows, k)
    tols = dion2_norm_tolerances(g, m0, ref.rows, dtype)
    violation = dion2_selection_violation(ref.norms, tols, fast_sel)
    note = ""
    if violation <= 0 and not np.array_equal(fast_sel, ref.selected):
        ref = dion2_step(w0, g, m0, selected=fast_sel, **ref_opts)
        note = "a near-tie of slice norms broken otherwise: compared on the fast selection"
    scale_of = max(float(ref.norms.max()), np.finfo(float).tiny)
    rows = [measured("dion2_selection", case_name, f"{detail} top-{k} of {size} {'rows' if ref.rows else 'columns'}",
                     violation / scale_of if math.isfinite(violation) else -1.0, 0.0,
                     "max (ℓ_j − τ_j) − min (ℓ_i + τ_i), relative to max ℓ")]
    w_tol, m_tol = dion2_step_tolerances(w0, ref.update, ref.accumulated, ref.selected, ref.rows, g, m0,
                                         lr=ref_opts["lr"], lr_scale=ref.lr_scale,
                                         coefficients=ref_opts["coefficients"], safety=ref_opts["safety"],
                                         eps=ref_opts["eps"], dtype=dtype)
    w_err = float(np.linalg.norm(weight - ref.weight))
    if math.isinf(w_tol):
        rows.append(no_claim("dion2_vs_reference", case_name, f"{detail} weight",
                             "first-order Newton–Schulz bound above half of ‖O_S‖ in this dtype"))
    else:
        rows.append(measured("dion2_vs_reference", case_name, f"{detail} weight", w_err, w_tol, note))
    rows.append(measured("dion2_vs_reference", case_name, f"{detail} momentum",
                         float(np.linalg.norm(momentum - ref.momentum)), m_tol, note))
    return rows


def dion2_inputs(case: MatrixCase) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weight, momentum, gradient) of a Dion2 check: the case's matrix as the gradient."""
    g = case.matrix
    gscale = float(np.linalg.norm(g)) / math.sqrt(g.size)
    return case_array(case, "weight", g.shape, 0.02), case_array(case, "momentum", g.shape, gscale), g


def check_dion2(case: MatrixCase, config: str, dtype: str) -> list[CheckResult]:
    """One ``ortho_fast.Dion2`` step with ``DION2_CONFIGS[config]`` in ``dtype`` against the
    oracle (``compare_dion2_step``), on the case's matrix as the gradient."""
    w0, m0, g = dion2_inputs(case)
    options = DION2_CONFIGS[config]
    weight, momentum = fast_dion2_step(options, dtype, w0, m0, g)
    return compare_dion2_step(case.name, f"{config}/{dtype}", w0, g, m0, weight, momentum, options, dtype)


def check_dion2_optimizer(optimizer, conventions=None, *, lr: float = 0.02, fraction: float = 0.25,
                          ef_decay: float = 0.95, weight_decay: float = 0.01, steps: int = 3,
                          param_dtype: torch.dtype = torch.float32, shapes=((16, 40), (40, 16), (24, 24)),
                          seed: int = 0) -> list[CheckResult]:
    """Check a Dion2-like optimizer class step by step against ``ortho_ref.dion2``.

    Built on parameters of ``shapes`` with the hyperparameters under the conventions' keyword names and stepped
    ``steps`` times on seeded gradients; each step is recomputed from the optimizer's own weight and momentum
    before it (``compare_dion2_step``, tolerances for the coarser of ``param_dtype`` and ``ns_dtype``).

    Parameters
    ----------
    optimizer : type or callable
        Called as ``optimizer(params, **{names[k]: v}, **extra_kwargs)``.
    conventions : Dion2Conventions, optional
        What it computes (default ``DION2``: ortho_fast's and microsoft/dion's).
    lr : float, default 0.02
        Learning rate.
    fraction : float, default 0.25
        Fraction of the slices selected per step, in (0, 1].
    ef_decay : float, default 0.95
        Decay of the selected slices' momentum (error feedback).
    weight_decay : float, default 0.01
        Decoupled weight decay.
    steps : int, default 3
        Number of steps.
    param_dtype : torch.dtype, default torch.float32
        The parameters' dtype.
    shapes : sequence of (m, n) tuple of int, default ((16, 40), (40, 16), (24, 24))
        One matrix parameter per shape.
    seed : int, default 0
        Seed of the weights and gradients.

    Returns
    -------
    list of CheckResult
        Selection, weight and momentum rows per matrix and step.

    Raises
    ------
    TypeError
        If ``conventions`` is not a ``Dion2Conventions``.
    KeyError
        Naming the momentum state key, when the optimizer does not keep it.

    References
    ----------
    microsoft/dion ``dion/dion2.py`` (class ``Dion2``); docs/math.md, "5a. Dion2".

    Examples
    --------
    >>> from ortho_verify import DION2, check_dion2_optimizer
    >>> import ortho_fast
    >>> all(row.passed for row in check_dion2_optimizer(ortho_fast.Dion2, DION2, shapes=[(8, 4)], steps=2))
    True
    """
    from ..conventions import DION2, Dion2Conventions, coarser_dtype, dtype_name

    conventions = DION2 if conventions is None else conventions
    if not isinstance(conventions, Dion2Conventions):
        raise TypeError(f"conventions: expected Dion2Conventions, got {type(conventions).__name__}")
    dtype = coarser_dtype(dtype_name(param_dtype, argument="param_dtype"), dtype_name(conventions.ns_dtype))
    options = dict(lr=lr, fraction=fraction, ef_decay=ef_decay, weight_decay=weight_decay,
                   coefficients=conventions.coefficients, ns_steps=conventions.ns_steps, safety=conventions.safety,
                   epsilon=conventions.epsilon,
                   adjust_lr={"rms_norm": "match_rms_adamw"}.get(conventions.adjust_lr, conventions.adjust_lr))
    rng = np.random.default_rng(seed)
    params = [torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(s), dtype=param_dtype)) for s in shapes]
    names = conventions.hyperparameter_names
    opt = optimizer(params, **{names[k]: v for k, v in (("lr", lr), ("fraction", fraction), ("ef_decay", ef_decay),
                                                         ("weight_decay", weight_decay))}, **conventions.extra_kwargs)
    key = conventions.momentum_state_key
    rows: list[CheckResult] = []
    for t in range(steps):
        before = [(as_float64(p), as_float64(opt.state[p][key]) if key in opt.state.get(p, {}) else np.zeros(s))
                  for p, s in zip(params, shapes)]
        grads = [torch.tensor(rng.standard_normal(s), dtype=param_dtype) for s in shapes]
        for p, g in zip(params, grads):
            p.grad = g
        opt.step()
        for i, (p, s) in enumerate(zip(params, shapes)):
            if key not in opt.state.get(p, {}):
                raise KeyError(f"momentum_state_key: the optimizer keeps no {key!r} state (it has "
                               f"{sorted(opt.state.get(p, {}))})")
            w0, m0 = before[i]
            rows += compare_dion2_step(f"{s[0]}x{s[1]}", f"step {t + 1}/{dtype}", w0, as_float64(grads[i]), m0,
                                       as_float64(p), as_float64(opt.state[p][key]), options, dtype)
    return rows
