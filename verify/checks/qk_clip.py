"""QK-clip checks of ``ortho-verify``: ``ortho_fast.Muon``'s QK-clip (MuonClip, Kimi K2) after a
real-gradient step against ``ortho_ref.qk_clip`` applied to the same step without the clip.

Each row runs two ``ortho_fast.optimizer_preset("motif", ...)`` optimizers (Motif's Muon: QK-clip
with τ = 100, Newton–Schulz in the parameter's dtype here) from the same weight, momentum and
real gradient: one without QK-clip, one with it and per-head maximum logits given to ``step``.
The Muon update is the same computation in both (same code, same device), so the difference is
the clip alone: the reference is ``ortho_ref.qk_clip_fused`` / ``qk_clip`` of the unclipped
result, compared elementwise and relative to the reference entry with
``ortho_verify.tolerances.qk_clip_tolerance`` (docs/tolerances.md, "QK-clip"). Layouts: a fused
QKV weight in nanoGPT's [Q; K; V] order and in Megatron's per-group order (4 query heads, 2 key
groups: GQA), and separate query / key weights (MHA, 4 heads). The logits put one key group
below τ and one above, heads of each kind, so clipping too much or too little shows.

Planted bugs (``QK_CLIP_PLANTED``, written here, for the tests): "gamma_not_sqrt" (both sides
scaled by γ instead of γ^α, γ^(1−α)), "all_heads" (γ = τ / S for every head, also those below τ),
"wrong_fused_split" (a fused weight's rows read in the other layout), "before_update" (the
clip applied to the weight before the step instead of after). "rewritten" is the control: a
correct clip written head by head in float64, which must pass.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

import ortho_fast
import ortho_ref.qk_clip as ref_qk
from ortho_fast.functional import qk_clip as fast_qk

from .. import registry
from ..inputs.arrays import TORCH_DTYPES, as_float64, case_array, case_rng
from ..inputs.spectra import MatrixCase
from ..report.results import CheckResult, measured, no_claim
from ..tolerances.qk_clip import qk_clip_tolerance

__all__ = ["QK_CLIP_CONTROL", "QK_CLIP_HEADS", "QK_CLIP_LAYOUTS", "QK_CLIP_PLANTED", "QK_CLIP_THRESHOLD",
           "check_qk_clip", "qk_clip_jobs", "qk_clip_logits"]

#: Query heads and key groups of every row (GQA: two query heads per key head), from the registry.
QK_CLIP_HEADS = tuple(registry.QK_CLIP_CONFIG.options[k] for k in ("qk_clip_num_heads", "qk_clip_num_kv_heads"))
#: τ of Motif's default clip_config (and Kimi K2's).
QK_CLIP_THRESHOLD = registry.QK_CLIP_CONFIG.options["qk_clip_threshold"]
#: The layouts of the rows: fused QKV in either row order, or separate query / key weights.
QK_CLIP_LAYOUTS = ("qkv concatenated", "qkv grouped", "separate q/k")
#: Planted bugs the checks must catch (module docstring).
QK_CLIP_PLANTED = ("gamma_not_sqrt", "all_heads", "wrong_fused_split", "before_update")
#: A correct clip written differently from ours (head by head, float64 factors): must pass.
QK_CLIP_CONTROL = "rewritten"


def qk_clip_logits(case: MatrixCase, heads: int) -> np.ndarray:
    """Per-head maximum logits of a row: τ·(0.3, 0.9, 1.5, 4.0)·(1 + 0.05·U(0, 1)) for 4 heads (one
    key group under τ, one over it, each with heads under and over τ), from ``case_rng``."""
    base = np.resize(np.array([0.3, 0.9, 1.5, 4.0]), heads)
    return QK_CLIP_THRESHOLD * base * (1 + 0.05 * case_rng(case, "qk-logits").uniform(size=heads))


def _planted_clip(kind: str):
    """A wrong ``qk_clip_`` (see ``QK_CLIP_PLANTED``), written head by head in float64."""

    def clip(weight, max_logits, *, threshold, role, num_heads, num_kv_heads=None, alpha=0.5,
             layout="concatenated"):
        kv = num_kv_heads or num_heads
        r = num_heads // kv
        s = max_logits.double().view(kv, r).max(dim=1).values
        gamma = threshold / s if kind == "all_heads" else torch.where(s > threshold, threshold / s, torch.ones_like(s))
        fq, fk = (gamma, gamma) if kind == "gamma_not_sqrt" else (gamma ** alpha, gamma ** (1 - alpha))
        if kind == "wrong_fused_split":
            layout = "grouped" if layout == "concatenated" else "concatenated"
        per_group = [[fq[g]] * r + [fk[g], torch.ones(())] for g in range(kv)]
        if role == "query":
            factors = [fq[h // r] for h in range(num_heads)]
        elif role == "key":
            factors = list(fk)
        elif layout == "grouped":
            factors = [f for group in per_group for f in group]
        else:
            factors = [fq[h // r] for h in range(num_heads)] + list(fk) + [torch.ones(())] * kv
        blocks = weight.view(len(factors), -1, weight.shape[1])
        for i, f in enumerate(factors):
            blocks[i].copy_((blocks[i].double() * f).to(weight.dtype))
        return weight

    return clip


@contextlib.contextmanager
def _planted(kind: str | None):
    if kind in (None, "before_update"):
        yield
        return
    original = fast_qk.qk_clip_
    fast_qk.qk_clip_ = _planted_clip(kind)  # the documented seam of ortho_fast.functional.qk_clip
    try:
        yield
    finally:
        fast_qk.qk_clip_ = original


def _run(weights, m0s, grads, dtype, clip: dict | None, logits, planted: str | None):
    tdt = TORCH_DTYPES[dtype]
    params = [torch.nn.Parameter(torch.tensor(w, dtype=tdt)) for w in weights]
    group = {"params": params}
    if clip is not None:
        group.update(clip)
    options = registry.QK_CLIP_CONFIG.kwargs()
    if clip is None:
        options["qk_clip_threshold"] = None
    opt = ortho_fast.optimizer_preset("motif", [group], **options)
    for p, m0, g in zip(params, m0s, grads):
        opt.state[p]["momentum_buffer"] = torch.tensor(m0, dtype=tdt)
        p.grad = torch.tensor(g, dtype=tdt)
    s = torch.tensor(logits, dtype=torch.float32)
    if clip is not None and planted == "before_update":
        with torch.no_grad():
            for p, role in zip(params, clip["qk_clip_roles"]):
                fast_qk.qk_clip_(p.data, s, threshold=QK_CLIP_THRESHOLD, role=role, num_heads=QK_CLIP_HEADS[0],
                                 num_kv_heads=QK_CLIP_HEADS[1], layout=clip.get("qk_clip_layout", "concatenated"))
        opt.step()
    else:
        with _planted(planted):
            opt.step(qk_logits={"attn": s} if clip is not None else None)
    return [as_float64(p) for p in params]


def check_qk_clip(case: MatrixCase, dtype: str, layout: str = "qkv concatenated",
                  planted: str | None = None) -> list[CheckResult]:
    """(q) QK-clip after one Motif Muon step on a real gradient vs ``ortho_ref.qk_clip`` of the
    step without it (module docstring), parameters in ``dtype``; ``planted``: one of
    ``QK_CLIP_PLANTED`` (tests of the check). One row: the largest elementwise relative error.
    Rows that do not fit (fused: rows not a multiple of the 8 head blocks; separate: fewer than 6
    rows) are no-claim rows saying so."""
    h, kv = QK_CLIP_HEADS
    m, n = case.matrix.shape
    detail = f"{dtype} {layout} ({h} q heads, {kv} kv groups)" + (f" planted {planted}" if planted else "")
    blocks = h + 2 * kv if layout.startswith("qkv") else h + kv
    if (m % blocks if layout.startswith("qkv") else m < blocks):
        return [no_claim("qk_clip_vs_reference", case.name, detail, f"{m} rows are not {blocks} head blocks")]
    g = case.matrix
    w0 = case_array(case, "weight", g.shape, 0.02)
    m0 = case_array(case, "momentum", g.shape, float(np.abs(g).max()))
    logits = qk_clip_logits(case, h)
    if layout.startswith("qkv"):
        fused = layout.split()[1]
        split = [(w0, m0, g)]
        clip = {"qk_clip_roles": ["qkv"], "qk_clip_layer": "attn", "qk_clip_layout": fused}
    else:
        d = m // (h + kv)  # query rows h·d, key rows kv·d: the first (h + kv)·d rows are used
        rows = [slice(0, h * d), slice(h * d, (h + kv) * d)]
        split = [(w0[r], m0[r], g[r]) for r in rows]
        clip = {"qk_clip_roles": ["query", "key"], "qk_clip_layer": "attn"}
    ws, ms, gs = ([s[i] for s in split] for i in range(3))
    plain = _run(ws, ms, gs, dtype, None, logits, None)
    clipped = _run(ws, ms, gs, dtype, clip, logits, planted)
    s32 = np.asarray(logits, dtype=np.float32).astype(np.float64)  # the logits the optimizer was given
    kw = dict(threshold=QK_CLIP_THRESHOLD, num_heads=h, num_kv_heads=kv)
    if layout.startswith("qkv"):
        refs = [ref_qk.qk_clip_fused(plain[0], s32, head_dim=m // blocks, layout=clip["qk_clip_layout"], **kw)]
    else:
        refs = list(ref_qk.qk_clip(plain[0], plain[1], s32, **kw))
    err = max(float((np.abs(c - r) / np.where(r == 0, 1.0, np.abs(r))).max()) for c, r in zip(clipped, refs))
    return [measured("qk_clip_vs_reference", case.name, detail, err, qk_clip_tolerance(dtype),
                     "elementwise relative error of the clipped weights")]


def qk_clip_jobs(cases, dtypes=registry.QK_CLIP_DTYPES) -> list[tuple[str, callable]]:
    """(label, thunk) of every QK-clip row of ``ortho-verify`` (for ``ortho_verify.cli.main.plan_jobs``)."""
    return [(f"QK-clip {layout}/{dtype} {case.name}",
             lambda c=case, d=dtype, lay=layout: check_qk_clip(c, d, lay))
            for case in cases for layout in QK_CLIP_LAYOUTS for dtype in dtypes]
