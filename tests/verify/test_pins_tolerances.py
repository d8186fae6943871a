"""Pinned tolerances, the rest: ``ef_subspace_tolerances``,
``ef_bookkeeping_tolerance``, ``sharded_tolerance``, ``compiled_tolerance``, ``adamw_tolerances``,
``lion_tolerances``, ``cautious_weight_decay_tolerance``, ``error_feedback_projection_tolerance`` and the
baseline margin.

As tests/verify/test_pinned_muon.py: at a fixed input the formula's value is recorded (``PIN_*``,
3 significant digits, never a call of the tolerance function), and a planted error of ``BEYOND``
times it fails the comparison the judge makes with the tolerance, one of ``INSIDE`` times passes;
so a tolerance loosened (or tightened) by 10x fails a test. docs/verification.md, "Pinned tolerances".
"""

from __future__ import annotations

import numpy as np
import pytest

import ortho_ref
from ortho_verify import tolerances as tol
from ortho_verify.report import baseline
from ortho_verify.report.results import CheckResult, measured

BEYOND, INSIDE = 2.0, 0.5
PLANTS = [(BEYOND, False), (INSIDE, True)]

# --- Dion's subspace split and bookkeeping (checks ef_outside_subspace, ef_inside_subspace, ef_bookkeeping) ---

#: ``ef_subspace_tolerances(2.0, 2.5, 1.5, 0.95, 24, 6, "float32", ef)`` -> (outside, inside).
PIN_EF_SUBSPACE = {True: (1.17e-06, 1.33e-06), False: (1.31e-05, 1.62e-05)}
#: ``ef_bookkeeping_tolerance([1e-6, 2e-6, 3e-6], [1, 2, 3], "float32")``.
PIN_EF_BOOKKEEPING = 6.72e-06


def _passes(error: float, tolerance: float) -> bool:
    """The judge's comparison (``ortho_verify.report.results.measured``)."""
    return measured("pin", "pinned", "", error, tolerance).passed


@pytest.mark.parametrize("error_feedback", [True, False])
@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize("factor, passes", PLANTS)
def test_ef_subspace_tolerances_pinned(error_feedback, which, factor, passes):
    bound = tol.ef_subspace_tolerances(2.0, 2.5, 1.5, 0.95, 24, 6, "float32", error_feedback)[which]
    assert _passes(factor * PIN_EF_SUBSPACE[error_feedback][which], bound) is passes


@pytest.mark.parametrize("factor, passes", PLANTS)
def test_ef_bookkeeping_tolerance_pinned(factor, passes):
    bound = tol.ef_bookkeeping_tolerance([1e-6, 2e-6, 3e-6], [1.0, 2.0, 3.0], "float32")
    assert _passes(factor * PIN_EF_BOOKKEEPING, bound) is passes


# --- sharded and compiled steps: relative Frobenius differences ---

#: The layout contract (docs/design.md, "Distributed layouts and the layout contract").
PIN_SHARDED = {"float64": 1e-12, "float32": 1e-5}


def _relative_plant(factor: float, pinned: float, seed: int) -> float:
    """‖X + δ − X‖_F/‖X‖_F for δ of relative size factor·pinned along a random direction, measured
    as the sharded and compiled checks measure it."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((7, 5))
    e = rng.standard_normal((7, 5))
    planted = x + factor * pinned * np.linalg.norm(x) * e / np.linalg.norm(e)
    return float(np.linalg.norm(planted - x) / np.linalg.norm(x))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("factor, passes", PLANTS)
def test_sharded_tolerance_pinned(dtype, factor, passes):
    assert (_relative_plant(factor, PIN_SHARDED[dtype], 1) <= tol.sharded_tolerance(dtype)) is passes


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("factor, passes", PLANTS)
def test_compiled_tolerance_pinned(dtype, factor, passes):
    assert (_relative_plant(factor, PIN_SHARDED[dtype], 2) <= tol.compiled_tolerance(dtype)) is passes


# --- AdamW and Lion: per-entry tolerances of one float32 step ---

W = np.array([[0.5, -0.2, 0.05], [0.1, 0.3, -0.7]])
G = np.array([[0.2, 0.1, -0.3], [0.05, -0.4, 0.6]])
M = np.array([[0.01, -0.02, 0.03], [0.0, 0.05, -0.01]])
V = np.array([[1e-3, 2e-3, 1e-4], [3e-4, 5e-4, 2e-3]])
#: ``adamw_tolerances`` at (W, G, M, V), step 2, lr 0.01, betas (0.9, 0.999), eps 1e-8, wd 0.1, float32.
PIN_ADAMW = {"weight": [[9.37e-08, 3.73e-08, 2.08e-08], [1.96e-08, 6.23e-08, 1.33e-07]],
             "exp_avg": [[5.01e-08, 2.86e-08, 7.87e-08], [1.19e-08, 1.07e-07, 1.45e-07]],
             "exp_avg_sq": [[2.48e-10, 4.79e-10, 4.53e-11], [7.21e-11, 1.57e-10, 5.62e-10]]}
#: ``lion_tolerances`` at (W, G, M), lr 0.01, betas (0.9, 0.99), wd 0.1, float32 (every |c| > sign margin).
PIN_LION = {"weight": [[9.06e-08, 3.70e-08, 1.01e-08], [1.91e-08, 5.48e-08, 1.26e-07]],
            "exp_avg": [[5.01e-08, 2.86e-08, 7.87e-08], [1.19e-08, 1.07e-07, 1.45e-07]]}


def _entrywise(ref: np.ndarray, pinned, factor: float, bound: np.ndarray) -> bool:
    """Every entry moved by factor·pinned (alternating signs), compared entrywise as the scalar
    optimizers' tests compare."""
    signs = np.where(np.arange(ref.size).reshape(ref.shape) % 2 == 0, 1.0, -1.0)
    planted = ref + factor * np.asarray(pinned) * signs
    return bool(np.all(np.abs(planted - ref) <= bound))


@pytest.mark.parametrize("key", sorted(PIN_ADAMW))
@pytest.mark.parametrize("factor, passes", PLANTS)
def test_adamw_tolerances_pinned(key, factor, passes):
    ref = ortho_ref.adamw_step(W, G, M, V, 2, lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    bound = tol.adamw_tolerances(ref, W, G, M, lr=0.01, betas=(0.9, 0.999), eps=1e-8, dtype="float32")[key]
    assert _entrywise(getattr(ref, key), PIN_ADAMW[key], factor, bound) is passes


@pytest.mark.parametrize("key", sorted(PIN_LION))
@pytest.mark.parametrize("factor, passes", PLANTS)
def test_lion_tolerances_pinned(key, factor, passes):
    ref = ortho_ref.lion_step(W, G, M, lr=0.01, betas=(0.9, 0.99), weight_decay=0.1)
    bound = tol.lion_tolerances(ref, W, G, M, lr=0.01, dtype="float32")[key]
    assert _entrywise(getattr(ref, key), PIN_LION[key], factor, bound) is passes


# --- cautious weight decay ---

#: ``cautious_weight_decay_tolerance`` for W = [[0.5, -0.2], [0.1, 0.3]], O_ref = [[1e-6, -0.4], [0.3, -2e-6]],
#: ns_tol 1e-5, lr 0.02, wd 0.1: lr·wd·‖(0.5, 0.3)‖ (the two ambiguous entries).
PIN_CAUTIOUS = 1.17e-03


@pytest.mark.parametrize("factor, passes", PLANTS)
def test_cautious_weight_decay_tolerance_pinned(factor, passes):
    w = np.array([[0.5, -0.2], [0.1, 0.3]])
    o = np.array([[1e-6, -0.4], [0.3, -2e-6]])
    bound = tol.cautious_weight_decay_tolerance(w, o, 1e-5, 0.02, 0.1)
    assert _passes(factor * PIN_CAUTIOUS, bound) is passes
    assert tol.cautious_weight_decay_tolerance(w, o, 1e-7, 0.02, 0.1) == 0.0  # no ambiguous sign: no allowance


# --- the baseline margin of ortho-verify --baseline ---

#: max(2·r_old, 0.1): growth 2, floor 0.1 (``ortho_verify.tolerances.baselines``).
PIN_GROWTH, PIN_FLOOR = 2.0, 0.1


@pytest.mark.parametrize("old", [0.3, 0.001])
@pytest.mark.parametrize("factor, passes", PLANTS)
def test_baseline_margin_pinned(tmp_path, old, factor, passes):
    """A new ratio of factor·max(2·old, 0.1) regresses for factor 2 and not for 0.5 (both branches:
    old 0.3 is above the floor's reach, old 0.001 below it), through ``baseline.write`` / ``compare``."""
    golden = tmp_path / "golden"
    golden.mkdir()
    mode = {"quick": True}
    path = baseline.write(tmp_path / "b.json", [CheckResult("ns", "x", "d", old, 1.0, True)], mode, golden_dir=golden)
    allowed = max(PIN_GROWTH * old, PIN_FLOOR)
    rows = baseline.compare([CheckResult("ns", "x", "d", factor * allowed, 1.0, True)], baseline.load(path), mode,
                            golden_dir=golden)
    assert all(r.passed for r in rows if r.check == "baseline_regression") is passes, rows


# --- error feedback's two identities on a computed P (ortho_fast / ortho_ref Dion tests) ---

#: ``error_feedback_projection_tolerance(1e-6, rows=24, b_norm=2.0, m_norm=1.9, r_norm=1.5, p_norm=2.4,
#: mu=0.95, orthogonality=1e-6, dtype="float32")``.
PIN_EF_PROJECTION = 1.23e-06


@pytest.mark.parametrize("factor, passes", PLANTS)
def test_error_feedback_projection_tolerance_pinned(factor, passes):
    bound = tol.error_feedback_projection_tolerance(1e-6, rows=24, b_norm=2.0, m_norm=1.9, r_norm=1.5, p_norm=2.4,
                                                    mu=0.95, orthogonality=1e-6, dtype="float32")
    assert _passes(factor * PIN_EF_PROJECTION, bound) is passes
