"""``ortho-verify sharding``: every distributed layout of Dion and Muon against one process.

For each layout that fits the world size (DDP, FSDP, TP colwise / rowwise, HSDP, FSDP + TP with
``_StridedShard``, HSDP + TP; Muon's TP modes) the same seeded matrices (even, uneven and
emptily sharded shapes, tall and wide) are stepped ``steps`` times by the distributed optimizer
on DTensors and by the same optimizer in one process on the full tensors. After every step each
rank assembles the full weights and state (``DTensor.full_tensor()``) and rank 0 compares them
with the one-process run in relative Frobenius norm against ``sharded_tolerance(dtype)``
(the layout contract: docs/design.md, "Distributed layouts and the layout contract"). Three kinds of check:

- ``equal``: the sharded step equals the one-process step (every replica fed the same gradient),
  and every rank holds the same full weights and state (a digest per rank; rank 0's alone is
  compared with one process, so a DDP copy on another rank could otherwise diverge unseen).
- ``compressed``: Dion's compressed data-parallel sync (Ahn et al., arXiv 2504.05295, Sec. 3;
  docs/design.md, "Dion"): replicas are fed *different* gradients; the weights and Q must be bitwise
  identical on every replica, the mean over replicas of the momentum must equal the momentum of
  one process fed the mean gradient, and the weights and Q must equal that process's; after
  ``synchronize_for_checkpoint()`` every replica's momentum equals it too.
- ``blockwise``: Muon's TP mode "blockwise" (Megatron / Emerging-Optimizers) is layout
  dependent by design; it is checked against its own definition: one-process Muon applied to
  each TP shard as a matrix of its own.

Every collective of each step is recorded (``ortho_fast.distributed.comm.record_collectives``)
and its elements are compared with the analytic volume of the layout (the Dion paper's Table 1
refined per layout, ``ortho_fast.distributed.volumes.dion_comm_volume`` /
``ortho_fast.distributed.volumes.muon_comm_volume``).

``run(world_size)`` starts gloo workers on CPU (``ortho_verify.sharding.workers.run_workers``); under
``torchrun`` (``RANK`` / ``WORLD_SIZE`` set, or a process group already initialized) the same
code runs in-process, with NCCL on CUDA when available. ``main(argv)`` is the command line.

``ortho_verify.check_sharded_optimizer`` runs anyone's distributed optimizer on the same
catalogue (``SHARDED_LAYOUTS``), inputs and launcher: ``tensors`` (placing and assembling),
``mesh_layout`` (``ShardedLayout``, what a factory is told), ``factory_run`` (one process and one
layout's ranks), ``user_launch`` (one launch and what came back), ``analysis`` (rows),
``compute`` (the compute dtype and the bfloat16 update rows), ``placement`` (state placement),
``crashes`` (frames, backend features, headlines), ``diagnosis`` (causes), ``factories``
(ortho_fast's Dion and Muon through it), ``planted_optimizers`` (distributed optimizers with
planted bugs), ``planted_designs`` (ZeRO-1 batched and future-waiting distributed Muons),
``user_cli`` (``--optimizer``).

Modules: ``layouts`` (the catalogue), ``inputs`` (seeded matrices), ``planted`` (planted bugs),
``steps`` (one layout on a rank), ``launch`` (workers / torchrun), ``volumes`` (analytic
communication), ``markdown`` (reports, docs/layouts.md from the package data file
``layouts_template.md``), ``cli``. Every public name is importable from ``ortho_verify.sharding``.
"""

from .cli import build_parser, main
from .crashes import backend_feature, headline, user_frame_in
from .diagnosis import FEATURES, dion_replay, layout_features, layout_pattern, moved_fraction
from .dion2_reference import dion2_local_reference, selected_dim_shards
from .factories import dion_factory, muon_factory
from .factory_run import FactoryPlan, hyperparameters, layout_rank_run, one_process_run
from .inputs import gradient, initial_weight, mean_gradient
from .launch import run, under_torchrun
from .layouts import (
    DION_OPTIONS,
    DOCS_PATH,
    DOCS_WORLD_SIZES,
    DTYPES,
    LAYOUTS,
    MATRICES,
    MUON_OPTIONS,
    QUICK_MATRICES,
    QUICK_STEPS,
    SEED,
    SHARDED_LAYOUTS,
    STATE_KEYS,
    STEPS,
    TIMEOUT,
    Layout,
    layouts_for,
    optimizer_options,
)
from .markdown import HEADERS, layouts_doc, markdown_report, markdown_tables, print_table, table_rows
from .mesh_layout import ShardedLayout, sharded_layout
from .placement import STATE_PLACEMENTS, recognize
from .planted import PLANTS, planted
from .planted_designs import FutureMuon, OwnerBatchMuon, future_muon_factory, owner_batch_muon_factory
from .planted_dion2 import DION2_BUGS, PlantedDion2, dion2_factory, planted_dion2_factory
from .planted_optimizers import (
    CRASHES,
    MUON_BUGS,
    ORIENTATIONS,
    CrashingMuon,
    PlantedDion,
    PlantedMuon,
    crashing_muon_factory,
    planted_muon_factory,
)
from .steps import FLAG_TAGS, Plan, check_layout, dtensor_placements, reference, tp_blocks, worker
from .tensors import digest, full_copy, is_dtensor, place, relative_difference
from .volumes import analytic_volume, comm_verdict, padded_shape

__all__ = ["DION2_BUGS", "PlantedDion2", "dion2_factory", "planted_dion2_factory", "dion2_local_reference",
           "selected_dim_shards", "Layout", "LAYOUTS", "MATRICES", "QUICK_MATRICES", "DTYPES", "PLANTS", "DOCS_PATH",
           "layouts_for",
           "initial_weight", "gradient", "mean_gradient", "optimizer_options", "reference", "analytic_volume", "run",
           "under_torchrun", "main", "markdown_report", "layouts_doc",
           # also public since the split into a package
           "DION_OPTIONS", "DOCS_WORLD_SIZES", "FLAG_TAGS", "HEADERS", "MUON_OPTIONS", "Plan", "QUICK_STEPS", "SEED",
           "STATE_KEYS", "STEPS", "TIMEOUT", "build_parser", "check_layout", "comm_verdict", "dtensor_placements",
           "markdown_tables", "padded_shape", "planted", "print_table", "table_rows", "tp_blocks", "worker",
           # check_sharded_optimizer's mechanism (ortho_verify.sharding.sharded_check)
           "SHARDED_LAYOUTS", "ShardedLayout", "sharded_layout", "FactoryPlan", "hyperparameters", "layout_rank_run",
           "one_process_run", "FEATURES", "dion_replay", "layout_features", "layout_pattern", "moved_fraction",
           "dion_factory", "muon_factory", "MUON_BUGS", "ORIENTATIONS", "PlantedDion", "PlantedMuon",
           "planted_muon_factory", "digest",
           "full_copy", "is_dtensor", "place", "relative_difference", "CRASHES", "CrashingMuon",
           "crashing_muon_factory", "backend_feature", "headline", "user_frame_in", "STATE_PLACEMENTS", "recognize",
           "FutureMuon", "OwnerBatchMuon", "future_muon_factory", "owner_batch_muon_factory"]
