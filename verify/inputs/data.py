"""Real gradients: a small byte-level GPT trained on a pinned, generated corpus of Python-like text.

The training text of the ``ortho-verify`` inputs is ``ortho_verify.inputs.corpus.pinned_corpus``:
generated deterministically, the same bytes on every interpreter, identified by its SHA-256
(``corpus_identity``), so the same package gives the same inputs everywhere and nothing is
downloaded (docs/design.md, "Real input"). The running interpreter's standard library
(``stdlib_corpus``, ``stdlib_split``) stays available: ``ortho_verify.reproduce`` trains on it.
The model is a GPT-2 style decoder (Radford et al. 2019; layout as in Karpathy's
nanoGPT): token + position embeddings, pre-norm blocks with causal self-attention
(fused qkv Linear) and a 4x GELU MLP, a final LayerNorm and an untied lm_head.
Gradients of its 2-D weights at a few training steps are the "real" test matrices.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import sysconfig
import time
import warnings
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .corpus import CORPUS_BYTES, corpus_identity, pinned_corpus
from .gradient_cache import cache_path, load, save
from .spectra import MatrixCase

__all__ = ["CorpusSplit", "GPTConfig", "capture_in_background", "last_run_info", "quick_config", "quick_step",
           "real_gradients", "stdlib_corpus", "stdlib_split", "train_and_capture"]

VOCAB_SIZE = 256  # byte-level tokens
_SKIP_DIRS = frozenset({"site-packages", "test", "tests", "idle_test"})
#: Parameters whose gradients form the quick set of real inputs (one matrix per kind of layer).
QUICK_PARAMS = (
    "tok_emb.weight",
    "blocks.0.attn.qkv.weight",
    "blocks.0.attn.proj.weight",
    "blocks.0.mlp.fc.weight",
    "blocks.0.mlp.proj.weight",
    "lm_head.weight",
)


def quick_step(config: "GPTConfig") -> int:
    """The capture step of the quick set of real inputs: the first capture step after step 1 (the
    gradients at step 1 are those of the random initialization), else the only one. 100 for the
    default ``GPTConfig``."""
    later = [s for s in sorted(config.capture_steps) if s > 1]
    return later[0] if later else max(config.capture_steps)


def quick_config(config: "GPTConfig") -> "GPTConfig":
    """``config`` trained only up to ``quick_step(config)`` and capturing there: the quick set's own
    training (a third of the default's steps). AdamW runs at a constant lr and draws its batches
    from one generator, so its first steps are those of the full run: the quick set is the same
    matrices whether it is read from the full run's cache or from this one's."""
    step = quick_step(config)
    return replace(config, steps=step, capture_steps=(step,))


_FINAL_LOSS_WINDOW = 10

Progress = Callable[[int, int, float], None]


def stdlib_corpus(max_bytes: int | None = None) -> bytes:
    """Concatenated bytes of the standard library's ``.py`` files (about 12 MB for CPython 3.11).

    Walks ``sysconfig.get_paths()["stdlib"]`` top-down, directories and files in sorted order
    (deterministic for a given installation), skipping ``site-packages`` and test directories
    (``test``, ``tests``, ``idlelib/idle_test``) and files that cannot be read. ``max_bytes``: if
    given, stop after this many bytes (the result is truncated to exactly ``max_bytes``).
    Raises: ValueError if ``max_bytes`` is negative.
    """
    if max_bytes is not None and max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
    chunks: list[bytes] = []
    total = 0
    for data in stdlib_files():
        chunks.append(data)
        total += len(data)
        if max_bytes is not None and total >= max_bytes:
            break
    corpus = b"".join(chunks)
    return corpus if max_bytes is None else corpus[:max_bytes]


class CorpusSplit(NamedTuple):
    """The standard-library corpus split by file (:func:`stdlib_split`).

    Attributes: ``train``, ``validation``, ``test`` the concatenated bytes of each split's
    files; ``files`` the number of files in each, in that order.
    """

    train: bytes
    validation: bytes
    test: bytes
    files: tuple[int, int, int]


def stdlib_split(heldout_every: int = 10) -> CorpusSplit:
    """The files of :func:`stdlib_corpus` dealt into train, validation and test splits.

    File i (0-based, in :func:`stdlib_corpus`'s order, counting only readable files) goes to
    validation if ``i % k == k - 2``, to test if ``i % k == k - 1``, else to train
    (k = ``heldout_every``): one file in k is held out for validation and one for test,
    spread over the whole library, and no file contributes to two splits, so held-out text
    is never a window of the training text. Deterministic for a given installation.

    ``heldout_every``: k >= 3 (k = 10: 80 % / 10 % / 10 % of the files). Returns a
    :class:`CorpusSplit` (train + validation + test is a permutation of the files of ``stdlib_corpus()``).
    Raises: ValueError if ``heldout_every`` is not an int >= 3.
    """
    if isinstance(heldout_every, bool) or not isinstance(heldout_every, int) or heldout_every < 3:
        raise ValueError(f"heldout_every: expected an int >= 3, got {heldout_every!r}")
    parts: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    for i, data in enumerate(stdlib_files()):
        parts[{heldout_every - 2: 1, heldout_every - 1: 2}.get(i % heldout_every, 0)].append(data)
    return CorpusSplit(*(b"".join(parts[j]) for j in range(3)), files=tuple(len(parts[j]) for j in range(3)))


def _stdlib_sources() -> Iterator[Path]:
    """``.py`` files of the stdlib, sorted walk, without site-packages and test dirs."""
    for directory, subdirs, files in os.walk(sysconfig.get_paths()["stdlib"]):
        subdirs[:] = sorted(d for d in subdirs if d not in _SKIP_DIRS)
        for name in sorted(f for f in files if f.endswith(".py")):
            yield Path(directory, name)


def stdlib_files() -> Iterator[bytes]:
    """Bytes of each readable ``.py`` file of the running Python's standard library (sorted walk,
    without site-packages and test dirs), in order; unreadable ones are skipped.

    Patch point: ``stdlib_corpus`` and ``stdlib_split`` read the files through this function
    (looked up on this module at call time), so a test may replace it with
    ``monkeypatch.setattr(ortho_verify.inputs.data, "stdlib_files", ...)``."""
    for path in _stdlib_sources():
        try:
            yield path.read_bytes()
        except OSError:
            continue


@dataclass(frozen=True)
class GPTConfig:
    """Sizes and training schedule of the gradient-source model.

    Attributes:
        d_model: embedding width.
        n_layers: number of transformer blocks.
        n_heads: attention heads (must divide ``d_model``).
        context: sequence length in bytes.
        batch_size: sequences per step.
        lr: AdamW learning rate (other AdamW hyperparameters are torch defaults).
        steps: number of optimizer steps.
        capture_steps: 1-based steps at which gradients are recorded, each in [1, steps].
        corpus_bytes: size of the training corpus, a prefix of
            ``ortho_verify.inputs.corpus.pinned_corpus``.

    Raises:
        ValueError: on non-positive sizes, ``d_model % n_heads != 0``, empty or
            out-of-range ``capture_steps``, or a corpus shorter than ``context + 1``.
    """

    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    context: int = 64
    batch_size: int = 16
    lr: float = 3e-3
    steps: int = 300
    capture_steps: tuple[int, ...] = (1, 100, 200, 300)
    corpus_bytes: int = CORPUS_BYTES

    def __post_init__(self) -> None:
        sizes = ("d_model", "n_layers", "n_heads", "context", "batch_size", "steps")
        for field_name in sizes:
            if getattr(self, field_name) < 1:
                raise ValueError(f"GPTConfig.{field_name} must be >= 1")
        if self.d_model % self.n_heads:
            raise ValueError("GPTConfig.d_model must be divisible by n_heads")
        if not self.capture_steps or not all(1 <= s <= self.steps for s in self.capture_steps):
            raise ValueError(f"GPTConfig.capture_steps must be non-empty and within [1, steps={self.steps}]")
        if self.corpus_bytes < self.context + 1:
            raise ValueError("GPTConfig.corpus_bytes must be >= context + 1")


class _Attention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class _MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(config.d_model, 4 * config.d_model, bias=False)
        self.proj = nn.Linear(4 * config.d_model, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class _Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = _Attention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = _MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class _GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB_SIZE, config.d_model)
        self.pos_emb = nn.Embedding(config.context, config.d_model)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, VOCAB_SIZE, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def build_model(config: GPTConfig, generator: torch.Generator) -> nn.Module:
    """The byte-level GPT of ``config`` (``d_model``, ``n_layers``, ``n_heads``, ``context``; vocabulary
    ``VOCAB_SIZE``), with GPT-2 initialization (weights N(0, 0.02), LayerNorm 1/0) drawn from
    ``generator`` only, float32 on the CPU. Input (batch, ≤ context) int64 bytes -> logits
    (batch, length, 256).

    Built on the meta device first, so the global torch RNG is neither used nor advanced. Used by
    ``train_and_capture`` and ``ortho_verify.reproduce``.
    """
    with torch.device("meta"):
        model = _GPT(config)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, 0.02, generator=generator)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()
    return model


def train_and_capture(
    config: GPTConfig = GPTConfig(), *, seed: int = 0, progress: Progress | None = None
) -> list[MatrixCase]:
    """Train the byte-level GPT with AdamW and record gradients of its 2-D weights.

    Each step draws ``batch_size`` random windows of ``context + 1`` bytes from
    ``pinned_corpus(config.corpus_bytes)`` and minimizes the next-byte cross-entropy.
    At every step in ``config.capture_steps`` the gradient of each 2-D parameter
    (token/position embeddings, attention qkv/proj, MLP fc/proj, lm_head) is copied
    after ``backward`` and before ``optimizer.step``. All randomness (init, batches)
    comes from a ``torch.Generator`` seeded with ``seed``; the global RNG is untouched.
    Training runs with one intra-op thread (``torch.set_num_threads(1)``, restored on
    return): the model is too small to gain from threads, a fixed count makes the
    result independent of the caller's setting, and with 2 threads on a 2-core machine
    where one core is busy, OpenMP spin-waiting made a run 30x slower (160 s vs 5 s).

    Args:
        config: model sizes and schedule.
        seed: seed of the private ``torch.Generator``.
        progress: optional ``callable(step, total, loss)`` called after every step
            (1-based ``step``, ``total = config.steps``, ``loss`` in nats per byte).

    Returns:
        list of :class:`MatrixCase` (source ``"real"``), step-major, named
        ``"gpt/step<k>/<parameter name>"``; matrices are float64 with the
        parameter's shape (out_features, in_features) or (num_embeddings, d_model).

    Raises:
        ValueError: if the corpus is shorter than ``config.context + 1`` bytes.
    """
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(config, seed, progress)
    finally:
        torch.set_num_threads(previous_threads)


def _train(config: GPTConfig, seed: int, progress: Progress | None) -> list[MatrixCase]:
    corpus = pinned_corpus(config.corpus_bytes)
    if len(corpus) < config.context + 1:
        raise ValueError(f"corpus has {len(corpus)} bytes, need at least context + 1 = {config.context + 1}")
    data = torch.frombuffer(bytearray(corpus), dtype=torch.uint8)
    generator = torch.Generator().manual_seed(seed)
    model = build_model(config, generator)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    window = torch.arange(config.context + 1)
    capture = set(config.capture_steps)
    cases = []
    for step in range(1, config.steps + 1):
        starts = torch.randint(0, len(data) - config.context, (config.batch_size, 1), generator=generator)
        chunk = data[starts + window].long()
        logits = model(chunk[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), chunk[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        loss_value = loss.item()
        if step in capture:
            for name, param in model.named_parameters():
                if param.ndim == 2:
                    cases.append(
                        MatrixCase(
                            name=f"gpt/step{step}/{name}",
                            matrix=param.grad.detach().to(torch.float64).numpy(),
                            source="real",
                            description=(
                                f"gradient of {name} at AdamW step {step}/{config.steps}, batch loss "
                                f"{loss_value:.4f} nats/byte; byte-level GPT d{config.d_model} "
                                f"L{config.n_layers} H{config.n_heads} on the pinned corpus, seed {seed}"
                            ),
                        )
                    )
        if progress is not None:
            progress(step, config.steps, loss_value)
        optimizer.step()
    return cases


def capture_in_background(*, config: GPTConfig | None = None, cache_dir: str | os.PathLike | None = None,
                          seed: int = 0, quick: bool = False):
    """Start :func:`real_gradients`' training in a forked daemon process when its cache file is missing (torch's
    compiler stack, which AdamW imports, is imported first: the caller needs it too), so that the caller
    works on the other core meanwhile (``ortho-verify`` checks the synthetic inputs): join the returned
    ``multiprocessing.Process``, then call :func:`real_gradients` with the same arguments: it reads the file
    the child wrote atomically (or trains if the child failed). None when the file exists or the platform
    cannot fork. ``quick``: the training :func:`real_gradients` needs for ``quick=True`` (none when the full
    run's cache exists, else ``quick_config``'s). Raises: OSError if the cache directory cannot be made."""
    config = GPTConfig() if config is None else config
    path, _ = cache_path(config, cache_dir, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or "fork" not in multiprocessing.get_all_start_methods():
        return None
    if quick:
        config = quick_config(config)
        if cache_path(config, cache_dir, seed)[0].exists():
            return None
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])  # imports torch._dynamo (seconds) here, not in the child
    proc = multiprocessing.get_context("fork").Process(target=real_gradients, name="ortho-gpt-capture", daemon=True,
                                                       kwargs=dict(quick=False, config=config, cache_dir=cache_dir,
                                                                   seed=seed))
    proc.start()
    return proc


_last_info: dict | None = None


def last_run_info() -> dict | None:
    """Metadata of the most recent :func:`real_gradients` call in this process.

    Returns:
        None before the first call, else a dict with keys ``config`` (dict),
        ``seed``, ``torch_version``, ``python_version`` (of the run that trained),
        ``corpus`` (``ortho_verify.inputs.corpus.corpus_identity``: name, bytes, sha256),
        ``corpus_bytes`` (int),
        ``initial_loss`` (loss at step 1, nats/byte; ln 256 = 5.545 is chance),
        ``final_loss`` (mean loss over the last 10 steps, nats/byte),
        ``train_seconds`` (wall time of the training run that built the cache),
        ``key``, ``cache_path`` (str) and ``from_cache`` (bool).
    """
    return None if _last_info is None else dict(_last_info)


def real_gradients(
    *,
    quick: bool,
    config: GPTConfig | None = None,
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
    progress: Progress | None = None,
) -> list[MatrixCase]:
    """Gradients of the byte-level GPT, trained once and cached on disk.

    The cache is ``<cache_dir>/gpt-grads-<key>.npz`` plus a ``.json`` sidecar with
    the metadata; ``key`` hashes (config, seed, torch version, the corpus identity,
    cache format) — not the Python version: the corpus does not depend on it — so a changed setting never loads a stale
    file. An unreadable or mismatching cache file is rebuilt (with a warning); files are written to a
    temp file and moved into place with ``os.replace``, so an interrupted write
    never leaves a corrupt cache. A quick call reads the full run's cache when it exists, else
    trains only up to the quick step (``quick_config``, cached under its own key): the same matrices.

    Args:
        quick: if True return the quick set: the capture step ``quick_step(config)`` only
            (step 100 of the default), and only the parameters tok_emb, blocks.0.attn.{qkv,proj},
            blocks.0.mlp.{fc,proj} and lm_head (6 matrices).
        config: model and schedule; default ``GPTConfig()``.
        cache_dir: cache directory; default ``$ORTHO_CACHE_DIR``, else
            ``$XDG_CACHE_HOME/ortho``, else ``~/.cache/ortho``. Created if missing.
        seed: training seed (see :func:`train_and_capture`).
        progress: forwarded to :func:`train_and_capture` when training runs.

    Returns the :class:`MatrixCase` list of :func:`train_and_capture` (float64 (m, n) gradients,
    source ``"real"``); the training metadata, final loss included, from :func:`last_run_info`.
    Raises: OSError if the cache directory cannot be created or written.
    """
    global _last_info
    config = GPTConfig() if config is None else config
    step = quick_step(config)
    path, key = cache_path(config, cache_dir, seed)
    if quick and not path.exists():  # the full run is not cached: train only what the quick set needs
        config = quick_config(config)
        path, key = cache_path(config, cache_dir, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    from_cache = False
    try:
        cases, meta = load(path, key)
        from_cache = True
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        warnings.warn(f"rebuilding unreadable gradient cache {path}: {err}", stacklevel=2)
    if not from_cache:
        losses: list[float] = []

        def record(step: int, total: int, loss: float) -> None:
            losses.append(loss)
            if progress is not None:
                progress(step, total, loss)

        start = time.perf_counter()
        cases = train_and_capture(config, seed=seed, progress=record)
        meta = {
            "key": key,
            "config": asdict(config),
            "seed": seed,
            "torch_version": torch.__version__,
            "python_version": sys.version,
            "corpus": corpus_identity(config.corpus_bytes),
            "corpus_bytes": config.corpus_bytes,
            "initial_loss": losses[0],
            "final_loss": float(np.mean(losses[-_FINAL_LOSS_WINDOW:])),
            "train_seconds": time.perf_counter() - start,
        }
        save(path, cases, meta)
    _last_info = {**meta, "cache_path": str(path), "from_cache": from_cache}
    if quick:
        prefix = f"gpt/step{step}/"
        cases = [c for c in cases if c.name.startswith(prefix) and c.name[len(prefix):] in QUICK_PARAMS]
    return cases
