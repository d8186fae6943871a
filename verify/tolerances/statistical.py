"""Statistical tolerances for low-precision Newton–Schulz kernels (bfloat16, float16, float32):
the pooled mean signed deviation of uᵢᵀ X vᵢ from f(σ̂ᵢ) over many matrices of one spectrum,
with a threshold from probabilistic rounding-error analysis at a stated false-alarm probability
(docs/tolerances.md, "Statistical checks of low-precision kernels").

numpy and ``ortho_ref`` only.

The model (Higham & Mary 2019, "A new approach to probabilistic rounding error analysis",
SIAM J. Sci. Comput. 41(5), Model 2.1): every rounding is fl(x) = x(1 + δ) with the δ
independent random variables of mean zero, |δ| ≤ u. To first order in u (their "+ O(u²)"), a
computed Newton–Schulz result X̃ of an input with exact singular triplets (σᵢ, uᵢ, vᵢ) has

    dᵢ = uᵢᵀ X̃ vᵢ − f(σ̂ᵢ) = Σ_r c_{i,r} δ_r,

a linear form in the roundings δ_r: the diagonal entry (i, i) of a perturbation E in the
singular-vector basis of an iterate is carried to the output by ∂x_T/∂x_t exactly (the
Daleckii–Krein derivative of a singular-value function acts on diagonal entries by the
derivative; Higham, *Functions of Matrices*, Thm. 3.11), and a rounding of entry (p, q) of an
intermediate M moves (UᵀEV)ᵢᵢ by uᵢₚ vᵢ_q M_pq δ. So E[dᵢ] = 0 and, by the Azuma–Hoeffding
inequality on the bounded independent terms (Higham & Mary's Lemma 2.2), for any fixed weights
P(|Σ_j w_j d_ij| ≥ λ·u·√(Σ_j w_j² Σ_r c²_{ij,r})) ≤ 2 exp(−λ²/2). ``ns_rounding_moments``
computes vᵢⱼ = u² Σ_r c²_{ij,r} from the exact intermediates of the iteration (float64) and a
bound on the O(u²) mean that the nonlinear steps add, and
``ns_mean_deviation_tolerances`` the threshold of the mean over J independent matrices with a
Bonferroni λ over the k directions.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict

import numpy as np

import ortho_ref

from .roundoff import U64, UNIT_ROUNDOFF, unit_roundoff

__all__ = [
    "FALSE_ALARM_PROBABILITY", "STATISTICAL_DTYPES", "STATISTIC_FIRST_ORDER_LIMIT", "accumulation_roundoff",
    "hoeffding_lambda", "ns_mean_deviation_tolerances", "ns_rounding_moments", "ns_rounding_variances",
    "oracle_deviation_allowance", "divided_differences",
]

#: False-alarm probability of one statistical check (one row: every direction of one batch).
FALSE_ALARM_PROBABILITY = 1e-6

#: The dtypes the statistical model covers: the kernel rounds at u per stored result.
STATISTICAL_DTYPES = ("bfloat16", "float16", "float32")

#: A direction enters the statistic only while one matrix's proxy standard deviation √vᵢⱼ is at
#: most this: the first-order model neglects O(u²) terms, which stay small next to the
#: first-order ones only while rounding moves the output's singular value by a small fraction of
#: its O(1) size (the same limit of 0.1 as the Dion tolerances' ``FIRST_ORDER_LIMIT``). Directions
#: of large first-order gain (small σ̂ after a few steps, or the steep first steps of
#: polar_express in bfloat16) are left out; within the limit the O(u²) mean is bounded by
#: ``ns_rounding_moments`` and added to the threshold.
STATISTIC_FIRST_ORDER_LIMIT = 0.1


def hoeffding_lambda(probability: float = FALSE_ALARM_PROBABILITY, count: int = 1) -> float:
    """λ with count · 2 exp(−λ²/2) = probability: the two-sided Azuma–Hoeffding multiplier for
    ``count`` statistics tested at once (Bonferroni), each sub-Gaussian with the variance
    proxies of ``ns_rounding_moments``. λ(1e-6, 1) = 5.39, λ(1e-6, 16) = 5.88.
    Raises: ValueError naming probability (not in (0, 1)) or count (< 1)."""
    if not 0.0 < probability < 1.0:
        raise ValueError(f"probability: expected in (0, 1), got {probability!r}")
    if count < 1:
        raise ValueError(f"count: expected >= 1, got {count!r}")
    return math.sqrt(2.0 * math.log(2.0 * count / probability))


def accumulation_roundoff(dtype) -> float:
    """The unit roundoff of a matmul's accumulation: float32 for bfloat16 / float16 (CPU and
    CUDA kernels accumulate in float32 and round the result once), the dtype's own otherwise."""
    return min(unit_roundoff(dtype), UNIT_ROUNDOFF["float32"])


def _divided_differences(x: np.ndarray, rest: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """|g[xᵢ, xᵢ, y]| for y = +x_l, −x_l ((..., k, k) each) and y = 0 (..., k), g the composition of the
    rows ``rest`` (a polynomial); within 1e-3 of a confluent point ½ max |g″| of the two ends."""
    def one(a, b):
        ga, gb = ortho_ref.ns_polynomial(a, rest), ortho_ref.ns_polynomial(b, rest)
        d1 = ortho_ref.ns_derivative(a, rest)
        close = np.abs(a - b) < 1e-3 * np.maximum(1.0, np.abs(a))
        gap = np.where(close, 1.0, a - b)
        value = (d1 - (ga - gb) / gap) / gap
        curvature = np.maximum(np.abs(ortho_ref.ns_derivative(a, rest, 2)), np.abs(ortho_ref.ns_derivative(b, rest, 2)))
        near = 0.5 * curvature
        return np.where(close, near, np.abs(value))
    a = np.broadcast_to(x[..., :, None], x.shape + x.shape[-1:])
    b = np.swapaxes(a, -1, -2)
    return one(a, b), one(a, -b), one(x, np.zeros_like(x))


def ns_rounding_moments(sigma_hat: np.ndarray, u: np.ndarray, v: np.ndarray, coefficients,
                        dtype) -> tuple[np.ndarray, np.ndarray]:
    """Variance proxies vᵢ = u²Σ_r c²_{i,r} of dᵢ = uᵢᵀX̃vᵢ − f(σ̂ᵢ) for one matrix (see the
    module), and bounds bᵢ ≥ |E dᵢ| on the mean of its second-order part (its first-order part has mean 0).

    Rounding points counted, per step X ← aX + (bA + cA²)X on the wide side (A = XXᵀ): the
    stored A = XXᵀ, P = AA, bA, cP, B = bA + cP, BX, aX and X' = aX + BX (the union of
    torch.optim.Muon's ``b*A + c*A@A`` / ``a*X + B@X`` and the fused ``addmm`` / ``baddbmm``
    forms: a kernel that rounds fewer intermediates has a smaller variance); before the steps
    the Frobenius norm (a scalar relative rounding, its safety product and eps sum, and the
    accumulation of mn squares) and the division. A rounding E of an (m, n) term M moves the
    iterate by E, one of an (m, m) term by E·X times h (b + c(xᵢ² + x_l²) for A, c for P, 1 for
    bA, cP, B) in entry (i, l) of the singular basis, where (UᵀEV)ᵢₗ has second moment
    ≤ u²Σ_pq u²ᵢₚ M²_pq v²_lq ((m, m): u_lq for v_lq, doubled: a symmetric result has E_pq = E_qp,
    one dot product computed twice the same way). Products add the accumulation's roundings:
    length-L sums in ``accumulation_roundoff`` u_a give each entry a proxy ≤ u_a²(L − 1)(|L||R|)²_pq.
    First order: entry (i, i) reaches the output multiplied by γᵢ = ∂x_T/∂x_t (the signed product
    of p_s′ along the exact trajectory; the Daleckii–Krein derivative of a singular-value function
    acts on diagonal entries by the derivative), so vᵢ = Σ γᵢ²·E(UᵀEV)ᵢᵢ².
    Second order: the remaining steps g_t act on the perturbed iterate; in the Jordan–Wielandt
    embedding [[0, X], [Xᵀ, 0]] (eigenvalues ±x_l, eigenvectors (u_l, ±v_l)/√2, and (0, v⊥) for 0)
    the (i, i) entry's second-order term is Σ_b g[xᵢ, xᵢ, λ_b]·F²_ib (Daleckii–Krein, second order;
    Higham, *Functions of Matrices*, Thm. 3.11 and Sec. 8.1), F the perturbation in that basis.
    Its mean is bounded by bᵢ = Σ_l ½(E_il + E_li)(|g[xᵢ, xᵢ, x_l]| + |g[xᵢ, xᵢ, −x_l]|) over l ≠ i
    + E_ii·½|g″(xᵢ)| + ½E⊥ᵢ·|g[xᵢ, xᵢ, 0]| (E⊥ the energy off the row space), summed over the
    rounding points with the divided differences of the steps after each point. Roundings of
    different points are independent, so cross terms have mean 0; third order is neglected.
    Deterministic: the coefficients, safety and eps enter as float32 scalars (torch's opmath for
    bfloat16, float16 and float32 tensors), relative u32 each and the same in every matrix
    (found: polar_express in float32 is off by −2.4e-6 on average at σ̂ = 0.38, its first step's
    terms are 47 times its result), so bᵢ also holds Σ_t |γᵢₜ|·u32·(|a_t|x + |b_t|x³ + |c_t|x⁵)
    at x = x_{t−1,i} and |γᵢ₀|·σ̂ᵢ·2u32.
    No underflow or overflow (float16: entries of the normalized iterates ≥ 6.1e-5).

    Shapes: sigma_hat (..., k) the normalized singular values (descending, as ``ortho_ref.svd``);
    u (..., m, k), v (..., n, k) the input's singular vectors (leading dims: independent matrices,
    computed at once); -> ((..., k), (..., k)) float64.
    Source: Higham & Mary 2019 (SIAM J. Sci. Comput. 41(5)), Model 2.1 and Lemma 2.2; Higham,
    *Functions of Matrices*, Thm. 3.11 (the Fréchet derivatives of a matrix function).
    Raises: ValueError for a dtype outside ``STATISTICAL_DTYPES`` or mismatched shapes.
    Memoized: the same arrays, schedule and dtype (the seeded default examples of every
    ``check_orthogonalizer`` call of a process) return copies of the first call's result,
    ``MOMENTS_CACHE_SIZE`` results kept, keyed on a digest of their bytes
    (``ns_rounding_moments.cache_clear()`` forgets them).
    """
    name = str(dtype).replace("torch.", "")
    if name not in STATISTICAL_DTYPES:
        raise ValueError(f"dtype: the statistical model covers {STATISTICAL_DTYPES}, got {dtype!r}")
    s = np.asarray(sigma_hat, dtype=np.float64)
    u, v = np.asarray(u, dtype=np.float64), np.asarray(v, dtype=np.float64)
    k = s.shape[-1]
    if u.shape[-1] != k or v.shape[-1] != k or u.shape[:-2] != s.shape[:-1] or v.shape[:-2] != s.shape[:-1]:
        raise ValueError(f"u, v: expected (..., m, {k}) and (..., n, {k}) for sigma_hat {s.shape}, got {u.shape} "
                         f"and {v.shape}")
    table = ortho_ref.schedule(coefficients) if isinstance(coefficients, str) else coefficients
    table = np.atleast_2d(np.asarray(table, dtype=np.float64))  # (T, 3)
    digest = hashlib.blake2b(name.encode(), digest_size=20)
    for x in (s, u, v, table):
        digest.update(repr(x.shape).encode())
        digest.update(np.ascontiguousarray(x))
    key = digest.digest()
    with _MOMENTS_LOCK:
        hit = _MOMENTS.get(key)
        if hit is not None:
            _MOMENTS.move_to_end(key)
    if hit is None:
        hit = _rounding_moments(s, u, v, table, name)
        with _MOMENTS_LOCK:
            _MOMENTS[key] = hit
            while len(_MOMENTS) > MOMENTS_CACHE_SIZE:
                _MOMENTS.popitem(last=False)
    return hit[0].copy(), hit[1].copy()


#: Results ``ns_rounding_moments`` keeps (digest -> (variances, biases)), least recently used first.
MOMENTS_CACHE_SIZE = 64
_MOMENTS: OrderedDict = OrderedDict()
_MOMENTS_LOCK = threading.Lock()


def _clear_moments() -> None:
    with _MOMENTS_LOCK:
        _MOMENTS.clear()


ns_rounding_moments.cache_clear = _clear_moments  # as functools' caches: forget every kept result


def _rounding_moments(s: np.ndarray, u: np.ndarray, v: np.ndarray, table: np.ndarray,
                      name: str) -> tuple[np.ndarray, np.ndarray]:
    """``ns_rounding_moments`` on validated float64 arrays, the (T, 3) table and the dtype's name."""
    if u.shape[-2] > v.shape[-2]:  # the iteration runs on the wide side
        u, v = v, u
    m, n, k = u.shape[-2], v.shape[-2], s.shape[-1]
    uu, ua = unit_roundoff(name), accumulation_roundoff(name)
    xs = [s]
    derivatives = []
    for a, b, c in table:
        y = xs[-1]
        derivatives.append(a + y * y * (3 * b + 5 * c * y * y))
        xs.append(y * (a + y * y * (b + c * y * y)))
    steps = len(table)
    gammas = [np.ones_like(s) for _ in range(steps + 1)]  # gammas[t] = ∂x_T/∂x_t
    for t in range(steps - 1, -1, -1):
        gammas[t] = gammas[t + 1] * derivatives[t]
    u2, v2 = u * u, v * v
    u2t = np.swapaxes(u2, -1, -2)
    v_perp2 = np.clip(1.0 - v2.sum(axis=-1), 0.0, None)[..., None]  # (..., n, 1): squared norm off the row space
    var, bias = np.zeros_like(s), np.zeros_like(s)
    eye = np.eye(k, dtype=bool)

    def x_space(x):
        return (u * x[..., None, :]) @ np.swapaxes(v, -1, -2)

    def a_space(y):
        return (u * y[..., None, :]) @ np.swapaxes(u, -1, -2)

    def diagonal(z):
        return np.diagonal(z, axis1=-2, axis2=-1)

    def add(t, pairs, perp):
        """Point entering iterate t: pairs (..., k, k) second moments of (UᵀδXV)ᵢₗ, perp (..., k) off the row space."""
        nonlocal var, bias
        var = var + gammas[t] ** 2 * diagonal(pairs)
        if t == steps:
            return
        plus, minus, zero = differences[t]
        sym = 0.5 * (pairs + np.swapaxes(pairs, -1, -2)) * (plus + minus)
        bias = bias + np.where(eye, 0.0, sym).sum(axis=-1) + diagonal(pairs) * diagonal(plus) + 0.5 * perp * zero

    def transpose(z):
        return np.swapaxes(z, -1, -2)

    # Deterministic: the coefficients, safety and eps are applied as float32 scalars (torch's opmath
    # for bfloat16 / float16 / float32 tensors, CPU and CUDA): relative u32 each, the same error
    # in every matrix, so it adds to the mean: |γ_t|·u32·(|a|x + |b|x³ + |c|x⁵) per step and
    # |γ_0|·x_0·2u32 for the normalization.
    u_scalar = UNIT_ROUNDOFF["float32"]
    bias = bias + np.abs(gammas[0]) * s * 2 * u_scalar
    for t, (a, b, c) in enumerate(table):
        x = np.abs(xs[t])
        bias = bias + np.abs(gammas[t + 1]) * u_scalar * x * (abs(a) + x * x * (abs(b) + abs(c) * x * x))
    differences = [_divided_differences(xs[t], table[t:]) for t in range(steps)]
    x0 = x_space(s)
    norm_pairs = eye * (s * s * (3 * uu**2 + m * n * ua**2))[..., None, :]  # one relative scalar error on every x_i
    add(0, norm_pairs + uu**2 * (u2t @ (x0 * x0) @ v2), uu**2 * (u2t @ (x0 * x0) @ v_perp2)[..., 0])
    for t, (a, b, c) in enumerate(table):
        x = xs[t]
        xm = x_space(x)
        am = a_space(x * x)
        pm = a_space(x**4)
        bm = a_space(b * x * x + c * x**4)
        bx = x_space((b * x * x + c * x**4) * x)
        abs_x = np.abs(xm)
        x2 = x * x
        pair_h = {"A": b + c * (x2[..., :, None] + x2[..., None, :]), "P": c, "1": 1.0}
        a_terms = [(am, "A", (abs_x @ transpose(abs_x), n)), (pm, "P", (np.abs(am) @ np.abs(am), m)),
                   (b * am, "1", None), (c * pm, "1", None), (bm, "1", None)]
        for value, h, acc in a_terms:
            moments = uu**2 * (u2t @ (value * value) @ u2)
            if acc is not None:
                moments += ua**2 * (acc[1] - 1) * (u2t @ acc[0] ** 2 @ u2)
            add(t + 1, 2 * moments * (pair_h[h] * x[..., None, :]) ** 2, np.zeros_like(s))
        for value, acc in [(bx, (np.abs(bm) @ abs_x, m)), (a * xm, None), (x_space(xs[t + 1]), None)]:
            squares = uu**2 * value * value
            if acc is not None:
                squares = squares + ua**2 * (acc[1] - 1) * acc[0] ** 2
            add(t + 1, u2t @ squares @ v2, (u2t @ squares @ v_perp2)[..., 0])
    return var, bias


def ns_rounding_variances(sigma_hat: np.ndarray, u: np.ndarray, v: np.ndarray, coefficients, dtype) -> np.ndarray:
    """The variance proxies of ``ns_rounding_moments`` alone. Shapes: -> (k,) float64."""
    return ns_rounding_moments(sigma_hat, u, v, coefficients, dtype)[0]


def oracle_deviation_allowance(sigma_hat: np.ndarray, shape: tuple[int, int], coefficients) -> np.ndarray:
    """A deterministic allowance for the float64 oracle's own error in dᵢ (not random, so added to
    the threshold, not to the variance): the SVD's singular values are backward stable
    (|σ̃ − σ| ≲ (m + n)·u64·σ_max per value, LAPACK), carried by f′ ≤ ``ns_diagonal_gain``; the
    projection uᵢᵀXvᵢ sums mn products (≲ mn·u64·max|f|). Shapes: (..., k) -> (..., k)."""
    m, n = shape
    s = np.asarray(sigma_hat, dtype=np.float64)
    gain = ortho_ref.ns_diagonal_gain(s, coefficients)
    return (2.0 * (m + n) * gain + m * n * (1.0 + np.abs(ortho_ref.ns_polynomial(s, coefficients)))) * U64


def ns_mean_deviation_tolerances(variances: np.ndarray, allowances: np.ndarray,
                                 probability: float = FALSE_ALARM_PROBABILITY, count: int | None = None) -> np.ndarray:
    """Thresholds for the mean over J matrices of dᵢⱼ, per direction i:

        tᵢ = λ·√(Σ_j vᵢⱼ)/J + mean_j aᵢⱼ,   λ = hoeffding_lambda(probability, count),

(aᵢⱼ: deterministic allowances, the second-order bias bounds of ``ns_rounding_moments`` and the
oracle's ``oracle_deviation_allowance``),

    count = the number of directions tested together (default k): the J matrices are drawn
    independently, so Σ_j dᵢⱼ is a linear form in independent roundings with proxy Σ_j vᵢⱼ,
    and with the Bonferroni λ the probability that any of the count directions exceeds its
    threshold under the model is ≤ ``probability``.
    Shapes: variances, allowances (J, k) -> (k,).
    Raises: ValueError naming variances for mismatched or empty shapes."""
    v = np.atleast_2d(np.asarray(variances, dtype=np.float64))
    a = np.atleast_2d(np.asarray(allowances, dtype=np.float64))
    if v.shape != a.shape or v.size == 0:
        raise ValueError(f"variances: expected a non-empty (J, k) array shaped as allowances, got {v.shape} and "
                         f"{a.shape}")
    lam = hoeffding_lambda(probability, v.shape[1] if count is None else count)
    return lam * np.sqrt(v.sum(axis=0)) / v.shape[0] + a.mean(axis=0)


#: Public name of ``_divided_differences`` (``ortho_verify.tolerances.optimizer_statistical``'s
#: second-order bound of the roundings before the kernel uses it).
divided_differences = _divided_differences
