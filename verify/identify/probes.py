"""Designed inputs for identifying a Newton–Schulz kernel, and reading its scalar map.

A probe is a matrix A = U diag(σ) Vᵀ with a prescribed spectrum and Haar singular vectors
(``ortho_verify.inputs.spectra.matrix_with_spectrum``), rounded to the input dtype the kernel is given.
The kernel's output Y is read along the singular directions of the rounded input: yᵢ = uᵢᵀ Y vᵢ is,
to first order, the map f applied to σᵢ (Stewart & Sun 1990, ch. V), and ‖Y − U diag(y) Vᵀ‖_F / ‖Y‖_F
says whether Y is a function of the singular values at all. docs/identification.md, "Probes".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

import ortho_ref

from ..checks.kernel_calls import call_with_timeout
from ..inputs.arrays import TORCH_DTYPES
from ..inputs.spectra import matrix_with_spectrum

__all__ = ["MAIN_SHAPE", "Probe", "ProbeRun", "call_probe", "main_probes", "read_map", "tiny_probes"]

#: (m, n) of the main probes: wide, k = 24 singular directions (tall and square probes are transposes / crops).
MAIN_SHAPE = (24, 40)
#: Frobenius norm of the main probes: a power of two (exact scaling in every dtype), large enough that
#: an eps ≤ 1e-3 changes the normalizer by < 2e-5 relative, small enough for float16's range.
MAIN_NORM = 64.0
#: Frobenius norms of the tiny probes, where an eps of 1e-30 … 1e-5 is a visible part of the normalizer (the
#: judge's own inputs reach ‖G‖_F = 1e-30; float32 and bfloat16 hold these entries as normal numbers).
TINY_NORMS = (1e-5, 1e-6, 3e-7, 1e-7, 3e-8, 1e-8, 1e-10, 1e-12, 1e-15, 1e-18, 1e-24, 1e-30)


@dataclass
class Probe:
    """One designed input: ``matrix`` (m, n) float64 as the kernel receives it (rounded to
    ``dtype``), its float64 SVD (``u`` (m, k), ``sigma`` (k,), ``vt`` (k, n)) and ``name``."""

    name: str
    matrix: np.ndarray
    dtype: str
    u: np.ndarray = field(init=False, repr=False)
    sigma: np.ndarray = field(init=False, repr=False)
    vt: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.u, self.sigma, self.vt = ortho_ref.svd(self.matrix)

    @property
    def frobenius(self) -> float:
        return float(np.linalg.norm(self.matrix))

    @property
    def spectral(self) -> float:
        return float(self.sigma[0])

    @property
    def max_abs(self) -> float:
        return float(np.max(np.abs(self.matrix)))

    def tensor(self) -> torch.Tensor:
        return torch.from_numpy(self.matrix).to(TORCH_DTYPES[self.dtype])

    def transposed(self, name: str) -> "Probe":
        return Probe(name, self.matrix.T.copy(), self.dtype)


def _rounded(a: np.ndarray, dtype: str) -> np.ndarray:
    return torch.from_numpy(a).to(TORCH_DTYPES[dtype]).double().numpy()


def _spectrum(kind: str, k: int) -> np.ndarray:
    if kind == "geometric":
        return np.geomspace(1.0, 1e-4, k)
    half = k // 2  # "flat_top": ‖A‖_F / σ_max ≈ √(k/2), where the geometric one is ≈ 1
    return np.concatenate([np.ones(half), np.geomspace(1.0, 1e-4, k - half)])


def _probe(name: str, kind: str, shape, norm: float, dtype: str, seed: int) -> Probe:
    m, n = shape
    s = _spectrum(kind, min(m, n))
    a = matrix_with_spectrum(s * (norm / np.linalg.norm(s)), m, n, np.random.default_rng(seed))
    return Probe(name, _rounded(a, dtype), dtype)


def main_probes(dtype: str, seed: int) -> list[Probe]:
    """Three wide probes of ``MAIN_SHAPE`` at ‖A‖_F = ``MAIN_NORM``: two geometric spectra
    σ ∈ [1e-4, 1]·c (different singular vectors) and one with a flat top (half the values equal), so
    that ‖A‖_F / σ_max and ‖A‖_F / max|A| differ between probes (Frobenius, spectral and max
    normalization then give different normalizers)."""
    return [_probe("geometric/a", "geometric", MAIN_SHAPE, MAIN_NORM, dtype, seed),
            _probe("geometric/b", "geometric", MAIN_SHAPE, MAIN_NORM, dtype, seed + 1),
            _probe("flat_top", "flat_top", MAIN_SHAPE, MAIN_NORM, dtype, seed + 2)]


def tiny_probes(dtype: str, seed: int, smallest: float = 0.0) -> list[Probe]:
    """Geometric probes of ``MAIN_SHAPE`` at the Frobenius norms ``TINY_NORMS`` (those ≥ ``smallest``),
    where the eps of the normalization is a measurable part of the normalizer."""
    return [_probe(f"norm {norm:g}", "geometric", MAIN_SHAPE, norm, dtype, seed + 10 + i)
            for i, norm in enumerate(TINY_NORMS) if norm >= smallest]


@dataclass
class ProbeRun:
    """What the kernel returned on one input: ``status`` "ok", "raised", "timeout" or "bad" (not a
    tensor of the input's shape), ``output`` the float64 array (ok only), ``out_dtype`` the torch dtype
    it returned, ``error`` the exception, ``what`` a few words on what came back."""

    status: str
    output: np.ndarray | None = None
    out_dtype: torch.dtype | None = None
    error: BaseException | None = None
    what: str = ""
    mutated: bool = False


def call_probe(fn, x: torch.Tensor, timeout_s, device=None) -> ProbeRun:
    """``fn(x)`` (on ``device`` when given) with ``call_with_timeout``; the result read back to float64."""
    xin = x if device is None else x.to(device)
    pristine = xin.clone()
    status, out = call_with_timeout(fn, xin, timeout_s)
    mutated = status != "timeout" and not torch.equal(xin, pristine)
    if status == "timeout":
        return ProbeRun("timeout", what=f"did not return within {timeout_s:g} s")
    if status == "raised":
        return ProbeRun("raised", error=out, what=f"raised {out!r}")
    if not isinstance(out, torch.Tensor):
        return ProbeRun("bad", what=f"returned {type(out).__name__}, not a tensor")
    if tuple(out.shape) != tuple(x.shape):
        return ProbeRun("bad", what=f"returned a tensor of shape {tuple(out.shape)} for an input of shape "
                                    f"{tuple(x.shape)}")
    if not (out.is_floating_point()):
        return ProbeRun("bad", what=f"returned a {out.dtype} tensor")
    return ProbeRun("ok", out.detach().cpu().double().numpy(), out.dtype, what=f"{out.dtype} {tuple(out.shape)}",
                    mutated=mutated)


def read_map(probe: Probe, y: np.ndarray) -> tuple[np.ndarray, float]:
    """(yᵢ = uᵢᵀ Y vᵢ per direction (k,), the relative off-diagonal part ‖Y − U diag(y) Vᵀ‖_F / ‖Y‖_F)
    of an output ``y`` (m, n) float64 of ``probe``; NaN / Inf in ``y`` give NaN."""
    if not np.all(np.isfinite(y)):
        return np.full(len(probe.sigma), np.nan), float("nan")
    proj = np.einsum("ij,ik,kj->j", probe.u, y, probe.vt.T)
    rest = y - (probe.u * proj) @ probe.vt
    norm = float(np.linalg.norm(y))
    return proj, (float(np.linalg.norm(rest)) / norm if norm > 0 else 0.0)
