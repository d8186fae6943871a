"""Pinned tolerances of the Newton–Schulz and Muon checks.

As in test_pinned_dion.py: a planted error of ``BEYOND`` times the pinned tolerance fails the
check that uses it, one of ``INSIDE`` times passes; the plant's size is a recorded value
(``PIN_*``, the formula's value at this fixed input, 3 significant digits) or the derivation
restated here, never a call of the tolerance function, so a tolerance loosened (or tightened)
by 10x fails a test. docs/verification.md, "Pinned tolerances".
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ortho_fast
import ortho_ref
from ortho_verify.api import check_optimizer, optimizer_inputs
from ortho_verify.checks.muon import MUON_CONFIGS, check_muon
from ortho_verify.checks.newton_schulz import compare_ns_output
from ortho_verify.inputs.spectra import MatrixCase, matrix_with_spectrum
from ortho_verify.planted.bugs import CORRECT_OPTIMIZERS, SimpleMuon

BEYOND, INSIDE = 2.0, 0.5
U32, U64 = 2.0**-24, 2.0**-53
PLANTS = [(BEYOND, False), (INSIDE, True)]

#: The input of the Newton–Schulz pins: 9 × 6, σ = geomspace(1, 0.3, 6), jordan (safety 1, eps 1e-7).
A = matrix_with_spectrum(np.geomspace(1.0, 0.3, 6), 9, 6, np.random.default_rng(7))
TABLE = ortho_ref.schedule("jordan")
SIGMA_HAT = ortho_ref.normalized_singular_values(A, safety=1.0, eps=1e-7)
#: ``ns_tolerance`` (float32) at A.
PIN_NS = 3.36e-4
#: ``ns_singular_value_tolerances`` (bfloat16) at A, in the order of SIGMA_HAT (descending).
PIN_NS_SV_BF16 = np.array([0.346, 0.343, 0.118, 0.223, 0.126, 0.378])


def _direction(seed: int, shape) -> np.ndarray:
    e = np.random.default_rng(seed).standard_normal(shape)
    return e / np.linalg.norm(e)


def _with_singular_values(values: np.ndarray) -> np.ndarray:
    """U diag(values) Vᵀ with A's singular vectors (values in A's descending order)."""
    u, _, vt = ortho_ref.svd(A)
    return (u[:, :len(values)] * values) @ vt[:len(values)]


def _rows(fast: np.ndarray, dtype: str) -> dict:
    rows = compare_ns_output(fast, A, TABLE, safety=1.0, eps=1e-7, dtype=dtype, input_name="pinned", detail="pin")
    return {r.check: r for r in rows}


@pytest.mark.parametrize("factor, passes", PLANTS)
def test_ns_tolerance_pinned(factor, passes):
    """``ns_tolerance`` through ``compare_ns_output`` (check ``ns_vs_ns_map``, float32)."""
    fast = ortho_ref.ns_map(A, TABLE, safety=1.0, eps=1e-7) + factor * PIN_NS * _direction(0, A.shape)
    row = _rows(fast, "float32")["ns_vs_ns_map"]
    assert row.passed is passes, row


@pytest.mark.parametrize("edge", ["lower", "upper"])
@pytest.mark.parametrize("factor, passes", PLANTS)
def test_spread_in_band_edges_pinned(edge, factor, passes):
    """Both edges of the spread-in-band check (float32): the smallest (largest) singular value
    moved to lo − x (hi + x) with every other at its exact f(σ̂ᵢ) fails for x = 2·PIN_NS and
    passes for x = PIN_NS/2 (a check without its lower edge passes the first)."""
    lo, hi = ortho_ref.ns_band(TABLE, float(SIGMA_HAT.min()), float(SIGMA_HAT.max()))
    values = ortho_ref.ns_polynomial(SIGMA_HAT, TABLE)
    i = int(np.argmin(values)) if edge == "lower" else int(np.argmax(values))
    values[i] = lo - factor * PIN_NS if edge == "lower" else hi + factor * PIN_NS
    row = _rows(_with_singular_values(values), "float32")["spread_in_band"]
    assert row.passed is passes, row
    if not passes:
        assert row.error == pytest.approx(factor * PIN_NS, rel=1e-6)


@pytest.mark.parametrize("factor, passes", PLANTS)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_ns_singular_value_tolerances_pinned(factor, passes, sign):
    """``ns_singular_value_tolerances`` (bfloat16) through ``compare_ns_output``: every direction
    moved by ±factor·τᵢ (checks ``ns_projected_singular_values`` and the sorted ``ns_vs_ns_map``)."""
    values = ortho_ref.ns_polynomial(SIGMA_HAT, TABLE) + sign * factor * PIN_NS_SV_BF16
    rows = _rows(_with_singular_values(values), "bfloat16")
    assert rows["ns_projected_singular_values"].passed is passes, rows["ns_projected_singular_values"]
    if passes:
        assert rows["ns_vs_ns_map"].passed, rows["ns_vs_ns_map"]


# --- Muon steps: check_muon (muon_tolerance, cautious_weight_decay_tolerance, momentum_tolerance) ---

#: check_muon's tolerances (float32, μ = 0.95) at the case ``_case()``: weight (``muon_tolerance``,
#: + ``cautious_weight_decay_tolerance`` for nanochat) and momentum (``momentum_tolerance``).
PIN_MUON_WEIGHT = {"torch.optim.Muon": 8.33e-6, "microsoft/dion": 1.50e-5, "Moonlight": 4.41e-7,
                   "Megatron": 9.27e-8, "nanochat (cautious wd)": 2.73e-5}
PIN_MUON_MOMENTUM = 1.04e-6


def _case() -> MatrixCase:
    return MatrixCase("pinned/9x6", A, "synthetic", "pinned tolerances")


def _planted_muon(key: str, size: float):
    """ortho_fast.Muon with ``size``·(unit direction) added to the weight or the momentum buffer
    after each step."""

    class PlantedMuon(ortho_fast.Muon):
        @torch.no_grad()
        def step(self, closure=None):
            out = super().step(closure)
            for group in self.param_groups:
                for p in group["params"]:
                    target = p if key == "weight" else self.state[p]["momentum_buffer"]
                    target.add_(torch.tensor(size * _direction(5, tuple(p.shape)), dtype=target.dtype))
            return out

    return PlantedMuon


def test_muon_config_pins_cover_every_config():
    assert sorted(PIN_MUON_WEIGHT) == sorted(MUON_CONFIGS)


@pytest.mark.parametrize("config", sorted(PIN_MUON_WEIGHT))
@pytest.mark.parametrize("factor, passes", PLANTS)
def test_muon_tolerance_pinned(monkeypatch, config, factor, passes):
    """``muon_tolerance`` (and ``cautious_weight_decay_tolerance`` for nanochat) through
    ``check_muon``'s weight row."""
    monkeypatch.setattr(ortho_fast, "Muon", _planted_muon("weight", factor * PIN_MUON_WEIGHT[config]))
    rows = {r.detail.split()[-1]: r for r in check_muon(_case(), config, "float32")}
    assert rows["weight"].passed is passes, rows["weight"]
    assert rows["momentum"].passed


@pytest.mark.parametrize("factor, passes", PLANTS)
def test_momentum_tolerance_pinned_in_check_muon(monkeypatch, factor, passes):
    """``momentum_tolerance`` through ``check_muon``'s momentum row."""
    monkeypatch.setattr(ortho_fast, "Muon", _planted_muon("momentum", factor * PIN_MUON_MOMENTUM))
    rows = {r.detail.split()[-1]: r for r in check_muon(_case(), "Megatron", "float32")}
    assert rows["momentum"].passed is passes, rows["momentum"]
    assert rows["weight"].passed


class _BufferPlantedMuon(SimpleMuon):
    """SimpleMuon whose stored momentum buffer gets ``plant`` (a (9, 6) array) added after the
    step (the update itself is correct)."""

    plant: np.ndarray = np.zeros((9, 6))

    @torch.no_grad()
    def step(self, closure=None):
        super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if tuple(p.shape) == self.plant.shape:  # the (9, 6) parameter, not check_optimizer's decay probe
                    self.state[p]["momentum_buffer"].add_(torch.tensor(self.plant, dtype=p.dtype))


@pytest.mark.parametrize("factor, passes", PLANTS)
def test_momentum_tolerance_pinned_in_check_optimizer(factor, passes):
    """``momentum_tolerance`` through ``check_optimizer`` (row ``muon_momentum``), one float32 step
    from a zero buffer: 6(u + u64)‖G₁‖_F, restated (G₁ the float32 gradient it was given)."""
    _, conventions = CORRECT_OPTIMIZERS["SimpleMuon"]
    [(_, grads)] = optimizer_inputs(((9, 6),), 1, 10.0, 0)
    g1 = torch.tensor(grads[0], dtype=torch.float32).double().numpy()
    pinned = 6 * (U32 + U64) * float(np.linalg.norm(g1))
    planted = type("Planted", (_BufferPlantedMuon,), {"plant": factor * pinned * _direction(6, (9, 6))})
    report = check_optimizer(planted, conventions, steps=1, shapes=((9, 6),), param_dtype=torch.float32)
    [row] = [r for r in report.results if r.check == "muon_momentum"]
    assert row.passed is passes, row
    assert all(r.passed for r in report.results if r.check != "muon_momentum")
