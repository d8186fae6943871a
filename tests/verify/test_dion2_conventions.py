"""``Dion2Conventions`` and ``check_dion2_optimizer``: the judge's check of any Dion2-like
optimizer class passes ortho_fast.Dion2 and a correct optimizer of our own written differently,
and fails the same optimizer with a planted bug."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import ortho_fast
from ortho_verify.checks.dion2 import check_dion2_optimizer
from ortho_verify.conventions import DION2, Dion2Conventions
from tests.verify.test_dion2_checks import planted_dion2


class PlantedDion2(torch.optim.Optimizer):
    """A Dion2 of our own (numpy float64 per matrix, ``planted_dion2``: ties to the higher index,
    Newton–Schulz on the other Gram side), with one planted ``bug`` or none."""

    def __init__(self, params, lr=0.01, fraction=0.25, ef_decay=0.95, weight_decay=0.01, bug=None):
        super().__init__(params, dict(lr=lr, fraction=fraction, ef_decay=ef_decay, weight_decay=weight_decay))
        self.bug = bug

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            opts = {k: group[k] for k in ("lr", "fraction", "ef_decay", "weight_decay")}
            for p in group["params"]:
                st = self.state[p]
                m = st.get("momentum", torch.zeros_like(p)).double().numpy()
                w, mom = planted_dion2(p.double().numpy(), p.grad.double().numpy(), m, bug=self.bug,
                                       options={**opts, "adjust_lr": "spectral_norm"})
                p.copy_(torch.from_numpy(w))
                st["momentum"] = torch.from_numpy(mom).to(p.dtype)


FLOAT64 = Dion2Conventions(ns_dtype=torch.float64)


def test_ortho_fast_passes_in_float64_and_with_its_bfloat16_default():
    rows = check_dion2_optimizer(ortho_fast.Dion2, Dion2Conventions(ns_dtype=torch.float64,
                                                                    extra_kwargs={"dtype": torch.float64}),
                                 param_dtype=torch.float64)
    assert rows and all(r.passed and math.isfinite(r.tolerance) for r in rows)
    rows = check_dion2_optimizer(ortho_fast.Dion2, DION2)
    assert all(r.passed for r in rows)
    assert sum(math.isfinite(r.tolerance) for r in rows) == 2 * len(rows) // 3  # selection and momentum claim


def test_our_own_dion2_passes_and_each_planted_bug_fails():
    rows = check_dion2_optimizer(PlantedDion2, FLOAT64, param_dtype=torch.float64)
    assert all(r.passed for r in rows), [(r.case, r.detail, r.error, r.tolerance) for r in rows if not r.passed]
    for bug in ("l2", "wrong_dim", "ef_all", "whole_matrix", "floor_k"):
        rows = check_dion2_optimizer(lambda params, **kw: PlantedDion2(params, bug=bug, **kw), FLOAT64,
                                     param_dtype=torch.float64, fraction=0.3)
        assert not all(r.passed for r in rows), bug


def test_conventions_and_arguments_are_checked():
    with pytest.raises(ValueError, match="adjust_lr"):
        Dion2Conventions(adjust_lr="original")
    with pytest.raises(TypeError, match="ns_dtype"):
        Dion2Conventions(ns_dtype=torch.int32)
    with pytest.raises(TypeError, match="conventions"):
        check_dion2_optimizer(ortho_fast.Dion2, object())
    with pytest.raises(KeyError, match="momentum_state_key"):
        check_dion2_optimizer(ortho_fast.Dion2, Dion2Conventions(momentum_state_key="exp_avg"), steps=1)
    assert np.isclose(DION2.epsilon, 1e-8) and DION2.coefficients == "polar_express"
