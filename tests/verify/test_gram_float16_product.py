"""ortho_fast's float16 Gram Newton–Schulz (``newton_schulz(g, dtype=torch.float16, gram=True)``), judged
as what it is: a Gram kernel (``form="gram"``) with ortho_fast's restarts (``gram_restarts``). It passes
on every default input for every registered schedule; the same kernel with its restarts left out, with
microsoft/dion's single restart, or with a coefficient 1% off fails, the last just beyond tolerance.
bfloat16 stays out of ``GRAM_DTYPES``: the judge cannot vouch for it there."""

import pytest
import torch
from hypothesis import given, settings

import ortho_fast
import ortho_ref
from ortho_fast.coefficients import resolve_coefficients
from ortho_fast.functional.newton_schulz import (
    GRAM_DTYPES,
    frobenius_normalize_,
    gram_iterate,
    gram_restarts,
    power_of_two_scale,
)
from ortho_verify import check_orthogonalizer
from ortho_verify.api import check_orthogonalizer_example
from ortho_verify.cli.main import plan_jobs
from ortho_verify.inputs.spectra import synthetic_matrices
from ortho_verify.strategies import spectral_examples

SCHEDULES = sorted(ortho_fast.COEFFICIENTS)


def _declared(name: str, compute=torch.float16, dtype=torch.float32) -> dict:
    """What a float16 Gram kernel of ortho_fast declares to the judge."""
    return dict(coefficients=name, dtype=dtype, compute_dtype=compute, form="gram",
                restarts=gram_restarts(len(resolve_coefficients(name, None))))


def _ours(name: str):
    sched = ortho_ref.SCHEDULES[name]
    return lambda g: ortho_fast.newton_schulz(g, name, dtype=torch.float16, gram=True, safety=sched.safety,
                                              eps=sched.eps)


def _planted(name: str, restarts=None, c_factor: float = 1.0, dtype=torch.float16):
    """ortho_fast's own Gram iteration with a planted error: other ``restarts`` (None: ours) or every
    step's c multiplied by ``c_factor``; normalized as ``newton_schulz`` does."""
    sched = ortho_ref.SCHEDULES[name]
    table = [(a, b, c * c_factor) for a, b, c in resolve_coefficients(name, None)]

    def fn(g):
        x3 = g.reshape(-1, *g.shape[-2:])
        beta = power_of_two_scale(x3)
        x = frobenius_normalize_((x3 / beta).to(dtype), beta, sched.safety, sched.eps, "add")
        y = gram_iterate(x, table, tall=g.shape[-2] > g.shape[-1], restarts=restarts)
        return y.to(g.dtype).reshape(g.shape)
    return fn


@pytest.mark.parametrize("name", SCHEDULES)
def test_float16_gram_passes_the_judge(name):
    """Every default input (tall / wide / square / batched, float16's range); measured worst 0.33x (you6)."""
    report = check_orthogonalizer(_ours(name), **_declared(name))
    assert report.passed, report.summary(max_rows=3)
    assert f"gram restarts {list(gram_restarts(len(resolve_coefficients(name, None))))}" in report.subject
    assert 0 < report.worst_ratio <= 1


def test_float16_gram_on_float16_inputs_passes():
    report = check_orthogonalizer(_ours("polar_express"), **_declared("polar_express", dtype=torch.float16))
    assert report.passed, report.summary(max_rows=3)


@settings(deadline=None)
@given(spectral_examples(dtypes=("float32", "float16"), max_dim=24, max_batch=2))
def test_float16_gram_on_drawn_spectra(example):
    rows = check_orthogonalizer_example(_ours("jordan"), example, **{**_declared("jordan"), "dtype": None})
    assert rows and all(r.passed for r in rows), [r for r in rows if not r.passed]


@pytest.mark.parametrize("label, name, kernel, low, high", [
    # measured: no restart 38.6x (jordan); dion's single restart 5.8x (you6); c 1% off 1.94x, 0.5% off 0.88x
    ("restarts left out", "jordan", _planted("jordan", restarts=()), 10.0, float("inf")),
    ("one restart (microsoft/dion's) where two are declared", "you6", _planted("you6", restarts=(2,)), 2.0, 20.0),
    ("c off by 1% in every step", "jordan", _planted("jordan", c_factor=1.01), 1.0, 3.0),
])
def test_planted_errors_in_our_float16_gram_kernel_fail(label, name, kernel, low, high):
    """The per-matrix rows (the statistical row ``ns_mean_deviation``: tests/verify/test_gram_statistical.py)."""
    report = check_orthogonalizer(kernel, **_declared(name), statistical=False)
    assert not report.passed, label
    worst = max(f.result.ratio for f in report.failures)
    assert low < worst <= high, (label, worst)
    assert {f.result.check for f in report.failures} <= {"ns_vs_ns_map", "ns_projected_singular_values",
                                                         "spread_in_band"}, label


def test_planted_kernel_is_ours_without_the_error():
    """The planted kernels differ from the product only by the planted error: with none, the same bits."""
    g = torch.randn(3, 16, 64, dtype=torch.float32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(_planted("jordan")(g), _ours("jordan")(g))


def test_why_bfloat16_is_not_a_gram_dtype():
    """bfloat16 Gram with the same restarts: the Gram model makes no claim on most polar_express inputs
    (inconclusive: 63 of 79 rows measured), and the standard bfloat16 model (what ``gram=False`` is held to)
    fails it for jordan (1.69x); float16 Gram meets that bfloat16 model (worst 0.07x measured for jordan)."""
    assert torch.bfloat16 not in GRAM_DTYPES and torch.float16 in GRAM_DTYPES
    loose = check_orthogonalizer(_planted("polar_express", dtype=torch.bfloat16),
                                 **_declared("polar_express", compute=torch.bfloat16))
    assert loose.status == "inconclusive"
    standard = dict(coefficients="jordan", dtype=torch.float32, compute_dtype=torch.bfloat16, statistical=False)
    assert not check_orthogonalizer(_planted("jordan", dtype=torch.bfloat16), **standard).passed
    assert check_orthogonalizer(_ours("jordan"), **standard).passed


def test_ortho_verify_judges_the_float16_gram_kernel():
    """``ortho-verify`` has a float16 Gram row per schedule and (small) input; on the quick inputs all pass."""
    jobs = [(label, run) for label, run in plan_jobs(synthetic_matrices(quick=True), quick=True)
            if "/float16/gram " in label]
    assert {label.split("/")[0].removeprefix("NS ") for label, _ in jobs} == set(SCHEDULES)
    rows = [r for _, run in jobs for r in run()]
    assert rows and all(r.passed for r in rows), [r for r in rows if not r.passed][:3]
    assert any(r.claimed and "gram" in r.detail for r in rows)
