"""ortho_verify.report.baseline: the regression margin, coverage and golden-file rows."""

import json
import math

import pytest

from ortho_verify import checks
from ortho_verify.checks import CheckResult
from ortho_verify.report import baseline
from ortho_verify.tolerances import BASELINE_FLOOR, BASELINE_GROWTH

MODE = {"quick": True, "real_inputs_used": False, "seed": 0}


def _row(check, inp, ratio, detail="d"):
    return CheckResult(check, inp, detail, ratio, 1.0, ratio <= 1.0)


def _verdicts(rows):
    return {r.check: r.passed for r in rows}


@pytest.fixture
def stored(tmp_path):
    golden = tmp_path / "golden"
    golden.mkdir()
    (golden / "a.json").write_text("{}")
    results = [_row("ns", "x", 0.02), _row("ns", "y", 0.3), _row("dion", "x", 0.0)]
    path = baseline.write(tmp_path / "b.json", results, MODE, golden_dir=golden)
    return baseline.load(path), golden


@pytest.mark.parametrize("new_ratio, passes", [
    (0.3, True),                                   # unchanged
    (BASELINE_GROWTH * 0.3, True),                 # exactly at the margin
    (BASELINE_GROWTH * 0.3 * 1.01, False),         # just above 2x
])
def test_growth_margin_above_the_floor(stored, new_ratio, passes):
    body, golden = stored
    rows = baseline.compare([_row("ns", "x", 0.02), _row("ns", "y", new_ratio), _row("dion", "x", 0.0)], body, MODE,
                            golden_dir=golden)
    assert all(r.passed for r in rows if r.check == "baseline_regression") is passes


def test_small_ratios_may_grow_up_to_the_floor(stored):
    body, golden = stored
    # 0.02 -> 0.09 is 4.5x but below the floor; a bitwise check (0) growing to 0.05 too
    ok = baseline.compare([_row("ns", "x", 0.09), _row("ns", "y", 0.3), _row("dion", "x", 0.05)], body, MODE,
                          golden_dir=golden)
    assert all(r.passed for r in ok)
    bad = baseline.compare([_row("ns", "x", BASELINE_FLOOR * 1.5), _row("ns", "y", 0.3), _row("dion", "x", 0.0)],
                           body, MODE, golden_dir=golden)
    failed = [r for r in bad if not r.passed]
    assert len(failed) == 1 and failed[0].input == "x" and failed[0].tolerance == BASELINE_FLOOR


def test_missing_checks_fail_only_in_the_same_mode(stored):
    body, golden = stored
    partial = [_row("ns", "x", 0.02)]
    same = {r.check: r for r in baseline.compare(partial, body, MODE, golden_dir=golden)}
    assert not same["baseline_coverage"].passed and same["baseline_coverage"].error == 2
    other = baseline.compare(partial, body, {**MODE, "quick": False}, golden_dir=golden)
    assert "baseline_coverage" not in {r.check for r in other}  # no claim to make: no row
    assert all(r.passed and "coverage not enforced" in r.note for r in other)


def test_changed_golden_file_fails(stored):
    body, golden = stored
    results = [_row("ns", "x", 0.02), _row("ns", "y", 0.3), _row("dion", "x", 0.0)]
    assert _verdicts(baseline.compare(results, body, MODE, golden_dir=golden))["baseline_golden_files"]
    (golden / "a.json").write_text('{"changed": 1}')
    row = {r.check: r for r in baseline.compare(results, body, MODE, golden_dir=golden)}["baseline_golden_files"]
    assert not row.passed and row.note == "changed or removed: a"


def test_write_refuses_failures_and_load_validates(tmp_path):
    with pytest.raises(ValueError, match="failed"):
        baseline.write(tmp_path / "b.json", [_row("ns", "x", 2.0)], MODE)
    (tmp_path / "bad.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(ValueError, match="format"):
        baseline.load(tmp_path / "bad.json")


def test_rows_without_a_claim_are_not_recorded(tmp_path):
    vacuous = checks.no_claim("dion", "z", "d", "ill-posed")
    body = baseline.load(baseline.write(tmp_path / "b.json", [_row("ns", "x", 0.02), vacuous], MODE))
    assert list(body["ratios"]) == ["ns | x | d"]
    # a row that claimed in the baseline and no longer does counts as missing
    then = baseline.load(baseline.write(tmp_path / "c.json", [_row("ns", "x", 0.02), _row("dion", "z", 0.1)], MODE))
    coverage = {r.check: r for r in baseline.compare([_row("ns", "x", 0.02), vacuous], then, MODE)}
    assert not coverage["baseline_coverage"].passed and "dion | z | d" in coverage["baseline_coverage"].note


def test_infinite_ratio_round_trips(tmp_path):
    inf_row = CheckResult("c", "i", "d", 1.0, 0.0, True)  # passed flag set by hand; ratio is inf
    body = baseline.load(baseline.write(tmp_path / "b.json", [inf_row], MODE))
    assert math.isinf(body["ratios"]["c | i | d"]) and baseline.allowed_ratio(math.inf) == math.inf


def _copy_golden(tmp_path, name="dion_24x16_rank4"):
    import shutil

    folder = tmp_path / "golden_copy"
    folder.mkdir()
    for ext in ("json", "npz"):
        shutil.copy(baseline.GOLDEN_DIR / f"{name}.{ext}", folder / f"{name}.{ext}")
    return folder, name


def test_golden_hash_ignores_how_and_when_the_data_was_made(tmp_path):
    import numpy as np

    folder, name = _copy_golden(tmp_path)
    before = baseline.golden_hashes(folder)
    sidecar = folder / f"{name}.json"
    meta = json.loads(sidecar.read_text())
    meta.update(date="2031-01-01", mpmath_backend="gmpy", mpmath_version="9.9", numpy_version="9.9")
    meta["tolerance"]["P"]["value"] *= 2
    sidecar.write_text(json.dumps(meta, indent=4))  # regenerated another day, with gmpy2: same data
    assert baseline.golden_hashes(folder) == before
    meta["arguments"]["mu"] = 0.9  # what the data means changed
    sidecar.write_text(json.dumps(meta))
    assert baseline.golden_hashes(folder) != before
    meta["arguments"]["mu"] = 0.95
    sidecar.write_text(json.dumps(meta))
    with np.load(folder / f"{name}.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["hi_weight"] = arrays["hi_weight"].copy()
    arrays["hi_weight"][0, 0] = np.nextafter(arrays["hi_weight"][0, 0], np.inf)  # one ulp in one stored value
    np.savez(folder / f"{name}.npz", **arrays)
    changed = baseline.golden_hashes(folder)
    assert set(changed) == {name} and changed != before
