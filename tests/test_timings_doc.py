"""The timings in README.md, docs/*.md and ``ortho-verify --help`` are written by
``scripts/timings.py --write-docs`` from a measurement, never typed: the marked regions exist, the
writer round-trips on a fake measurement, and the committed docs are what the writer makes of the
committed measurement (``ortho_verify.cli.measured``)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import tomllib

from ortho_verify.cli import main as cli, measured
from tests.load_file import load_file

ROOT = Path(__file__).resolve().parents[1]
timings = load_file(ROOT / "scripts" / "timings.py", "timings_script")

#: Regions each file must have (name -> file).
REQUIRED = {"capture": "README.md", "commands": "README.md", "statistical-rows": "docs/verification.md",
            "stage-rows": "docs/tolerances.md", "default-cached": "docs/tolerances.md",
            "default-checks": "docs/tolerances.md", "sharding": "docs/verification.md"}


def _run(wall, cpu, train=0.0, **extra):
    return {"argv": "x", "wall_s": wall, "cpu_s": cpu, "rc": 0, "label": "x",
            "phases_s": {"real gradients": train, "checks": wall - train}, "train_s": train, "rows": 10, **extra}


FAKE = {"date": "2000-01-02", "cores": 2, "load_at_start": [0.5, 0.4, 0.3], "python": "3.11",
        "commands": {"default_first": _run(51.5, 50.1, 12.25), "default": _run(38.0, 37.5),
                     "quick_first": _run(21.0, 20.0, 12.0), "quick": _run(8.25, 8.0),
                     "quick_threads2": _run(9.5, 12.0), "pytest": _run(233.0, 228.0, tests="2240 passed"),
                     "sharding_muon": _run(6.5, 6.0), "sharding_dion": _run(11.0, 10.0)},
        "checks_s": {"ns_mean_deviation": 1.25, "muon_stages_vs_reference": 3.0, "muon_stages_map_vs_reference": 2.0},
        "checks": {"golden": {"total": 23, "no_claim": 0, "worst_ratio": 0.125, "exact": False},
                   "muon_vs_torch": {"total": 56, "no_claim": 0, "worst_ratio": 0.0, "exact": True},
                   "dion_vs_reference": {"total": 10, "no_claim": 10, "worst_ratio": None, "exact": False}},
        "inputs": {"total": 56, "real": 44, "seed": 0}}


def test_the_checks_table_is_the_measured_rows():
    text = timings.render(FAKE)["default-checks"]
    assert "56 inputs, 44 of them real gradients" in text and "89 checks, 10 of them without a claim" in text
    assert "| golden (float64 oracle vs 50-digit golden files) | 23 | 0 | 0.125 |" in text
    assert "| muon_vs_torch | 56 | 0 | 0 (bitwise) |" in text and "| dion_vs_reference | 10 | 10 | — |" in text


def test_every_required_region_is_in_its_file():
    for name, file in REQUIRED.items():
        text = (ROOT / file).read_text()
        assert timings.START.format(name) in text and timings.END.format(name) in text, (name, file)


def test_every_region_of_the_docs_has_a_rendered_value():
    values = timings.render(FAKE)
    for file in timings.DOC_FILES:
        assert set(timings.regions_of((ROOT / file).read_text())) <= set(values), file


def test_writer_round_trips_on_a_fake_measurement():
    values = timings.render(FAKE)
    other = copy.deepcopy(FAKE)
    other["commands"]["quick"]["wall_s"] = 99.0
    other["commands"]["default_first"]["train_s"] = 77.0
    other["checks_s"]["ns_mean_deviation"] = 5.5
    for file in timings.DOC_FILES:
        text = (ROOT / file).read_text()
        once = timings.rewrite(text, values)
        assert timings.regions_of(once) == {k: values[k] for k in timings.regions_of(text)}
        assert timings.rewrite(once, values) == once  # idempotent
        changed = timings.rewrite(once, timings.render(other))
        assert timings.rewrite(changed, values) == once  # back again
        outside = timings.REGION.sub("", once)
        assert outside == timings.REGION.sub("", text)  # nothing outside the regions changes
    assert "12 s the first time" in values["capture"] and "| 52 s | 50 s |" in values["commands"]
    assert "1.2 s of the default run" in values["statistical-rows"] and values["stage-rows"].startswith("5.0 s")
    assert "99 s" in timings.render(other)["quick"] and "77 s" in timings.render(other)["capture"]


def test_writer_rejects_unmatched_or_unknown_regions():
    start, end = timings.START.format("capture"), timings.END.format("capture")
    with pytest.raises(ValueError, match="unmatched"):
        timings.rewrite(f"a {start} b", timings.render(FAKE))
    with pytest.raises(ValueError, match="'nope' has no value"):
        timings.rewrite(f"{timings.START.format('nope')}x{timings.END.format('nope')}", timings.render(FAKE))
    with pytest.raises(ValueError, match="ends with the marker"):
        timings.rewrite(f"{start}x{timings.END.format('quick')}{timings.START.format('quick')}y{end}",
                        timings.render(FAKE))


def test_write_docs_writes_the_files_and_the_module_that_help_quotes(tmp_path, monkeypatch):
    for file in timings.DOC_FILES:
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / file, tmp_path / file)
    (tmp_path / "verify" / "cli").mkdir(parents=True)
    changed = timings.write_docs(FAKE, tmp_path)
    assert tmp_path / "verify" / "cli" / "timings.json" in changed
    assert json.loads((tmp_path / "verify" / "cli" / "timings.json").read_text()) == timings.portable(FAKE)
    assert "12 s the first time" in (tmp_path / "README.md").read_text()
    monkeypatch.setattr(measured, "TIMINGS", FAKE)
    text = cli.build_parser().format_help()
    assert "8 s with the gradients cached, 21 s the first time" in " ".join(text.split())
    assert "8 s with 1 thread, 10 s with 2" in " ".join(text.split())


def test_the_committed_docs_are_the_writer_s_output_of_the_committed_measurement():
    """No timing typed by hand: the regions equal ``render(ortho_verify.cli.measured.TIMINGS)``."""
    values = timings.render(measured.TIMINGS)
    for file in timings.DOC_FILES:
        for name, content in timings.regions_of((ROOT / file).read_text()).items():
            assert content == values[name], (file, name)


def test_file_seconds_sums_a_files_durations_heaviest_first(tmp_path):
    output = ("============ slowest durations ============\n"
              "2.50s call     tests/a/test_x.py::test_one[p]\n"
              "0.75s setup    tests/a/test_x.py::test_one[p]\n"
              "3.00s call     tests/test_y.py::test_two\n"
              "0.40s call     docs/guide.md::line 12\n"
              "(3 durations < 0.005s hidden.)\n")
    assert timings.file_seconds(output) == {"tests/a/test_x.py": 3.2, "tests/test_y.py": 3.0, "docs/guide.md": 0.4}
    assert list(timings.file_seconds(output)) == ["tests/a/test_x.py", "tests/test_y.py", "docs/guide.md"]
    t = copy.deepcopy(FAKE)
    t["commands"]["pytest"]["file_seconds"] = timings.file_seconds(output)
    for name in timings.DOC_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "verify" / "cli").mkdir(parents=True)
    (tmp_path / "tests").mkdir(exist_ok=True)
    timings.write_docs(t, tmp_path)
    assert json.loads((tmp_path / "tests" / "file_seconds.json").read_text())["tests/test_y.py"] == 3.0
    assert "file_seconds" not in (tmp_path / "verify" / "cli" / "timings.json").read_text()


def test_the_committed_file_seconds_name_test_files_that_exist():
    seconds = json.loads((ROOT / "tests" / "file_seconds.json").read_text())
    assert len(seconds) > 50 and all(v >= 0 for v in seconds.values())
    assert [name for name in seconds if not (ROOT / name).is_file()] == []


def test_the_heaviest_files_are_handed_out_first():
    """tests/conftest.py orders the collected tests by their file's seconds, keeping each file's tests
    together and in order; pytest-xdist keeps that order (--no-loadscope-reorder)."""
    from tests import conftest

    class Item:
        def __init__(self, nodeid):
            self.nodeid, self.keywords = nodeid, {}

    seconds = json.loads(conftest.FILE_SECONDS.read_text())
    heavy, light = list(seconds)[0], "tests/test_not_measured.py"
    items = [Item(f"{light}::t1"), Item(f"{heavy}::t1"), Item(f"{light}::t2"), Item(f"{heavy}::t2")]

    class Config:
        def getoption(self, name):
            return "slow"
    conftest.pytest_collection_modifyitems(Config(), items)
    assert [i.nodeid for i in items] == [f"{heavy}::t1", f"{heavy}::t2", f"{light}::t1", f"{light}::t2"]
    assert "--no-loadscope-reorder" in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"]["addopts"].split()
