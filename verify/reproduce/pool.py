"""The process pool of ``ortho-verify reproduce``: ``train_run`` jobs in this process or in spawned
ones (results do not depend on it: every run is seeded and deterministic)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch

from .config import METHODS_BY_KEY, ReproConfig
from .training import train_run

__all__ = ["Runner", "init_worker"]


def init_worker(threads: int) -> None:
    """Set up a process (a pool worker, or the study's own): ``threads`` torch threads and
    ``torch.use_deterministic_algorithms(True, warn_only=True)``."""
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)


def _execute(job: tuple[ReproConfig, dict]) -> dict:
    config, kwargs = job
    return train_run(config, **kwargs)


class Runner:
    """Runs ``train_run`` jobs in this process (jobs = 1) or in ``jobs`` spawned processes, each
    with ``threads`` torch threads; results come back in the order of the jobs. ``seconds``: the
    training time of every run so far, summed. ``map(phase, jobs)``: ``jobs`` are ``train_run``
    keyword dicts (the device is added); ``log`` gets one line per finished run; ``close()``
    shuts the pool down."""

    def __init__(self, config: ReproConfig, device: str, jobs: int, threads: int, log: Callable[[str], None]):
        self.config, self.device, self.log = config, device, log
        self.pool = None
        self.seconds = 0.0
        if jobs > 1:
            self.pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=init_worker, initargs=(threads,))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()

    def map(self, phase: str, jobs: list[dict]) -> list[dict]:
        jobs = [dict(job, device=self.device) for job in jobs]
        out: list[dict | None] = [None] * len(jobs)

        def done(i: int, result: dict) -> None:
            out[i] = result
            self.seconds += result["seconds"]
            count = sum(r is not None for r in out)
            loss = "diverged" if result["diverged"] else f"{result['loss']:.4f}"
            self.log(f"  {phase} [{count}/{len(jobs)}] {METHODS_BY_KEY[result['method']].label}, lr {result['lr']:g}, "
                     f"seed {result['seed']}: {result['split']} loss {loss} ({result['seconds']:.1f} s)")

        if self.pool is None:
            for i, job in enumerate(jobs):
                done(i, _execute((self.config, job)))
        else:
            futures = {self.pool.submit(_execute, (self.config, job)): i for i, job in enumerate(jobs)}
            for future in as_completed(futures):
                done(futures[future], future.result())
        return out  # type: ignore[return-value]
