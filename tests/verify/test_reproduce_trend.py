"""The size sweep's trend rule (``ortho_verify.reproduce.trend``) on synthetic results: shrinking,
growing, flat and noisy differences, each verdict able to come out every way."""

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from ortho_verify.reproduce import scaling
from ortho_verify.reproduce.trend import TRENDS, seed_slopes, trend_verdict

SIZES = (24_576, 98_304, 393_216)  # the default sweep's matrix parameters (d_model 32, 64, 128)
SEEDS = (1, 2, 3)
#: Per-seed, per-size noise (nats/byte), zero mean per seed: it moves each seed's slope a little.
NOISE = np.array([[0.002, -0.001, -0.001], [-0.001, 0.002, -0.001], [-0.001, -0.001, 0.002]])
MARGIN = 0.018  # 1 % of a loss of 1.8 nats/byte


def _series(gap_at_smallest: float, per_doubling: float, noise_scale: float = 1.0, sizes=SIZES):
    """Seed -> difference at each size: gap + slope·log2(N / N_min) + noise."""
    x = np.log2(np.asarray(sizes, float) / sizes[0])
    return [{s: gap_at_smallest + per_doubling * x[i] + noise_scale * NOISE[j % 3][i % 3] for j, s in enumerate(SEEDS)}
            for i in range(len(sizes))]


def _verdict(*args, **kwargs) -> str:
    out = trend_verdict(SIZES, _series(*args, **kwargs), MARGIN)
    assert out["verdict"] in TRENDS
    return out["verdict"]


def test_a_shrinking_gap_shrinks_from_either_side():
    assert _verdict(0.24, -0.05) == "shrinks"  # Dion above Muon, the gap closing
    assert _verdict(-0.24, +0.05) == "shrinks"  # below, closing from the other side


def test_a_growing_gap_grows_from_either_side():
    assert _verdict(0.05, +0.05) == "grows"
    assert _verdict(-0.05, -0.05) == "grows"


def test_a_flat_difference_is_flat_and_a_small_resolved_slope_too():
    assert _verdict(0.24, 0.0) == "flat"
    assert _verdict(0.24, 0.002, noise_scale=0.0) == "flat"  # resolved, but 0.008 over the sweep: within δ


def test_noise_larger_than_the_slope_is_inconclusive():
    assert _verdict(0.24, -0.01, noise_scale=20.0) == "inconclusive"


def test_the_rule_fails_just_beyond_its_thresholds():
    """A slope interval that just crosses zero is inconclusive; one that just clears it decides."""
    x = np.log(np.asarray(SIZES, float))
    x = x - x.mean()
    spread_unit = np.array([1.0, -1.0, 0.0])  # per-seed slope offsets: sample std exactly 1
    for mean, expected in ((-1.01, "shrinks"), (-0.99, "inconclusive"), (1.01, "grows"), (0.99, "inconclusive")):
        slopes = 0.1 * (mean + spread_unit)  # slope mean 0.1·mean, spread 0.1
        diffs = [{s: 1.0 + slopes[j] * x[i] for j, s in enumerate(SEEDS)} for i in range(3)]
        assert trend_verdict(SIZES, diffs, 1e-6)["verdict"] == expected, mean
    # flat: (|b̄| + spread)·Δ against δ, just inside and just outside
    span = math.log(SIZES[-1] / SIZES[0])
    diffs = [{s: 1.0 for s in SEEDS} for _ in SIZES]
    diffs[-1] = {1: 1.0 + 0.01, 2: 1.0 + 0.01, 3: 1.0 + 0.01}
    slope = seed_slopes(SIZES, diffs)[1]
    assert trend_verdict(SIZES, diffs, slope * span * 1.001)["verdict"] == "flat"
    assert trend_verdict(SIZES, diffs, slope * span * 0.999)["verdict"] != "flat"


def test_missing_data_is_inconclusive_and_bad_input_is_rejected():
    one_seed = [{1: v} for v in (0.3, 0.2, 0.1)]
    assert trend_verdict(SIZES, one_seed, MARGIN)["verdict"] == "inconclusive"
    diverged = _series(0.24, -0.05)
    diverged[1][2] = None
    diverged[1][3] = math.nan
    assert trend_verdict(SIZES, diverged, MARGIN)["seeds"] == 1  # seeds 2 and 3 dropped
    assert trend_verdict(SIZES[:1], _series(0.2, -0.05)[:1], MARGIN)["verdict"] == "inconclusive"
    assert trend_verdict(SIZES, _series(0.24, -0.05), math.nan)["verdict"] == "inconclusive"
    with pytest.raises(ValueError, match="sizes"):
        trend_verdict(SIZES, _series(0.2, 0.0)[:2], MARGIN)
    with pytest.raises(ValueError, match="sizes"):
        trend_verdict((0, 1, 2), _series(0.2, 0.0), MARGIN)


_slope = st.floats(-0.1, 0.1, allow_nan=False)
_noise = st.floats(0.0, 30.0, allow_nan=False)
_gap = st.floats(-0.5, 0.5, allow_nan=False).filter(lambda g: abs(g) > 0.05)


@given(_gap, _slope, _noise)
def test_mirroring_the_difference_keeps_the_verdict(gap, slope, noise):
    """Swapping worse and better (d → −d) is the same claim seen from the other side."""
    diffs = _series(gap, slope, noise)
    mirrored = [{s: -v for s, v in d.items()} for d in diffs]
    assert trend_verdict(SIZES, diffs, MARGIN)["verdict"] == trend_verdict(SIZES, mirrored, MARGIN)["verdict"]


@given(_gap, _slope, _noise, st.floats(0.01, 100.0))
def test_the_unit_of_model_size_does_not_matter(gap, slope, noise, factor):
    diffs = _series(gap, slope, noise)
    a = trend_verdict(SIZES, diffs, MARGIN)
    b = trend_verdict([n * factor for n in SIZES], diffs, MARGIN)
    assert a["verdict"] == b["verdict"] and a["slope"] == pytest.approx(b["slope"], rel=1e-9, abs=1e-12)


@given(_gap, _slope)
def test_without_noise_the_slope_is_recovered(gap, slope):
    out = trend_verdict(SIZES, _series(gap, slope, 0.0), MARGIN)
    assert out["per_doubling"] == pytest.approx(slope, abs=1e-9) and out["spread"] == pytest.approx(0, abs=1e-9)


def test_size_trends_follow_every_series_on_synthetic_sweeps():
    """``size_trends`` on three synthetic sizes: Dion's and Dion2's gaps shrink, AdamW's and NorMuon's
    lead grow, EF is flat."""
    x = np.log2(np.asarray(SIZES, float) / SIZES[0])
    sizes = []
    for i, n in enumerate(SIZES):
        base = {"muon-jordan": 2.0 - 0.1 * x[i], "muon-polar_express": 1.99 - 0.1 * x[i]}
        base["adamw"] = base["muon-jordan"] + 0.1 + 0.05 * x[i]
        for name, gap in (("1", 0.02), ("1/4", 0.24), ("1/16", 0.36)):
            base[f"dion-{name}-ef"] = base["muon-jordan"] + gap * (1 if name == "1" else 1 - 0.3 * x[i])
            base[f"dion-{name}-noef"] = base[f"dion-{name}-ef"] + 0.001
        base["normuon"] = base["muon-polar_express"] - 0.02 - 0.02 * x[i]
        base["dion2-1/4"] = base["muon-polar_express"] + 0.2 * (1 - 0.3 * x[i])
        evaluation = {k: {"seeds": list(SEEDS), "test_loss": [v + NOISE[j][i] for j in range(3)]}
                      for k, v in base.items()}
        spectral = {"seeds": list(SEEDS), "schedules": {
            "jordan": {"bfloat16": {"rms_by_seed": [0.3, 0.31, 0.29]}},
            "polar_express": {"bfloat16": {"rms_by_seed": [0.22, 0.23, 0.21]}}}}
        sizes.append({"evaluation": evaluation, "spectral": spectral, "config": {"ns_dtype": "bfloat16"},
                      "parameters": {"matrices": n}})
    trends = {t["key"]: t["verdict"] for t in scaling.size_trends(sizes)}
    assert trends == {"muon_vs_adamw": "grows", "dion_full_rank": "flat", "dion_quarter_rank": "shrinks",
                      "dion_sixteenth_rank": "shrinks", "error_feedback_1/4": "flat", "error_feedback_1/16": "flat",
                      "polar_express": "flat", "normuon": "grows", "dion2_quarter": "shrinks"}
