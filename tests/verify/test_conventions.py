"""Conventions: every option of ortho_fast's Muon expressible in
MuonConventions (extra_scale_factor, cautious weight decay, √max(m, n) scaling), bad
declarations rejected by name, and kernels limited to (b, m, n) checked with max_batch_dims."""

import dataclasses
import functools

import pytest
import torch

import ortho_fast
from ortho_verify import DionConventions, MuonConventions, check_optimizer, check_orthogonalizer
from ortho_verify.api import default_examples
from ortho_verify.planted.bugs import newton_schulz_kernel


@pytest.mark.parametrize("options, conventions", [
    (dict(adjust_lr="spectral", extra_scale_factor=0.2), dict(adjust_lr="spectral", extra_scale_factor=0.2)),
    (dict(cautious_weight_decay=True), dict(cautious_weight_decay=True)),
], ids=["spectral-with-extra-scale-factor", "cautious-weight-decay"])
def test_muon_options_are_expressible_and_required(options, conventions):
    opt = functools.partial(ortho_fast.Muon, dtype=torch.float32, eps_mode="clamp", **options)
    report = check_optimizer(opt, MuonConventions(ns_dtype=torch.float32, eps_mode="clamp", **conventions))
    assert report.passed, report.summary()
    undeclared = check_optimizer(opt, MuonConventions(ns_dtype=torch.float32, eps_mode="clamp"))
    assert undeclared.status == "failed"


@pytest.mark.parametrize("cls, kwargs, field", [
    (MuonConventions, {"adjust_lr": "rms"}, "adjust_lr"),
    (MuonConventions, {"momentum_style": "heavy_ball"}, "momentum_style"),
    (MuonConventions, {"extra_scale_factor": 0.0}, "extra_scale_factor"),
    (MuonConventions, {"bias_correction": "yes"}, "bias_correction"),
    (MuonConventions, {"bias_correction": True, "momentum_style": "classic"}, "bias_correction"),
    (MuonConventions, {"bias_correction": True, "nesterov_form": "full_grad"}, "bias_correction"),
    (DionConventions, {"qr_method": "rcqr"}, "qr_method"),
    (DionConventions, {"orientation": "wide"}, "orientation"),
    (DionConventions, {"power_iters": 0}, "power_iters"),
    (DionConventions, {"orthonormalize_dtype": torch.int8}, "orthonormalize_dtype"),
])
def test_bad_declarations_name_the_field(cls, kwargs, field):
    with pytest.raises((ValueError, TypeError), match=field):
        cls(**kwargs)


@pytest.mark.parametrize("stages", [{}, {"renormalize": True}], ids=["plain", "stage-path"])
def test_bias_correction_declared_for_a_muon_without_it_fails_from_step_2(stages):
    """ortho_fast.Muon keeps no bias correction. Declared with one, step 1 passes (M_0 = 0: both Nesterov
    inputs are ∝ G) and every later step fails; declared without, it passes (the plain and the stage path)."""
    opt = functools.partial(ortho_fast.Muon, dtype=torch.float32, eps_mode="clamp", **stages)
    plain = MuonConventions(ns_dtype=torch.float32, eps_mode="clamp", **stages)
    fast = dict(param_dtype=torch.float32, statistical_matrices=0, shapes=[(24, 12), (10, 20)])
    assert check_optimizer(opt, plain, **fast).passed
    report = check_optimizer(opt, MuonConventions(ns_dtype=torch.float32, eps_mode="clamp", bias_correction=True,
                                                  **stages), **fast)
    assert report.status == "failed"
    updates = [r for r in report.results if r.check in ("muon_update/ns_vs_ns_map", "muon_stages_vs_reference")
               and "momentum" not in r.detail]
    by_step = {s: [r.passed for r in updates if r.input.endswith(f"step {s}")] for s in (1, 2, 3)}
    assert by_step[1] and all(by_step[1]), by_step
    assert by_step[2] and not any(by_step[2]) and not any(by_step[3]), by_step
    momenta = [r for r in report.results if r.check == "muon_momentum" or "momentum" in r.detail]
    assert momenta and all(r.passed for r in momenta)  # the stored buffer is the uncorrected EMA


def test_max_batch_dims_for_kernels_taking_at_most_three_dims():
    def kernel_3d(g):  # takes (m, n) or (b, m, n) only
        assert g.ndim <= 3, "expected at most 3-D"
        return newton_schulz_kernel(g)

    shapes = {ex.matrix.ndim for ex in default_examples(max_batch_dims=1)}
    assert shapes == {2, 3}
    assert not check_orthogonalizer(kernel_3d, dtype=torch.float32).passed
    report = check_orthogonalizer(kernel_3d, dtype=torch.float32, max_batch_dims=1)
    assert report.passed, report.summary()
    assert {ex.matrix.ndim for ex in default_examples(batched=False, max_batch_dims=1)} == {2}
    with pytest.raises(ValueError, match="max_batch_dims"):
        check_orthogonalizer(kernel_3d, max_batch_dims=-1)


def test_bias_correction_misdeclared_names_bias_correction_as_the_cause():
    """Declared with a bias correction the optimizer does not keep, the failing update's cause names
    the form without it (the replay explains the update, residual ≤ a tenth of the declared form's)."""
    opt = functools.partial(ortho_fast.Muon, dtype=torch.float32, eps_mode="clamp")
    report = check_optimizer(opt, MuonConventions(ns_dtype=torch.float32, eps_mode="clamp", bias_correction=True),
                             param_dtype=torch.float32, statistical_matrices=0, shapes=[(24, 12)])
    failing = [r for r in report.results if r.check == "muon_update/ns_vs_ns_map" and not r.passed]
    assert failing and all("the update matches bias_correction=False" in r.cause for r in failing), \
        [r.cause for r in failing]


class _L2ClassicMuon(torch.optim.Optimizer):
    """A Muon with coupled L2 decay (G ← G + wd·W) and the classic Nesterov momentum
    (M ← μM + G, U = G + μM), ortho_fast's float32 Newton–Schulz with torch's clamp: written for
    a declaration that gets the momentum style wrong."""

    def __init__(self, params, lr=0.02, momentum=0.95, weight_decay=0.5):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad + group["weight_decay"] * p
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.mul_(group["momentum"]).add_(g)
                o = ortho_fast.newton_schulz(g + group["momentum"] * buf, "jordan", eps_mode="clamp",
                                             dtype=torch.float32)
                p.add_(o, alpha=-group["lr"] * max(1.0, p.shape[0] / p.shape[1]) ** 0.5)


def test_l2_declared_style_misdeclared_names_the_style_from_the_l2_gradient():
    """Under a declared "l2" style the replay starts from the gradient the momentum takes (G + wd·W):
    the classic momentum is named as the cause where the EMA is declared."""
    declared = MuonConventions(ns_dtype=torch.float32, eps_mode="clamp", weight_decay_style="l2")
    report = check_optimizer(_L2ClassicMuon, declared, param_dtype=torch.float32, statistical_matrices=0,
                             shapes=[(24, 12)])
    failing = [r for r in report.results if r.check == "muon_update/ns_vs_ns_map" and not r.passed]
    assert failing and all("momentum_style='classic'" in r.cause.split(" where ")[0] for r in failing), \
        [r.cause for r in failing]
    right = dataclasses.replace(declared, momentum_style="classic")
    assert check_optimizer(_L2ClassicMuon, right, param_dtype=torch.float32, statistical_matrices=0,
                           shapes=[(24, 12)]).passed
