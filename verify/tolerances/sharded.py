"""The layout contract of the distributed optimizers: a sharded step against one process
(docs/design.md, "Distributed layouts and the layout contract"; ``ortho-verify sharding``).
"""

from __future__ import annotations

__all__ = ["RANDOM_SPLITS", "SHARDED_RTOL", "SPLIT_ORDERS", "newton_schulz_in", "sharded_compute_tolerance",
           "sharded_tolerance"]


# --- sharding equivalence ---

#: The layout contract (docs/design.md, "Distributed layouts and the layout contract"): relative Frobenius difference
#: between a sharded step and the one-process step on the full tensors.
SHARDED_RTOL = {"float64": 1e-12, "float32": 1e-5}


def sharded_tolerance(dtype) -> float:
    """Relative Frobenius bound ‖X_sharded − X_one‖_F / ‖X_one‖_F for a distributed Muon or Dion
    step (weights, momenta, Q; the largest over matrices and steps) against the same optimizer in
    one process on the full tensors (``ortho_verify.sharding``, ``ortho-verify sharding``).

    The layout contract (docs/design.md, "Distributed layouts and the layout contract"), float64 1e-12 (≈ 9000·u) and
    float32 1e-5 (≈ 168·u): a requirement, not a fitted number. Derivation of when it holds. A sharded step performs the
    one-process arithmetic except that every sum over a sharded dimension is split into local
    partial sums plus an all-reduce (the same terms in another order), and Dion orthonormalizes
    sharded rows of P by the same algorithm on gathered rows (Householder) or an all-reduced
    Gram matrix (CholeskyQR). So X_sharded and X_one are two computed values of one exact step X,
    and ‖X_sharded − X_one‖ ≤ ‖X_sharded − X‖ + ‖X_one − X‖: two forward errors of the same
    algorithm in the same precision, each bounded as for one process.

    Dion, one step: Y = BQ and R = BᵀP carry relative errors ≲ √d·u (Higham & Mary 2019,
    probabilistic; d ≤ max(m, n) the summed length); the Q factor of Y amplifies a perturbation
    of Y by κ(Y) (Higham, *Accuracy and Stability*, Thm 19.4 and the QR perturbation bound
    ‖ΔP‖ ≲ κ(Y)‖ΔY‖/‖Y‖; CholeskyQR2 the same order while κ(Y) ≪ u^(-1/2)); the column
    normalization Q_j = R_j/‖R_j‖ amplifies column j's error by ‖B‖₂/‖R_j‖. So the relative
    difference is ≲ 2c·√d·u·κ(BQ)·‖B‖₂/min_j‖R_j‖ (c a small constant): within 1e-12 in float64
    while √d·κ·‖B‖/‖R_j‖ ≲ 4·10³ (e.g. d = 10⁴ with κ·‖B‖/‖R_j‖ ≤ 40), within 1e-5 in float32
    only while it is ≲ 80 — the checked inputs (d ≤ 24, κ(BQ) ≤ 5.3, ‖B‖₂/min‖R_j‖ ≤ 2.5 at
    the first step) are in that regime; a large or ill-conditioned float32 problem is not
    covered by this argument, the float64 one has 50× more room.

    Muon: FSDP, DDP, TP "duplicated" and "blockwise" orthogonalize the very matrices one process
    does with the same calls, and the rest is elementwise: equal bitwise (``ortho_verify.sharding``
    requires it). TP "distributed" all-reduces the Gram matrix of every Newton–Schulz step; a
    relative √d·u perturbation at step t is amplified by the remaining steps' first-order gain
    G_t (``ortho_ref.ns_step_gains``), and the all-reduced ‖X‖_F² perturbs the normalization
    (gain G_0): ≲ C_NS·√d·u·Σ_t G_t. Over the whole band σ̂ ∈ [1e-3, 1] (jordan×5: 470.5 +
    192.8) that is 2·√24·6e-8·663 ≈ 3.9e-4 in float32, above the contract; at the spectra of the
    checked first-step gradients (σ̂ ∈ [0.055, 0.71]: G_0 ≤ 33, Σ_{t≥1} G_t ≤ 27) ≈ 3.5e-5, still a
    worst case. The float32 contract for this mode is therefore a measured fact, not implied.

    Measured (``ortho-verify sharding --world-size 1 2 4 8``: every layout, matrices 16×24,
    13×7, 5×11, 3 steps): float64 ≤ 1.4e-15 (12·u), float32 ≤ 7.8e-7 (13·u), both in Dion's Q;
    the one-process float32 forward error of the same Dion steps (against float64) is 4.3e-7 in
    Q, so the sharded difference is the size of two forward errors, as derived. Muon
    "distributed": 1.2e-16 / 6.7e-8, 150× inside the float32 contract (500× below the bound at
    the inputs' spectra). docs/tolerances.md repeats this; docs/layouts.md has every layout.
    Raises: ValueError for a dtype other than float64 / float32.
    """
    name = str(dtype).removeprefix("torch.")
    if name not in SHARDED_RTOL:
        raise ValueError(f"dtype: the sharding contract covers float64 and float32, got {dtype!r}")
    return SHARDED_RTOL[name]


#: The orders in which ``newton_schulz_in`` splits and sums an inner dimension: contiguous blocks
#: summed first to last (a ring all-reduce over Shard placements), interleaved blocks (a strided
#: shard), contiguous blocks summed last to first.
SPLIT_ORDERS = ("blocks", "strided", "reversed")

#: Realizations of ``sharded_compute_tolerance`` beyond the ``SPLIT_ORDERS`` ones: every product's inner
#: indices dealt to the blocks by a seeded random permutation (``newton_schulz_in(order="random")``, seeds
#: 0..15, p = 2..w in turn). Three block orders alone estimate the spread of a small matrix's realizations
#: too low: a random split exceeded that bound on 8 of 3000 random 3..16 × 3..16 inputs (up to 1.7×), and
#: on none with these 16 added (at most 0.93 of it; docs/tolerances.md).
RANDOM_SPLITS = 16


def _split_product(a, b, parts: int, order: str = "blocks", generator=None):
    """a @ b in a's dtype with the inner sum split in ``parts`` blocks (``SPLIT_ORDERS``, or "random":
    the inner indices permuted by ``generator`` and cut into ``parts`` blocks), each block's product
    rounded to the dtype and the partial results summed one after another in the dtype (a sharded
    inner dimension whose partial sums are all-reduced in the compute precision)."""
    import torch

    k = a.shape[1]
    if parts <= 1 or k < 2:
        return a @ b
    parts = min(parts, k)
    if order == "random":
        blocks = list(torch.randperm(k, generator=generator).tensor_split(parts))
    else:
        blocks = ([torch.arange(r, k, parts) for r in range(parts)] if order == "strided"
                  else list(torch.arange(k).tensor_split(parts)))
    if order == "reversed":
        blocks = blocks[::-1]
    acc = None
    for idx in blocks:
        part = a[:, idx] @ b[idx, :]
        acc = part if acc is None else acc + part
    return acc


def newton_schulz_in(u, coefficients, compute_dtype, parts: int = 1, *, eps: float = 1e-7,
                     eps_mode: str = "add", safety: float = 1.0, order: str = "blocks", seed: int = 0):
    """Newton–Schulz on ``u`` evaluated in ``compute_dtype`` (the judge's own evaluation of the
    map a Muon declares: U/(safety·‖U‖_F + eps) or /max(safety·‖U‖_F, eps), then
    X ← aX + (bA + cA²)X with A = XXᵀ on the wide side), every product's inner sum split in
    ``parts`` blocks summed in ``order`` (``SPLIT_ORDERS``, or "random": each product's inner indices
    dealt to the blocks by its own permutation, drawn from a generator seeded with ``seed``;
    ``parts`` 1: one process's order).
    Shapes: u (m, n) tensor -> (m, n) float64. ``coefficients``: (T, 3) rows (a, b, c). The input
    is rounded to the compute dtype first and normalized there (‖U‖_F from the blocks' rounded
    partial sums of squares when split). Raises: ValueError naming ``order`` for another order."""
    import torch

    if order not in (*SPLIT_ORDERS, "random"):
        raise ValueError(f"order: expected one of {(*SPLIT_ORDERS, 'random')}, got {order!r}")
    generator = torch.Generator().manual_seed(seed) if order == "random" else None

    dt = getattr(torch, str(compute_dtype).removeprefix("torch."))
    x = torch.as_tensor(u, dtype=torch.float64).to(dt)
    tall = x.shape[0] > x.shape[1]
    x = x.mT if tall else x
    if parts <= 1:
        norm = torch.linalg.vector_norm(x)
    else:  # sums of squares per block, rounded and all-reduced in the compute precision
        flat = x.reshape(-1, 1)
        norm = _split_product(flat.mT, flat, parts, order, generator).sqrt()[0, 0]
    norm = norm * safety
    x = x / (norm.clamp(min=eps) if eps_mode == "clamp" else norm + eps)
    for a, b, c in [tuple(map(float, row)) for row in coefficients]:
        gram = _split_product(x, x.mT, parts, order, generator)
        poly = b * gram + c * _split_product(gram, gram, parts, order, generator)
        x = a * x + _split_product(poly, x, parts, order, generator)
    x = x.double()
    return x.mT if tall else x


def sharded_compute_tolerance(u, coefficients, compute_dtype, world_size: int, param_dtype, *, eps: float = 1e-7,
                              eps_mode: str = "add", safety: float = 1.0, u_sharded=None) -> tuple[float, float]:
    """Relative Frobenius bound ‖O_sharded − O_one‖_F / ‖O_one‖_F for the orthogonalized update of
    a Muon whose Newton–Schulz runs in ``compute_dtype`` (bfloat16 / float16) below the
    parameter dtype, on ``world_size`` ranks, for the Newton–Schulz input ``u`` (m, n).
    Returns (bound, the difference of the judge's evaluations it is built on: the reduction-order
    one, plus the input one where ``u_sharded`` is given).

        τ = C_NS · (max_{(p, o)} ‖NS_{p,o}(U) − NS_1(U)‖_F / ‖NS_1(U)‖_F
                    + ‖NS_1(U_s) − NS_1(U)‖_F / ‖NS_1(U)‖_F)
            + sharded_tolerance(param_dtype)

    with NS_{p,o} the judge's evaluation of the same map in ``compute_dtype`` with every
    product's inner sum split in p blocks (contiguous, strided, or summed in reverse: o ∈
    ``SPLIT_ORDERS`` for p = 2..world_size; and ``RANDOM_SPLITS`` seeded random deals of the
    inner indices, p = 2..world_size in turn), each rounded to the compute precision and summed
    in it (``newton_schulz_in``), and U_s = ``u_sharded`` the sharded run's own Newton–Schulz
    input where it differs from one process's (default U: the second term is 0). It differs
    under a weight-coupled decay (``weight_decay_style`` "l2", G ← G + wd·W): the sharded run
    adds wd times its own weight, which differs from one process's by the earlier steps' update
    differences and the layout contract, so U_s − U = wd·Σ_k (momentum weight of step k)·(W_s,k − W_1,k), rebuilt by the
    caller from both runs' weights.

    Derivation. Where the sharded run and one process evaluate the same map in the same
    precision, they differ only in reduction order: a product over a sharded dimension forms
    partial sums on each rank, rounds them to the compute dtype and all-reduces them (w − 1 more
    roundings of relative size u, ``unit_roundoff``), where one process accumulates in float32
    and rounds once (``per_product_roundoff``). To first order both are the exact map plus
    Σ_t J_t E_t, E_t the roundings of step t and J_t the Fréchet derivative of the remaining
    steps (``ns_tolerance``'s model); their difference is Σ_t J_t (E_t^sharded − E_t^one). The
    worst-case bounds of that sum (``ns_tolerance``: G_t, the sup of the divided differences over
    the spectrum's hull; ``ns_singular_value_tolerances``: the diagonal gain's sup over a
    rounding neighbourhood) are 0.05–0.98 per direction (8 where σ̂ ≈ 0.004) and 3–18 in
    Frobenius norm for Keller Jordan's schedule in bfloat16 on the checked 16×8 … 12×12 inputs:
    at or above the 0.4–0.75 by which Newton–Schulz per local shard differs, so they cannot tell a correct sharded Muon
    from a wrong one. The same first-order sum is evaluated instead: NS_p realizes it with the
    sharded run's extra roundings (p partial sums, each rounded, summed in the compute
    precision) on the actual input, so the J_t are the actual Jacobians at the actual spectrum.
    By Higham & Mary's probabilistic model (``C_NS``) a sum of k·d independent roundings
    concentrates at its root mean square; the max over 3(w − 1) + ``RANDOM_SPLITS`` realizations
    (p = 2..w: the layouts' shard counts, an all-reduce over a w-rank mesh dim or fewer ranks
    along a sub-mesh; three block orders each, and random deals, which stand for the orders a
    sharded run may take that the judge does not know: a ring all-reduce sums each output chunk
    from another rank first) estimates it from above, C_NS = 2 covers the spread of one more
    realization (the sharded run's) around it where k·d is small (a 3 × 5 matrix has 15
    roundings per product; with the three block orders alone a random deal exceeded the bound
    on 8 of 3000 such inputs, none with the random deals added), and the float32 /
    float64 layout contract of the parameter dtype (``sharded_tolerance``) adds the elementwise
    remainder of the step. A per-shard Newton–Schulz evaluates another map (the polar factor of
    each block, scaled by the block's shape) and stays off by 0.4–0.75 in bfloat16 and in
    float32 alike.

    The input term (``u_sharded``). The sharded run evaluates its map at U_s, one process at U, so
    O_s − O_1 = [NS_s(U_s) − NS_s(U)] + [NS_s(U) − NS_1(U)]: the second bracket is the
    reduction-order difference above; the first is the same evaluation at two inputs, which
    the order term does not contain (its realizations all start from U). It cannot be
    absorbed into the layout contract: W_s − W_1 is lr·s times the previous steps' update
    differences (each up to τ·‖O‖, a few percent in bfloat16), not a float32 rounding. In the
    compute dtype the input enters Newton–Schulz rounded, fl(U_s) and fl(U) (every later operation
    is a function of the rounded matrix), so the first bracket is J·(fl(U_s) − fl(U)) plus the
    response of the later roundings to that change (J the Fréchet derivative of the map at U).
    fl(U_s) − fl(U) is realized exactly by the judge (it rounds the same values the same way, up
    to the parameter dtype's rounding of U, which the contract term covers); so is its first-order
    response at the actual spectrum; the later roundings' response is realized once along one
    process's order, and C_NS covers one more realization along the sharded run's order, as for
    the order term. That response dominates: once one entry of fl(U) flips, every later rounding
    of a bfloat16 Newton–Schulz lands elsewhere, so the term is the size of another rounding
    realization (0 on 43% of 300 random 3..16 × 3..16 inputs with ‖U_s − U‖_F/‖U‖_F ≈
    1e-4/√max(m, n), 1.5e-2 median, 5.7e-2 max; the order term 3.4–7.5e-2, 5–95%), not of
    ‖U_s − U‖: two
    realizations (order and input) where C_NS covers one, hence its own term. A sharded run that
    adds the decay on a wrong weight (the local shard, a stale copy) or drops it evaluates at
    another input than U_s, and that difference is not in τ.
    Shapes: u (m, n) array or tensor; coefficients (T, 3); u_sharded (m, n) or None. Raises:
    ValueError for a compute dtype other than bfloat16 / float16 (float32 and float64 keep
    ``sharded_tolerance``), world_size < 1, or a ``u_sharded`` of another shape than ``u``.
    """
    from .roundoff import C_NS

    name = str(compute_dtype).removeprefix("torch.")
    if name not in ("bfloat16", "float16"):
        raise ValueError(f"compute_dtype: the reduction-order bound is for bfloat16 / float16, got {compute_dtype!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: expected an int >= 1, got {world_size!r}")
    if u_sharded is not None and tuple(u_sharded.shape) != tuple(u.shape):
        raise ValueError(f"u_sharded: expected the shape of u {tuple(u.shape)}, got {tuple(u_sharded.shape)}")
    kw = dict(eps=eps, eps_mode=eps_mode, safety=safety)
    one = newton_schulz_in(u, coefficients, name, 1, **kw)
    den = float(one.norm()) or 1.0
    splits = [(p, o, 0) for p in range(2, world_size + 1) for o in SPLIT_ORDERS]
    if world_size > 1:
        splits += [(2 + r % (world_size - 1), "random", r) for r in range(RANDOM_SPLITS)]
    diff = max((float((newton_schulz_in(u, coefficients, name, p, order=o, seed=r, **kw) - one).norm()) / den
                for p, o, r in splits), default=0.0)
    if u_sharded is not None:
        diff += float((newton_schulz_in(u_sharded, coefficients, name, 1, **kw) - one).norm()) / den
    return C_NS * diff + sharded_tolerance(param_dtype), diff
