"""The GPU plan of ``ortho-verify reproduce``: its sizes and cost estimate, and ``--device cuda --dry-run``
on the CPU through the command line's own code path."""

import json
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings, strategies as st

from ortho_verify import reproduce as rp
from ortho_verify.reproduce import device_plan as dp
from ortho_verify.reproduce.scaling import ModelSize, parameter_counts
from tests.strategies import profile_examples


@pytest.fixture(autouse=True)
def _run_cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTHO_CACHE_DIR", str(tmp_path / "ortho-cache"))


def test_the_plan_reaches_the_gpt2_small_shape_within_the_budget():
    largest = rp.GPU_SWEEP.configs()[-1]
    assert (largest.n_layers, largest.d_model, largest.n_heads) == (12, 768, 12)
    assert set(rp.GPU_METHODS) >= {"adamw", "muon-jordan", "muon-polar_express", "dion-1/4-ef", "dion2-1/4"}
    assert rp.GPU_SWEEP.base.seeds == (1, 2) and rp.GPU_SWEEP.lr_sweep == "matrix-shared"
    estimate = rp.estimate_plan()
    assert estimate["within_budget"] and estimate["largest_seconds"] <= dp.BUDGET_SECONDS
    rows = estimate["sizes"]
    assert [r["d_model"] for r in rows] == [c.d_model for c in rp.GPU_SWEEP.configs()]
    assert rows[-1]["parameters"] == pytest.approx(86.2e6, rel=1e-3)
    assert all(r["tokens_per_run"] == r["steps"] * 32 * 1024 for r in rows)
    assert rows[-1]["evaluation_runs"] == 2 * len(rp.GPU_METHODS)
    assert rows[-1]["memory_bytes"] < 80 * 2**30  # one H100's memory


def test_the_estimate_follows_the_flops():
    """Doubling the steps doubles the time; the optimizer's products are Newton–Schulz's 5·(4m²n + 2m³) per
    matrix; a planted 10× utilization shrinks the compute part tenfold."""
    config = rp.GPU_SWEEP.configs()[-1]
    bf16, fp32 = dp.optimizer_flops("muon-jordan", [(3 * 768, 768)])
    assert (bf16, fp32) == (5 * (4 * 768 ** 2 * 2304 + 2 * 768 ** 3), 0.0)
    bf16, fp32 = dp.optimizer_flops("dion-1/4-ef", [(768, 3072)])
    assert bf16 == 0 and fp32 == 8 * 768 * 3072 * 192 + 2 * 768 * 192 ** 2
    bf16, _ = dp.optimizer_flops("dion2-1/4", [(768, 3072)])
    assert bf16 == 5 * (4 * 192 ** 2 * 3072 + 2 * 192 ** 3)
    one, flops = dp.run_seconds(config, "muon-jordan", evaluations=1, matmul=85_000_000)
    two, flops2 = dp.run_seconds(replace(config, steps=2 * config.steps), "muon-jordan", evaluations=1,
                                  matmul=85_000_000)
    assert flops2 > 1.99 * flops and two > 1.99 * one
    assert flops > 6 * 85_000_000 * config.steps * config.batch_size * config.context


@settings(deadline=None, **profile_examples(2))
@given(st.integers(1, 6), st.integers(1, 3), st.integers(1, 4), st.sampled_from([8, 16, 32]))
def test_plan_parameter_counts_equal_the_built_model(width, layers, heads, context):
    config = replace(rp.ReproConfig(), d_model=8 * width * heads, n_heads=heads, n_layers=layers, context=context)
    assert rp.plan_parameter_counts(config) == parameter_counts(config)


def test_the_dry_run_keeps_the_plan_s_structure():
    dry = rp.DRY_RUN_SWEEP
    assert dry.methods == rp.GPU_SWEEP.methods and dry.lr_sweep == rp.GPU_SWEEP.lr_sweep
    assert dry.base.seeds == rp.GPU_SWEEP.base.seeds and len(dry.sizes) == len(rp.GPU_SWEEP.sizes)
    assert all(c.d_model <= 32 and c.steps <= 8 for c in dry.configs())
    with pytest.raises(ValueError, match="methods"):
        replace(rp.GPU_SWEEP, methods=("muon-jordan",))  # AdamW trains the other parameters: required
    with pytest.raises(ValueError, match="methods"):
        replace(rp.GPU_SWEEP, methods=("adamw", "sgd"))


def test_dry_run_on_the_cpu_prints_the_plan_and_decides_nothing(tmp_path, capsys, monkeypatch):
    """``--device cuda --dry-run`` on a machine without CUDA: the plan's sizes, steps, tokens, estimated time
    and memory, then the tiny sweep through run_size_sweep, report and terminal, as a measurement."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert rp.main(["--device", "cuda", "--dry-run", "--jobs", "1", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    flat = " ".join(printed.split())  # the prose wraps at the terminal's width; the table rows do not
    estimate = rp.estimate_plan()
    for row in estimate["sizes"]:
        assert f"| {row['d_model']} | {row['n_layers']} | {row['n_heads']} |" in printed
        assert f"{row['tokens_per_run'] / 1e6:.1f} M" in printed and f"{row['seconds'] / 60:.1f} min" in printed
    assert f"Estimated {estimate['largest_seconds'] / 60:.1f} min at the largest size (within the 10 min" in flat
    assert "GiB" in printed and "assumed, not measured" in flat
    assert "no claim is decided" in flat and "reproduced" not in printed.split("dry run:")[1]
    results = json.loads((tmp_path / "reproduction" / "results.json").read_text())
    assert results["mode"] == "measurement" and results["gpu_plan"]["sizes"][-1]["d_model"] == 768
    assert results["environment"]["device"] == "cpu"
    assert [r["config"]["d_model"] for r in results["sizes"]] == [c.d_model for c in rp.DRY_RUN_SWEEP.configs()]
    assert set(results["evaluation"]) == set(rp.GPU_METHODS)
    assert all(c["verdict"] == rp.MEASURED for c in results["claims"])
    assert "## Running at scale on one GPU" in (tmp_path / "reproduction.md").read_text()


@pytest.mark.parametrize("argv, option", [
    (["--dry-run"], "--dry-run"), (["--device", "cuda", "--dry-run", "--quick"], "--dry-run"),
    (["--device", "cuda", "--dry-run", "--sizes", "8,16"], "--dry-run"),
])
def test_dry_run_arguments_exit_2_naming_the_option(argv, option, capsys):
    with pytest.raises(SystemExit) as exit_:
        rp.main(argv)
    assert exit_.value.code == 2 and option in capsys.readouterr().err


def test_sizes_keep_their_head_size_in_the_plan():
    assert {c.d_model // c.n_heads for c in rp.GPU_SWEEP.configs()} == {64}
    assert all(isinstance(s, ModelSize) for s in rp.GPU_SWEEP.sizes)


def test_device_cuda_runs_the_gpu_plan(tmp_path, capsys, monkeypatch):
    """``--device cuda`` (CUDA faked) hands the GPU plan's sweep to run_size_sweep on that device as a study,
    after printing the estimate; ``--steps`` / ``--seeds`` override it; ``--sizes`` leaves the plan."""
    from ortho_verify.reproduce import cli
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    seen = []

    def fake_sweep(sweep, **kwargs):
        seen.append((sweep, kwargs))
        raise KeyboardInterrupt  # stop before any training

    monkeypatch.setattr(cli, "run_size_sweep", fake_sweep)
    for argv in (["--device", "cuda"], ["--device", "cuda", "--steps", "50", "--seeds", "3"],
                 ["--device", "cuda", "--sizes", "64,128"]):
        with pytest.raises(KeyboardInterrupt):
            rp.main([*argv, "--out", str(tmp_path)])
    (plan, kwargs), (short, _), (custom, _) = seen
    assert plan == rp.GPU_SWEEP and kwargs["device"] == "cuda" and kwargs["mode"] == "study"
    assert [c.steps for c in short.configs()] == [50] * 3 and short.base.seeds == (1, 2, 3)
    assert short.methods == rp.GPU_METHODS
    assert custom.methods == () and [c.d_model for c in custom.configs()] == [64, 128]
    assert "GPU plan" in capsys.readouterr().out
