"""The model-size sweep's options of ``ortho-verify reproduce`` (``--sizes``, ``--lr-sweep``,
``--single-size``, ``--cache``, ``--no-cache``, ``--resume``), kept apart from ``cli`` so that the
command line's other options evolve independently."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from .cache import default_cache_dir
from .scaling import DEFAULT_SWEEP, LR_SWEEP_MODES, QUICK_SWEEP, ModelSize, SizeSweep

__all__ = ["HEAD_SIZE", "add_sweep_arguments", "cache_folder", "sweep_from_arguments"]

#: Head size of the sizes given with ``--sizes`` (d_model / n_heads), as the default sweep's.
HEAD_SIZE = 16


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the sweep's options to ``ortho-verify reproduce``'s parser."""
    default = ", ".join(str(s.d_model) for s in DEFAULT_SWEEP.sizes)
    parser.add_argument("--sizes", default=None,
                        help=f"comma-separated d_model widths of the size sweep (default {default}; head size "
                             f"{HEAD_SIZE}, the default sweep's depth)")
    parser.add_argument("--lr-sweep", choices=LR_SWEEP_MODES, default=None,
                        help="'each': every size sweeps its own lrs; 'shared': the smallest size sweeps and the "
                             "others reuse its best lrs (default with --quick); 'matrix-shared': AdamW swept at every "
                             f"size, Muon / Dion at the smallest (default: {DEFAULT_SWEEP.lr_sweep})")
    parser.add_argument("--single-size", action="store_true",
                        help="no size sweep: the single-size study (d_model 64, 600 steps; --quick: its tiny model)")
    parser.add_argument("--cache", type=Path, default=None,
                        help=f"folder of the per-run cache (default {default_cache_dir()}, or $ORTHO_CACHE_DIR)")
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write the per-run cache")
    parser.add_argument("--resume", action="store_true",
                        help="reuse the cached runs whose method, code, size, seed and lr are unchanged (continues "
                             "an interrupted run; after a code change reruns only the runs it touches)")


def cache_folder(args: argparse.Namespace) -> Path | None:
    """The cache folder the arguments ask for (None with ``--no-cache``)."""
    return None if args.no_cache else (args.cache or default_cache_dir())


def sweep_from_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> SizeSweep | None:
    """The ``SizeSweep`` of the arguments (``--quick``, ``--scale``, ``--steps``, ``--seeds``,
    ``--sizes``, ``--lr-sweep``), None with ``--single-size``. Bad values: ``parser.error`` naming
    the option (exit 2)."""
    if args.single_size:
        for name in ("sizes", "lr_sweep"):
            if getattr(args, name) is not None:
                parser.error(f"--{name.replace('_', '-')}: not with --single-size")
        return None
    if args.no_cache and args.resume:
        parser.error("--resume needs the cache: not with --no-cache")
    sweep = QUICK_SWEEP if args.quick else DEFAULT_SWEEP.scaled(args.scale)
    try:
        if args.sizes is not None:
            try:
                widths = [int(w) for w in args.sizes.split(",")]
            except ValueError:
                parser.error(f"--sizes: expected comma-separated ints, got {args.sizes!r}")
            if any(w < 1 for w in widths):
                parser.error(f"--sizes: expected positive widths, got {args.sizes!r}")
            layers = sweep.sizes[-1].n_layers
            sweep = replace(sweep, sizes=tuple(ModelSize(w, layers, max(1, w // HEAD_SIZE)) for w in widths))
        base = sweep.base
        if args.steps is not None:
            base = replace(base, steps=args.steps)
            sweep = replace(sweep, sizes=tuple(replace(s, steps=None) for s in sweep.sizes))
        if args.seeds is not None:
            base = replace(base, seeds=tuple(range(base.sweep_seed + 1, base.sweep_seed + 1 + args.seeds)))
        return replace(sweep, base=base, lr_sweep=args.lr_sweep or sweep.lr_sweep)
    except ValueError as err:
        parser.error(f"--sizes / --steps / --seeds: {err}")
