"""Analytic communication volumes of the distributed optimizers: what one rank's ``Ledger``
(``ortho_fast.distributed.comm``) records per step, by collective, for each layout — the numbers
``ortho-verify sharding`` compares the measured traffic with (docs/layouts.md)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Sequence

from ..functional.dion import RIGHT_FACTORS
from ..functional.qr import QR_METHOD_ALIASES, QR_METHODS, RCQR_OVERSAMPLE, sketch_rows
from ..validation import check_choice, check_count, check_hyper
from .layout import TP_MODES

__all__ = ["dion2_comm_volume", "dion_check_volume", "dion_comm_volume", "muon_comm_volume"]


def muon_comm_volume(shape: Sequence[int], *, dp: str | None = None, dp_size: int = 1, dp_dim: int = 0,
                     tp_mode: str | None = None, tp_size: int = 1, tp_dim: int = 0, tp_index: int = 0,
                     ns_steps: int = 5, owner: bool = True, variance: int = 0) -> dict[str, int]:
    """Elements one rank's ``Ledger`` records for one parameter in one Muon step, by collective:
    exactly, uneven shards included.

    Args: ``shape`` the parameter's shape, read as the matrix (m, n) = (shape[0],
    prod(shape[1:])); ``dp`` None, "fsdp" (sharded on ``distributed_mesh``, tensor dim
    ``dp_dim``: 0 for FSDP2) or "ddp" (whole on every rank of it), over ``dp_size`` ranks;
    ``tp_mode`` None (no tensor parallelism) or one of ``TP_MODES``, with ``tp_size`` ranks
    sharding tensor dim ``tp_dim`` (0 colwise, 1 rowwise), this rank at TP position
    ``tp_index``; ``owner``: whether this rank is at the owner's dp position (non-owners take
    part in the dp collectives only). An axis of one rank issues nothing.
    Returns {"gather", "scatter", "broadcast", "all_gather", "all_reduce": elements}, zero
    entries left out. Volumes (``comm``'s convention, the Dion paper's Table 1: the logical
    tensor, every shard counted once, uneven shards zero-padded to the largest, as gloo and NCCL
    move them). Shards follow ``torch.chunk`` (DTensor ``Shard``): a dim of s entries over k
    ranks has blocks of ⌈s/k⌉ and the rest; when dp and tp shard one dim (FSDP2 over colwise TP:
    ``_StridedShard``) dp splits each TP block. With B the block at TP position ``tp_index`` (the
    whole parameter without TP) and B_dp its largest dp block: FSDP gather and scatter dp_size·B_dp
    each (m·n for even shapes); DDP broadcast B; TP "duplicated" all-gather tp_size·(largest TP
    block) (m·n for even shapes); "distributed" all-reduce ns_steps·d² + 2 (the Gram matrix each
    step, d = n for tp_dim 0 and m otherwise: the matrix dim that is not sharded; plus max|X|
    and ‖X‖_F²); "blockwise" nothing. The per-step check (1 + number of parameters elements per
    axis, tag "check", ``MuonSharding.check``) is not included. Dtypes: U is gathered and
    all-gathered in the momentum's dtype, O scattered / broadcast in the Newton–Schulz compute
    dtype (bf16 by default: half the bytes); "distributed" reduces the Gram matrix and ‖X‖_F² in
    float32 for a bf16 / fp16 compute dtype (its accumulation dtype), max|X| in the input's.
    NorMuon (``variance``: the elements of the parameter's second moment, m or n per matrix,
    ``ortho_fast.groups.muon_stages.variance_shape``): the owner broadcasts it over the dp axis
    after the step, FSDP and DDP alike (every rank keeps the whole matrix's second moment), in the
    parameter's dtype: + ``variance`` to "broadcast". MuonEq and Muon+ run on the owner's whole
    matrix and move nothing.
    Raises: ValueError for an unknown ``dp`` / ``tp_mode``, a shape of fewer than 2 dims, sizes
    below 1, ``dp_dim`` / ``tp_dim`` / ``tp_index`` out of range, or a negative ``variance``.
    """
    check_choice(dp, "dp", (None, "fsdp", "ddp"))
    check_choice(tp_mode, "tp_mode", (None, *TP_MODES))
    dims = [int(s) for s in shape]
    if len(dims) < 2 or min(dp_size, tp_size) < 1 or not (0 <= dp_dim < len(dims) and 0 <= tp_dim < len(dims)
                                                         and 0 <= tp_index < tp_size):
        raise ValueError(f"shape / dp_size / dp_dim / tp_size / tp_dim / tp_index: expected a shape of >= 2 dims, "
                         f"sizes >= 1 and dims and index within range, got {tuple(dims)}, {dp_size}, {dp_dim}, "
                         f"{tp_size}, {tp_dim}, {tp_index}")
    if isinstance(variance, bool) or not isinstance(variance, int) or variance < 0:
        raise ValueError("variance: expected a non-negative int (elements of NorMuon's second moment), got "
                         f"{variance!r}")
    m, n = dims[0], math.prod(dims[1:])
    tp = tp_mode if tp_size > 1 else None
    chunk = -(-dims[tp_dim] // tp_size)  # the largest TP block's size along tp_dim
    padded_tp = tp_size * chunk * math.prod(s for d, s in enumerate(dims) if d != tp_dim)
    if tp:
        dims[tp_dim] = max(0, min(chunk, dims[tp_dim] - tp_index * chunk))
    out: dict[str, int] = {}
    if dp == "fsdp" and dp_size > 1:
        largest = [-(-s // dp_size) if d == dp_dim else s for d, s in enumerate(dims)]
        out["gather"] = out["scatter"] = dp_size * math.prod(largest)
    elif dp == "ddp" and dp_size > 1:
        out["broadcast"] = math.prod(dims)
    if variance and dp is not None and dp_size > 1:
        out["broadcast"] = out.get("broadcast", 0) + variance
    if owner and tp == "duplicated":
        out["all_gather"] = padded_tp
    if owner and tp == "distributed":
        out["all_reduce"] = ns_steps * (n if tp_dim == 0 else m) ** 2 + 2
    return out


def _gather_volume(length: int, r: int, shards: Sequence[int]) -> int:
    """Elements of gathering a (length, r) matrix over axes of sizes ``shards`` in turn."""
    held, total = length // math.prod(shards), 0
    for size in shards:
        held *= size
        total += held * r
    return total


def dion_comm_volume(m: int, n: int, r: int, *, row_shards: Sequence[int] = (), col_shards: Sequence[int] = (),
                     replicas: int = 1, replicate_mesh_grad_sync: bool = True, qr_method: str = "householder",
                     right_factor: str = "column_norm", power_iters: int = 1,
                     oversample: float = RCQR_OVERSAMPLE) -> dict[str, int]:
    """Elements that one rank's collectives carry in one Dion step of one (m, n) matrix of rank r,
    by ledger tag (the convention of ``comm``: an all-reduce counts its tensor, an all-gather the
    assembled tensor).

    ``row_shards`` / ``col_shards``: the sizes of the mesh dims sharding the parameter's dim 0 /
    dim 1 (mesh-dim order); ``replicas`` the replicate mesh size. Dion works on (m', n') =
    (max, min) with rows sharded over p_r = ∏ row_shards, columns over p_c; with a axes sharding
    the rows and b the columns (sizes > 1) and s = 1 under compressed sync (replicas > 1), else 0,
    per power iteration:

    - "P": (m'/p_r)·r·(b + s) — B Q partials over the column axes, then the replicas' mean;
    - "R": (n'/p_c)·r·(a + s);
    - rows sharded (a > 0): ``householder`` "gather_P" Σ_k m'·r/∏_{j>k} p_j (m'·r for one
      axis); ``cholesky_qr`` "gram" 2·r²·a; ``randomized_cholesky_qr`` (k = ceil(oversample·r)
      < m') "sketch" k·r·a, "gram" r²·a, "finite" a (else as householder);
    - columns sharded (b > 0): ``column_norm`` "norms" r·b; ``qr`` "gather_R" like gather_P with n'.

    So DDP with compressed sync carries (m' + n')·r (Dion paper, Table 1, data parallel); FSDP /
    TP sharding the working columns m'·r + r (Table 1's (m + 1)·r weight sharding); sharding the
    rows m'·r + n'·r with Householder, 2r² + n'·r with CholeskyQR2. Add ``dion_check_volume``
    once per step. Exact for dims divisible by their shard counts (uneven blocks travel padded
    in gathers and the largest block sets the all-reduce sizes).
    Source: Ahn et al., arXiv 2504.05295, Table 1, refined per layout.
    Raises: ValueError for m, n, r not positive or r > min(m, n), and naming ``qr_method`` /
    ``right_factor`` (not one of ``Dion``'s, aliases "qr" / "rcqr" accepted), ``power_iters``
    (not an int >= 1) or ``oversample`` (not a finite value >= 1).
    """
    if min(m, n, r) < 1 or r > min(m, n):
        raise ValueError(f"m, n, r: expected positive sizes with r <= min(m, n), got {(m, n, r)}")
    qr_method = QR_METHOD_ALIASES.get(qr_method, qr_method)
    check_choice(qr_method, "qr_method", QR_METHODS)
    check_choice(right_factor, "right_factor", RIGHT_FACTORS)
    check_count(power_iters, "power_iters")
    check_hyper(oversample, "oversample", low=1.0)
    rows, cols = [s for s in row_shards if s > 1], [s for s in col_shards if s > 1]
    if m < n:
        m, n, rows, cols = n, m, cols, rows
    a, b = len(rows), len(cols)
    s = int(replicate_mesh_grad_sync and replicas > 1)
    out: dict[str, int] = defaultdict(int)
    out["P"] = m // math.prod(rows) * r * (b + s)
    out["R"] = n // math.prod(cols) * r * (a + s)
    k = sketch_rows(r, oversample)
    if a and qr_method == "cholesky_qr":
        out["gram"] = 2 * r * r * a
    elif a and qr_method == "randomized_cholesky_qr" and k < m:
        out.update(sketch=k * r * a, gram=r * r * a, finite=a)
    elif a:
        out["gather_P"] = _gather_volume(m, r, rows)
    if b:
        out["norms" if right_factor == "column_norm" else "gather_R"] = (
            r * b if right_factor == "column_norm" else _gather_volume(n, r, cols))
    return {tag: v * power_iters for tag, v in out.items() if v}


def dion_check_volume(num_params: int, comm_axes: int) -> dict[str, int]:
    """Elements of the per-step checks of a distributed Dion (``ShardedDionGroups.check``): 9 numbers
    (an error flag and the parameters' / options' digest, ``comm.raise_together``), then 2·``num_params``
    (has a gradient, B != 0), all-reduced over each of the ``comm_axes`` axes (``DionMeshes.check_axes``;
    tag "flags"); nothing without such axes."""
    return {"flags": (9 + 2 * num_params) * comm_axes} if comm_axes else {}


def _nested_chunks(size: int, splits: Sequence[int]) -> list[int]:
    """Sizes of ``size`` indices cut by ``torch.chunk`` into splits[-1] pieces, each of those into
    splits[-2] pieces, ... (FSDP2 on top of TP: the TP blocks are cut further, ``_StridedShard``)."""
    sizes = [size]
    for k in reversed(list(splits)):
        sizes = [len(c) for s in sizes for c in _chunk(s, k)]
    return sizes


def _chunk(size: int, k: int) -> list[range]:
    step = -(-size // k) if size else 0
    return [range(min(i * step, size), min((i + 1) * step, size)) for i in range(k)] if step else [range(0)] * k


def dion2_comm_volume(m: int, n: int, *, fraction: float, row_shards: Sequence[int] = (),
                      col_shards: Sequence[int] = (), selection_scope: str = "global") -> dict[str, int]:
    """Elements one rank's ``Ledger`` records for one (m, n) matrix in one Dion2 step
    (``ortho_fast.distributed.dion2``), the per-step agreement (tag "check") not included.

    With N slices (rows when m <= n, else columns), the other dimension of size o and A the
    number of axes of more than one rank sharding the matrix (``row_shards`` / ``col_shards``:
    their sizes, in mesh-dim order): all-reduce A·(N + k·o) — the slice norms and the zero-padded
    selected submatrix, over each axis. k = max(1, ⌈fraction·N⌉) for "global" (and whenever the
    selected dimension is not sharded); for "local", Σ over the shards of the selected dimension
    of min(|shard|, max(1, ⌈fraction·(largest shard)⌉)), the shards cut by ``torch.chunk``
    (two axes on one dimension nested as FSDP2 on top of TP: the later axis cuts first).
    Returns {"all_reduce": elements}, or {} when nothing is sharded.
    Raises: ValueError for fraction outside (0, 1], sizes below 1 or an unknown scope.
    """
    check_hyper(fraction, "fraction", high=1.0, low_open=True)
    check_choice(selection_scope, "selection_scope", ("global", "local"))
    if min(m, n) < 1 or any(s < 1 for s in (*row_shards, *col_shards)):
        raise ValueError(f"m, n, row_shards, col_shards: expected sizes >= 1, got {m}, {n}, {row_shards}, {col_shards}")
    rows = m <= n
    size, other = (m, n) if rows else (n, m)
    axes = sum(1 for s in (*row_shards, *col_shards) if s > 1)
    select_shards = [s for s in (row_shards if rows else col_shards) if s > 1]
    if selection_scope == "local" and select_shards:
        pieces = _nested_chunks(size, select_shards)
        k_local = max(1, int(math.ceil(fraction * max(pieces))))
        k = sum(min(k_local, p) for p in pieces)
    else:
        k = min(size, max(1, int(math.ceil(fraction * size))))
    return {"all_reduce": axes * (size + k * other)} if axes else {}
