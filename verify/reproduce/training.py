"""One training run of ``ortho-verify reproduce``: the optimizer of a method, the corpus splits,
the held-out loss and ``train_run``."""

from __future__ import annotations

import contextlib
import math
import time
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

import ortho_fast

from ..inputs.data import VOCAB_SIZE, build_model, stdlib_split
from .config import METHODS_BY_KEY, Method, ReproConfig, gpt_config, lr_multiplier, method_options

__all__ = ["autocast", "build_optimizer", "corpus", "heldout_loss", "train_run"]


def autocast(device: torch.device):
    """The forward pass's precision: bfloat16 autocast on CUDA (weights, gradients and optimizer state
    stay float32; the matrix products run on the tensor cores), nothing on other devices (float32)."""
    if device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def build_optimizer(method: Method, model: torch.nn.Module, lr: float, scalar_lr: float, config: ReproConfig,
                    seed: int) -> torch.optim.Optimizer:
    """The optimizer of ``method`` for ``model``.

    "adamw": ``torch.optim.AdamW`` at ``lr`` on every parameter. "muon" / "dion" / "dion2":
    ``ortho_fast.HybridOptimizer`` over ``ortho_fast.param_groups`` — the hidden matrices on
    Muon (torch.optim.Muon's defaults: EMA momentum ``config.momentum`` with Nesterov, 5 steps of
    ``method.coefficients`` with its own normalization, computed in ``config.ns_dtype``; lr
    scaled per matrix by ``config.muon_adjust_lr``; NorMuon's second-moment EMA
    ``method.normuon_beta2`` when set), Dion (Ahn et al. Algorithm 1:
    μ = ``config.momentum``, Householder QR, one power iteration, column-normalized Q, lr scaled
    by √(m/n), Q0 from ``seed``) or Dion2 (microsoft/dion ``dion/dion2.py``: ``method.fraction``
    of the rows or columns selected by L1 norm, ``method.ef_decay`` on them, Polar Express in
    ``config.ns_dtype``, lr scaled by √(m/n); no μ: ``config.momentum`` is not used), at ``lr``;
    embeddings, LayerNorms and lm_head on AdamW at ``scalar_lr``. AdamW
    everywhere with ``config.betas``, ``config.adamw_eps``; weight decay 0 for every parameter.
    Raises: what ``param_groups`` / ``HybridOptimizer`` raise for bad options.
    """
    if method.family == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=lr, betas=config.betas, eps=config.adamw_eps, weight_decay=0.0)
    if method.family == "muon":  # nesterov, coefficients: ortho_verify.registry
        options = dict(momentum=config.momentum, **method_options(method), adjust_lr=config.muon_adjust_lr,
                       dtype=getattr(torch, config.ns_dtype))
    elif method.family == "dion2":  # fraction, ef_decay, coefficients, adjust_lr: ortho_verify.registry
        options = dict(**method_options(method), dtype=getattr(torch, config.ns_dtype))
    else:  # rank_fraction, error_feedback, qr_method: ortho_verify.registry
        options = dict(mu=config.momentum, **method_options(method))
    groups = ortho_fast.param_groups(
        model, algorithm=method.family, lr=lr, weight_decay=0.0, scalar_lr=scalar_lr, scalar_weight_decay=0.0,
        lm_head_lr_scale=None, matrix_options=options, scalar_options={"betas": config.betas, "eps": config.adamw_eps})
    return ortho_fast.HybridOptimizer(groups, seed=seed)


@lru_cache(maxsize=2)
def corpus(heldout_every: int) -> dict:
    """{"tensors": uint8 tensors of the train / validation / test splits of
    ``ortho_verify.inputs.data.stdlib_split(heldout_every)``, "files": their file counts} (read once per
    process)."""
    split = stdlib_split(heldout_every)
    tensors = {name: torch.frombuffer(bytearray(getattr(split, name)), dtype=torch.uint8)
               for name in ("train", "validation", "test")}
    return {"tensors": tensors, "files": dict(zip(("train", "validation", "test"), split.files))}


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, data: torch.Tensor, config: ReproConfig, device: torch.device) -> float:
    """Mean next-byte cross-entropy (nats) over ``config.eval_windows`` evenly spaced windows of
    ``data`` (uint8 bytes), ``config.context`` bytes each.

    Patch point: ``train_run`` looks it up on this module at every evaluation, so a test may replace
    it (``monkeypatch.setattr(ortho_verify.reproduce.training, "heldout_loss", ...)``).
    Raises: ValueError when ``data`` is shorter than context + 2 bytes."""
    if len(data) < config.context + 2:
        raise ValueError(f"held-out split has {len(data)} bytes, need at least context + 2 = {config.context + 2}")
    starts = torch.linspace(0, len(data) - config.context - 1, config.eval_windows).long()
    window = torch.arange(config.context + 1)
    total = 0.0
    for chunk_starts in starts.split(4 * config.batch_size):
        chunk = data[chunk_starts[:, None] + window].long().to(device)
        with autocast(device):
            logits = model(chunk[:, :-1])
        total += F.cross_entropy(logits.float().reshape(-1, VOCAB_SIZE), chunk[:, 1:].reshape(-1),
                                 reduction="sum").item()
    return total / (config.eval_windows * config.context)


def _grads_finite(params) -> bool:
    return all(bool(torch.isfinite(p.grad).all()) for p in params if p.grad is not None)


def train_run(config: ReproConfig, method_key: str, lr: float, seed: int, *, scalar_lr: float | None = None,
              split: str = "test", curve: bool = True, capture: bool = False, device: str = "cpu") -> dict:
    """Train one model with one method at one lr and seed; return its losses.

    The initialization and the batches come from one ``torch.Generator`` seeded with ``seed``
    (``ortho_verify.inputs.data.build_model``, then ``batch_size`` uniform window starts per step), so two
    methods with the same seed see the same initial weights and the same batches; the global
    RNG is not used. A non-finite training loss, gradient or held-out loss stops the run:
    ``diverged``.

    Args: ``method_key`` a key of ``METHODS``; ``scalar_lr`` the AdamW lr of the non-matrix
    parameters of Muon / Dion (default ``lr``); ``split`` "validation" or "test" (held-out
    split judged); ``curve``: record the held-out loss at ``config.curve_steps()`` (else only at
    the end); ``capture``: record the gradients of the Muon / Dion / Dion2 matrices at
    ``config.capture_steps()``; ``device`` a torch device string.
    Returns: dict with ``method``, ``lr``, ``scalar_lr``, ``seed``, ``split``, ``loss`` (final
    held-out loss in nats per byte, None if diverged), ``curve_steps`` / ``curve`` (held-out
    loss, None after a divergence), ``train_curve`` (mean training loss over each curve
    interval), ``diverged``, ``seconds`` (the whole run), ``step_seconds`` (wall time per
    training step — batch, forward, backward, optimizer step — without the held-out evaluations;
    None if the first step diverged), and with ``capture`` ``gradients``: a list of
    (parameter name, step, float32 (m, n) array).
    Raises: KeyError for an unknown method, ValueError for an unknown split.
    """
    method = METHODS_BY_KEY[method_key]
    if split not in ("validation", "test"):
        raise ValueError(f"split: expected 'validation' or 'test', got {split!r}")
    start = time.perf_counter()
    tensors = corpus(config.heldout_every)["tensors"]
    train, heldout = tensors["train"], tensors[split]
    dev = torch.device(device)
    generator = torch.Generator().manual_seed(seed)
    model = build_model(gpt_config(config), generator).to(dev)
    optimizer = build_optimizer(method, model, lr, lr if scalar_lr is None else scalar_lr, config, seed)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda index: lr_multiplier(index, config))
    matrices = [(name, p) for g in optimizer.param_groups if g.get("algorithm") in ("muon", "dion", "dion2")
                for name, p in zip(g["param_names"], g["params"])]
    params = list(model.parameters())
    curve_steps = config.curve_steps() if curve else (config.steps,)
    captures = set(config.capture_steps()) if capture else set()
    window = torch.arange(config.context + 1)
    curve_losses, train_curve, gradients, interval = [], [], [], []
    diverged = False
    if 0 in curve_steps:
        curve_losses.append(heldout_loss(model, heldout, config, dev))
    loop_start, eval_seconds, steps_done = time.perf_counter(), 0.0, 0
    for step in range(1, config.steps + 1):
        starts = torch.randint(0, len(train) - config.context, (config.batch_size, 1), generator=generator)
        chunk = train[starts + window].long().to(dev)
        with autocast(dev):
            logits = model(chunk[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB_SIZE), chunk[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        value = loss.item()
        if not math.isfinite(value) or not _grads_finite(params):
            diverged = True
            break
        interval.append(value)
        if step in captures:
            gradients += [(name, step, p.grad.detach().float().cpu().numpy().copy()) for name, p in matrices]
        optimizer.step()
        scheduler.step()
        steps_done += 1
        if step in curve_steps:
            eval_start = time.perf_counter()
            loss_now = heldout_loss(model, heldout, config, dev)
            eval_seconds += time.perf_counter() - eval_start
            if not math.isfinite(loss_now):  # this step's update made the weights non-finite
                diverged = True
                break
            curve_losses.append(loss_now)
            train_curve.append(float(np.mean(interval)))
            interval = []
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    step_seconds = (time.perf_counter() - loop_start - eval_seconds) / steps_done if steps_done else None
    if diverged:
        curve_losses += [None] * (len(curve_steps) - len(curve_losses))
        train_curve += [None] * (len(curve_steps) - (0 in curve_steps) - len(train_curve))
    result = dict(method=method_key, lr=lr, scalar_lr=lr if scalar_lr is None else scalar_lr, seed=seed, split=split,
                  loss=curve_losses[-1], curve_steps=list(curve_steps), curve=curve_losses, train_curve=train_curve,
                  diverged=diverged, seconds=time.perf_counter() - start, step_seconds=step_seconds)
    if capture:
        result["gradients"] = gradients
    return result
