"""Helpers shared by several ortho_fast test modules (each name says which tests use it).

- Seeds and test matrices: ``rng_for`` (a generator per key), ``spectral_matrix`` /
  ``gradient_matrix`` (geometric singular values), ``SHAPES`` (tall, wide, square).
- Muon against the float64 oracle ``ortho_ref.muon_step``, composed per matrix:
  ``BASE``, ``ROWS``, ``muon_reference``, ``check_against_muon_reference``,
  ``run_one_muon_step`` (test_muon_options.py, test_muon_layout.py); the five-parameter
  layout optimizer of test_muon_state.py and test_muon_errors.py.
- Dion: ``DION_SEED``, ``DION_RANDOMIZED`` (test_dion*.py).
- Newton–Schulz: the ``matrix_shapes`` strategy, ``MAX_DIM``, ``SCHEDULE_NAMES``
  (test_newton_schulz*.py).
- The hybrid tests' model (a small GPT inside the wrappers torch.compile and activation
  checkpointing add), its gradients and the hybrid configurations (test_hybrid_*.py).
"""

from __future__ import annotations

import zlib

import numpy as np
import torch
from hypothesis import strategies as st
from torch import nn

import ortho_ref
from ortho_fast import COEFFICIENTS, DionConfig, Muon, MuonConfig
from ortho_verify import tolerances as tol
from ortho_verify.inputs.spectra import matrix_with_spectrum

# =======================================================================================
# Seeds and test matrices
# =======================================================================================


def rng_for(*key) -> np.random.Generator:
    """A numpy generator seeded by the CRC-32 of ``repr(key)``: each test draws its own numbers."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def spectral_matrix(shape, rng, cond=1e2, scale=1.0):
    """A float64 ``shape`` matrix U diag(s) Vᵀ, s geometric from ``scale`` down to ``scale / cond``."""
    m, n = shape
    return matrix_with_spectrum(scale * np.geomspace(1.0, 1.0 / cond, min(m, n)), m, n, rng)


def stage_case(name: str, m: int, n: int, seed: int = 0, cond: float = 1e2):
    """A ``MatrixCase`` for the stage checks: singular values geomspace(1, 1/cond), Haar vectors
    from ``seed``; ``name`` prefixes its identifier."""
    from ortho_verify.inputs.spectra import MatrixCase

    s = np.geomspace(1.0, 1.0 / cond, min(m, n))
    return MatrixCase(f"{name}/{m}x{n}/{seed}", matrix_with_spectrum(s, m, n, np.random.default_rng(seed)),
                      "synthetic", "test")


def gradient_matrix(shape, rng, cond: float = 1e3, scale: float = 1.0) -> np.ndarray:
    """``spectral_matrix`` with κ = 1e3 by default: the gradients and momenta of the
    optimizer tests (test_muon_parity.py, test_dion_invariants.py, test_optimizers.py)."""
    return spectral_matrix(shape, rng, cond, scale)


SHAPES = [(24, 16), (16, 24), (20, 20)]  # tall, wide, square
SHAPE_IDS = ["tall", "wide", "square"]

# =======================================================================================
# Muon: the oracle, composed per matrix
# =======================================================================================

#: Options of one float64 comparison (Muon keyword -> value); ``dtype`` is always float64.
#: Optional keys: ``ns_steps``, ``safety``, ``eps`` (None or absent: the schedule's), ``eps_mode``
#: (None: the documented default), ``coefficients`` a name or a user table of rows.
BASE = dict(lr=0.02, weight_decay=0.1, momentum=0.9, nesterov=True, momentum_style="ema", coefficients="jordan",
            eps_mode="add", adjust_lr="original", extra_scale_factor=1.0, cautious_weight_decay=False)


def _normalization(opts):
    """(table, safety, eps, eps_mode) the oracle runs for ``opts``, from the oracle's own
    transcription and the documented rules (written here, not taken from ortho_fast):
    a named schedule's rows (``ortho_ref.schedule``) and normalization, a user table's rows with
    its last row repeated past its end, safety 1 / eps 1e-7 for tables, eps_mode "clamp" for
    "jordan" (torch.optim.Muon) and "add" otherwise."""
    coefficients, steps = opts["coefficients"], opts.get("ns_steps")
    if isinstance(coefficients, str):
        sched = ortho_ref.SCHEDULES[coefficients]
        table, safety, eps = ortho_ref.schedule(coefficients, steps), sched.safety, sched.eps
    else:
        rows = [tuple(r) for r in coefficients]
        t = len(rows) if steps is None else steps
        table, safety, eps = np.array(rows[:t] + rows[-1:] * max(0, t - len(rows))), 1.0, 1e-7
    safety = safety if opts.get("safety") is None else opts["safety"]
    eps = eps if opts.get("eps") is None else opts["eps"]
    eps_mode = opts.get("eps_mode") or ("clamp" if coefficients == "jordan" else "add")
    return table, safety, eps, eps_mode


def muon_reference(w, g, m, opts, dtype: str = "float64"):
    """ortho_ref.muon_step on one matrix, with the tolerances of ortho_verify.tolerances for a fast
    step computed in ``dtype`` (float32 / float64)."""
    table, safety, eps, eps_mode = _normalization(opts)
    ref = ortho_ref.muon_step(
        w, g, m, lr=opts["lr"], mu=opts["momentum"], nesterov=opts["nesterov"], momentum_style=opts["momentum_style"],
        coefficients=table, safety=safety, eps=eps, eps_mode=eps_mode, adjust_lr=opts["adjust_lr"],
        weight_decay=opts["weight_decay"], extra_scale_factor=opts["extra_scale_factor"],
        cautious_weight_decay=opts["cautious_weight_decay"],
        weight_decay_style=opts.get("weight_decay_style", "decoupled"),
    )
    sigma_hat = ortho_ref.normalized_singular_values(ref.ns_input, safety=safety, eps=eps, eps_mode=eps_mode)
    ns_tol = tol.ns_tolerance(sigma_hat, table, w.shape, dtype)
    w_tol = tol.muon_tolerance(ns_tol, ref.lr_scale, opts["lr"], float(np.linalg.norm(w)),
                               float(np.linalg.norm(ref.update)), dtype)
    if opts["cautious_weight_decay"]:
        w_tol += tol.cautious_weight_decay_tolerance(w, ref.update, ns_tol, opts["lr"], opts["weight_decay"])
    m_tol = tol.momentum_tolerance(float(np.linalg.norm(g)), float(np.linalg.norm(m)), dtype)
    return ref, w_tol, m_tol


def check_against_muon_reference(w_new, m_new, w0, g, m0, matrices, opts) -> None:
    """Every matrix of a parameter against the oracle. ``w_new`` etc. are numpy arrays in the
    parameter's *matrix view* ((m, n) or (E, m, n)); ``matrices`` index that view, one matrix
    each, and must cover every entry exactly once."""
    cover = np.zeros(w0.shape, dtype=int)
    for idx in matrices:
        cover[idx] += 1
        ref, w_tol, m_tol = muon_reference(w0[idx], g[idx], m0[idx], opts)
        w_err = np.linalg.norm(w_new[idx] - ref.weight)
        m_err = np.linalg.norm(m_new[idx] - ref.momentum)
        assert w_err <= w_tol, f"{opts} {w0[idx].shape}: weight error {w_err:.3e} > {w_tol:.3e}"
        assert m_err <= m_tol, f"momentum error {m_err:.3e} > {m_tol:.3e}"
    assert np.all(cover == 1), "the matrices must partition the parameter"


def run_one_muon_step(shapes, opts, rng, *, view_shapes=None, names=None, group_extra=None, **muon_kw):
    """One float64 Muon step with a nonzero momentum buffer; returns per parameter
    (w_new, m_new, w0, g, m0) as numpy arrays reshaped to ``view_shapes``."""
    w0 = [0.02 * rng.standard_normal(s) for s in shapes]
    g = [rng.standard_normal(s) for s in shapes]
    m0 = [0.5 * rng.standard_normal(s) for s in shapes]
    ps = [torch.nn.Parameter(torch.tensor(w)) for w in w0]
    params = list(zip(names, ps)) if names else ps
    group = [{"params": params, **(group_extra or {})}]
    opt = Muon(group, dtype=torch.float64, **opts, **muon_kw)
    for p, m, gg in zip(ps, m0, g):
        opt.state[p]["momentum_buffer"] = torch.tensor(m)
        p.grad = torch.tensor(gg)
    opt.step()
    view_shapes = view_shapes or shapes
    return [tuple(a.reshape(vs) for a in (p.detach().numpy(), opt.state[p]["momentum_buffer"].numpy(), w, gg, m))
            for p, w, gg, m, vs in zip(ps, w0, g, m0, view_shapes)]


#: The index of the whole (m, n) matrix: ``matrices`` of a plain 2-D parameter.
ROWS = (slice(None),)

#: Five parameters with every layout (experts, split QKV twice, a conv weight, a plain weight).
LAYOUT_SHAPES = [(4, 8, 6), (18, 6), (18, 6), (8, 3, 3, 3), (6, 10)]
LAYOUT_NAMES = ["moe.experts.w1", "attn0.qkv.weight", "attn1.qkv.weight", "conv.weight", "mlp.weight"]


def layout_optimizer(ps):
    """Muon over ``LAYOUT_SHAPES`` parameters named ``LAYOUT_NAMES``: banks, experts, a split QKV
    group with heads, cautious weight decay, Megatron's "spectral" lr times 0.2."""
    named = list(zip(LAYOUT_NAMES, ps))
    return Muon([{"params": [named[i] for i in (0, 3, 4)]},
                 {"params": [named[1], named[2]], "split_sizes": (6, 6, 6), "num_heads": (3, 3, 3)}],
                lr=0.02, banks=True, expert_keys=("experts",), cautious_weight_decay=True, adjust_lr="spectral",
                extra_scale_factor=0.2)


def layout_params(rng):
    """float32 parameters of ``LAYOUT_SHAPES`` drawn from ``rng``."""
    return [torch.nn.Parameter(torch.tensor(0.02 * rng.standard_normal(s), dtype=torch.float32))
            for s in LAYOUT_SHAPES]


# =======================================================================================
# Dion
# =======================================================================================

DION_SEED = 7
#: The randomized Cholesky QR with 2 power iterations, rank 1/2 and Orth-Dion's QR right factor.
DION_RANDOMIZED = dict(qr_method="randomized_cholesky_qr", power_iters=2, rank_fraction=0.5, right_factor="qr")


# =======================================================================================
# Newton–Schulz
# =======================================================================================

SCHEDULE_NAMES = sorted(COEFFICIENTS)
MAX_DIM = 48


@st.composite
def matrix_shapes(draw, max_dim: int = MAX_DIM, min_dim: int = 1, kinds=("tall", "wide", "square")):
    """(m, n) that is tall (m > n), wide (m < n) or square, with min_dim <= m, n <= max_dim."""
    kind = draw(st.sampled_from(kinds))
    small = draw(st.integers(min_dim, max_dim - 1))
    if kind == "square":
        return small, small
    large = draw(st.integers(small + 1, max_dim))
    return (large, small) if kind == "tall" else (small, large)


# =======================================================================================
# Hybrid: a small GPT, its gradients, the configurations
# =======================================================================================

D_MODEL, VOCAB, CTX = 8, 16, 4


class Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)  # fused QKV
        self.proj = nn.Linear(d, d)


class MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(d), Attention(d), nn.LayerNorm(d), MLP(d)


class CheckpointWrapper(nn.Module):
    """Stands for torch.distributed's checkpoint_wrapper (its attribute name)."""

    def __init__(self, inner):
        super().__init__()
        self._checkpoint_wrapped_module = inner


class Compiled(nn.Module):
    """Stands for torch.compile's OptimizedModule (its attribute name)."""

    def __init__(self, inner):
        super().__init__()
        self._orig_mod = inner


class MoE(nn.Module):
    def __init__(self, d, experts=3):
        super().__init__()
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.Module()
        self.experts.w1 = nn.Parameter(0.02 * torch.randn(experts, 2 * d, d))  # (E, m, n)
        self.experts.b1 = nn.Parameter(torch.zeros(experts, 2 * d))  # expert biases: vectors


class GPT(nn.Module):
    """Embeddings, a conv weight, two blocks (one activation-checkpointed), an MoE stack, a head
    (optionally tied to the embedding), a scalar and a frozen vector: every kind param_groups sorts."""

    def __init__(self, tied: bool = False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, D_MODEL), nn.Embedding(CTX, D_MODEL)
        self.patch = nn.Conv2d(1, D_MODEL, 2)  # a 4-D conv weight
        self.blocks = nn.ModuleList([Block(D_MODEL), CheckpointWrapper(Block(D_MODEL))])
        self.moe = MoE(D_MODEL)
        self.ln_f = nn.LayerNorm(D_MODEL)
        self.lm_head = nn.Linear(D_MODEL, VOCAB, bias=False)
        if tied:
            self.lm_head.weight = self.wte.weight
        self.scale = nn.Parameter(torch.ones(()))
        self.frozen = nn.Parameter(torch.ones(3), requires_grad=False)


def gpt_model(tied=False, seed=0) -> nn.Module:
    """The GPT above (head ``tied`` to the embedding or not) inside torch.compile's wrapper,
    initialized from ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return Compiled(GPT(tied))


def groups_by_name(groups) -> dict:
    """Parameter name -> its param group."""
    return {name: g for g in groups for name in g["param_names"]}


def fill_grads(model, seed):
    """Set a gradient on every trainable parameter of ``model``, drawn from a generator seeded by ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)


def assert_same_model(a: nn.Module, b: nn.Module):
    """Every parameter of ``a`` bitwise equals its counterpart in ``b`` (same order)."""
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name


#: Name -> a MuonConfig / DionConfig factory: each matrix algorithm with AdamW or Lion scalars.
HYBRID_CONFIGS = {
    "muon_adamw": lambda: MuonConfig(expert_keys=("experts",), lr=0.02),
    "muon_lion": lambda: MuonConfig(expert_keys=("experts",), scalar_algorithm="lion", scalar_lr=3e-4),
    "dion_adamw": lambda: DionConfig(overrides=(("*experts.w1", {"algorithm": "muon"}),), expert_keys=("experts",),
                                     rank_fraction=0.5, seed=3),
    "dion_lion_rcqr": lambda: DionConfig(overrides=(("*experts.*", {"algorithm": "lion"}),), scalar_algorithm="lion",
                                         qr_method="randomized_cholesky_qr", seed=5),
}
