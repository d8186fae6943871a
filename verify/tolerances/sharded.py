"""The layout contract of the distributed optimizers: a sharded step against one process
(docs/design.md, "Distributed layouts and the layout contract"; ``ortho-verify sharding``).
"""

from __future__ import annotations

__all__ = ["SHARDED_RTOL", "sharded_tolerance"]


# --- sharding equivalence ---

#: The layout contract (docs/design.md, "Distributed layouts and the layout contract"): relative Frobenius difference between a sharded step and the
#: one-process step on the full tensors.
SHARDED_RTOL = {"float64": 1e-12, "float32": 1e-5}


def sharded_tolerance(dtype) -> float:
    """Relative Frobenius bound ‖X_sharded − X_one‖_F / ‖X_one‖_F for a distributed Muon or Dion
    step (weights, momenta, Q; the largest over matrices and steps) against the same optimizer in
    one process on the full tensors (``ortho_verify.sharding``, ``ortho-verify sharding``).

    The layout contract (docs/design.md, "Distributed layouts and the layout contract"), float64 1e-12 (≈ 9000·u) and float32 1e-5 (≈ 168·u): a
    requirement, not a fitted number. Derivation of when it holds. A sharded step performs the
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
