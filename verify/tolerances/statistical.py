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
P(|Σ_j w_j d_ij| ≥ λ·u·√(Σ_j w_j² Σ_r c²_{ij,r})) ≤ 2 exp(−λ²/2). ``ns_rounding_variances``
computes vᵢⱼ = u² Σ_r c²_{ij,r} from the exact intermediates of the iteration (float64), and
``ns_mean_deviation_tolerances`` the threshold of the mean over J independent matrices with a
Bonferroni λ over the k directions.
"""

from __future__ import annotations

import math

import numpy as np

import ortho_ref
from ortho_verify.tolerances.roundoff import U64, UNIT_ROUNDOFF, unit_roundoff

__all__ = [
    "FALSE_ALARM_PROBABILITY", "STATISTICAL_DTYPES", "STATISTIC_FIRST_ORDER_LIMIT", "accumulation_roundoff",
    "hoeffding_lambda", "ns_mean_deviation_tolerances", "ns_rounding_variances", "oracle_deviation_allowance",
]

#: False-alarm probability of one statistical check (one row: every direction of one batch).
FALSE_ALARM_PROBABILITY = 1e-6

#: The dtypes the statistical model covers: the kernel rounds at u per stored result.
STATISTICAL_DTYPES = ("bfloat16", "float16", "float32")

#: A direction enters the statistic only while one matrix's probabilistic radius
#: λ₁·√vᵢⱼ (λ₁ = ``hoeffding_lambda(p, 1)``) is at most this: the first-order model neglects
#: O(u²) terms, which stay small next to the first-order ones only while the rounding moves the
#: output's singular value by a small fraction of its O(1) size (the same limit of 0.1 as the
#: Dion tolerances' ``FIRST_ORDER_LIMIT``).
STATISTIC_FIRST_ORDER_LIMIT = 0.1


def hoeffding_lambda(probability: float = FALSE_ALARM_PROBABILITY, count: int = 1) -> float:
    """λ with count · 2 exp(−λ²/2) = probability: the two-sided Azuma–Hoeffding multiplier for
    ``count`` statistics tested at once (Bonferroni), each sub-Gaussian with the variance
    proxies of ``ns_rounding_variances``. λ(1e-6, 1) = 5.39, λ(1e-6, 16) = 5.88.
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


def _quadratic(left2: np.ndarray, m2: np.ndarray, right2: np.ndarray) -> np.ndarray:
    """Σ_pq left[p, i]² M_pq² right[q, i]² for every i (the squares given)."""
    return np.einsum("pi,pq,qi->i", left2, m2, right2)


def ns_rounding_variances(sigma_hat: np.ndarray, u: np.ndarray, v: np.ndarray, coefficients, dtype) -> np.ndarray:
    """Variance proxies vᵢ = u²Σ_r c²_{i,r} of dᵢ = uᵢᵀX̃vᵢ − f(σ̂ᵢ) for one matrix (see the module).

    Rounding points counted, per step X ← aX + (bA + cA²)X on the wide side (A = XXᵀ): the
    stored A = XXᵀ, P = AA, bA, cP, B = bA + cP, BX, aX and X' = aX + BX (the union of
    torch.optim.Muon's ``b*A + c*A@A`` / ``a*X + B@X`` and the fused ``addmm`` / ``baddbmm``
    forms: a kernel that rounds fewer intermediates has a smaller variance); before the steps
    the Frobenius norm (a scalar relative rounding, its safety product and eps sum, and the
    accumulation of mn squares) and the division. A rounding of M in the step-t
    computation reaches the output's direction i with the factor γᵢₜ = ∂x_T/∂x_t (signed
    product of p_s′ along the exact trajectory) times 1 for an (m, n) term and xᵢ·h for an
    (m, m) one (h = b + 2c xᵢ² for A, c for P, 1 for bA, cP, B). Products add the
    accumulation's roundings: length L sums in ``accumulation_roundoff`` u_a give each entry a
    proxy ≤ u_a²(L − 1)(|L||R|)_pq². Symmetric (m, m) results have E_pq = E_qp (one dot
    product computed twice the same way): their proxy is doubled (uᵢᵀEuᵢ counts the pair twice).
    No underflow or overflow (float16: entries of the normalized iterates ≥ 6.1e-5).

    Shapes: sigma_hat (k,) the normalized singular values (descending, as ``ortho_ref.svd``);
    u (m, k), v (n, k) the input's singular vectors; -> (k,) float64.
    Source: Higham & Mary 2019 (SIAM J. Sci. Comput. 41(5)), Model 2.1 and Lemma 2.2; Higham,
    *Functions of Matrices*, Thm. 3.11 (the diagonal of the Fréchet derivative).
    Raises: ValueError for a dtype outside ``STATISTICAL_DTYPES`` or mismatched shapes.
    """
    name = str(dtype).replace("torch.", "")
    if name not in STATISTICAL_DTYPES:
        raise ValueError(f"dtype: the statistical model covers {STATISTICAL_DTYPES}, got {dtype!r}")
    s = np.asarray(sigma_hat, dtype=np.float64)
    k = len(s)
    if u.shape[1] != k or v.shape[1] != k:
        raise ValueError(f"u, v: expected k = {k} columns, got {u.shape} and {v.shape}")
    if u.shape[0] > v.shape[0]:  # the iteration runs on the wide side
        u, v = v, u
    m, n = u.shape[0], v.shape[0]
    uu, ua = unit_roundoff(name), accumulation_roundoff(name)
    table = ortho_ref.schedule(coefficients) if isinstance(coefficients, str) else coefficients
    table = np.atleast_2d(np.asarray(table, dtype=np.float64))
    xs = [s]
    derivatives = []
    for a, b, c in table:
        y = xs[-1]
        derivatives.append(a + y * y * (3 * b + 5 * c * y * y))
        xs.append(y * (a + y * y * (b + c * y * y)))
    steps = len(table)
    gammas = [np.ones(k) for _ in range(steps + 1)]  # gammas[t] = ∂x_T/∂x_t
    for t in range(steps - 1, -1, -1):
        gammas[t] = gammas[t + 1] * derivatives[t]
    u2, v2 = u * u, v * v

    def x_space(x):
        return (u * x) @ v.T

    def a_space(y):
        return (u * y) @ u.T

    # Normalization: X₀ = G/N with a relative error of N (rounding, safety product, eps sum,
    # accumulation of mn squares) and the rounded division.
    x0 = x_space(s)
    var = (gammas[0] * s) ** 2 * (3 * uu**2 + m * n * ua**2)
    var += gammas[0] ** 2 * uu**2 * _quadratic(u2, x0 * x0, v2)
    for t, (a, b, c) in enumerate(table):
        x, g = xs[t], gammas[t + 1]
        xm = x_space(x)
        am = a_space(x * x)
        pm = a_space(x**4)
        bm = a_space(b * x * x + c * x**4)
        bx = x_space((b * x * x + c * x**4) * x)
        abs_x = np.abs(xm)
        a_terms = [  # (exact stored value, factor h, accumulation: (|L||R|, length) or None)
            (am, b + 2 * c * x * x, (abs_x @ abs_x.T, n)),
            (pm, c * np.ones(k), (np.abs(am) @ np.abs(am), m)),
            (b * am, np.ones(k), None),
            (c * pm, np.ones(k), None),
            (bm, np.ones(k), None),
        ]
        for value, h, acc in a_terms:
            proxy = uu**2 * _quadratic(u2, value * value, u2)
            if acc is not None:
                proxy += ua**2 * (acc[1] - 1) * _quadratic(u2, acc[0] ** 2, u2)
            var += (g * x * h) ** 2 * 2 * proxy
        x_terms = [(bx, (np.abs(bm) @ abs_x, m)), (a * xm, None), (x_space(xs[t + 1]), None)]
        for value, acc in x_terms:
            proxy = uu**2 * _quadratic(u2, value * value, v2)
            if acc is not None:
                proxy += ua**2 * (acc[1] - 1) * _quadratic(u2, acc[0] ** 2, v2)
            var += g**2 * proxy
    return var


def oracle_deviation_allowance(sigma_hat: np.ndarray, shape: tuple[int, int], coefficients) -> np.ndarray:
    """A deterministic allowance for the float64 oracle's own error in dᵢ (not random, so added to
    the threshold, not to the variance): the SVD's singular values are backward stable
    (|σ̃ − σ| ≲ (m + n)·u64·σ_max per value, LAPACK), carried by f′ ≤ ``ns_diagonal_gain``; the
    projection uᵢᵀXvᵢ sums mn products (≲ mn·u64·max|f|). Shapes: (k,) -> (k,)."""
    m, n = shape
    s = np.asarray(sigma_hat, dtype=np.float64)
    gain = ortho_ref.ns_diagonal_gain(s, coefficients)
    return (2.0 * (m + n) * gain + m * n * (1.0 + np.abs(ortho_ref.ns_polynomial(s, coefficients)))) * U64


def ns_mean_deviation_tolerances(variances: np.ndarray, allowances: np.ndarray,
                                 probability: float = FALSE_ALARM_PROBABILITY, count: int | None = None) -> np.ndarray:
    """Thresholds for the mean over J matrices of dᵢⱼ, per direction i:

        tᵢ = λ·√(Σ_j vᵢⱼ)/J + mean_j aᵢⱼ,   λ = hoeffding_lambda(probability, count),

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
