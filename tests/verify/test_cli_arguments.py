"""ortho-verify's command line: subcommands with typo suggestions, and every bad argument or unusable
path rejected before any work (exit code 2, a message naming it, no traceback)."""

import json
import subprocess
import sys

import pytest

from ortho_verify.cli import main as cli
from ortho_verify.reproduce import cli as reproduce_cli
from ortho_verify.sharding import cli as sharding_cli


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if any check, training or reproduction starts."""
    def forbidden(*args, **kwargs):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr(cli, "plan_jobs", forbidden)
    monkeypatch.setattr(cli.data, "real_gradients", forbidden)
    monkeypatch.setattr(reproduce_cli, "run_study", forbidden)
    monkeypatch.setattr(sharding_cli, "run", forbidden)


def _usage_error(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, expected", [
    (["shardin"], "did you mean 'sharding'?"),
    (["reproduc"], "did you mean 'reproduce'?"),
    (["--quik"], "did you mean '--quick'?"),
    (["--no-rael"], "did you mean '--no-real'?"),
])
def test_typos_get_a_suggestion(argv, expected, capsys, no_work):
    assert expected in _usage_error(cli.main, argv, capsys)


def test_usage_lists_the_subcommands_and_exit_codes(capsys):
    with pytest.raises(SystemExit) as err:
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert err.value.code == 0 and "{sharding,reproduce,identify}" in out.splitlines()[0] + out
    assert "2 usage error" in " ".join(out.split())


def test_subcommand_typos_in_the_subcommands(capsys, no_work):
    assert "did you mean '--world-size'?" in _usage_error(sharding_cli.main, ["--world-sise", "2"], capsys)
    assert "did you mean '--quick'?" in _usage_error(reproduce_cli.main, ["--quik"], capsys)


@pytest.mark.parametrize("argv, named", [
    (["--seed", "-1"], "--seed"),
    (["--seed", str(2**63)], "--seed"),
    (["--threads", "0"], "--threads"),
    (["--update-baseline"], "--update-baseline"),
    (["--quick", "sharding"], "must come first"),
])
def test_bad_values_are_usage_errors(argv, named, capsys, no_work, tmp_path):
    assert named in _usage_error(cli.main, [*argv, "--out", str(tmp_path)], capsys)


def test_an_out_that_is_a_file_or_cannot_be_created(tmp_path, capsys, no_work):
    file = tmp_path / "file"
    file.write_text("")
    assert "--out" in _usage_error(cli.main, ["--out", str(file)], capsys)
    assert "--out" in _usage_error(cli.main, ["--out", str(file / "below")], capsys)
    assert "--junit-xml" in _usage_error(cli.main, ["--out", str(tmp_path / "o"), "--junit-xml", str(tmp_path)],
                                         capsys)
    assert "--junit-xml" in _usage_error(cli.main, ["--out", str(tmp_path / "o"), "--junit-xml",
                                                    str(file / "j.xml")], capsys)
    assert "--cache-dir" in _usage_error(cli.main, ["--out", str(tmp_path / "o"), "--cache-dir", str(file)], capsys)
    for main in (sharding_cli.main, reproduce_cli.main):
        assert "--out" in _usage_error(main, ["--out", str(file)], capsys)


@pytest.mark.parametrize("content, message", [
    ("[1, 2]", "expected a JSON object"),
    ("{not json", "not JSON"),
    (json.dumps({"format": 1, "ratios": {}}), "expected format"),
    (json.dumps({"format": 3, "ratios": {"a | b | c": "x"}}), "'ratios' must map keys to numbers"),
])
def test_a_baseline_that_is_not_one(tmp_path, capsys, no_work, content, message):
    path = tmp_path / "baseline.json"
    path.write_text(content)
    err = _usage_error(cli.main, ["--out", str(tmp_path / "o"), "--baseline", str(path)], capsys)
    assert "--baseline" in err and message in err and str(path) in err


def test_a_missing_baseline_or_a_folder(tmp_path, capsys, no_work):
    assert "no such file" in _usage_error(cli.main, ["--out", str(tmp_path / "o"), "--baseline",
                                                     str(tmp_path / "none.json")], capsys)
    assert "is a folder" in _usage_error(cli.main, ["--out", str(tmp_path / "o"), "--baseline", str(tmp_path),
                                                    "--update-baseline"], capsys)


def test_no_traceback_from_the_installed_command(tmp_path):
    run = subprocess.run([sys.executable, "-m", "ortho_verify", "--seed", "-1", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr and "--seed" in run.stderr


def test_reproduce_writes_under_out_and_docs_only_when_asked(tmp_path, capsys, no_work):
    parser = reproduce_cli.build_parser()
    assert parser.parse_args([]).out == cli.Path("ortho-verify-out")
    assert parser.parse_args([]).write_docs is False
    assert "--write-docs" in _usage_error(reproduce_cli.main, ["--write-docs", "--quick"], capsys)
    assert "--no-plots" in _usage_error(reproduce_cli.main, ["--write-docs", "--no-plots"], capsys)
