"""The judge on a CUDA device: skipped without CUDA (CI); on a GPU machine run with
``PYTHONPATH=.:offline python -m pytest -p ortho_verify.pytest_plugin tests/verify/test_device_cuda.py``
(docs/verification.md, "Offline GPU runs")."""

import functools
import json
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import ortho_fast
from ortho_verify import check_orthogonalizer
from ortho_verify.planted.bugs import GRAM_POLAR_EXPRESS, gram_newton_schulz_kernel, newton_schulz_kernel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _on_cuda(fn, seen):
    def run(x):
        seen.append(x.device.type)
        return fn(x)
    return run


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_ortho_fast_kernels_pass_on_cuda(dtype):
    seen = []
    kernel = _on_cuda(lambda x: ortho_fast.newton_schulz(x, "jordan", dtype=dtype), seen)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 products here
    try:
        report = check_orthogonalizer(kernel, dtype=dtype, device="cuda")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    assert report.passed, report.summary()
    assert set(seen) == {"cuda"}
    assert torch.cuda.get_device_name() in report.device and f"CUDA {torch.version.cuda}" in report.device


def test_real_tf32_is_judged_as_high_not_float32():
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        kernel = functools.partial(newton_schulz_kernel, dtype=torch.float32)
        assert check_orthogonalizer(kernel, dtype="high", device="cuda").passed
        declared32 = check_orthogonalizer(kernel, dtype=torch.float32, device="cuda", statistical=False)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    if torch.cuda.get_device_capability()[0] >= 8:  # TF32 tensor cores (Ampere and later)
        assert not declared32.passed


def test_gram_float16_kernel_on_cuda():
    report = check_orthogonalizer(gram_newton_schulz_kernel, dtype=torch.float32,
                                  compute_dtype=torch.float16, coefficients=np.array(GRAM_POLAR_EXPRESS), safety=1.0,
                                  eps=1e-7, form="gram", restarts=(2,), device="cuda")
    assert report.passed, report.summary()
    wrong = functools.partial(gram_newton_schulz_kernel, restarts=())
    assert not check_orthogonalizer(wrong, dtype=torch.float32, compute_dtype=torch.float16,
                                    coefficients=np.array(GRAM_POLAR_EXPRESS), safety=1.0, eps=1e-7, form="gram",
                                    restarts=(2,), device="cuda").passed


@pytest.mark.parametrize("name", ["jordan", "polar_express", "you6"])
def test_ortho_fast_float16_gram_on_cuda(name):
    """ortho_fast's float16 Gram Newton–Schulz (``gram=True, dtype=torch.float16``) on the GPU, judged as a
    Gram kernel with its own restarts (cuBLAS float16 products: the reduced-precision-reduction flag is
    named in the report's device description)."""
    from ortho_fast.functional.newton_schulz import gram_restarts

    sched = ortho_fast.COEFFICIENTS[name]
    fn = functools.partial(ortho_fast.newton_schulz, coefficients=name, dtype=torch.float16, gram=True,
                           safety=sched.safety, eps=sched.eps)
    report = check_orthogonalizer(fn, coefficients=name, dtype=torch.float32, compute_dtype=torch.float16,
                                  form="gram", restarts=gram_restarts(len(sched.table())), device="cuda")
    assert report.passed, report.summary()


def test_compiled_kernel_on_cuda_with_shapes():
    kernel = torch.compile(newton_schulz_kernel, dynamic=False, fullgraph=True)
    report = check_orthogonalizer(kernel, shapes=[(64, 32)], device="cuda", statistical=False)
    assert report.passed, report.summary()


def test_cli_quick_on_cuda(tmp_path):
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "ortho_verify", "--device", "cuda", "--quick", "--no-real",
                          "--no-plots", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    meta = json.loads((tmp_path / "report.json").read_text())["meta"]
    assert meta["device"]["device"].startswith("cuda") and meta["device"]["name"] == torch.cuda.get_device_name()
    print(f"ortho-verify --device cuda --quick --no-real: {time.perf_counter() - start:.1f} s")
