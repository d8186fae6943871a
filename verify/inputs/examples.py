"""Matrices with prescribed singular spectra for testing orthogonalizers: the spectrum families,
``SpectralExample`` and ``build_example`` (deterministic, no hypothesis).

``ortho_verify.strategies`` draws the same examples with hypothesis and re-exports every name
here; ``ortho_verify.api`` builds its default inputs from this module, so checking an
orthogonalizer needs no hypothesis. Every example is U diag(s) Vᵀ with Haar-random U, V
(``ortho_verify.inputs.spectra.haar_orthogonal``) and a spectrum s from one of six families (see
``ortho_verify.strategies`` for the table).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .spectra import MatrixCase, matrix_with_spectrum

__all__ = ["DTYPES", "LAYOUTS", "MAX_SCALE", "MIN_SCALE", "SPECTRUM_KINDS", "SpectralExample", "build_example",
           "make_spectrum"]

SPECTRUM_KINDS = ("geometric", "clustered", "rank_deficient", "dynamic_range", "flat", "two_level")
LAYOUTS = ("tall", "wide", "square")
DTYPES = ("float64", "float32", "bfloat16", "float16")

#: Largest matrix scale per input dtype. torch.linalg.vector_norm sums squares without
#: rescaling, so ‖G‖_F overflows to inf once ‖G‖_F² > 3.4e38 in float32 / bfloat16
#: (‖G‖_F > 1.8e19; measured on torch 2.13, CPU) and a Newton–Schulz written the usual way
#: (torch.optim.Muon's) then returns zeros. 1e15 keeps ‖G‖_F² finite for any k ≤ 1e8
#: singular values of size ≤ 1 × scale, so user kernels are judged on their arithmetic.
#: ``ortho_fast.newton_schulz`` normalizes X/2^e and is tested up to 1e30 separately
#: (tests/ortho_fast/test_newton_schulz.py::test_huge_and_tiny_inputs_match_ns_map).
#: float16 (largest finite 65504): 1e2 keeps ‖G‖_F² < 65504 for the default inputs' spectra, so a
#: kernel that sums squares in float16 is judged on its arithmetic too.
MAX_SCALE = {"float64": 1e30, "float32": 1e15, "bfloat16": 1e15, "float16": 1e2}
MIN_SCALE = 1e-30

def make_spectrum(kind: str, k: int, **params) -> np.ndarray:
    """Singular values of one family, descending, largest exactly 1.

    Shapes: -> (k,) float64, k >= 1. Parameters per family as in the module table:
    ``log_cond``; ``clusters`` and ``spread`` (clustered); ``rank_fraction`` ∈ [0, 1]
    (rank_deficient: rank = 1 + ⌊fraction·(k − 2)⌋, so 1 <= rank <= k − 1 when k >= 2);
    ``top_fraction`` ∈ [0, 1] and ``log_gap`` (two_level: 1 + ⌊fraction·(k − 1)⌋ values at 1).
    Raises: ValueError for an unknown kind or k < 1.
    """
    if k < 1:
        raise ValueError(f"k: expected >= 1, got {k}")
    if kind in ("geometric", "dynamic_range"):
        return np.geomspace(1.0, 10.0 ** -params["log_cond"], k)
    if kind == "clustered":
        sizes = np.diff(np.linspace(0, k, min(params["clusters"], k) + 1).astype(int))
        levels = np.geomspace(1.0, 10.0 ** -params["log_cond"], len(sizes))
        s = np.concatenate([lv * (1.0 + params["spread"] * np.linspace(0.0, -1.0, size))
                            for lv, size in zip(levels, sizes)])
        return np.sort(s)[::-1] / s.max()
    if kind == "rank_deficient":
        rank = 1 + int(params["rank_fraction"] * max(k - 2, 0))
        return np.concatenate([np.geomspace(1.0, 10.0 ** -params["log_cond"], rank), np.zeros(k - rank)])
    if kind == "flat":
        return np.ones(k)
    if kind == "two_level":
        top = 1 + int(params["top_fraction"] * (k - 1))
        return np.concatenate([np.ones(top), np.full(k - top, 10.0 ** -params["log_gap"])])
    raise ValueError(f"kind: expected one of {SPECTRUM_KINDS}, got {kind!r}")


@dataclass(frozen=True, eq=False)
class SpectralExample:
    """One drawn test input with its provenance.

    Attributes:
        matrix: float64 array (*batch, m, n), U diag(s) Vᵀ per batch element.
        singular_values: float64 (*batch, min(m, n)), descending, including the scale.
        kind: spectrum family; params: its parameters; scale: the example's scale (batch
            elements carry their own factor within 10^±2 of it).
        dtype: compute dtype under test ("float64", "float32" or "bfloat16").
        seed: seed of the numpy generator that drew the singular vectors.
    """

    matrix: np.ndarray
    singular_values: np.ndarray
    kind: str
    params: tuple
    scale: float
    dtype: str
    seed: int

    @property
    def input_dtype(self) -> str:
        """The dtype the input tensor is given in: the kernel's own compute dtype (float64,
        float32 or bfloat16), so that a kernel that works in place or aliases its input in that
        dtype is exercised as it runs in training (bfloat16 kernels would otherwise get float32
        inputs, and a cast hid their aliasing)."""
        return self.dtype

    @property
    def name(self) -> str:
        """Short identifier, e.g. ``geometric/tall/(3, 37, 16)/scale 1e+00/seed 4``."""
        m, n = self.matrix.shape[-2:]
        layout = "tall" if m > n else "wide" if m < n else "square"
        return f"{self.kind}/{layout}/{tuple(self.matrix.shape)}/scale {self.scale:.0e}/seed {self.seed}"

    @property
    def provenance(self) -> str:
        """How to rebuild it: ``build_example(...)`` with the example's arguments."""
        return (f"ortho_verify.strategies.build_example({self.kind!r}, {dict(self.params)!r}, "
                f"shape={tuple(self.matrix.shape)}, scale={self.scale!r}, dtype={self.dtype!r}, seed={self.seed})")

    def tensor(self):
        """The input as a torch tensor of ``input_dtype`` (values rounded once from float64)."""
        import torch

        return torch.from_numpy(self.matrix).to(getattr(torch, self.input_dtype))

    def cases(self) -> list[MatrixCase]:
        """One float64 ``MatrixCase`` per batch element, values as the tensor holds them."""
        rounded = self.tensor().double().numpy().reshape(-1, *self.matrix.shape[-2:])
        flat = [[int(i) for i in np.unravel_index(j, self.matrix.shape[:-2])] for j in range(len(rounded))]
        return [MatrixCase(f"{self.name}{idx if idx else ''}", np.ascontiguousarray(a), "synthetic", self.provenance)
                for idx, a in zip(flat, rounded)]


def build_example(kind: str, params: dict, *, shape: tuple[int, ...], scale: float = 1.0, dtype: str = "float64",
                  seed: int = 0) -> SpectralExample:
    """Deterministic example: shape (*batch, m, n), spectrum ``make_spectrum(kind, k, **params)``.

    Each batch element draws its Haar vectors (Mezzadri 2007) from
    ``numpy.random.default_rng(seed)`` in order, and (when there are batch dims) a scale
    factor 10^U(−2, 2) from the same generator.
    Raises: ValueError for a shape with fewer than 2 dims or a dim < 1, a scale outside
    (0, ∞), an unknown dtype or kind.
    """
    if len(shape) < 2 or min(shape) < 1:
        raise ValueError(f"shape: expected (*batch, m, n) with every dim >= 1, got {shape}")
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale: expected a finite positive number, got {scale!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {DTYPES}, got {dtype!r}")
    *batch, m, n = shape
    s = make_spectrum(kind, min(m, n), **params)
    rng = np.random.default_rng(seed)
    count = int(np.prod(batch)) if batch else 1
    factors = 10.0 ** rng.uniform(-2.0, 2.0, count) if batch else np.ones(1)
    mats = [matrix_with_spectrum(s * scale * f, m, n, rng) for f in factors]
    return SpectralExample(
        matrix=np.stack(mats).reshape(shape), singular_values=np.stack([s * scale * f for f in factors]).reshape(
            *batch, len(s)),
        kind=kind, params=tuple(sorted(params.items())), scale=float(scale), dtype=dtype, seed=seed)
