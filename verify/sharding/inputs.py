"""Inputs of ``ortho-verify sharding``: seeded on the global shape, identical in every process."""

from __future__ import annotations

import hashlib
import math

import torch

from .layouts import SEED

__all__ = ["gradient", "initial_weight", "input_name", "mean_gradient"]


def _normal(shape: tuple[int, int], dtype: torch.dtype, *key) -> torch.Tensor:
    """N(0, 1) of ``shape`` from a generator seeded by ``key`` (a stable hash, not Python's hash())."""
    seed = int.from_bytes(hashlib.sha256(repr((SEED, *key)).encode()).digest()[:7], "little")
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def initial_weight(i: int, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """Matrix i's initial weight, N(0, 1/n)."""
    return _normal(shape, dtype, "weight", i) / math.sqrt(shape[1])


def gradient(i: int, step: int, replica: int, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """Matrix i's gradient at ``step`` on data-parallel replica ``replica``."""
    return _normal(shape, dtype, "grad", i, step, replica)


def mean_gradient(i: int, step: int, replicas: int, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """The mean over ``replicas`` of ``gradient`` (summed in float64, rounded once)."""
    return sum(gradient(i, step, j, shape, dtype).double() for j in range(replicas)).div(replicas).to(dtype)


def input_name(layout_name: str, label: str, shape) -> str:
    """The report's input name of one (layout, shape): "layout / label mxn", or "layout / label"
    when the label starts with the shape ("16x8#1")."""
    dims = f"{shape[0]}x{shape[1]}"
    return f"{layout_name} / {label}" if label.split("#")[0] == dims else f"{layout_name} / {label} {dims}"
