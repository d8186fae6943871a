"""Dion for one process (Ahn et al., arXiv 2504.05295, Algorithm 1), with the variants of microsoft/dion.

Pure functions first (``orthonormalize``, ``dion_update``), then the param-group functions
(``DION_DEFAULTS``, ``normalize_dion_group``, ``check_dion_step``, ``dion_group_step``) that
any optimizer owning Dion groups can drive, and the thin ``Dion`` optimizer on top.
The step is written against ``WholeDim`` (how a dimension of the working matrix is held): in
one process it communicates nothing; ``ortho_fast.distributed.dion`` runs the same step on each
rank's block with sharded dimensions whose sums are all-reduces (``Dion(..., outer_shard_mesh=...)``).
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, NamedTuple

import torch
from torch.optim import Optimizer

from ._state import add_param_group_checked, load_state_dict_checked, state_dict_with_dtype_names
from ._validate import check_choice, check_count, check_filled, check_finite, check_hyper

QR_METHODS = ("householder", "cholesky_qr", "randomized_cholesky_qr")
#: microsoft/dion's names for the same methods (its "cqr" is one CholeskyQR pass, not CholeskyQR2).
QR_METHOD_ALIASES = {"qr": "householder", "rcqr": "randomized_cholesky_qr"}
RIGHT_FACTORS = ("column_norm", "qr")
#: Sketch rows per column for the randomized CholeskyQR (microsoft/dion ``rcqr_oversample``).
RCQR_OVERSAMPLE = 1.25
#: CholeskyQR2 falls back to Householder when its first pass leaves ‖Y₁ᵀY₁ − I‖_F above this
#: (κ(Y) beyond about u^(-1/2)); same rule as ``ortho_ref.dion.CQR2_GRAM_DEVIATION``.
CQR2_GRAM_DEVIATION = 0.5

#: Every key of a Dion param group with its default (microsoft/dion ``Dion`` defaults, except
#: ``qr_method``: the reference Householder QR here, microsoft/dion's default is "rcqr").
#: ``momentum_dtype`` / ``q_dtype`` None mean the parameter's dtype (microsoft/dion
#: ``DionMixedPrecisionConfig``); ``oversample`` is microsoft/dion's ``rcqr_oversample``.
DION_DEFAULTS: dict[str, object] = dict(
    lr=0.01, mu=0.95, weight_decay=0.01, rank_fraction=1.0, rank_multiple_of=1, epsilon=1e-8, power_iters=1,
    error_feedback=True, qr_method="householder", oversample=RCQR_OVERSAMPLE, right_factor="column_norm",
    momentum_dtype=None, q_dtype=None, flatten=False,
)

_LOW_PRECISION = (torch.bfloat16, torch.float16)


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


def sketch_rows(rank: int, oversample: float = RCQR_OVERSAMPLE) -> int:
    """Rows k = ceil(oversample·r) of the randomized CholeskyQR sketch (microsoft/dion rounds k
    up to a multiple of 128; we do not). Same as ``ortho_ref.sketch_rows``."""
    return math.ceil(oversample * rank)


def _factor_dtype(dtype: torch.dtype) -> torch.dtype:
    """QR / Cholesky run in float32 for bfloat16 / float16 data (as microsoft/dion)."""
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def _splitmix(z: int) -> int:
    z = z & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFF


def _seed_for(seed: int, index: int) -> int:
    """Deterministic 63-bit seed for parameter ``index`` (splitmix64-style mixing)."""
    return _splitmix(seed * 0x9E3779B97F4A7C15 + index + 1)


def initial_q(shape: tuple[int, int], seed: int, index: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Q0 ~ N(0, 1) of the global shape, drawn on the CPU from a generator seeded by
    (seed, parameter index) — never the global RNG, identical on every device.

    Shapes: ``shape`` (min(m, n), r) -> Q0 of that shape in ``dtype`` on ``device`` (drawn in
    float64, then cast: the same numbers for every dtype up to its rounding).
    Source: Ahn et al., arXiv 2504.05295, Algorithm 1 (Q₀ Gaussian, as microsoft/dion's
    ``torch.randn``); the per-parameter generator is this package's determinism rule
    (DESIGN.md: seeded from the optimizer seed and the parameter index, global shape).
    Raises: ValueError naming ``shape`` unless it is two ints >= 1; TypeError naming ``dtype``
    for a dtype that is not floating.
    """
    if len(tuple(shape)) != 2:
        raise ValueError(f"shape: expected (rows, rank), got {shape!r}")
    for size in shape:
        check_count(size, "shape")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype: expected a floating torch.dtype, got {dtype!r}")
    gen = torch.Generator(device="cpu").manual_seed(_seed_for(seed, index))
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)


def sketch_generator(seed: int, index: int, step: int, device) -> torch.Generator:
    """Generator of the randomized-CholeskyQR sketches of parameter ``index`` at ``step`` (>= 1):
    seeded from (seed, index, step) only — never the global RNG — on ``device``. Each power
    iteration draws the next sketch from it. Same seed, index, step and device type: same bits.

    Source: this package's determinism rule (DESIGN.md); microsoft/dion draws its sketches
    from the global RNG, so its runs do not repeat bit for bit.
    Raises: ValueError naming ``step`` unless it is an int >= 1.
    """
    check_count(step, "step")
    return torch.Generator(device=device).manual_seed(_seed_for(_seed_for(seed, index), step))


def gaussian_sketch(generator: torch.Generator, k: int, rows: int, dtype: torch.dtype, device) -> torch.Tensor:
    """S (k, rows) with i.i.d. N(0, 1/k) entries from ``generator`` (microsoft/dion's scaling).

    Shapes: -> (k, rows) in ``dtype`` on ``device`` (the generator's device type).
    Source: microsoft/dion ``orthogonalize`` (rcqr: randn / √k); randomized Cholesky QR,
    Balabanov, arXiv 2210.09953.
    Raises: ValueError naming ``k`` / ``rows`` unless an int >= 1; TypeError naming
    ``generator`` for something that is not a torch.Generator.
    """
    check_count(k, "k")
    check_count(rows, "rows")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator: expected a torch.Generator, got {type(generator).__name__}")
    return torch.randn((k, rows), generator=generator, dtype=dtype, device=device) / math.sqrt(k)


def _householder(y: torch.Tensor) -> torch.Tensor:
    q, r = torch.linalg.qr(y, mode="reduced")
    return q * torch.where(torch.diagonal(r) < 0, -1.0, 1.0).to(q.dtype)


class WholeDim:
    """A matrix dimension this process holds whole: the one-process case of the interface the
    QR methods and the right factor are written against (``ortho_fast.distributed.dion`` has the
    sharded one). ``total`` is the dimension's global length, ``sum`` the sum over the ranks
    sharding it (here: nothing to add), ``all_finite`` whether every rank's block is finite
    (``needed=False``: a caller that does not depend on it; one process checks anyway),
    ``sketch`` this rank's columns of a sketch drawn at the global size, ``householder`` this
    rank's rows of the Householder Q factor of the whole matrix, ``column_norms`` the column
    2-norms of the whole matrix. No communication here."""

    @staticmethod
    def total(y: torch.Tensor) -> int:
        return y.shape[0]

    @staticmethod
    def sum(t: torch.Tensor, tag: str) -> torch.Tensor:
        return t

    @staticmethod
    def all_finite(p: torch.Tensor, needed: bool = True) -> torch.Tensor:
        return torch.isfinite(p).all()

    @staticmethod
    def sketch(s: torch.Tensor) -> torch.Tensor:
        return s

    @staticmethod
    def householder(y: torch.Tensor) -> torch.Tensor:
        return _householder(y)

    @staticmethod
    def column_norms(rf: torch.Tensor) -> torch.Tensor:
        return torch.linalg.vector_norm(rf, dim=0, keepdim=True)


WHOLE = WholeDim()


def _cholesky_solve(y: torch.Tensor, gram: torch.Tensor, rows, ok: torch.Tensor | None = None,
                    needed: bool = True) -> torch.Tensor | None:
    """Y R⁻¹ with R = chol(gram) upper (one CholeskyQR pass; ``gram`` already summed over the
    ranks holding Y's rows); None if the factorization failed, the result is not finite, or the
    extra condition ``ok`` (a bool tensor) is False. One host sync."""
    r, info = torch.linalg.cholesky_ex(gram, upper=True)
    p = torch.linalg.solve_triangular(r, y, upper=True, left=False)
    good = (info == 0) & rows.all_finite(p, needed)
    return p if bool(good if ok is None else good & ok) else None


def _cholesky_qr2(y: torch.Tensor, rows=WHOLE) -> torch.Tensor | None:
    # Distributed, neither pass needs its own finiteness vote: a non-finite P₁ makes the second
    # Gram non-finite on every rank, which fails the deviation test; a second pass that passes
    # it has ‖R₂⁻¹‖₂ <= √2 and |P₁| <= √(3/2), so P₂ is finite.
    p1 = _cholesky_solve(y, rows.sum(y.mT @ y, "gram"), rows, needed=False)
    if p1 is None:
        return None
    gram = rows.sum(p1.mT @ p1, "gram")
    eye = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    return _cholesky_solve(p1, gram, rows, torch.linalg.matrix_norm(gram - eye) <= CQR2_GRAM_DEVIATION, needed=False)


def _randomized_cholesky_qr(y: torch.Tensor, generator: torch.Generator, oversample: float,
                            rows=WHOLE) -> torch.Tensor | None:
    total, r = rows.total(y), y.shape[1]
    k = sketch_rows(r, oversample)
    if k >= total:  # the sketch would not compress: factor Y itself (no draw)
        return None
    sketch = rows.sketch(gaussian_sketch(generator, k, total, y.dtype, y.device))
    r_s = torch.linalg.qr(rows.sum(sketch @ y, "sketch"), mode="r").R
    r_s = r_s * torch.where(torch.diagonal(r_s) < 0, -1.0, 1.0).to(r_s.dtype)[:, None]
    y1 = torch.linalg.solve_triangular(r_s, y, upper=True, left=False)
    return _cholesky_solve(y1, rows.sum(y1.mT @ y1, "gram"), rows)


def _orthonormalize(y: torch.Tensor, method: str, oversample: float, generator, rows=WHOLE) -> torch.Tensor:
    """``orthonormalize`` without the argument checks, on this rank's rows of Y (``rows``)."""
    yf = y.to(_factor_dtype(y.dtype))
    p = None
    if method == "cholesky_qr":
        p = _cholesky_qr2(yf, rows)
    elif method == "randomized_cholesky_qr":
        p = _randomized_cholesky_qr(yf, generator, oversample, rows)
    return (rows.householder(yf) if p is None else p).to(y.dtype)


def orthonormalize(y: torch.Tensor, method: str = "householder", *, oversample: float = RCQR_OVERSAMPLE,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """Q factor P of the thin QR Y = P R with diag(R) > 0, by one of ``QR_METHODS``.

    ``householder`` (torch.linalg.qr, signs fixed, sign(0) := +1); ``cholesky_qr``
    (CholeskyQR2); ``randomized_cholesky_qr`` (Gaussian sketch of k = ceil(oversample·r) rows
    drawn from ``generator``, R_s from the QR of S Y, then one CholeskyQR pass on Y R_s⁻¹ —
    microsoft/dion ``orthogonalize``). The Cholesky methods fall back to Householder where
    they lose orthogonality (a failed Cholesky, a non-finite result, or for CholeskyQR2 a
    first pass with ‖Y₁ᵀY₁ − I‖_F > ``CQR2_GRAM_DEVIATION``); the randomized method factors Y
    directly when k >= rows. Each costs one or two host syncs. See ``ortho_ref.orthonormalize``.
    Shapes: y (rows, r), rows >= r -> P (rows, r) in y's dtype with PᵀP = I; bfloat16 / float16
    are factored in float32 (as microsoft/dion).
    Raises: ValueError for an unknown method or a y that is not (rows, r) with rows >= r;
    TypeError for the randomized method without a torch.Generator.
    """
    if method not in QR_METHODS:
        raise ValueError(f"method: expected one of {QR_METHODS}, got {method!r}")
    if y.ndim != 2 or y.shape[0] < y.shape[1]:
        raise ValueError(f"y: expected shape (rows, r) with rows >= r, got {tuple(y.shape)}")
    if method == "randomized_cholesky_qr" and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator: randomized_cholesky_qr needs a torch.Generator, got {type(generator).__name__}")
    return _orthonormalize(y, method, oversample, generator)


def dion_right_factor(r: torch.Tensor, right_factor: str = "column_norm", epsilon: float = 1e-8) -> torch.Tensor:
    """New right factor from R = BᵀP (n', r): ``column_norm`` R / (‖R[:, j]‖₂ + ε) (the paper),
    or ``qr`` the Householder Q factor of R with diag > 0 (Orth-Dion, as ``ortho_ref.dion_right_factor``).
    Computed and returned in float32 for bfloat16 / float16 R (microsoft/dion normalizes in float32).
    Source: Ahn et al., arXiv 2504.05295, Algorithm 1 (column normalization); microsoft/dion.
    Raises: ValueError naming ``right_factor`` for a value not in ``RIGHT_FACTORS``.
    """
    check_choice(right_factor, "right_factor", RIGHT_FACTORS)
    return _right_factor(r, right_factor, epsilon)


def _right_factor(r: torch.Tensor, right_factor: str, epsilon: float, cols=WHOLE) -> torch.Tensor:
    """``dion_right_factor`` on this rank's rows of R (``cols``: how R's rows are held)."""
    rf = r.to(_factor_dtype(r.dtype))
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
    return _dion_apply(x, g, m, q, shape=tuple(x.shape), lr=lr, mu=mu, weight_decay=weight_decay, epsilon=epsilon,
                       power_iters=power_iters, error_feedback=error_feedback, qr_method=qr_method,
                       oversample=oversample, right_factor=right_factor, generator=generator)


def _same(t: torch.Tensor, tag: str) -> torch.Tensor:
    return t


@torch.no_grad()
def _dion_apply(x, g, m, q, *, shape, lr, mu, weight_decay, epsilon, power_iters, error_feedback, qr_method,
                oversample, right_factor, generator, rows=WHOLE, cols=WHOLE, replica_mean=_same,
                nonzero: bool | None = None) -> DionUpdate:
    """``dion_update`` on this rank's block of the matrix of global ``shape`` (m, n).

    x, g, m: the block W[I][:, J] (m's block in place holds B); q: Q's rows of this block's
    working columns. ``rows`` / ``cols`` (``WholeDim`` or a sharded dimension): how the working
    orientation's rows and columns are held; ``replica_mean`` the mean over data-parallel
    replicas (compressed sync); ``nonzero`` whether B != 0 anywhere (None: decided here).
    With the defaults this is one process."""
    rows_, cols_ = shape
    transposed = rows_ < cols_
    m.add_(g.to(m.dtype))  # m now holds B
    b = m.mT if transposed else m
    x.mul_(1 - lr * weight_decay)
    r_dim = q.shape[1]
    if not (bool(b.any()) if nonzero is None else nonzero):
        return DionUpdate(b.new_zeros(b.shape[0], r_dim), b.new_zeros(b.shape[1], r_dim))
    qw = q.to(m.dtype)
    for _ in range(power_iters):
        p = _orthonormalize(replica_mean(cols.sum(b @ qw, "P"), "P"), qr_method, oversample, generator, rows)
        r = replica_mean(rows.sum(b.mT @ p, "R"), "R")
        q_new = _right_factor(r, right_factor, epsilon, cols)
        qw = q_new.to(m.dtype)
    if error_feedback:
        b.addmm_(p, r.mT, alpha=-(1 - mu))  # fused: no (m, n) temporaries
    else:
        torch.mul(p @ r.mT, mu, out=b)
    q.copy_(q_new)
    qp, alpha = q.to(p.dtype), -lr * math.sqrt(rows_ / cols_)
    left, right = (qp, p.mT) if transposed else (p, qp.mT)  # the update PQᵀ in x's orientation
    if x.dtype == p.dtype:
        x.addmm_(left, right, alpha=alpha)
    else:  # mixed precision: the product in the momentum dtype, rounded once into x's dtype
        x.add_(left @ right, alpha=alpha)
    return DionUpdate(p, r)


# ---------------------------------------------------------------------------------------
# Param-group functions: the contract a hybrid optimizer drives Dion groups through.
# ---------------------------------------------------------------------------------------


def _matrix_shape(p: torch.Tensor) -> tuple[int, int]:
    """(m, n) Dion works on: the shape, or (shape[0], prod(shape[1:])) for a flattened ndim > 2."""
    return (p.shape[0], p.numel() // p.shape[0]) if p.ndim > 2 else tuple(p.shape)


def _rank(p: torch.Tensor, group: dict) -> int:
    m, n = _matrix_shape(p)
    return dion_rank(m, n, group["rank_fraction"], group["rank_multiple_of"])


def _check_hyperparameters(group: dict) -> None:
    """Every hyperparameter of a filled Dion group; raises naming the key, changes nothing."""
    check_filled(group, DION_DEFAULTS, "Dion")
    check_hyper(group["lr"], "lr")
    check_hyper(group["mu"], "mu", high=1.0)
    check_hyper(group["weight_decay"], "weight_decay")
    check_hyper(group["rank_fraction"], "rank_fraction", high=1.0, low_open=True)
    check_hyper(group["epsilon"], "epsilon")
    check_hyper(group["oversample"], "oversample", low=1.0)
    for key in ("rank_multiple_of", "power_iters"):
        check_count(group[key], key)
    for key in ("error_feedback", "flatten"):
        if not isinstance(group[key], bool):
            raise TypeError(f"{key}: expected a bool, got {group[key]!r}")
    for key, choices in (("qr_method", QR_METHODS), ("right_factor", RIGHT_FACTORS)):
        check_choice(group[key], key, choices)
    for key in ("momentum_dtype", "q_dtype"):
        dt = group[key]
        if dt is not None and not (isinstance(dt, torch.dtype) and dt.is_floating_point):
            raise TypeError(f"{key}: expected None or a floating torch.dtype, got {dt!r}")


def normalize_dion_group(group: dict) -> None:
    """Validate one Dion param group already filled with ``DION_DEFAULTS`` (hyperparameters and
    its params' ndim and dtype), resolving microsoft/dion's ``qr_method`` aliases ("qr",
    "rcqr") in place. Called at construction and by ``add_param_group``.
    Raises: ValueError / TypeError naming the key ("lr: ...", "params: ...")."""
    group["qr_method"] = QR_METHOD_ALIASES.get(group["qr_method"], group["qr_method"])
    _check_hyperparameters(group)
    for p in group["params"]:
        if not isinstance(p, torch.Tensor) or not p.is_floating_point():
            raise TypeError(f"params: Dion expects floating-point tensors, got {getattr(p, 'dtype', type(p).__name__)}")
        if p.ndim < 2 or (p.ndim > 2 and not group["flatten"]) or p.numel() == 0:
            hint = ("pass flatten=True to treat it as (shape[0], prod(shape[1:])) (conv weights, as "
                    "microsoft/dion's Muon); a stack of expert matrices (E, m, n) needs Muon with expert_keys"
                    if p.ndim > 2 else "give vectors, scalars and embeddings to AdamW/Lion")
            raise ValueError(f"params: Dion expects non-empty 2-D (m, n) parameters; got shape {tuple(p.shape)}: {hint}")


def check_dion_step(group: dict, state: Mapping[torch.Tensor, dict], *, finite: bool = True) -> None:
    """Check one group before any change: its hyperparameters (a scheduler may have set them),
    and for each param with a grad, the grad (dense, real, the param's shape, finite) and any
    existing state (``momentum`` of the param's shape, ``Q`` of shape (min(m, n), r)).
    ``finite=False`` leaves the finiteness test to the caller (the sharded step tests each
    rank's block and decides on every rank together). Changes nothing.
    Raises: ValueError / TypeError naming the key ("grad ...", "Q: ...")."""
    _check_hyperparameters(group)
    for p in group["params"]:
        g = p.grad
        if g is None:
            continue
        if g.is_sparse or not g.is_floating_point() or g.shape != p.shape:
            raise ValueError(f"grad: expected a dense real tensor of shape {tuple(p.shape)}, got {tuple(g.shape)} {g.dtype}")
        if finite:
            check_finite(g, f"grad of parameter with shape {tuple(p.shape)}")
        st = state.get(p, {})
        m, n = _matrix_shape(p)
        want_q = (min(m, n), _rank(p, group))
        for key, want in (("momentum", tuple(p.shape)), ("Q", want_q)):
            if key in st and (tuple(st[key].shape) != want or not st[key].is_floating_point()):
                raise ValueError(f"{key}: expected a floating tensor of shape {want} for parameter of shape "
                                 f"{tuple(p.shape)}, got {tuple(st[key].shape)} {st[key].dtype}")
        if "step" in st and not (torch.is_tensor(st["step"]) and st["step"].numel() == 1):
            raise ValueError(f"step: expected a one-element tensor, got {st['step']!r}")


def _matrix_view(t: torch.Tensor, shape: tuple[int, int]) -> tuple[torch.Tensor, bool]:
    """(view of t as shape, False), or (a reshaped copy, True) when no view exists."""
    try:
        return t.view(shape), False
    except RuntimeError:
        return t.reshape(shape), True


def dion_state_dtype(group: dict, key: str, p: torch.Tensor) -> torch.dtype | None:
    """The dtype of Dion state ``key`` of parameter ``p``: ``momentum_dtype`` / ``q_dtype``
    (None: the parameter's dtype) for "momentum" / "Q", None for other keys."""
    if key not in ("momentum", "Q"):
        return None
    dt = group["momentum_dtype" if key == "momentum" else "q_dtype"]
    return p.dtype if dt is None else dt


def init_dion_state(p: torch.Tensor, st: dict, group: dict, *, seed: int, index: int) -> None:
    """Create the missing state of one-process parameter ``p`` (global index ``index``):
    ``momentum`` zeros, ``Q`` = ``initial_q`` of (min(m, n), r), ``step`` 0. No parameter changes."""
    m, n = _matrix_shape(p)
    if "momentum" not in st:
        st["momentum"] = torch.zeros(p.shape, dtype=dion_state_dtype(group, "momentum", p), device=p.device)
    if "Q" not in st:
        st["Q"] = initial_q((min(m, n), _rank(p, group)), seed, index, dion_state_dtype(group, "Q", p), p.device)
    if "step" not in st:
        st["step"] = torch.zeros((), dtype=torch.int64)


@torch.no_grad()
def _step_block(x_t: torch.Tensor, g_t: torch.Tensor, m_t: torch.Tensor, q: torch.Tensor, st: dict, group: dict, *,
                seed: int, index: int, shape: tuple[int, int], local_shape: tuple[int, int], **sharding) -> None:
    """One step of parameter ``index`` on its block: x_t, g_t, m_t (any shape of ``local_shape``'s
    size) viewed as the (|I|, |J|) block of the (m, n) = ``shape`` matrix; ``sharding`` passed to
    ``_dion_apply`` (nothing: one process)."""
    st["step"] += 1
    gen = None
    if group["qr_method"] == "randomized_cholesky_qr":
        gen = sketch_generator(seed, index, int(st["step"]), m_t.device)
    x, x_copied = _matrix_view(x_t, local_shape)
    mom, m_copied = _matrix_view(m_t, local_shape)
    _dion_apply(
        x, g_t.reshape(local_shape), mom, q, shape=shape, lr=group["lr"], mu=group["mu"],
        weight_decay=group["weight_decay"], epsilon=group["epsilon"], power_iters=group["power_iters"],
        error_feedback=group["error_feedback"], qr_method=group["qr_method"], oversample=group["oversample"],
        right_factor=group["right_factor"], generator=gen, **sharding,
    )
    for target, copy, copied in ((x_t, x, x_copied), (m_t, mom, m_copied)):
        if copied:
            target.copy_(copy.view(target.shape))


def dion_group_step(group: dict, state, *, seed: int, first_index: int) -> None:
    """Apply one Dion step to every param of ``group`` with a grad (``check_dion_step`` passed).

    Param i of the group has global index ``first_index + i``: its Q0 is
    ``initial_q(..., seed, first_index + i)`` and its sketches come from
    ``sketch_generator(seed, first_index + i, step)``. State per param (created on first use):
    ``momentum`` (param's shape, ``momentum_dtype``), ``Q`` ((min(m, n), r), ``q_dtype``) and
    ``step`` (int64 CPU scalar tensor: steps taken, which keys the sketch so a resumed run draws
    the same sketches). ``state`` is the optimizer's defaultdict(dict).
    """
    for i, p in enumerate(group["params"]):
        if p.grad is None:
            continue
        st = state[p]
        init_dion_state(p, st, group, seed=seed, index=first_index + i)
        shape = _matrix_shape(p)
        _step_block(p, p.grad, st["momentum"], st["Q"], st, group, seed=seed, index=first_index + i, shape=shape,
                    local_shape=shape)


def resolve_meshes(replicate_mesh=None, outer_shard_mesh=None, inner_shard_mesh=None,
                   replicate_mesh_grad_sync: bool = True, process_group=None):
    """The ``ortho_fast.distributed.dion.DionMeshes`` of Dion's mesh arguments, or None when
    none is given (one process; torch.distributed is then not imported).
    Raises: as ``resolve_dion_meshes``; TypeError naming ``replicate_mesh_grad_sync`` unless a bool."""
    if any(a is not None for a in (replicate_mesh, outer_shard_mesh, inner_shard_mesh, process_group)):
        from .distributed.dion import resolve_dion_meshes

        return resolve_dion_meshes(replicate_mesh, outer_shard_mesh, inner_shard_mesh, replicate_mesh_grad_sync,
                                   process_group)
    if not isinstance(replicate_mesh_grad_sync, bool):
        raise TypeError(f"replicate_mesh_grad_sync: expected a bool, got {replicate_mesh_grad_sync!r}")
    return None


def plan_dion_group(group: dict, meshes, plans: dict) -> None:
    """Add the distributed plan (``ortho_fast.distributed.dion.dion_plan``) of every parameter of
    a normalized Dion group to ``plans``; nothing is added if one fails. Without meshes, a
    DTensor parameter is an error.
    Raises: LayoutError (a ValueError) as ``dion_plan``, or for DTensors without mesh arguments."""
    if meshes is None:
        from .distributed.layout import LayoutError, is_dtensor

        if any(is_dtensor(p) for p in group["params"]):
            raise LayoutError("params: DTensor parameters need the mesh arguments (replicate_mesh, "
                              "outer_shard_mesh, inner_shard_mesh) that their placements shard over")
        return
    from .distributed.dion import dion_plan

    plans.update({p: dion_plan(p, meshes) for p in group["params"]})


def init_dion_groups(groups, state, meshes, plans: dict, *, seed: int) -> None:
    """``init_dion_state`` (or its sharded form) for every parameter of ``groups``, numbered in
    group order as the step numbers them: the state a first step would create, no communication."""
    index = 0
    for group in groups:
        for p in group["params"]:
            if meshes is None:
                init_dion_state(p, state[p], group, seed=seed, index=index)
            else:
                from .distributed.dion import init_sharded_state

                init_sharded_state(p, state[p], group, plans[p], seed=seed, index=index)
            index += 1


class Dion(Optimizer):
    """Dion (DIstributed OrthoNormalization) for matrix parameters, in one process or over a
    DeviceMesh / DTensor / ProcessGroup.

    Args follow microsoft/dion: lr 0.01, mu 0.95, weight_decay 0.01, rank_fraction 1.0,
    rank_multiple_of 1, epsilon 1e-8, power_iters 1, ``oversample`` 1.25 (its
    ``rcqr_oversample``), ``momentum_dtype`` / ``q_dtype`` (its ``DionMixedPrecisionConfig``;
    None = the parameter's dtype). Also: ``qr_method`` ("householder" default, "cholesky_qr",
    "randomized_cholesky_qr"; aliases "qr", "rcqr"), ``right_factor`` ("column_norm" of the
    paper, or "qr" for Orth-Dion), ``error_feedback`` (default True), ``flatten`` (ndim > 2
    parameters as (shape[0], prod(rest)), as microsoft/dion's Muon), ``seed`` (Q0 and the
    sketches are deterministic per parameter index, in the order of ``params``).
    Every group key and default is in ``DION_DEFAULTS``; the group logic lives in
    ``normalize_dion_group`` / ``check_dion_step`` / ``dion_group_step`` so a hybrid optimizer
    can drive Dion groups.

    Distributed (microsoft/dion's arguments; each mesh a 1-D DeviceMesh such as
    ``world_mesh["dp_shard"]``, or a ProcessGroup): ``replicate_mesh`` (DDP, the replicate dim of
    HSDP), ``outer_shard_mesh`` (FSDP: FSDP2 ``fully_shard``'s Shard(0)), ``inner_shard_mesh``
    (TP: ``parallelize_module``'s colwise Shard(0) / rowwise Shard(1)); FSDP on top of colwise
    TP (``_StridedShard``), HSDP + TP and uneven or empty shards work the same way. Parameters
    are DTensors whose sharded mesh dims are among these meshes (plain tensors are whole on every
    rank). ``process_group``: DDP over plain tensors (the replicate axis; excludes the meshes).
    ``replicate_mesh_grad_sync`` (default True): the gradients differ between replicas and Dion
    synchronizes them compressed (P and R averaged over the replicate axis, (m + n)·r per matrix
    instead of m·n; each replica keeps its own momentum, whose mean is the momentum of one
    process fed the mean gradient; weights and Q stay identical). False: the gradients are
    already averaged (DDP, FSDP2's HSDP all-reduce) and there is no replicate communication.
    With FSDP2 HSDP either disable FSDP's replicate all-reduce and keep True, or keep it and
    pass False (OLMo-core's setting). The result equals one process on the full tensors to
    rounding for every layout (the orientation and Q0 depend on the global shape only; see
    ``ortho_fast.distributed.dion``). State of a DTensor parameter: ``momentum`` with its
    layout, ``Q`` a DTensor on its mesh sharded like the working columns, so
    ``torch.distributed.checkpoint`` saves and reshards both; call
    ``synchronize_for_checkpoint()`` before saving, and ``init_state()`` on a fresh optimizer
    before ``dcp.load(opt.state_dict())`` then ``opt.load_state_dict``.

    State per parameter: ``momentum``, ``Q``, ``step`` (see ``dion_group_step``); inject a known
    Q through ``load_state_dict`` (its shape is checked at the next step). ``load_state_dict``
    keeps the configured state dtypes (torch would cast them to the parameter's dtype).
    Params: tensors, (name, tensor) pairs (``model.named_parameters()``: torch's
    ``param_names``) or group dicts.
    ``load_state_dict`` validates the saved groups first and never aliases the given tensors
    (the ``step`` counter seeds the sketches: a shared one would advance both optimizers).
    Source: Ahn et al., arXiv 2504.05295, Algorithm 1 and its distributed form (compressed
    data-parallel sync, sharded weights); microsoft/dion.
    Raises: TypeError naming ``seed`` unless an int (not a bool); ValueError / TypeError at
    construction (or ``add_param_group`` / ``load_state_dict``) for bad hyperparameters or
    parameters (1-D, ndim > 2 without flatten, non-floating); at construction, LayoutError (a
    ValueError) / TypeError naming the argument for a mesh that is not 1-D or overlaps another,
    ``process_group`` with a mesh or with DTensor parameters, a DTensor without any mesh, sharded
    on a mesh dim the optimizer was not given or by the replicate mesh, with a Partial placement
    or on a mesh this rank is not in; at ``step`` for hyperparameters edited since, non-finite
    or mis-shaped gradients or mis-shaped state, before any parameter or state changes (in a
    distributed step on every rank together: see ``sharded_dion_step``).
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 0.01,
        mu: float = 0.95,
        weight_decay: float = 0.01,
        *,
        rank_fraction: float = 1.0,
        rank_multiple_of: int = 1,
        epsilon: float = 1e-8,
        power_iters: int = 1,
        error_feedback: bool = True,
        qr_method: str = "householder",
        oversample: float = RCQR_OVERSAMPLE,
        right_factor: str = "column_norm",
        momentum_dtype: torch.dtype | None = None,
        q_dtype: torch.dtype | None = None,
        flatten: bool = False,
        seed: int = 0,
        replicate_mesh=None,
        outer_shard_mesh=None,
        inner_shard_mesh=None,
        replicate_mesh_grad_sync: bool = True,
        process_group=None,
    ) -> None:
        defaults = dict(
            lr=lr, mu=mu, weight_decay=weight_decay, rank_fraction=rank_fraction, rank_multiple_of=rank_multiple_of,
            epsilon=epsilon, power_iters=power_iters, error_feedback=error_feedback, qr_method=qr_method,
            oversample=oversample, right_factor=right_factor, momentum_dtype=momentum_dtype, q_dtype=q_dtype,
            flatten=flatten,
        )
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed: expected an int, got {seed!r}")
        normalize_dion_group({**defaults, "params": []})  # the defaults themselves, before any group
        self.seed = seed
        self._meshes, self._plans = resolve_meshes(replicate_mesh, outer_shard_mesh, inner_shard_mesh,
                                                   replicate_mesh_grad_sync, process_group), {}
        super().__init__(params, defaults)

    def __getstate__(self) -> dict:
        """torch's state (defaults, state, param_groups) plus the seed and the distributed plans,
        so ``copy.deepcopy`` / pickle give an optimizer that steps as this one does."""
        return {**super().__getstate__(), "seed": self.seed, "_meshes": self._meshes, "_plans": self._plans}

    def _normalize_group(self, group: dict) -> None:
        """``normalize_dion_group``, then each param's distributed plan (kept once the group is)."""
        normalize_dion_group(group)
        plan_dion_group(group, self._meshes, self._plans)

    def add_param_group(self, param_group: dict) -> None:
        """torch's add_param_group (defaults, (name, tensor) pairs, leaf and duplicate checks),
        then ``normalize_dion_group`` and the layout checks; a rejected group is removed again."""
        add_param_group_checked(self, param_group, self._normalize_group)

    def state_dict(self) -> dict:
        """torch's ``state_dict`` with dtype options as names (``state_dict_with_dtype_names``)."""
        return state_dict_with_dtype_names(self)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's ``load_state_dict`` through ``load_state_dict_checked``: saved groups
        completed from the current ones and validated first, every state tensor a copy, and
        ``momentum`` / ``Q`` restored from the saved tensors in the group's ``momentum_dtype``
        / ``q_dtype`` (torch casts floating state to the parameter's dtype, which would round a
        float32 momentum of a bfloat16 parameter). Distributed: the state of a DTensor
        parameter must be DTensors with its layout (``torch.distributed.checkpoint`` into
        ``init_state()``'s state), checked at the next step."""
        load_state_dict_checked(self, state_dict, lambda i, saved, current: (DION_DEFAULTS, normalize_dion_group),
                                dion_state_dtype)

    @torch.no_grad()
    def init_state(self) -> None:
        """Create the state of every parameter now, with or without a gradient, without changing
        any parameter and without communication: ``momentum`` zeros, ``Q`` = Q0, ``step`` 0 —
        exactly what the first step would create (existing entries are kept). Call it on a fresh
        optimizer before ``torch.distributed.checkpoint.load(opt.state_dict(), ...)`` so there
        are tensors (DTensors with the right placements) to load into, then ``load_state_dict``."""
        init_dion_groups(self.param_groups, self.state, self._meshes, self._plans, seed=self.seed)

    @torch.no_grad()
    def synchronize_for_checkpoint(self) -> None:
        """Make the state the same on every replica before a checkpoint is saved: with
        compressed sync each replica's momentum is its own, this averages it over the replicate
        axis (and broadcasts Q, already equal, from the first replica). A no-op in one process,
        without a replicate axis or with ``replicate_mesh_grad_sync=False`` (as microsoft/dion).
        See ``ortho_fast.distributed.dion.synchronize_replicas``."""
        if self._meshes is not None:
            from .distributed.dion import synchronize_replicas

            synchronize_replicas(self.param_groups, self.state, self._meshes)

    @torch.no_grad()
    def step(self, closure=None):
        """One Dion step for every parameter with a gradient: every group is checked first
        (``check_dion_step``), then stepped (``dion_group_step``; distributed:
        ``ortho_fast.distributed.dion.sharded_dion_step``). Returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._meshes is not None:
            from .distributed.dion import sharded_dion_step

            sharded_dion_step(self.param_groups, self.state, self._plans, self._meshes, seed=self.seed)
            return loss
        for group in self.param_groups:
            check_dion_step(group, self.state)
        first = 0
        for group in self.param_groups:
            dion_group_step(group, self.state, seed=self.seed, first_index=first)
            first += len(group["params"])
        return loss
