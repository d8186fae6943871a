"""Muon pipeline stage checks of ``ortho-verify``: one ``ortho_fast.Muon`` step with MuonEq, Muon+
and / or NorMuon (``STAGE_CONFIGS``: nanochat's current matrix step, microsoft/dion's NorMuon, each
stage alone) against ``ortho_ref.muon.muon_pipeline_step``, which composes the oracle's own stages
(``ortho_ref.muon_stages``). Tolerances: ``ortho_verify.tolerances.stages`` (docs/tolerances.md,
"Muon pipeline stages").
"""

from __future__ import annotations

import math

import numpy as np
import torch

import ortho_fast
import ortho_ref
from ortho_ref import muon_stages as ref_stages

from .. import registry, tolerances as tol
from ..conventions import table_and_normalization
from ..inputs.arrays import TORCH_DTYPES, as_float64, case_array, rounded
from ..inputs.spectra import MatrixCase
from ..report.results import CheckResult, measured
from ..tolerances.stages import equilibration_error, stage_tolerances

__all__ = ["STAGE_CONFIGS", "STAGE_DTYPES", "StageRun", "StepInputs", "check_muon_stages", "fast_stage_step",
           "stage_errors", "stage_jobs", "stage_map_errors", "stage_reference", "stage_step_rows"]

#: label -> Muon options (lr and weight_decay included) of the stage configurations (``ortho_verify.registry``).
STAGE_CONFIGS = registry.STAGE_CONFIGS
#: The dtypes every stage configuration is checked in (parameters, state and Newton–Schulz alike).
STAGE_DTYPES = ("float64", "float32", "bfloat16")
#: The stage options of ``ortho_fast.Muon`` that ``muon_pipeline_step`` takes under the same names.
STAGE_KEYS = ("row_equilibration", "renormalize", "normuon_beta2", "normuon_eps", "normuon_eps_mode", "normuon_dim")


class StageRun:
    """The inputs of one stage check, float64: weight, momentum, gradient, NorMuon's prior second
    moment (rounded to the parameter dtype, so both sides start from the same state; None
    without NorMuon)."""

    def __init__(self, case: MatrixCase, options: dict, dtype: str) -> None:
        g = case.matrix
        m, n = g.shape
        gscale = float(np.linalg.norm(g)) / math.sqrt(g.size)
        self.grad = g
        self.weight = case_array(case, "weight", g.shape, 0.02)
        self.momentum = case_array(case, "momentum", g.shape, gscale)
        self.variance = None
        if options.get("normuon_beta2") is not None:
            shape = ref_stages.normuon_variance_shape(m, n, options.get("normuon_dim", "row"))
            # a typical second moment: an update of Frobenius norm √min(m, n) has mean square min(m, n)/(mn)
            prior = case_array(case, "variance", shape, math.sqrt(min(m, n) / (m * n))) ** 2
            self.variance = rounded(prior, TORCH_DTYPES[dtype])


def _schedule(options: dict) -> tuple[np.ndarray, float, float]:
    """(table, safety, eps) of the options' ``coefficients`` (a registry name or (T, 3) rows),
    ``ns_steps``, ``safety`` and ``eps`` (None: the schedule's own)."""
    return table_and_normalization(options["coefficients"], options.get("ns_steps"), options.get("safety"),
                                   options.get("eps"))


def stage_reference(run: StageRun, options: dict, mu: float) -> ortho_ref.muon.MuonPipelineStep:
    """``ortho_ref.muon.muon_pipeline_step`` of ``run`` with the Muon options ``options`` (a
    bias-corrected momentum with ``bias_correction`` and the 1-based ``step``)."""
    table, safety, eps = _schedule(options)
    return ortho_ref.muon.muon_pipeline_step(
        run.weight, run.grad, run.momentum, lr=options["lr"], mu=mu, nesterov=options["nesterov"],
        momentum_style=options["momentum_style"], coefficients=table,
        safety=safety, eps=eps, eps_mode=options.get("eps_mode", "add"), adjust_lr=options["adjust_lr"],
        weight_decay=options["weight_decay"], extra_scale_factor=options.get("extra_scale_factor", 1.0),
        cautious_weight_decay=options.get("cautious_weight_decay", False), normuon_variance=run.variance,
        nesterov_form=options.get("nesterov_form", "mix"),
        weight_decay_style=options.get("weight_decay_style", "decoupled"),
        bias_correction=options.get("bias_correction", False), step=options.get("step"),
        **{k: options[k] for k in STAGE_KEYS if k in options})


def stage_errors(run: StageRun, options: dict, dtype: str, mu: float, weight: np.ndarray, momentum: np.ndarray,
                 variance: np.ndarray | None, ref=None) -> list[tuple[str, float, float]]:
    """[(quantity, Frobenius error, tolerance)] of a fast step (float64 ``weight``, ``momentum``,
    ``variance`` after it) against ``stage_reference``: the weight (``muon_tolerance`` with the
    stages' update tolerance, + cautious weight decay's), the momentum, NorMuon's second moment.
    ``ref``: ``stage_reference`` of ``run`` when the caller has it."""
    ref = stage_reference(run, options, mu) if ref is None else ref
    table, safety, eps = _schedule(options)
    eps_mode = options.get("eps_mode", "add")
    sigma_hat = ortho_ref.normalized_singular_values(ref.ns_input, safety=safety, eps=eps, eps_mode=eps_mode)
    shape = run.grad.shape
    ns_tol = tol.ns_tolerance(sigma_hat, table, shape, dtype)
    gains, _ = tol.gains_and_sizes(sigma_hat, table)
    side = ref_stages.equilibration_side(options.get("row_equilibration", False))
    renormalized = ref_stages.renormalize(ref.ns_output) if options.get("renormalize") else None
    beta2 = options.get("normuon_beta2")
    dim = options.get("normuon_dim", "row")
    stages = stage_tolerances(
        ns_tol, shape=shape, dtype=dtype, ns_gain=float(gains[0]), ns_output=ref.ns_output,
        renormalized=renormalized, equilibration=side,
        normuon_input=renormalized if renormalized is not None else ref.ns_output, variance=ref.variance,
        normuon_beta2=beta2, normuon_eps=options.get("normuon_eps", 1e-8),
        normuon_eps_mode=options.get("normuon_eps_mode", "add"),
        normuon_rows=ref_stages.normuon_side(*shape, dim) == "row", state_dtype=dtype)
    w_tol = tol.muon_tolerance(stages.update, ref.lr_scale, options["lr"], float(np.linalg.norm(run.weight)),
                               float(np.linalg.norm(ref.update)), dtype)
    if options.get("cautious_weight_decay"):
        w_tol += tol.cautious_weight_decay_tolerance(run.weight, ref.update, stages.update, options["lr"],
                                                     options["weight_decay"])
    m_tol = tol.momentum_tolerance(float(np.linalg.norm(run.grad)), float(np.linalg.norm(run.momentum)), dtype)
    rows = [("weight", float(np.linalg.norm(weight - ref.weight)), w_tol),
            ("momentum", float(np.linalg.norm(momentum - ref.momentum)), m_tol)]
    if beta2 is not None:
        rows.append(("variance_neuron", float(np.linalg.norm(variance - ref.variance)), stages.variance))
    return rows


def fast_stage_step(run: StageRun, options: dict, dtype: str, mu: float):
    """One ``ortho_fast.Muon`` step of ``run`` with ``options`` in ``dtype`` (parameters, state and
    Newton–Schulz): (weight, momentum, variance or None) after it, float64."""
    opts = dict(options)
    lr, wd = opts.pop("lr"), opts.pop("weight_decay")
    tdt = TORCH_DTYPES[dtype]
    p = torch.nn.Parameter(torch.tensor(run.weight, dtype=tdt))
    opt = ortho_fast.Muon([p], lr=lr, weight_decay=wd, momentum=mu, dtype=tdt, **opts)
    opt.state[p]["momentum_buffer"] = torch.tensor(run.momentum, dtype=tdt)
    if run.variance is not None:
        opt.state[p]["variance_neuron"] = torch.tensor(run.variance, dtype=tdt)
    p.grad = torch.tensor(run.grad, dtype=tdt)
    opt.step()
    variance = opt.state[p].get("variance_neuron")
    return (as_float64(p), as_float64(opt.state[p]["momentum_buffer"]),
            None if variance is None else as_float64(variance))


def stage_map_errors(run: StageRun, options: dict, dtype: str, mu: float, ref=None) -> list[tuple[str, float, float]]:
    """[(quantity, Frobenius error, tolerance)] of ``ortho_fast.functional.muon_stages`` given the
    same inputs as the oracle: MuonEq on the reference's momentum-mixed U and the post stages on the
    reference's Newton–Schulz output, both rounded to ``dtype`` and given to both sides (so only the
    stages' own rounding counts: ``stage_tolerances`` with ε₀ = 0, and ``equilibration_error``).
    This is the claim that survives bfloat16, where the Newton–Schulz tolerance exceeds the step."""
    from ortho_fast.functional import muon_stages as fast_stages

    ref = stage_reference(run, options, mu) if ref is None else ref
    tdt = TORCH_DTYPES[dtype]
    rows = []
    side = ref_stages.equilibration_side(options.get("row_equilibration", False))
    if side is not None:
        _, u = ortho_ref.muon.momentum_update(run.grad, run.momentum, mu=mu, nesterov=options["nesterov"],
                                              momentum_style=options["momentum_style"],
                                              nesterov_form=options.get("nesterov_form", "mix"),
                                              bias_correction=options.get("bias_correction", False),
                                              step=options.get("step"))
        u0 = rounded(u, tdt)
        want = ref_stages.equilibrate(u0, side)
        got = as_float64(fast_stages.pre_orthogonalize([torch.tensor(u0, dtype=tdt)], equilibration=side)[0])
        rows.append(("MuonEq", float(np.linalg.norm(got - want)),
                     equilibration_error(u0.shape, dtype, side) * float(np.linalg.norm(want))))
    beta2 = options.get("normuon_beta2")
    if options.get("renormalize") or beta2 is not None:
        o0 = rounded(ref.ns_output, tdt)
        dim = options.get("normuon_dim", "row")
        eps, eps_mode = options.get("normuon_eps", 1e-8), options.get("normuon_eps_mode", "add")
        renormalized = ref_stages.renormalize(o0) if options.get("renormalize") else None
        stage_in = renormalized if renormalized is not None else o0
        want, want_v = stage_in, None
        if beta2 is not None:
            want, want_v = ref_stages.normuon_normalize(stage_in, run.variance, beta2=beta2, eps=eps,
                                                        eps_mode=eps_mode, dim=dim)
        v_t = None if beta2 is None else [torch.tensor(run.variance, dtype=tdt)]
        got = as_float64(fast_stages.post_orthogonalize(
            [torch.tensor(o0, dtype=tdt)], v_t, renormalize_norm=bool(options.get("renormalize")), beta2=beta2,
            eps=eps, eps_mode=eps_mode, dim=dim)[0])
        bounds = stage_tolerances(0.0, shape=o0.shape, dtype=dtype, ns_gain=0.0, ns_output=o0,
                                  renormalized=renormalized, normuon_input=stage_in, variance=want_v,
                                  normuon_beta2=beta2, normuon_eps=eps, normuon_eps_mode=eps_mode,
                                  normuon_rows=ref_stages.normuon_side(*o0.shape, dim) == "row", state_dtype=dtype)
        rows.append(("post-orthogonalization stages", float(np.linalg.norm(got - want)), bounds.update))
        if beta2 is not None:
            rows.append(("post-orthogonalization variance_neuron", float(np.linalg.norm(as_float64(v_t[0]) - want_v)),
                         bounds.variance))
    return rows


def check_muon_stages(case: MatrixCase, config: str, dtype: str, mu: float = 0.95) -> list[CheckResult]:
    """One ``ortho_fast.Muon`` step with the stages of ``STAGE_CONFIGS[config]`` in ``dtype`` against
    ``ortho_ref.muon.muon_pipeline_step``: rows for the weight, the momentum and NorMuon's second
    moment (a row whose tolerance is not below the size of what it compares — the step lr·s·‖O‖_F,
    or ‖v‖ — claims nothing: bfloat16's Newton–Schulz tolerance), then the stages alone given the
    same inputs (``stage_map_errors``), a claim in every dtype."""
    options = STAGE_CONFIGS[config]
    run = StageRun(case, options, dtype)
    weight, momentum, variance = fast_stage_step(run, options, dtype, mu)
    ref = stage_reference(run, options, mu)
    size = {"weight": options["lr"] * ref.lr_scale * float(np.linalg.norm(ref.update)),
            "momentum": math.inf, "variance_neuron": float(np.linalg.norm(ref.variance)) if ref.variance is not None
            else 0.0}
    out = [measured("muon_stages_vs_reference", case.name, f"{config}/{dtype} {key}", err, bound,
                    "" if bound < size[key] else "tolerance not below the compared quantity: no claim",
                    informative=bound < size[key])
           for key, err, bound in stage_errors(run, options, dtype, mu, weight, momentum, variance, ref)]
    return out + [measured("muon_stages_map_vs_reference", case.name, f"{config}/{dtype} {key}", err, bound)
                  for key, err, bound in stage_map_errors(run, options, dtype, mu, ref)]


def stage_jobs(cases) -> list[tuple[str, callable]]:
    """(label, thunk) of every stage check for ``ortho-verify``'s job list: each case, each
    configuration of ``STAGE_CONFIGS``, each dtype of ``STAGE_DTYPES``."""
    return [(f"Muon stages {cfg}/{dtype} {case.name}", lambda c=case, g=cfg, d=dtype: check_muon_stages(c, g, d))
            for case in cases for cfg in STAGE_CONFIGS for dtype in STAGE_DTYPES]


class StepInputs:
    """The float64 inputs of one optimizer step as ``stage_errors`` reads them (``StageRun``'s
    attributes): weight, gradient, momentum and NorMuon's second moment before the step."""

    def __init__(self, weight: np.ndarray, grad: np.ndarray, momentum: np.ndarray, variance) -> None:
        self.weight, self.grad, self.momentum, self.variance = weight, grad, momentum, variance


def stage_step_rows(conv, inputs: StepInputs, after: tuple, *, lr: float, mu: float, wd: float, dtype: str,
                    name: str, step: int | None = None) -> tuple[list[CheckResult], np.ndarray]:
    """``check_optimizer``'s rows for a step under ``MuonConventions`` that declare pipeline stages
    (``conv.has_stages``): the weight, momentum and NorMuon second moment ``after`` the step
    (float64; None for a state the conventions do not name) against
    ``ortho_ref.muon.muon_pipeline_step`` of ``inputs``, with ``stage_errors``' tolerances in
    ``dtype`` (the coarser of the parameters' and the Newton–Schulz dtype). A row whose tolerance
    is not below what it compares claims nothing (as in ``check_muon_stages``). ``step``: the
    1-based step index, which a bias-corrected momentum (``conv.bias_correction``) needs.
    Returns (rows, the reference's momentum)."""
    options = dict(lr=lr, weight_decay=wd, nesterov=conv.nesterov, momentum_style=conv.momentum_style,
                   coefficients=conv.coefficients, ns_steps=conv.ns_steps, safety=conv.safety, eps=conv.eps,
                   eps_mode=conv.eps_mode, adjust_lr=conv.adjust_lr, extra_scale_factor=conv.extra_scale_factor,
                   cautious_weight_decay=conv.cautious_weight_decay, nesterov_form=conv.nesterov_form,
                   weight_decay_style=conv.weight_decay_style, bias_correction=conv.bias_correction, step=step,
                   **conv.stage_kwargs())
    ref = stage_reference(inputs, options, mu)
    weight, momentum, variance = after
    errors = stage_errors(inputs, options, dtype, mu, weight, ref.momentum if momentum is None else momentum,
                          ref.variance if variance is None else variance, ref)
    size = {"weight": lr * ref.lr_scale * float(np.linalg.norm(ref.update)), "momentum": math.inf,
            "variance_neuron": float(np.linalg.norm(ref.variance)) if ref.variance is not None else 0.0}
    given = {"weight": True, "momentum": momentum is not None, "variance_neuron": variance is not None}
    rows = [measured("muon_stages_vs_reference", name, f"{key} (stages: {conv.stage_kwargs()})", err, bound,
                     "" if bound < size[key] else "tolerance not below the compared quantity: no claim",
                     informative=bound < size[key])
            for key, err, bound in errors if given[key]]
    return rows, ref.momentum
