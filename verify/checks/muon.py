"""Muon checks of ``ortho-verify``: one ``ortho_fast.Muon`` step per system our users come from
(``MUON_CONFIGS``, from ``ortho_verify.registry``) against ``ortho_ref.muon_step``, its parameter
layouts (fused QKV split by heads, banks) block by block, and bitwise parity with
``torch.optim.Muon`` (docs/design.md, "Muon" and "Systems our users come from").
"""

from __future__ import annotations

import math

import numpy as np
import torch

import ortho_fast
import ortho_ref

from .. import registry, tolerances as tol
from ..inputs.arrays import TORCH_DTYPES, as_float64, case_array, case_rng
from ..inputs.spectra import MatrixCase
from ..report.results import CheckResult, measured

__all__ = ["LAYOUT_BANK", "LAYOUT_HEADS", "MUON_CONFIGS", "check_muon", "check_muon_layouts", "check_torch_muon"]

#: Muon option sets of the systems users come from (docs/design.md, "Systems our users come from"):
#: ``ortho_verify.registry.MUON_CONFIGS`` (their sources are in ``ortho_verify.registry.CONFIGS``).
MUON_CONFIGS = registry.MUON_CONFIGS

#: Heads per q / k / v block in ``check_muon_layouts`` (the n_heads of ``ortho_verify.inputs.data``'s GPT,
#: whose fused qkv weight is (3·d, d) with rows ordered q heads, k heads, v heads).
LAYOUT_HEADS = 4
#: Same-shape matrices stacked into one bank in ``check_muon_layouts``.
LAYOUT_BANK = 3


def _fast_muon(config: str, dtype: str, mu: float, groups) -> list[tuple[np.ndarray, np.ndarray]]:
    """One ``ortho_fast.Muon`` step with the options of ``MUON_CONFIGS[config]`` computed in
    ``dtype``. ``groups``: [(extra group keys, [(weight, momentum, grad), ...])] of float64
    arrays; returns (weight, momentum) after the step, float64, per parameter in order."""
    opts = dict(MUON_CONFIGS[config])
    lr, wd = opts.pop("lr"), opts.pop("weight_decay")
    tdt = TORCH_DTYPES[dtype]
    params = [[torch.nn.Parameter(torch.tensor(w, dtype=tdt)) for w, _, _ in arrays] for _, arrays in groups]
    opt = ortho_fast.Muon([{**keys, "params": ps} for (keys, _), ps in zip(groups, params)], lr=lr, weight_decay=wd,
                          momentum=mu, dtype=tdt, **opts)
    for ps, (_, arrays) in zip(params, groups):
        for p, (_, m0, g) in zip(ps, arrays):
            opt.state[p]["momentum_buffer"] = torch.tensor(m0, dtype=tdt)
            p.grad = torch.tensor(g, dtype=tdt)
    opt.step()
    return [(as_float64(p), as_float64(opt.state[p]["momentum_buffer"])) for ps in params for p in ps]


def _muon_errors(config: str, dtype: str, mu: float, w0: np.ndarray, g: np.ndarray, m0: np.ndarray,
                weight: np.ndarray, momentum: np.ndarray) -> list[tuple[str, float, float]]:
    """[("weight", error, tolerance), ("momentum", error, tolerance)] of a fast Muon step on one
    (m, n) matrix (float64 ``weight`` / ``momentum`` after it) against ``ortho_ref.muon_step``
    from ``w0``, ``g``, ``m0`` with the options of ``MUON_CONFIGS[config]``: Frobenius errors,
    tolerances ``muon_tolerance`` (+ ``cautious_weight_decay_tolerance``) and
    ``momentum_tolerance`` for the compute ``dtype``."""
    opts = MUON_CONFIGS[config]
    lr, wd, eps_mode = opts["lr"], opts["weight_decay"], opts.get("eps_mode", "add")
    sched = ortho_ref.SCHEDULES[opts["coefficients"]]
    table = ortho_ref.schedule(opts["coefficients"])
    ref = ortho_ref.muon_step(
        w0, g, m0, lr=lr, mu=mu, nesterov=opts["nesterov"], momentum_style=opts["momentum_style"],
        coefficients=table, safety=sched.safety, eps=sched.eps, eps_mode=eps_mode, adjust_lr=opts["adjust_lr"],
        weight_decay=wd, extra_scale_factor=opts.get("extra_scale_factor", 1.0),
        cautious_weight_decay=opts.get("cautious_weight_decay", False),
    )
    sigma_hat = ortho_ref.normalized_singular_values(ref.ns_input, safety=sched.safety, eps=sched.eps,
                                                     eps_mode=eps_mode)
    ns_tol = tol.ns_tolerance(sigma_hat, table, g.shape, dtype)
    w_tol = tol.muon_tolerance(ns_tol, ref.lr_scale, lr, float(np.linalg.norm(w0)), float(np.linalg.norm(ref.update)),
                               dtype)
    if opts.get("cautious_weight_decay"):
        w_tol += tol.cautious_weight_decay_tolerance(w0, ref.update, ns_tol, lr, wd)
    m_tol = tol.momentum_tolerance(float(np.linalg.norm(g)), float(np.linalg.norm(m0)), dtype)
    return [("weight", float(np.linalg.norm(weight - ref.weight)), w_tol),
            ("momentum", float(np.linalg.norm(momentum - ref.momentum)), m_tol)]


def _muon_inputs(case: MatrixCase, suffix: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weight, momentum, gradient) of a Muon check: the case's matrix as the gradient."""
    g = case.matrix
    gscale = float(np.linalg.norm(g)) / math.sqrt(g.size)
    return case_array(case, "weight" + suffix, g.shape, 0.02), case_array(case, "momentum" + suffix, g.shape, gscale), g


def check_muon(case: MatrixCase, config: str, dtype: str, mu: float = 0.95) -> list[CheckResult]:
    """(c) One ``ortho_fast.Muon`` step vs ``ortho_ref.muon_step`` from the same weight and
    momentum, with the options of ``MUON_CONFIGS[config]``, computed in ``dtype``."""
    w0, m0, g = _muon_inputs(case)
    [(w, mom)] = _fast_muon(config, dtype, mu, [({}, [(w0, m0, g)])])
    return [measured("muon_vs_reference", case.name, f"{config}/{dtype} {key}", err, bound)
            for key, err, bound in _muon_errors(config, dtype, mu, w0, g, m0, w, mom)]


def check_muon_layouts(case: MatrixCase, dtype: str, config: str = "Megatron", mu: float = 0.95) -> list[CheckResult]:
    """(c') ``ortho_fast.Muon``'s parameter layouts on one step, block by block against
    ``ortho_ref.muon_step`` on each block alone (``_muon_errors``'s tolerances per block).

    - fused QKV (when m is divisible by 3): ``split_sizes`` = (m/3,)·3 and ``num_heads`` =
      ``LAYOUT_HEADS`` (1 when it does not divide m/3): each head's rows are one matrix;
    - banks: ``LAYOUT_BANK`` parameters of the case's shape (same gradient, own weight and
      momentum) with ``banks=True``, orthogonalized in one batched call.
    One row per layout and quantity (weight, momentum): the block with the largest
    error/tolerance, named in the note. Source: Megatron-LM split_qkv; Keller Jordan's and
    nanochat's banked Muon.
    """
    m = case.matrix.shape[0]
    bank = [_muon_inputs(case, f"/bank{i}" if i else "") for i in range(LAYOUT_BANK)]
    layouts = [("banks", {"banks": True}, bank, [(i, slice(None)) for i in range(LAYOUT_BANK)])]
    if m % 3 == 0:
        heads = LAYOUT_HEADS if (m // 3) % LAYOUT_HEADS == 0 else 1
        rows = m // (3 * heads)
        layouts.insert(0, (f"qkv 3x{heads} heads", {"split_sizes": (m // 3,) * 3, "num_heads": heads}, bank[:1],
                           [(0, slice(i, i + rows)) for i in range(0, m, rows)]))
    fast = iter(_fast_muon(config, dtype, mu, [(keys, arrays) for _, keys, arrays, _ in layouts]))
    out = []
    for name, _, arrays, blocks in layouts:
        after = [next(fast) for _ in arrays]
        rows_by_key: dict[str, list[CheckResult]] = {}
        for j, (i, sl) in enumerate(blocks):
            (w0, m0, g), (w, mom) = arrays[i], after[i]
            for key, err, bound in _muon_errors(config, dtype, mu, w0[sl], g[sl], m0[sl], w[sl], mom[sl]):
                rows_by_key.setdefault(key, []).append(measured(
                    "muon_layout_vs_reference", case.name, f"{config}/{dtype} {name} {key}", err, bound,
                    f"worst of {len(blocks)} blocks: block {j + 1}"))
        out += [max(rows, key=lambda r: (not r.passed, r.ratio)) for rows in rows_by_key.values()]
    return out


def check_torch_muon(case: MatrixCase, steps: int = 3) -> list[CheckResult]:
    """(e) ``ortho_fast.Muon(eps_mode="clamp")`` vs ``torch.optim.Muon`` with torch's
    defaults, float32 parameters, ``steps`` steps: bitwise equality expected."""
    g = case.matrix
    w0 = torch.tensor(case_array(case, "weight", g.shape, 0.02), dtype=torch.float32)
    p_ref = torch.nn.Parameter(w0.clone())
    p_fast = torch.nn.Parameter(w0.clone())
    o_ref = torch.optim.Muon([p_ref], lr=0.02)
    o_fast = ortho_fast.Muon([p_fast], lr=0.02, eps_mode="clamp")
    rng = case_rng(case, "torch-steps")
    for t in range(steps):
        grad = torch.tensor(g * (1.0 + 0.1 * t) + 0.01 * rng.standard_normal(g.shape) * np.abs(g).max(),
                            dtype=torch.float32)
        p_ref.grad, p_fast.grad = grad.clone(), grad.clone()
        o_ref.step()
        o_fast.step()
    err = float((p_ref.detach() - p_fast.detach()).abs().max())
    return [measured("muon_vs_torch", case.name, f"{steps} steps, bf16 NS, max |dW|", err, tol.TORCH_MUON_TOLERANCE)]
