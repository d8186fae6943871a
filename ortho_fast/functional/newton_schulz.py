"""Batched Newton–Schulz orthogonalization on (..., m, n) tensors.

Dtype policy (``newton_schulz(g, dtype=..., out_dtype=...)``):

* The input ``g`` may be any floating dtype. It is cast to the *compute dtype* first, and the
  Frobenius normalization, every step's products and sums, and the transposes all happen in
  the compute dtype (bfloat16 normalizes in bfloat16, exactly as ``torch.optim.Muon``).
* Compute dtypes: ``torch.bfloat16`` (default; torch.optim.Muon, Keller Jordan, nanochat),
  ``torch.float16``, ``torch.float32``, ``torch.float64``, or ``None`` for the input's own
  dtype. bfloat16 / float16 matmuls accumulate in float32 and round each output once (CPU
  and CUDA kernels); float16 has the range [6e-8, 65504], so singular values of the
  normalized input below ~6e-8·‖G‖_F flush towards zero (the odd polynomial keeps 0 at 0).
* Megatron / NVIDIA Emerging-Optimizers ``fp32_matmul_prec`` names are accepted as compute
  dtypes: ``"medium"`` runs in bfloat16 (Emerging-Optimizers casts to bfloat16 for "medium";
  it normalizes in float32 before the cast, we normalize after it, as torch.optim.Muon),
  ``"high"`` runs in float32 with ``torch.set_float32_matmul_precision("high")`` (TF32 on CUDA;
  process-global while the call runs, then restored, as Emerging-Optimizers'
  ``fp32_matmul_precision`` context), ``"highest"`` in float32 with full-precision matmuls.
* The result is cast to ``out_dtype`` (default: the input dtype) once, at the end.
"""

from __future__ import annotations

import contextlib
import math

import torch

from ..coefficients import CoefficientsLike, resolve_coefficients
from ..documents import doc_reference
from ..validation import check_hyper, check_matrix_tensor

COMPUTE_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
#: Megatron / Emerging-Optimizers ``fp32_matmul_prec`` -> (compute dtype, float32 matmul precision).
MATMUL_PRECISIONS = {
    "medium": (torch.bfloat16, None),
    "high": (torch.float32, "high"),
    "highest": (torch.float32, "highest"),
}
EPS_MODES = ("add", "clamp")
#: Gram Newton–Schulz recomputes its Gram matrix from X before every step i > 0 with
#: i % GRAM_RESTART_EVERY == 0 (steps 2, 4, ...; ``gram_restarts``). microsoft/dion and Dao AI Lab's
#: gram-newton-schulz restart once, before step 2 (``gram_newton_schulz_reset_iterations=[2]``); in
#: float32 that fails the judge's statistical check (``ns_mean_deviation``) for the cesista5 and you6
#: schedules (3.2–3.6× and 5.3–7.5× the threshold, 256 matrices of 40 × 24 / 48 × 24 / 24 × 72), and in
#: float16 its per-direction rows for you6 (2.0× on a 28 × 12 flat spectrum); restarting every second
#: step passes both (at most 0.63× and 0.33× for each of the six schedules in ``COEFFICIENTS``).
GRAM_RESTART_EVERY = 2
#: Automatic Gram Newton–Schulz (``gram=None``) from this aspect ratio max(m, n) / min(m, n) up:
#: below it the (m×m)³ products cost more than the m²n products they save (docs/performance.md).
GRAM_MIN_ASPECT = 2.0
#: Compute dtypes where ``gram=True`` is accepted: the judge passes Gram Newton–Schulz there under
#: its Gram rounding model with the restarts of ``gram_restarts`` (float16: every default input of
#: ``check_orthogonalizer`` for the six schedules of ``COEFFICIENTS``, worst 0.33× the tolerance (you6),
#: and within the standard *bfloat16* model that the default kernel is held to, worst 0.16×).
#: bfloat16 is left out: its Gram model makes no claim on 63 of the 79 default rows for polar_express
#: (an inconclusive verdict), and against the standard bfloat16 model it fails for jordan (1.69×) and
#: you6 (2.84×) (docs/performance.md, "Gram Newton–Schulz").
GRAM_DTYPES = (torch.float16, torch.float32, torch.float64)
#: Compute dtypes where ``gram=None`` (automatic) chooses Gram Newton–Schulz: float32 / float64.
#: float16 is opt-in (``gram=True``): its speed against bfloat16's standard steps is a GPU question,
#: not measured here (benchmarks/gpu.py ``gram_section``).
GRAM_AUTO_DTYPES = (torch.float32, torch.float64)


def gram_restarts(steps: int) -> tuple[int, ...]:
    """The 0-based steps before which ``gram_iterate`` recomputes R from X (X ← QX, R ← XXᵀ) for a
    table of ``steps`` rows: every ``GRAM_RESTART_EVERY``-th step after the first, (2, 4) for five
    steps. What a judge declares as the kernel's ``restarts`` (``ortho_verify.check_orthogonalizer(...,
    form="gram", restarts=gram_restarts(steps))``)."""
    return tuple(range(GRAM_RESTART_EVERY, steps, GRAM_RESTART_EVERY))



def resolve_compute_dtype(dtype, input_dtype: torch.dtype | None = None) -> tuple[torch.dtype | None, str | None]:
    """Map a compute-dtype setting to (torch dtype, float32 matmul precision or None).

    ``dtype``: one of ``COMPUTE_DTYPES``, a key of ``MATMUL_PRECISIONS`` ("medium", "high",
    "highest"), or None (the input's dtype; returned as ``input_dtype``).
    Source: torch.optim.Muon (bfloat16 Newton–Schulz); Megatron / NVIDIA Emerging-Optimizers
    ``fp32_matmul_prec`` ("medium" casts to bfloat16, "high" TF32, "highest" full float32).
    Raises: TypeError naming ``dtype`` for anything else.
    """
    if dtype is None:
        return input_dtype, None
    if isinstance(dtype, str) and dtype in MATMUL_PRECISIONS:
        return MATMUL_PRECISIONS[dtype]
    if isinstance(dtype, str) or dtype not in COMPUTE_DTYPES:
        raise TypeError(f"dtype: expected one of {COMPUTE_DTYPES}, None or {sorted(MATMUL_PRECISIONS)}, got {dtype!r}")
    return dtype, None


@contextlib.contextmanager
def float32_matmul_precision(precision: str):
    """Set ``torch.set_float32_matmul_precision`` for the duration of the block (restored after,
    also on error). Process-global, as Emerging-Optimizers' ``fp32_matmul_precision`` context."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def quintic_step(x: torch.Tensor, a: float, b: float, c: float) -> torch.Tensor:
    """One Newton–Schulz step X <- aX + (bA + cA²)X with A = XXᵀ, on (m, n) or (batch, m, n) with m <= n.

    Shapes: x (m, n) or (batch, m, n), m <= n (the wide side) -> the same shape and dtype.

    Written with addmm / baddbmm as in torch.optim.Muon, so that 2-D bf16 inputs give the
    same bits as torch's implementation.
    """
    if x.ndim == 2:
        gram = x @ x.T
        update = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        return torch.addmm(x, update, x, beta=a)
    gram = torch.bmm(x, x.mT)
    if c == 0.0:
        # torch's CPU baddbmm in bf16/fp16 returns ``gram`` unscaled when alpha == 0 for
        # matrices of 13 x 13 and up (beta ignored; measured on torch 2.13): scale directly.
        update = gram * b
    else:
        update = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
    return torch.baddbmm(x, update, x, beta=a)


def quintic_step_stacked(x: torch.Tensor, a: float, b: float, c: float, *, tall: bool) -> torch.Tensor:
    """One Newton–Schulz step on a contiguous (batch, m, n) stack, without transposing it: for a
    wide stack X <- (aI + bA + cA²) X with A = X Xᵀ (m × m), for a tall one X <- X (aI + bA + cA²)
    with A = Xᵀ X (n × n) — the same map (A is symmetric), on the small side either way.

    The last product is ``baddbmm(X, X, P, beta=a)`` (tall) / ``baddbmm(X, P, X, beta=a)`` (wide):
    a·X is added in the product's accumulation, as torch.optim.Muon's ``addmm`` does. Adding a·I to
    the diagonal of P in the compute dtype instead (one plain ``bmm``, a pass less) rounds a + P_ii
    to bfloat16's spacing near a (2^-6 at a = 3.4445): a systematic error of the step's linear
    coefficient that the judge's statistical check (``ns_mean_deviation``) measured at 1.3x its
    false-alarm threshold on 256 bf16 matrices of 40 × 24.
    Shapes: x (batch, m, n) -> (batch, m, n), x's dtype. Source: Keller Jordan's
    ``zeropower_via_newtonschulz5`` (the step); the small-side Gram matrix as in
    torch.optim.Muon's transpose of tall inputs.
    """
    gram = torch.bmm(x.mT, x) if tall else torch.bmm(x, x.mT)
    if c == 0.0:  # baddbmm's alpha == 0 quirk (see ``quintic_step``)
        poly = gram * b
    else:
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
    return torch.baddbmm(x, x, poly, beta=a) if tall else torch.baddbmm(x, poly, x, beta=a)


def use_gram(gram: bool | None, m: int, n: int, compute_dtype: torch.dtype, precision: str | None = None) -> bool:
    """Whether an (m, n) matrix takes Gram Newton–Schulz: ``gram`` itself when set; None (auto):
    the compute dtype is in ``GRAM_AUTO_DTYPES``, the float32 products are not TF32 (``precision`` not
    "high") and max(m, n) >= ``GRAM_MIN_ASPECT``·min(m, n)."""
    if gram is None:
        return (compute_dtype in GRAM_AUTO_DTYPES and precision != "high"
                and max(m, n) >= GRAM_MIN_ASPECT * min(m, n))
    return gram


def check_gram(gram, compute_dtype: torch.dtype | None, precision: str | None = None) -> bool | None:
    """Validate the ``gram`` setting (None, True or False) for a compute dtype (and float32 matmul
    ``precision``); returns it.
    Raises: TypeError for anything but None / bool; ValueError for ``gram=True`` with a compute
    dtype outside ``GRAM_DTYPES`` (bfloat16: see there) or
    with ``precision="high"`` (TF32 products on CUDA: a 10-bit significand, closer to bfloat16's
    than to float32's; not judged here, no GPU)."""
    if gram is not None and not isinstance(gram, bool):
        raise TypeError(f"gram: expected None (automatic), True or False, got {gram!r}")
    if gram and compute_dtype is not None and compute_dtype not in GRAM_DTYPES:
        raise ValueError(f"gram: Gram Newton–Schulz runs in float16, float32 or float64 only (in {compute_dtype} "
                         f"its error exceeds the Newton–Schulz tolerance; {doc_reference('performance.md')}); got "
                         f"dtype={compute_dtype}")
    if gram and precision == "high":
        raise ValueError("gram: Gram Newton–Schulz needs full float32 products; dtype='high' (TF32 on CUDA) is not "
                         "judged for it (use dtype='highest' or torch.float32)")
    return gram


def _gram_poly(r: torch.Tensor, b: float, c: float) -> torch.Tensor:
    """bR + cR² (``baddbmm``; its alpha == 0 quirk avoided as in ``quintic_step``)."""
    return r * b if c == 0.0 else torch.baddbmm(r, r, r, beta=b, alpha=c)


def add_scaled_exact(m: torch.Tensor, z: torch.Tensor, k: float) -> torch.Tensor:
    """M + k·Z rounded once to M's dtype with k kept in float32 or wider: ``torch.add(m, z,
    alpha=k)``, except for float16 / bfloat16 on the CPU, where that rounds k to the tensor's dtype
    first (torch 2.13: 13,915 of 100,000 float16 sums differed from float32 scalar arithmetic; a
    fixed error in every matrix, which the judge's Gram ``ns_mean_deviation`` row measured), so
    the sum is formed in float32 there and cast once. Shapes: m, z the same."""
    if m.device.type == "cpu" and m.dtype in (torch.float16, torch.bfloat16):
        return torch.add(m.float(), z.float(), alpha=k).to(m.dtype)
    return torch.add(m, z, alpha=k)


def gram_iterate(x: torch.Tensor, table, *, tall: bool, restarts=None) -> torch.Tensor:
    """The Newton–Schulz steps of ``table`` on a normalized (batch, m, n) or (m, n) X, run on the
    small side's Gram matrix (Gram Newton–Schulz).

    Every step multiplies X by a polynomial in its Gram matrix R = X Xᵀ (wide; XᵀX tall), so
    after steps 0…k, X_k = Q X₀ (tall: X₀ Q) with Q = Π (aᵢI + Zᵢ), Zᵢ = bᵢRᵢ + cᵢRᵢ², and
    R_{i+1} = (aᵢI + Zᵢ) Rᵢ (aᵢI + Zᵢ): the loop carries R and Q (small × small) and touches
    the m × n matrix only to form R, at the restarts (every ``GRAM_RESTART_EVERY`` steps: X ← Q X and R recomputed,
    which bounds the drift of R) and at the end. With small side s and large side l, five steps
    cost about 6s²l + 11s³ multiply-adds against 10s²l + 5s³ for the plain steps (0.92× at
    l = 2s, 0.78× at 4s, 0.6× as l/s grows).
    Q is carried as αI + M with the scalar α = Π aᵢ kept in Python and M holding the polynomial
    part, so no aᵢ is rounded into a diagonal of the compute dtype (the error the judge's
    ``ns_mean_deviation`` found in the stacked step's a·I form); every a·(·) is added in a
    product's accumulation (``baddbmm(…, beta=a)``), and M's update aM + αZ + ZM is
    ``baddbmm(M + (α/a)Z, Z, M, beta=a)``: two roundings (aM, αZ and their sum rounded apart: the
    float16 kernel's worst judged ratio 0.57×, against 0.33× in this form; you6). Shapes: x (batch, m, n) or (m, n) ->
    the same shape and dtype (``tall``: m > n, R = XᵀX). ``restarts``: the steps before which R is
    recomputed (None: every ``GRAM_RESTART_EVERY``-th; ``(2,)`` is microsoft/dion's single restart).
    Accuracy: within ``ortho_verify.tolerances.ns_tolerance`` of ``ortho_ref.ns_map`` in float32 and
    float64 on every default input of ``check_orthogonalizer``; in float16 within the judge's Gram
    model (``ns_gram_singular_value_tolerances`` with these restarts; ``check_orthogonalizer(...,
    form="gram", restarts=gram_restarts(T))``); in bfloat16 not (6 rows at 1.7× the standard bfloat16
    tolerance on geometric spectra with these restarts, 12 rows up to 2.4× with one restart, 58 rows
    without), and its Gram model makes no claim on many inputs: hence ``GRAM_DTYPES``.
    float16 range: X is normalized (‖X‖₂ ≤ ‖X‖_F ≤ 1), so |R_ij| ≤ 1, and every later R is the square
    of an intermediate singular value (≤ 2² for polar_express's first step on [0, 1], ≤ 1.3² for the
    other registered schedules); ‖Z‖₂ = max |br + cr²| along the trajectory (≤ 8 for them) and ‖Q‖₂ ≈
    Π aᵢ over the steps since the last restart (33 for polar_express's first two): far below 65504.
    Entries below 6e-5 are subnormal and below 2⁻²⁴ round to 0 or 2⁻²⁴: an absolute error of at most
    2⁻²⁵ per entry, below the judge's per-product roundoff 2⁻¹¹·‖R‖₂ (‖R‖₂ = σ̂²_max, near 1).
    Products accumulate in float32 and round once (``bmm`` / ``baddbmm`` in float16 on CPU and CUDA; CUDA's
    ``allow_fp16_reduced_precision_reduction`` may split the sum in float16 for some shapes);
    α stays a Python float, and the restarts recompute R from X.
    Source: Gram Newton–Schulz as in microsoft/dion's optional ``use_gram_newton_schulz`` kernel
    (which restarts once, after step 2); the recurrence written here from the polynomial view (Amsel et al.
    2025, arXiv 2505.16932, Sec. 2).
    """
    if x.ndim == 2:
        return gram_iterate(x.unsqueeze(0), table, tall=tall, restarts=restarts).squeeze(0)
    if restarts is None:
        restarts = gram_restarts(len(table))
    restarts = frozenset(i for i in restarts if i > 0)

    def gram(y: torch.Tensor) -> torch.Tensor:
        return torch.bmm(y.mT, y) if tall else torch.bmm(y, y.mT)

    def apply(y: torch.Tensor, alpha: float, m: torch.Tensor | None) -> torch.Tensor:  # (αI + M) applied to y
        if m is None:
            return y if alpha == 1.0 else y * alpha
        return torch.baddbmm(y, y, m, beta=alpha) if tall else torch.baddbmm(y, m, y, beta=alpha)

    r, alpha, m = gram(x), 1.0, None
    last = len(table) - 1
    for i, (a, b, c) in enumerate(table):
        if i in restarts:
            x = apply(x, alpha, m)
            r, alpha, m = gram(x), 1.0, None
        z = _gram_poly(r, b, c)
        if m is None:  # Q = αI -> (aI + Z)·αI = aαI + αZ
            m = z if alpha == 1.0 else z * alpha
        else:  # (aI + Z)(αI + M) = aαI + (aM + αZ + ZM)
            if a != 0.0:
                s = add_scaled_exact(m, z, alpha / a)  # M + (α/a)Z, one rounding; a·(·) inside the product
                m = torch.baddbmm(s, z, m, beta=a) if not tall else torch.baddbmm(s, m, z, beta=a)
            else:  # a = 0 (a user's row): αZ + ZM
                m = torch.baddbmm(z * alpha, z, m) if not tall else torch.baddbmm(z * alpha, m, z)
        alpha *= a
        if i < last and i + 1 not in restarts:
            rz = torch.baddbmm(r, r, z, beta=a)  # R(aI + Z)
            r = torch.baddbmm(rz, z, rz, beta=a)  # (aI + Z) R (aI + Z)
    return apply(x, alpha, m)


def power_of_two_scale(x: torch.Tensor) -> torch.Tensor:
    """β = 2^e per matrix with max|X| in [2^(e−1), 2^e) (β = 1 for a zero matrix), e capped at
    the dtype's largest finite power of two (then max|X/β| < 2); shape (batch, 1, 1), or ()
    for a 2-D x (a 0-dim tensor takes torch's scalar fast path in the divisions); x's dtype.
    X/β is exact."""
    if x.ndim == 2:  # amax and amin: no |X| temporary (10× faster than an inf-norm; measured
        amax = torch.maximum(x.amax(), -x.amin())  # 48 µs against aminmax's 60 µs on 1024 x 256)
    else:
        amax = x.abs().amax(dim=(-2, -1), keepdim=True)
    largest = math.floor(math.log2(torch.finfo(x.dtype).max))  # 2^largest is finite: 15 for float16
    exponent = torch.frexp(amax).exponent.clamp(max=largest)
    return torch.ldexp(torch.ones_like(amax), exponent)


def normalize_and_iterate(x: torch.Tensor, beta: torch.Tensor, table, safety: float, eps: float,
                          eps_mode: str, gram: bool = False) -> torch.Tensor:
    """Normalize and run the steps on (m, n) or (batch, m, n) with m <= n, in x's dtype.

    ``x`` is X/β already (our own tensor), β = ``power_of_two_scale(X)`` in the input's
    dtype, computed by the caller before the cast to the compute dtype and before any
    transpose. The Frobenius normalization is (X/β) / (s·‖X/β‖_F + eps/β) or
    / max(s·‖X/β‖_F, eps/β), with eps rounded to the compute dtype first (as torch does with
    a Python scalar). Scaling by a power of two commutes with every rounding, so in float32,
    bfloat16 and float64 this gives the same bits as X / (s·‖X‖_F + eps) (the form of
    torch.optim.Muon) whenever no intermediate is subnormal; in float16 entries below
    6e-5·β become subnormal and may differ in their last bits. It stays correct where that
    form fails: ‖X‖_F overflows for ‖X‖_F > 1.8e19 in float32 / bfloat16 (the squares pass
    3.4e38) and above 65504 in float16, and a float32 input above 65504 overflows in the cast
    to float16 — all of which made the result 0 or NaN. ``gram``: the steps by ``gram_iterate``.
    """
    x = frobenius_normalize_(x, beta, safety, eps, eps_mode)
    if gram:  # the steps on the Gram matrix (``gram_iterate``; resolved by the caller)
        return gram_iterate(x, table, tall=False)
    for a, b, c in table:
        x = quintic_step(x, a, b, c)
    return x


def frobenius_normalize_(x: torch.Tensor, beta: torch.Tensor, safety: float, eps: float, eps_mode: str,
                         kept: dict | None = None) -> torch.Tensor:
    """X/β ← (X/β) / (s·‖X/β‖_F + eps/β) (or / max(s·‖X/β‖_F, eps/β)) per matrix, in place, in
    x's dtype; returns x. The normalization of ``normalize_and_iterate`` (see there), shared by
    the stacked path (``newton_schulz_stacked``). Shapes: x (m, n) or (batch, m, n); beta () or
    (batch, 1, 1). ``kept``: a dict keeping eps rounded to x's dtype (a tensor of beta's shape) from call
    to call (a chunk's plan: the same shapes at every step)."""
    if x.dtype in (torch.bfloat16, torch.float16):  # torch.optim.Muon's own norm: bitwise parity
        norm = x.norm() if x.ndim == 2 else torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True)
    else:  # torch's CPU float32 norm accumulates serially: 3.0e-5 relative off on a 1024 x 2048
        # Gaussian, against 2.4e-8 for the cascade summation of sum() (measured)
        norm = x.square().sum(dim=(-2, -1), keepdim=x.ndim > 2).sqrt()
    if safety != 1.0:
        norm = norm * safety
    # eps rounded to x's dtype, divided by β in the promoted dtype of the two (holds both; no float64 on
    # MPS), exact unless it underflows, then back in x's dtype
    key = ("eps", eps, beta.shape, x.dtype, beta.device)
    eps_rounded = kept.get(key) if kept is not None else None
    if eps_rounded is None:
        eps_rounded = torch.full_like(beta, eps, dtype=x.dtype)
        if kept is not None:
            kept[key] = eps_rounded
    eps_scaled = torch.div(eps_rounded, beta).to(x.dtype)
    denom = norm + eps_scaled if eps_mode == "add" else torch.maximum(norm, eps_scaled)
    if eps == 0.0:  # a zero matrix maps to zero (as ns_map), not to 0/0
        denom = torch.where(denom == 0, torch.ones_like(denom), denom)
    return x.div_(denom)  # x is our own tensor here (the division by β made it)


def newton_schulz(
    g: torch.Tensor,
    coefficients: CoefficientsLike = "jordan",
    *,
    steps: int | None = None,
    safety: float = 1.0,
    eps: float = 1e-7,
    dtype: torch.dtype | str | None = torch.bfloat16,
    eps_mode: str = "add",
    out_dtype: torch.dtype | None = None,
    gram: bool | None = None,
) -> torch.Tensor:
    """Odd quintic Newton–Schulz iteration approximating the polar factor of each matrix.

    X₀ = G / (safety·‖G‖_F + eps), then per step (a, b, c): X <- aX + (bA + cA²)X, A = XXᵀ; exactly U f(Σ̂) Vᵀ
    (``ortho_ref.ns_map``) within ``ortho_verify.tolerances.ns_tolerance``. docs/math.md, §2.2b, has the details.

    Parameters
    ----------
    g : (..., m, n) real floating Tensor
        The matrices; any number of leading dims; must not require grad while grad mode is on.
    coefficients, steps : str, CoefficientSchedule, (a, b, c) rows or (T, 3) Tensor, int, default "jordan", None
        A name in ``ortho_fast.COEFFICIENTS``, a schedule or rows; the step count (None: the schedule's).
    safety, eps : float, default 1.0, 1e-7
        The normalization's divisor of ‖G‖_F (> 0; Polar Express 1.02) and its epsilon (≥ 0).
    dtype : torch.dtype or {"medium", "high", "highest"} or None, default torch.bfloat16
        The compute dtype (bfloat16, float16, float32, float64; None: g.dtype; Megatron's precision names).
    eps_mode, out_dtype : {"add", "clamp"}, torch.dtype, default "add", None
        Keller Jordan's / (s‖G‖_F + eps) or torch's / max(s‖G‖_F, eps); the result's dtype (None: g.dtype).
    gram : bool, optional
        Gram Newton–Schulz (``gram_iterate``): None for float32 / float64 compute at aspect ratio ≥ 2.

    Returns
    -------
    (..., m, n) Tensor
        The Newton–Schulz image of ``g``, in ``out_dtype``, on ``g``'s device.

    Raises
    ------
    TypeError, ValueError, UnknownScheduleError
        Naming the argument: a bad ``g`` (non-float, requires grad, < 2 dims, empty), dtype, table or name.

    References
    ----------
    KellerJordan/Muon; torch.optim.Muon; Polar Express, arXiv 2505.16932; Dao-AILab/gram-newton-schulz.

    Examples
    --------
    >>> import torch, ortho_fast
    >>> ortho_fast.newton_schulz(torch.randn(4, 16), "polar_express", safety=1.02, eps=1e-6).shape
    torch.Size([4, 16])
    """
    check_matrix_tensor(g, "g")
    if g.requires_grad and torch.is_grad_enabled():
        raise ValueError("g: requires grad; newton_schulz iterates in place in its own buffers and is not "
                         "differentiable: pass g.detach() (or call it under torch.no_grad())")
    compute_dtype, precision = resolve_compute_dtype(dtype, g.dtype)
    if eps_mode not in EPS_MODES:
        raise ValueError(f"eps_mode: expected one of {EPS_MODES}, got {eps_mode!r}")
    safety = check_hyper(safety, "safety", low_open=True)
    eps = check_hyper(eps, "eps")
    table = resolve_coefficients(coefficients, steps)
    check_gram(gram, compute_dtype, precision)
    if out_dtype is not None and not (isinstance(out_dtype, torch.dtype) and out_dtype.is_floating_point):
        raise TypeError(f"out_dtype: expected None or a real floating torch.dtype (bfloat16/float16/float32/float64), "
                        f"got {out_dtype!r}")
    return newton_schulz_resolved(g, table, safety=safety, eps=eps, eps_mode=eps_mode, compute_dtype=compute_dtype,
                                  precision=precision, out_dtype=out_dtype, gram=gram)


def newton_schulz_resolved(g: torch.Tensor, table, *, safety: float, eps: float, eps_mode: str,
                           compute_dtype: torch.dtype, precision: str | None = None,
                           out_dtype: torch.dtype | None = None, gram: bool | None = None) -> torch.Tensor:
    """``newton_schulz`` with its options already validated and resolved: the step an optimizer
    runs every iteration after checking its options once (``ortho_fast.groups.options``).

    Args: ``table`` the per-step rows ((a, b, c), ...) of ``resolve_coefficients``;
    ``compute_dtype`` / ``precision`` from ``resolve_compute_dtype``; ``safety`` > 0, ``eps`` >= 0,
    ``eps_mode`` in ``EPS_MODES``; ``gram`` as ``newton_schulz`` (``check_gram`` passed). Shapes and
    dtypes as ``newton_schulz``; the same bits. A 2-D input takes torch.optim.Muon's calls
    (``quintic_step``, transposed to the wide side) or ``gram_iterate``; a batch the stacked path
    (``newton_schulz_stacked``).
    Raises: nothing of its own (no checks: pass validated options).
    """
    if g.ndim > 2:  # a batch: the stacked path (no transposes, ``quintic_step_stacked``)
        x = newton_schulz_stacked([g], table, safety=safety, eps=eps, eps_mode=eps_mode,
                                  compute_dtype=compute_dtype, precision=precision, gram=gram)[0]
        return x.to(g.dtype if out_dtype is None else out_dtype)
    m, n = g.shape[-2], g.shape[-1]
    beta = power_of_two_scale(g)  # (), g's dtype: unchanged by the transpose
    # exact; entries below 2 cannot overflow any compute dtype; divided and cast in one pass
    x = torch.div(g, beta, out=torch.empty_like(g, dtype=compute_dtype))  # g's strides, as g / beta
    transpose = m > n  # both kernels then run the very calls of the wide transpose: NS(Gᵀ) = NS(G)ᵀ bit for bit
    if transpose:
        x = x.mT
    gram = use_gram(gram, m, n, compute_dtype, precision)
    if gram:  # Gram Newton–Schulz on a contiguous wide copy: 2048 x 512 float32 took 1.03x the GEMM on the
        x = x.contiguous()  # transposed view against 0.87x for 512 x 2048 (1 thread, measured)
    with float32_matmul_precision(precision) if precision is not None else contextlib.nullcontext():
        x = normalize_and_iterate(x, beta, table, safety, eps, eps_mode, gram)
    if transpose:
        x = x.mT
    return x.to(g.dtype if out_dtype is None else out_dtype)


def newton_schulz_stacked(mats, table, *, safety: float, eps: float, eps_mode: str, compute_dtype: torch.dtype,
                          precision: str | None = None, gram: bool | None = None, workspace=None,
                          stack: torch.Tensor | None = None) -> list[torch.Tensor]:
    """``newton_schulz_resolved`` on k matrices of one shape, stacked into one batch: the fast
    default path of ``ortho_fast.Muon`` (modded-nanogpt / nanochat parameter banks).

    The inputs are concatenated into one (k, m, n) stack in their own dtype (``stack``: that stack
    already, the inputs being its consecutive slices: no copy), each matrix divided by its power
    of two β (``power_of_two_scale``) and cast to the compute dtype in one pass
    (``stacked.scale_and_cast``), in the inputs' own orientation (a transposed write costs 2.6×
    a contiguous one on CPU, and so does reading a transposed result in the update). Then the
    normalization of ``normalize_and_iterate`` and ``quintic_step_stacked``'s products written
    into reused buffers (``stacked.iterate_stack``), or ``gram_iterate`` (``gram`` resolved by
    ``use_gram``). A fixed number of operations whatever k.
    ``workspace``: an ``ortho_fast.functional.stacked.Workspace`` holding the compute-dtype stacks
    and products (None: allocated here); the results are then views of its buffers, valid until
    its next use.
    Shapes: ``mats`` a non-empty sequence of (..., m, n) tensors of one (m, n) and one dtype; the
    result: one (..., m, n) tensor per input in ``compute_dtype`` (views of the stack).
    Contract: per matrix the same function as ``newton_schulz_resolved`` in exact arithmetic; a
    batched ``bmm`` differs from a 2-D ``addmm`` in the last bits (not torch.optim.Muon's bits),
    within ``ortho_verify.tolerances.ns_tolerance`` of ``ortho_ref.ns_map``.
    Source: Keller Jordan's Muon (2024) ``zeropower_via_newtonschulz5`` (batched over leading
    dims); docs/performance.md, "(b)" and "The stacked step".
    Raises: nothing of its own (validated options, as ``newton_schulz_resolved``).
    """
    m, n = mats[0].shape[-2], mats[0].shape[-1]
    flat = [x.reshape(-1, m, n) for x in mats]
    counts = [f.shape[0] for f in flat]
    u = stack if stack is not None else flat[0] if len(flat) == 1 else torch.cat(flat)
    x = newton_schulz_stack(u, table, safety=safety, eps=eps, eps_mode=eps_mode, compute_dtype=compute_dtype,
                            precision=precision, gram=gram, workspace=workspace)
    out, start = [], 0
    for src, k in zip(mats, counts):
        out.append(x[start:start + k].reshape(src.shape))
        start += k
    return out


def newton_schulz_stack(u: torch.Tensor, table, *, safety: float, eps: float, eps_mode: str,
                        compute_dtype: torch.dtype, precision: str | None = None, gram: bool | None = None,
                        workspace=None, overwrite: bool = False) -> torch.Tensor:
    """``newton_schulz_stacked`` on its stack: u (k, m, n) contiguous, any floating dtype -> the
    (k, m, n) result in ``compute_dtype`` (a buffer of ``workspace`` when given). ``overwrite``:
    u is the caller's scratch; in ``compute_dtype`` the iteration starts in it (no copy). Options
    validated by the caller."""
    from .stacked import Workspace, iterate_stack, scale_and_cast

    workspace = Workspace() if workspace is None else workspace
    m, n = u.shape[-2], u.shape[-1]
    tall = m > n
    x = u if overwrite and u.dtype == compute_dtype else workspace.get("stack_a", tuple(u.shape),
                                                                       compute_dtype, u.device)
    kept = getattr(workspace, "cache", None)  # a chunk's ``groups.muon_plan.Replay``: its constants kept
    beta = scale_and_cast(u, x, kept)  # exact division by β, then one cast into the stack
    with float32_matmul_precision(precision) if precision is not None else contextlib.nullcontext():
        x = frobenius_normalize_(x, beta, safety, eps, eps_mode, kept)
        if use_gram(gram, m, n, compute_dtype, precision):
            return gram_iterate(x, table, tall=tall)
        return iterate_stack(x, table, tall=tall, workspace=workspace)
