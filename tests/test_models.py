"""The course's models, built in one place (dpkit.models): every name a tool offers builds
the model its lessons describe, with weights a seed fixes; the old import paths notebooks
use still give the same objects; and Table, the rows ddp and pipeline print."""

from __future__ import annotations

import pytest
import torch

from dpkit import models
from dpkit.table import Table

# Hand-counted: weights plus biases of each Linear (and Conv2d), positions and LayerNorms.
PARAMETERS = {
    "mlp": 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10,  # 235,146: 0.9 MB
    "cnn": (9 * 8 + 8) + (8 * 9 * 16 + 16) + (16 * 7 * 7 * 10 + 10),
    "wide": 784 * 1024 + 1024 + 4 * (1024 * 1024 + 1024) + 1024 * 10 + 10,  # 20.0 MB
}  # "wide-mlp" (24.2 M parameters, zeros) takes about a second to build: too slow here


def test_every_name_a_tool_offers_is_built_here():
    from dpkit.ddp import DDP_MODELS, MODELS  # dpkit ddp; dpkit demo

    assert {*models.PREDICTION_MODELS, *DDP_MODELS, *MODELS} == set(models.BUILDERS)


@pytest.mark.parametrize("name", ["mlp", "cnn", "wide"])
def test_each_model_has_the_parameters_its_lesson_counts(name):
    model = models.build_model(name, seed=0)
    assert sum(p.numel() for p in model.parameters()) == PARAMETERS[name]
    assert model(models.sample_input(3)).shape == (3, models.CLASSES)


def test_the_transformer_reads_rows_as_tokens():
    model = models.build_model("transformer", seed=0)
    assert model.position.shape == (28, 32)  # one learned position per row, width 32
    assert model(models.sample_input(2)).shape == (2, models.CLASSES)


def test_a_seed_fixes_the_weights_and_no_seed_takes_torchs_generator():
    first, again = (models.build_model("mlp", seed=3).state_dict() for _ in range(2))
    assert all(torch.equal(first[k], again[k]) for k in first)
    torch.manual_seed(3)  # the demo and the DDP ranks seed, then build without a seed
    unseeded = models.build_model("mlp").state_dict()
    assert all(torch.equal(first[k], unseeded[k]) for k in first)


def test_an_unknown_name_lists_the_names():
    with pytest.raises(ValueError, match="'resnet'.*mlp, cnn, transformer, wide, wide-mlp"):
        models.build_model("resnet")


def test_the_paths_notebooks_import_give_the_same_objects():
    from dpkit import ddp
    from dpkit.ddp.workload import WithUnusedLayer  # notebook 09
    from dpkit.demo import build_model  # notebook 07

    assert build_model is models.build_model
    assert WithUnusedLayer is models.WithUnusedLayer
    assert ddp.wide_mlp is models.wide_mlp  # notebooks 07 and 09


def test_a_table_prints_aligned_rows():
    rows = Table(
        [{"name": "mlp", "bytes": 940584, "ms": 0.5}, {"name": "wide", "bytes": 1, "ms": 12.25}]
    )
    assert str(rows).splitlines() == [
        "name    bytes      ms",
        "---------------------",
        " mlp  940,584   0.500",
        "wide        1  12.250",
    ]
    assert str(Table()) == "(no rows)"
    assert str(Table([{"fits": True}, {"fits": False}])).splitlines()[2:] == [" True", "False"]
