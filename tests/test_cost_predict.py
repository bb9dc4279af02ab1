"""The cost model's predictions: bytes and memory exactly as dpkit measures them, every export
and figure working on a predicted trace and saying "predicted", DDP's buckets, speed, errors."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import torch
from torch import nn

import dpkit
import dpkit.cost as cost
from dpkit.cost import profiling
from dpkit.models import build_model, sample_input
from dpkit.tracing import BACKWARD_PHASES
from tests.lanes import lanes

viz = pytest.importorskip("dpkit.viz")


def with_batchnorm() -> nn.Module:
    """A model with buffers: replicate broadcasts them in events of their own."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
        nn.Linear(4 * 28 * 28, 10),
    )  # fmt: skip


def _index(device: str) -> int:
    return int(re.search(r":(\d+)", device).group(1))


def measured_trace(model: nn.Module, devices: int, batch: int) -> dpkit.Trace:
    chosen = lanes(devices)
    parallel = dpkit.DataParallel(model, device_ids=chosen)
    images = torch.randn(batch, 1, 28, 28)
    labels = torch.randint(0, 10, (batch,))
    with dpkit.trace() as recorded:
        nn.functional.cross_entropy(parallel(images), labels).backward()
    return recorded


def moves(trace: dpkit.Trace) -> Counter:
    """Every event as (phase, device index, bytes, what): the multiset a trace's copies make."""
    return Counter(
        (e.phase, _index(e.device), e.nbytes, e.details.get("what")) for e in trace.events
    )


def held(trace: dpkit.Trace) -> Counter:
    return Counter((_index(r.device), r.category, r.nbytes) for r in trace.memory)


CASES = [("mlp", 2, 64), ("mlp", 3, 10), ("cnn", 4, 37), ("transformer", 3, 20), ("bn", 2, 9)]


@pytest.mark.parametrize(("name", "devices", "batch"), CASES)
def test_predicted_dp_events_and_bytes_equal_a_measured_trace(name, devices, batch):
    model = with_batchnorm() if name == "bn" else build_model(name, seed=0)
    predicted = cost.predict(model, sample_input(), batch, devices, "this-machine")
    measured = measured_trace(model, devices, batch)
    # the same events, phase by phase and device by device, with the same bytes (exact)
    assert moves(predicted) == moves(measured)
    for phase in ("scatter", "replicate", "gather", "grad_scatter", "reduce"):
        total = sum(e.nbytes for e in predicted.events if e.phase == phase)
        assert total == sum(e.nbytes for e in measured.events if e.phase == phase), phase
    # and the same memory records where the trace records them: parameters, input,
    # activations, outputs, gathered (gradients and optimizer state: test_cost_model.py)
    recorded = {category for _, category, _ in held(measured)}
    assert recorded <= set(dpkit.tracing.MEMORY_CATEGORIES)
    assert Counter(r for r in held(predicted).elements() if r[1] in recorded) == held(measured)


class LogitsAndExtras(nn.Module):
    """Logits, the features before them (detached: a caller's to read) and the predicted
    class (integers): only the logits are on the loss's autograd path."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body, self.head = nn.Sequential(nn.Flatten(), nn.Linear(784, 16)), nn.Linear(16, 10)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        features = self.body(images)
        logits = self.head(features)
        return logits, features.detach(), logits.argmax(dim=1)


def test_predicted_grad_scatter_bytes_equal_a_measured_trace_for_outputs_no_loss_reads():
    model, batch = LogitsAndExtras(), 10
    predicted = cost.predict(model, sample_input(), batch, 3, "this-machine")
    parallel = dpkit.DataParallel(model, device_ids=lanes(3))
    with dpkit.trace() as measured:
        logits, _, _ = parallel(torch.randn(batch, 1, 28, 28))
        nn.functional.cross_entropy(logits, torch.randint(0, 10, (batch,))).backward()
    for phase in ("gather", "grad_scatter"):
        total = sum(e.nbytes for e in predicted.events if e.phase == phase)
        assert total == sum(e.nbytes for e in measured.events if e.phase == phase), phase
    # devices 1 and 2 get back the gradient of their logits alone: 3 + 3 rows of 10 floats
    assert sum(e.nbytes for e in predicted.events if e.phase == "grad_scatter") == 6 * 10 * 4


def test_predicted_bytes_follow_chunks_and_parameters():
    model = build_model("mlp", seed=0)
    params = sum(p.nbytes for p in model.parameters())
    predicted = cost.predict(model, sample_input(), 10, 4, "8xA100-SXM-NVLink")
    by_phase = {row["phase"]: row["nbytes"] for row in predicted.summary()}
    assert by_phase["scatter"] == (3 + 3 + 1) * 784 * 4  # chunks 3, 3, 3, 1; device 0's stays
    assert by_phase["replicate"] == 3 * params
    assert by_phase["reduce"] == 3 * params
    assert by_phase["gather"] == by_phase["grad_scatter"] == (3 + 3 + 1) * 10 * 4


def test_dataparallel_replicates_onto_the_devices_that_got_a_chunk_and_no_others():
    # 3 rows over 8 GPUs: torch.chunk makes 3 chunks of 1, and DataParallel replicates the
    # module onto devices_ids[:3] only (as dpkit.DataParallel, measured on lanes above)
    model = build_model("mlp", seed=0)
    params = sum(p.nbytes for p in model.parameters())
    predicted = cost.predict(model, sample_input(), 3, 8, "8xA100-SXM-NVLink")
    for phase in ("replicate", "reduce"):
        events = [e for e in predicted.events if e.phase == phase]
        assert {_index(e.device) for e in events} == {0, 1, 2}, phase
        assert sum(e.nbytes for e in events) == 2 * params, phase


def test_the_caller_starting_replica_threads_holds_the_gil_as_their_calls_do():
    from dpkit.cost.prediction import _threads

    # by hand, 2 threads on 2 cores, one call each of 1 s of Python then 3 s of kernel, the
    # caller's starts 1 s of Python each: A started 0-1, its Python 1-2 (the caller waits for
    # the GIL), B started 2-3, its Python 3-4; kernels 2-5 and 4-7. As fixed delays of 1 s
    # (the model before), B started at 2 while A's Python ran, and was done at 6.
    starts = [0.0, 0.0]
    assert _threads(starts, 1, [1.0, 1.0], [3.0, 3.0], 2.0, caller=1.0) == pytest.approx([5, 7])
    assert starts == pytest.approx([1, 3])


@pytest.mark.parametrize("strategy", ["dp", "ddp"])
def test_predicted_trace_goes_through_every_export_and_figure(strategy, tmp_path):
    predicted = cost.predict(
        build_model("cnn", seed=0),
        sample_input(),
        256,
        4,
        "4xA100-PCIe4",
        strategy=strategy,
        steps=2,
    )
    assert "predicted" in predicted.hardware and "4xA100-PCIe4" in predicted.hardware
    summary = predicted.summary()
    assert {row["phase"] for row in summary} >= {"apply", "backward"}
    assert all(row["time_s"] > 0 for row in summary)
    assert "phase" in str(summary)
    memory = predicted.memory_summary()
    assert len(memory) == 4 and all(row["counted"] > 0 for row in memory)
    assert "predicted:0 (A100 PCIe)" in str(memory)
    chrome = json.loads(predicted.to_chrome_trace(tmp_path / "trace.json").read_text())
    names = [e["args"]["name"] for e in chrome["traceEvents"] if e["name"] == "process_name"]
    assert names == ["predicted devices (cost model)"]
    tracks = [e for e in chrome["traceEvents"] if e["name"] == "thread_name"]
    assert len(tracks) == 4
    assert all(e["args"]["kind"] == "predicted" for e in chrome["traceEvents"] if e["ph"] == "X")
    rows = predicted.rows()
    assert len(rows) == len(predicted.events)
    for figure in (
        viz.timeline(predicted),
        viz.bytes_per_phase(predicted),
        viz.memory_per_device(predicted),
    ):
        title = figure.axes[0].get_title()
        assert "predicted" in title and "4xA100-PCIe4" in title, title
        figure.savefig(tmp_path / "figure.png")
    assert predicted.step_time > 0
    assert {e.step for e in predicted.events} == {1, 2}


@pytest.mark.parametrize(
    ("bucket_cap_mb", "bucket_bytes"),
    [
        # torch's default: the last layer (bias 2,048 + weight 1,048,576 B) passes the first
        # bucket's 1 MiB and closes it; the first layer's 1,050,624 B make the second
        (None, [1_050_624, 1_050_624]),
        # a cap given, even torch's 25, is the first bucket's too: one bucket of both layers
        (25, [2_101_248]),
        # 1.5 MiB (1,572,864 B): the last layer does not reach it, the first layer closes it
        (1.5, [2_101_248]),
        (1, [1_050_624, 1_050_624]),
    ],
)
def test_ddp_takes_a_small_first_bucket_only_when_no_cap_is_given(bucket_cap_mb, bucket_bytes):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 512))  # 1 MiB + 2 KiB each
    predicted = cost.predict(model, torch.randn(1, 512), 8, 2, "8xA100-SXM-NVLink",
                             strategy="ddp", bucket_cap_mb=bucket_cap_mb)  # fmt: skip
    allreduces = [e for e in predicted.events
                  if e.phase == "allreduce" and e.device.startswith("predicted:0")]  # fmt: skip
    assert [e.details["bucket_bytes"] for e in allreduces] == bucket_bytes


def test_ddp_all_reduces_the_gradients_in_buckets_overlapping_backward():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 1024), nn.ReLU(),
        nn.Linear(1024, 10),
    )  # fmt: skip
    params = [p.nbytes for p in model.parameters()]
    predicted = cost.predict(model, sample_input(), 512, 8, "8xA100-SXM-NVLink", strategy="ddp")
    device0 = [e for e in predicted.events if e.device.startswith("predicted:0")]
    allreduces = [e for e in device0 if e.phase == "allreduce"]
    buckets = cost.ddp_buckets(params)
    # the first bucket closes past 1 MiB (the last two layers), the second holds the rest
    assert len(allreduces) == len(buckets) == 2
    assert sum(e.details["bucket_bytes"] for e in allreduces) == sum(params)
    # a ring all-reduce sends 2 (n-1)/n of each bucket from every device: 14/8 on 8 devices
    expected = sum(round(14 * sum(params[i] for i in b) / 8) for b in buckets)
    assert sum(e.nbytes for e in allreduces) == expected
    backward = next(e for e in device0 if e.phase == "backward")
    assert allreduces[0].start < backward.end  # the first bucket overlaps the backward
    assert not [e for e in predicted.events if e.phase in ("scatter", "gather", "reduce")]
    memory = predicted.memory_summary()
    assert len({row["counted"] for row in memory}) == 1  # no device-0 imbalance
    assert all(e.phase in BACKWARD_PHASES or e.phase == "apply" for e in predicted.events)


def test_ddp_buckets_match_torch():
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    sizes = [4 << 20, 4, 30 << 20, 2 << 20, 500 << 10, 700 << 10, 300 << 10, 8, 1 << 20]
    tensors = [torch.empty(size // 4) for size in sizes]
    expected, _ = dist._compute_bucket_assignment_by_size(
        list(reversed(tensors)), [1 << 20, 25 << 20], [False] * len(tensors)
    )
    assert cost.ddp_buckets(sizes) == [[len(sizes) - 1 - i for i in b] for b in expected]


def test_dataparallel_stays_on_one_node_and_ddp_spans_nodes():
    model, x = build_model("mlp", seed=0), sample_input()
    with pytest.raises(ValueError, match="one process.*strategy='ddp'.*torchrun"):
        cost.predict(model, x, 4096, 16, "2x8xA100-10GbE")  # DataParallel cannot span nodes
    two_nodes = cost.predict(model, x, 4096, 16, "2x8xA100-10GbE", strategy="ddp")
    assert "predicted:8 (A100, node 1)" in {e.device for e in two_nodes.events}
    ddp_ib = cost.predict(model, x, 4096, 16, "2x8xA100-IB-HDR", strategy="ddp")
    one_node = cost.predict(model, x, 4096, 8, "2x8xA100-10GbE", strategy="ddp")
    assert one_node.step_time < ddp_ib.step_time < two_nodes.step_time


def test_one_device_runs_the_module_itself():
    predicted = cost.predict(build_model("mlp", seed=0), sample_input(), 64, 1, "T4-PCIe3")
    phases = [e.phase for e in predicted.events]
    assert phases == ["scatter", "apply", "backward"]
    assert sum(e.nbytes for e in predicted.events) == 0


def test_a_prediction_runs_the_model_once_and_reuses_its_profile(monkeypatch):
    """The explorers predict at every slider move: only the first prediction of a model runs
    it (a speed goal in milliseconds would be a timed unit test, noisy under load)."""
    model, x = build_model("transformer", seed=0), sample_input()
    cost.predict(model, x, 1024, 8, "8xH100-SXM-NVLink")  # profiles once
    passes = []
    run_passes = profiling.run_passes
    monkeypatch.setattr(
        profiling,
        "run_passes",
        lambda *args, **kwargs: passes.append(1) or run_passes(*args, **kwargs),
    )
    for strategy in ("dp", "ddp"):
        for batch in (64, 1024):
            cost.predict(model, x, batch, 8, "8xH100-SXM-NVLink", strategy=strategy)
    assert passes == []
    cost.predict(build_model("transformer", seed=0), x, 64, 8, "8xH100-SXM-NVLink")
    assert passes, "a new model is profiled: the check above would see a pass"


def test_profile_counts_flops_like_flop_counter_mode_and_leaves_the_model_alone():
    from torch.utils.flop_counter import FlopCounterMode

    model = with_batchnorm()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    profiled = cost.profile(model, sample_input())
    assert cost.profile(model, sample_input()) is profiled  # cached
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert all(p.grad is None for p in model.parameters())
    x = torch.randn(7, 1, 28, 28)
    with FlopCounterMode(display=False) as counter:
        model(x)
    assert profiled.forward.flops(7) == counter.get_total_flops()
    assert profiled.input_bytes(7) == x.nbytes


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"strategy": "zero"}, "strategy"),
        ({"batch_size": 0}, "^batch_size must be a positive int, got 0"),
        ({"devices": 0}, "devices"),
        ({"hardware": "laptop-gpu"}, "preset"),
        ({"steps": 0}, "^steps must be a positive int, got 0"),
        ({"bucket_cap_mb": True}, "bucket_cap_mb"),  # not 1 MiB: torch's DDP has its own check
        ({"bucket_cap_mb": float("inf")}, "bucket_cap_mb=inf is more than torch can hold"),
        ({"bucket_cap_mb": -1}, "bucket_cap_mb must be a positive number"),
        # DataParallel leaves a device without a chunk idle; DDP would have a rank of no rows
        (
            {"strategy": "ddp", "batch_size": 3, "devices": 4},
            r"^batch_size=3 over devices=4 leaves 1 of 4 ranks without rows .*batch_size=4$",
        ),
    ],
)
def test_bad_arguments_are_named(kwargs, words):
    arguments = {"batch_size": 32, "devices": 2, "hardware": "T4-PCIe3", **kwargs}
    with pytest.raises(ValueError, match=words):
        cost.predict(build_model("mlp", seed=0), sample_input(), **arguments)


def test_devices_is_a_count_or_a_list_of_devices():
    model, x = build_model("mlp", seed=0), sample_input()
    by_count = cost.predict(model, x, 32, 2, "8xA100-SXM-NVLink")
    by_list = cost.predict(model, x, 32, dpkit.devices(2), "8xA100-SXM-NVLink")
    assert by_list.device_count == 2
    assert by_list.step_time == by_count.step_time
    with pytest.raises(TypeError, match="devices must be a count"):
        cost.predict(model, x, 32, "2", "8xA100-SXM-NVLink")


def test_bucket_cap_mb_is_in_mebibytes_as_ddp_reads_it():
    # Two gradients of exactly 1 MiB (512 x 512 float32). DDP closes a bucket once it holds
    # at least its cap, so bucket_cap_mb=1 (1,048,576 bytes) gives one bucket per gradient;
    # a cap one KiB larger would put both in one bucket of 2 MiB.
    model = nn.Sequential(nn.Linear(512, 512, bias=False), nn.Linear(512, 512, bias=False))
    for cap, buckets in ((1, [1 << 20, 1 << 20]), (1 + 1 / 1024, [2 << 20])):
        trace = cost.predict(model, torch.randn(1, 512), 8, 2, "8xA100-SXM-NVLink",
                             strategy="ddp", bucket_cap_mb=cap)  # fmt: skip
        first = trace.events[0].device
        sent = [e.details["bucket_bytes"] for e in trace.events
                if e.phase == "allreduce" and e.device == first]  # fmt: skip
        assert sent == buckets, cap
