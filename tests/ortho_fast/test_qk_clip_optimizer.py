"""QK-clip in ortho_fast.Muon: applied after the update, roles from names or group keys, the
``qk_logits`` / ``record_max_logits`` hook, bad input rejected before any change, state dicts."""

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st
from torch import nn

from ortho_fast import Muon
from ortho_fast.functional.qk_clip import qk_clip_
from ortho_fast.groups.qk_clip import role_of_name
from ortho_ref.qk_clip import qk_clip, qk_clip_fused
from ortho_verify.tolerances.qk_clip import qk_clip_tolerance

CLIP = dict(qk_clip_threshold=5.0, qk_clip_num_heads=4, qk_clip_num_kv_heads=2)


class Attention(nn.Module):
    def __init__(self, fused: bool = False):
        super().__init__()
        if fused:
            self.linear_qkv = nn.Linear(16, 32, bias=False)  # (4 + 2·2) heads × 4 rows
        else:
            self.q_proj = nn.Linear(16, 16, bias=False)
            self.k_proj = nn.Linear(16, 8, bias=False)
            self.v_proj = nn.Linear(16, 8, bias=False)


def model(fused: bool = False, layers: int = 2) -> nn.Module:
    torch.manual_seed(0)
    return nn.ModuleDict({"layers": nn.ModuleList([Attention(fused) for _ in range(layers)])})


def set_grads(m: nn.Module, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in m.parameters():
        p.grad = torch.randn(p.shape, generator=g)


def weights(m: nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in m.named_parameters()}


LOGITS = {0: torch.tensor([1.0, 10.0, 3.0, 20.0]), 1: torch.tensor([1.0, 2.0, 3.0, 4.0])}


def rel(fast, ref):
    f, r = fast.double().numpy(), np.asarray(ref)
    return float((np.abs(f - r) / np.where(r == 0, 1, np.abs(r))).max())


def test_clip_follows_the_update():
    m, plain = model(), model()
    opt = Muon(m.named_parameters(), lr=0.02, **CLIP)
    ref_opt = Muon(plain.named_parameters(), lr=0.02)
    set_grads(m), set_grads(plain)
    opt.step(qk_logits=LOGITS)
    ref_opt.step()
    a, b = m["layers"][0], plain["layers"][0]
    def d(t):
        return t.detach().double().numpy()
    wq, wk = qk_clip(d(b.q_proj.weight), d(b.k_proj.weight), LOGITS[0].numpy(), threshold=5.0, num_heads=4,
                     num_kv_heads=2)
    assert rel(a.q_proj.weight.detach(), wq) <= qk_clip_tolerance("float32")
    assert rel(a.k_proj.weight.detach(), wk) <= qk_clip_tolerance("float32")
    assert torch.equal(a.v_proj.weight, b.v_proj.weight)
    # layer 1: no head over τ -> bitwise the plain step
    for name in ("q_proj", "k_proj"):
        assert torch.equal(getattr(m["layers"][1], name).weight, getattr(plain["layers"][1], name).weight)
    assert opt.qk_clip_factors[0].tolist() == [0.5, 0.25]


def test_record_max_logits_keeps_the_maximum_and_matches_qk_logits():
    m1, m2 = model(), model()
    o1 = Muon(m1.named_parameters(), **CLIP)
    o2 = Muon(m2.named_parameters(), **CLIP)
    set_grads(m1), set_grads(m2)
    o1.record_max_logits(0, torch.tensor([1.0, 10.0, 0.0, 2.0]))
    o1.record_max_logits(0, torch.tensor([0.0, 3.0, 3.0, 20.0]))
    o1.step()
    o2.step(qk_logits={0: LOGITS[0]})
    for (k, a), b in zip(weights(m1).items(), weights(m2).values()):
        assert torch.equal(a, b), k
    set_grads(m1, 2), set_grads(m2, 2)
    o1.step(), o2.step()  # the recorded logits were used once: neither clips now
    for (k, a), b in zip(weights(m1).items(), weights(m2).values()):
        assert torch.equal(a, b), k


@pytest.mark.parametrize("layout", ["concatenated", "grouped"])
def test_fused_qkv_by_name(layout):
    m, plain = model(fused=True), model(fused=True)
    opt = Muon(m.named_parameters(), **CLIP, qk_clip_layout=layout)
    ref_opt = Muon(plain.named_parameters())
    set_grads(m), set_grads(plain)
    opt.step(qk_logits={1: LOGITS[0]})
    ref_opt.step()
    w = plain["layers"][1].linear_qkv.weight.detach().double().numpy()
    ref = qk_clip_fused(w, LOGITS[0].numpy(), threshold=5.0, num_heads=4, num_kv_heads=2, head_dim=4, layout=layout)
    assert rel(m["layers"][1].linear_qkv.weight.detach(), ref) <= qk_clip_tolerance("float32")
    assert torch.equal(m["layers"][0].linear_qkv.weight, plain["layers"][0].linear_qkv.weight)


def test_roles_by_group_keys():
    m, plain = model(layers=1), model(layers=1)
    a = m["layers"][0]
    opt = Muon([{"params": [a.q_proj.weight, a.k_proj.weight], "qk_clip_roles": ["query", "key"],
                 "qk_clip_layer": "attn0"}, {"params": [a.v_proj.weight]}], **CLIP)
    ref_opt = Muon(plain.parameters())
    set_grads(m), set_grads(plain)
    opt.step(qk_logits={"attn0": LOGITS[0]})
    ref_opt.step()
    b = plain["layers"][0]
    expect = b.q_proj.weight.detach().clone()
    qk_clip_(expect, LOGITS[0], threshold=5.0, role="query", num_heads=4, num_kv_heads=2)
    assert torch.equal(a.q_proj.weight, expect)


@pytest.mark.parametrize("name, expect", [
    ("layers.3.attn.wq.weight", ("query", 3)),  # Motif
    ("model.layers.0.self_attn.k_proj.weight", ("key", 0)),  # Hugging Face
    ("transformer.h.11.attn.c_q.weight", ("query", 11)),  # nanochat
    ("_orig_mod.decoder.layers.2.self_attention.linear_qkv.weight", ("qkv", 2)),  # Megatron, compiled
    ("attn.c_k.weight", ("key", "attn")),
    ("layers.0.attn.v_proj.weight", (None, None)),
    ("layers.0.attn.q_proj.bias", (None, None)),
])
def test_role_of_name(name, expect):
    assert role_of_name(name) == expect


@pytest.mark.parametrize("logits, match", [
    ({0: torch.tensor([1.0, float("nan"), 1.0, 1.0])}, "qk_logits of layer 0"),
    ({0: torch.tensor([1.0, 2.0, 3.0])}, "4 real maximum logits"),
    ({7: torch.tensor([1.0, 2.0, 3.0, 4.0])}, "layer 7"),
    ([torch.ones(4)], "mapping"),
])
def test_bad_logits_change_nothing(logits, match):
    m = model()
    opt = Muon(m.named_parameters(), **CLIP)
    set_grads(m)
    before = weights(m)
    with pytest.raises((ValueError, TypeError), match=match):
        opt.step(qk_logits=logits)
    for k, v in weights(m).items():
        assert torch.equal(v, before[k]), k
    assert len(opt.state) == 0


@pytest.mark.parametrize("kwargs, match", [
    (dict(qk_clip_threshold=-1.0, qk_clip_num_heads=4), "qk_clip_threshold"),
    (dict(qk_clip_threshold=float("inf"), qk_clip_num_heads=4), "qk_clip_threshold"),
    (dict(qk_clip_threshold=5.0), "qk_clip_num_heads"),
    (dict(qk_clip_threshold=5.0, qk_clip_num_heads=4, qk_clip_num_kv_heads=3), "qk_clip_num_kv_heads"),
    (dict(qk_clip_threshold=5.0, qk_clip_num_heads=3), "qk_clip_num_heads"),
    (dict(qk_clip_threshold=5.0, qk_clip_num_heads=4, qk_clip_alpha=2.0), "qk_clip_alpha"),
    (dict(qk_clip_threshold=5.0, qk_clip_num_heads=4, qk_clip_layout="x"), "qk_clip_layout"),
])
def test_bad_options_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Muon(model().named_parameters(), **kwargs)


def test_layer_needs_query_and_key():
    m = model(layers=1)
    named = [(n, p) for n, p in m.named_parameters() if "k_proj" not in n]
    opt = Muon(named, **CLIP)
    set_grads(m)
    with pytest.raises(ValueError, match="layer 0 has roles"):
        opt.step()


def test_clip_off_ignores_logits_and_no_op_is_bitwise():
    m, plain, quiet = model(), model(), model()
    o1, o2 = Muon(m.named_parameters()), Muon(plain.named_parameters())
    o3 = Muon(quiet.named_parameters(), **{**CLIP, "qk_clip_threshold": 1e6})
    for mm in (m, plain, quiet):
        set_grads(mm)
    o1.step(qk_logits=LOGITS)
    o2.step()
    o3.step(qk_logits=LOGITS)
    for k, v in weights(plain).items():
        assert torch.equal(weights(m)[k], v) and torch.equal(weights(quiet)[k], v), k


def test_state_dict_round_trip_bitwise():
    m = model()
    opt = Muon(m.named_parameters(), **CLIP)
    set_grads(m)
    opt.step(qk_logits=LOGITS)
    saved = copy.deepcopy(opt.state_dict())
    assert saved["param_groups"][0]["qk_clip_threshold"] == 5.0
    m2 = copy.deepcopy(m)
    opt2 = Muon(m2.named_parameters(), **CLIP)
    opt2.load_state_dict(saved)
    for mm, oo in ((m, opt), (m2, opt2)):
        set_grads(mm, seed=5)
        oo.step(qk_logits=LOGITS)
    for (k, a), b in zip(weights(m).items(), weights(m2).values()):
        assert torch.equal(a, b), k
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"],
                       opt2.state_dict()["state"][0]["momentum_buffer"])


def test_old_checkpoint_keeps_current_qk_clip_options():
    m = model()
    old = Muon(m.named_parameters())
    set_grads(m)
    old.step()
    saved = old.state_dict()
    for g in saved["param_groups"]:
        for k in [k for k in g if k.startswith("qk_clip")]:
            del g[k]
    opt = Muon(m.named_parameters(), **CLIP)
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["qk_clip_threshold"] == 5.0


def test_bad_saved_qk_clip_option_rejected_before_change():
    m = model()
    opt = Muon(m.named_parameters(), **CLIP)
    saved = opt.state_dict()
    saved["param_groups"][0]["qk_clip_threshold"] = -2.0
    with pytest.raises(ValueError, match="qk_clip_threshold"):
        opt.load_state_dict(saved)
    assert opt.param_groups[0]["qk_clip_threshold"] == 5.0


def test_recorded_and_given_logits_merge_by_maximum():
    m1, m2 = model(), model()
    o1, o2 = Muon(m1.named_parameters(), **CLIP), Muon(m2.named_parameters(), **CLIP)
    set_grads(m1), set_grads(m2)
    o1.record_max_logits(0, torch.tensor([1.0, 10.0, 0.0, 0.0]))
    o1.step(qk_logits={0: torch.tensor([0.0, 0.0, 3.0, 20.0])})
    o2.step(qk_logits={0: LOGITS[0]})
    for (k, a), b in zip(weights(m1).items(), weights(m2).values()):
        assert torch.equal(a, b), k


def test_record_rejects_another_head_count_and_non_tensors():
    opt = Muon(model().named_parameters(), **CLIP)
    opt.record_max_logits(0, torch.ones(4))
    with pytest.raises(ValueError, match="max_logits: layer 0 was recorded with 4 heads"):
        opt.record_max_logits(0, torch.ones(3))
    with pytest.raises(TypeError, match="max_logits"):
        opt.record_max_logits(0, [1.0, 2.0, 3.0, 4.0])


@pytest.mark.parametrize("check_finite, reads", [(True, 2), (False, 0)])
def test_host_reads(check_finite, reads):
    """QK-clip adds one device read (the logits' finiteness, decided at once for every layer) to the
    step's one, and none with check_finite=False: the clip factors stay on the device (torch.where)."""
    from tests.ortho_fast.test_compile_and_syncs import CountSyncs

    m = model()
    opt = Muon(m.named_parameters(), check_finite=check_finite, **CLIP)
    set_grads(m)
    with CountSyncs() as counter:
        opt.step(qk_logits=LOGITS)
    assert counter.count == reads


@st.composite
def attention_case(draw):
    kv = draw(st.sampled_from([1, 2, 3]))
    heads = kv * draw(st.sampled_from([1, 2]))
    d = draw(st.sampled_from([1, 2, 4]))
    fused = draw(st.booleans())
    layout = draw(st.sampled_from(["concatenated", "grouped"]))
    logits = draw(st.lists(st.floats(-10.0, 50.0), min_size=heads, max_size=heads))
    return kv, heads, d, fused, layout, torch.tensor(logits)


@given(attention_case(), st.sampled_from([0.5, 0.0, 1.0]))
def test_optimizer_clip_is_the_reference_clip_of_the_update(case, alpha):
    """Any GQA shape, fused or separate, any α: the optimizer's weights after a step with QK-clip are
    the reference clip of the weights after the same step without it (float32 tolerance)."""
    kv, heads, d, fused, layout, logits = case
    shapes = [((heads + 2 * kv) * d, 6)] if fused else [(heads * d, 6), (kv * d, 6)]
    roles = ["qkv"] if fused else ["query", "key"]
    gen = torch.Generator().manual_seed(heads * 100 + kv * 10 + d)
    w0 = [torch.randn(s, generator=gen) for s in shapes]
    grads = [torch.randn(s, generator=gen) for s in shapes]
    ps, qs = [nn.Parameter(w.clone()) for w in w0], [nn.Parameter(w.clone()) for w in w0]
    clip = dict(qk_clip_threshold=5.0, qk_clip_alpha=alpha, qk_clip_num_heads=heads, qk_clip_num_kv_heads=kv,
                qk_clip_layout=layout)
    opt = Muon([{"params": ps, "qk_clip_roles": roles, "qk_clip_layer": "a"}], **clip)
    plain = Muon(qs)
    for p, q, g in zip(ps, qs, grads):
        p.grad, q.grad = g.clone(), g.clone()
    opt.step(qk_logits={"a": logits})
    plain.step()
    after = [q.detach().double().numpy() for q in qs]
    kw = dict(threshold=5.0, alpha=alpha, num_heads=heads, num_kv_heads=kv)
    s = logits.double().numpy()
    refs = ([qk_clip_fused(after[0], s, head_dim=d, layout=layout, **kw)] if fused
            else list(qk_clip(after[0], after[1], s, **kw)))
    for p, r in zip(ps, refs):
        assert rel(p.detach(), r) <= qk_clip_tolerance("float32")
