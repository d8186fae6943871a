"""The two ways of building a whole model's optimizer agree: ``MuonConfig(...).build(model)`` /
``DionConfig(...).build(model)`` and ``HybridOptimizer(param_groups(model, algorithm=..., ...))``
give every parameter the same group hyperparameters, with the defaults of the one table
``ortho_fast.param_assignment.HYBRID_DEFAULTS`` — the table docs/compatibility.md states ("Whole-model
defaults")."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from ortho_fast import DionConfig, HybridOptimizer, MuonConfig, param_groups
from ortho_fast.param_assignment import HYBRID_DEFAULTS
from tests.ortho_fast.helpers import D_MODEL, gpt_model

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {"muon": MuonConfig, "dion": DionConfig}
#: What each algorithm needs to accept the test GPT (its MoE stack): the same for both builders.
GROUPING = {"muon": dict(expert_keys=("experts",)),
            "dion": dict(expert_keys=("experts",), overrides=(("*experts.w1", {"algorithm": "muon"}),))}


def _per_parameter(opt: HybridOptimizer) -> dict[str, dict]:
    """Parameter name -> its group's hyperparameters (everything but the parameter lists)."""
    return {name: {k: v for k, v in g.items() if k not in ("params", "param_names")}
            for g in opt.param_groups for name in g["param_names"]}


@pytest.mark.parametrize("scalar_algorithm", ["adamw", "lion"])
@pytest.mark.parametrize("given", [{}, {"lr": 0.02}, {"lr": 0.02, "weight_decay": 0.05}],
                         ids=["defaults", "lr", "lr-wd"])
@pytest.mark.parametrize("algorithm", ["muon", "dion"])
def test_config_build_and_param_groups_give_the_same_groups(algorithm, given, scalar_algorithm):
    options = dict(GROUPING[algorithm], scalar_algorithm=scalar_algorithm, **given)
    built = _per_parameter(CONFIGS[algorithm](**options).build(gpt_model()))
    grouped = _per_parameter(HybridOptimizer(param_groups(gpt_model(), algorithm=algorithm, **options)))
    assert built.keys() == grouped.keys()
    differ = {n: {k: (built[n].get(k), grouped[n].get(k)) for k in built[n].keys() | grouped[n].keys()
                  if built[n].get(k) != grouped[n].get(k)} for n in built}
    assert not any(differ.values()), {n: d for n, d in differ.items() if d}


@pytest.mark.parametrize("algorithm", ["muon", "dion"])
def test_the_defaults_are_the_table(algorithm):
    """Both builders' groups carry the table's values (so a change to one builder alone fails above,
    and a change to the table shows here)."""
    row = HYBRID_DEFAULTS[algorithm]
    for opt in (CONFIGS[algorithm](**GROUPING[algorithm]).build(gpt_model()),
                HybridOptimizer(param_groups(gpt_model(), algorithm=algorithm, **GROUPING[algorithm]))):
        by_name = _per_parameter(opt)
        matrix, norm = by_name["_orig_mod.blocks.0.attn.proj.weight"], by_name["_orig_mod.ln_f.weight"]
        bias, head, embedding = (by_name["_orig_mod.blocks.0.attn.proj.bias"], by_name["_orig_mod.lm_head.weight"],
                                 by_name["_orig_mod.wte.weight"])
        scalar_wd = row["weight_decay"] if row["scalar_weight_decay"] is None else row["scalar_weight_decay"]
        assert (matrix["algorithm"], matrix["lr"], matrix["weight_decay"]) == \
            (algorithm, row["lr"], row["weight_decay"])
        for key, value in row["matrix_options"].items():
            assert matrix[key] == value
        for group in (norm, bias):
            assert (group["algorithm"], group["lr"], group["weight_decay"]) == ("adamw", row["lr"], scalar_wd)
            assert (group["betas"], group["eps"]) == (row["scalar_options"]["adamw"]["betas"],
                                                      row["scalar_options"]["adamw"]["eps"])
        assert embedding["weight_decay"] == row["embedding_weight_decay"]
        scale = 1 / math.sqrt(D_MODEL) if row["lm_head_lr_scale"] == "inv_sqrt_d_model" else 1.0
        assert head["lr"] == row["lr"] * scale and head["weight_decay"] == scalar_wd


def _doc_table() -> dict[str, dict[str, str]]:
    """docs/compatibility.md, "Whole-model defaults": row label -> {algorithm: cell}."""
    text = (ROOT / "docs" / "compatibility.md").read_text()
    section = text.split("## Whole-model defaults", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header[1:], cells[1:]))
    return rows


def _numbers(cell: str) -> list[float]:
    return [float(x) for x in re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?:e-?\d+)?", cell)]


def test_the_documented_table_is_the_code():
    rows = _doc_table()
    for algorithm, row in HYBRID_DEFAULTS.items():
        column = f"`{algorithm}`"
        scalar_wd = row["scalar_weight_decay"]
        assert _numbers(rows["matrix lr (`lr`)"][column]) == [row["lr"]], algorithm
        assert _numbers(rows["matrix weight decay (`weight_decay`)"][column]) == [row["weight_decay"]], algorithm
        scalar_cell = rows["AdamW / Lion weight decay (`scalar_weight_decay`)"][column]
        assert _numbers(scalar_cell) == [scalar_wd] if scalar_wd is not None else "= `weight_decay`" in scalar_cell
        assert _numbers(rows["embedding weight decay"][column]) == [row["embedding_weight_decay"]]
        assert ("/√d_model" in rows["output-head lr (`lm_head_lr_scale`)"][column]) == bool(row["lm_head_lr_scale"])
        assert _numbers(rows["AdamW betas, eps"][column]) == [*row["scalar_options"]["adamw"]["betas"],
                                                             row["scalar_options"]["adamw"]["eps"]]
        assert _numbers(rows["Lion betas"][column]) == list(row["scalar_options"]["lion"]["betas"])
        assert rows["further matrix options"][column] == (
            ", ".join(f'`{k}="{v}"`' for k, v in row["matrix_options"].items()) or "—")
