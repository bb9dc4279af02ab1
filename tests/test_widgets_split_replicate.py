"""The split and replication explorers: their data match torch, their figures render and say
what hardware they came from, and moving a control changes the data and the image.

Expected values come from torch itself (``torch.chunk``) or from the model's own parameters,
never from another dpkit function.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

import dpkit
from dpkit.viz import replicas, split
from dpkit.viz.explorer import figure_png

# As on a GPU: code that leaves a model or a tensor off the devices fails (tests/conftest.py).
pytestmark = pytest.mark.placement_check

pytest.importorskip("ipywidgets")

cpu_lanes = functools.partial(dpkit.virtual_devices, on="cpu")


def _torch_chunk_sizes(batch: int, num_devices: int) -> list[int]:
    return [len(chunk) for chunk in torch.chunk(torch.arange(batch), num_devices)]


@pytest.mark.parametrize(
    "batch, num_devices", [(10, 8), (10, 4), (36, 7), (3, 16), (512, 16), (1, 1), (17, 5)]
)
@pytest.mark.parametrize("dim", [0, 1])
def test_torch_split_matches_torch_chunk(batch, num_devices, dim):
    plan = split.split_plan(batch, num_devices, dim=dim, devices=cpu_lanes)
    expected = _torch_chunk_sizes(batch, num_devices)
    assert plan.used_sizes == expected
    assert plan.idle == num_devices - len(expected)
    assert plan.chunk_sizes == tuple(expected + [0] * plan.idle)
    # Every sample lands on exactly one device, in order, and idle devices get none.
    assert [s for samples in plan.samples for s in samples] == list(range(batch))
    assert all(plan.samples[i] == () for i in plan.idle_devices)
    assert plan.input_shape[dim] == batch


@pytest.mark.parametrize("batch, num_devices", [(10, 4), (10, 8), (3, 8), (512, 16), (17, 5)])
def test_balanced_split_differs_by_at_most_one_and_idles_only_without_rows(batch, num_devices):
    plan = split.split_plan(batch, num_devices, mode="balanced", devices=cpu_lanes)
    assert sum(plan.chunk_sizes) == batch
    assert max(plan.used_sizes) - min(plan.used_sizes) <= 1
    assert plan.idle == max(0, num_devices - batch)


def test_ten_on_eight_uses_five_and_reports_three_idle():
    plan = split.split_plan(10, 8, devices=cpu_lanes)
    assert (plan.used, plan.idle, plan.idle_devices) == (5, 3, [5, 6, 7])
    assert plan.marker.startswith("batch=10 devices=8 -> chunks [2, 2, 2, 2, 2], idle: 3")


def test_bad_split_arguments_name_the_argument():
    with pytest.raises(ValueError, match="batch"):
        split.split_plan(0, 4, devices=cpu_lanes)
    with pytest.raises(ValueError, match="mode"):
        split.split_plan(4, 4, mode="even", devices=cpu_lanes)


def _idle_labels(figure) -> int:
    return sum(text.get_text() == "idle" for text in figure.axes[0].texts)


def test_split_figure_renders_highlights_idle_devices_and_says_virtual():
    figure = split.split_figure(split.split_plan(10, 8, devices=cpu_lanes))
    assert figure_png(figure).startswith(b"\x89PNG")
    assert _idle_labels(figure) == 3
    assert "virtual devices on the CPU" in figure.axes[0].get_title()
    assert "5 used, 3 idle" in figure.get_suptitle()
    heights = [bar.get_height() for bar in figure.axes[0].containers[0]]
    assert heights == [2, 2, 2, 2, 2, 0, 0, 0]


def test_scatter_table_shows_nested_inputs_kwargs_and_idle_devices():
    lanes = cpu_lanes(4)
    inputs = (torch.zeros(3, 5), {"mask": torch.ones(3), "name": "shared"})
    rows = split.scatter_table(inputs, {"scale": torch.ones(3, 2), "flag": True}, lanes)
    rows = rows.to_dict("records") if hasattr(rows, "to_dict") else rows
    assert [r["args"] for r in rows[:3]] == [
        "(tensor[1, 5], {'mask': tensor[1], 'name': 'shared'})"
    ] * 3
    assert rows[0]["kwargs"] == "{'scale': tensor[1, 2], 'flag': True}"
    assert rows[3]["args"].startswith("idle")


def test_split_explorer_redraws_when_a_control_moves():
    explorer = split.split_explorer(batch=10, num_devices=8, devices=cpu_lanes)
    assert set(explorer.controls) == {"batch", "devices", "dim", "split"}
    assert explorer.controls["batch"].description == "batch"
    assert explorer.controls["batch"].continuous_update is False
    first_plan, first_png = explorer.last_data, explorer.last_png
    assert explorer.marker.value == first_plan.marker
    assert explorer.image.value == first_png

    explorer.controls["batch"].value = 33
    assert explorer.last_data is not first_plan
    assert explorer.last_data.used_sizes == _torch_chunk_sizes(33, 8)
    assert explorer.last_png != first_png and explorer.image.value == explorer.last_png
    assert explorer.marker.value.startswith("batch=33 devices=8 -> chunks [5, 5, 5, 5, 5, 5, 3]")

    explorer.controls["split"].value = "balanced"
    assert explorer.last_data.used_sizes == [5, 4, 4, 4, 4, 4, 4, 4]
    explorer.controls["devices"].value = 16
    assert explorer.last_data.idle == 0  # balanced: 33 rows keep 16 devices busy
    explorer.controls["split"].value = "torch"
    assert explorer.last_data.idle == 16 - len(_torch_chunk_sizes(33, 16)) == 5
    explorer.controls["dim"].value = 1
    assert explorer.last_data.input_shape == (split.SEQUENCE, 33, split.FEATURES)
    assert "text/plain" in explorer._repr_mimebundle_()


# --------------------------------------------------------------------------------------
# Replication


def _model_bytes(model: nn.Module) -> int:
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("num_devices", [1, 2, 4, 7])
def test_replication_copies_model_bytes_to_every_device_but_the_first(num_devices):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Flatten(), nn.Linear(8, 2))
    model = dpkit.to_device(model, cpu_lanes(1)[0])
    cost = replicas.replication_cost(model, num_devices, cpu_lanes)
    assert cost.replica_bytes == _model_bytes(model)
    assert cost.copied_bytes == _model_bytes(model) * (num_devices - 1)
    assert cost.copied_per_device == (0,) + (_model_bytes(model),) * (num_devices - 1)
    assert cost.shares_storage == (True,) + (False,) * (num_devices - 1)


def test_replication_figure_renders_and_says_virtual():
    cost = replicas.model_cost(64, 4, cpu_lanes)
    figure = replicas.replication_figure(cost)
    assert figure_png(figure).startswith(b"\x89PNG")
    assert "virtual devices on the CPU" in figure.get_suptitle()
    labels = [text.get_text() for text in figure.axes[0].texts]
    assert labels[0] == "shared" and len(labels) == 4


def test_replication_explorer_redraws_when_a_control_moves():
    explorer = replicas.replication_explorer(width=64, num_devices=4, devices=cpu_lanes)
    assert set(explorer.controls) == {"width", "devices"}
    first_cost, first_png = explorer.last_data, explorer.last_png
    assert first_cost.copied_bytes == _model_bytes(replicas.example_model(64)) * 3

    explorer.controls["devices"].value = 8
    assert explorer.last_data.copied_bytes == _model_bytes(replicas.example_model(64)) * 7
    assert explorer.last_png != first_png and explorer.image.value == explorer.last_png
    assert explorer.marker.value.startswith("width=64 devices=8 -> copied 7 x")

    explorer.controls["width"].value = 128
    assert explorer.last_data.copied_bytes == _model_bytes(replicas.example_model(128)) * 7
    assert explorer.marker.value.startswith("width=128 devices=8")
