"""Cost per optimizer step of each method of ``ortho-verify reproduce``, timed serially in one
process (no parallel run competing for the cores), the methods interleaved so that a slow spell
of a shared machine touches them alike."""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F

from ..inputs.data import VOCAB_SIZE, build_model
from .config import METHODS_BY_KEY, ReproConfig, gpt_config
from .training import autocast, build_optimizer, corpus

__all__ = ["time_steps"]


def time_steps(config: ReproConfig, lrs: Mapping[str, float], scalar_lr: float, *, steps: int = 8,
               repeats: int = 3, warmup: int = 2, device: str = "cpu") -> dict[str, float]:
    """{method key: median wall seconds of one training step (batch, forward, backward, optimizer
    step)} at ``config``'s size, for each method of ``lrs`` (key -> lr) with the non-matrix
    parameters on AdamW at ``scalar_lr``. Each method gets ``warmup`` untimed steps, then
    ``repeats`` rounds of ``steps`` timed steps, methods interleaved round by round; the median
    is over the rounds' per-step means. Seed 0's initialization and batches.
    Raises: ValueError for steps, repeats < 1 or warmup < 0; KeyError for an unknown method."""
    if steps < 1 or repeats < 1 or warmup < 0:
        raise ValueError(f"steps, repeats, warmup: expected >= 1, >= 1, >= 0, got {steps}, {repeats}, {warmup}")
    dev = torch.device(device)
    train = corpus(config.heldout_every)["tensors"]["train"]
    window = torch.arange(config.context + 1)
    states = {}
    for key, lr in lrs.items():
        generator = torch.Generator().manual_seed(0)
        model = build_model(gpt_config(config), generator).to(dev)
        optimizer = build_optimizer(METHODS_BY_KEY[key], model, lr, scalar_lr if key != "adamw" else lr, config, 0)
        states[key] = (model, optimizer, generator)

    def step(key: str) -> None:
        model, optimizer, generator = states[key]
        starts = torch.randint(0, len(train) - config.context, (config.batch_size, 1), generator=generator)
        chunk = train[starts + window].long().to(dev)
        with autocast(dev):
            logits = model(chunk[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB_SIZE), chunk[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    for key in states:
        for _ in range(warmup):
            step(key)
    rounds: dict[str, list[float]] = {key: [] for key in states}
    for _ in range(repeats):
        for key in states:
            sync()
            start = time.perf_counter()
            for _ in range(steps):
                step(key)
            sync()
            rounds[key].append((time.perf_counter() - start) / steps)
    return {key: float(np.median(v)) for key, v in rounds.items()}
