"""The Muon pipeline stages around Newton–Schulz, batched over (..., m, n).

nanochat's Muon step (``nanochat/optim.py``, ``muon_step_fused``) runs, per matrix:

    momentum -> MuonEq equilibration -> Newton–Schulz -> Muon+ renormalization -> NorMuon -> update

``equilibrate`` (MuonEq, arXiv 2603.28254), ``renormalize`` (Muon+, arXiv 2602.21545) and
``normuon_normalize`` (NorMuon, Li et al. arXiv 2510.05491; microsoft/dion ``dion/normuon.py``)
are those stages as functions of tensors; ``pre_orthogonalize`` / ``post_orthogonalize`` apply the
ones a param group switches on to its list of matrices (one call each in the group step).
Every stage computes in float32 or wider (``stage_dtype``): nanochat reads its bf16 matrices
``.float()`` for these norms; bf16 squares would lose the small rows. Equations and the
differences between the papers and the implementations: docs/math.md, "Muon pipeline stages".

The post stages are per-row (or per-matrix) factors: Muon+ and NorMuon multiply O by one factor
per neuron (``post_factors``: ``renormalize_factor``, then ``normuon_factor`` with it folded in),
so the stacked step applies Ô = O·f in its update (``add_scaled_product_``: in rounds in free
workspace bytes, or inside one ``foreach_addcmul_scaled_``) and never allocates a float32 copy
of O; ``renormalize``, ``normuon_normalize`` and ``post_orthogonalize``
return O·f itself, computed by the same factor functions.

Patch points (documented seams for tests that plant bugs): ``pre_orthogonalize`` /
``post_factors`` / ``post_orthogonalize`` are looked up in this module at every group step
(``ortho_fast.groups.muon``, ``ortho_fast.distributed.muon``), and they look up ``equilibrate``,
``renormalize_factor`` and ``normuon_factor`` here at every call, so
``monkeypatch.setattr(ortho_fast.functional.muon_stages, "normuon_factor", ...)`` reaches every
Muon step run afterwards.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from . import graph_scalars

#: MuonEq sides: "row" rescales rows (nanochat, the paper), "column" rescales columns.
EQUILIBRATION_SIDES = ("row", "column")
#: NorMuon's statistic: "row" one per row = output neuron (the paper; microsoft/dion, state (m, 1));
#: "column" one per column; "by_shape" per row when m >= n, else per column (nanochat).
NORMUON_DIMS = ("row", "column", "by_shape")
#: NorMuon's division: "add" O / (√v + eps) (microsoft/dion); "clamp" O / √max(v, eps) (nanochat).
NORMUON_EPS_MODES = ("add", "clamp")
#: The floor nanochat puts under a row norm (MuonEq) and under ‖O‖_F (Muon+).
NORM_FLOOR = 1e-6


def stage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the stages compute in: float64 for float64 input, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def equilibration_side(value) -> str | None:
    """The side a ``row_equilibration`` option means: False/None -> None, True -> "row", "row" /
    "column" as given. Raises: ValueError naming ``row_equilibration`` otherwise."""
    if value is None or value is False:
        return None
    if value is True:
        return "row"
    if isinstance(value, str) and value in EQUILIBRATION_SIDES:
        return value
    raise ValueError(f"row_equilibration: expected a bool or one of {EQUILIBRATION_SIDES}, got {value!r}")


def equilibrate(x: torch.Tensor, side: str = "row", *, floor: float = NORM_FLOOR) -> torch.Tensor:
    """MuonEq: each row x_i ← x_i · t / max(‖x_i‖₂, floor) with t = ‖X‖_F / √m (the root-mean-square
    row norm, so ‖X‖_F is kept); ``side="column"`` the same on columns. Out of place (the input
    may be the momentum buffer itself).

    Shapes: x (..., m, n) floating -> (..., m, n) in ``stage_dtype(x.dtype)``, per matrix.
    Source: MuonEq (arXiv 2603.28254); nanochat ``muon_step_fused`` (rows, norms in float32, floor 1e-6).
    Raises: ValueError naming ``side``.
    """
    if side not in EQUILIBRATION_SIDES:
        raise ValueError(f"side: expected one of {EQUILIBRATION_SIDES}, got {side!r}")
    w = x.to(stage_dtype(x.dtype))
    dim, count = (-1, w.shape[-2]) if side == "row" else (-2, w.shape[-1])
    norms = torch.linalg.vector_norm(w, dim=dim, keepdim=True)
    target = torch.linalg.vector_norm(w, dim=(-2, -1), keepdim=True) / math.sqrt(count)
    return w * (target / norms.clamp_min(floor))


def renormalize_factor(o: torch.Tensor, *, floor: float = NORM_FLOOR) -> torch.Tensor:
    """Muon+'s factor √min(m, n) / max(‖O‖_F, floor) per matrix (‖O‖_F accumulated in ``stage_dtype``:
    no copy of O).

    Shapes: o (..., m, n) floating -> (..., 1, 1) in ``stage_dtype(o.dtype)``.
    Source: Muon+ (arXiv 2602.21545); nanochat ``muon_step_fused`` (floor 1e-6).
    """
    target = math.sqrt(min(o.shape[-2], o.shape[-1]))
    norm = torch.linalg.vector_norm(o, dim=(-2, -1), keepdim=True, dtype=stage_dtype(o.dtype))
    return target / norm.clamp_min(floor)


def renormalize(o: torch.Tensor, *, floor: float = NORM_FLOOR) -> torch.Tensor:
    """Muon+: O ← O · √min(m, n) / max(‖O‖_F, floor), per matrix (``renormalize_factor``).

    Shapes: o (..., m, n) floating -> (..., m, n) in ``stage_dtype(o.dtype)``.
    Source: Muon+ (arXiv 2602.21545); nanochat ``muon_step_fused`` (floor 1e-6).
    """
    return o * renormalize_factor(o, floor=floor)  # the factor (stage_dtype, >= 2-D) promotes O: no copy


def normuon_side(m: int, n: int, dim: str = "row") -> str:
    """"row" or "column": where NorMuon keeps its statistic for an (m, n) matrix ("by_shape":
    "row" when m >= n, nanochat's ``red_dim = -1 if m >= n else -2``).
    Raises: ValueError naming ``normuon_dim``."""
    if dim not in NORMUON_DIMS:
        raise ValueError(f"normuon_dim: expected one of {NORMUON_DIMS}, got {dim!r}")
    if dim == "by_shape":
        return "row" if m >= n else "column"
    return dim


def normuon_variance_shape(shape: Sequence[int], dim: str = "row") -> tuple[int, ...]:
    """Shape of NorMuon's second moment for matrices of ``shape`` (..., m, n): (..., m, 1) per
    row (microsoft/dion's ``param[..., 0:1]``), (..., 1, n) per column."""
    *batch, m, n = shape
    return (*batch, m, 1) if normuon_side(m, n, dim) == "row" else (*batch, 1, n)


_TINY = {d: torch.finfo(d).tiny for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64)}


def normuon_factor(o: torch.Tensor, variance: torch.Tensor, *, beta2: float, eps: float = 1e-8,
                   eps_mode: str = "add", dim: str = "row", gain: torch.Tensor | None = None) -> torch.Tensor:
    """NorMuon as one factor per neuron: v ← β₂v + (1 − β₂)·mean(O⊙O) per neuron (in place in
    ``variance``) and f with O·f = Ô·‖O‖_F/‖Ô‖_F, Ô = O ⊘ d(v) (a zero O gives f = 0).

    Everything comes from the neurons' norms r_i = ‖O_i‖₂ (one reduction of O, accumulated in
    ``stage_dtype``; no copy and no squares of O): mean(O_i⊙O_i) = r_i²/ℓ (ℓ the reduced length),
    ‖O‖_F = ‖r‖₂, ‖Ô‖_F = ‖r ⊘ d‖₂, so f = d⁻¹·‖r‖₂/‖r ⊘ d‖₂. d(v) = √v + eps ("add",
    microsoft/dion) or √max(v, eps) ("clamp", nanochat's ``rsqrt(clamp_min(v, 1e-10))``); no bias
    correction (neither implementation has one). The EMA runs in the variance's dtype's
    ``stage_dtype`` (in place when that is its dtype), stored back in its own dtype.
    ``gain``: a per-matrix factor g applied to O first (Muon+'s ``renormalize_factor``): the
    statistics are those of g·O and the result includes g (f·O = NorMuon(g·O)).
    Shapes: o (..., m, n); variance ``normuon_variance_shape(o.shape, dim)``; gain (..., 1, 1) or
    None -> f of the variance's shape in ``stage_dtype(o.dtype)``.
    Source: Li et al. arXiv 2510.05491 (Algorithm 1); microsoft/dion ``_normuon_normalization_core``;
    nanochat ``muon_step_fused``. Raises: nothing (the group layer validates the options and the state).
    """
    return NormuonFactor(o.shape, o.dtype, variance.dtype, beta2=beta2, eps=eps, eps_mode=eps_mode, dim=dim)(
        o, variance, gain)


class NormuonFactor:
    """``normuon_factor`` for results of one shape and dtype and second moments of one dtype, its
    constants resolved once (a stacked chunk's plan calls it at every step): the same operations
    in the same order, the same bits. ``shape``: o's shape (..., m, n); ``dtype``, ``variance_dtype``:
    o's and the variance's dtypes; the keywords as ``normuon_factor``'s. Call it with
    ``(o, variance, gain=None)``. Raises: nothing (the group layer validates the options)."""

    __slots__ = ("dtype", "red", "length", "v_dtype", "in_place", "weight", "eps", "add", "tiny")

    def __init__(self, shape: Sequence[int], dtype: torch.dtype, variance_dtype: torch.dtype, *, beta2: float,
                 eps: float = 1e-8, eps_mode: str = "add", dim: str = "row") -> None:
        self.dtype = stage_dtype(dtype)
        self.red = -1 if normuon_side(shape[-2], shape[-1], dim) == "row" else -2
        self.length = shape[self.red]
        self.v_dtype = stage_dtype(variance_dtype)
        self.in_place = variance_dtype == self.v_dtype
        self.weight = 1 - beta2
        self.eps = eps
        self.add = eps_mode == "add"
        self.tiny = _TINY.get(self.dtype) or torch.finfo(self.dtype).tiny

    def __call__(self, o: torch.Tensor, variance: torch.Tensor, gain: torch.Tensor | None = None) -> torch.Tensor:
        dtype = self.dtype
        norms = torch.linalg.vector_norm(o, dim=self.red, keepdim=True, dtype=dtype)
        if gain is not None:
            norms = norms.mul_(gain)
        mean_square = norms.square().div_(self.length)
        if dtype != self.v_dtype:  # (``.to`` of its own dtype is the tensor itself: skipped, one call less)
            mean_square = mean_square.to(self.v_dtype)
        if self.in_place:
            v = variance.lerp_(mean_square, self.weight)
        else:
            v = variance.to(self.v_dtype).lerp(mean_square, self.weight)
            variance.copy_(v)
        del mean_square  # freed before the divisors are formed (the stage's peak: stage_nbytes)
        if self.v_dtype != dtype:
            v = v.to(dtype)
        inverse = v.sqrt().add_(self.eps).reciprocal_() if self.add else v.clamp_min(self.eps).rsqrt_()
        norm_o = torch.linalg.vector_norm(norms, dim=(-2, -1), keepdim=True)
        norm_y = torch.linalg.vector_norm(norms.mul_(inverse), dim=(-2, -1), keepdim=True)
        factor = inverse.mul_(norm_o.div_(norm_y.clamp_min_(self.tiny)))
        return factor if gain is None else factor.mul_(gain)


def normuon_normalize(o: torch.Tensor, variance: torch.Tensor, *, beta2: float, eps: float = 1e-8,
                      eps_mode: str = "add", dim: str = "row") -> torch.Tensor:
    """NorMuon: v ← β₂v + (1 − β₂)·mean(O⊙O) per neuron (in place in ``variance``), Ô = O ⊘ d(v),
    returned as Ô·‖O‖_F/‖Ô‖_F per matrix (a zero Ô stays zero): O·``normuon_factor`` (see it for
    d(v), the dtypes and the statistics).
    Shapes: o (..., m, n); variance ``normuon_variance_shape(o.shape, dim)`` -> (..., m, n) in
    ``stage_dtype(o.dtype)``.
    Source: Li et al. arXiv 2510.05491; microsoft/dion ``_normuon_normalization_core``; nanochat
    ``muon_step_fused``. Raises: nothing (the group layer validates the options and the state).
    """
    return o * normuon_factor(o, variance, beta2=beta2, eps=eps, eps_mode=eps_mode, dim=dim)  # promoted, no copy


def pre_orthogonalize(mats: Sequence[torch.Tensor], *, equilibration: str | None) -> list[torch.Tensor]:
    """The stages before Newton–Schulz on a group's matrices: MuonEq with ``equilibration`` (a
    side, or None: the matrices unchanged, no copy)."""
    if equilibration is None:
        return list(mats)
    return [equilibrate(x, equilibration) for x in mats]


def post_factors(outs: Sequence[torch.Tensor], variances: Sequence[torch.Tensor] | None, *,
                 renormalize_norm: bool, beta2: float | None, eps: float, eps_mode: str,
                 dim: str) -> list[torch.Tensor] | None:
    """The stages after Newton–Schulz on one parameter's matrices (or one stack) as factors, in
    nanochat's order: Muon+ (``renormalize_norm``: ``renormalize_factor``, (..., 1, 1)), then
    NorMuon (``beta2`` not None: ``normuon_factor`` with Muon+'s factor as its ``gain``;
    ``variances[j]`` the second moment of matrix j, updated in place), so that outs[j]·f_j is
    the stages' output. None: nothing switched on.
    Shapes: outs[j] (..., m, n) -> f_j (..., 1, 1) or the variance's shape, in ``stage_dtype``."""
    if not renormalize_norm and beta2 is None:
        return None
    gains = [renormalize_factor(o) for o in outs] if renormalize_norm else [None] * len(outs)
    if beta2 is None:
        return gains
    return [normuon_factor(o, v, beta2=beta2, eps=eps, eps_mode=eps_mode, dim=dim, gain=g)
            for o, v, g in zip(outs, variances, gains)]


def post_orthogonalize(outs: Sequence[torch.Tensor], variances: Sequence[torch.Tensor] | None, *,
                       renormalize_norm: bool, beta2: float | None, eps: float, eps_mode: str,
                       dim: str) -> list[torch.Tensor]:
    """The stages after Newton–Schulz on one parameter's matrices, in nanochat's order: Muon+
    (``renormalize_norm``), then NorMuon (``beta2`` not None; ``variances[j]`` the second
    moment of matrix j, updated in place): outs[j]·f_j in ``stage_dtype`` with f = ``post_factors``.
    Nothing switched on: the outputs unchanged."""
    factors = post_factors(outs, variances, renormalize_norm=renormalize_norm, beta2=beta2, eps=eps,
                           eps_mode=eps_mode, dim=dim)
    if factors is None:
        return list(outs)
    return [o * f for o, f in zip(outs, factors)]  # f (stage_dtype, >= 2-D) promotes O: one O-sized result


def foreach_addcmul_scaled_(dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor],
                            factors: Sequence[torch.Tensor], alpha: float | torch.Tensor) -> None:
    """dsts[i] ← dsts[i] + alpha·srcs[i]·factors[i] in place (factors broadcast: the stages'
    ``post_factors``), computed in the promoted dtype (float32 for bfloat16 sources and float32
    factors) and rounded once into dsts[i]: the update with Ô = O·f never materialized. Eager: one
    ``_foreach_addcmul_`` (on CUDA, mixed dtypes or broadcast factors take torch's per-tensor
    path: one kernel per tensor). Under ``torch.compile`` a product then a sum (the lr stays a
    graph input, ``ortho_fast.functional.graph_scalars``), and so for a tensor ``alpha`` (``capturable``).
    Shapes: srcs[i] and factors[i] broadcastable to dsts[i]."""
    if torch.compiler.is_compiling() or isinstance(alpha, torch.Tensor):
        for d, s, f in zip(dsts, srcs, factors):
            dtype = torch.promote_types(torch.promote_types(d.dtype, s.dtype), f.dtype)
            d.add_(s.to(dtype) * f.to(dtype) * alpha)
        return
    torch._foreach_addcmul_(list(dsts), list(srcs), list(factors), value=alpha)


def add_scaled_product_(dsts: Sequence[torch.Tensor], stack: torch.Tensor, factor: torch.Tensor,
                        counts: Sequence[int], alpha: float, free: Sequence[torch.Tensor | None] = (),
                        cache: dict | None = None) -> None:
    """dsts[i] ← dsts[i] + alpha·Ô_i, Ô = stack·factor, dsts[i] the i-th ``counts[i]`` consecutive
    matrices of the (k, m, n) ``stack`` (dsts[i] (counts[i], m, n) contiguous): the stacked step's
    update with the stages' factors. Where the dsts have the promoted dtype of the three (float32
    parameters, a bfloat16 stack, float32 factors) and ``stacked.product_rounds`` finds free bytes
    in ``free`` (flat workspace bytes the step no longer reads, disjoint from ``stack``, the
    factor and the dsts) or in the stack's added matrices: per round one batched ``torch.mul`` of
    the stack's slice by the factor's into a free region per part and one same-dtype
    ``_foreach_add_`` (CUDA's fast path: a few launches per chunk, where the mixed-dtype
    ``_foreach_addcmul_`` with broadcast factors takes one per tensor). Ô is then rounded once to
    the dsts' dtype before the sum (the ``_foreach_addcmul_`` fuses α·O·f into the sum: on the CPU
    fma(α·O, f, W), measured with torch 2.13): not the same bits, each entry within
    u·|W| + 5u·|α·O·f| of W + α·O·f (u the dsts' unit roundoff; α's cast, O·f and α·Ô, then the
    sum: u·|W| + 4u(1 + u)²·|α·O·f|), the fused form within u·|W| + 3u·|α·O·f|. Otherwise, and under ``torch.compile``,
    ``foreach_addcmul_scaled_``. Changes the bytes of ``free`` and of ``stack``.
    ``cache``: a dict keeping the rounds and their splits from step to step (a chunk's plan: ``free``,
    ``stack`` and ``factor``'s shape the same at every step).
    Shapes: stack (k, m, n); factor (k, m, 1), (k, 1, n) or (k, 1, 1); sum(counts) = k."""
    rounds = cache.get("product_rounds", False) if cache is not None else False
    if rounds:  # the rounds kept: the kernels only (the helpers looked up at the call, as below)
        add = graph_scalars.foreach_add_scaled_
        for lo, hi, made, srcs in rounds:
            for a, b, part, out in made:
                torch.mul(part, factor[a:b], out=out)
            add(dsts[lo:hi], srcs, alpha)
        return
    from .graph_scalars import foreach_add_scaled_  # looked up at the call: patchable (tests spy on the rounds)
    from .stacked import product_rounds

    dsts, counts = list(dsts), list(counts)
    dtype = dsts[0].dtype
    if rounds is False:  # not kept yet (kept None: no rounds)
        rounds = None
        if not torch.compiler.is_compiling() and all(d.dtype == dtype for d in dsts) and _widest(dtype, stack, factor):
            rounds = product_rounds(list(free), stack, counts, dtype)
        if rounds is not None:  # each part's stack slice and its matrices' views, made once
            planned = []
            for lo, hi, parts in rounds:
                made, srcs = [], []
                for a, b, out in parts:
                    made.append((a, b, stack[a:b], out))
                    srcs += _split(out, counts[len(srcs) + lo:hi])
                planned.append((lo, hi, made, srcs[:hi - lo]))
            rounds = planned
        if cache is not None:
            cache["product_rounds"] = rounds
    if rounds is None:
        foreach_addcmul_scaled_(dsts, _split(stack, counts), _split(factor, counts), alpha)
        return
    for lo, hi, made, srcs in rounds:
        for a, b, part, out in made:
            torch.mul(part, factor[a:b], out=out)
        foreach_add_scaled_(dsts[lo:hi], srcs, alpha)


def _widest(dtype: torch.dtype, *ts: torch.Tensor) -> bool:
    """Whether floating ``dtype`` is what it promotes to with the floating tensors ``ts`` (the same
    dtype or a wider one; host-side: ``torch.promote_types`` is an operator a dispatch mode sees)."""
    return dtype.is_floating_point and all(
        t.dtype.is_floating_point and (t.dtype == dtype or t.dtype.itemsize < dtype.itemsize) for t in ts)


def _split(x: torch.Tensor, counts: Sequence[int]) -> list[torch.Tensor]:
    """Consecutive slices of x along dim 0 of the lengths ``counts`` (as many as x holds)."""
    out, start = [], 0
    for k in counts:
        if start + k > x.shape[0]:
            break
        out.append(x[start:start + k])
        start += k
    return out
