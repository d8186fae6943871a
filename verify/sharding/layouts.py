"""The layouts of ``ortho-verify sharding``: every distributed layout of Dion and Muon
(``Layout``, ``LAYOUTS``, ``layouts_for``), the matrices and steps of a run and the optimizer
options of each layout (from ``ortho_verify.registry``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ortho_fast.groups.dion import DION_DEFAULTS
from ortho_fast.groups.dion2 import DION2_DEFAULTS
from ortho_fast.groups.muon import MUON_DEFAULTS

from .. import registry

__all__ = ["DION2_OPTIONS", "DION_OPTIONS", "DOCS_PATH", "DOCS_WORLD_SIZES", "DTYPES", "LAYOUTS", "Layout", "MATRICES",
           "MUON_OPTIONS", "NORMUON_OPTIONS", "QUICK_MATRICES", "QUICK_STEPS", "SEED", "SHARDED_LAYOUTS", "STATE_KEYS",
           "STEPS", "TIMEOUT", "layouts_for",
           "optimizer_options"]

DTYPES = ("float64", "float32")
#: (m, n) of the test matrices: even at every world size, uneven (13 rows or 7 columns over 2, 4
#: or 8 ranks), and with fewer rows (5) than ranks, so some shards are empty; tall and wide
#: (Dion works on the transpose of a wide matrix, Muon on the wide side).
MATRICES = ((16, 24), (13, 7), (5, 11))
#: --quick: one shape even at 2 and 4 ranks (communication exactly the formula) and one uneven
#: with an empty shard at 4 ranks.
QUICK_MATRICES = ((12, 8), (5, 11))
STEPS, QUICK_STEPS = 3, 2
SEED = 0
#: Options of both the distributed and the one-process optimizer (a rank fraction below one
#: keeps Dion's error feedback in play; Newton–Schulz in the parameter's dtype).
#: (``ortho_verify.registry.SHARDING_DION`` / ``SHARDING_MUON``; Dion's seed is ``SEED``.)
DION_OPTIONS = registry.SHARDING_DION
MUON_OPTIONS = registry.SHARDING_MUON
#: Dion2's options (``ortho_verify.registry.SHARDING_DION2``: "global" selection, fraction 0.5).
DION2_OPTIONS = registry.SHARDING_DION2
#: Options of the "normuon-stages" layouts (labelled so that a "muon/" filter keeps plain Muon): Muon's with nanochat's
#: stages (MuonEq, Muon+, NorMuon by shape; ``ortho_verify.registry.SHARDING_NORMUON``), run by ``ortho_fast.Muon``.
NORMUON_OPTIONS = registry.SHARDING_NORMUON
STATE_KEYS = {"dion": ("momentum", "Q"), "muon": ("momentum_buffer",), "dion2": ("momentum",),
              "normuon-stages": ("momentum_buffer", "variance_neuron")}
#: The page ``--write-docs`` writes (in the repository checkout).
DOCS_PATH = Path(__file__).resolve().parents[2] / "docs" / "layouts.md"
#: World sizes docs/layouts.md covers (``--write-docs`` runs them all).
DOCS_WORLD_SIZES = (1, 2, 4, 8)
#: Seconds a whole launch may take before its workers are killed (a hang fails, never blocks).
TIMEOUT = 900.0


@dataclass(frozen=True)
class Layout:
    """One distributed layout of one optimizer.

    ``dims``: mesh dim names (torchtitan / OLMo-core: "dp_replicate", "dp_shard", "tp"; "dp" for
    DDP). ``shape``: the mesh shape, -1 standing for world_size / (product of the others).
    ``placements``: one code per mesh dim for every matrix ("R" Replicate, "S0" / "S1" Shard,
    "SS0" ``_StridedShard(0)`` with split factor the size of the later mesh dims that shard
    dim 0, as FSDP2 on top of colwise TP), None for plain tensors (DDP). ``roles``: (optimizer
    argument, mesh dim) pairs; "dim:group" passes the dim's ProcessGroup instead of the 1-D
    mesh. ``check``: "equal", "compressed", "blockwise" (see the module docstring) or "local"
    (Dion2's per-shard selection, against ``ortho_verify.sharding.dion2_reference``).
    ``options``: extra optimizer arguments (see ``optimizer_options``: update options such as
    ``qr_method`` reach the one-process reference too, ``tp_mode`` /
    ``replicate_mesh_grad_sync`` only the distributed optimizer). ``bitwise``: the sharded step
    performs the same floating-point operations as one process, so equality must be exact.
    """

    name: str
    optimizer: str
    dims: tuple[str, ...] = ()
    shape: tuple[int, ...] = ()
    placements: tuple[str, ...] | None = None
    roles: tuple[tuple[str, str], ...] = ()
    check: str = "equal"
    options: tuple[tuple[str, object], ...] = ()
    bitwise: bool = False

    def mesh_shape(self, world_size: int) -> tuple[int, ...] | None:
        """The mesh shape at ``world_size``, or None if the layout does not fit: "single" runs at
        one rank only; a 1-D mesh takes every rank; in an N-D mesh the free dim gets >= 2 ranks."""
        if not self.shape:
            return () if world_size == 1 else None
        fixed = math.prod(s for s in self.shape if s != -1)
        rest, ok = divmod(world_size, fixed)
        if ok or rest < (1 if len(self.shape) == 1 else 2):
            return None
        return tuple(rest if s == -1 else s for s in self.shape)

    @property
    def tp_dim(self) -> int | None:
        return self.dims.index("tp") if "tp" in self.dims else None


def _dion(name, dims, shape, placements, roles, check="equal", bitwise=False, **options) -> Layout:
    return Layout(name, "dion", dims, shape, placements, roles, check, tuple(options.items()), bitwise)


def _muon(name, dims, shape, placements, roles, bitwise=False, **options) -> Layout:
    check = "blockwise" if options.get("tp_mode") == "blockwise" else "equal"
    return Layout(name, "muon", dims, shape, placements, roles, check, tuple(options.items()), bitwise)


def _dion2(name, dims, shape, placements, roles, check="equal", bitwise=False, **options) -> Layout:
    return Layout(name, "dion2", dims, shape, placements, roles, check, tuple(options.items()), bitwise)


def _normuon(name, dims, shape, placements, roles, bitwise=False, **options) -> Layout:
    return Layout(name, "normuon-stages", dims, shape, placements, roles, "equal", tuple(options.items()), bitwise)


#: Dion variants some layouts add (``ortho_verify.registry.DION_VARIANTS``).
_VARIANTS = registry.DION_VARIANTS
_DP, _SHARD, _TP, _HSDP, _FSDP_TP = ("dp",), ("dp_shard",), ("tp",), ("dp_replicate", "dp_shard"), ("dp_shard", "tp")
_HSDP_TP = ("dp_replicate", "dp_shard", "tp")
_REP, _OUT, _IN = ("replicate_mesh", "dp_replicate"), ("outer_shard_mesh", "dp_shard"), ("inner_shard_mesh", "tp")
_COLWISE_2D, _ROWWISE_2D = ("SS0", "S0"), ("S0", "S1")
_MUON_2D = (("distributed_mesh", "dp_shard"), ("tp_mesh", "tp"))

#: Every layout checked, in report order (``layouts_for`` picks those that fit a world size).
LAYOUTS: tuple[Layout, ...] = (
    _dion("single", (), (), None, (), bitwise=True),
    _dion("DDP", _DP, (-1,), None, (("replicate_mesh", "dp"),), "compressed"),
    _dion("DDP, grads synced", _DP, (-1,), None, (("replicate_mesh", "dp"),), bitwise=True,
          replicate_mesh_grad_sync=False),
    _dion("FSDP", _SHARD, (-1,), ("S0",), (_OUT,)),
    _dion("TP colwise", _TP, (-1,), ("S0",), (_IN,)),
    _dion("TP rowwise", _TP, (-1,), ("S1",), (_IN,)),
    _dion("HSDP", _HSDP, (2, -1), ("R", "S0"), (_REP, _OUT), "compressed"),
    _dion("HSDP, grads synced", _HSDP, (2, -1), ("R", "S0"), (_REP, _OUT), replicate_mesh_grad_sync=False),
    _dion("FSDP + TP colwise", _FSDP_TP, (-1, 2), _COLWISE_2D, (_OUT, _IN)),
    _dion("FSDP + TP rowwise", _FSDP_TP, (-1, 2), _ROWWISE_2D, (_OUT, _IN)),
    _dion("HSDP + TP colwise", _HSDP_TP, (2, -1, 2), ("R", *_COLWISE_2D), (_REP, _OUT, _IN), "compressed"),
    _dion("HSDP + TP rowwise", _HSDP_TP, (2, -1, 2), ("R", *_ROWWISE_2D), (_REP, _OUT, _IN), "compressed"),
    # the other distributed code paths: a ProcessGroup, QR methods on sharded rows, Orth-Dion's gathered R
    _dion("DDP, process_group", _DP, (-1,), None, (("process_group", "dp:group"),), "compressed"),
    _dion("FSDP, randomized CholeskyQR", _SHARD, (-1,), ("S0",), (_OUT,), **_VARIANTS["randomized_cholesky_qr"]),
    _dion("FSDP + TP rowwise, CholeskyQR2", _FSDP_TP, (-1, 2), _ROWWISE_2D, (_OUT, _IN), **_VARIANTS["cholesky_qr"]),
    _dion("HSDP + TP colwise, randomized CholeskyQR", _HSDP_TP, (2, -1, 2), ("R", *_COLWISE_2D), (_REP, _OUT, _IN),
          "compressed", **_VARIANTS["randomized_cholesky_qr"]),
    _dion("TP rowwise, Orth-Dion", _TP, (-1,), ("S1",), (_IN,), **_VARIANTS["orth_dion"]),
    _muon("single", (), (), None, (), bitwise=True),
    _muon("DDP", _DP, (-1,), None, (("distributed_mesh", "dp"),), bitwise=True),
    _muon("DDP, ProcessGroup", _DP, (-1,), None, (("distributed_mesh", "dp:group"),), bitwise=True),
    _muon("FSDP", _SHARD, (-1,), ("S0",), (("distributed_mesh", "dp_shard"),), bitwise=True),
    *(_muon(f"TP {wise} {mode}", _TP, (-1,), (code,), (("tp_mesh", "tp"),), bitwise=mode != "distributed",
            tp_mode=mode)
      for mode in ("duplicated", "distributed", "blockwise") for wise, code in (("colwise", "S0"), ("rowwise", "S1"))),
    *(_muon(f"FSDP + TP {wise} {mode}", _FSDP_TP, (-1, 2), codes, _MUON_2D, bitwise=mode != "distributed",
            tp_mode=mode)
      for mode in ("duplicated", "distributed", "blockwise")
      for wise, codes in (("colwise", _COLWISE_2D), ("rowwise", _ROWWISE_2D))),
    # Dion2: "global" selection equals one process on every layout (DDP / one process: the same
    # operations, bitwise); "local" (per-shard top-k) is checked against its own definition
    # (``ortho_verify.sharding.dion2_reference``), on the layouts that shard the selected dimension
    _dion2("single", (), (), None, (), bitwise=True),
    _dion2("DDP", _DP, (-1,), None, (("distributed_mesh", "dp"),), bitwise=True),
    _dion2("DDP, ProcessGroup", _DP, (-1,), None, (("distributed_mesh", "dp:group"),), bitwise=True),
    _dion2("FSDP", _SHARD, (-1,), ("S0",), (("distributed_mesh", "dp_shard"),)),
    _dion2("TP colwise", _TP, (-1,), ("S0",), (("tp_mesh", "tp"),)),
    _dion2("TP rowwise", _TP, (-1,), ("S1",), (("tp_mesh", "tp"),)),
    _dion2("HSDP", _HSDP, (2, -1), ("R", "S0"), (("replicate_mesh", "dp_replicate"), ("distributed_mesh", "dp_shard"))),
    _dion2("FSDP + TP colwise", _FSDP_TP, (-1, 2), _COLWISE_2D, _MUON_2D),
    _dion2("FSDP + TP rowwise", _FSDP_TP, (-1, 2), _ROWWISE_2D, _MUON_2D),
    _dion2("FSDP, local", _SHARD, (-1,), ("S0",), (("distributed_mesh", "dp_shard"),), "local",
           selection_scope="local"),
    _dion2("TP rowwise, local", _TP, (-1,), ("S1",), (("tp_mesh", "tp"),), "local", selection_scope="local"),
    _dion2("FSDP + TP colwise, local", _FSDP_TP, (-1, 2), _COLWISE_2D, _MUON_2D, "local", selection_scope="local"),
    # the Muon pipeline stages (MuonEq, Muon+, NorMuon) where a whole matrix reaches its owner; TP
    # "distributed" and "blockwise" reject NorMuon at construction (ortho_fast.distributed.muon)
    _normuon("single", (), (), None, (), bitwise=True),
    _normuon("DDP", _DP, (-1,), None, (("distributed_mesh", "dp"),), bitwise=True),
    _normuon("FSDP", _SHARD, (-1,), ("S0",), (("distributed_mesh", "dp_shard"),), bitwise=True),
    *(_normuon(f"TP {wise} duplicated", _TP, (-1,), (code,), (("tp_mesh", "tp"),), bitwise=True, tp_mode="duplicated")
      for wise, code in (("colwise", "S0"), ("rowwise", "S1"))),
    *(_normuon(f"FSDP + TP {wise} duplicated", _FSDP_TP, (-1, 2), codes, _MUON_2D, bitwise=True,
               tp_mode="duplicated") for wise, codes in (("colwise", _COLWISE_2D), ("rowwise", _ROWWISE_2D))),
)


#: The layouts of ``ortho_verify.check_sharded_optimizer`` (any optimizer: "optimizer" is "any"),
#: each a placement of the matrices on a mesh with microsoft/dion's roles (``replicate_mesh``,
#: ``outer_shard_mesh``, ``inner_shard_mesh``; DDP also ``process_group``): the parameter
#: layouts of ``LAYOUTS`` plus FSDP on dim 1 (FSDP2 ``fully_shard(shard_placement_fn=Shard(1))``).
SHARDED_LAYOUTS: tuple[Layout, ...] = (
    Layout("DDP", "any", _DP, (-1,), None, (("replicate_mesh", "dp"), ("process_group", "dp:group"))),
    Layout("FSDP Shard(0)", "any", _SHARD, (-1,), ("S0",), (_OUT,)),
    Layout("FSDP Shard(1)", "any", _SHARD, (-1,), ("S1",), (_OUT,)),
    Layout("TP colwise", "any", _TP, (-1,), ("S0",), (_IN,)),
    Layout("TP rowwise", "any", _TP, (-1,), ("S1",), (_IN,)),
    Layout("HSDP", "any", _HSDP, (2, -1), ("R", "S0"), (_REP, _OUT)),
    Layout("FSDP + TP colwise", "any", _FSDP_TP, (-1, 2), _COLWISE_2D, (_OUT, _IN)),
    Layout("FSDP + TP rowwise", "any", _FSDP_TP, (-1, 2), _ROWWISE_2D, (_OUT, _IN)),
    Layout("HSDP + TP colwise", "any", _HSDP_TP, (2, -1, 2), ("R", *_COLWISE_2D), (_REP, _OUT, _IN)),
    Layout("HSDP + TP rowwise", "any", _HSDP_TP, (2, -1, 2), ("R", *_ROWWISE_2D), (_REP, _OUT, _IN)),
)


def layouts_for(world_size: int, names: Sequence[str] | None = None,
                catalogue: Sequence[Layout] = LAYOUTS) -> list[tuple[Layout, tuple[int, ...]]]:
    """(layout, mesh shape) of every layout of ``catalogue`` (default ``LAYOUTS``;
    ``SHARDED_LAYOUTS`` for ``check_sharded_optimizer``) that fits ``world_size``, optionally only
    those whose "optimizer/name" contains one of ``names`` (case-insensitive).
    Raises: ValueError naming ``world_size`` unless an int >= 1."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: expected an int >= 1, got {world_size!r}")
    out = []
    for lay in catalogue:
        shape = lay.mesh_shape(world_size)
        label = f"{lay.optimizer}/{lay.name}".lower()
        if shape is not None and (not names or any(n.lower() in label for n in names)):
            out.append((lay, shape))
    return out


def optimizer_options(layout: Layout, *, distributed: bool = True) -> dict:
    """Constructor arguments of the layout's optimizer: ``DION_OPTIONS`` / ``MUON_OPTIONS`` and the
    layout's ``options`` — all of them for the distributed optimizer, only the update's own
    options (keys of ``ortho_fast.groups.dion.DION_DEFAULTS`` / ``MUON_DEFAULTS``, e.g. ``qr_method``) for the
    one-process reference (not ``tp_mode`` / ``replicate_mesh_grad_sync``)."""
    base, keys = {"dion": (DION_OPTIONS, DION_DEFAULTS), "muon": (MUON_OPTIONS, MUON_DEFAULTS),
                  "dion2": (DION2_OPTIONS, DION2_DEFAULTS),
                  "normuon-stages": (NORMUON_OPTIONS, MUON_DEFAULTS)}[layout.optimizer]
    extra = {k: v for k, v in layout.options if distributed or k in keys}
    return {**base, **extra}
