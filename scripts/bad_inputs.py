"""Bad inputs against the optimizers, the functional core, the oracle and the judge: a few
hundred cases, each (family, the names a clear message must give, setup, action), classified as
silent (no error), confusing (an error naming none of them, or not a ValueError / TypeError), clear,
(for the few valid inputs in the list, names None: clear when accepted as documented), and state_changed (an optimizer's
parameters, state or groups differ after an error).

    python scripts/bad_inputs.py
"""
import collections
import copy
import os
import random
import warnings

if __name__ == "__main__":  # eager when run; a test that imports this file keeps its process's dynamo
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import ortho_fast  # noqa: E402
import ortho_ref  # noqa: E402
import ortho_verify  # noqa: E402
from ortho_fast import Dion, Dion2, HybridOptimizer, Muon, NorMuon  # noqa: E402
from ortho_verify.checks.optimizer_checks import check_optimizer  # noqa: E402

SHAPES = ((6, 4), (4, 5), (3, 3))
def params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in SHAPES]
OPTS = {
    "Muon": lambda ps: Muon(ps), "NorMuon": lambda ps: NorMuon(ps), "Dion": lambda ps: Dion(ps),
    "Dion2": lambda ps: Dion2(ps),
    "AdamW": lambda ps: HybridOptimizer([{"params": ps, "algorithm": "adamw"}]),
    "Lion": lambda ps: HybridOptimizer([{"params": ps, "algorithm": "lion"}]),
    "Hybrid": lambda ps: HybridOptimizer([{"params": ps[:2], "algorithm": "muon"},
                                          {"params": ps[2:], "algorithm": "adamw"}]),
}
def stepped(name, seed=0, steps=2):
    ps = params(seed)
    opt = OPTS[name](ps)
    g = torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    return ps, opt

def snap(v):
    if isinstance(v, torch.Tensor):
        return ("T", v.detach().clone())
    if isinstance(v, dict):
        return {k: snap(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [snap(x) for x in v]
    return copy.deepcopy(v)
def same(a, b):
    if isinstance(a, tuple) and a and a[0] == "T":
        return (isinstance(b, tuple) and b[0] == "T" and a[1].shape == b[1].shape and a[1].dtype == b[1].dtype
                and torch.equal(a[1], b[1]))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    try:
        return a == b or (a != a and b != b)
    except Exception:
        return True
def everything(opt, ps):
    idx = {id(p): i for i, p in enumerate(ps)}
    groups = [{k: ([idx.get(id(p), -1) for p in v] if k == "params" else v) for k, v in g.items()}
              for g in opt.param_groups]
    return snap({"p": list(ps), "s": [dict(opt.state.get(p, {})) for p in ps], "g": groups})

CASES = []
def case(family, names, fn):
    CASES.append((family, names, fn))

rng = random.Random(26)
SECOND = {"NorMuon": "variance_neuron", "AdamW": "exp_avg_sq", "Hybrid": "exp_avg_sq"}

# ---- load_state_dict corruptions, every optimizer, several seeds
def load_case(name, seed, corrupt):
    def fn():
        ps, opt = stepped(name, seed)
        sd = copy.deepcopy(opt.state_dict())
        corrupt(sd, ps, opt)
        return (opt, ps), (lambda: opt.load_state_dict(sd))
    return fn
def first_entry(sd): return next(iter(sd["state"].values()))
def emptied_case(name, seed):
    """An entry emptied to {} (what reading ``opt.state[p]`` of a torch optimizer leaves behind)
    means no state, as an absent entry: the load must succeed and give what dropping the entry
    gives (docs/compatibility.md, "Never silently reset")."""
    def fn():
        ps, opt = stepped(name, seed)
        sd = copy.deepcopy(opt.state_dict())
        key = next(iter(sd["state"]))
        absent = copy.deepcopy(sd)
        del absent["state"][key]
        sd["state"][key] = {}
        def action():
            opt.load_state_dict(absent)
            want = everything(opt, ps)
            opt.load_state_dict(sd)
            if not same(want, everything(opt, ps)):
                raise AssertionError("an emptied entry loaded differently from an absent one")
        return None, action
    return fn
for name in OPTS:
    for seed in range(3):
        k = rng.randint(50, 10**6)
        case("load: JSON string keys", ["state", "'0'"],
             load_case(name, seed, lambda sd, ps, o: sd.__setitem__(
                 "state", {str(k): v for k, v in sd["state"].items()})))
        case("load: entry of no parameter", ["state", str(k)],
             load_case(name, seed, lambda sd, ps, o, k=k: sd["state"].__setitem__(k, copy.deepcopy(first_entry(sd)))))
        key = rng.choice(["foo", "momentum_buffer2", "exp_avg", "Q", "max_exp_avg_sq", "momentum"])
        def unk(sd, ps, o, key=key):
            e = first_entry(sd)
            if key in e:
                e[key + "_x"] = torch.zeros(1)
            else:
                e[key] = torch.zeros(1)
        case("load: unknown state key", [key], load_case(name, seed, unk))
        case("load: id listed twice", ["param_groups", "0"],
             load_case(name, seed, lambda sd, ps, o: sd["param_groups"][-1]["params"].append(
                 sd["param_groups"][0]["params"][0])))
        def nan(sd, ps, o):
            e = first_entry(sd)
            kk = [k for k, v in e.items() if v.is_floating_point() and v.numel() > 1][0]
            e[kk].view(-1)[0] = float("nan")
        case("load: NaN in state", ["momentum", "exp_avg", "Q", "variance_neuron"], load_case(name, seed, nan))
        def shape(sd, ps, o):
            e = first_entry(sd)
            kk = [k for k, v in e.items() if v.numel() > 1][0]
            e[kk] = torch.zeros(7, 7)
        case("load: wrong state shape", ["momentum", "exp_avg", "Q", "variance_neuron", "shape"],
             load_case(name, seed, shape))
        def intdt(sd, ps, o):
            e = first_entry(sd)
            kk = [k for k, v in e.items() if v.numel() > 1][0]
            e[kk] = e[kk].long()
        case("load: integer state", ["momentum", "exp_avg", "Q", "variance_neuron"], load_case(name, seed, intdt))
        def missing(sd, ps, o):  # a partial entry: one key gone, others left
            e = next(e for e in sd["state"].values() if len(e) > 1)
            kk = [k for k in e if k != "step"][0]
            del e[kk]
        if name not in ("Muon", "Dion2", "Lion"):  # one-key states cannot be partial: "emptied entry" below
            case("load: missing state key", ["momentum", "exp_avg", "Q", "variance_neuron"],
                 load_case(name, seed, missing))
        case("load: emptied entry", None, emptied_case(name, seed))
        case("load: fewer groups", ["param_groups", "parameter group", "groups"],
             load_case(name, seed, lambda sd, ps, o: sd.__setitem__(
                 "param_groups", sd["param_groups"] + [copy.deepcopy(sd["param_groups"][0])])))
        case("load: lr negative", ["lr"],
             load_case(name, seed, lambda sd, ps, o: sd["param_groups"][0].__setitem__("lr", -0.5)))
        case("load: weight_decay NaN", ["weight_decay"],
             load_case(name, seed, lambda sd, ps, o: sd["param_groups"][0].__setitem__("weight_decay", float("nan"))))
        case("load: state not a dict", ["state"],
             load_case(name, seed, lambda sd, ps, o: sd.__setitem__("state", [1, 2])))
    if name in SECOND:
        for seed in range(4):
            v = -10 ** rng.uniform(-20, 5)
            def neg(sd, ps, o, v=v, key=SECOND[name]):
                e = [e for e in sd["state"].values() if key in e][0]
                e[key].view(-1)[-1] = v
            case("load: negative second moment", [SECOND[name]], load_case(name, seed, neg))
    for other, make in [("SGD", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
                        ("Adam", lambda ps: torch.optim.Adam(ps, lr=0.1)),
                        ("RMSprop", lambda ps: torch.optim.RMSprop(ps, lr=0.1, momentum=0.9))]:
        if name in ("AdamW", "Hybrid") and other == "Adam":
            continue  # a torch Adam(W) checkpoint into AdamW groups is a supported path when its flags are AdamW's
        for stepped_foreign in (False, True):
            def fn(name=name, make=make, stepped_foreign=stepped_foreign):
                ps, opt = stepped(name)
                f = make(ps)
                if stepped_foreign:
                    for p in ps:
                        p.grad = torch.ones_like(p)
                    f.step()
                sd = copy.deepcopy(f.state_dict())
                return (opt, ps), (lambda: opt.load_state_dict(sd))
            case(f"load: torch.optim.{other} state dict", ["dampening", "momentum", "betas", "alpha", "centered",
                                                           "amsgrad", "momentum_buffer", "exp_avg", "square_avg",
                                                           "foreach", "maximize", "capturable", "differentiable",
                                                           "decoupled_weight_decay", "eps", "fused",
                                                           "param_groups"], fn)
for a, b in [("Muon", "Dion2"), ("Muon", "Dion"), ("Dion", "Muon"), ("Dion2", "Muon"), ("NorMuon", "Dion2"),
             ("Dion2", "Dion")]:
    def fn(a=a, b=b):
        ps, src = stepped(a)
        ps2, dst = stepped(b)
        sd = copy.deepcopy(src.state_dict())
        return (dst, ps2), (lambda: dst.load_state_dict(sd))
    case(f"load: {a} state dict into {b}", ["momentum", "mu", "fraction", "ef_decay", "rank_fraction",
                                            "momentum_buffer", "Q", "nesterov", "flatten", "coefficients",
                                            "momentum_style", "Muon", "Dion", "oversample", "epsilon",
                                            "error_feedback"], fn)

def meta_state(sd, ps, o):  # a checkpoint materialized on the meta device: shapes, no data
    e = first_entry(sd)
    for k in [k for k, v in e.items() if isinstance(v, torch.Tensor)]:
        e[k] = torch.empty(e[k].shape, dtype=e[k].dtype, device="meta")
for name in OPTS:
    case("load: meta-device state tensor", ["momentum_buffer", "momentum", "exp_avg", "exp_avg_sq", "step", "Q",
                                            "variance_neuron"], load_case(name, 0, meta_state))
for other, make in [("SGD", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
                    ("RMSprop", lambda ps: torch.optim.RMSprop(ps, lr=0.1)),
                    ("AdamW", lambda ps: torch.optim.AdamW(ps, lr=0.1))]:
    def fn(make=make):  # one torch group against Hybrid's two: the message must say what the checkpoint holds
        ps, opt = stepped("Hybrid")
        sd = copy.deepcopy(make(ps).state_dict())
        return (opt, ps), (lambda: opt.load_state_dict(sd))
    case(f"load: torch.optim.{other} state dict into Hybrid (group count)",
         {"SGD": ["dampening"], "RMSprop": ["centered"], "AdamW": ["amsgrad"]}[other], fn)

# ---- construction
for name in OPTS:
    for seed in range(2):
        def dup(name=name, seed=seed):
            p = params(seed)[0]
            return None, (lambda: OPTS[name]([p, p]))
        case("construct: parameter twice", ["params", "parameter"], dup)
        def meta(name=name):
            ps = [torch.nn.Parameter(torch.empty(s, device="meta")) for s in SHAPES]
            return None, (lambda: OPTS[name](ps))
        case("construct: meta parameter", ["params", "meta"], meta)
        def dup_add(name=name, seed=seed):
            ps, opt = stepped(name, seed)
            extra = torch.nn.Parameter(torch.randn(3, 3))
            g = {"params": [extra, extra]}
            if isinstance(opt, HybridOptimizer):
                g["algorithm"] = opt.param_groups[0]["algorithm"]
            return (opt, ps), (lambda: opt.add_param_group(g))
        case("add_param_group: parameter twice", ["params", "parameter"], dup_add)
        def cross(name=name, seed=seed):
            ps, opt = stepped(name, seed)
            g = {"params": [torch.nn.Parameter(torch.randn(3, 3)), ps[0]]}
            if isinstance(opt, HybridOptimizer):
                g["algorithm"] = opt.param_groups[0]["algorithm"]
            return (opt, ps), (lambda: opt.add_param_group(g))
        case("add_param_group: parameter of another group", ["params"], cross)
HYPER = [
    (Muon, "lr", [-1.0, float("nan")]), (Muon, "momentum", [1.5, -0.1]), (Muon, "mu", [1.5, 2.0]),
    (Muon, "weight_decay", [-1.0, float("inf")]), (NorMuon, "muon_beta2", [1.5, -0.5]),
    (NorMuon, "normuon_beta2", [1.0001]),
    (Muon, "epsilon", [-1.0]), (Muon, "eps", [-1.0]), (Dion, "mu", [1.5]), (Dion, "rank_fraction", [0.0, 1.5]),
    (Dion, "rcqr_oversample", [0.5]), (Dion2, "ef_decay", [1.5, -0.2, 2.0]), (Dion2, "fraction", [0.0, 1.5]),
    (Dion2, "lr", [-0.1]), (Dion2, "betas", [(1.5, 0.9), (0.9,)]), (Muon, "ns_steps", [0, -1, 2.5]),
    (Muon, "safety", [0.0, -1.0]), (Muon, "dtype", [torch.int32, "int8"]), (Muon, "coefficients", ["nope", [(1, 2)]]),
]
for cls, arg, values in HYPER:
    for v in values:
        case(f"construct: {cls.__name__}({arg}=bad)", [arg],
             lambda cls=cls, arg=arg, v=v: (None, lambda: cls(params(), **{arg: v})))
        def grp(cls=cls, arg=arg, v=v):
            ps = params()
            opt = cls(ps[:2])
            return (opt, ps[:2]), (lambda: opt.add_param_group({"params": [ps[2]], arg: v}))
        case(f"add_param_group: {cls.__name__} group {arg}=bad", [arg], grp)
for key, v in [("rank_fraction", 0.5), ("momentum", 0.9), ("qr_method", "rcqr"), ("nesterov", True),
               ("betas", (0.9, 0.95))]:
    def grp(key=key, v=v):  # another algorithm's option in a Dion2 group: it would do nothing there
        ps = params()
        opt = Dion2(ps[:2])  # microsoft/dion's betas: accepted (checked, unused), the group added
        return ((opt, ps[:2]) if key != "betas" else None), (lambda: opt.add_param_group({"params": [ps[2]], key: v}))
    case(f"add_param_group: Dion2 group with another algorithm's {key}", [key] if key != "betas" else None, grp)
for algorithm, arg, v in [("adamw", "betas", (1.5, 0.9)), ("adamw", "eps", -1.0), ("lion", "betas", (0.9, 1.5)),
                          ("adamw", "lr", -1.0), ("lion", "weight_decay", float("nan"))]:
    case(f"construct: Hybrid {algorithm} {arg}=bad", [arg, arg + "[0]", arg + "[1]"],
         lambda algorithm=algorithm, arg=arg, v=v: (
             None, lambda: HybridOptimizer([{"params": params(), "algorithm": algorithm, arg: v}])))

for alg, arg, v in [("muon", "mu", 1.5), ("muon", "epsilon", -1.0), ("dion", "rcqr_oversample", 0.5),
                    ("muon", "cautious_wd", "yes")]:
    case(f"construct: Hybrid {alg} alias {arg}=bad", [arg],
         lambda alg=alg, arg=arg, v=v: (
             None, lambda: HybridOptimizer([{"params": params(), "algorithm": alg, arg: v}])))

# ---- functional core
g = torch.randn(6, 4)
for od in [torch.int32, torch.int64, torch.bool, torch.complex64, "float32", 3]:
    case("newton_schulz out_dtype", ["out_dtype"],
         lambda od=od: (None, lambda: ortho_fast.newton_schulz(g, out_dtype=od)))
for kw, nm in [(dict(dtype=torch.int32), "dtype"), (dict(steps=0), "steps"), (dict(eps=-1.0), "eps"),
               (dict(safety=0.0), "safety"), (dict(eps_mode="x"), "eps_mode"),
               (dict(coefficients="nope"), "coefficients"), (dict(gram="yes"), "gram")]:
    case(f"newton_schulz {nm}", [nm], lambda kw=kw: (None, lambda: ortho_fast.newton_schulz(g, **kw)))
for bad, nm in [(torch.randn(5), "g"), (torch.ones(3, 3, dtype=torch.int32), "g"), ([[1.0, 2.0]], "g"),
                (torch.empty(0, 3), "g")]:
    case("newton_schulz g", [nm], lambda bad=bad: (None, lambda: ortho_fast.newton_schulz(bad)))

DIVERGENT = [((3.4445, 4.775, 2.0315),) * 5, ((3.0, 3.0, 3.0),) * 5, ((1.5, -0.5, 0.0), (40.0, 0.0, 0.0))]
for table in DIVERGENT:  # the map grows without bound on [0, 1]: finite inputs would give Inf / NaN
    case("newton_schulz divergent table", ["coefficients"],
         lambda table=table: (None, lambda: ortho_fast.newton_schulz(g, coefficients=table, dtype=torch.float32)))
    case("ortho_ref.ns_map divergent table", ["coefficients"],
         lambda table=table: (None, lambda: ortho_ref.ns_map(g.double().numpy(), table)))
    case("Muon divergent table", ["coefficients"],
         lambda table=table: (None, lambda: Muon(params(), coefficients=table)))
for table in [((3.4445, -4.775, 2.0315),) * 8, ((3.0, -3.2, 1.2), (2.0, -1.5, 0.5))]:  # overshoot to 1.2: valid
    case("newton_schulz convergent user table", None,
         lambda table=table: (None, lambda: ortho_fast.newton_schulz(g, coefficients=table)))
case("newton_schulz g requires grad", ["g"],
     lambda: (None, lambda: ortho_fast.newton_schulz(torch.randn(6, 4, requires_grad=True))))
case("newton_schulz g requires grad under no_grad", None,
     lambda: (None, lambda: torch.no_grad()(ortho_fast.newton_schulz)(torch.randn(6, 4, requires_grad=True))))

# ---- oracle
for fn_name, call in [("ns_map", lambda a: ortho_ref.ns_map(a, [(3.4445, -4.775, 2.0315)])),
                      ("polar", lambda a: ortho_ref.polar(a)),
                      ("singular_values", lambda a: ortho_ref.singular_values(a))]:
    for bad, label in [([[1.0, 2.0], [3.0]], "ragged"), (torch.ones(3, 3, dtype=torch.bfloat16), "bfloat16 tensor"),
                       (np.ones((3, 3), dtype=np.int64), "int"), (np.ones(3), "1-D"), ([["a", "b"]], "strings"),
                       (None, "None")]:
        case(f"ortho_ref.{fn_name} {label}", ["a", "g", "matrix"], lambda call=call, bad=bad: (None, lambda: call(bad)))
for bad, label in [([(1, 2, 3), (4, 5)], "ragged"), (torch.ones(2, 3, dtype=torch.bfloat16), "bfloat16"),
                   ([["a", "b", "c"]], "strings")]:
    case(f"ortho_ref.ns_map coefficients {label}", ["coefficients"],
         lambda bad=bad: (None, lambda: ortho_ref.ns_map(np.eye(3), bad)))

JORDAN = ortho_ref.schedule("jordan")
for kw, nm in [(dict(safety="1.0"), "safety"), (dict(eps="1e-7"), "eps"), (dict(safety=-1.0), "safety")]:
    case(f"ortho_ref.ns_map {nm}={kw[nm]!r}", [nm],
         lambda kw=kw: (None, lambda: ortho_ref.ns_map(np.eye(3), JORDAN, **kw)))
    case(f"ortho_ref.normalized_singular_values {nm}={kw[nm]!r}", [nm],
         lambda kw=kw: (None, lambda: ortho_ref.normalized_singular_values(np.eye(3), **kw)))
W3 = np.random.default_rng(0).standard_normal((6, 4))
for v in [1.5, -0.1, "0.9"]:
    case(f"ortho_ref.dion2_step ef_decay={v!r}", ["ef_decay"],
         lambda v=v: (None, lambda: ortho_ref.dion2_step(W3, W3, W3, lr=0.1, ef_decay=v)))

# ---- judge
case("check_orthogonalizer(fn=None)", ["fn"], lambda: (None, lambda: ortho_verify.check_orthogonalizer(None)))
case("check_orthogonalizer(fn=3)", ["fn"], lambda: (None, lambda: ortho_verify.check_orthogonalizer(3)))
for kw, nm in [(dict(shapes=[(3,)]), "shapes"), (dict(shapes=[]), "shapes"), (dict(shapes=[(0, 3)]), "shapes"),
               (dict(cond=0), "cond"), (dict(cond=float("nan")), "cond"), (dict(steps=0), "steps"), (dict(lr=0), "lr")]:
    case(f"check_optimizer {nm}", [nm], lambda kw=kw: (
        None, lambda: check_optimizer(ortho_fast.Muon, steps=kw.pop("steps", 1), param_dtype=torch.float32, **kw)))

case("check_orthogonalizer safety=-1", ["safety"],
     lambda: (None, lambda: ortho_verify.check_orthogonalizer(ortho_fast.newton_schulz, safety=-1.0)))
case("check_orthogonalizer seed=-1", ["seed"],
     lambda: (None, lambda: ortho_verify.check_orthogonalizer(ortho_fast.newton_schulz, seed=-1)))
case("check_optimizer seed=-1", ["seed"],
     lambda: (None, lambda: check_optimizer(ortho_fast.Muon, steps=1, param_dtype=torch.float32, seed=-1)))

def run():
    counts = collections.Counter()
    bad = collections.defaultdict(list)
    for family, names, make in CASES:
        try:
            target, action = make()
        except Exception as e:  # the setup itself failed: a bad input rejected earlier than planned
            target, action = None, (lambda e=e: (_ for _ in ()).throw(e))
        before = everything(*target) if target else None
        try:
            action()
            outcome = "silent" if names is not None else "clear"
            msg = ""
        except (ValueError, TypeError) as e:
            if names is None:  # a valid input rejected
                counts["confusing"] += 1
                bad[("confusing", family)].append(str(e)[:150])
                continue
            msg = str(e)
            outcome = "clear" if any(msg.startswith(n) or f"{n}:" in msg or f"'{n}'" in msg or f"{n} (" in msg
                                     for n in names) else "confusing"
        except Exception as e:
            msg = f"{type(e).__name__}: {e}"
            outcome = "confusing"
        changed = outcome != "silent" and target is not None and not same(before, everything(*target))
        counts[outcome] += 1
        if changed:
            counts["state_changed"] += 1
        if outcome != "clear" or changed:
            bad[(outcome, family)].append(msg[:150])
    print(f"cases {len(CASES)}: " + ", ".join(f"{k} {counts[k]}"
                                              for k in ("silent", "confusing", "clear", "state_changed")))
    for (outcome, family), msgs in sorted(bad.items()):
        print(f"  {outcome:9s} {family} x{len(msgs)}: {msgs[0]}")

if __name__ == "__main__":
    run()
