"""One launch of a user's factory on one layout (``check_sharded_optimizer``): forked gloo workers on
CPU, spawned NCCL workers on GPUs, or in-process under torchrun; what came back
(``LaunchResult``: every rank's result, or the error with the user's frame, whether it hung, and
the backend feature it lacked)."""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from .crashes import backend_feature, user_frame_in
from .factory_run import FactoryPlan, layout_rank_run
from .launch import under_torchrun
from .workers import WorkerError, run_workers

__all__ = ["LaunchResult", "run_layout"]


@dataclass
class LaunchResult:
    """``runs``: every rank's ``layout_rank_run`` result (None when it failed); ``error``: "raised:
    ... at FILE:LINE in FUNCTION" or "hung: ..." (None when it ran); ``hung``; ``feature``: what
    the backend lacks according to the error ("" if nothing); ``backend``; ``text``: the traceback."""

    runs: list | None
    error: str | None = None
    hung: bool = False
    feature: str = ""
    backend: str = "gloo"
    text: str = ""


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _raised(text: str, backend: str) -> LaunchResult:
    frame = user_frame_in(text)
    error = f"raised: {text.splitlines()[0]} {_last_line(text)}" + (f" at {frame}" if frame else "")
    return LaunchResult(None, error, False, backend_feature(text, backend), backend, text)


def run_layout(plan: FactoryPlan, world_size: int, timeout: float, gpu: bool = False,
               idle_timeout: float | None = None) -> LaunchResult:
    """Every rank's result of ``layout_rank_run`` (forked gloo workers killed after ``timeout``
    seconds, or from ``idle_timeout`` on as soon as every rank sits idle: ``run_workers``;
    spawned NCCL workers, one per GPU, with ``gpu``; or in-process under torchrun), or the error
    of a raising or hanging rank."""
    if under_torchrun():
        import torch.distributed as dist

        backend = dist.get_backend()
        try:
            mine = layout_rank_run(dist.get_rank(), world_size, plan)
        except Exception as err:  # noqa: BLE001 - every rank reports; a rank stuck in a collective cannot be freed
            mine = {"error": f"rank {dist.get_rank()}: {type(err).__name__}: {err}\n{traceback.format_exc()}"}
        everyone = [None] * world_size
        dist.all_gather_object(everyone, mine)
        errors = [r["error"] for r in everyone if "error" in r]
        return _raised(errors[0], backend) if errors else LaunchResult(everyone, backend=backend)
    backend = "nccl" if gpu else "gloo"
    try:
        if gpu:
            from .launch import run_gpu_workers

            return LaunchResult(run_gpu_workers(world_size, layout_rank_run, plan, timeout=timeout), backend=backend)
        return LaunchResult(run_workers(world_size, layout_rank_run, plan, timeout=timeout, idle_timeout=idle_timeout),
                            backend=backend)
    except TimeoutError as err:
        return LaunchResult(None, f"hung: {err}", True, "", backend, str(err))
    except WorkerError as err:
        return _raised(str(err), backend)
