"""Notebook 06's figures and explorer (dpkit.viz.scaling) and the check of a prediction
against this machine's lanes (dpkit.viz.prediction_check).

Expected bytes come from the model's own parameters and the preset's topology, expected
speed-ups from ``dpkit.cost.predict`` called directly, verdicts from hand-made numbers.
"""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest

import dpkit.cost as cost
from dpkit.models import build_model, sample_input
from dpkit.verdict import Outcome
from dpkit.viz import prediction_check, scaling
from dpkit.viz.explorer import figure_png

# As on a GPU: code that leaves a model or a tensor off the devices fails (tests/conftest.py).
pytestmark = pytest.mark.placement_check

TWO_NODES = "2x8xA100-IB-HDR"


def _parameter_bytes(name: str) -> int:
    return sum(p.numel() * p.element_size() for p in build_model(name, seed=0).parameters())


def test_traffic_counts_what_each_phase_moves_inside_one_node():
    params = _parameter_bytes("cnn")
    trace = scaling.predict("cnn", 160, 8, TWO_NODES)  # DataParallel: node 0's 8 devices
    rows = {row.phase: row for row in scaling.phase_traffic(trace)}
    for phase in ("replicate", "reduce"):  # the whole model, to or from each other device
        assert rows[phase].inside == 7 * params, phase
        assert rows[phase].across == 0, phase
    # the batch: 8 chunks of 160 / 8 = 20 rows; device 0's stays
    assert rows["scatter"].inside == 7 * 20 * 28 * 28 * 4
    assert rows["apply"].inside == rows["apply"].across == 0
    ddp = {
        row.phase: row
        for row in scaling.phase_traffic(scaling.predict("cnn", 160, 12, TWO_NODES, "ddp"))
    }
    assert ddp["allreduce"].across > 0  # ranks 8-11 on node 1 all-reduce over the network
    assert len(scaling.traffic(trace)) == len(rows)


def test_ddp_all_reduces_instead_of_funnelling_through_device0():
    rows = {row.phase for row in scaling.phase_traffic(scaling.predict("cnn", 64, 4, TWO_NODES,
                                                                        "ddp"))}  # fmt: skip
    assert "allreduce" in rows and not {"replicate", "reduce"} & rows


def test_link_names_state_each_link_s_bandwidth_and_latency():
    machine = cost.preset(TWO_NODES)
    names = scaling.link_names(machine)
    assert f"{machine.network_link().bandwidth / 1e9:.3g} GB/s" in names["network"]
    assert f"{machine.device_link().bandwidth / 1e9:.3g} GB/s" in names["node"]


def test_phase_timeline_draws_each_phase_s_span_and_says_predicted():
    trace = scaling.predict("mlp", 256, 4, "4xA100-PCIe4")
    figure = scaling.phase_timeline([trace], ["one step"])
    axes = figure.axes[0]
    labels = [tick.get_text() for tick in axes.get_yticklabels()]
    starts = {}
    for event in trace.events:
        starts[event.phase] = min(starts.get(event.phase, event.start), event.start)
    assert labels == sorted(starts, key=starts.get)  # the phases in the order they began
    widths = {labels[round(bar.get_y() + bar.get_height() / 2)]: bar.get_width()
              for bar in axes.patches}  # fmt: skip
    for row in trace.summary():  # each bar is its phase's span, in ms (or the minimum width)
        assert widths[row["phase"]] == pytest.approx(max(row["time_s"] * 1e3, widths[row["phase"]]))
        assert widths[row["phase"]] >= row["time_s"] * 1e3 * (1 - 1e-9)
    assert "predicted" in figure.get_suptitle() and "4xA100-PCIe4" in figure.get_suptitle()
    assert figure_png(figure).startswith(b"\x89PNG")
    with pytest.raises(ValueError, match="traces"):
        scaling.phase_timeline([])


def test_speedup_grid_is_one_device_over_n_from_the_cost_model():
    grid = scaling.speedup_grid("mlp", "8xA100-SXM-NVLink", batches=(64, 4096), devices=(2, 8, 16))
    assert grid.devices == (2, 8)  # DataParallel: one node's devices only
    model = scaling.model("mlp")
    sample = sample_input()
    for i, batch in enumerate(grid.batches):
        one = cost.predict(model, sample, batch, 1, "8xA100-SXM-NVLink").step_time
        for j, n in enumerate(grid.devices):
            many = cost.predict(model, sample, batch, n, "8xA100-SXM-NVLink").step_time
            assert grid.speedup[i][j] == pytest.approx(one / many)
            assert grid.efficiency[i][j] == pytest.approx(one / many / n)
    figure = scaling.speedup_heatmap(grid)
    assert "predicted" in figure.get_suptitle()
    texts = [t.get_text() for t in figure.axes[0].texts]
    assert len(texts) == 4 and sum(t.endswith("*") for t in texts) == sum(
        s < 1 for row in grid.speedup for s in row
    )


def test_break_even_is_the_first_batch_where_n_devices_beat_one():
    grid = scaling.SpeedupGrid(
        "m", "h", "dp", batches=(16, 256, 4096), devices=(2, 8),
        step_ms=((2.0, 9.0), (1.5, 3.0), (1.0, 1.0)), single_ms=(1.0, 2.0, 4.0),
    )  # fmt: skip
    assert grid.speedup == [[0.5, 1 / 9], [2 / 1.5, 2 / 3], [4.0, 4.0]]
    assert grid.break_even(2) == 256
    assert grid.break_even(8) == 4096
    never = scaling.SpeedupGrid("m", "h", "dp", (16,), (2,), ((3.0,),), (1.0,))
    assert never.break_even(2) is None


def test_scaling_rows_grow_the_batch_with_the_devices_and_say_predicted():
    rows = scaling.scaling_rows("mlp", 32, (1, 4, 16), ("2x8xA100-10GbE",))
    assert [(r.strategy, r.devices, r.batch) for r in rows] == [
        (s, n, 32 * n) for s in ("dp", "ddp") for n in (1, 4, 16) if (s, n) != ("dp", 16)
    ]  # DataParallel stops at one node
    assert all(0 <= r.communication_ms < r.step_ms for r in rows)
    figure = scaling.scaling_figure(rows)
    assert "predicted" in figure.axes[0].get_title()
    assert len(figure.axes[0].lines) == 2


def test_explorer_redraws_for_every_control_and_names_what_it_shows():
    pytest.importorskip("ipywidgets")
    explorer = scaling.scaling_explorer(hardware="8xA100-SXM-NVLink", model_name="mlp",
                                        devices=8, batch=256)  # fmt: skip
    assert re.match(
        r"batch=256 devices=8 hardware=8xA100-SXM-NVLink model=mlp", explorer.marker.value
    )
    first_png = explorer.last_png
    explorer.controls["batch"].value = 272
    assert explorer.marker.value.startswith("batch=272 ") and explorer.last_png != first_png
    explorer.controls["devices"].value = 64  # past one node, and 272 rows make 55 chunks
    assert explorer.last_data.dp is None and explorer.last_data.ddp is None
    assert "DataParallel one node only, DDP too few rows" in explorer.marker.value
    said = " ".join(text.get_text() for text in explorer.last_figure.texts)
    assert "no DataParallel: one process" in said
    assert "no DDP: batch 272 makes 55 chunks, so 9 of 64 ranks would get no rows" in said
    explorer.controls["batch"].value = 512  # 8 rows a rank: DDP alone, and why
    assert explorer.last_data.dp is None and explorer.last_data.ddp.device_count == 64
    labels = [axes.get_title(loc="left") for axes in explorer.last_figure.axes]
    assert len(labels) == 1 and "no DataParallel: one process" in labels[0]
    assert "predicted" in explorer.last_figure.get_suptitle()
    explorer.controls["devices"].value = 8
    assert explorer.last_data.dp.device_count == 8
    explorer.controls["hardware"].value = TWO_NODES
    assert TWO_NODES in explorer.last_figure.get_suptitle()
    assert "predicted" in explorer.last_figure.get_suptitle()
    explorer.controls["model"].value = "transformer"
    assert "model=transformer" in explorer.marker.value


@pytest.mark.parametrize(
    "kwargs, words",
    [({"devices": 0}, "devices"), ({"batch": 1}, "batch"), ({"model_name": "resnet"}, "model_name"),
     ({"hardware": "8xB200"}, "8xA100")],
)  # fmt: skip
def test_explorer_refuses_values_it_cannot_show(kwargs, words):
    pytest.importorskip("ipywidgets")
    with pytest.raises(ValueError, match=words):
        scaling.scaling_explorer(**kwargs)


def _comparison(measured_ms: list[float], predicted_ms: float) -> prediction_check.Comparison:
    predicted = SimpleNamespace(step_time=predicted_ms / 1e3)
    return prediction_check.Comparison("mlp", 2, 8, None, predicted, measured_ms)


def test_a_prediction_is_judged_on_the_middle_half_of_the_measured_steps():
    tight = [10.0, 10.1, 10.2, 10.3, 10.4, 10.5]  # steps over the prediction: middle half
    assert _comparison(tight, 10.25).verdict().outcome is Outcome.WITHIN_NOISE  # 0.99-1.01
    faster = _comparison(tight, 8.0).verdict()  # every step 1.25-1.31x the prediction
    assert faster.outcome is Outcome.FASTER and "leaves out" in str(faster)
    assert _comparison(tight, 13.0).verdict().outcome is Outcome.SLOWER  # 0.77-0.81x
    wide = [8.0, 9.0, 10.0, 12.0, 14.0, 16.0]  # a loaded machine: 0.82-1.23x of 11 ms
    assert _comparison(wide, 11.0).verdict().outcome is Outcome.TOO_NOISY
    assert _comparison(tight, 10.25).error == pytest.approx(10.25 / 10.25 - 1)


def test_measured_against_predicted_on_lanes():
    check = prediction_check.measure_against_prediction(
        cost.preset("this-machine"), "mlp", devices=2, batch=16, steps=4
    )
    assert len(check.measured_ms) == 4 and all(ms > 0 for ms in check.measured_ms)
    assert check.predicted.device_count == 2 and check.predicted_ms > 0
    phases = set(check.phase_errors()["phase"])
    assert {"scatter", "replicate", "apply", "backward", "reduce"} <= phases
    figure = prediction_check.comparison_figure(check)
    panels = [axes.get_title(loc="left") for axes in figure.axes]
    assert panels[0].startswith("measured") and "virtual devices on the CPU" in panels[0]
    assert panels[1].startswith("predicted")
    with pytest.raises(ValueError, match="steps"):
        prediction_check.measure_against_prediction(cost.preset("this-machine"), steps=2)


def test_a_models_first_prediction_says_it_is_profiling_while_it_works(monkeypatch):
    """The first prediction of a model profiles it (1-2 s): the marker says so while that
    runs, and only then; afterwards it names what is drawn."""
    pytest.importorskip("ipywidgets")
    seen = []
    real_view = scaling.scaling_view

    def watched(hardware, model_name, devices, batch):
        seen.append((model_name, explorer_marker()))
        return real_view(hardware, model_name, devices, batch)

    monkeypatch.setattr(scaling, "scaling_view", watched)
    holder = {}

    def explorer_marker():
        return holder["explorer"].marker.value if "explorer" in holder else "(first)"

    explorer = scaling.scaling_explorer(hardware="8xA100-SXM-NVLink", model_name="mlp")
    holder["explorer"] = explorer
    explorer.controls["model"].value = "cnn"  # a model not seen yet: profiled first
    explorer.controls["batch"].value = 272  # seen: no message
    assert seen[1][1].startswith("profiling cnn")
    assert seen[2][1].startswith("batch=1024 devices=8") and "model=cnn" in seen[2][1]
    assert explorer.marker.value.startswith("batch=272 ")


def test_a_ddp_grid_has_no_step_where_a_rank_would_get_no_rows():
    # 16 rows: 2 ranks get 8 each, 32 ranks would leave 16 without rows (DDP cannot run)
    grid = scaling.speedup_grid("mlp", "8xA100-SXM-NVLink", batches=(16, 64), devices=(2, 32),
                                strategy="ddp")  # fmt: skip
    assert math.isnan(grid.step_ms[0][1]) and math.isnan(grid.speedup[0][1])
    assert not any(math.isnan(v) for v in (grid.step_ms[0][0], *grid.step_ms[1]))
    assert grid.break_even(32) in (64, None)  # never the batch it cannot run
    figure = scaling.speedup_heatmap(grid)
    assert [t.get_text() for t in figure.axes[0].texts].count("-") == 1
    assert "-: a rank would get no rows" in figure.get_suptitle()


def test_ddp_is_left_out_where_the_batch_leaves_a_rank_without_rows_and_the_figure_says_so():
    # 16 rows over 7 devices: torch.chunk's chunks of 3 make 6, so DataParallel leaves one
    # device idle (it builds no replica there), while DDP has no rank without rows of its own
    view = scaling.scaling_view("8xA100-SXM-NVLink", "mlp", 7, 16)
    assert view.ddp is None and view.dp.device_count == 7
    figure = scaling.scaling_view_figure(view)
    (label,) = [axes.get_title(loc="left") for axes in figure.axes]
    assert label.startswith("DataParallel: ")
    assert label.endswith("(no DDP: batch 16 makes 6 chunks, so 1 of 7 ranks would get no rows)")
    assert "predicted" in figure.get_suptitle() and ", dp" not in figure.get_suptitle()
