"""Pinned tolerances of the Dion checks.

Each test plants an error of a known size into an otherwise exact result and runs it through the
check that uses the tolerance: an error of ``BEYOND`` times the tolerance must fail, one of
``INSIDE`` times it must pass. The size of the plant never comes from the tolerance function
itself (that would move with it): it is either the derivation restated here with its literal
constants, or ``PIN_*``, the tolerance's value at this fixed input recorded once from the
formula (3 significant digits; docs/tolerances.md has the derivations). So a tolerance loosened
by 10x (or tightened by 10x) fails one of these tests: docs/verification.md, "Pinned tolerances".
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import ortho_ref
from ortho_verify import tolerances as tol
from ortho_verify.checks.dion import dion_reference_rows
from ortho_verify.checks.error_feedback import DionTrace, identity_rows

#: Plant sizes relative to the pinned tolerance: beyond (must fail) and inside (must pass).
#: Both are within 10x of 1, so a tolerance loosened or tightened 10x flips one verdict.
BEYOND, INSIDE = 2.0, 0.5
U32 = 2.0**-24
MU = 0.95


def _direction(rng: np.random.Generator, shape) -> np.ndarray:
    """A random direction of unit Frobenius norm."""
    e = rng.standard_normal(shape)
    return e / np.linalg.norm(e)


def _trace(seed: int = 3, m: int = 14, n: int = 9, r: int = 4) -> DionTrace:
    """One exact float64 Dion step in the working orientation: P = qr(BQ), R = BᵀP,
    M = B − (1 − μ)PRᵀ."""
    rng = np.random.default_rng(seed)
    g, b = rng.standard_normal((m, n)), rng.standard_normal((m, n))
    p, _ = np.linalg.qr(b @ rng.standard_normal((n, r)))
    r_mat = b.T @ p
    q = r_mat / np.linalg.norm(r_mat, axis=0)
    return DionTrace([g], [b], [p], [r_mat], [b - (1 - MU) * p @ r_mat.T], [q], np.zeros((m, n)))


def _row(rows, check):
    [row] = [r for r in rows if r.check == check]
    return row


@pytest.mark.parametrize("factor, passes", [(BEYOND, False), (INSIDE, True)])
def test_error_feedback_tolerance_pinned(factor, passes):
    """``error_feedback_tolerance`` through ``identity_rows`` (check ``dion_error_feedback``):
    2u(√r(1 − μ)‖P‖‖R‖ + 2(‖B‖ + (1 − μ)‖P‖‖R‖)), restated."""
    trace = _trace()
    rows, r = trace.P[0].shape
    bn, pn, rn = (float(np.linalg.norm(a[0])) for a in (trace.B, trace.P, trace.R))
    pinned = 2 * U32 * (math.sqrt(r) * (1 - MU) * pn * rn + 2 * (bn + (1 - MU) * pn * rn))
    trace.M[0] = trace.M[0] + factor * pinned * _direction(np.random.default_rng(0), trace.M[0].shape)
    row = _row(identity_rows("pinned", "ef", trace, mu=MU, dtype="float32"), "dion_error_feedback")
    assert row.passed is passes, row


@pytest.mark.parametrize("factor, passes", [(BEYOND, False), (INSIDE, True)])
def test_orthonormality_tolerance_pinned(factor, passes):
    """``orthonormality_tolerance`` through ``identity_rows`` (check ``dion_orthonormal_P``):
    C_NS·√r·(3 + rows)·u with C_NS = 2, restated. P·diag(√(1 + δ)) has PᵀP − I = diag(δ) exactly."""
    trace = _trace()
    rows, r = trace.P[0].shape
    pinned = 2.0 * math.sqrt(r) * (3 + rows) * U32
    delta = factor * pinned * _direction(np.random.default_rng(1), r)
    trace.P[0] = trace.P[0] * np.sqrt(1 + delta)
    trace.R[0] = trace.B[0].T @ trace.P[0]
    trace.M[0] = trace.B[0] - (1 - MU) * trace.P[0] @ trace.R[0].T  # the identity still holds exactly
    out = identity_rows("pinned", "orth", trace, mu=MU, dtype="float32")
    assert _row(out, "dion_error_feedback").passed
    row = _row(out, "dion_orthonormal_P")
    assert row.passed is passes, row


def _dion_case():
    rng = np.random.default_rng(13)
    m, n, r = 12, 7, 3
    w, g, m0 = 0.02 * rng.standard_normal((m, n)), rng.standard_normal((m, n)), 0.5 * rng.standard_normal((m, n))
    q0 = rng.standard_normal((n, r))
    return w, q0, ortho_ref.dion_step(w, g, m0, q0, lr=0.01, mu=MU, weight_decay=0.1)


#: ``dion_tolerances`` (float32) at ``_dion_case``: κ₂(BQ) = 2.77.
PIN_DION = {"weight": 9.78e-08, "momentum": 1.96e-06, "Q": 4.31e-06}
#: ``dion_variant_tolerances`` (float32 state and parameters) at ``_dion_case``, per QR method.
PIN_DION_VARIANT = {"householder": {"weight": 7.55e-07, "momentum": 9.85e-06, "Q": 4.06e-05},
                    "cholesky_qr": {"weight": 1.22e-06, "momentum": 1.46e-05, "Q": 6.62e-05}}


def _dion_rows(key: str, size: float, bounds=None, check="dion_vs_reference"):
    w, q0, ref = _dion_case()
    fast = {"weight": ref.weight, "momentum": ref.momentum, "Q": ref.Q}
    fast[key] = fast[key] + size * _direction(np.random.default_rng(2), fast[key].shape)
    rows = dion_reference_rows("pinned", "dion", ref, q0, w, lr=0.01, mu=MU, dtype="float32", bounds=bounds,
                               check=check, **fast)
    return {r.detail.split()[-1]: r for r in rows}


@pytest.mark.parametrize("key", sorted(PIN_DION))
@pytest.mark.parametrize("factor, passes", [(BEYOND, False), (INSIDE, True)])
def test_dion_tolerances_pinned(key, factor, passes):
    """``dion_tolerances`` through ``dion_reference_rows`` (check ``dion_vs_reference``), per
    quantity; the other quantities are exact and pass."""
    rows = _dion_rows(key, factor * PIN_DION[key])
    assert rows[key].passed is passes, rows[key]
    assert all(r.passed for k, r in rows.items() if k != key)


@pytest.mark.parametrize("qr_method", sorted(PIN_DION_VARIANT))
@pytest.mark.parametrize("key", ["weight", "momentum", "Q"])
@pytest.mark.parametrize("factor, passes", [(BEYOND, False), (INSIDE, True)])
def test_dion_variant_tolerances_pinned(qr_method, key, factor, passes):
    """``dion_variant_tolerances`` through ``dion_reference_rows`` (check ``dion_variant_vs_reference``,
    as ``check_dion(variant=...)`` and ``check_optimizer`` call it)."""
    w, q0, ref = _dion_case()
    bounds = tol.dion_variant_tolerances(ref, q0, lr=0.01, mu=MU, weight=w, dtype="float32", param_dtype="float32",
                                         q_dtype="float32", qr_method=qr_method)
    rows = _dion_rows(key, factor * PIN_DION_VARIANT[qr_method][key], bounds, "dion_variant_vs_reference")
    assert rows[key].passed is passes, rows[key]
