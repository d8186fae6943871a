"""ortho_fast.groups.scalar (AdamW and Lion group steps): bitwise parity with torch.optim.AdamW,
agreement with the float64 oracle (ortho_ref.adamw_step / lion_step) within
ortho_verify.tolerances, and the error contract (checks before any change)."""

from __future__ import annotations

import collections
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ortho_ref
from ortho_fast.groups import scalar
from ortho_verify import tolerances as tol

SHAPES = [(), (7,), (5, 3), (2, 3, 4)]


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _group(algorithm: str, params, **options) -> dict:
    defaults = scalar.ADAMW_DEFAULTS if algorithm == "adamw" else scalar.LION_DEFAULTS
    group = {"params": list(params), **defaults, **options}
    (scalar.normalize_adamw_group if algorithm == "adamw" else scalar.normalize_lion_group)(group)
    return group


def _params(shapes, rng, dtype=torch.float64):
    return [torch.nn.Parameter(torch.tensor(rng.standard_normal(s), dtype=dtype)) for s in shapes]


def _np(t: torch.Tensor) -> np.ndarray:
    """A float64 numpy copy of a tensor's values."""
    return t.detach().double().numpy().copy()


def _step(algorithm: str, group: dict, state) -> None:
    check = scalar.check_adamw_step if algorithm == "adamw" else scalar.check_lion_step
    run = scalar.adamw_group_step if algorithm == "adamw" else scalar.lion_group_step
    check(group, state)
    run(group, state)


# =======================================================================================
# AdamW vs torch.optim.AdamW: bitwise
# =======================================================================================

ADAMW_OPTIONS = [
    {},  # torch's defaults
    dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.1),
    dict(lr=0.02, betas=(0.8, 0.99), eps=1e-8, weight_decay=0.0),
]


TORCH_PATHS = [(dtype, foreach) for dtype in (torch.float32, torch.float64, torch.bfloat16)
               for foreach in (None, False, True) if not (dtype == torch.bfloat16 and foreach)]


@pytest.mark.parametrize("dtype, foreach", TORCH_PATHS)
@pytest.mark.parametrize("options", ADAMW_OPTIONS, ids=["defaults", "olmo", "no_wd"])
def test_adamw_bitwise_equals_torch_adamw(options, dtype, foreach):
    """Same parameters, state (``step``, ``exp_avg``, ``exp_avg_sq``) and dtypes as
    torch.optim.AdamW for 6 steps; a parameter without a gradient on some steps is skipped by
    both. On CPU the default is the single-tensor path (foreach=None == False); the foreach
    path agrees in float32/float64 (bfloat16: see the next test)."""
    rng = _rng("adamw-torch", tuple(sorted(options.items())), str(dtype), foreach)
    ref_ps = _params(SHAPES, rng, dtype)
    ps = [torch.nn.Parameter(p.detach().clone()) for p in ref_ps]
    opt = torch.optim.AdamW(ref_ps, foreach=foreach, **options)
    group, state = _group("adamw", ps, **options), collections.defaultdict(dict)
    for k in range(6):
        for i, (a, b) in enumerate(zip(ref_ps, ps)):
            g = None if (i == 1 and k % 3 == 1) else torch.tensor(rng.standard_normal(a.shape), dtype=dtype)
            a.grad, b.grad = g, (None if g is None else g.clone())
        opt.step()
        _step("adamw", group, state)
        for a, b in zip(ref_ps, ps):
            assert torch.equal(a, b)
            assert set(opt.state[a]) == set(state[b]) == {"step", "exp_avg", "exp_avg_sq"}
            for key in ("step", "exp_avg", "exp_avg_sq"):
                x, y = opt.state[a][key], state[b][key]
                assert x.dtype == y.dtype and x.device == y.device and torch.equal(x, y), key
    assert float(state[ps[1]]["step"]) == 4 and float(state[ps[0]]["step"]) == 6


def test_torch_foreach_rounds_the_scalar_beta2_to_bfloat16():
    """Why torch.optim.AdamW(foreach=True) differs from its own single-tensor path (and ours)
    in bfloat16 on CPU: ``torch._foreach_mul_(exp_avg_sqs, β2)`` rounds β2 to bfloat16 first,
    ``Tensor.mul_(β2)`` multiplies in float32. With β2 = 0.95 the two differ."""
    x = torch.tensor(_rng("foreach-bf16").uniform(0, 1, 256), dtype=torch.bfloat16)
    single, multi = x.clone().mul_(0.95), [x.clone()]
    torch._foreach_mul_(multi, 0.95)
    assert torch.equal(single, (x.float() * 0.95).bfloat16())
    assert torch.equal(multi[0], (x.float() * torch.tensor(0.95).bfloat16().float()).bfloat16())
    assert not torch.equal(single, multi[0])


def test_adamw_state_from_torch_continues_bitwise():
    """A torch.optim.AdamW state (its layout is ours) continues bitwise under our step."""
    rng = _rng("adamw-handover")
    ref_ps = _params([(4, 3), (5,)], rng, torch.float32)
    ps = [torch.nn.Parameter(p.detach().clone()) for p in ref_ps]
    opt = torch.optim.AdamW(ref_ps, lr=0.01)
    grads = [[torch.tensor(rng.standard_normal(p.shape), dtype=torch.float32) for p in ps] for _ in range(4)]
    for k, gs in enumerate(grads):
        for p, g in zip(ref_ps, gs):
            p.grad = g.clone()
        opt.step()
        if k == 1:  # hand the state over after two steps
            state = collections.defaultdict(dict, {b: {key: v.clone() for key, v in opt.state[a].items()}
                                                   for a, b in zip(ref_ps, ps)})
            for a, b in zip(ref_ps, ps):
                b.data.copy_(a.detach())
    group = _group("adamw", ps, lr=0.01)
    for gs in grads[2:]:
        for p, g in zip(ps, gs):
            p.grad = g.clone()
        _step("adamw", group, state)
    for a, b in zip(ref_ps, ps):
        assert torch.equal(a, b)


# =======================================================================================
# Float64: fast vs oracle (and torch.optim.AdamW vs oracle) within ortho_verify.tolerances
# =======================================================================================


def _adamw_vs_oracle(shape, seed, options, steps=3, torch_adamw=False, dtype=torch.float64):
    """Run `steps` steps of the fast AdamW (or torch.optim.AdamW) from a nonzero state and
    compare each step with ortho_ref.adamw_step from the same inputs (float64 oracle)."""
    rng = np.random.default_rng(seed)
    p = torch.nn.Parameter(torch.tensor(rng.standard_normal(shape), dtype=dtype))
    m0, v0 = rng.standard_normal(shape), rng.standard_normal(shape) ** 2
    first = {"step": torch.tensor(5.0, dtype=torch.float32), "exp_avg": torch.tensor(m0, dtype=dtype),
             "exp_avg_sq": torch.tensor(v0, dtype=dtype)}
    if torch_adamw:
        opt = torch.optim.AdamW([p], foreach=False, **options)
        opt.state[p] = first
        state, run = opt.state, opt.step
    else:
        group, state = _group("adamw", [p], **options), collections.defaultdict(dict, {p: first})
        run = lambda: _step("adamw", group, state)  # noqa: E731
    full = {**scalar.ADAMW_DEFAULTS, **options}
    for _ in range(steps):
        st_ = state[p]
        w, m, v, t = (_np(p), _np(st_["exp_avg"]), _np(st_["exp_avg_sq"]), int(st_["step"]))
        p.grad = torch.tensor(rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3), dtype=dtype)
        g = _np(p.grad)
        run()
        ref = ortho_ref.adamw_step(w, g, m, v, t, **full)
        bound = tol.adamw_tolerances(ref, w, g, m, lr=full["lr"], betas=full["betas"], eps=full["eps"], dtype=dtype)
        for key, fast, exact in (("weight", p, ref.weight), ("exp_avg", st_["exp_avg"], ref.exp_avg),
                                 ("exp_avg_sq", st_["exp_avg_sq"], ref.exp_avg_sq)):
            err = np.abs(_np(fast) - exact)
            assert np.all(err <= bound[key]), f"{key}: worst err/tol {np.max(err / bound[key]):.3g}"
        assert int(st_["step"]) == ref.step == t + 1


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("torch_adamw", [False, True], ids=["ortho_fast", "torch"])
@pytest.mark.parametrize("options", ADAMW_OPTIONS, ids=["defaults", "olmo", "no_wd"])
@pytest.mark.parametrize("shape", SHAPES)
def test_adamw_matches_reference(shape, options, torch_adamw, dtype):
    _adamw_vs_oracle(shape, zlib.crc32(repr((shape, sorted(options.items()))).encode()), options,
                     torch_adamw=torch_adamw, dtype=dtype)


@settings(deadline=None)
@given(seed=st.integers(0, 2**32 - 1), b1=st.floats(0.5, 0.99), b2=st.floats(0.9, 0.9999),
       lr=st.floats(1e-5, 0.1), wd=st.floats(0.0, 0.5), eps=st.sampled_from([0.0, 1e-8, 1e-6]),
       shape=st.sampled_from(SHAPES))
def test_adamw_float64_matches_reference_property(seed, b1, b2, lr, wd, eps, shape):
    _adamw_vs_oracle(shape, seed, dict(lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd), steps=2)


def _lion_vs_oracle(shape, seed, options, steps=3, dtype=torch.float64):
    rng = np.random.default_rng(seed)
    p = torch.nn.Parameter(torch.tensor(rng.standard_normal(shape), dtype=dtype))
    group = _group("lion", [p], **options)
    state = collections.defaultdict(dict, {p: {"exp_avg": torch.tensor(rng.standard_normal(shape), dtype=dtype)}})
    full = {**scalar.LION_DEFAULTS, **options}
    for _ in range(steps):
        w, m = _np(p), _np(state[p]["exp_avg"])
        p.grad = torch.tensor(rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3), dtype=dtype)
        g = _np(p.grad)
        _step("lion", group, state)
        ref = ortho_ref.lion_step(w, g, m, **full)
        bound = tol.lion_tolerances(ref, w, g, m, lr=full["lr"], dtype=dtype)
        for key, fast, exact in (("weight", p, ref.weight), ("exp_avg", state[p]["exp_avg"], ref.exp_avg)):
            err = np.abs(_np(fast) - exact)
            assert np.all(err <= bound[key]), f"{key}: worst err/tol {np.max(err / bound[key]):.3g}"


LION_OPTIONS = [{}, dict(lr=3e-4, betas=(0.95, 0.98), weight_decay=0.1)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("options", LION_OPTIONS, ids=["defaults", "megatron"])
@pytest.mark.parametrize("shape", SHAPES)
def test_lion_matches_reference(shape, options, dtype):
    _lion_vs_oracle(shape, zlib.crc32(repr((shape, sorted(options.items()))).encode()), options, dtype=dtype)


@settings(deadline=None)
@given(seed=st.integers(0, 2**32 - 1), b1=st.floats(0.0, 1.0), b2=st.floats(0.0, 1.0), lr=st.floats(1e-6, 0.1),
       wd=st.floats(0.0, 1.0), shape=st.sampled_from(SHAPES))
def test_lion_float64_matches_reference_property(seed, b1, b2, lr, wd, shape):
    _lion_vs_oracle(shape, seed, dict(lr=lr, betas=(b1, b2), weight_decay=wd), steps=2)


@settings(deadline=None)
@given(seed=st.integers(0, 2**32 - 1), lr=st.floats(1e-6, 1.0),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
def test_lion_moves_each_weight_by_exactly_lr(seed, lr, dtype):
    """From W = 0 without decay the step is −lr·sign(c): every moved entry has bitwise the
    same magnitude, lr rounded to the parameter dtype (through float32 for bfloat16: at most
    u + u32 relative), and the sign of −g (fresh state: c = (1 − β1)g)."""
    rng = np.random.default_rng(seed)
    p = torch.nn.Parameter(torch.zeros(6, 5, dtype=dtype))
    g = torch.tensor(rng.standard_normal((6, 5)), dtype=dtype)
    g[0, 0] = 0.0  # c = 0 at fresh state: sign 0, no move
    p.grad = g
    group, state = _group("lion", [p], lr=lr), collections.defaultdict(dict)
    _step("lion", group, state)
    moved = p.detach().abs().flatten()[1:]
    assert p[0, 0] == 0 and torch.equal(moved, moved[0].expand(29))
    assert abs(float(moved[0]) - lr) <= (tol.unit_roundoff(dtype) + tol.UNIT_ROUNDOFF["float32"]) * lr
    assert torch.equal(torch.sign(p.detach()), -torch.sign(g))
    assert state[p]["exp_avg"].dtype == dtype


# =======================================================================================
# Options and the error contract
# =======================================================================================


@pytest.mark.parametrize("algorithm, key, value, match", [
    ("adamw", "lr", -1e-3, "lr"),
    ("adamw", "lr", "fast", "lr"),
    ("adamw", "eps", float("nan"), "eps"),
    ("adamw", "weight_decay", -0.1, "weight_decay"),
    ("adamw", "betas", (0.9, 1.0), "betas"),
    ("adamw", "betas", (0.9, 0.99, 0.999), "betas"),
    ("adamw", "betas", (-0.1, 0.99), r"betas\[0\]"),
    ("lion", "lr", float("inf"), "lr"),
    ("lion", "betas", 0.9, "betas"),
    ("lion", "betas", (0.9, 1.5), r"betas\[1\]"),
    ("lion", "weight_decay", None, "weight_decay"),
])
def test_normalize_rejects_bad_options(algorithm, key, value, match):
    p = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match=match):
        _group(algorithm, [p], **{key: value})


def test_normalize_stores_floats_and_a_betas_tuple():
    group = _group("adamw", [torch.nn.Parameter(torch.zeros(3))], lr=1, betas=[0.5, 0.75], weight_decay=0)
    assert group["betas"] == (0.5, 0.75) and type(group["lr"]) is float and type(group["weight_decay"]) is float
    assert _group("lion", [torch.nn.Parameter(torch.zeros(3))], betas=[1, 1])["betas"] == (1.0, 1.0)


def _bad_case(case: str, p: torch.nn.Parameter, state: dict):
    """Make parameter ``p`` (float64, shape (4, 3)) or its state invalid in one way."""
    if case == "nan":
        p.grad = torch.ones(4, 3, dtype=torch.float64)
        p.grad[1, 2] = float("nan")
    elif case == "inf":
        p.grad = torch.full((4, 3), float("-inf"), dtype=torch.float64)
    elif case == "shape":  # torch's grad setter refuses these; ``.data`` does not
        p.grad = torch.ones(4, 3, dtype=torch.float64)
        p.grad.data = torch.ones(3, 4, dtype=torch.float64)
    elif case == "dtype":
        p.grad = torch.ones(4, 3, dtype=torch.float64)
        p.grad.data = torch.ones(4, 3, dtype=torch.float32)
    elif case == "sparse":
        p.grad = torch.ones(4, 3, dtype=torch.float64).to_sparse()
    elif case == "state":
        state[p]["exp_avg"] = torch.zeros(12, dtype=torch.float64)
    return ValueError


@pytest.mark.parametrize("algorithm", ["adamw", "lion"])
@pytest.mark.parametrize("case", ["nan", "inf", "shape", "dtype", "sparse", "state"])
def test_check_rejects_bad_gradients_and_state_and_changes_nothing(algorithm, case):
    rng = _rng("bad", algorithm, case)
    good, bad = _params([(5,), (4, 3)], rng)
    group, state = _group(algorithm, [good, bad]), collections.defaultdict(dict)
    for p in (good, bad):
        p.grad = torch.tensor(rng.standard_normal(p.shape))
    _step(algorithm, group, state)  # state exists for both
    before = [p.detach().clone() for p in (good, bad)]
    saved = {id(p): {k: v.clone() for k, v in s.items()} for p, s in state.items()}
    good.grad = torch.tensor(rng.standard_normal(good.shape))
    error = _bad_case(case, bad, state)
    saved_bad = {k: v.clone() for k, v in state[bad].items()}
    check = scalar.check_adamw_step if algorithm == "adamw" else scalar.check_lion_step
    with pytest.raises(error, match="grad|exp_avg") as info:
        check(group, state)
    assert "parameter 1" in str(info.value)
    for p, b in zip((good, bad), before):
        assert torch.equal(p.detach(), b)
    assert torch.equal(state[good]["exp_avg"], saved[id(good)]["exp_avg"])
    assert all(torch.equal(v, saved_bad[k]) for k, v in state[bad].items())


@pytest.mark.parametrize("algorithm", ["adamw", "lion"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.complex64])
def test_check_rejects_non_real_floating_parameters(algorithm, dtype):
    p = torch.zeros(3, dtype=dtype)
    p.grad = torch.zeros(3, dtype=dtype)
    check = scalar.check_adamw_step if algorithm == "adamw" else scalar.check_lion_step
    with pytest.raises(TypeError, match="real floating-point"):
        check(_group(algorithm, [p]), {})


@pytest.mark.parametrize("algorithm", ["adamw", "lion"])
@pytest.mark.parametrize("key, value", [("lr", float("nan")), ("lr", "1e-3"), ("weight_decay", -0.1),
                                        ("betas", (0.9, float("nan"))), ("betas", 0.9)])
def test_check_rejects_options_edited_after_normalization(algorithm, key, value):
    """check_<alg>_step re-checks the options (a scheduler may have written them) and changes
    nothing: the group keeps the edited value, no state is created."""
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.ones(3)
    group = _group(algorithm, [p])
    group[key] = value
    check = scalar.check_adamw_step if algorithm == "adamw" else scalar.check_lion_step
    state = collections.defaultdict(dict)
    with pytest.raises(ValueError, match=rf"^{key}(\[\d\])?:"):
        check(group, state)
    assert group[key] is value and not state


def test_check_adamw_rejects_a_bad_step_entry():
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.ones(3)
    state = {p: {"step": torch.zeros(2), "exp_avg": torch.zeros(3), "exp_avg_sq": torch.zeros(3)}}
    with pytest.raises(ValueError, match="step"):
        scalar.check_adamw_step(_group("adamw", [p]), state)


def test_parameters_without_gradients_get_no_state():
    a, b = _params([(3,), (2,)], _rng("nograd"))
    a.grad = torch.ones(3, dtype=torch.float64)
    for algorithm in ("adamw", "lion"):
        state = collections.defaultdict(dict)
        _step(algorithm, _group(algorithm, [a, b]), state)
        assert a in state and b not in state
