"""Golden-file regression checks: the float64 oracle against outputs stored at 50 digits.

For every file of ``ortho_ref.golden`` (or another directory), run the float64 oracle
(``ortho_ref.polar``, ``ortho_ref.ns_map``, ``ortho_ref.dion_step``) on the stored inputs and
compare each output with the stored hi + lo pair, within a tolerance from
``ortho_verify.tolerances``: ``mp_agreement_tolerance`` for polar and ns_map, ``dion_tolerances``
(float64) plus ``mp_accuracy`` for the Dion step. The error is ‖X_oracle − (hi + lo)‖_F,
formed as ‖(X_oracle − hi) − lo‖_F.
"""

from __future__ import annotations

import numpy as np

import ortho_ref
from ortho_ref import golden as golden_files

from .. import tolerances as tol
from ..report.results import CheckResult, measured, no_claim

CHECK = "golden"
DION_OUTPUTS = ("weight", "momentum", "Q", "P")


def _oracle(g: "golden_files.Golden") -> dict:
    """Float64 oracle outputs with their tolerances: name -> (value, tolerance or None, formula)."""
    x, args, d = g.inputs, g.arguments, g.digits
    if g.function == "polar":
        return {"polar": (ortho_ref.polar(x["a"]), tol.mp_agreement_tolerance(x["a"], "polar", digits=d),
                          "mp_agreement_tolerance(a, 'polar', digits) = polar_tolerance(a, float64) + mp_accuracy")}
    if g.function == "ns_map":
        kw = {k: args[k] for k in ("safety", "eps", "eps_mode")}
        a, table = x["a"], x["coefficients"]
        return {"ns_map": (ortho_ref.ns_map(a, table, **kw),
                           tol.mp_agreement_tolerance(a, "ns_map", table, digits=d, **kw),
                           "mp_agreement_tolerance(a, 'ns_map', ...) = ns_map_tolerance(a, table, float64) + "
                           "mp_accuracy")}
    kw = {k: args[k] for k in golden_files.DION_ARGUMENTS}
    step = ortho_ref.dion_step(x["weight"], x["grad"], x["momentum"], x["Q"], **kw)
    bounds = tol.dion_tolerances(step, x["Q"], lr=kw["lr"], mu=kw["mu"], weight=x["weight"], dtype="float64")
    out = {}
    for name in DION_OUTPUTS:
        value = getattr(step, name)
        hi = g.outputs[name][0]
        bound = bounds[name] + tol.mp_accuracy(hi.shape, d, float(np.max(np.abs(hi)))) if bounds["well_posed"] else None
        out[name] = (value, bound, f"dion_tolerances(float64)['{name}'] + mp_accuracy(shape, digits, max|x|)")
    return out


def golden_tolerances(g: "golden_files.Golden") -> dict:
    """Per output of a golden file: {"formula": ..., "value": tolerance or None}, for the sidecar
    (``ortho_ref.golden.generate(tolerance=golden_tolerances)``)."""
    return {name: {"formula": formula, "value": bound} for name, (_, bound, formula) in _oracle(g).items()}


def check_golden(g: "golden_files.Golden") -> list[CheckResult]:
    """One ``CheckResult`` per output of one golden file. Where the first-order tolerance does not
    apply (polar below its validity limit, an ill-posed Dion step) the check is the property
    U·H = A with the stored U (polar) or is reported as a "no claim" row (Dion, ``no_claim``)."""
    results = []
    for name, (value, bound, formula) in _oracle(g).items():
        hi, lo = g.outputs[name]
        detail = f"{g.function} {name} {hi.shape[0]}x{hi.shape[1]}"
        error = np.linalg.norm((value - hi) - lo)
        if bound is not None:
            results.append(measured(CHECK, g.name, detail, error, bound, formula))
        elif g.function == "polar":
            a = g.inputs["a"]
            _, h = ortho_ref.polar_decomposition(a)
            s0 = float(ortho_ref.singular_values(a)[0])
            results.append(measured(CHECK, g.name, detail + " (U·H = A)", np.linalg.norm(hi @ h - a),
                                   tol.polar_hermitian_tolerance(a.shape, s0) + tol.svd_residual_tolerance(a.shape, s0),
                                   "below first-order validity: property check"))
        else:
            results.append(no_claim(CHECK, g.name, detail, "ill-posed: P not determined by B in float64; not compared",
                                    {"error": float(error)}))
    return results


def check_golden_files(directory=None) -> list[CheckResult]:
    """Every golden file in ``directory`` (default: ``ortho_ref/golden/data``), one
    ``CheckResult`` per stored output: error ‖X_oracle − (hi + lo)‖_F and its tolerance.
    Raises: ValueError if the directory holds no golden file."""
    found = golden_files.names(directory)
    if not found:
        raise ValueError(f"directory: no golden files (*.json + *.npz) in {directory or golden_files.DATA}")
    return [r for name in found for r in check_golden(golden_files.load(name, directory))]
