"""ortho_fast.Dion's bitwise contracts: CholeskyQR2 falling back to Householder, the randomized
QR's sketch (a function of the generator's seed alone), the same seed giving the same bits
without the global RNG, each step being ``dion_update`` with the documented generator, state_dict
round trips, zero gradients (decay only), flattened conv weights (also channels_last) and the
group functions another optimizer drives.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch

import ortho_fast
from ortho_fast import Dion
from ortho_fast.functional.dion import dion_rank, dion_update, initial_q
from ortho_fast.functional.qr import gaussian_sketch, orthonormalize, sketch_generator, sketch_rows
from ortho_fast.groups.dion import DION_DEFAULTS, check_dion_step, dion_group_step, normalize_dion_group
from ortho_verify import tolerances as tol
from ortho_verify.inputs.spectra import matrix_with_spectrum
from tests.ortho_fast.helpers import DION_RANDOMIZED, DION_SEED, SHAPES, rng_for, spectral_matrix
from tests.round_trip import round_trip

# =======================================================================================
# QR methods on the fast side
# =======================================================================================


def _tall(rows, r, cond, seed):
    return torch.tensor(matrix_with_spectrum(np.geomspace(1.0, 1.0 / cond, r), rows, r, np.random.default_rng(seed)))


@pytest.mark.parametrize("dtype, cond", [(torch.float64, 1e9), (torch.float32, 1e5)])
def test_cholesky_qr2_falls_back_to_householder(dtype, cond):
    """κ(Y) beyond u^(-1/2) of the factorization dtype: CholeskyQR2 returns Householder's P bit for bit."""
    y = _tall(50, 10, cond, 0).to(dtype)
    assert torch.equal(orthonormalize(y, "cholesky_qr"), orthonormalize(y))
    y_ok = _tall(50, 10, 10.0, 0).to(dtype)
    assert not torch.equal(orthonormalize(y_ok, "cholesky_qr"), orthonormalize(y_ok))


def test_randomized_qr_sketch_and_fallback():
    """No compression (k >= rows): Householder, bit for bit, and the generator is not advanced;
    with compression the result depends only on the generator's seed."""
    y = _tall(10, 8, 10.0, 1)
    gen = torch.Generator().manual_seed(3)
    before = gen.get_state()
    assert torch.equal(orthonormalize(y, "randomized_cholesky_qr", generator=gen),
                       orthonormalize(y))
    assert torch.equal(gen.get_state(), before)
    y = _tall(64, 6, 1e10, 2)  # far past CholeskyQR2: the sketch preconditions it
    a, b, c = (orthonormalize(y, "randomized_cholesky_qr", generator=torch.Generator().manual_seed(s))
               for s in (4, 4, 5))
    assert torch.equal(a, b) and not torch.equal(a, c)
    sketch = gaussian_sketch(torch.Generator().manual_seed(4), sketch_rows(6), 64, torch.float64, "cpu")
    ks = tol.sketch_condition(y.numpy(), sketch.numpy())
    omega = tol.qr_orthogonality_tolerance(64, 6, "randomized_cholesky_qr", sketch_condition=ks)
    assert np.linalg.norm(a.numpy().T @ a.numpy() - np.eye(6)) <= omega
    with pytest.raises(TypeError, match="^generator:"):
        orthonormalize(y, "randomized_cholesky_qr")


# =======================================================================================
# Determinism and state_dict
# =======================================================================================


def _run(make, grads, w0, dtype=torch.float64):
    ps = [torch.nn.Parameter(torch.tensor(w, dtype=dtype)) for w in w0]
    opt = make(ps)
    for step in grads:
        for p, g in zip(ps, step):
            p.grad = torch.tensor(g, dtype=dtype)
        opt.step()
    return ps, opt


def _assert_same(run_a, run_b):
    (pa, oa), (pb, ob) = run_a, run_b
    for a, b in zip(pa, pb):
        assert torch.equal(a, b)
        assert set(oa.state[a]) == set(ob.state[b]) == {"momentum", "Q", "step"}
        for k in oa.state[a]:
            assert oa.state[a][k].dtype == ob.state[b][k].dtype and torch.equal(oa.state[a][k], ob.state[b][k]), k


def test_same_seed_same_bits_and_no_global_rng():
    rng = rng_for("det")
    w0 = [0.02 * rng.standard_normal(s) for s in SHAPES]
    grads = [[spectral_matrix(s, rng) for s in SHAPES] for _ in range(3)]
    make = lambda seed: lambda ps: Dion(ps, seed=seed, **DION_RANDOMIZED)  # noqa: E731
    torch.manual_seed(0)
    a = _run(make(5), grads, w0)
    torch.manual_seed(1)
    b = _run(make(5), grads, w0)
    _assert_same(a, b)
    c = _run(make(6), grads, w0)
    assert not torch.equal(a[0][0], c[0][0])


def test_optimizer_step_is_dion_update_with_the_documented_generator():
    """The optimizer's step on parameter i at step t is ``dion_update`` with Q0 = initial_q(…, seed, i)
    and the sketches of ``sketch_generator(seed, i, t)``, bit for bit."""
    rng = rng_for("gen")
    ps = [torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(s))) for s in SHAPES]
    opt = Dion(ps, seed=DION_SEED, **DION_RANDOMIZED)
    x = ps[2].detach().clone()
    r = dion_rank(20, 20, 0.5)
    mom, q = torch.zeros(20, 20, dtype=torch.float64), initial_q((20, r), DION_SEED, 2, torch.float64, "cpu")
    for t in (1, 2):
        for p in ps:
            p.grad = torch.tensor(spectral_matrix(tuple(p.shape), rng))
        opt.step()
        dion_update(x, ps[2].grad, mom, q, lr=0.01, mu=0.95, weight_decay=0.01, epsilon=1e-8,
                    power_iters=2, qr_method="randomized_cholesky_qr", right_factor="qr",
                    generator=sketch_generator(DION_SEED, 2, t, "cpu"))
        assert torch.equal(x, ps[2].detach()) and torch.equal(mom, opt.state[ps[2]]["momentum"])
        assert torch.equal(q, opt.state[ps[2]]["Q"])


@pytest.mark.parametrize("param_dtype, extra", [
    (torch.float64, DION_RANDOMIZED),
    (torch.bfloat16, dict(DION_RANDOMIZED, momentum_dtype=torch.float32, q_dtype=torch.float32)),
    (torch.float32, dict(qr_method="cholesky_qr", momentum_dtype=torch.bfloat16, rank_fraction=0.25)),
])
def test_state_dict_round_trip_is_bitwise(param_dtype, extra):
    """k steps, save, load into a fresh Dion on cloned parameters, continue: bitwise the
    uninterrupted run — the step counter re-draws the same sketches, and the state keeps its
    dtypes (a float32 momentum of a bfloat16 parameter is not rounded by load_state_dict)."""
    rng = rng_for("rt", str(param_dtype))
    w0 = [0.02 * rng.standard_normal(s) for s in SHAPES]
    grads = [[spectral_matrix(s, rng) for s in SHAPES] for _ in range(4)]
    make = lambda ps: Dion(ps, lr=0.02, seed=3, **extra)  # noqa: E731
    full, (resumed_ps, resumed) = round_trip(make, w0, grads, dtype=param_dtype)
    _assert_same(full, (resumed_ps, resumed))
    mdt = extra.get("momentum_dtype", param_dtype)
    assert resumed.state[resumed_ps[0]]["momentum"].dtype == mdt


# =======================================================================================
# Zero gradients, flatten, the param-group contract
# =======================================================================================


@pytest.mark.parametrize("qr_method", ortho_fast.functional.qr.QR_METHODS)
@pytest.mark.parametrize("right_factor", ortho_fast.functional.dion.RIGHT_FACTORS)
def test_zero_gradient_only_decays(qr_method, right_factor):
    p = torch.nn.Parameter(torch.ones(12, 8, dtype=torch.float64))
    opt = Dion([p], lr=0.1, weight_decay=0.5, rank_fraction=0.5, qr_method=qr_method, right_factor=right_factor, seed=2)
    p.grad = torch.zeros(12, 8, dtype=torch.float64)
    opt.step()
    assert torch.equal(opt.state[p]["Q"], initial_q((8, 4), 2, 0, torch.float64, "cpu"))
    assert not opt.state[p]["momentum"].any() and torch.equal(p.detach(),
                                                              torch.full((12, 8), 0.95, dtype=torch.float64))


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_flatten_conv_weight_equals_the_matrix_run(memory_format):
    """flatten=True: an (8, 3, 3, 3) weight steps exactly as the (8, 27) matrix (same seed and
    index), also when stored channels_last (no view: updated through a copy)."""
    rng = rng_for("conv")
    w0 = torch.tensor(0.02 * rng.standard_normal((8, 3, 3, 3)))
    grads = [torch.tensor(rng.standard_normal((8, 3, 3, 3))) for _ in range(2)]
    conv = torch.nn.Parameter(w0.clone().to(memory_format=memory_format))
    mat = torch.nn.Parameter(w0.reshape(8, 27).clone())
    o_conv = Dion([conv], flatten=True, rank_fraction=0.5, seed=1,
                  **{k: v for k, v in DION_RANDOMIZED.items() if k != "rank_fraction"})
    o_mat = Dion([mat], rank_fraction=0.5, seed=1, **{k: v for k, v in DION_RANDOMIZED.items() if k != "rank_fraction"})
    for g in grads:
        conv.grad, mat.grad = g.clone().to(memory_format=memory_format), g.reshape(8, 27).clone()
        o_conv.step()
        o_mat.step()
    assert torch.equal(conv.detach().reshape(8, 27), mat.detach())
    assert torch.equal(o_conv.state[conv]["momentum"].reshape(8, 27), o_mat.state[mat]["momentum"])
    assert o_conv.state[conv]["Q"].shape == (8, 4) and o_conv.state[conv]["momentum"].shape == (8, 3, 3, 3)


def test_group_functions_drive_dion_groups_like_dion():
    """The contract another optimizer uses: a group filled from DION_DEFAULTS, normalized,
    checked and stepped with ``first_index`` equals Dion's own step of the same parameter at
    the same global index, bit for bit."""
    rng = rng_for("contract")
    w_a, w_b = (0.02 * rng.standard_normal(s) for s in ((6, 4), (24, 16)))
    grads = [rng.standard_normal((24, 16)) for _ in range(2)]
    a0, b0 = torch.nn.Parameter(torch.tensor(w_a)), torch.nn.Parameter(torch.tensor(w_b))
    opt = Dion([{"params": [a0]}, {"params": [b0], "qr_method": "rcqr", "rank_fraction": 0.5}], seed=DION_SEED)
    b1 = torch.nn.Parameter(torch.tensor(w_b))
    group = dict(DION_DEFAULTS, params=[b1], qr_method="rcqr", rank_fraction=0.5, algorithm="dion")
    normalize_dion_group(group)
    assert group["qr_method"] == "randomized_cholesky_qr" == opt.param_groups[1]["qr_method"]
    state = defaultdict(dict)
    for g in grads:
        b0.grad, b1.grad = torch.tensor(g), torch.tensor(g)
        opt.step()
        check_dion_step(group, state)
        dion_group_step(group, state, seed=DION_SEED, first_index=1)
    assert torch.equal(b0, b1)
    assert all(torch.equal(opt.state[b0][k], state[b1][k]) for k in ("momentum", "Q", "step"))
    assert set(DION_DEFAULTS) == set(opt.defaults)
