"""Newton–Schulz tolerances: ``newton_schulz`` vs ``ns_map`` in float32 / float64 (Frobenius), the
per-direction singular-value tolerances of bfloat16, and the bands and gains they are computed from
(``ortho_ref.ns_step_gains``, ``ns_step_magnitudes``, ``ns_diagonal_gain``); docs/tolerances.md.
"""

from __future__ import annotations

import functools
import math

import numpy as np

import ortho_ref

from .roundoff import C_NS, U64, UNIT_ROUNDOFF, operand_roundings, unit_roundoff

__all__ = [
    "COEFFICIENT_REGISTRY_TOLERANCE", "NS_FORMS", "ROUNDINGS_PER_STEP", "gains_and_sizes", "gram_point_gains",
    "gram_rounding_points", "ns_gram_singular_value_tolerances", "ns_gram_tolerance", "ns_singular_value_tolerance",
    "ns_singular_value_tolerances", "ns_tolerance", "per_product_roundoff", "validate_restarts",
]


#: Rounding points per Newton–Schulz step: A = XXᵀ, B = bA + cA², X ← aX + BX.
ROUNDINGS_PER_STEP = 3


def ns_tolerance(sigma_hat: np.ndarray, coefficients, shape: tuple[int, int], dtype) -> float:
    """Frobenius tolerance for ‖newton_schulz(G) − ns_map(G)‖_F in float32/float64.

        C_NS · √k · (1 + √d) · (u + u64) · (G_0 + Σ_{t=1}^{T} G_t · S_t)

    Derivation (first order). Write the computed iterate as X̃_t = X_t + E_t where E_t is the
    rounding committed at step t (t = 0: rounding of the input and its normalization).
    Step t forms A = XXᵀ, B = bA + cA², X ← aX + BX. Its products have inner dimension
    ≤ d, and by Higham & Mary's probabilistic bound each contributes ≲ λ√d·u relative to the
    sizes of its terms; the sums add u relative to the same sizes. The terms are not the
    result: they are |a_t|x + |b_t|x³ + |c_t|x⁵ per singular value x of the step input, and
    cancel (``ortho_ref.ns_step_magnitudes`` gives their sup S_t). So per singular direction
    E_t ≲ (1 + √d)·u·S_t, and over k directions ‖E_t‖_F ≲ λ√k(1 + √d)·u·S_t. To first order
    E_t reaches the output multiplied by the Fréchet derivative of the remaining steps,
    whose norm is at most G_t (``ortho_ref.ns_step_gains``, Daleckii–Krein divided
    differences over the step-t spectrum). The u64 term covers the oracle's own
    backward-stable SVD. This refines the c·u·L_f·√k of docs/design.md ("Tolerances"): G_0 is the sup over the actual
    spectrum's hull, at most ``ortho_ref.ns_lipschitz(table, 0, σ̂_max)`` ≤ L_f (mean value
    theorem; checked on every call, see ``gains_and_sizes``), the later steps' roundings are
    weighted by their own gains G_t, and the inner-dimension and
    cancellation factors are explicit (a 1 × 1 input exceeded the form without S_t: local
    step errors of 9–14u against ~2u modelled).
    Shapes: sigma_hat (k,) the normalized singular values; shape (m, n).
    """
    u = unit_roundoff(dtype)
    m, n = shape
    gains, sizes = gains_and_sizes(sigma_hat, coefficients)
    weighted = float(gains[0] + np.dot(gains[1:], sizes))
    return C_NS * math.sqrt(min(m, n)) * (1 + math.sqrt(max(m, n))) * (u + U64) * weighted


def gains_and_sizes(sigma_hat: np.ndarray, coefficients) -> tuple[np.ndarray, np.ndarray]:
    """``ns_step_gains`` (G_0..G_T) and ``ns_step_magnitudes`` (S_1..S_T) over the hull [lo, hi]
    of σ̂ (widened by a relative 1e-12 when all σ̂ are equal).

    Checked against ``ortho_ref.ns_lipschitz`` on every call: G_0 = sup over [lo, hi] of
    max(|f′(x)|, |f(x)/x|), and |f(x)/x| = |f′(ξ)| for some ξ ∈ (0, x) (mean value theorem,
    f(0) = 0), so ns_lipschitz(lo, hi) <= G_0 <= ns_lipschitz(0, hi), and the latter is at most
    the L_f = sup_[0,1] |f′| of docs/design.md ("Tolerances") when hi <= 1. The lower inequality is exact in floating
    point (G_0 maximizes over a superset of ns_lipschitz's points); the upper one is allowed a
    relative √u64 ≈ 1.5e-8, far above the float64 rounding of f′ and f(x)/x (≲ 10³·u64 with the
    registry's cancellation) and far below the 1e-2 by which a sampled sup missed it.
    Raises: RuntimeError if either fails (the oracle's sup missed a critical point).
    """
    s = np.asarray(sigma_hat, dtype=np.float64)
    lo, hi = float(max(s.min(), 0.0)), float(s.max())
    if hi <= lo:
        hi = lo * (1 + 1e-12) + 1e-300
    table = np.ascontiguousarray(np.asarray(coefficients, dtype=np.float64))
    gains, sizes = _gains_and_sizes(table.tobytes(), table.shape, lo, hi)
    return gains.copy(), sizes.copy()


@functools.lru_cache(maxsize=4096)
def _gains_and_sizes(table_bytes: bytes, shape: tuple, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """``gains_and_sizes`` on the hull [lo, hi], memoized on the exact table bytes and float64 ends: the
    Newton–Schulz rows of one input call it with the same σ̂ and schedule once per dtype and kernel
    (float64 / float32, plain / Gram), and the oracle's root search is most of a row's cost."""
    coefficients = np.frombuffer(table_bytes, dtype=np.float64).reshape(shape)
    gains = ortho_ref.ns_step_gains(coefficients, lo, hi)
    inner, outer = ortho_ref.ns_lipschitz(coefficients, lo, hi), ortho_ref.ns_lipschitz(coefficients, 0.0, hi)
    if not inner <= gains[0] <= outer * (1 + math.sqrt(U64)):
        raise RuntimeError(f"ns_step_gains: G_0 = {gains[0]!r} outside [ns_lipschitz(lo, hi), ns_lipschitz(0, hi)] = "
                           f"[{inner!r}, {outer!r}] on σ̂ ∈ [{lo!r}, {hi!r}]")
    return gains, ortho_ref.ns_step_magnitudes(coefficients, lo, hi)


def ns_singular_value_tolerance(sigma_hat: np.ndarray, coefficients, shape: tuple[int, int], dtype) -> float:
    """Tolerance for max_i |σ_i(newton_schulz(G)) − f(σ̂_i)| (sorted); the bfloat16 check.

    Derivation. In bfloat16 (and float16) the CPU and GPU matmuls accumulate in float32 and
    round each output once, so each of the ROUNDINGS_PER_STEP products perturbs the iterate
    by about u relative to its scale (≤ max x_t ≈ 1); in float32/float64 the accumulation is
    in the same precision and adds the probabilistic √d of Higham & Mary (2019). To first order a perturbation E of a
    simple singular value moves it by uᵢᵀEvᵢ (Stewart & Sun 1990, ch. V), and that displacement of
    x_t is carried to the output by |∂x_T/∂x_t| along the exact trajectory. Summing over
    the input rounding and the T steps gives ``ortho_ref.ns_diagonal_gain``; with
    rho = ROUNDINGS_PER_STEP·a·(u + u64) (a = 1 or √d, above) the tolerance is
    rho·max_i sup_{|x − σ̂ᵢ| ≤ rho} gain(x) — the sup over the rounding neighbourhood makes
    the first-order estimate a mean-value one. Sorting both sides is
    justified by Weyl's inequality for the sorted singular values.
    This is a first-order model, not a rigorous bound; it is only informative where it is
    below the width of the band (well-conditioned inputs) — the check reports it regardless.
    """
    return float(np.max(ns_singular_value_tolerances(sigma_hat, coefficients, shape, dtype)))


def ns_singular_value_tolerances(sigma_hat: np.ndarray, coefficients, shape: tuple[int, int], dtype) -> np.ndarray:
    """Per-direction tolerances τ_i = rho·sup_{|x − σ̂ᵢ| ≤ rho} gain(x) (see
    ``ns_singular_value_tolerance``, whose value is their maximum).

    Used directly for |uᵢᵀ X_fast vᵢ − f(σ̂ᵢ)| with uᵢ, vᵢ the exact singular vectors of
    the input: to first order that projection is the i-th singular value of X_fast
    (Stewart & Sun 1990, ch. V), so each direction gets its own tolerance and the
    well-resolved directions of an ill-conditioned input keep a sharp check.
    Shapes: sigma_hat (k,) -> (k,) float64.
    """
    rho = ROUNDINGS_PER_STEP * per_product_roundoff(dtype, shape)
    # Mean-value form: the gain's sup over each σ̂ᵢ ± rho, not its value at σ̂ᵢ — the steep
    # schedules' gains oscillate within one bf16 rounding of x ≈ 1 (a point value was
    # measured to be exceeded: polar_express_paper, a 3 × 1 input at σ̂ = 0.99).
    x = np.asarray(sigma_hat, dtype=np.float64)[:, None] + rho * np.linspace(-1.0, 1.0, 33)[None, :]
    gain = ortho_ref.ns_diagonal_gain(np.clip(x, 0.0, None), coefficients)
    return rho * np.max(gain, axis=1)


def per_product_roundoff(dtype, shape: tuple[int, int]) -> float:
    """ρ: the displacement of one singular value (absolute, per unit of the product's scale) that one
    matrix product commits, the rounding model of the per-direction tolerances.

    bfloat16 / float16: the product accumulates in float32 and is rounded once, ρ = u + u64.
    float32 / float64: accumulated in the dtype itself, ρ = √d·(u + u64) (Higham & Mary's
    probabilistic √d, d = max(m, n) the longest inner dimension).
    TF32 ("tf32" / "high"): both operands rounded to 10 bits (u = 2⁻¹¹) and the products
    accumulated and stored in float32, fl(AB) = (A + ΔA)(B + ΔB) + float32 accumulation, so
    ρ = 2(u_tf32 + u64) + √d·u32 (``operand_roundings``).
    """
    u = unit_roundoff(dtype)
    d = max(shape)
    if operand_roundings(dtype) == 2:
        return 2 * (u + U64) + math.sqrt(d) * UNIT_ROUNDOFF["float32"]
    accumulation = 1.0 if u > UNIT_ROUNDOFF["float32"] else math.sqrt(d)
    return accumulation * (u + U64)


#: Kernel forms of a Newton–Schulz iteration that the checks model: "standard" (X ← aX + (bA + cA²)X
#: with A = XXᵀ each step) and "gram" (Gram Newton–Schulz: the iteration carried on R = XXᵀ and
#: Q = Π(aI + bR + cR²), X touched only at the declared restarts and at the end). The same map in
#: exact arithmetic; different rounding.
NS_FORMS = ("standard", "gram")


def validate_restarts(restarts, steps: int) -> tuple[int, ...]:
    """The sorted step indices (0-based, 0 < i < steps) before which a Gram kernel restarts
    (X ← QX, R ← XXᵀ), from any iterable of ints; None or () for none.
    Raises: ValueError naming restarts for a non-integer or an index outside 1 .. steps − 1."""
    if restarts is None:
        return ()
    try:
        values = sorted({int(i) for i in restarts if int(i) == i})
        given = list(restarts)
    except (TypeError, ValueError):
        raise ValueError(f"restarts: expected step indices (ints in 1 .. {steps - 1}), got {restarts!r}") from None
    if len(values) != len(set(given)) or any(not 0 < i < steps for i in values):
        raise ValueError(f"restarts: expected step indices (0-based ints in 1 .. {steps - 1}, the steps before which X "
                         f"<- QX and R <- XX^T are recomputed), got {restarts!r}")
    return tuple(values)


def gram_rounding_points(x0, table, restarts=(), perturbation: dict | None = None, sizes: list | None = None):
    """The scalar Gram Newton–Schulz recurrence of one singular value x₀ (elementwise over an
    array), with an additive perturbation at each rounding point.

    In exact arithmetic every intermediate of a Gram kernel is a function of the input's
    singular values in the input's own singular basis (R = U diag(r) Uᵀ, Q = U diag(q) Uᵀ,
    X = U diag(x) Vᵀ), so one direction follows the scalar recurrence

        x ← x₀, r ← x²;  per step i: [restart: x ← q·x, r ← x², q ← 1]
        z ← b r + c r²,  q ← (a + z)·q,  [unless the next step restarts or i is last:
        r_z ← (a + z)·r,  r ← (a + z)·r_z];   at the end x_T = q·x,

    whose result is ``ortho_ref.ns_polynomial`` (z and r are the step polynomial's
    h(x²) − a and x² along the trajectory). The *points* are the stored intermediates in this
    order: the (normalized) input, then every R, Z, Q, R_z, restart X and the final X.
    ``perturbation``: point index -> value added there (complex values allowed: complex-step
    derivatives). ``sizes``: if a list, receives per point the magnitude of its terms
    (|b|r + |c|r² for Z, (|a| + |z|)|q| for Q, ...), the scale its rounding is relative to.
    Returns: x_T (the same shape as x0). Source: the Gram form of Newton–Schulz, Dao AI Lab's
    gram-newton-schulz (2025) and microsoft/dion's ``use_gram_newton_schulz``, written from the
    polynomial view (Amsel et al. 2025, arXiv 2505.16932, Sec. 2).
    """
    table = np.atleast_2d(np.asarray(table, dtype=np.float64))
    extra = perturbation or {}
    index = [0]

    def point(value, size):
        if sizes is not None:
            sizes.append(np.abs(size))
        i = index[0]
        index[0] += 1
        return value + extra[i] if i in extra else value

    x0 = np.asarray(x0)
    x = point(x0 * 1.0, np.abs(x0))
    r = point(x * x, np.abs(x * x))
    q = np.ones_like(x)
    last = len(table) - 1
    for i, (a, b, c) in enumerate(table):
        if i in restarts:
            x = point(q * x, np.abs(q * x))
            r = point(x * x, np.abs(x * x))
            q = np.ones_like(x)
        z = point(b * r + c * r * r, abs(b) * np.abs(r) + abs(c) * np.abs(r * r))
        q = point((a + z) * q, (abs(a) + np.abs(z)) * np.abs(q))
        if i < last and i + 1 not in restarts:
            rz = point((a + z) * r, (abs(a) + np.abs(z)) * np.abs(r))
            r = point((a + z) * rz, (abs(a) + np.abs(z)) * np.abs(rz))
    return point(q * x, np.abs(q * x))


def gram_point_gains(x0, table, restarts=()) -> tuple[np.ndarray, np.ndarray]:
    """(|∂x_T/∂e_p|, S_p): per rounding point p of ``gram_rounding_points`` the first-order gain of
    the output singular value (complex-step derivative of the polynomial recurrence: exact to
    float64 rounding, no step size to tune) and the magnitude of the point's terms, both
    elementwise over x0. Shapes: x0 (...) -> ((P, ...), (P, ...))."""
    x0 = np.asarray(x0, dtype=np.float64)
    sizes: list = []
    gram_rounding_points(x0, table, restarts, sizes=sizes)
    h = 1e-30
    gains = np.stack([np.abs(gram_rounding_points(x0.astype(np.complex128), table, restarts, {p: 1j * h}).imag / h)
                      for p in range(len(sizes))])
    return gains, np.stack(sizes)


def ns_gram_singular_value_tolerances(sigma_hat: np.ndarray, coefficients, shape: tuple[int, int], dtype,
                                      restarts=()) -> np.ndarray:
    """Per-direction tolerances τᵢ for |σ(X_fast) − f(σ̂ᵢ)| of a Gram Newton–Schulz kernel:

        τᵢ = ρ · Σ_p sup_{|x − σ̂ᵢ| ≤ δ} |∂x_T/∂e_p|(x) · S_p,   S_p = max_j size_p(σ̂_j),
        δ = ROUNDINGS_PER_STEP·ρ,

    with ρ = ``per_product_roundoff(dtype, shape)`` and the points, gains and sizes of
    ``gram_rounding_points`` / ``gram_point_gains`` (docs/tolerances.md, "Gram Newton–Schulz").

    Derivation (first order, as ``ns_singular_value_tolerances``). Each stored intermediate M_p
    (R, Z, Q, R_z, X) is rounded once; its error E_p moves direction i's value of M_p by
    uᵢᵀE_pwᵢ ≲ ρ·‖M_p‖₂ (Stewart & Sun 1990, ch. V), and ‖M_p‖₂ = S_p, the largest term
    magnitude over the whole spectrum — the *coupling* that makes Gram kernels different: Q's
    norm is set by the small singular values (q ≈ Π aᵢ ≈ 10² at x ≈ 0 after two polar_express
    steps), and its rounding lands on every direction. From point p the displacement reaches
    the output through the rest of the recurrence, whose derivative is the point's gain. An
    error in R is carried by every later R update — each multiplies it by ∂r′/∂r = (a + z)² +
    ... ≈ a² ≈ 12–66 at small r — until a restart recomputes R from X, which is why kernels
    restart; it reaches X only through Q, at the restarts and at the end. The sup over a
    rounding neighbourhood makes the estimate a mean-value one, as in the standard form.
    A first-order model, not a rigorous bound: informative where it is below the band's width.
    Shapes: sigma_hat (k,) -> (k,) float64. Raises: ValueError for bad restarts.
    """
    table = ortho_ref.schedule(coefficients) if isinstance(coefficients, str) else \
        np.atleast_2d(np.asarray(coefficients, dtype=np.float64))
    restarts = validate_restarts(restarts, len(table))
    rho = per_product_roundoff(dtype, shape)
    s = np.asarray(sigma_hat, dtype=np.float64)
    _, sizes = gram_point_gains(s, table, restarts)
    scale = sizes.max(axis=1)  # (P,): ‖M_p‖₂ over the spectrum
    x = np.clip(s[:, None] + ROUNDINGS_PER_STEP * rho * np.linspace(-1.0, 1.0, 33)[None, :], 0.0, None)
    gains, _ = gram_point_gains(x, table, restarts)  # (P, k, 33)
    return rho * np.einsum("pk,p->k", gains.max(axis=2), scale)


def ns_gram_tolerance(sigma_hat: np.ndarray, coefficients, shape: tuple[int, int], dtype, restarts=()) -> float:
    """Frobenius tolerance for ‖X_fast − ns_map(G)‖_F of a Gram kernel in float32 / float64:

        ns_tolerance(σ̂) + C_NS·√k·max_i τᵢ^gram

    The standard form's rounding model covers the X products (R = XXᵀ, the restarts and the final
    QX are products of the same sizes as a standard step's); the Gram recurrence adds, per
    direction, the τᵢ of ``ns_gram_singular_value_tolerances`` (its diagonal errors); an
    error matrix of k directions whose entries are each within the largest τ has Frobenius
    norm ≲ √k·max τ at its root-mean-square (the off-diagonal entries are carried by divided
    differences of the same recurrence, bounded by its gains' sup over the spectrum's hull),
    and C_NS = 2 allows two standard deviations, as in ``ns_tolerance``."""
    k = min(shape)
    return ns_tolerance(sigma_hat, coefficients, shape, dtype) + C_NS * math.sqrt(k) * float(
        np.max(ns_gram_singular_value_tolerances(sigma_hat, coefficients, shape, dtype, restarts)))


#: Two transcriptions of the same decimal literals must give the same float64 bits.
COEFFICIENT_REGISTRY_TOLERANCE = 0.0
