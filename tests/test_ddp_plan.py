"""The plan (dpkit.ddp.plan): sharding predicts less memory per device than DDP, in the
order ZeRO's arithmetic says, "fits" follows the machine's memory, and the choice is the
fastest predicted strategy that fits, or says that none does."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import dpkit.cost as cost
from dpkit import models
from dpkit.ddp.plan import STRATEGIES, choose, plan

MACHINE = cost.preset("8xA100-SXM-NVLink")


@pytest.fixture(scope="module")
def rows():  # 3 devices: a stage for each of the mlp's 3 layers
    return plan(models.build_model("mlp", seed=0), models.sample_input(), 256, 3, MACHINE)


def by_name(rows):
    return {row["strategy"]: row for row in rows}


def test_sharding_holds_less_than_ddp_in_zero_s_order(rows):
    assert [row["strategy"] for row in rows] == list(STRATEGIES)
    memory = {name: row["predicted bytes/device"] for name, row in by_name(rows).items()}
    assert memory["FSDP"] < memory["ZeRO-1"] < memory["DDP"]
    assert all(row["predicted step ms"] > 0 for row in rows)


def test_fits_follows_the_memory_and_the_choice_is_the_fastest_that_fits(rows):
    memory = {name: row["predicted bytes/device"] for name, row in by_name(rows).items()}
    small = dataclasses.replace(MACHINE, memory_capacity=memory["ZeRO-1"])
    tight = plan(models.build_model("mlp", seed=0), models.sample_input(), 256, 3, small)
    fitting = {row["strategy"] for row in tight if row["fits"]}
    assert fitting == {name for name, nbytes in memory.items() if nbytes <= memory["ZeRO-1"]}
    assert "DDP" not in fitting and "ZeRO-1" in fitting
    chosen = choose(tight, small.memory_capacity)
    name = chosen.split(":")[0]
    assert name in fitting  # ZeRO-1 is the simplest that fits; another only if 2x faster
    steps = {r["strategy"]: r["predicted step ms"] for r in tight}
    assert name == "ZeRO-1" or steps[name] * 2 <= steps["ZeRO-1"]
    assert "DDP" in chosen.split("; ")[-1] and "would not fit" in chosen
    assert choose(tight, 1).startswith("nothing fits")


def test_no_pipeline_of_more_stages_than_the_model_has_layers():
    # the mlp has 3 Linear layers: 8 stages would leave 5 devices without one
    eight = by_name(plan(models.build_model("mlp", seed=0), models.sample_input(), 256, 8, MACHINE))
    pipeline = eight["pipeline"]
    assert not pipeline["fits"] and pipeline["how"] == "3 layers for 8 stages"
    assert choose(list(eight.values()), MACHINE.memory_capacity).split(":")[0] != "pipeline"


def test_dpkit_plan_prints_every_engine_and_the_choice(capsys):
    from dpkit.cli import main

    assert main(["plan", "--model", "mlp", "--hardware", "8xA100-SXM-NVLink", "--batch", "64"]) == 0
    printed = capsys.readouterr().out
    assert "every number predicted" in printed and "choice: " in printed
    assert all(engine in printed for engine in STRATEGIES)
    with pytest.raises(SystemExit) as refused:
        main(["plan", "--batch", "0"])
    assert refused.value.code == 2 and "--batch: must be at least 1" in capsys.readouterr().err


def test_dpkit_plan_s_refusals_name_the_flags_typed(capsys):
    from dpkit.cli import main

    assert main(["plan", "--model", "mlp", "--batch", "3"]) == 2  # 8 A100s by default
    error = capsys.readouterr().err
    assert "--batch 3 over --devices 8 leaves 5 of 8 ranks without rows" in error
    assert "batch_size" not in error and "e.g. --batch 8" in error


def test_dpkit_plan_takes_a_hardware_file_an_optimizer_and_presets_in_any_case(capsys):
    from dpkit.cli import main

    assert main(["plan", "--model", "mlp", "--hardware", "t4-pcie3"]) == 0
    assert "mlp on 4 x T4," in capsys.readouterr().out  # T4-PCIe3: 4 of them
    toml = Path(__file__).resolve().parents[1] / "docs" / "examples" / "my_machine.toml"
    example = ["--hardware-file", str(toml), "--optimizer", "sgd"]
    assert main(["plan", "--model", "mlp", *example]) == 0
    printed = capsys.readouterr().out
    assert "with SGD):" in printed and "choice: " in printed
    assert main(["plan", "--hardware", "T4-PCIe3", *example]) == 2
    assert "--hardware and --hardware-file name two machines" in capsys.readouterr().err
