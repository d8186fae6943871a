"""Tests for ortho_verify.inputs.data: stdlib corpus, GPT gradient capture and the on-disk cache."""

import json
import math

import numpy as np
import pytest
import torch

from ortho_verify.inputs import data
from ortho_verify.inputs.data import GPTConfig, last_run_info, real_gradients, stdlib_corpus, train_and_capture

TINY = GPTConfig(
    d_model=16, n_layers=1, n_heads=2, context=16, batch_size=4, steps=5, capture_steps=(1, 5), corpus_bytes=20_000
)
# per capture step: tok_emb, pos_emb, attn.qkv, attn.proj, mlp.fc, mlp.proj, lm_head
MATRICES_PER_STEP = 7


def _same(a, b):
    return [c.name for c in a] == [c.name for c in b] and all(
        np.array_equal(x.matrix, y.matrix) for x, y in zip(a, b)
    )


def _forbid_training(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("train_and_capture must not run on a cache hit")

    monkeypatch.setattr(data, "train_and_capture", fail)


def test_stdlib_corpus_is_deterministic_prefix():
    small, large = stdlib_corpus(1000), stdlib_corpus(5000)
    assert len(small) == 1000 and len(large) == 5000
    assert large.startswith(small)
    assert stdlib_corpus(5000) == large
    assert stdlib_corpus(0) == b""
    with pytest.raises(ValueError, match="max_bytes"):
        stdlib_corpus(-1)


@pytest.mark.parametrize(
    "kwargs",
    [{"d_model": 0}, {"d_model": 10, "n_heads": 4}, {"capture_steps": ()}, {"steps": 5, "capture_steps": (6,)},
     {"corpus_bytes": 10, "context": 16}],
)
def test_config_validation(kwargs):
    with pytest.raises(ValueError, match="GPTConfig"):
        GPTConfig(**kwargs)


def test_capture_cache_and_quick_subset(tmp_path, monkeypatch):
    rng_state = torch.random.get_rng_state()
    full = real_gradients(quick=False, config=TINY, cache_dir=tmp_path)
    assert torch.equal(rng_state, torch.random.get_rng_state())  # global RNG untouched
    info = last_run_info()
    assert not info["from_cache"] and info["corpus_bytes"] == TINY.corpus_bytes
    assert len(full) == len(TINY.capture_steps) * MATRICES_PER_STEP
    assert len({c.name for c in full}) == len(full)
    for c in full:
        assert c.source == "real" and c.name.startswith("gpt/step") and c.description
        assert c.matrix.dtype == np.float64 and c.matrix.ndim == 2
        assert np.all(np.isfinite(c.matrix)) and np.any(c.matrix != 0)
    [npz] = tmp_path.glob("gpt-grads-*.npz")
    sidecar = json.loads(npz.with_suffix(".json").read_text())
    assert sidecar["config"]["d_model"] == TINY.d_model and sidecar["seed"] == 0
    assert {"torch_version", "python_version", "final_loss"} <= sidecar.keys()

    _forbid_training(monkeypatch)
    again = real_gradients(quick=False, config=TINY, cache_dir=tmp_path)
    assert last_run_info()["from_cache"] and _same(full, again)
    assert last_run_info()["final_loss"] == info["final_loss"]
    quick = real_gradients(quick=True, config=TINY, cache_dir=tmp_path)
    assert 0 < len(quick) <= 6 and all(c.name.startswith("gpt/step5/") for c in quick)
    by_name = {c.name: c.matrix for c in full}
    assert all(np.array_equal(by_name[c.name], c.matrix) for c in quick)


@pytest.mark.parametrize("corrupt", ["garbage", "truncated"])
def test_corrupt_cache_is_rebuilt(tmp_path, corrupt):
    first = real_gradients(quick=False, config=TINY, cache_dir=tmp_path)
    [npz] = tmp_path.glob("gpt-grads-*.npz")
    raw = npz.read_bytes()
    npz.write_bytes(b"not an npz file" if corrupt == "garbage" else raw[: len(raw) // 2])
    with pytest.warns(UserWarning, match="rebuilding"):
        rebuilt = real_gradients(quick=False, config=TINY, cache_dir=tmp_path)
    assert not last_run_info()["from_cache"] and _same(first, rebuilt)
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".npz"]  # no temp files left


def test_changed_config_or_seed_uses_new_cache_file(tmp_path):
    real_gradients(quick=True, config=TINY, cache_dir=tmp_path)
    real_gradients(quick=True, config=GPTConfig(**{**TINY.__dict__, "lr": 1e-3}), cache_dir=tmp_path)
    real_gradients(quick=True, config=TINY, cache_dir=tmp_path, seed=1)
    assert len(list(tmp_path.glob("gpt-grads-*.npz"))) == 3


def test_default_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTHO_CACHE_DIR", str(tmp_path / "explicit"))
    real_gradients(quick=True, config=TINY)
    assert list((tmp_path / "explicit").glob("gpt-grads-*.npz"))
    monkeypatch.delenv("ORTHO_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    real_gradients(quick=True, config=TINY)
    assert list((tmp_path / "xdg" / "ortho").glob("gpt-grads-*.npz"))


def test_training_reduces_loss():
    config = GPTConfig(**{**TINY.__dict__, "steps": 50, "capture_steps": (50,), "batch_size": 8})
    losses = []
    threads = torch.get_num_threads()
    cases = train_and_capture(config, seed=0, progress=lambda step, total, loss: losses.append(loss))
    assert len(losses) == 50 and len(cases) == MATRICES_PER_STEP
    assert torch.get_num_threads() == threads  # the single-thread training setting is restored
    assert losses[0] == pytest.approx(math.log(256), abs=0.1)  # N(0, 0.02) init: near-uniform prediction
    assert np.mean(losses[-10:]) < losses[0] - 1.0


def test_quick_set_trains_only_to_its_step_and_equals_the_full_runs(tmp_path, monkeypatch):
    config = GPTConfig(**{**TINY.__dict__, "capture_steps": (1, 3, 5)})
    assert data.quick_step(config) == 3 and data.quick_step(GPTConfig()) == 100
    steps = []
    quick = real_gradients(quick=True, config=config, cache_dir=tmp_path / "quick",
                           progress=lambda step, total, loss: steps.append((step, total)))
    assert steps[-1] == (3, 3) and len(steps) == 3  # trained three steps, not five
    assert [c.name for c in quick] == [f"gpt/step3/{n}" for n in data.QUICK_PARAMS]
    full = real_gradients(quick=False, config=config, cache_dir=tmp_path / "full")
    _forbid_training(monkeypatch)
    from_full = real_gradients(quick=True, config=config, cache_dir=tmp_path / "full")  # reads the full cache
    assert last_run_info()["config"]["steps"] == 5
    by_name = {c.name: c.matrix for c in full}
    assert [c.name for c in from_full] == [c.name for c in quick]
    assert all(np.array_equal(by_name[c.name], c.matrix) for c in quick)  # the same bits either way
    assert data.capture_in_background(config=config, cache_dir=tmp_path / "quick", quick=True) is None  # cached
