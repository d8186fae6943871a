"""ortho_verify.reproduce: the claim functions both ways, the protocol's invariants, a --quick run end to end
and the command line's errors."""

import json
import math
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

from ortho_fast.functional.muon import adjusted_lr_scale
from ortho_verify import reproduce as rp
from ortho_verify.cli import main as cli
from ortho_verify.inputs import data

ROOT = Path(__file__).resolve().parents[2]
SEEDS = (1, 2, 3)
#: Per-seed noise shared by every method (the same batches): paired differences cancel it.
NOISE = (0.03, -0.02, 0.01)


@pytest.fixture(autouse=True)
def _run_cache_in_tmp(tmp_path, monkeypatch):
    """The reproduction's run cache (written by every run of the command) goes to a temporary folder."""
    monkeypatch.setenv("ORTHO_CACHE_DIR", str(tmp_path / "ortho-cache"))


def _results(losses: dict, rms: dict | None = None) -> dict:
    """A synthetic results dict: ``losses`` method key -> per-seed test losses (or a float: that
    loss plus NOISE; AdamW 3.0 plus NOISE unless given: the run's assay-sensitivity control, separated
    from every reference by far more than δ); ``rms`` schedule -> per-seed distance to the polar factor."""
    evaluation = {}
    for key, value in {"adamw": 3.0, **losses}.items():
        values = [value + n for n in NOISE] if isinstance(value, float) else list(value)
        evaluation[key] = {"seeds": list(SEEDS[:len(values)]), "test_loss": values}
    spectral = {"seeds": list(SEEDS), "gradients": 12, "schedules": {
        name: {kind: {"rms_by_seed": list(v), "worst_in_band": 0.5} for kind in ("exact", "bfloat16")}
        for name, v in (rms or {}).items()}}
    return {"evaluation": evaluation, "spectral": spectral, "config": {"ns_dtype": "bfloat16"}}


def _verdict(claim, losses, rms=None):
    result = claim(_results(losses, rms))
    assert result.verdict in rp.VERDICTS and result.verdict.split()[-1] in result.sentence.lower()
    return result.verdict


# ---------------------------------------------------------------------------------------
# Decision rules and claims, each able to come out every way
# ---------------------------------------------------------------------------------------


def test_muon_vs_adamw_both_ways():
    claim = rp.claim_muon_beats_adamw
    assert _verdict(claim, {"adamw": 2.10, "muon-jordan": 2.00}) == "reproduced"
    assert _verdict(claim, {"adamw": 2.00, "muon-jordan": 2.10}) == "not reproduced"
    assert _verdict(claim, {"adamw": [2.0, 2.1, 2.0], "muon-jordan": [2.05, 2.0, 2.05]}) == "inconclusive"
    assert _verdict(claim, {"adamw": [2.1], "muon-jordan": [2.0]}) == "inconclusive"  # one seed: no spread
    assert _verdict(claim, {"adamw": [2.1, None, 2.1], "muon-jordan": 2.0}) == "inconclusive"  # a diverged run
    assert _verdict(claim, {"adamw": 2.1}) == "inconclusive"  # Muon not run


def test_dion_full_rank_match_both_ways():
    claim = rp.claim_dion_full_rank_matches_muon
    assert _verdict(claim, {"muon-jordan": 2.0, "dion-1-ef": 2.005}) == "reproduced"
    assert _verdict(claim, {"muon-jordan": 2.0, "dion-1-ef": 2.1}) == "not reproduced"
    assert _verdict(claim, {"muon-jordan": 2.0, "dion-1-ef": 1.9}) == "not reproduced"  # better is not "matches"
    assert _verdict(claim, {"muon-jordan": 2.0, "dion-1-ef": [2.0, 2.05, 1.97]}) == "inconclusive"


def test_dion_quarter_rank_close_uses_the_wider_margin():
    claim = rp.claim_dion_quarter_rank_close
    gap = 2.0 * (rp.MATCH_MARGIN + rp.CLOSE_MARGIN) / 2  # between the two margins
    assert _verdict(claim, {"muon-jordan": 2.0, "dion-1/4-ef": 2.0 + gap}) == "reproduced"
    assert _verdict(rp.claim_dion_full_rank_matches_muon, {"muon-jordan": 2.0, "dion-1-ef": 2.0 + gap}) == \
        "not reproduced"
    assert _verdict(claim, {"muon-jordan": 2.0, "dion-1/4-ef": 2.2}) == "not reproduced"


def test_error_feedback_claim_needs_both_low_ranks():
    claim = rp.claim_error_feedback_needed
    base = {"dion-1-ef": 2.0, "dion-1-noef": 2.0, "dion-1/4-ef": 2.02, "dion-1/16-ef": 2.05}
    assert _verdict(claim, {**base, "dion-1/4-noef": 2.1, "dion-1/16-noef": 2.3}) == "reproduced"
    assert _verdict(claim, {**base, "dion-1/4-noef": 2.1, "dion-1/16-noef": 2.0}) == "not reproduced"
    assert _verdict(claim, {**base, "dion-1/4-noef": 2.1, "dion-1/16-noef": [2.1, 2.0, 2.06]}) == "inconclusive"


def test_polar_express_claim_both_ways():
    claim = rp.claim_polar_express_more_accurate
    assert _verdict(claim, {}, {"jordan": [0.3, 0.31, 0.29], "polar_express": [0.2, 0.22, 0.19]}) == "reproduced"
    assert _verdict(claim, {}, {"jordan": [0.2, 0.22, 0.19], "polar_express": [0.3, 0.31, 0.29]}) == "not reproduced"
    assert _verdict(claim, {}, {"jordan": [0.3, 0.2, 0.25], "polar_express": [0.25, 0.25, 0.25]}) == "inconclusive"
    assert _verdict(claim, {}) == "inconclusive"  # nothing measured


def test_every_claim_is_evaluated_and_inconclusive_without_results():
    claims = rp.evaluate_claims(_results({}))
    assert [c.verdict for c in claims] == ["inconclusive"] * len(rp.CLAIMS)
    assert len({c.key for c in claims}) == len(rp.CLAIMS)


finite = st.floats(0.5, 6.0, allow_nan=False)
three = st.lists(finite, min_size=2, max_size=5)


@given(three, st.data())
def test_lower_verdict_is_antisymmetric(a, data_):
    b = data_.draw(st.lists(finite, min_size=len(a), max_size=len(a)))
    seeds = range(len(a))
    forward = rp.lower_verdict(rp.paired_difference(dict(zip(seeds, a)), dict(zip(seeds, b))))
    backward = rp.lower_verdict(rp.paired_difference(dict(zip(seeds, b)), dict(zip(seeds, a))))
    mirror = {"reproduced": "not reproduced", "not reproduced": "reproduced", "inconclusive": "inconclusive"}
    assert backward == mirror[forward]


@given(three, st.floats(1e-3, 1.0))
def test_a_constant_shift_is_resolved_and_within_a_larger_margin(a, shift):
    """Same noise for both methods (shared batches): the paired difference has no spread."""
    seeds = range(len(a))
    diff = rp.paired_difference({s: x + shift for s, x in zip(seeds, a)}, dict(zip(seeds, a)))
    assert diff["spread"] < 1e-9 and diff["mean"] == pytest.approx(shift)
    assert rp.lower_verdict(diff) == "reproduced"
    assert rp.within_verdict(diff, 1.01 * shift + 1e-6) == "reproduced"
    assert rp.within_verdict(diff, 0.99 * shift - 1e-6) == "not reproduced"


def test_bad_margin_is_rejected():
    with pytest.raises(ValueError, match="margin"):
        rp.within_verdict({"mean": 0.0, "spread": 0.0, "n": 3, "finite": True}, 0.0)


def test_best_learning_rate_and_edges():
    points = [{"lr": 0.02, "validation_loss": 2.0}, {"lr": 0.01, "validation_loss": 2.1},
              {"lr": 0.04, "validation_loss": None}]
    assert rp.best_learning_rate(points) == (0.02, False)
    assert rp.best_learning_rate(points[:2]) == (0.02, True)
    with pytest.raises(ValueError, match="points"):
        rp.best_learning_rate([])
    # a run whose last update made the held-out loss NaN is never the best
    assert rp.best_learning_rate([*points, {"lr": 0.005, "validation_loss": math.nan}]) == (0.02, False)


class _FakeRunner:
    """``Runner``'s interface with a validation loss given as a function of the lr."""

    def __init__(self, loss):
        self.config, self.loss, self.rounds = rp.ReproConfig(), loss, []

    def map(self, phase, jobs):
        self.rounds.append(sorted(job["lr"] for job in jobs))
        return [{"loss": self.loss(job["lr"])} for job in jobs]


@pytest.mark.parametrize("loss, added", [
    (lambda lr: abs(math.log(lr / 0.02)), None),  # interior optimum: the grid is kept
    (lambda lr: -lr, 0.08),  # the largest lr wins: one point above
    (lambda lr: lr, 0.005),  # the smallest wins: one point below
    (lambda lr: None, 0.005),  # every lr diverged: one point below, not an evaluation at a diverging lr
])
def test_sweep_extends_a_grid_beyond_a_winning_edge(loss, added):
    runner, sweep = _FakeRunner(loss), {}
    rp.sweep_learning_rates(runner, rp.METHODS[1:2], 0.002, sweep)
    grid = list(runner.config.muon_lrs)
    assert runner.rounds == [grid] + ([] if added is None else [[added]])
    assert sorted(p["lr"] for p in sweep["muon-jordan"]) == sorted(grid + ([] if added is None else [added]))


# ---------------------------------------------------------------------------------------
# Data split, configuration, training runs
# ---------------------------------------------------------------------------------------


def test_stdlib_split_deals_files_without_overlap(monkeypatch):
    files = [bytes([i]) for i in range(25)]
    monkeypatch.setattr(data, "stdlib_files", lambda: iter(files))
    split = data.stdlib_split(10)
    assert split.validation == bytes([8, 18]) and split.test == bytes([9, 19])
    assert split.files == (21, 2, 2) and sorted(split.train + split.validation + split.test) == list(range(25))
    with pytest.raises(ValueError, match="heldout_every"):
        data.stdlib_split(2)


def test_config_validation():
    with pytest.raises(ValueError, match="seeds"):
        rp.ReproConfig(seeds=(0, 1))  # the sweep seed chooses the lr: never an evaluation seed
    with pytest.raises(ValueError, match="n_heads"):
        rp.ReproConfig(d_model=30)
    with pytest.raises(ValueError, match="muon_lrs"):
        rp.ReproConfig(muon_lrs=(0.02, 0.01))
    with pytest.raises(ValueError, match="muon_adjust_lr"):
        rp.ReproConfig(muon_adjust_lr="match_rms_adamw")
    with pytest.raises(ValueError, match="scale"):
        rp.ReproConfig().scaled(0)
    big = rp.ReproConfig().scaled(2)
    assert (big.d_model, big.n_heads, big.steps) == (128, 8, 2 * rp.ReproConfig().steps)


def test_lr_schedule_warms_up_then_decays_to_the_final_fraction():
    config = rp.ReproConfig(steps=200, warmup_fraction=0.05, final_lr_fraction=0.1)
    values = [rp.lr_multiplier(i, config) for i in range(config.steps)]
    warmup = config.warmup_steps()
    assert warmup == 10 and values[0] == pytest.approx(0.1) and values[warmup - 1] == values[warmup] == 1.0
    assert values[-1] == pytest.approx(0.1) and all(a >= b for a, b in zip(values[warmup:], values[warmup + 1:]))
    assert rp.lr_multiplier(0, rp.ReproConfig(warmup_fraction=0.0)) == 1.0


def test_runs_are_deterministic_and_paired():
    """Bitwise the same run twice; two methods with the same seed start from the same model."""
    one = rp.train_run(rp.QUICK, "dion-1/4-ef", 0.01, 1, scalar_lr=0.004)
    assert rp.train_run(rp.QUICK, "dion-1/4-ef", 0.01, 1, scalar_lr=0.004)["curve"] == one["curve"]
    adamw = rp.train_run(rp.QUICK, "adamw", 0.004, 1)
    assert adamw["curve"][0] == one["curve"][0] and adamw["curve"][-1] != one["curve"][-1]
    assert len(one["curve"]) == len(one["curve_steps"]) == rp.QUICK.curve_points + 1


def test_divergence_is_recorded_not_raised(monkeypatch):
    run = rp.train_run(rp.QUICK, "muon-jordan", 1e6, 1, scalar_lr=1e6, curve=False)
    assert run["diverged"] and run["loss"] is None
    # the last update leaves non-finite weights: no training step follows to see it, the held-out loss does
    evaluate = rp.heldout_loss
    monkeypatch.setattr(rp.training, "heldout_loss", lambda model, *args: evaluate(model, *args) if any(
        p.grad is None for p in model.parameters()) else math.nan)
    run = rp.train_run(rp.QUICK, "adamw", 0.004, 1)
    assert run["diverged"] and run["loss"] is None and run["curve"][1:] == [None] * rp.QUICK.curve_points
    assert math.isfinite(run["curve"][0]) and run["train_curve"] == [None] * rp.QUICK.curve_points


def _matrix_shapes(config):
    d = config.d_model
    return {f"blocks.{i}.{name}": shape for i in range(config.n_layers)
            for name, shape in (("attn.qkv.weight", (3 * d, d)), ("attn.proj.weight", (d, d)),
                                ("mlp.fc.weight", (4 * d, d)), ("mlp.proj.weight", (d, 4 * d)))}


@pytest.mark.parametrize("method", rp.METHODS, ids=lambda m: m.key)
def test_every_method_trains_the_same_matrices_with_its_own_options(method):
    """Muon / Dion train exactly the hidden matrices (everything else on AdamW at the scalar lr),
    weight decay 0 everywhere, Muon's per-matrix lr scale is Dion's √(m/n), Dion's rank is
    ceil(rank fraction × min(m, n)) and its error feedback the method's."""
    config = rp.QUICK
    model = data.build_model(rp.gpt_config(config), torch.Generator().manual_seed(0))
    optimizer = rp.build_optimizer(method, model, 0.01, 0.004, config, seed=1)
    groups = optimizer.param_groups
    assert all(g["weight_decay"] == 0.0 for g in groups)
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    if method.family == "adamw":
        assert isinstance(optimizer, torch.optim.AdamW) and [g["lr"] for g in groups] == [0.01]
        return
    matrices = {n: p for g in groups if g["algorithm"] == method.family for n, p in zip(g["param_names"], g["params"])}
    shapes = _matrix_shapes(config)
    assert {n: tuple(p.shape) for n, p in matrices.items()} == shapes
    assert all(g["lr"] == (0.01 if g["algorithm"] == method.family else 0.004) for g in groups)
    assert {g["algorithm"] for g in groups} == {method.family, "adamw"}
    (group,) = [g for g in groups if g["algorithm"] == method.family]
    if method.family == "muon":
        assert group["coefficients"] == method.coefficients and group["dtype"] == torch.bfloat16
        scales = [adjusted_lr_scale(group["adjust_lr"], m, n) for m, n in shapes.values()]
        assert scales == [math.sqrt(m / n) for m, n in shapes.values()]  # Dion's scale: only the orthogonalizer differs
        return
    if method.family == "dion2":  # checked in tests/verify/test_reproduce_methods.py
        return
    assert (group["rank_fraction"], group["error_feedback"]) == (method.rank_fraction, method.error_feedback)
    batch = torch.randint(0, data.VOCAB_SIZE, (2, config.context + 1), generator=torch.Generator().manual_seed(0))
    F.cross_entropy(model(batch[:, :-1]).reshape(-1, data.VOCAB_SIZE), batch[:, 1:].reshape(-1)).backward()
    optimizer.step()
    for name, p in matrices.items():
        assert optimizer.state[p]["Q"].shape[1] == math.ceil(method.rank_fraction * min(shapes[name])), name


def test_methods_see_the_same_batches():
    """Same seed, same initial weights and batches: the first gradients of two methods are bitwise equal."""
    config = replace(rp.QUICK, steps=3, capture_points=2)
    runs = [rp.train_run(config, key, 0.01, 2, scalar_lr=0.004, curve=False, capture=True)["gradients"]
            for key in ("muon-polar_express", "dion-1/16-noef")]
    first = [[(name, g) for name, step, g in run if step == 1] for run in runs]
    assert len(first[0]) == len(_matrix_shapes(config))
    assert all(n0 == n1 and (g0 == g1).all() for (n0, g0), (n1, g1) in zip(*first))
    assert not all((g0 == g1).all() for (_, s0, g0), (_, s1, g1) in zip(*runs) if s0 == s1 == 3)


# ---------------------------------------------------------------------------------------
# End to end and the command line
# ---------------------------------------------------------------------------------------


# slow: 172 s of a loaded 2-core run (about 22 s quiet), the suite's slowest test; the end-to-end
# pipeline stays in the default run through test_reproduce_sweep.py's quick sweep.
@pytest.mark.slow
def test_quick_run_writes_report_plots_and_results(tmp_path, capsys):
    assert rp.main(["--quick", "--jobs", "1", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "reproduction.md").read_text()
    results = json.loads((tmp_path / "reproduction" / "results.json").read_text())
    keys = [m.key for m in rp.METHODS]
    assert list(results["evaluation"]) == keys and set(results["sweep"]) == set(keys)
    assert all(len(results["evaluation"][k]["test_loss"]) == len(rp.QUICK.seeds) for k in keys)
    assert all(f"| {m.label} |" in md for m in rp.METHODS)
    for key in keys:  # the evaluated lr is the sweep's best on validation
        assert results["evaluation"][key]["lr"] == rp.best_learning_rate(results["sweep"][key])[0]
    assert results["seeds"] == {"sweep": 0, "evaluation": list(rp.QUICK.seeds)}
    assert results["config"]["steps"] == rp.QUICK.steps and results["corpus"]["files"]["test"] > 0
    assert {"python", "torch", "numpy", "platform", "cpu", "device"} <= set(results["environment"])
    assert results["wall_seconds"] > 0
    claims = results["claims"]
    assert [c["key"] for c in claims] == [c(results).key for c in rp.CLAIMS]
    assert all(c["verdict"] == rp.MEASURED and f"**{c['verdict']}**" in md and c["sentence"] in md for c in claims)
    pngs = sorted(p.name for p in (tmp_path / "reproduction").glob("*.png"))
    assert pngs == sorted(["loss_curves.png", "test_loss.png", "lr_sweep.png", "sv_map_jordan.png",
                           "sv_map_polar_express.png"])
    assert all((tmp_path / "reproduction" / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert all(f"(reproduction/{p})" in md for p in pngs)
    assert "wrote" in capsys.readouterr().out
    # no gradient captured (every Muon run diverged at once): the report says so, claim 5 is inconclusive
    results["spectral"] = None
    results["claims"] = [asdict(c) for c in rp.evaluate_claims({**results, "mode": "study"})]
    assert results["claims"][-1]["verdict"] == "inconclusive"
    assert "No gradient was captured" in rp.render_markdown(results)
    # a method that diverged on every seed (and at every lr of its sweep) still gets its plots drawn
    adamw = results["evaluation"]["adamw"]
    adamw["test_loss"] = [None] * len(adamw["test_loss"])
    adamw["curves"] = [[curve[0]] + [None] * (len(curve) - 1) for curve in adamw["curves"]]
    for point in results["sweep"]["adamw"]:
        point["validation_loss"] = None
    assert len(rp.write_plots(results, {}, tmp_path / "diverged")) == len(pngs)


def test_claim_5_is_measured_in_the_training_dtype():
    """A Newton–Schulz dtype outside ``SV_DTYPES`` is measured too, and claim 5 judges it."""
    config = replace(rp.QUICK, steps=4, ns_dtype="float16", lr_extensions=0, curve_points=1, eval_windows=8,
                     adamw_lrs=(4e-3,), muon_lrs=(0.02,), dion_lrs=(0.02,))
    results, _ = rp.run_study(config, log=lambda _: None)
    claim = results["claims"][-1]
    assert claim["key"] == "polar_express" and claim["numbers"]["dtype"] == "float16"
    assert claim["numbers"]["difference"]["finite"] and "float16" in claim["sentence"]
    assert "| jordan | G / max(‖G‖_F, 1e-07) | float16 |" in rp.render_markdown(results)


@pytest.mark.parametrize("argv, option", [
    (["--scale", "0"], "--scale"), (["--steps", "0"], "--steps"), (["--seeds", "0"], "--seeds"),
    (["--threads", "0"], "--threads"), (["--jobs", "0"], "--jobs"), (["--device", "nonsense"], "--device"),
    (["--quick", "--scale", "2"], "--scale"), (["--steps", "x"], "--steps"),
])
def test_bad_arguments_exit_2_naming_the_option(argv, option, capsys):
    with pytest.raises(SystemExit) as exit_:
        rp.main(argv)
    assert exit_.value.code == 2 and option in capsys.readouterr().err


def test_cuda_without_cuda_is_a_clear_error(capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_:
        rp.main(["--device", "cuda"])
    assert exit_.value.code == 2 and "CUDA is not available" in capsys.readouterr().err
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    with pytest.raises(SystemExit) as exit_:
        rp.main(["--device", "cuda:1"])
    assert exit_.value.code == 2 and "1 CUDA device" in capsys.readouterr().err


def test_entry_points_reach_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["reproduce", "--help"])
    assert exit_.value.code == 0 and "ortho-verify reproduce" in capsys.readouterr().out
    run = subprocess.run([sys.executable, "-m", "ortho_verify.reproduce", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and "--scale" in run.stdout


@pytest.mark.slow
def test_parallel_jobs_give_the_same_results():
    config = rp.QUICK
    jobs = [dict(method_key=k, lr=0.01, seed=1, scalar_lr=0.004) for k in ("muon-polar_express", "dion-1/16-noef")]
    serial = rp.Runner(config, "cpu", 1, 1, lambda _: None).map("t", jobs)
    runner = rp.Runner(config, "cpu", 2, 1, lambda _: None)
    try:
        parallel = runner.map("t", jobs)
    finally:
        runner.close()
    assert [r["curve"] for r in parallel] == [r["curve"] for r in serial]
