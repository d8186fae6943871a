"""Golden files: the float64 oracle still matches the stored 50-digit outputs; the files
round-trip; a corrupted file is caught."""

import json
import shutil

import mpmath
import numpy as np
import pytest

from ortho_ref import golden, mp
from ortho_verify import tolerances as tol
from ortho_verify.checks.golden import check_golden_files, golden_tolerances

SIDECAR_KEYS = {"name", "function", "arguments", "inputs", "outputs", "digits", "generator", "mpmath_version",
                "mpmath_backend", "numpy_version", "date", "provenance", "accuracy", "tolerance"}
SMALL = "polar_4x4_well"


def test_every_case_is_stored_and_small():
    assert golden.names() == sorted(golden.SPECS)
    assert sum(p.stat().st_size for p in golden.DATA.iterdir()) < 1_000_000
    for name in golden.names():
        g = golden.load(name)
        assert SIDECAR_KEYS <= set(g.meta) and g.digits == golden.DIGITS
        assert all(v["value"] is not None for v in g.meta["tolerance"].values())


def test_float64_oracle_matches_golden_outputs():
    results = check_golden_files()
    expected = sum(len(golden.load(name).outputs) for name in golden.names())
    assert len(results) == expected
    failed = [(r.input, r.detail, r.ratio) for r in results if not r.passed]
    assert failed == []
    assert all(r.tolerance > 0 and not r.note.startswith(("below", "ill-posed")) for r in results)


def test_stored_outputs_round_trip_to_a_fresh_50_digit_computation():
    g = golden.load(SMALL)
    fresh = golden.compute_exact(golden.SPECS[SMALL], g.inputs)
    for name, value in fresh.items():
        stored = g.exact(name)
        with mpmath.workdps(2 * golden.DIGITS):
            dist = mpmath.sqrt(mpmath.fsum((x - y) ** 2 for x, y in zip(stored.ravel(), value.ravel())))
        # fresh: within 10^-50 of exact; stored hi + lo: within 10^-50 + 2^-106·|x| (scale 1: polar)
        assert dist <= 2 * tol.mp_accuracy(value.shape, golden.DIGITS)


def test_generate_writes_checkable_files(tmp_path):
    golden.generate(tmp_path, only=[SMALL], tolerance=golden_tolerances)
    assert golden.names(tmp_path) == [SMALL]
    (result,) = check_golden_files(tmp_path)
    assert result.passed
    meta = json.loads((tmp_path / f"{SMALL}.json").read_text())
    assert meta["tolerance"]["polar"]["value"] == result.tolerance
    assert meta["provenance"]["seed"] == golden.SPECS[SMALL].seed


def test_corrupted_golden_output_is_caught(tmp_path):
    for suffix in (".npz", ".json"):
        shutil.copy(golden.DATA / f"{SMALL}{suffix}", tmp_path / f"{SMALL}{suffix}")
    (before,) = check_golden_files(tmp_path)
    with np.load(tmp_path / f"{SMALL}.npz") as data:
        arrays = {k: data[k].copy() for k in data.files}
    arrays["hi_polar"][0, 0] += 2 * before.tolerance  # error >= 2·tol − (error before) > tol
    np.savez_compressed(tmp_path / f"{SMALL}.npz", **arrays)
    (after,) = check_golden_files(tmp_path)
    assert before.passed and not after.passed


def test_bad_names_and_directories(tmp_path):
    with pytest.raises(KeyError, match="known"):
        golden.load("no_such_file")
    with pytest.raises(ValueError, match="no golden files"):
        check_golden_files(tmp_path)
    with pytest.raises(KeyError):
        golden.generate(tmp_path, only=["no_such_case"])


def test_dion_step_exact_bad_input():
    w = np.zeros((6, 4))
    args = dict(lr=0.01, mu=0.95, weight_decay=0.1, epsilon=1e-8)
    with pytest.raises(ValueError, match="Q: expected shape"):
        golden.dion_step_exact(w, np.ones((6, 4)), w, np.ones((6, 2)), **args)
    with pytest.raises(ValueError, match="grad"):
        golden.dion_step_exact(w, np.ones((4, 6)), w, np.ones((4, 2)), **args)
    with pytest.raises(ValueError, match="rank deficient"):
        golden.dion_step_exact(w, np.ones((6, 4)), w, np.ones((4, 2)), **args)  # B Q has rank 1
    with pytest.raises(ValueError, match="mu"):
        golden.dion_step_exact(w, np.eye(6, 4), w, np.eye(4, 2), **{**args, "mu": 2.0})


@pytest.mark.parametrize("shape", [(mp.MAX_DIM + 1, 4), (4, mp.MAX_DIM + 1), (256, 256)])
def test_dion_step_exact_refuses_large_inputs_before_any_work(shape):
    # 256 x 256 ran for over 30 s before the limit; now the same MAX_DIM as every mpmath function.
    m, n = shape
    w, q = np.ones(shape), np.ones((min(m, n), 2))
    args = dict(lr=0.01, mu=0.95, weight_decay=0.1, epsilon=1e-8)
    with pytest.raises(ValueError, match=f"^weight: .*MAX_DIM = {mp.MAX_DIM}"):
        golden.dion_step_exact(w, w, w, q, **args)
    with pytest.raises(ValueError, match=str(mp.MAX_DIGITS)):
        golden.dion_step_exact(w[:4, :4], w[:4, :4], w[:4, :4], q[:4], digits=mp.MAX_DIGITS + 1, **args)
