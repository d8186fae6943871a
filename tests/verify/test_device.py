"""``device=`` of check_orthogonalizer, ``ortho-verify --device`` and ``--ortho-device``, on the CPU.

The CUDA paths are in tests/verify/test_device_cuda.py (skipped without a GPU)."""

import functools

import pytest
import torch

import ortho_fast
from ortho_verify import check_orthogonalizer
from ortho_verify.api import check_orthogonalizer_statistics, default_examples
from ortho_verify.checks.newton_schulz import check_newton_schulz
from ortho_verify.checks.statistical import check_ns_statistics, statistical_batch
from ortho_verify.cli.main import build_parser, validate
from ortho_verify.devices import describe_device, device_label, resolve_device
from ortho_verify.inputs.spectra import synthetic_matrices
from ortho_verify.planted.bugs import newton_schulz_kernel


@pytest.mark.parametrize("device", [None, "cpu", torch.device("cpu")])
def test_resolve_device_cpu(device):
    assert resolve_device(device) == torch.device("cpu")


@pytest.mark.parametrize("device, message", [("fakedev", "not a torch device"), ("meta", "hold no values"),
                                             ("cuda:99", "cuda")])
def test_resolve_device_rejects_unusable_devices(device, message):
    if device == "cuda:99" and torch.cuda.is_available() and torch.cuda.device_count() > 99:
        pytest.skip("a machine with 100 GPUs")
    with pytest.raises(ValueError, match="device") as err:
        resolve_device(device)
    assert message in str(err.value)


def test_resolve_device_rejects_other_types():
    with pytest.raises(TypeError, match="device"):
        resolve_device(3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_names_the_build():
    with pytest.raises(ValueError, match="CUDA is not available") as err:
        resolve_device("cuda")
    assert torch.__version__ in str(err.value)


def test_describe_device_names_device_and_versions():
    info = describe_device("cpu")
    assert info["device"] == "cpu" and info["torch"] == torch.__version__ and info["cuda"] == torch.version.cuda
    assert info["name"]
    label = device_label(info)
    assert label.startswith("cpu (") and torch.__version__ in label


def _recording(fn, seen):
    def run(x):
        seen.append(x.device)
        return fn(x)
    return run


def test_check_orthogonalizer_on_cpu_device_passes_and_names_it():
    seen = []
    fn = _recording(newton_schulz_kernel, seen)
    report = check_orthogonalizer(fn, dtype=torch.float32, device="cpu", examples=default_examples("float32")[::2])
    assert report.passed, report.summary()
    assert seen and all(d == torch.device("cpu") for d in seen)
    assert report.device.startswith("cpu (") and f"torch {torch.__version__}" in report.device
    assert report.subject in report.summary() and f"ran on {report.device}" in report.summary()
    assert "cpu" not in report.subject  # the subject keys baselines: the same on every machine


@pytest.mark.parametrize("device", ["fakedev", "meta", "cuda:99"])
def test_unusable_device_raises_before_any_work(device):
    if device == "cuda:99" and torch.cuda.is_available() and torch.cuda.device_count() > 99:
        pytest.skip("a machine with 100 GPUs")
    calls = []
    with pytest.raises(ValueError, match="device"):
        check_orthogonalizer(_recording(newton_schulz_kernel, calls), device=device)
    assert calls == []


def test_device_does_not_hide_a_wrong_kernel():
    """The same planted error fails on device="cpu" as without a device."""
    wrong = functools.partial(newton_schulz_kernel, coefficients=((3.4445, -4.7750, 2.0415),) * 5)
    examples = default_examples("float32")[:4]
    assert not check_orthogonalizer(wrong, examples=examples, device="cpu").passed


def test_statistics_on_device_moves_batch_and_back():
    seen = []
    batch = statistical_batch(1.0, (24, 16), None, 16, "bfloat16", seed=3)
    fn = _recording(functools.partial(newton_schulz_kernel, dtype=torch.bfloat16), seen)
    rows = check_orthogonalizer_statistics(fn, batch, dtype=torch.bfloat16, device="cpu")
    assert [r.check for r in rows] == ["ns_mean_deviation"] and rows[0].passed, rows
    assert seen == [torch.device("cpu")]


def test_cli_checks_take_a_device():
    case = synthetic_matrices(quick=True, seed=0)[0]
    rows = check_newton_schulz(case, "jordan", "float32", device="cpu")
    assert rows and all(r.passed for r in rows)
    rows = check_ns_statistics("jordan", "bfloat16", 8, device="cpu")
    assert rows[0].check == "ns_mean_deviation" and rows[0].passed


def test_cli_device_option(tmp_path):
    parser = build_parser()
    args = parser.parse_args(["--device", "cpu", "--no-real", "--out", str(tmp_path / "out")])
    validate(args, parser)
    assert args.device == "cpu"
    args = parser.parse_args(["--device", "fakedev", "--no-real", "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as err:
        validate(args, parser)
    assert err.value.code == 2


def test_cli_unusable_device_is_a_usage_error_naming_the_option(tmp_path, capsys):
    from ortho_verify.cli.main import main

    with pytest.raises(SystemExit) as err:
        main(["--device", "meta", "--no-real", "--out", str(tmp_path / "out")])
    assert err.value.code == 2
    assert "--device" in capsys.readouterr().err


def test_ortho_fast_kernel_passes_on_cpu_device_in_float16():
    def kernel(x):
        return ortho_fast.newton_schulz(x, "jordan", dtype=torch.float16)

    report = check_orthogonalizer(kernel, dtype=torch.float16, device="cpu", statistical=False)
    assert report.passed, report.summary()


def test_verify_orthogonalizer_fixture_takes_a_device(verify_orthogonalizer):
    report = verify_orthogonalizer(newton_schulz_kernel, examples=default_examples("float32")[:2], device="cpu")
    assert report.device.startswith("cpu (")


def test_ortho_device_option_is_the_fixture_default():
    """``pytest --ortho-device DEVICE``: the default device= of verify_orthogonalizer (here "meta", which
    the check refuses before running: the option reached it)."""
    from types import SimpleNamespace

    from ortho_verify import pytest_plugin

    raw = getattr(pytest_plugin.verify_orthogonalizer, "__wrapped__", pytest_plugin.verify_orthogonalizer)
    options = {"--ortho-device": "meta", "--ortho-report": None}
    request = SimpleNamespace(config=SimpleNamespace(getoption=lambda name, default=None: options.get(name, default)),
                              node=SimpleNamespace(nodeid="t"))
    check = raw(request)
    with pytest.raises(ValueError, match="meta"):
        check(newton_schulz_kernel, examples=default_examples("float32")[:1])
    assert check(newton_schulz_kernel, examples=default_examples("float32")[:1],
                 device="cpu").device.startswith("cpu (")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without enough GPUs")
def test_sharding_device_cuda_without_gpus_is_a_usage_error_before_any_launch(capsys):
    from ortho_verify.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["sharding", "--device", "cuda", "--world-size", "2", "--quick"])
    assert exc.value.code == 2
    assert "--device cuda runs one rank per GPU: --world-size 2 needs 2 GPUs" in capsys.readouterr().err


def test_sharding_run_names_a_bad_device():
    from ortho_verify.sharding.launch import run

    with pytest.raises(ValueError, match="device: expected 'cpu'"):
        run(2, quick=True, device="tpu")
