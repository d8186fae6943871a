"""Planted bugs: small, realistic mistakes in Newton–Schulz kernels and Muon / Dion optimizers.

Each entry of ``PLANTED_BUGS`` is something a person writing their own kernel or optimizer
gets wrong, packaged so that ``ortho_verify.check_orthogonalizer`` / ``ortho_verify.check_optimizer`` can
be shown to catch it (tests/verify/test_planted.py runs them all; docs/verification.md lists
them). The correct versions (``newton_schulz_kernel`` with default options, ``SimpleMuon``,
``SimpleDion``) are "user code" too: compact implementations written independently of
``ortho_fast``'s, and they pass the same checks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

import ortho_fast
from ortho_fast.functional.dion import dion_rank, dion_update, initial_q
from ortho_fast.functional.muon import adjusted_lr_scale

from ..conventions import DionConventions, MuonConventions

__all__ = ["GRAM_POLAR_EXPRESS", "GRAM_RESTARTS", "JORDAN", "PLANTED_BUGS", "PlantedBug", "SimpleDion", "SimpleMuon",
           "gram_newton_schulz_kernel", "newton_schulz_kernel", "round_to_tf32", "tf32_newton_schulz_kernel"]

#: Keller Jordan's quintic coefficients (torch.optim.Muon's default), 5 steps.
JORDAN = ((3.4445, -4.7750, 2.0315),) * 5


def _gather_rows(x: torch.Tensor, shards: int, offset_bug: bool) -> torch.Tensor:
    """Emulate an all-gather of row shards (FSDP Shard(0), ``torch.chunk`` sizes). With
    ``offset_bug`` shard i is written at i·(m // shards) instead of the sum of the sizes before
    it: correct for even m, shifted rows and a zero tail for uneven m."""
    parts = torch.chunk(x, shards, dim=-2)
    out = torch.zeros_like(x)
    start = 0
    for i, part in enumerate(parts):
        at = i * (x.shape[-2] // shards) if offset_bug else start
        out[..., at:at + part.shape[-2], :] = part
        start += part.shape[-2]
    return out


def newton_schulz_kernel(g: torch.Tensor, coefficients=JORDAN, *, dtype: torch.dtype = torch.float32,
                         norm: str = "fro", eps: float = 1e-7, transpose_back: bool = True, shards: int = 1,
                         shard_offset_bug: bool = False) -> torch.Tensor:
    """A user's Newton–Schulz kernel: X₀ = G/(‖G‖ + eps) per matrix, X ← aX + (bA + cA²)X with
    A = XXᵀ on the wide side, for each (a, b, c) in ``coefficients``.

    Shapes: g (..., m, n) -> (..., m, n) in g's dtype; computed in ``dtype``. The keyword options
    plant bugs: ``norm="max"`` (max |G| instead of ‖G‖_F), ``transpose_back=False`` (a tall input
    is transposed for the iteration and reshaped, not transposed, back), ``shards`` > 1 with
    ``shard_offset_bug`` (rows gathered from shards at wrong offsets; see ``_gather_rows``).
    Source: Keller Jordan, ``zeropower_via_newtonschulz5`` (2024).
    Raises: ValueError for fewer than 2 dims or an unknown ``norm``.
    """
    if g.ndim < 2 or norm not in ("fro", "max"):
        raise ValueError(f"g: expected (..., m, n), got shape {tuple(g.shape)}; norm: 'fro' or 'max', got {norm!r}")
    x = _gather_rows(g, shards, shard_offset_bug) if shards > 1 else g
    x = x.to(dtype)
    scale = x.abs().amax(dim=(-2, -1), keepdim=True) if norm == "max" else \
        torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True)
    x = x / (scale + eps)
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.mT
    for a, b, c in coefficients:
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    if tall:
        x = x.mT if transpose_back else x.reshape(g.shape)
    return x.to(g.dtype)


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """``x`` (float32) with each significand rounded to TF32's 10 bits, to nearest, ties to even: what
    an NVIDIA tensor core does to a float32 matmul's operands under ``torch.backends.cuda.matmul.
    allow_tf32`` / ``set_float32_matmul_precision("high")``, simulated on any device. The exponent
    range is float32's (TF32 keeps 8 exponent bits); inf and NaN pass through; a carry out of the
    significand rounds up to the next power of two (to inf past float32's largest finite value,
    as the hardware's round-to-nearest).
    Shapes: any -> the same, float32. Raises: TypeError for another dtype."""
    if x.dtype != torch.float32:
        raise TypeError(f"x: expected float32, got {x.dtype}")
    bits = x.contiguous().view(torch.int32)
    drop = 13  # 23 float32 significand bits -> 10
    lsb = (bits >> drop) & 1
    rounded = ((bits + ((1 << (drop - 1)) - 1) + lsb) >> drop) << drop
    finite = torch.isfinite(x)
    return torch.where(finite, rounded.view(torch.float32), x)


def tf32_newton_schulz_kernel(g: torch.Tensor, coefficients=JORDAN, *, eps: float = 1e-7,
                              operand_bits: str = "tf32") -> torch.Tensor:
    """A float32 Newton–Schulz whose matmuls run as TF32 tensor cores do, simulated on the CPU: each
    product's operands rounded by ``round_to_tf32`` (``operand_bits="bfloat16"``: to bfloat16's 7
    bits instead, a planted precision error), products and sums in float32. Normalization
    X₀ = G/(‖G‖_F + eps) in float32; A = XXᵀ on the wide side; X ← aX + (bA + cA²)X.
    Shapes: g (..., m, n) -> (..., m, n) float32 (g cast to float32 first).
    Source: NVIDIA's TF32 (Ampere whitepaper, 2020); Emerging-Optimizers' ``fp32_matmul_prec="high"``.
    Raises: ValueError for an unknown operand_bits."""
    if operand_bits not in ("tf32", "bfloat16"):
        raise ValueError(f"operand_bits: expected 'tf32' or 'bfloat16', got {operand_bits!r}")

    def cut(t):
        return round_to_tf32(t) if operand_bits == "tf32" else t.to(torch.bfloat16).float()

    def mm(p, q):
        return cut(p) @ cut(q)

    x = g.float()
    x = x / (torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True) + eps)
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.mT
    for a, b, c in coefficients:
        gram = mm(x, x.mT)
        x = a * x + mm(b * gram + c * mm(gram, gram), x)
    return (x.mT if tall else x).contiguous()


#: Dao AI Lab's gram-newton-schulz default coefficients: the first five steps of Polar Express
#: (Amsel et al. 2025, Table / arXiv 2505.16932) unmodified, then (a/s, b/s³, c/s⁵) with safety
#: s = 1.05. Computed here from the oracle's transcription (``polar_express_paper``, which folds in
#: 1.01): multiply back by 1.01^(1, 3, 5), divide by 1.05^(1, 3, 5).
GRAM_POLAR_EXPRESS = tuple(tuple(float(v) for v in row) for row in
                           ortho_fast.COEFFICIENTS["polar_express_paper"].table(5)
                           * ((1.01 / 1.05) ** torch.tensor([1.0, 3.0, 5.0], dtype=torch.float64)).numpy())
#: Dao AI Lab's default restart: before the third step (0-based index 2), X ← QX and R ← XXᵀ.
GRAM_RESTARTS = (2,)


def gram_newton_schulz_kernel(g: torch.Tensor, coefficients=GRAM_POLAR_EXPRESS, *, restarts=GRAM_RESTARTS,
                              dtype: torch.dtype = torch.float16, eps: float = 1e-7) -> torch.Tensor:
    """A user's Gram Newton–Schulz, written from the published algorithm (Dao AI Lab,
    gram-newton-schulz, 2025): normalize X₀ = G/(‖G‖_F + eps) in float32, cast to ``dtype``, put the
    short side first, R = XXᵀ; per step i (0-based) with (a, b, c): before a step in ``restarts``
    X ← QX, R ← XXᵀ and Q restarts; Z = bR + cR², Q ← aI + Z on the first step after a (re)start,
    else Q ← aQ + ZQ; unless the next step restarts (or this is the last), R ← (aI + Z)R(aI + Z) in
    two products; finally X ← QX. Every intermediate is stored in ``dtype`` (float16 by default, the
    published kernel's), aI included.
    Shapes: g (..., m, n) -> (..., m, n) in g's dtype. Planted errors: ``restarts=()`` where restarts
    are declared, a perturbed ``coefficients`` row, ``dtype=torch.float16`` declared as float32.
    Source: Dao AI Lab, gram-newton-schulz (2025); microsoft/dion ``use_gram_newton_schulz``.
    """
    x = g.float()
    x = x / (torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True) + eps)
    x = x.to(dtype)
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.mT
    eye = torch.eye(x.shape[-2], dtype=dtype, device=x.device)
    r = x @ x.mT
    q = None
    last = len(coefficients) - 1
    for i, (a, b, c) in enumerate(coefficients):
        if i in restarts and i > 0:
            x = q @ x
            r = x @ x.mT
            q = None
        z = b * r + c * (r @ r)
        q = a * eye + z if q is None else a * q + z @ q
        if i < last and i + 1 not in restarts:
            rz = a * r + z @ r
            r = a * rz + z @ rz
    x = q @ x
    return (x.mT if tall else x).to(g.dtype)


class SimpleMuon(torch.optim.Optimizer):
    """A compact Muon-like optimizer: the "user class" of the docs and the base of the planted
    optimizer bugs. EMA momentum with Nesterov (torch.optim.Muon's), O = ``orthogonalizer``(U),
    W ← W(1 − lr·wd) − lr·adjusted_lr_scale(adjust_lr, m, n)·O.

    Args: lr, momentum, weight_decay as torch.optim.Muon; ``orthogonalizer`` maps (m, n) ->
    (m, n) (default ``newton_schulz_kernel`` in float32); ``adjust_lr`` as ortho_fast.Muon.
    Planted-bug switches: ``nesterov=False`` (the Nesterov term dropped while Nesterov is
    declared), ``normalize_buffer_in_place`` (the momentum buffer divided by its norm in place),
    ``nesterov_in_place`` (the Nesterov mix written into ``p.grad`` with ``lerp_``: the update is
    right, the gradient is corrupted).
    State: ``momentum_buffer``. Source: Jordan et al. 2024 (Muon); torch.optim.Muon.
    Raises: ValueError for non-2-D parameters (at construction).
    """

    def __init__(self, params: Iterable, lr: float = 0.02, momentum: float = 0.95, weight_decay: float = 0.1, *,
                 orthogonalizer: Callable | None = None, adjust_lr: str | None = "original", nesterov: bool = True,
                 normalize_buffer_in_place: bool = False, nesterov_in_place: bool = False) -> None:
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))
        if any(p.ndim != 2 for group in self.param_groups for p in group["params"]):
            raise ValueError("params: SimpleMuon expects 2-D (m, n) parameters")
        self.orthogonalizer = orthogonalizer or newton_schulz_kernel
        self.adjust_lr, self.nesterov, self.normalize_buffer_in_place = adjust_lr, nesterov, normalize_buffer_in_place
        self.nesterov_in_place = nesterov_in_place

    @torch.no_grad()
    def step(self, closure=None):
        """One step for every parameter with a gradient."""
        for group in self.param_groups:
            lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.lerp_(p.grad, 1 - mu)
                if self.normalize_buffer_in_place:  # planted: the stored buffer is normalized in place
                    buf.div_(torch.linalg.vector_norm(buf))
                mixed = p.grad.lerp_(buf, mu) if self.nesterov_in_place else p.grad.lerp(buf, mu)  # lerp_: planted
                o = self.orthogonalizer(mixed if self.nesterov else buf)
                p.mul_(1 - lr * wd).add_(o, alpha=-lr * adjusted_lr_scale(self.adjust_lr, *p.shape))


class SimpleDion(torch.optim.Optimizer):
    """A compact Dion built on ``ortho_fast.functional.dion.dion_update`` (Ahn et al., arXiv 2504.05295,
    Algorithm 1), with planted-bug switches: ``error_feedback_sign=-1`` keeps
    M = B + (1 − μ)PRᵀ instead of B − (1 − μ)PRᵀ; ``weight_noise`` > 0 adds that times N(0, 1)
    noise to the weights after each step.

    Args: lr, mu, weight_decay, rank_fraction as microsoft/dion; ``seed`` for Q0 (and the noise).
    State: ``momentum`` (m, n) and ``Q`` (min(m, n), r), in the parameter's dtype.
    Raises: ValueError for non-2-D params.
    """

    def __init__(self, params: Iterable, lr: float = 0.01, mu: float = 0.95, weight_decay: float = 0.01, *,
                 rank_fraction: float = 1.0, seed: int = 0, error_feedback_sign: int = 1,
                 weight_noise: float = 0.0) -> None:
        super().__init__(params, dict(lr=lr, mu=mu, weight_decay=weight_decay, rank_fraction=rank_fraction))
        if any(p.ndim != 2 for group in self.param_groups for p in group["params"]):
            raise ValueError("params: SimpleDion expects 2-D (m, n) parameters")
        self.seed, self.sign, self.noise = seed, error_feedback_sign, weight_noise
        self.generator = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def step(self, closure=None):
        """One step for every parameter with a gradient."""
        params = [(group, p) for group in self.param_groups for p in group["params"]]
        for index, (group, p) in enumerate(params):
            if p.grad is None:
                continue
            m, n = p.shape
            state = self.state[p]
            if "Q" not in state:  # Q0 from (seed, parameter index), as ortho_fast.Dion
                r = dion_rank(m, n, group["rank_fraction"])
                state["momentum"] = torch.zeros_like(p)
                state["Q"] = initial_q((min(m, n), r), self.seed, index, p.dtype, p.device)
            upd = dion_update(p, p.grad, state["momentum"], state["Q"], lr=group["lr"], mu=group["mu"],
                              weight_decay=group["weight_decay"], epsilon=1e-8)
            if self.sign != 1:  # planted: flip the sign of the error-feedback term
                pr = upd.P @ upd.R.mT
                state["momentum"].add_((pr.mT if m < n else pr).to(p.dtype), alpha=2 * (1 - group["mu"]))
            if self.noise:  # planted: noise in the weights
                p.add_(torch.randn(p.shape, generator=self.generator).to(p), alpha=self.noise)


@dataclass(frozen=True)
class PlantedBug:
    """One planted bug: ``kind`` "orthogonalizer" (``make()`` returns the function) or
    "optimizer" (``make`` is the optimizer class or factory), checked against ``conventions``
    (MuonConventions / DionConventions; None for orthogonalizers, declared jordan), with
    ``check_kwargs`` for the check (``dtype`` of ``check_orthogonalizer``, default float32;
    ``param_dtype`` of ``check_optimizer``)."""

    name: str
    kind: str
    make: Callable
    conventions: object
    description: str
    check_kwargs: dict = field(default_factory=dict)


_FLOAT32_MUON = MuonConventions(ns_dtype=torch.float32)
#: A float16 Gram kernel restarting before steps 2 and 4, as ortho_fast's ``gram=True, dtype=torch.float16``.
_FLOAT16_GRAM = {"compute_dtype": torch.float16, "form": "gram", "restarts": (2, 4)}
_kernel = newton_schulz_kernel
PLANTED_BUGS = [
    PlantedBug("wrong coefficient", "orthogonalizer",
               lambda: functools.partial(_kernel, coefficients=((3.4445, -4.7750, 2.0415),) * 5), None,
               "c = 2.0415 instead of 2.0315 (a one-digit typo)"),
    PlantedBug("one step missing", "orthogonalizer", lambda: functools.partial(_kernel, coefficients=JORDAN[:4]),
               None, "4 Newton–Schulz steps where 5 are declared"),
    PlantedBug("tall input not transposed back", "orthogonalizer",
               lambda: functools.partial(_kernel, transpose_back=False), None,
               "a tall input is iterated on its transpose and reshaped (not transposed) back"),
    PlantedBug("max norm instead of Frobenius", "orthogonalizer", lambda: functools.partial(_kernel, norm="max"),
               None, "X₀ = G / max|G| instead of G / ‖G‖_F"),
    PlantedBug("bf16 arithmetic where float32 declared", "orthogonalizer",
               lambda: functools.partial(_kernel, dtype=torch.bfloat16), None,
               "the iteration runs in bfloat16 while the check declares float32"),
    PlantedBug("shard offset error", "orthogonalizer",
               lambda: functools.partial(_kernel, shards=4, shard_offset_bug=True), None,
               "rows gathered from 4 shards at offset i·(m // 4): wrong for uneven m"),
    PlantedBug("wrong eps (bf16 kernel)", "orthogonalizer",
               lambda: functools.partial(_kernel, eps=1e-3, dtype=torch.bfloat16), None,
               "X₀ = G/(‖G‖_F + 1e-3) where 1e-7 is declared, in a bfloat16 kernel: matters once ‖G‖_F ≲ 1e-4",
               {"dtype": torch.bfloat16}),
    PlantedBug("bf16 arithmetic where float16 declared", "orthogonalizer",
               lambda: functools.partial(_kernel, dtype=torch.bfloat16), None,
               "the iteration runs in bfloat16 (7-bit significand) while the check declares float16 (10-bit)",
               {"dtype": torch.float16}),
    PlantedBug("bf16 operands where TF32 declared", "orthogonalizer",
               lambda: functools.partial(tf32_newton_schulz_kernel, operand_bits="bfloat16"), None,
               "matmul operands rounded to bfloat16 while TF32 (dtype='high', 10-bit operands) is declared",
               {"dtype": "high"}),
    PlantedBug("float16 Gram kernel without its restarts", "orthogonalizer",
               lambda: functools.partial(gram_newton_schulz_kernel, coefficients=JORDAN, restarts=()), None,
               "a float16 Gram Newton–Schulz that never recomputes R from X where restarts before steps 2 and 4 "
               "are declared (measured 112x)", _FLOAT16_GRAM),
    PlantedBug("float16 Gram kernel with c 1% off", "orthogonalizer",
               lambda: functools.partial(gram_newton_schulz_kernel, restarts=_FLOAT16_GRAM["restarts"],
                                         coefficients=((3.4445, -4.7750, 2.0315 * 1.01),) * 5), None,
               "every step's c 1% too large in a float16 Gram kernel (measured 1.86x per direction)", _FLOAT16_GRAM),
    PlantedBug("float16 Gram kernel with c 0.5% off", "orthogonalizer",
               lambda: functools.partial(gram_newton_schulz_kernel, restarts=_FLOAT16_GRAM["restarts"],
                                         coefficients=((3.4445, -4.7750, 2.0315 * 1.005),) * 5), None,
               "every step's c 0.5% too large in a float16 Gram kernel: within the per-direction tolerance "
               "(0.84x), caught by the Gram statistical row ns_mean_deviation (measured 7.5x)", _FLOAT16_GRAM),
    PlantedBug("wrong error-feedback sign", "optimizer",
               lambda: functools.partial(SimpleDion, error_feedback_sign=-1), DionConventions(),
               "Dion keeps M = B + (1 − μ)PRᵀ"),
    PlantedBug("wrong error-feedback sign (bf16 parameters)", "optimizer",
               lambda: functools.partial(SimpleDion, error_feedback_sign=-1), DionConventions(),
               "the same with bfloat16 parameters and state, where P is not determined by B",
               {"param_dtype": torch.bfloat16}),
    PlantedBug("noise in the weights (bf16 parameters)", "optimizer",
               lambda: functools.partial(SimpleDion, weight_noise=1e-2), DionConventions(),
               "0.01·N(0, 1) added to bfloat16 weights after each Dion step", {"param_dtype": torch.bfloat16}),
    PlantedBug("lr scale of the wrong mode", "optimizer",
               lambda: functools.partial(SimpleMuon, adjust_lr="spectral_norm"), _FLOAT32_MUON,
               "√(m/n) (microsoft/dion) where √max(1, m/n) (torch.optim.Muon 'original') is declared"),
    PlantedBug("momentum normalized in place", "optimizer",
               lambda: functools.partial(SimpleMuon, normalize_buffer_in_place=True), _FLOAT32_MUON,
               "the stored momentum buffer divided by its norm in place (norm 1.0 instead of 0.27); "
               "checked with the default parameter dtypes, float32 and bfloat16"),
    PlantedBug("gradient modified in place", "optimizer",
               lambda: functools.partial(SimpleMuon, nesterov_in_place=True), _FLOAT32_MUON,
               "the Nesterov mix computed with p.grad.lerp_(buf, mu): a correct update, a corrupted gradient"),
    PlantedBug("shard offset error (optimizer)", "optimizer",
               lambda: functools.partial(SimpleMuon, orthogonalizer=functools.partial(
                   _kernel, shards=4, shard_offset_bug=True)), _FLOAT32_MUON,
               "a Muon whose Newton–Schulz gathers row shards at wrong offsets"),
]

#: Correct user implementations and the conventions they declare (they must pass).
CORRECT_OPTIMIZERS = {"SimpleMuon": (SimpleMuon, _FLOAT32_MUON), "SimpleDion": (SimpleDion, DionConventions())}
