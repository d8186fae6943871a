"""The run cache of ``ortho-verify reproduce``: one file per training run, keyed by (method and the
code it runs, model size and schedule, seed, lr, split), so that regenerating the report after a
change reruns only the runs the change touches, and ``--resume`` continues an interrupted sweep.

A key hashes (``run_key``): the fields of ``ReproConfig`` that one run reads (the evaluation
seeds, the lr grids and their extension rule are left out: adding a seed or widening a grid keeps
the runs already done), the run's keywords (method, lr, seed, AdamW lr of the other parameters,
split, curve, capture, device) and the method's fingerprint (``method_fingerprint``: its options
from ``ortho_verify.registry``, the torch version and the SHA-256 of the source files the run
executes, ``code_files``). Entries are written atomically with ``torch.save`` and read with
``torch.load(weights_only=True)`` (no pickle of arbitrary objects).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

import ortho_fast

from .config import FAMILIES, METHODS, Method, ReproConfig, method_options

__all__ = ["CACHE_FORMAT", "CachedRunner", "RunCache", "code_files", "default_cache_dir", "method_fingerprint",
           "method_fingerprints", "run_key"]

#: Bump when the layout of an entry or the meaning of a key changes.
CACHE_FORMAT = 1
#: ReproConfig fields that no single run reads (the protocol's, not the run's).
_PROTOCOL_FIELDS = frozenset({"seeds", "sweep_seed", "adamw_lrs", "muon_lrs", "dion_lrs", "lr_extensions", "lr_factor"})
#: ortho_fast files a family does not execute (by file name, or by path under ortho_fast/); distributed/ is
#: never executed here. Dion2 runs Newton–Schulz (newton_schulz.py, coefficients.py) and functional/muon.py's lr
#: scale, and HybridOptimizer runs ortho_fast/dion.py and groups/dion.py for every family: only Dion's math
#: (functional/dion.py, functional/qr.py) is left out.
_OTHER_FAMILY = {"muon": ("dion.py", "qr.py"), "dion": ("muon.py", "newton_schulz.py", "coefficients.py"),
                 "dion2": ("functional/dion.py", "functional/qr.py")}


def default_cache_dir() -> Path:
    """``$ORTHO_CACHE_DIR/reproduce`` if set, else ``$XDG_CACHE_HOME/ortho/reproduce`` (default
    ``~/.cache/ortho/reproduce``)."""
    if os.environ.get("ORTHO_CACHE_DIR"):
        return Path(os.environ["ORTHO_CACHE_DIR"]) / "reproduce"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "ortho" / "reproduce"


def code_files(family: str) -> list[Path]:
    """Source files a run of a method family executes: ``ortho_verify.reproduce``'s training,
    configuration and ``ortho_verify.inputs.data`` (model, corpus) for every family, and for "muon" /
    "dion" / "dion2" the ``ortho_fast`` package without ``distributed/`` and without the files
    only another family executes (Dion2: without Dion's math, with Newton–Schulz). Patch point: ``method_fingerprint``
    looks it up on this module at every call, so a test
    may replace it (``monkeypatch.setattr(ortho_verify.reproduce.cache, "code_files", ...)``).
    Raises: ValueError for an unknown family."""
    if family not in FAMILIES:
        raise ValueError(f"family: expected one of {FAMILIES}, got {family!r}")
    here = Path(__file__).resolve().parent
    files = [here / "training.py", here / "config.py", here.parent / "inputs" / "data.py"]
    if family != "adamw":
        root = Path(ortho_fast.__file__).resolve().parent
        files += [p for p in sorted(root.rglob("*.py")) if "distributed" not in p.relative_to(root).parts
                  and p.name not in _OTHER_FAMILY[family]
                  and p.relative_to(root).as_posix() not in _OTHER_FAMILY[family]]
    return files


def method_fingerprint(method: Method) -> str:
    """SHA-256 (hex) of the method (``Method`` fields), its optimizer options, the torch version
    and the contents of ``code_files(method.family)``: it changes when anything its runs execute
    changes."""
    digest = hashlib.sha256()
    options = {} if method.family == "adamw" else method_options(method)
    digest.update(json.dumps([asdict(method), repr(sorted(options.items())), torch.__version__],
                             sort_keys=True).encode())
    for path in code_files(method.family):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def method_fingerprints() -> dict[str, str]:
    """{method key: ``method_fingerprint``} for every method of ``METHODS``."""
    return {m.key: method_fingerprint(m) for m in METHODS}


def run_key(config: ReproConfig, job: Mapping, fingerprint: str) -> str:
    """SHA-256 (hex) naming one run: the run-level fields of ``config``, the ``train_run`` keywords
    of ``job`` (defaults filled in) and the method's ``fingerprint``."""
    fields = {k: v for k, v in asdict(config).items() if k not in _PROTOCOL_FIELDS}
    kwargs = {"scalar_lr": None, "split": "test", "curve": True, "capture": False, "device": "cpu", **job}
    kwargs["scalar_lr"] = kwargs["lr"] if kwargs["scalar_lr"] is None else kwargs["scalar_lr"]
    text = json.dumps([CACHE_FORMAT, fields, kwargs, fingerprint], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


class RunCache:
    """A folder of cached ``train_run`` results, one ``<key>.pt`` file each. ``get(key)``: the
    result or None (a missing or unreadable entry is a miss); ``put(key, result)``: written
    atomically (a temporary file, then ``os.replace``). Gradients ((name, step, array) tuples)
    are stored as tensors and come back as float32 numpy arrays."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.pt"

    def get(self, key: str) -> dict | None:
        try:
            entry = torch.load(self.path(key), weights_only=True)
        except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError):
            return None
        if not isinstance(entry, dict) or entry.get("key") != key:
            return None
        result = dict(entry["result"])
        if "gradients" in result:
            result["gradients"] = [(n, int(s), g.numpy()) for n, s, g in result["gradients"]]
        return result

    def put(self, key: str, result: Mapping) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        stored = dict(result)
        if "gradients" in stored:
            stored["gradients"] = [(n, int(s), torch.from_numpy(np.ascontiguousarray(g)))
                                   for n, s, g in stored["gradients"]]
        tmp = self.path(key).with_suffix(f".tmp{os.getpid()}")
        torch.save({"key": key, "result": stored}, tmp)
        os.replace(tmp, self.path(key))


class CachedRunner:
    """A ``Runner`` that answers from a ``RunCache``: ``map(phase, jobs)`` runs on ``runner`` (any
    object with ``config``, ``device``, ``log`` and ``map``) only the jobs whose ``run_key`` is not
    in ``cache`` (all of them when ``reuse`` is False), stores every fresh result, and returns
    results in the order of the jobs. ``hits`` / ``misses`` count the jobs answered from the
    cache / run; ``seconds`` sums the training time of the fresh runs, ``cached_seconds`` that
    recorded in the reused ones. ``fingerprints``: method key -> fingerprint (default
    ``method_fingerprints()``)."""

    def __init__(self, runner, cache: RunCache, *, reuse: bool = True, fingerprints: Mapping[str, str] | None = None):
        self.runner, self.cache, self.reuse = runner, cache, reuse
        self.fingerprints = dict(method_fingerprints() if fingerprints is None else fingerprints)
        self.hits = self.misses = 0
        self.seconds = self.cached_seconds = 0.0

    @property
    def config(self) -> ReproConfig:
        return self.runner.config

    def close(self) -> None:
        if hasattr(self.runner, "close"):
            self.runner.close()

    def map(self, phase: str, jobs: list[dict]) -> list[dict]:
        device = getattr(self.runner, "device", "cpu")
        keys = [run_key(self.config, dict(job, device=device), self.fingerprints[job["method_key"]]) for job in jobs]
        out: list[dict | None] = [self.cache.get(k) if self.reuse else None for k in keys]
        todo = [i for i, r in enumerate(out) if r is None]
        self.hits += len(jobs) - len(todo)
        self.cached_seconds += sum(r["seconds"] for r in out if r is not None)
        if len(todo) < len(jobs):
            getattr(self.runner, "log", print)(f"  {phase}: {len(jobs) - len(todo)} of {len(jobs)} runs from the cache")
        if todo:
            fresh = self.runner.map(phase, [jobs[i] for i in todo])
            self.misses += len(todo)
            for i, result in zip(todo, fresh):
                self.cache.put(keys[i], result)
                self.seconds += result["seconds"]
                out[i] = result
        return out  # type: ignore[return-value]

