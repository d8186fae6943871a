"""The learning-rate sweep of ``ortho-verify reproduce``: each method's grid on the validation
split, extended beyond an edge that wins (``sweep_learning_rates``), and the best lr."""

from __future__ import annotations

import math
from collections.abc import Sequence

from .config import Method
from .pool import Runner

__all__ = ["best_learning_rate", "sweep_learning_rates"]


def _loss_key(loss: float | None) -> float:
    return math.inf if loss is None or not math.isfinite(loss) else loss


def sweep_learning_rates(runner: Runner, methods: Sequence[Method], scalar_lr: float | None, sweep: dict) -> None:
    """Fill ``sweep[key]`` = [{"lr", "validation_loss"}] for each method (``runner``: a ``Runner``, or
    any object with its ``config`` and ``map(phase, jobs)``), extending a grid
    whose best lr lies on an edge (``config.lr_extensions`` rounds; a grid whose every lr
    diverged is extended downwards)."""
    config = runner.config
    pending = [(m, lr) for m in methods for lr in config.grid(m.family)]
    for round_ in range(config.lr_extensions + 1):
        phase = "lr sweep" if round_ == 0 else f"lr sweep, grid extension {round_}"
        results = runner.map(phase, [dict(method_key=m.key, lr=lr, seed=config.sweep_seed, scalar_lr=scalar_lr,
                                          split="validation", curve=False) for m, lr in pending])
        for (m, lr), r in zip(pending, results):
            sweep.setdefault(m.key, []).append({"lr": lr, "validation_loss": r["loss"]})
        pending = []
        for m in methods if round_ < config.lr_extensions else ():
            best, edge = best_learning_rate(sweep[m.key])
            lrs = [p["lr"] for p in sweep[m.key]]
            if edge:
                pending.append((m, best / config.lr_factor if best == min(lrs) else best * config.lr_factor))
        if not pending:
            break


def best_learning_rate(points: list[dict]) -> tuple[float, bool]:
    """(lr with the lowest validation loss — the smallest such lr on a tie, diverged runs
    counting as +inf —, whether it lies on an edge of the swept grid).
    Raises: ValueError for an empty sweep."""
    if not points:
        raise ValueError("points: empty learning-rate sweep")
    points = sorted(points, key=lambda p: p["lr"])
    best = min(points, key=lambda p: _loss_key(p["validation_loss"]))
    return best["lr"], len(points) > 1 and best in (points[0], points[-1])
