"""Launching ``ortho-verify sharding``: gloo workers on CPU, or in-process under torchrun."""

from __future__ import annotations

import os
from typing import Sequence

import torch
import torch.distributed as dist

from ..tolerances import sharded_tolerance
from .layouts import DTYPES, MATRICES, QUICK_MATRICES, QUICK_STEPS, STEPS, TIMEOUT, layouts_for
from .planted import PLANTS
from .steps import Plan, worker
from .workers import run_workers

__all__ = ["run", "run_gpu_workers", "under_torchrun"]


def under_torchrun() -> bool:
    """True when this process is one rank of a launched job (torchrun's RANK / WORLD_SIZE, or a
    process group already initialized)."""
    return dist.is_initialized() or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def run(world_size: int | None = None, *, dtypes: Sequence[str] = DTYPES, quick: bool = False,
        layouts: Sequence[str] | None = None, plant: str | None = None, timeout: float = TIMEOUT,
        device: str = "cpu") -> list[dict]:
    """Check every layout that fits ``world_size`` (see ``layouts_for``; ``layouts`` filters by
    name); returns one row per (layout, dtype) with "status" "pass" / "FAIL", the relative
    Frobenius differences per quantity ("errors", "worst"), the contract ("bound"), and "comm"
    (measured elements per step and rank, the analytic volume).

    Without a process group: forks ``world_size`` gloo workers on CPU (``run_workers``, killed
    after ``timeout`` seconds), or with ``device="cuda"`` spawns one NCCL rank per GPU
    (``run_gpu_workers``). Under torchrun: runs in this process on the launched world
    (``world_size`` None or equal to it; NCCL + CUDA if available, else gloo), and returns the
    rows on rank 0, [] elsewhere. ``plant``: a key of ``PLANTS`` (a bug the checks must catch).
    Raises: ValueError for a bad ``world_size``, an unknown dtype or plant, a ``device`` other than
    "cpu" / "cuda" (or "cuda" with fewer GPUs than ranks), or a filter matching no layout;
    TimeoutError / ortho_verify.sharding.workers.WorkerError from the launch.
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device: expected 'cpu' (gloo workers) or 'cuda' (one NCCL rank per GPU), got {device!r}")
    for d in dtypes:
        sharded_tolerance(d)  # ValueError naming the dtype
    if plant is not None and plant not in PLANTS:
        raise ValueError(f"plant: expected one of {sorted(PLANTS)} or None, got {plant!r}")
    launched = under_torchrun()
    if launched:
        if not dist.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            dist.init_process_group(backend)
        if world_size is not None and world_size != dist.get_world_size():
            raise ValueError(f"world_size: {world_size} given, but torchrun launched {dist.get_world_size()} ranks")
        world_size = dist.get_world_size()
    elif world_size is None:
        raise ValueError("world_size: required unless running under torchrun")
    chosen = layouts_for(world_size, layouts)
    if not chosen:
        raise ValueError(f"layouts: no layout matches {list(layouts or [])} at world size {world_size}")
    plan = Plan(chosen, tuple(dtypes), QUICK_MATRICES if quick else MATRICES, QUICK_STEPS if quick else STEPS, plant)
    if launched:
        return worker(dist.get_rank(), world_size, plan) or []
    if device == "cuda":
        return run_gpu_workers(world_size, worker, plan, timeout=timeout)[0]
    return run_workers(world_size, worker, plan, timeout=timeout)[0]


def run_gpu_workers(world_size: int, fn, *args, timeout: float = TIMEOUT) -> list:
    """``fn(rank, world_size, *args)`` on ``world_size`` spawned NCCL ranks, one per GPU (rank r
    on cuda:r; ``ortho_verify.sharding.workers.run_workers`` with backend "nccl"); results in rank order.
    ``fn`` and ``args`` must pickle (spawn: a factory defined at module level). Raises: ValueError
    naming ``device`` with fewer GPUs than ranks; TimeoutError after ``timeout`` seconds (children
    killed); ortho_verify.sharding.workers.WorkerError if a rank raised."""
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if available < world_size:
        raise ValueError(f"device: 'cuda' runs one rank per GPU: world_size {world_size} needs {world_size} GPUs, "
                         f"{available} available")
    return run_workers(world_size, fn, *args, timeout=timeout, backend="nccl")
