"""How a parameter is cut into the matrices Muon orthogonalizes (pure functions of shapes and names).

``muon_layout`` reads a parameter of any supported shape as (*batch, m, n) blocks: 2-D as is, ≥ 4-D conv
weights flattened, expert stacks one matrix per expert, fused projections split into blocks and heads.
``is_expert_name`` decides which parameters are expert stacks. Used by ``ortho_fast.groups.muon`` (which
caches each parameter's layout) and ``ortho_fast.distributed.muon``.

Patch point (a documented seam for tests that plant bugs): the group layer looks ``muon_layout`` up
in this module at every call, so ``monkeypatch.setattr(ortho_fast.functional.layout, "muon_layout",
...)`` reaches every Muon optimizer built afterwards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from ..validation import check_count

#: Name components dropped before ``expert_keys`` matching (torch.compile, activation checkpointing; as Motif).
DROPPED_NAME_COMPONENTS = ("_orig_mod", "_checkpoint_wrapped_module")


@dataclass(frozen=True)
class MuonLayout:
    """The matrices Muon orthogonalizes for one parameter, as views of a param-shaped tensor.

    The parameter is read as (*batch, m, n): experts (batch = (E,)) are (shape[1],
    prod(shape[2:])) each; other parameters are (shape[0], prod(shape[1:])) (conv weights
    flattened as Keller Jordan's and Moonlight's Muon), or with ``flatten=False`` batches
    (batch = shape[:-2]) of (shape[-2], shape[-1]) matrices. Its m rows are ``groups`` repetitions
    of the row blocks ``blocks`` = ((offset, rows, head_rows), ...): block j of every
    repetition is gathered into one (groups·rows, n) matrix (Megatron's per-query-group fused
    QKV layout when groups > 1), then cut into heads of ``head_rows`` consecutive rows.
    """

    batch: tuple[int, ...]
    m: int
    n: int
    groups: int
    blocks: tuple[tuple[int, int, int], ...]

    def views(self, t: torch.Tensor) -> list[torch.Tensor]:
        """One view (*batch, groups, rows, n) per block of a contiguous param-shaped tensor."""
        base = t.view(*self.batch, self.groups, self.m // self.groups, self.n)
        return [base[..., off:off + rows, :] for off, rows, _ in self.blocks]

    def matrix_shapes(self) -> list[tuple[int, ...]]:
        """Shape of each block's matrices for ``newton_schulz``: (*batch, head_rows, n) for one
        head, (*batch, heads, head_rows, n) for several; heads ordered as the gathered rows."""
        out = []
        for _, rows, head_rows in self.blocks:
            heads = self.groups * rows // head_rows
            out.append((*self.batch, *((heads,) if heads > 1 else ()), head_rows, self.n))
        return out

    def matrices(self, t: torch.Tensor) -> list[torch.Tensor]:
        """The Newton–Schulz inputs of a param-shaped tensor (views where possible)."""
        return [v.reshape(s) for v, s in zip(self.views(t.contiguous()), self.matrix_shapes())]


def muon_layout(
    shape: Sequence[int],
    *,
    expert: bool = False,
    split_sizes: Sequence[int] | None = None,
    split_groups: int = 1,
    num_heads: int | Sequence[int] | None = None,
    flatten: bool | None = None,
    name: str = "parameter",
) -> MuonLayout:
    """Cut a parameter of ``shape`` into the matrices Muon orthogonalizes (see ``MuonLayout``).

    Shapes: 2-D (m, n) as is; expert weights (E, m, n, ...) one matrix per expert,
    (shape[1], prod(shape[2:])), whatever ``flatten``. Other parameters with ≥ 3 dims by
    ``flatten``: None (default) flattens ≥ 4-D (conv2d (out, in, kh, kw), conv3d) to
    (shape[0], prod(shape[1:])) as Keller Jordan's and Moonlight's Muon, and rejects 3-D,
    which is either a conv1d weight (out, in, k) or a stack of expert matrices whose name
    ``expert_keys`` missed — flattening the stack to one (E, m·n) matrix would silently be a
    different update; True flattens every ≥ 3-D parameter (conv1d; microsoft/dion
    ``flatten=True``); False reads it as a batch of (shape[-2], shape[-1]) matrices
    (microsoft/dion's default ``flatten=False``). ``split_sizes`` (s_1, …, s_B) cut the m rows into
    blocks (fused projections, e.g. (q, k, v) rows of a fused QKV weight), repeated
    ``split_groups`` times (Megatron's split_qkv layout: ``split_sizes = (heads_per_group·d,
    d, d)``, ``split_groups = num_query_groups``); ``num_heads`` (one int for every block or
    one per block) cuts each gathered block into that many per-head matrices.
    Source: Keller Jordan's Muon and Moonlight (conv flattening); Megatron-LM
    ``TensorParallelMuon`` split_qkv; microsoft/dion ``flatten``; Motif (experts).
    Raises: ValueError naming the argument for < 2 dims (Muon is for matrices: give vectors
    and scalars to AdamW / Lion) or a zero dim, a 3-D non-expert with ``flatten`` None (the
    message names ``expert_keys`` and ``flatten``), experts with < 3 dims, split sizes that
    are not positive or do not sum to m / split_groups, heads that do not divide a (gathered) block.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) < 2:
        raise ValueError(
            f"params: Muon expects parameters with at least 2 dims (m, n); {name} has shape {shape}. "
            "Give vectors, scalars and embeddings to AdamW/Lion."
        )
    if 0 in shape:
        raise ValueError(f"params: {name} has shape {shape}; Muon needs non-empty matrices")
    if expert and len(shape) < 3:
        raise ValueError(f"expert_keys: {name} matches an expert key but has shape {shape}; expert weights are "
                         "(experts, m, n, ...)")
    if len(shape) == 3 and not expert and flatten is None:
        raise ValueError(
            f"params: {name} has shape {shape}: a 3-D parameter is a stack of expert matrices (E, m, n) — "
            "name it in expert_keys (one matrix per expert; needs named parameters) — or a conv1d weight "
            "(out, in, k) — pass flatten=True for one (out, in·k) matrix (flatten=False: a batch of (m, n) "
            "matrices, microsoft/dion's)"
        )
    batch = shape[:1] if expert else shape[:-2] if flatten is False else ()
    m = shape[len(batch)]
    n = math.prod(shape[len(batch) + 1:])
    groups = check_count(split_groups, "split_groups")
    if split_sizes is None:
        if groups != 1:
            raise ValueError(f"split_groups: {groups} repetitions need split_sizes")
        sizes = (m,)
    else:
        sizes = tuple(check_count(s, "split_sizes") for s in split_sizes) if len(split_sizes) else ()
        if not sizes or groups * sum(sizes) != m:
            dim = len(batch)
            raise ValueError(
                f"split_sizes: {tuple(split_sizes)} × split_groups {groups} = {groups * sum(sizes)} rows, but {name} "
                f"of shape {shape} has {m} rows (dim {dim}); the sizes must sum to dim {dim} / split_groups"
            )
    heads = num_heads if num_heads is not None else 1
    heads = tuple(heads) if isinstance(heads, (tuple, list)) else (heads,) * len(sizes)
    if len(heads) != len(sizes):
        raise ValueError(f"num_heads: expected an integer or one per split block ({len(sizes)}), got {num_heads!r}")
    blocks, offset = [], 0
    for rows, h in zip(sizes, heads):
        h = check_count(h, "num_heads")
        if (groups * rows) % h:
            raise ValueError(f"num_heads: {h} heads do not divide the {groups}×{rows} rows of a block of {name}")
        blocks.append((offset, rows, groups * rows // h))
        offset += rows
    return MuonLayout(batch, m, n, groups, tuple(blocks))


def is_expert_name(name: str, expert_keys: str | Sequence[str]) -> bool:
    """True if a key equals a dot-separated component (or a run of components) of ``name``,
    after dropping ``DROPPED_NAME_COMPONENTS``: "experts" matches "layers.0.mlp.experts.w1",
    not "layers.0.mlp.shared_experts.w1".

    Args: ``name`` a parameter name as ``named_parameters()`` gives it; ``expert_keys`` one key
    or a sequence of keys (a single str is one key, not its characters).
    Source: Motif Muon (``expert_keys``, names normalized by dropping ``_orig_mod`` and
    ``_checkpoint_wrapped_module``).
    Raises: TypeError naming ``name`` / ``expert_keys`` for a name or key that is not a str.
    """
    if not isinstance(name, str):
        raise TypeError(f"name: expected a parameter name (str), got {type(name).__name__}")
    keys = (expert_keys,) if isinstance(expert_keys, str) else tuple(expert_keys)
    if not all(isinstance(k, str) for k in keys):
        raise TypeError(f"expert_keys: expected strings, got {expert_keys!r}")
    padded = "." + ".".join(c for c in name.split(".") if c not in DROPPED_NAME_COMPONENTS) + "."
    return any(f".{key}." in padded for key in keys)
