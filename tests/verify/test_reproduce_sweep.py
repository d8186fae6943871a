"""The size sweep of ``ortho-verify reproduce``: the run cache (a changed method reruns, an unchanged
one does not), ``--resume``, the sweep's options and report."""

import json
from dataclasses import replace

import numpy as np
import pytest

from ortho_verify import reproduce as rp
from ortho_verify.reproduce import cache as cache_module
from ortho_verify.reproduce.cache import CachedRunner, RunCache, code_files, method_fingerprint, run_key
from ortho_verify.reproduce.scaling import DEFAULT_SWEEP, QUICK_SWEEP, ModelSize, SizeSweep


@pytest.fixture(autouse=True)
def _run_cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTHO_CACHE_DIR", str(tmp_path / "ortho-cache"))


class FakeRunner:
    """A ``Runner`` that trains nothing: it records the jobs it is asked to run."""

    def __init__(self, config):
        self.config, self.device, self.log = config, "cpu", lambda _: None
        self.ran = []

    def map(self, phase, jobs):
        self.ran += jobs
        return [{"method": j["method_key"], "lr": j["lr"], "seed": j["seed"], "loss": 2.0 + j["lr"], "seconds": 1.5,
                 "gradients": [("w", 1, np.full((2, 3), j["lr"], np.float32))]} for j in jobs]


JOBS = [dict(method_key=k, lr=lr, seed=1, scalar_lr=0.004, split="validation", curve=False)
        for k in ("adamw", "muon-jordan", "dion-1/4-ef") for lr in (0.01, 0.02)]
PRINTS = {k: f"fingerprint-{k}" for k in rp.METHODS_BY_KEY}


def _cached(config, folder, prints=PRINTS, reuse=True):
    inner = FakeRunner(config)
    return inner, CachedRunner(inner, RunCache(folder), reuse=reuse, fingerprints=prints)


def test_a_changed_method_reruns_and_an_unchanged_one_does_not(tmp_path):
    inner, runner = _cached(rp.QUICK, tmp_path)
    first = runner.map("sweep", JOBS)
    assert len(inner.ran) == len(JOBS) and (runner.hits, runner.misses) == (0, len(JOBS))
    inner, runner = _cached(rp.QUICK, tmp_path)
    again = runner.map("sweep", JOBS)
    assert inner.ran == [] and runner.hits == len(JOBS) and runner.cached_seconds == 1.5 * len(JOBS)
    assert [r["loss"] for r in again] == [r["loss"] for r in first]
    assert all(np.array_equal(a["gradients"][0][2], b["gradients"][0][2]) for a, b in zip(again, first))
    changed = dict(PRINTS, **{"dion-1/4-ef": "another fingerprint"})  # e.g. Dion's code or options changed
    inner, runner = _cached(rp.QUICK, tmp_path, changed)
    runner.map("sweep", JOBS)
    assert [j["method_key"] for j in inner.ran] == ["dion-1/4-ef", "dion-1/4-ef"] and runner.hits == 4
    inner, runner = _cached(rp.QUICK, tmp_path, reuse=False)  # without --resume every run is recomputed
    runner.map("sweep", JOBS)
    assert len(inner.ran) == len(JOBS)


def test_only_what_a_run_reads_is_in_its_key(tmp_path):
    _, runner = _cached(rp.QUICK, tmp_path)
    runner.map("sweep", JOBS)
    protocol_only = replace(rp.QUICK, seeds=(1, 2, 3, 4), muon_lrs=(0.005, 0.01), lr_extensions=0)
    inner, runner = _cached(protocol_only, tmp_path)
    runner.map("sweep", JOBS)
    assert inner.ran == []  # another seed list or grid keeps the runs already done
    for change in (dict(steps=rp.QUICK.steps + 1), dict(d_model=16), dict(momentum=0.9)):
        inner, runner = _cached(replace(rp.QUICK, **change), tmp_path)
        runner.map("sweep", JOBS[:1])
        assert len(inner.ran) == 1, change
    job = JOBS[0]
    assert run_key(rp.QUICK, job, "a") != run_key(rp.QUICK, dict(job, seed=2), "a") != run_key(rp.QUICK, job, "b")
    assert run_key(rp.QUICK, dict(job, scalar_lr=None, lr=0.004), "a") == run_key(
        rp.QUICK, dict(job, scalar_lr=0.004, lr=0.004), "a")  # the default AdamW lr is spelled out


def test_a_code_change_changes_the_fingerprint(tmp_path, monkeypatch):
    source = tmp_path / "dion.py"
    source.write_text("x = 1\n")
    monkeypatch.setattr(cache_module, "code_files", lambda family: [source])
    method = rp.METHODS_BY_KEY["dion-1/4-ef"]
    before = method_fingerprint(method)
    assert method_fingerprint(method) == before
    source.write_text("x = 2\n")
    assert method_fingerprint(method) != before
    assert method_fingerprint(rp.METHODS_BY_KEY["dion-1/4-noef"]) != method_fingerprint(method)  # options differ


def test_code_files_follow_the_family():
    names = {f: {p.name for p in code_files(f)} for f in ("adamw", "muon", "dion")}
    assert names["adamw"] == {"training.py", "config.py", "data.py"}
    assert "newton_schulz.py" in names["muon"] and "qr.py" not in names["muon"] and "dion.py" not in names["muon"]
    assert "qr.py" in names["dion"] and "dion.py" in names["dion"] and "newton_schulz.py" not in names["dion"]
    assert not any("distributed" in p.parts for p in code_files("dion"))
    with pytest.raises(ValueError, match="family"):
        code_files("sgd")


def test_an_unreadable_entry_is_a_miss(tmp_path):
    store = RunCache(tmp_path)
    store.put("k", {"loss": 1.0, "seconds": 0.1})
    assert store.get("k") == {"loss": 1.0, "seconds": 0.1} and store.get("other") is None
    store.path("k").write_bytes(b"not a torch file")
    assert store.get("k") is None
    store.put("k2", {"loss": 1.0})
    store.path("k2").rename(store.path("k3"))  # an entry under another key's name
    assert store.get("k3") is None


def test_size_sweep_validation():
    with pytest.raises(ValueError, match="sizes"):
        SizeSweep(rp.QUICK, (ModelSize(16, 1, 2),))
    with pytest.raises(ValueError, match="sizes"):
        SizeSweep(rp.QUICK, (ModelSize(16, 1, 2), ModelSize(8, 1, 2)))
    with pytest.raises(ValueError, match="lr_sweep"):
        SizeSweep(rp.QUICK, QUICK_SWEEP.sizes, lr_sweep="never")
    with pytest.raises(ValueError, match="n_heads"):
        SizeSweep(rp.QUICK, (ModelSize(8, 1, 3), ModelSize(16, 1, 2)))
    assert [c.d_model for c in DEFAULT_SWEEP.configs()] == [32, 64, 128]
    assert [c.d_model for c in DEFAULT_SWEEP.scaled(2).configs()] == [64, 128, 256]
    assert len({c.d_model // c.n_heads for c in DEFAULT_SWEEP.configs()}) == 1  # one head size


@pytest.mark.parametrize("argv, option", [
    (["--sizes", "x"], "--sizes"), (["--sizes", "16,8"], "--sizes"), (["--sizes", "0,8"], "--sizes"),
    (["--resume", "--no-cache"], "--resume"), (["--single-size", "--sizes", "8,16"], "--sizes"),
    (["--lr-sweep", "sometimes"], "--lr-sweep"),
])
def test_bad_sweep_arguments_exit_2_naming_the_option(argv, option, capsys):
    with pytest.raises(SystemExit) as exit_:
        rp.main(argv)
    assert exit_.value.code == 2 and option in capsys.readouterr().err


def test_quick_sweep_resumes_from_its_cache(tmp_path, capsys):
    argv = ["--quick", "--steps", "8", "--seeds", "1", "--jobs", "1", "--sizes", "8,16", "--cache",
            str(tmp_path / "cache")]
    assert rp.main([*argv, "--out", str(tmp_path / "a")]) == 0
    printed = capsys.readouterr().out
    first = json.loads((tmp_path / "a" / "reproduction" / "results.json").read_text())
    assert [r["config"]["d_model"] for r in first["sizes"]] == [8, 16] and first["config"]["d_model"] == 16
    assert first["cache"]["misses"] > 0 and first["cache"]["hits"] == 0
    assert [t["key"] for t in first["trends"]] == [s.key for s in rp.TREND_SERIES]
    # --quick is a measurement: no claim and no trend is decided, in the terminal, results.json and the report
    assert first["mode"] == "measurement" and all(r["mode"] == "measurement" for r in first["sizes"])
    assert all(t["verdict"] == "measured" for t in first["trends"])
    assert all(c["verdict"] == rp.MEASURED for r in [first, *first["sizes"]] for c in r["claims"])
    assert "no claim is decided" in printed and "reproduced" not in printed and "inconclusive" not in printed
    report = (tmp_path / "a" / "reproduction.md").read_text()
    assert "**Measurement run**" in report and "**reproduced**" not in report and "**not reproduced**" not in report
    assert all(first["sizes"][1]["best_lr"][k] == first["sizes"][0]["best_lr"][k] for k in rp.METHODS_BY_KEY)
    md = (tmp_path / "a" / "reproduction.md").read_text()
    assert "## Model-size sweep" in md and "(reproduction/sizes/trends.png)" in md and "| d 16 " in md
    assert all((tmp_path / "a" / "reproduction" / "sizes" / n).exists() for n in ("trends.png", "rank.png"))
    cost = first["cost"][-1]
    assert cost["ratio_to_muon"]["muon-jordan"] == 1.0 and all(v > 0 for v in cost["seconds_per_step"].values())
    capsys.readouterr()
    # the resumed runs without plots (--no-plots: none written, none linked)
    assert rp.main([*argv, "--resume", "--no-plots", "--out", str(tmp_path / "b")]) == 0
    assert "runs from the cache" in capsys.readouterr().out
    assert not list((tmp_path / "b").rglob("*.png")) and ".png)" not in (tmp_path / "b" / "reproduction.md").read_text()
    second = json.loads((tmp_path / "b" / "reproduction" / "results.json").read_text())
    assert second["cache"]["misses"] == 0 and second["cache"]["hits"] == first["cache"]["misses"]
    for a, b in zip(first["sizes"], second["sizes"]):
        assert a["evaluation"].keys() == b["evaluation"].keys()
        assert all(a["evaluation"][k]["test_loss"] == b["evaluation"][k]["test_loss"] for k in a["evaluation"])
    assert [t["verdict"] for t in first["trends"]] == [t["verdict"] for t in second["trends"]]
    assert first["claims"] == second["claims"]
    # matrix-shared: AdamW swept again at d_model 16 (new runs), Muon / Dion lrs still from d_model 8
    assert rp.main([*argv, "--resume", "--no-plots", "--lr-sweep", "matrix-shared", "--out", str(tmp_path / "c")]) == 0
    third = json.loads((tmp_path / "c" / "reproduction" / "results.json").read_text())
    small, large = third["sizes"]
    assert [p["lr"] for p in large["sweep"]["adamw"]] == [p["lr"] for p in small["sweep"]["adamw"]]
    assert large["sweep"]["adamw"] != small["sweep"]["adamw"]  # measured at d_model 16: other losses
    assert all(large["sweep"][k] == small["sweep"][k] for k in rp.METHODS_BY_KEY if k != "adamw")
    assert large["lr_source"] == 8 and "adamw" not in large["lr_reused"] and third["cache"]["misses"] > 0
    assert "`--lr-sweep matrix-shared`" in (tmp_path / "c" / "reproduction.md").read_text()
