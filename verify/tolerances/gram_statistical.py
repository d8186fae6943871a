"""Statistical tolerances of a low-precision *Gram* Newton–Schulz kernel (float16, float32): the rounding
moments of dᵢ = uᵢᵀ X̃ vᵢ − f(σ̂ᵢ) under the Gram recurrence, for the row ``ns_mean_deviation`` with
``form="gram"`` (docs/tolerances.md, "Statistical checks of Gram kernels").

numpy and ``ortho_ref`` only.

The kernel (Dao AI Lab's gram-newton-schulz, microsoft/dion's ``use_gram_newton_schulz``,
``ortho_fast``'s ``gram_iterate``) runs on the small side: R = XXᵀ, per step Z = bR + cR²,
Q ← (aI + Z)Q, R_z ← R(aI + Z), R ← (aI + Z)R_z, and touches X only at the declared restarts (X ← QX,
R ← XXᵀ, Q ← I) and at the end (X ← QX). In exact arithmetic every intermediate is diagonal in the
input's singular basis (R = U diag(r) Uᵀ, Q = U diag(q) Uᵀ, X = U diag(x) Vᵀ), and one direction
follows the scalar recurrence of ``gram_rounding_points`` (its *nodes*: x₀, R, Z, Q, R_z, R, restart
X, final X).

**First order.** A rounding E of a stored intermediate M of node p (an m × m or m × n matrix) enters
the rest of the computation as a perturbation of that node. Every later operation is a product of
matrices diagonal in the singular basis, and a product D₁ F D₂ has entry (i, l) = d₁ᵢ F_il d₂ₗ, so
the diagonal entry F_ii = (UᵀEW)_ii (W = U for m × m nodes, V for m × n) reaches the output's
(i, i) entry multiplied by the derivative of the scalar recurrence at that node, gₚᵢ = ∂x_T/∂eₚ
(``gram_point_gains``, a complex-step derivative; at R = XXᵀ, δR_ii = 2xᵢ(UᵀδXV)_ii, which is the
recurrence's own r ← x², so restarts are covered). Hence, with every rounding fl(y) = y(1 + δ), the
δ independent, mean zero, |δ| ≤ u (Higham & Mary 2019, Model 2.1),

    dᵢ = Σ_p gₚᵢ · fₚ · Σ_{st} uₛᵢ M_st w_tᵢ δ_st + O(u²)

(fₚ: the factor from the rounded intermediate to the node, c for R² inside Z, a for ortho_fast's
M + (α/a)Z inside Q), a linear form with mean 0, and the Azuma–Hoeffding threshold of
``ns_mean_deviation_tolerances`` applies with the variance proxy vᵢ = Σ_p gₚᵢ² fₚ² E(UᵀEW)ᵢᵢ²,
E(UᵀEW)ᵢₗ² ≤ h·u²·Σ_st u²ₛᵢ M²_st w²_tₗ + h·u_a²·L·Σ_st u²ₛᵢ (|A||B|)²_st w²_tₗ (products A·B of
inner length L accumulated at ``accumulation_roundoff`` u_a; h = 2 for the symmetric m × m results,
which bounds the proxy whatever the correlation of the roundings of entries (s, t) and (t, s):
(x + y)² ≤ 2x² + 2y²). This is an upper bound on Σ c² when a kernel rounds a subset of the counted
intermediates (a looser proxy keeps the false-alarm probability ≤ the stated one).

**Rounded intermediates counted** (the fused ``baddbmm`` forms of Dao AI Lab's and ortho_fast's
kernels, and the unfused Z of a ``b*R + c*(R@R)`` kernel): X₀ (the division; and the norm, its
safety product and eps sum, a relative scalar on every direction as in ``ns_rounding_moments``);
R = XXᵀ; R², bR, cR², Z; Q's update stored as Q or as its polynomial part Q − αI (ortho_fast keeps
α = Π a in Python; the entrywise larger of the two), and ortho_fast's M + (α/a)Z; R_z; R; the restart
and final QX. A kernel that stores a·Q and Z·Q apart (unfused updates) rounds more than this.

**Second order** (the mean, added to the threshold as in the standard model): a second-order term
of the (i, i) output entry is a product of two entries of one node's perturbation F (cross terms of
different roundings have mean 0) along a chain through row / column i: F_il F_li, F_il², F_li²
(l ≠ i), F_ii² and, for m × n nodes, F_ic² with c off the row space. So it involves directions i
and l only, and its coefficients Hᵢₗ are second derivatives of the recurrence run on 2 × 3 matrices
(rows i, l; columns i, l and one column off the row space, ``_pair_walk``): exact up to the central
difference's O(h²) with h = 1e-4 in float64 (~1e-8 relative). The mean is bounded by
½|H_ii|E F_ii² + Σ_l (½|H_il,il| E F_il² + ½|H_li,li| E F_li² + |H_il,li| √(E F_il² E F_li²)) +
½|H_⊥| E⊥ᵢ per node. H depends on the spectrum only: it is evaluated at the corners and centre of
the box [min, max] of σ̂ᵢ, σ̂ₗ over the batch (matrices of one spectrum differ by the input's rounding)
and at every matrix when that box is wider than ``BOX_SPREAD``. Third order is neglected; the
directions kept are those with √vᵢ ≤ ``STATISTIC_FIRST_ORDER_LIMIT`` (the standard model's limit).
Deterministic: the scalars a, b, c, α, α/a, safety, eps applied in float32 (torch's opmath) add
Σ_p |gₚᵢ|·u32·Sₚᵢ + |g₀ᵢ|·σ̂ᵢ·2u32 (Sₚ the node's term magnitudes, ``gram_point_gains``); two constants
a kernel may hold in its own dtype, the same in every matrix, add their exact rounding errors at the
Q nodes: |gₚᵢ|·|fl(a) − a| (the aI of Q = aI + Z after a (re)start, Dao AI Lab's kernel) and
|gₚᵢ|·|a|·|fl(α/a) − α/a|·|zᵢ| (α/a, which torch's CPU ``add`` rounds to float16 as its ``alpha``
argument: a kernel forming M + (α/a)Z that way, as ortho_fast's did), fl the dtype's rounding (``round_to_dtype``; plus
u32 of the constant for a float32 step before it: torch's opmath).
No underflow or overflow (float16: the default statistical batch's entries are normal).
"""

from __future__ import annotations

import numpy as np

import ortho_ref

from .newton_schulz import gram_point_gains, validate_restarts
from .roundoff import UNIT_ROUNDOFF, unit_roundoff
from .statistical import STATISTICAL_DTYPES, accumulation_roundoff

__all__ = ["BOX_SPREAD", "GRAM_SECOND_ORDER_STEP", "SIGNIFICAND_BITS", "gram_node_kinds", "gram_pair_curvatures",
           "gram_rounding_moments", "round_to_dtype"]

#: The relative width of the box of σ̂ over a batch up to which the second-order coefficients are taken
#: at its corners and centre (matrices of one spectrum differ by the input's rounding, ≤ 2⁻¹¹ relative
#: in float16); wider batches get them per matrix.
BOX_SPREAD = 1e-2

#: Central-difference step of ``gram_pair_curvatures`` (absolute, on nodes of size ~1e-2 to 1e2): its
#: truncation O(h²) and float64 rounding O(u64/h²) are both ~1e-8 relative.
GRAM_SECOND_ORDER_STEP = 1e-4


#: Significand bits (the implicit one included) of the dtypes a kernel may hold a scalar in.
SIGNIFICAND_BITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}


def round_to_dtype(value: float, dtype: str) -> float:
    """``value`` rounded to nearest (ties to even) in ``dtype``'s significand, as a cast of a normal
    number does (float16: 11 bits, bfloat16: 8, float32: 24). The exact deterministic error of a
    constant a kernel holds in that dtype."""
    if value == 0.0 or not np.isfinite(value):
        return float(value)
    mantissa, exponent = np.frexp(value)
    bits = SIGNIFICAND_BITS[dtype]
    return float(np.ldexp(np.round(mantissa * 2.0**bits), int(exponent) - bits))


def gram_node_kinds(table, restarts=()) -> list[tuple[str, int]]:
    """(kind, step) of every node of ``gram_rounding_points`` in its order: "x0", "r" (R = XXᵀ, at the
    start and at restarts), "z", "q", "rz", "rr" (R's update), "x" (restart X ← QX), "xT" (the end)."""
    out = [("x0", -1), ("r", -1)]
    last = len(table) - 1
    for i in range(len(table)):
        if i in restarts:
            out += [("x", i), ("r", i)]
        out += [("z", i), ("q", i)]
        if i < last and i + 1 not in restarts:
            out += [("rz", i), ("rr", i)]
    return out + [("xT", last)]


def _trajectory(s: np.ndarray, table, restarts) -> list[dict]:
    """Per node the exact per-direction values the rounded intermediates are built from (elementwise on
    s): x, r, z, q, α (a float), and the step's coefficients."""
    x, r, q, alpha = s, s * s, np.ones_like(s), 1.0
    nodes = [dict(kind="x0", x=x), dict(kind="r", x=x, r=r)]
    last = len(table) - 1
    for i, (a, b, c) in enumerate(table):
        if i in restarts:
            nodes.append(dict(kind="x", x=x, q=q, alpha=alpha))
            x, q, alpha = q * x, np.ones_like(s), 1.0
            r = x * x
            nodes.append(dict(kind="r", x=x, r=r))
        z = b * r + c * r * r
        nodes.append(dict(kind="z", r=r, z=z, a=a, b=b, c=c))
        nodes.append(dict(kind="q", z=z, q=q, alpha=alpha, a=a))
        q, alpha = (a + z) * q, alpha * a
        if i < last and i + 1 not in restarts:
            rz = (a + z) * r
            nodes.append(dict(kind="rz", r=r, z=z, a=a))
            nodes.append(dict(kind="rr", rz=rz, z=z, a=a))
            r = (a + z) * rz
    nodes.append(dict(kind="xT", x=x, q=q, alpha=alpha))
    return nodes


def _roundings(node: dict) -> list[tuple]:
    """The rounded intermediates of a node: (factor to the node, side "mm"/"mn", [values per direction:
    alternative forms, the entrywise larger counted], accumulation (left, right, L) or None); a matrix
    operand is (side, values, α added on the diagonal)."""
    kind = node["kind"]
    if kind == "r":
        return [(1.0, "mm", [node["r"]], (("mn", node["x"], 0.0), ("nm", node["x"], 0.0), "n"))]
    if kind == "z":
        r, z, b, c = node["r"], node["z"], node["b"], node["c"]
        rr = ("mm", r, 0.0)
        return [(c, "mm", [r * r], (rr, rr, "m")), (1.0, "mm", [b * r], None), (1.0, "mm", [c * r * r], None),
                (1.0, "mm", [z], None)]
    if kind == "q":
        z, q, alpha, a = node["z"], node["q"], node["alpha"], node["a"]
        new = (a + z) * q
        out = [(1.0, "mm", [new, new - alpha * a], (("mm", z, abs(a)), ("mm", q - alpha, abs(alpha)), "m+1"))]
        if a != 0.0:
            out.append((a, "mm", [q - alpha + (alpha / a) * z], None))  # ortho_fast's M + (α/a)Z
        return out
    if kind == "rz":
        r, z, a = node["r"], node["z"], node["a"]
        return [(1.0, "mm", [(a + z) * r], (("mm", r, 0.0), ("mm", z, abs(a)), "m+1"))]
    if kind == "rr":
        rz, z, a = node["rz"], node["z"], node["a"]
        return [(1.0, "mm", [(a + z) * rz], (("mm", z, abs(a)), ("mm", rz, 0.0), "m+1"))]
    if kind in ("x", "xT"):
        x, q, alpha = node["x"], node["q"], node["alpha"]
        return [(1.0, "mn", [q * x, (q - alpha) * x], (("mm", q - alpha, abs(alpha)), ("mn", x, 0.0), "m+1"))]
    return [(1.0, "mn", [node["x"]], None)]  # x0: the division


def _mm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b for a (2, 2, N) and b (2, K, N): matrices along the first two axes, a batch of N along the
    last (contiguous rows of N, where numpy's matmul would loop over N tiny matrices)."""
    return a[:, 0, None] * b[None, 0] + a[:, 1, None] * b[None, 1]


def _pair_ops(table, restarts) -> list:
    """The Gram recurrence on 2 × 3 matrices ((2, 3, N) arrays) as one operation per node (state dict ->
    (state, key of the node's value)); the same order of products as the kernels: Q ← (aI + Z)Q,
    R_z ← R(aI + Z), R ← (aI + Z)R_z, X ← QX, R ← XXᵀ."""
    eye = np.eye(2)[:, :, None]

    def gram(st):
        x = st["x"]
        return {**st, "r": np.einsum("ikn,jkn->ijn", x, x), "q": None}, "r"

    def restart(st):
        q = st["q"]
        return {**st, "x": st["x"] if q is None else _mm(q, st["x"])}, "x"

    def poly(b, c):
        return lambda st: ({**st, "z": b * st["r"] + c * _mm(st["r"], st["r"])}, "z")

    def update_q(a):
        return lambda st: ({**st, "q": a * eye + st["z"] if st["q"] is None else _mm(a * eye + st["z"], st["q"])}, "q")

    def update_rz(a):
        return lambda st: ({**st, "rz": _mm(st["r"], a * eye + st["z"])}, "rz")

    def update_r(a):
        return lambda st: ({**st, "r": _mm(a * eye + st["z"], st["rz"])}, "r")

    ops = [lambda st: (st, "x"), gram]
    last = len(table) - 1
    for i, (a, b, c) in enumerate(table):
        if i in restarts:
            ops += [restart, gram]
        ops += [poly(b, c), update_q(a)]
        if i < last and i + 1 not in restarts:
            ops += [update_rz(a), update_r(a)]
    return ops + [restart]


def gram_pair_curvatures(xi, xl, table, restarts=()) -> np.ndarray:
    """Second derivatives of the output's (i, i) entry in one node's perturbation entries, per node:
    (nodes, ..., 5) with columns H_ii, H_il,il, H_li,li, H_il,li, H_⊥ (the last 0 for m × m nodes), by
    central differences (step ``GRAM_SECOND_ORDER_STEP``) of the recurrence run in float64 on 2 × 3
    matrices (rows: directions i, l; columns i, l and one off the row space) from diag(xi, xl).
    Shapes: xi, xl (...)."""
    xi, xl = np.broadcast_arrays(np.asarray(xi, dtype=np.float64), np.asarray(xl, dtype=np.float64))
    shape, n = xi.shape, xi.size
    h = GRAM_SECOND_ORDER_STEP
    entries = [(0, 0), (0, 1), (1, 0), (0, 2)]
    perts = np.zeros((2, 3, 13, n))  # ±h per entry, then (±h, ±h) on (i, l) and (l, i), then none
    for j, (e, sign) in enumerate((e, sign) for e in entries for sign in (1.0, -1.0)):
        perts[e[0], e[1], j] = sign * h
    for j, (s1, s2) in enumerate(((1, 1), (1, -1), (-1, 1), (-1, -1))):
        perts[0, 1, 8 + j], perts[1, 0, 8 + j] = s1 * h, s2 * h
    perts = perts.reshape(2, 3, 13 * n)
    x = np.zeros((2, 3, n))
    x[0, 0], x[1, 1] = xi.reshape(-1), xl.reshape(-1)
    ops = _pair_ops(table, restarts)
    states, state = [], {"x": x}
    for op in ops:  # the unperturbed states before each node
        states.append(state)
        state, _ = op(state)
    out = np.zeros((len(ops), n, 5))
    for p, op in enumerate(ops):
        state, key = op({k: None if v is None else np.tile(v, 13) for k, v in states[p].items()})
        value = state[key]
        state = {**state, key: value + perts[:value.shape[0], :value.shape[1]]}
        for later in ops[p + 1:]:
            state, _ = later(state)
        f = state["x"][0, 0].reshape(13, n)
        for col, j in zip((0, 1, 2, 4), (0, 2, 4, 6)):
            out[p, :, col] = (f[j] - 2 * f[12] + f[j + 1]) / h**2
        out[p, :, 3] = (f[8] - f[9] - f[10] + f[11]) / (4 * h**2)
    return out.reshape((len(ops),) + shape + (5,))


def _curvature_envelope(sigma: np.ndarray, table, restarts) -> np.ndarray:
    """|H| per node and direction pair, (J or 1, nodes, k, k, 5): the largest over the corners and centre
    of the box of σ̂ over the batch, or per matrix when the box is wider than ``BOX_SPREAD``."""
    lo, hi, mid = sigma.min(axis=0), sigma.max(axis=0), sigma.mean(axis=0)
    if np.any(hi - lo > BOX_SPREAD * np.maximum(np.abs(mid), 1e-3)):
        chunk = max(1, 4096 // sigma.shape[-1] ** 2)  # matrices per call: about 4096 pairs, 13 evaluations each
        return np.concatenate([np.moveaxis(np.abs(gram_pair_curvatures(
            part[:, :, None], part[:, None, :], table, restarts)), 0, 1)
            for part in np.split(sigma, range(chunk, len(sigma), chunk))])
    corners = [(lo, lo), (lo, hi), (hi, lo), (hi, hi), (mid, mid)]
    xi = np.stack([c[0][:, None] * np.ones_like(c[1])[None, :] for c in corners])
    xl = np.stack([np.ones_like(c[0])[:, None] * c[1][None, :] for c in corners])
    return np.abs(gram_pair_curvatures(xi, xl, table, restarts)).max(axis=1)[None]


def gram_rounding_moments(sigma_hat: np.ndarray, u: np.ndarray, v: np.ndarray, coefficients, dtype,
                          restarts=()) -> tuple[np.ndarray, np.ndarray]:
    """Variance proxies vᵢ and mean bounds bᵢ of dᵢ = uᵢᵀX̃vᵢ − f(σ̂ᵢ) for a Gram Newton–Schulz kernel
    with ``restarts`` (0-based steps before which X ← QX, R ← XXᵀ), per matrix (see the module for the
    derivation; the counterpart of ``ns_rounding_moments`` for ``form="gram"``).

    Shapes: sigma_hat (J, k) the normalized singular values; u (J, m, k), v (J, n, k) the input's
    singular vectors; -> ((J, k), (J, k)) float64. The recurrence runs on the small side.
    Source: Higham & Mary 2019 (SIAM J. Sci. Comput. 41(5)), Model 2.1 and Lemma 2.2; Higham,
    *Functions of Matrices*, Thm. 3.11; the Gram form: Dao AI Lab, gram-newton-schulz (2025).
    Raises: ValueError for a dtype outside ``STATISTICAL_DTYPES``, mismatched shapes or bad restarts.
    """
    name = str(dtype).replace("torch.", "")
    if name not in STATISTICAL_DTYPES:
        raise ValueError(f"dtype: the statistical model covers {STATISTICAL_DTYPES}, got {dtype!r}")
    s = np.atleast_2d(np.asarray(sigma_hat, dtype=np.float64))
    u, v = np.asarray(u, dtype=np.float64).reshape(s.shape[:1] + u.shape[-2:]), \
        np.asarray(v, dtype=np.float64).reshape(s.shape[:1] + v.shape[-2:])
    k = s.shape[-1]
    if u.shape[-1] != k or v.shape[-1] != k:
        raise ValueError(f"u, v: expected (J, m, {k}) and (J, n, {k}) for sigma_hat {s.shape}, got {u.shape} and "
                         f"{v.shape}")
    if u.shape[-2] > v.shape[-2]:  # the recurrence runs on the small side
        u, v = v, u
    m, n = u.shape[-2], v.shape[-2]
    table = ortho_ref.schedule(coefficients) if isinstance(coefficients, str) else \
        np.atleast_2d(np.asarray(coefficients, dtype=np.float64))
    restarts = validate_restarts(restarts, len(table))
    uu, ua, u32 = unit_roundoff(name), accumulation_roundoff(name), UNIT_ROUNDOFF["float32"]
    lengths = {"n": n, "m": m, "m+1": m + 1}
    gains, sizes = gram_point_gains(s, table, restarts)  # (P, J, k)
    nodes = _trajectory(s, table, restarts)
    if len(nodes) != len(gains):
        raise RuntimeError(f"gram_rounding_moments: {len(nodes)} nodes against {len(gains)} points of "
                           "gram_rounding_points")
    curv = _curvature_envelope(s, table, restarts)  # (J or 1, P, k, k, 5)
    u2, v2 = u * u, v * v
    u2t = np.swapaxes(u2, -1, -2)
    v_perp2 = np.clip(1.0 - v2.sum(axis=-1), 0.0, None)[..., None]  # (J, n, 1)
    vt = np.swapaxes(v, -1, -2)
    ut = np.swapaxes(u, -1, -2)

    def matrix(side, values, alpha=0.0):
        if side == "mm":
            return (u * values[:, None, :]) @ ut + alpha * np.eye(m)
        if side == "mn":
            return (u * values[:, None, :]) @ vt
        return (v * values[:, None, :]) @ ut  # "nm": Xᵀ

    eye = np.eye(k, dtype=bool)
    var, bias = np.zeros_like(s), np.zeros_like(s)
    bias += gains[0] * s * 2 * u32 + u32 * np.einsum("pjk,pjk->jk", gains, sizes)
    for p, node in enumerate(nodes):  # constants held in the dtype: aI, or α/a rounded as an argument
        if node["kind"] == "q":
            a, alpha = node["a"], node["alpha"]
            if np.all(node["q"] == 1.0) and alpha == 1.0:  # Q = aI + Z after a (re)start
                bias += gains[p] * (abs(round_to_dtype(a, name) - a) + u32 * abs(a))
            elif a != 0.0:  # M' = a(M + fl(α/a)Z) + ZM
                held = abs(round_to_dtype(alpha / a, name) - alpha / a) + u32 * abs(alpha / a)
                bias += gains[p] * abs(a) * held * np.abs(node["z"])
    for p, node in enumerate(nodes):
        pairs, perp = np.zeros(s.shape + (k,)), np.zeros_like(s)
        for factor, side, alternatives, acc in _roundings(node):
            square = np.max([matrix(side, a) ** 2 for a in alternatives], axis=0) * uu**2
            if acc is not None:
                left, right, length = acc
                square = square + ua**2 * lengths[length] * (np.abs(matrix(*left)) @ np.abs(matrix(*right))) ** 2
            w2 = u2 if side == "mm" else v2
            pairs += factor**2 * (2.0 if side == "mm" else 1.0) * (u2t @ square @ w2)
            if side == "mn":
                perp += factor**2 * (u2t @ square @ v_perp2)[..., 0]
        if node["kind"] == "x0":  # the norm, its safety product and eps sum: one relative scalar on every x
            pairs = pairs + eye * (s * s * (3 * uu**2 + m * n * ua**2))[..., None, :]
        diag = np.diagonal(pairs, axis1=-2, axis2=-1)
        var += gains[p] ** 2 * diag
        h = curv[:, p]  # (J or 1, k, k, 5)
        off = np.where(eye, 0.0, 0.5 * h[..., 1] * pairs + 0.5 * h[..., 2] * np.swapaxes(pairs, -1, -2)
                       + h[..., 3] * np.sqrt(pairs * np.swapaxes(pairs, -1, -2)))
        bias += 0.5 * np.diagonal(h[..., 0], axis1=-2, axis2=-1) * diag + off.sum(axis=-1) \
            + 0.5 * h[..., 4].max(axis=-1) * perp
    return var, bias
