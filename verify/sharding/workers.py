"""Start worker processes (gloo ranks on CPU by fork; NCCL ranks on GPUs by spawn), run one function
on every rank, collect the results.

``run_workers(world_size, fn, *args)`` forks ``world_size`` children; each sets
``torch.set_num_threads(1)``, joins a gloo process group through a file store, runs
``fn(rank, world_size, *args)`` and sends its (picklable) result back through a pipe. The parent
waits at most ``timeout`` seconds: a hang (a collective some rank never joins) kills every
child and raises ``TimeoutError`` naming the ranks that did not finish, never blocks CI; a rank
that raised re-raises here as ``WorkerError`` with the child's traceback.

Fork, not spawn: the children inherit the imported modules (no re-import per rank) and the
function needs no pickling. Use one launch per test module or CLI run, not per test.
Under ``torchrun`` (a process group already exists) use ``fn(rank, world_size, ...)`` directly.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import tempfile
import time
import traceback
from typing import Any, Callable

__all__ = ["WorkerError", "run_workers", "DEFAULT_TIMEOUT"]

#: Seconds a launch may take before its workers are killed.
DEFAULT_TIMEOUT = 300.0


class WorkerError(RuntimeError):
    """A worker raised; the message carries its rank and traceback."""


def _child(rank: int, world_size: int, store_path: str, fn: Callable, args: tuple, conn, backend: str = "gloo") -> None:
    status, payload = "ok", None
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if backend == "nccl":  # one rank per GPU: rank r on cuda:r
            torch.cuda.set_device(rank)
            dist.init_process_group("nccl", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                                    device_id=torch.device("cuda", rank))
        else:
            dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size)
        try:
            payload = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent, which re-raises
        status, payload = "error", traceback.format_exc()
    try:
        conn.send_bytes(pickle.dumps((status, payload)))
    except Exception:  # noqa: BLE001 - an unpicklable result is an error too
        conn.send_bytes(pickle.dumps(("error", f"rank {rank}: result not picklable\n{traceback.format_exc()}")))
    conn.close()
    os._exit(0)


def _cpu_seconds(pids: list[int]) -> float | None:
    """User + system CPU seconds of the processes ``pids`` and all their descendants (a rank's
    compile workers: inductor compiles in a pool of subprocesses), with their reaped children's,
    read from Linux /proc, together with every other descendant of this process (a compile pool
    started here before the fork, which the ranks may wait on); None where /proc is unreadable."""
    try:
        stats = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue  # exited meanwhile
                stats[int(entry)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
    except (OSError, ValueError, IndexError):
        return None
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    todo = [p for p in pids if p in stats] + children.get(os.getpid(), [])
    total, seen = 0, set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += stats[pid][1]
        todo += children.get(pid, [])
    return total / os.sysconf("SC_CLK_TCK")


#: A launch counts as idle (hung) when its live ranks used less than this fraction of one core
#: each over the last poll interval (a rank blocked in a collective sleeps in the kernel).
IDLE_CPU_FRACTION = 0.05


def run_workers(world_size: int, fn: Callable[..., Any], *args, timeout: float = DEFAULT_TIMEOUT,
                backend: str = "gloo", idle_timeout: float | None = None) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks; returns the results in rank order.

    ``backend``: "gloo" forks CPU ranks; "nccl" spawns one rank per GPU (rank r on cuda:r; CUDA
    cannot be forked, so ``fn`` and ``args`` must pickle: a function defined at module level).
    ``idle_timeout``: from this many seconds on, the children are killed as soon as every live rank
    is idle (below ``IDLE_CPU_FRACTION`` of a core over the last poll, with its subprocesses, read
    from /proc: blocked in a collective, sleeping), while ranks that compute (a first-call
    compilation, in the rank or in its compile workers) run on until
    ``timeout``; where /proc is unreadable, ``idle_timeout`` is the limit.
    Raises: ValueError naming ``world_size`` unless an int >= 1, or ``backend`` unless "gloo" /
    "nccl"; TimeoutError after ``timeout`` seconds, or after ``idle_timeout`` with every live rank
    idle (the children are killed); WorkerError if a rank raised (the first failing rank's
    traceback; the other ranks are killed, they may be waiting on it).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: expected an int >= 1, got {world_size!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend: expected 'gloo' (forked CPU ranks) or 'nccl' (spawned GPU ranks), got {backend!r}")
    ctx = mp.get_context("fork" if backend == "gloo" else "spawn")
    with tempfile.TemporaryDirectory(prefix=f"ortho-{backend}-") as tmp:
        store = os.path.join(tmp, "store")
        procs, conns = [], []
        for rank in range(world_size):
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(rank, world_size, store, fn, args, child, backend), daemon=True)
            proc.start()
            child.close()
            procs.append(proc)
            conns.append(parent)
        results: dict[int, tuple] = {}
        begun = time.monotonic()
        deadline = begun + timeout
        sample = None  # (time, CPU seconds of the live ranks)
        try:
            while len(results) < world_size:
                now = time.monotonic()
                if idle_timeout is not None and now - begun >= idle_timeout - 1.0:
                    live = [p.pid for r, p in enumerate(procs) if r not in results and p.is_alive()]
                    total = _cpu_seconds(live)
                    if live and total is None and now - begun >= idle_timeout:
                        raise TimeoutError(f"run_workers: ranks {sorted(set(range(world_size)) - set(results))} of "
                                           f"{world_size} did not finish within {idle_timeout:g} s")
                    total = total or 0.0
                    if sample is not None and now - begun >= idle_timeout and live and \
                            total - sample[1] < IDLE_CPU_FRACTION * (now - sample[0]) * len(live):
                        missing = sorted(set(range(world_size)) - set(results))
                        raise TimeoutError(f"run_workers: ranks {missing} of {world_size} did not finish within "
                                           f"{now - begun:.1f} s and sat idle, with their subprocesses (blocked: a "
                                           f"collective not joined by every rank hangs)")
                    sample = (now, total)
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(world_size)) - set(results))
                    raise TimeoutError(f"run_workers: ranks {missing} of {world_size} did not finish within "
                                       f"{timeout:g} s (a collective not joined by every rank hangs)")
                ready = mp.connection.wait([c for r, c in enumerate(conns) if r not in results], timeout=min(left, 1.0))
                for conn in ready:
                    rank = conns.index(conn)
                    try:
                        results[rank] = pickle.loads(conn.recv_bytes())
                    except EOFError:
                        results[rank] = ("error", f"rank {rank} exited without a result (exit code "
                                                  f"{procs[rank].exitcode})")
                    if results[rank][0] == "error":
                        raise WorkerError(f"rank {rank} of {world_size} failed:\n{results[rank][1]}")
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
                proc.join(timeout=10)
            for conn in conns:
                conn.close()
    return [results[r][1] for r in range(world_size)]
