"""The on-disk cache of the byte-level GPT's captured gradients (``ortho_verify.inputs.data.real_gradients``):
where it lives, the key of a run, and atomic writes of the ``.npz`` file and its ``.json`` sidecar.

The key hashes (config, seed, torch version, the corpus identity, cache format); a file whose
stored key does not match is rejected by ``load`` (ValueError), so a changed setting never reads
a stale file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from .corpus import corpus_identity
from .spectra import MatrixCase

__all__ = ["CACHE_FORMAT", "cache_path", "default_cache_dir", "load", "save"]

CACHE_FORMAT = 2  # bump when the cache layout or the capture procedure changes


def default_cache_dir() -> Path:
    """``$ORTHO_CACHE_DIR``, else ``$XDG_CACHE_HOME/ortho``, else ``~/.cache/ortho``."""
    if os.environ.get("ORTHO_CACHE_DIR"):
        return Path(os.environ["ORTHO_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "ortho"


def cache_key(config, seed: int) -> str:
    """16 hex digits of the SHA-256 of (cache format, ``config`` (a ``GPTConfig``), seed, torch
    version, the corpus identity)."""
    identity = {
        "format": CACHE_FORMAT,
        "config": asdict(config),
        "seed": seed,
        "torch": torch.__version__,
        "corpus": corpus_identity(config.corpus_bytes),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write via ``write(file)`` to a temp file in the same directory, then os.replace."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def save(path: Path, cases: list[MatrixCase], meta: dict) -> None:
    """The cases and ``meta`` (with its "key") as ``path`` (.npz) and a readable .json sidecar, each written
    atomically."""
    arrays = {f"matrix_{i}": c.matrix for i, c in enumerate(cases)}
    arrays["names"] = np.array([c.name for c in cases])
    arrays["descriptions"] = np.array([c.description for c in cases])
    arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
    atomic_write(path, lambda f: np.savez(f, **arrays))
    sidecar = json.dumps(meta, indent=2, sort_keys=True).encode()  # readable copy; the .npz is authoritative
    atomic_write(path.with_suffix(".json"), lambda f: f.write(sidecar))


def load(path: Path, key: str) -> tuple[list[MatrixCase], dict]:
    """(cases, meta) of ``path``. Raises: FileNotFoundError; ValueError when its key is not ``key``;
    OSError / KeyError / EOFError / zipfile.BadZipFile for an unreadable file."""
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        if meta["key"] != key:
            raise ValueError(f"cache key mismatch in {path}")
        cases = [
            MatrixCase(name=str(name), matrix=z[f"matrix_{i}"], source="real", description=str(desc))
            for i, (name, desc) in enumerate(zip(z["names"], z["descriptions"]))
        ]
    return cases, meta


def cache_path(config, cache_dir, seed: int) -> tuple[Path, str]:
    """(``<cache_dir or default_cache_dir()>/gpt-grads-<key>.npz``, key) of a run of ``config`` and ``seed``."""
    key = cache_key(config, seed)
    return (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / f"gpt-grads-{key}.npz", key
