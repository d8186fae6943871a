"""``ortho-verify identify module:attr``: exit 0 passed / 1 failed / 2 usage error, the summary within
COLUMNS, and the JSON file."""

from __future__ import annotations

import json

import pytest

from ortho_verify.cli.main import main as ortho_verify_main


def _run(argv, capsys, monkeypatch, columns=80):
    monkeypatch.setenv("COLUMNS", str(columns))
    code = ortho_verify_main(["identify", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_correct_kernel_passes_within_80_columns(tmp_path, capsys, monkeypatch):
    code, out, _ = _run(["ortho_verify.planted.bugs:newton_schulz_kernel", "--json", str(tmp_path / "id.json")], capsys,
                        monkeypatch)
    assert code == 0 and out.startswith("PASSED: orthogonalizer identified")
    assert max(len(line) for line in out.splitlines()) <= 80
    data = json.loads((tmp_path / "id.json").read_text())
    assert data["verdict"] == "passed" and data["declaration"]["coefficients"] == "jordan"
    assert data["declaration"]["dtype"] == "torch.float32" and data["judge"]["verdict"] == "passed"


def test_a_kernel_with_a_changed_table_fails(tmp_path, capsys, monkeypatch):
    (tmp_path / "my_kernels.py").write_text(
        "import functools\nfrom ortho_verify.planted.bugs import newton_schulz_kernel\n"
        "typo = functools.partial(newton_schulz_kernel, coefficients=((3.4445, -4.7750, 2.0415),) * 5)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, _ = _run(["my_kernels:typo", "--no-judge"], capsys, monkeypatch)
    assert code == 1 and "c x1.005 of jordan" in " ".join(out.split())


@pytest.mark.parametrize("target, message", [
    ("no_such_module_here:f", "cannot import 'no_such_module_here'"),
    ("ortho_verify.planted.bugs:nothing", "has no attribute 'nothing'"),
    ("ortho_verify.planted.bugs", "expected module:attr"),
])
def test_usage_errors_exit_2(target, message, capsys, monkeypatch):
    with pytest.raises(SystemExit) as err:
        _run([target], capsys, monkeypatch)
    assert err.value.code == 2 and message in capsys.readouterr().err


def test_neither_kernel_nor_optimizer_exits_2_naming_the_probe(capsys, monkeypatch):
    code, _, err = _run(["builtins:len", "--no-judge"], capsys, monkeypatch)
    assert code == 2 and "probed with a float32 tensor of shape (24, 40)" in " ".join(err.split())
