"""``ortho_verify.registry``: the one option registry that checks, cli, sharding, reproduce and the
tests read; the old names are its entries; it imports without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import ortho_fast
from ortho_fast.groups.dion import DION_DEFAULTS
from ortho_fast.groups.muon import MUON_DEFAULTS
from ortho_verify import checks, registry, reproduce, sharding
from ortho_verify.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]


def test_readers_use_the_registry():
    assert checks.MUON_CONFIGS is registry.MUON_CONFIGS and checks.DION_VARIANTS is registry.DION_VARIANTS
    assert cli.DION_VARIANT_RUNS is registry.DION_VARIANT_RUNS
    assert sharding.DION_OPTIONS == registry.get("sharding/dion").kwargs() == registry.SHARDING_DION
    assert sharding.MUON_OPTIONS == registry.get("sharding/muon").kwargs()
    assert [f"reproduce/{m.key}" for m in reproduce.METHODS] == [c.name for c in registry.REPRODUCTION_METHODS]
    assert [m.label for m in reproduce.METHODS] == [c.label for c in registry.REPRODUCTION_METHODS]


def test_every_configuration_is_accepted_by_ortho_fast():
    """Each Muon / Dion configuration's options are constructor keywords of ortho_fast (beyond the
    hyperparameters every optimizer takes)."""
    import torch

    for config in registry.CONFIGS:
        if config.algorithm not in ("muon", "dion"):
            continue
        cls, defaults = ((ortho_fast.Muon, MUON_DEFAULTS) if config.algorithm == "muon"
                         else (ortho_fast.Dion, DION_DEFAULTS))
        assert set(config.options) <= set(defaults) | {"lr", "weight_decay", "seed"}, config.name
        p = torch.nn.Parameter(torch.zeros(4, 3))
        cls([p], **{"lr": 0.01, **config.kwargs()})  # raises on a bad option


def test_sharding_layouts_take_their_variants_from_the_registry():
    variants = [dict(lay.options) for lay in sharding.LAYOUTS if lay.optimizer == "dion" and lay.options]
    known = list(registry.DION_VARIANTS.values())
    assert all(v in known for v in variants if "replicate_mesh_grad_sync" not in v)


def test_muon_option_grid():
    combos = registry.MUON_COMBOS
    assert len(combos) == 2 * 2 * 4 * 2 * 2 == len(set(combos))
    assert combos[0] == ("ema", True, "original", 0.0, "jordan") and combos[1][-1] == "polar_express"
    assert registry.muon_option_grid("nesterov", as_dicts=True) == [{"nesterov": True}, {"nesterov": False}]
    with pytest.raises(KeyError, match="axes"):
        registry.muon_option_grid("nesterov", "no such axis")


def test_lookup_and_validation():
    assert registry.get("Moonlight").algorithm == "muon" and "Moonlight" in registry.get("Moonlight").source
    with pytest.raises(KeyError, match="name"):
        registry.get("no such optimizer")
    with pytest.raises(ValueError, match="algorithm"):
        registry.OptimizerConfig("x", "sgd")
    with pytest.raises(ValueError, match="name"):
        registry.OptimizerConfig("", "muon")
    config = registry.get("torch.optim.Muon")
    with pytest.raises(TypeError):
        config.options["lr"] = 1.0  # read-only: readers get copies from kwargs()
    mine = config.kwargs(lr=1.0)
    assert mine["lr"] == 1.0 and config.options["lr"] == 0.02
    assert {c.algorithm for c in registry.select("reproduce")} == {"adamw", "muon", "dion", "dion2"}


def test_registry_imports_without_torch_or_optional_dependencies():
    code = ("import sys\n"
            "for name in ('matplotlib', 'rich', 'hypothesis'):\n"
            "    sys.modules[name] = None\n"
            "import ortho_verify.registry\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
