"""Dion's per-tensor math (Ahn et al., arXiv 2504.05295, Algorithm 1): rank, Q0, the right factor and
one step on a block of the working matrix (power iteration, QR, error feedback, update).

Functions of tensors and keyword hyperparameters; ``ortho_fast.groups.dion`` drives them for a param
group and ``ortho_fast.distributed.dion`` for sharded parameters (the same step on each rank's block,
with ``rows`` / ``cols`` whose sums are all-reduces).

Patch points (documented seams for tests that plant bugs): ``dion_apply`` and ``right_factor_block`` are
looked up in this module at every call by ``dion_update``, the group layer and the sharded step, so
``monkeypatch.setattr(ortho_fast.functional.dion, "dion_apply", ...)`` reaches every Dion step.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..validation import check_choice, check_count, check_hyper, max_abs
from .graph_scalars import add_scaled_, addmm_scaled_, foreach_scale_
from .qr import QR_METHODS, RCQR_OVERSAMPLE, WHOLE, factor_dtype, orthonormalize_block, seed_for

RIGHT_FACTORS = ("column_norm", "qr")


def dion_rank(m: int, n: int, rank_fraction: float = 1.0, rank_multiple_of: int = 1) -> int:
    """r = min(ceil_to_multiple(rank_multiple_of, rank_fraction·min(m, n)), m, n), at least 1.

    Args: (m, n) the matrix shape; ``rank_fraction`` in (0, 1]; ``rank_multiple_of`` an int >= 1.
    Source: microsoft/dion ``Dion(rank_fraction, rank_multiple_of)``.
    Raises: ValueError naming ``m`` / ``n`` (not an int >= 1), ``rank_fraction`` (not a finite
    value in (0, 1]) or ``rank_multiple_of`` (not an int >= 1).
    """
    check_count(m, "m")
    check_count(n, "n")
    fraction = check_hyper(rank_fraction, "rank_fraction", high=1.0, low_open=True)
    k = check_count(rank_multiple_of, "rank_multiple_of")
    return max(1, min(k * math.ceil(fraction * min(m, n) / k), m, n))


def initial_q(shape: tuple[int, int], seed: int, index: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Q0 ~ N(0, 1) of the global shape, drawn on the CPU from a generator seeded by
    (seed, parameter index) — never the global RNG, identical on every device.

    Shapes: ``shape`` (min(m, n), r) -> Q0 of that shape in ``dtype`` on ``device`` (drawn in
    float64, then cast: the same numbers for every dtype up to its rounding).
    Source: Ahn et al., arXiv 2504.05295, Algorithm 1 (Q₀ Gaussian, as microsoft/dion's
    ``torch.randn``); the per-parameter generator is this package's determinism rule
    (docs/design.md, "Conventions": seeded from the optimizer seed and the parameter index, global shape).
    Raises: ValueError naming ``shape`` unless it is two ints >= 1; TypeError naming ``dtype``
    for a dtype that is not floating.
    """
    if len(tuple(shape)) != 2:
        raise ValueError(f"shape: expected (rows, rank), got {shape!r}")
    for size in shape:
        check_count(size, "shape")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype: expected a floating torch.dtype, got {dtype!r}")
    rows, rank = (int(v) for v in shape)
    draw = torch.ops.ortho_fast.initial_q_draw if torch.compiler.is_compiling() else _draw_q
    return draw(rows, rank, seed_for(seed, index), dtype, torch.device(device))


def _draw_q(rows: int, rank: int, seed: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """N(0, 1) of (rows, rank) from a CPU generator seeded with ``seed``, drawn in float64, cast."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn((rows, rank), generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)


# Under torch.compile Q0 is drawn by this opaque operator (dynamo cannot create a torch.Generator in a
# graph): the graph calls it at run time, so a step compiled from the first one creates Q0 itself, the
# same bits as eager (``_draw_q``).
_draw_q_op = torch.library.custom_op("ortho_fast::initial_q_draw", mutates_args=())(_draw_q)


@_draw_q_op.register_fake
def _(rows: int, rank: int, seed: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty((rows, rank), dtype=dtype, device=device)


def dion_right_factor(r: torch.Tensor, right_factor: str = "column_norm", epsilon: float = 1e-8) -> torch.Tensor:
    """New right factor from R = BᵀP (n', r): ``column_norm`` R / (‖R[:, j]‖₂ + ε) (the paper),
    or ``qr`` the Householder Q factor of R with diag > 0 (Orth-Dion, as ``ortho_ref.dion_right_factor``).
    Computed and returned in float32 for bfloat16 / float16 R (microsoft/dion normalizes in float32).
    Source: Ahn et al., arXiv 2504.05295, Algorithm 1 (column normalization); microsoft/dion.
    Raises: ValueError naming ``right_factor`` for a value not in ``RIGHT_FACTORS``.
    """
    check_choice(right_factor, "right_factor", RIGHT_FACTORS)
    return right_factor_block(r, right_factor, epsilon)


def right_factor_block(r: torch.Tensor, right_factor: str, epsilon: float, cols=WHOLE) -> torch.Tensor:
    """``dion_right_factor`` without the argument check, on this rank's rows of R (``cols``: how
    R's rows are held; ``WHOLE`` in one process). Patch point (see the module docstring)."""
    rf = r.to(factor_dtype(r.dtype))
    if right_factor == "qr":
        return cols.householder(rf)
    return rf / (cols.column_norms(rf) + epsilon)


class DionUpdate(NamedTuple):
    """Diagnostics of one ``dion_update``: P (m', r) and R (n', r) in the working orientation."""

    P: torch.Tensor
    R: torch.Tensor


@torch.no_grad()
def dion_update(
    x: torch.Tensor,
    g: torch.Tensor,
    m: torch.Tensor,
    q: torch.Tensor,
    *,
    lr: float,
    mu: float,
    weight_decay: float,
    epsilon: float,
    power_iters: int = 1,
    error_feedback: bool = True,
    qr_method: str = "householder",
    oversample: float = RCQR_OVERSAMPLE,
    right_factor: str = "column_norm",
    generator: torch.Generator | None = None,
) -> DionUpdate:
    """One Dion step in place on weight x (m, n), momentum m (m, n) and right factor q.

    B = M + G (transposed when m < n, by the global shape only); P = orth(BQ) by ``qr_method``;
    R = BᵀP; power_iters > 1 repeats Q ← right factor of R; M ← B − (1−μ)PRᵀ
    (``error_feedback=False``: M ← μPRᵀ); Q ← R / (‖R_j‖ + ε) (``right_factor="qr"``: orth(R));
    X ← (1 − lr·wd)X − lr·√(m/n)·PQᵀ. B = 0: M ← B, Q kept, only weight decay applies.
    Shapes: x, g, m (m, n); q (min(m, n), r). Dtypes: all floating; B, P, R are computed in m's
    dtype (the momentum dtype), Q is stored in q's dtype and used in that precision for the
    update, QR and normalization run in float32 when m is bfloat16 / float16.
    ``generator`` supplies the sketches of ``randomized_cholesky_qr`` (one per power iteration).
    Source: Ahn et al., arXiv 2504.05295, Algorithm 1; microsoft/dion ``dion_simple.py``, ``dion.py``.
    Contract: equals ``ortho_ref.dion_step`` with the same options within
    ``ortho_verify.tolerances.dion_variant_tolerances``.
    Raises: ValueError for an unknown qr_method / right_factor; TypeError for the randomized
    method without a generator — before anything changes.
    """
    if qr_method not in QR_METHODS or right_factor not in RIGHT_FACTORS:
        raise ValueError(f"qr_method, right_factor: expected one of {QR_METHODS} and {RIGHT_FACTORS}, "
                         f"got {qr_method!r}, {right_factor!r}")
    if qr_method == "randomized_cholesky_qr" and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator: randomized_cholesky_qr needs a torch.Generator, got {type(generator).__name__}")
    return dion_apply(x, g, m, q, shape=tuple(x.shape), lr=lr, mu=mu, weight_decay=weight_decay, epsilon=epsilon,
                      power_iters=power_iters, error_feedback=error_feedback, qr_method=qr_method,
                      oversample=oversample, right_factor=right_factor, generator=generator)


def _same(t: torch.Tensor, tag: str) -> torch.Tensor:
    return t


@torch.no_grad()
def dion_prepare(xs: list[torch.Tensor], gs: list[torch.Tensor], ms: list[torch.Tensor], *, lr: float,
                 weight_decay: float) -> list[torch.Tensor]:
    """The elementwise start of ``dion_apply`` for a group of parameters on one process, batched:
    M ← M + G (one ``_foreach_add_``), X ← (1 − lr·wd)·X (``graph_scalars.foreach_scale_``: one
    ``_foreach_mul_``, the bits of ``mul_``), and whether
    each B = M is nonzero, as 0-dim bool tensors on the device (max|B| ≠ 0: one
    ``_foreach_norm(ord=inf)`` per (device, dtype) and one comparison per device, where
    ``B.any()`` per matrix launched once per matrix; a NaN counts as nonzero, as in ``any``).
    Then ``dion_apply(..., prepared=True, nonzero=flag)`` per parameter: the same bits as
    ``dion_apply`` alone (the same elementwise kernels, run earlier). Shapes: xs[i], gs[i], ms[i]
    of one shape each (non-empty); gs cast to ms' dtype. Changes xs and ms."""
    torch._foreach_add_(list(ms), [g.to(m.dtype) for g, m in zip(gs, ms)])
    foreach_scale_(xs, 1 - lr * weight_decay)  # the bits of mul_ on each (bfloat16 / float16 on the CPU too)
    maxima = max_abs(list(ms))
    flags: list = [None] * len(ms)
    by_device: dict = {}
    for i, mx in enumerate(maxima):
        by_device.setdefault(mx.device, []).append(i)
    for indices in by_device.values():
        nonzero = torch.stack([maxima[i] for i in indices]) != 0
        for j, i in enumerate(indices):
            flags[i] = nonzero[j]
    return flags


@torch.no_grad()
def dion_apply(x, g, m, q, *, shape, lr, mu, weight_decay, epsilon, power_iters, error_feedback, qr_method,
               oversample, right_factor, generator, rows=WHOLE, cols=WHOLE, replica_mean=_same,
               nonzero: bool | torch.Tensor | None = None, prepared: bool = False) -> DionUpdate:
    """``dion_update`` on this rank's block of the matrix of global ``shape`` (m, n).

    x, g, m: the block W[I][:, J] (m's block in place holds B); q: Q's rows of this block's
    working columns. ``rows`` / ``cols`` (``WholeDim`` or a sharded dimension): how the working
    orientation's rows and columns are held; ``replica_mean`` the mean over data-parallel
    replicas (compressed sync); ``nonzero`` whether B != 0 anywhere (None: decided here, on the
    device: the step runs and B = 0 masks its effect, no host sync; a 0-dim bool tensor: decided
    on the device by the caller); ``prepared``: M already holds B and X is decayed
    (``dion_prepare``, batched over a group). With the defaults this is one process."""
    rows_, cols_ = shape
    transposed = rows_ < cols_
    if not prepared:
        m.add_(g.to(m.dtype))  # m now holds B
    b = m.mT if transposed else m
    if not prepared:
        x.mul_(1 - lr * weight_decay)
    r_dim = q.shape[1]
    if nonzero is False:
        return DionUpdate(b.new_zeros(b.shape[0], r_dim), b.new_zeros(b.shape[1], r_dim))
    # B = 0 decided on the device (no host sync): the step runs and its effect is masked out
    nz = b.any() if nonzero is None else nonzero if isinstance(nonzero, torch.Tensor) else None
    qw = q.to(m.dtype)
    for _ in range(power_iters):
        p = orthonormalize_block(replica_mean(cols.sum(b @ qw, "P"), "P"), qr_method, oversample, generator, rows)
        r = replica_mean(rows.sum(b.mT @ p, "R"), "R")
        q_new = right_factor_block(r, right_factor, epsilon, cols)
        qw = q_new.to(m.dtype)
    if nz is not None:  # B = 0: P = 0 (so M, X unchanged but for the decay), Q kept
        p = p * nz
        q_new = torch.where(nz, q_new, q.to(q_new.dtype))
    if error_feedback:
        b.addmm_(p, r.mT, alpha=-(1 - mu))  # fused: no (m, n) temporaries
    else:
        torch.mul(p @ r.mT, mu, out=b)
    q.copy_(q_new)
    qp, alpha = q.to(p.dtype), -lr * math.sqrt(rows_ / cols_)
    left, right = (qp, p.mT) if transposed else (p, qp.mT)  # the update PQᵀ in x's orientation
    if x.dtype == p.dtype:
        addmm_scaled_(x, left, right, alpha)
    else:  # mixed precision: the product in the momentum dtype, rounded once into x's dtype
        add_scaled_(x, left @ right, alpha)
    return DionUpdate(p, r)


