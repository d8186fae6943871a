"""A distributed Dion2 written for the judge's tests of ``check_sharded_optimizer`` and
ortho_fast's Dion2 as a factory of it.

``PlantedDion2`` is correct by default and computed differently from ortho_fast (every rank
assembles the full matrix with ``full_tensor()``, steps it with an L1 top-k sorted in float64
(ties to the higher index) and Keller-style Newton–Schulz on the selected submatrix, and keeps
its own shard), with the layout-dependent choices a check must catch (``bug=``):
"shard_forces_rows" (a parameter sharded on dim 0 selects rows whatever its shape: microsoft/dion's
row-sharded path) and "local_shard" (the top-k of this rank's own shard of the rows only). Not
for training: every step gathers every matrix. Source: microsoft/dion ``dion/dion2.py``;
docs/math.md, "Dion2".
"""

from __future__ import annotations

import math

import torch

import ortho_fast

from .layouts import DION2_OPTIONS
from .tensors import full_value, is_dtensor, write_full

__all__ = ["DION2_BUGS", "PlantedDion2", "dion2_factory", "planted_dion2_factory"]

#: PlantedDion2's bugs: what each gets wrong (None: correct).
DION2_BUGS = {
    None: "correct",
    "shard_forces_rows": "a parameter sharded on dim 0 selects rows whatever its shape (microsoft/dion's FSDP path)",
    "local_shard": "each rank ranks only the rows of its own shard (a per-shard top-k in the global scope)",
}

#: Polar Express rows of microsoft/dion (Amsel et al., arXiv 2505.16932), transcribed for this planted copy.
_PE = ((8.156554524902461, -22.48329292557795, 15.878769915207462),
       (4.042929935166739, -2.808917465908714, 0.5000178451051316),
       (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
       (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
       (2.3465413258596377, -1.7097828382687081, 0.42323551169305323))


def _sharded_dim0(p: torch.Tensor) -> bool:
    return is_dtensor(p) and any(not pl.is_replicate() and getattr(pl, "dim", None) == 0 for pl in p.placements)


class PlantedDion2(torch.optim.Optimizer):
    """Dion2 with microsoft/dion's names (``distributed_mesh``, ``lr``, ``fraction``, ``ef_decay``,
    ``weight_decay``, ``epsilon``) plus ``tp_mesh`` / ``replicate_mesh`` (ignored: it assembles full
    matrices) and ``bug`` (a key of ``DION2_BUGS``). Polar Express with safety 1.02 in the
    parameter's dtype, "spectral_norm" scaling. State "momentum", a full tensor on every rank.
    Raises: ValueError for an unknown bug."""

    def __init__(self, params, distributed_mesh=None, lr: float = 0.01, fraction: float = 0.25, ef_decay: float = 0.95,
                 weight_decay: float = 0.01, epsilon: float = 1e-8, *, tp_mesh=None, replicate_mesh=None, bug=None,
                 **ignored):
        if bug not in DION2_BUGS:
            raise ValueError(f"bug: expected one of {list(DION2_BUGS)}, got {bug!r}")
        super().__init__(params, dict(lr=lr, fraction=fraction, ef_decay=ef_decay, weight_decay=weight_decay,
                                      epsilon=epsilon))
        self.bug = bug

    def _selection(self, p: torch.Tensor, b: torch.Tensor, rows: bool, fraction: float) -> torch.Tensor:
        bt = b if rows else b.mT
        norms = bt.abs().sum(dim=1).double()
        candidates = torch.arange(bt.shape[0])
        if self.bug == "local_shard" and rows and _sharded_dim0(p):
            d = next(i for i, pl in enumerate(p.placements) if not pl.is_replicate() and pl.dim == 0)
            chunk = math.ceil(p.shape[0] / p.device_mesh.size(d))
            start = p.device_mesh.get_coordinate()[d] * chunk
            candidates = torch.arange(start, start + p.to_local().shape[0])
        k = min(len(candidates), max(1, math.ceil(fraction * len(candidates))))
        order = sorted(candidates.tolist(), key=lambda i: (-float(norms[i]), -i))
        return torch.tensor(sorted(order[:k]), dtype=torch.int64)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                w, g = full_value(p), full_value(p.grad)
                st = self.state[p]
                b = st.get("momentum", torch.zeros_like(w)) + g
                m, n = w.shape
                rows = m <= n or (self.bug == "shard_forces_rows" and _sharded_dim0(p))
                sel = self._selection(p, b, rows, group["fraction"]).to(b.device)
                bt = b if rows else b.mT
                x = bt[sel]
                x = x / (1.02 * torch.linalg.vector_norm(x) + group["epsilon"])
                wide = x.shape[0] <= x.shape[1]
                x = x if wide else x.mT
                for a, bb, c in _PE:
                    gram = x @ x.mT
                    x = a * x + (bb * gram + c * gram @ gram) @ x
                x = x if wide else x.mT
                update = torch.zeros_like(bt)
                update[sel] = x
                mom = bt.clone()
                mom[sel] = bt[sel] * group["ef_decay"]
                st["momentum"] = mom if rows else mom.mT
                write_full(p, w * (1 - group["lr"] * group["weight_decay"])
                       - group["lr"] * math.sqrt(m / n) * (update if rows else update.mT))


def planted_dion2_factory(bug: str | None = None):
    """A ``check_sharded_optimizer`` factory of ``PlantedDion2`` with ``bug``; the layout's shard
    mesh as ``distributed_mesh``."""
    def factory(params, layout):
        if layout is None:
            return PlantedDion2(params, bug=bug, fraction=0.3)
        return PlantedDion2(params, distributed_mesh=layout.shard_mesh, bug=bug, fraction=0.3)
    return factory


def dion2_factory(params, layout):
    """``ortho_fast.Dion2`` with ``DION2_OPTIONS`` ("global" selection): ``distributed_mesh`` the
    shard mesh (FSDP / HSDP) or the replicate mesh (DDP), ``tp_mesh`` the inner shard mesh."""
    if layout is None:
        return ortho_fast.Dion2(params, **DION2_OPTIONS)
    return ortho_fast.Dion2(params, **DION2_OPTIONS, distributed_mesh=layout.shard_mesh,
                            tp_mesh=layout.inner_shard_mesh)
