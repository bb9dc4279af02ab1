"""Behaviour the mutation run (``make mutation``, benchmarks/mutation.py) found untested.

Each test here kills mutants that survived the rest of the fast suite: a planted bug that
would reach users unnoticed. The test names say the behaviour; a docstring says why it
matters where the name cannot. Error messages are checked for the words that matter, in
order (``says``): their whole text is pinned once, by docs/bad_input.md's table. Behaviour on
machines with GPUs is checked on simulated ones (device handles are plain values; no tensor
is made there).
The last section checks the run's own list of survivors kept on purpose.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import importlib.util
import json
import sys
import warnings
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from lanes import lanes, recorded_transfers
from torch import nn

import dpkit
import dpkit.device as devices_module
from dpkit import comm, tracing
from dpkit import lanes as lanes_module
from dpkit.context import backward_of
from dpkit.environment import describe_choice
from dpkit.lanes import place, resides_on
from dpkit.nested import module_tensors
from dpkit.testing.placement_check import checking_placement
from dpkit.tracing import export
from dpkit.tracing.events import Event, MemoryRecord

Pair = namedtuple("Pair", ["first", "second"])


class Identity(nn.Module):
    def forward(self, x):
        return x


class Copy(nn.Module):
    def forward(self, x):
        return x.clone()  # a new tensor: parallel_apply tags only what a replica made


def lane_outputs(pieces, devices=None):
    """A copy of each piece on its own lane, as a replica's output is."""
    devices = devices or lanes(len(pieces))
    return dpkit.parallel_apply([Copy() for _ in pieces], pieces, devices=devices)


# --------------------------------------------------------------------------------------
# gather


def says(error: pytest.ExceptionInfo, *words: str) -> None:
    """The words of a message that matter (what is wrong, where, the fix), in this order.
    A message's exact text is pinned once, by docs/bad_input.md's table (test_bad_input_table)."""
    text, position = str(error.value), 0
    for word in words:
        found = text.find(word, position)
        assert found >= 0, f"{word!r} is not in {text!r} (after position {position})"
        position = found + len(word)


def key_words(message: str) -> list[str]:
    """What is wrong, and the fix's first words: the message's clauses' beginnings."""
    return [clause.split(", ")[0] for clause in message.split("; ")]


@dataclasses.dataclass
class Prediction:
    logits: torch.Tensor


@pytest.mark.parametrize(
    "outputs, words",
    [
        (
            [Prediction(torch.ones(1)), Prediction(torch.ones(1))],
            ("of type Prediction", "a dataclass", "return its fields as a dict or a namedtuple"),
        ),
        (
            ["cat", "dog"],
            ("of type str", "return tensors", "torch.tensor(x)", "tuple or namedtuple of tensors"),
        ),
    ],
    ids=["dataclass", "str"],
)
def test_gather_says_what_a_replica_should_return(outputs, words):
    with pytest.raises(TypeError) as error:
        dpkit.gather(outputs, lanes(2)[0])
    # What is wrong, then the fix (the message's second half); the whole text of both is
    # docs/bad_input.md's rows "replicas return a dataclass" and "replicas return strings".
    says(error, "gather cannot combine replica outputs", *words)


def test_gather_of_no_outputs_asks_for_one_per_replica():
    with pytest.raises(ValueError) as error:
        dpkit.gather([], lanes(2)[0])
    says(error, "outputs is empty", "one output per replica")


def test_gather_of_vectors_along_dim_one_is_refused_not_gathered_along_dim_zero():
    """A 1-D output has no dim 1: gather must say so, not wrap dim 1 around to dim 0."""
    outputs = lane_outputs([torch.ones(2), torch.ones(3)])
    with pytest.raises(ValueError) as error:
        dpkit.gather(outputs, lanes(2)[0], dim=1)
    says(error, "dim=1 is out of range for replica outputs of shape (2,)", "between -1 and 0")


def test_gather_names_target_device_when_it_is_not_a_device():
    outputs = lane_outputs([torch.ones(2), torch.ones(2)])
    with pytest.raises(ValueError, match=r"^target_device='nowhere' is not a device name"):
        dpkit.gather(outputs, "nowhere")


def test_gather_to_an_int_means_that_lane_of_the_outputs_kind_even_with_a_gpu(monkeypatch):
    """On a GPU machine a course run on CPU lanes (``virtual_devices(n, on="cpu")``) gathers
    to ``0``, its lane 0: the int follows the outputs' kind, and is not the GPU ``cuda:0``."""
    devices = lanes(2)
    outputs = lane_outputs([torch.ones(2), torch.ones(2)], devices)
    monkeypatch.setattr(devices_module, "accelerator_type", lambda: "cuda")
    monkeypatch.setattr(devices_module, "accelerator_count", lambda: 1)
    gathered = dpkit.gather(outputs, 0)
    assert dpkit.device_of(gathered) == devices[0]
    assert torch.equal(gathered, torch.ones(4))


@pytest.mark.parametrize(
    "make",
    [list, tuple, lambda items: Pair(*items) if len(items) == 2 else tuple(items)],
    ids=["list", "tuple", "namedtuple"],
)
def test_gather_refuses_replica_outputs_of_different_lengths_instead_of_dropping_some(make):
    """Replicas whose lists (say, of detections) differ in length: zip would silently drop
    the extra entries; gather raises instead."""
    short = [torch.ones(1), torch.ones(1)]
    long = [torch.ones(1), torch.ones(1), torch.ones(1)]
    with pytest.raises(ValueError, match=r"replica 0: a \w+ of 2; replica 1: a \w+ of 3"):
        dpkit.gather([make(short), make(long)], lanes(2)[0])


# --------------------------------------------------------------------------------------
# comm


def _traced_step(devices):
    """One forward and backward of DataParallel over ``devices``: its trace and its copies."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    x = torch.randn(6, 3, requires_grad=True)
    with recorded_transfers() as log, dpkit.trace() as tr:
        dpkit.DataParallel(model, device_ids=devices)(x).sum().backward()
    return tr, log


def test_each_copy_of_a_step_is_traced_with_its_rows_shapes_counts_and_destination():
    """What ``tr.rows()`` shows per event (rows, shape, tensors, replica, destination), for a 6 x 3
    batch through a 3 -> 2 linear layer on 3 lanes; the bytes are those copied off lane 0."""
    tr, _ = _traced_step(lanes(3))
    lane = [d.name for d in lanes(3)]
    seen = sorted((e.phase, e.device, e.nbytes, sorted(e.details.items())) for e in tr.events)
    scatter = [("rows", 2), ("shape", (2, 3))]
    grad_scatter = [("rows", 2), ("shape", (2, 2))]
    gather = [("destination", lane[0]), ("rows", 2)]
    grad_gather = [("destination", "cpu"), ("rows", 2)]  # the input's gradient, on the host
    reduce = [("destination", lane[0]), ("tensors", 2)]
    expected = sorted(
        [("scatter", lane[0], 0, scatter)]
        + [("scatter", d, 24, scatter) for d in lane[1:]]
        + [("replicate", lane[0], 0, [("tensors", 2)])]
        + [("replicate", d, 32, [("tensors", 2)]) for d in lane[1:]]
        + [("replicate", lane[0], 0, [("modules", 1), ("what", "modules")])]
        + [("apply", d, 0, [("replica", i)]) for i, d in enumerate(lane)]
        + [("backward", d, 0, []) for d in lane]
        + [("gather", lane[0], 0, gather)]
        + [("gather", d, 16, gather) for d in lane[1:]]
        + [("grad_scatter", lane[0], 0, grad_scatter)]
        + [("grad_scatter", d, 16, grad_scatter) for d in lane[1:]]
        + [("grad_gather", lane[0], 0, grad_gather)]
        + [("grad_gather", d, 24, grad_gather) for d in lane[1:]]
        + [("reduce", lane[0], 0, reduce)]
        + [("reduce", d, 32, reduce) for d in lane[1:]]
        + [("reduce", lane[0], 0, [("tensors", 2), ("what", "sum")])]
    )
    assert seen == expected


def test_each_copy_of_a_step_reaches_the_listeners_with_its_ends_and_phase():
    """What a transfer listener learns: which collective, from where, to where, how many
    bytes, in which phase (a backward scatter is a grad_scatter, a broadcast a replicate)."""
    _, log = _traced_step(lanes(3))
    seen = sorted((t.op, t.source.name, t.destination.name, t.nbytes, t.phase) for t in log)
    lane = [d.name for d in lanes(3)]
    expected = sorted(
        [("scatter", "cpu", d, 24, "scatter") for d in lane[1:]]  # x is a plain CPU tensor
        + [("broadcast", "cpu", d, n, "replicate") for d in lane[1:] for n in (24, 8)]
        + [("gather", d, lane[0], 16, "gather") for d in lane[1:]]
        + [("scatter", lane[0], d, 16, "grad_scatter") for d in lane[1:]]
        + [("gather", d, "cpu", 24, "grad_gather") for d in lane[1:]]
        + [("reduce", d, lane[0], n, "reduce") for d in lane[1:] for n in (24, 8)]
    )
    assert seen == expected


@pytest.mark.parametrize(
    "label, phase", [("allreduce", "allreduce"), ("grad_scatter", "grad_scatter"), ("setup", None)]
)
def test_a_copy_labelled_by_its_caller_reports_the_phase_the_label_names(label, phase):
    """Exercises copy with their own labels: a phase's name is that phase, others none; the
    source defaults to where the tensor lives."""
    devices = lanes(2)
    tensor = torch.ones(2)
    with recorded_transfers() as log:
        moved = comm.copy_to(tensor, devices[1], label)
    assert dpkit.device_of(moved) == devices[1] and torch.equal(moved, tensor)
    (transfer,) = log
    assert (transfer.op, transfer.source, transfer.destination) == (
        label,
        dpkit.device_of(tensor),
        devices[1],
    )
    assert transfer.phase == phase and transfer.nbytes == 8


def test_broadcast_from_a_lane_other_than_the_first_says_where_the_tensor_is():
    devices = lanes(2)
    on_lane_1 = comm.copy_to(torch.ones(2), devices[1], "setup")
    with pytest.raises(ValueError) as error:
        comm.broadcast([on_lane_1], devices)
    says(
        error,
        "broadcast source must be on devices[0] (virtual:0 (cpu))",
        "virtual:1 (cpu)",
        "devices[0]",
    )


def test_comm_refuses_pieces_and_devices_that_do_not_pair_up():
    """A chunk, gradient or output without a device (or the reverse) is an error, never
    silently dropped."""
    devices = lanes(3)
    with pytest.raises(ValueError, match="zip"):
        comm.scatter(torch.ones(6), devices[:2], [2, 2, 2], 0)
    with pytest.raises(ValueError, match="zip"):
        comm.gather([torch.ones(2)] * 3, 0, devices[0], devices[:2])
    with pytest.raises(ValueError, match="zip"):
        comm.reduce_add([[torch.ones(2)]] * 3, devices[0], devices[:2])
    with pytest.raises(ValueError, match="zip"):  # one device sends fewer gradients
        comm.reduce_add([[torch.ones(2), torch.ones(2)], [torch.ones(2)]], devices[0], devices[:2])


def test_reduce_add_sums_from_the_destination_first_then_in_device_order_as_torch():
    """Float addition is not associative: onto lane 2 the sum is ((g2 + g0) + g1), as
    torch's reduce_add adds; another order rounds 1 away here."""
    devices = lanes(3)
    gradients = [torch.tensor([1e8]), torch.tensor([-1e8]), torch.tensor([1.0])]
    per_device = [[comm.copy_to(g, d, "setup")] for g, d in zip(gradients, devices)]
    (total,) = comm.reduce_add(per_device, devices[2], devices)
    g0, g1, g2 = gradients
    assert torch.equal(total, (g2 + g0) + g1)  # float32: 1 + 1e8 rounds to 1e8, so 0
    assert not torch.equal(total, (g0 + g1) + g2)  # lane 0 first: 1
    assert dpkit.device_of(total) == devices[2]


@pytest.mark.parametrize("count", [1, 3])
def test_reduce_add_onto_a_device_that_sent_nothing_sums_every_device(count):
    devices = lanes(count)
    per_device = [
        [comm.copy_to(torch.full((2,), i + 1.0), d, "setup")] for i, d in enumerate(devices)
    ]
    (total,) = comm.reduce_add(per_device, dpkit.as_device("cpu"), devices)
    assert torch.equal(total, torch.full((2,), sum(range(1, count + 1)) * 1.0))


# The meta device stands in for a GPU's memory: a device whose memory is not the CPU's.
OTHER_MEMORY = dpkit.Device(0, devices_module.REAL, torch.device("meta"))


def test_copy_to_a_device_with_other_memory_puts_the_copy_there():
    moved = comm.copy_to(torch.ones(2), OTHER_MEMORY, "setup")
    assert moved.device.type == "meta" and moved.shape == (2,)


def test_gather_onto_a_device_with_other_memory_allocates_the_result_there():
    devices = lanes(2)
    pieces = [comm.copy_to(torch.ones(2), d, "setup") for d in devices]
    result = comm.gather(pieces, 0, OTHER_MEMORY, devices)
    assert result.device.type == "meta" and result.shape == (4,)


class _FakeCudaTensor:
    """What record_use reads of a CUDA tensor: is_cuda, layout, record_stream."""

    def __init__(self, layout, log, name):
        self.is_cuda, self.layout, self.log, self.name = True, layout, log, name

    def record_stream(self, stream):
        self.log.append((self.name, stream))

    def _indices(self):
        return _FakeCudaTensor(torch.strided, self.log, f"{self.name}.indices")

    def _values(self):
        return _FakeCudaTensor(torch.strided, self.log, f"{self.name}.values")

    def __getattr__(self, part):  # a compressed layout's parts: crow_indices(), values(), ...
        return lambda: _FakeCudaTensor(torch.strided, self.log, f"{self.name}.{part}")


def test_record_use_records_dense_and_sparse_cuda_tensors_and_skips_the_rest():
    """On a GPU, a tensor another stream reads must be recorded on that stream, or the
    allocator may reuse its memory too early: a sparse tensor through the dense tensors it
    is made of (record_stream refuses sparse layouts); CPU tensors are left alone."""
    log = []
    tensors = [
        _FakeCudaTensor(torch.strided, log, "dense"),
        _FakeCudaTensor(torch.sparse_coo, log, "coo"),
        _FakeCudaTensor(torch.sparse_csr, log, "csr"),
        _FakeCudaTensor(torch.sparse_bsc, log, "bsc"),
        torch.ones(2),
    ]
    lanes_module.record_use(tensors, "lane stream")
    assert log == [
        (name, "lane stream")
        for name in [
            "dense",
            "coo.indices",
            "coo.values",
            "csr.crow_indices",
            "csr.col_indices",
            "csr.values",
            "bsc.ccol_indices",
            "bsc.row_indices",
            "bsc.values",
        ]
    ]


def test_in_backward_gradients_on_gpu_lanes_are_recorded_on_the_stream_that_reads_them(
    monkeypatch,
):
    """Lanes on one GPU compute on their own streams, copies run on the caller's. In a
    backward, each gradient chunk scatter hands a lane is recorded on that lane's stream;
    what the lanes made and reduce_add or gather read is recorded on the caller's stream of
    their GPU; broadcast's copies (double backward) on each lane's stream. Pretend GPU lanes
    on CPU memory, with the streams replaced by names."""
    gpu_lanes = [dpkit.Device(i, devices_module.VIRTUAL_GPU, torch.device("cpu")) for i in range(3)]
    recorded, asked = [], []
    monkeypatch.setattr(
        lanes_module, "record_use", lambda ts, stream: recorded.append((list(ts), stream))
    )
    monkeypatch.setattr(lanes_module, "stream_of", lambda device: f"lane {device.index}")

    def current_stream(device):
        asked.append(device)
        return "caller"

    monkeypatch.setattr(torch.cpu, "current_stream", current_stream)

    def ids(entries):
        return [([id(t) for t in tensors], stream) for tensors, stream in entries]

    grad = torch.arange(6.0)
    with backward_of(1):
        chunks = comm.scatter(grad, gpu_lanes, [2, 2, 2], 0, source=gpu_lanes[0])
    assert ids(recorded) == [([id(c)], f"lane {i}") for i, c in enumerate(chunks)]

    recorded.clear()
    per_device = [[chunk] for chunk in chunks]
    with backward_of(1):
        comm.reduce_add(per_device, gpu_lanes[0], gpu_lanes)
    assert ids(recorded) == [([id(c)], "caller") for c in chunks]
    assert asked == [torch.device("cpu")] * len(chunks)  # the lanes' GPU, asked per lane

    recorded.clear()
    with backward_of(1):
        comm.gather(list(chunks), 0, gpu_lanes[0], gpu_lanes)
    assert ids(recorded) == [([id(c)], "caller") for c in chunks]

    recorded.clear()
    with backward_of(1):
        copies = comm.broadcast([grad], gpu_lanes)
    assert ids(recorded) == [([id(c[0])], f"lane {i}") for i, c in enumerate(copies)]

    recorded.clear()  # a batch of one row: a single lane's gradient, summed or gathered
    (lane,) = comm.scatter(grad[:1], gpu_lanes[:1], [1], 0, source=gpu_lanes[0])
    with backward_of(1):
        comm.reduce_add([[lane]], gpu_lanes[0], gpu_lanes[:1])
        comm.gather([lane], 0, gpu_lanes[0], gpu_lanes[:1])
    assert ids(recorded) == [([id(lane)], "caller")] * 2

    recorded.clear()  # in forward, parallel_apply records what each lane reads instead
    comm.scatter(grad, gpu_lanes, [2, 2, 2], 0, source=gpu_lanes[0])
    comm.broadcast([grad], gpu_lanes)
    assert recorded == []


# --------------------------------------------------------------------------------------
# scatter


class Settings:
    """Not a tuple, yet it has ``_fields`` (as ``ast`` nodes and some config classes do)."""

    _fields = ("lr",)
    lr = 0.1


def test_an_object_with_fields_that_is_no_namedtuple_is_shared_not_split():
    settings = Settings()
    assert dpkit.scatter(settings, lanes(3)) == [settings] * 3


@pytest.mark.parametrize("empty", [(), [], {}], ids=["tuple", "list", "dict"])
def test_scatter_shares_an_empty_container_with_every_device_as_torch(empty):
    """torch gives every device a reference to an empty container (nothing to split)."""
    expected = torch.nn.parallel.scatter(empty, [0, 1, 2])  # no tensor: no GPU needed
    assert dpkit.scatter(empty, lanes(3)) == expected == [empty] * 3


def test_scatter_says_which_chunk_sizes_exist():
    with pytest.raises(ValueError) as error:
        dpkit.scatter(torch.randn(10, 2), lanes(4), chunk_sizes="even")
    says(error, "chunk_sizes='even' is not known", "'balanced'")


def test_keyword_inputs_are_split_by_the_same_chunk_sizes_as_positional_ones():
    """A model taking a keyword mask: with ``chunk_sizes="balanced"`` (3, 3, 2, 2 for 10
    rows) both must be split alike, or each replica gets rows of another's mask."""
    x, mask = torch.randn(10, 2), torch.randn(10, 2)
    args, kwargs = dpkit.scatter_kwargs((x,), {"mask": mask}, lanes(4), chunk_sizes="balanced")
    assert [a[0].shape[0] for a in args] == [k["mask"].shape[0] for k in kwargs] == [3, 3, 2, 2]

    rows_seen = []

    class Masked(nn.Module):
        def forward(self, x, mask):
            rows_seen.append((dpkit.current_device().index, x.shape[0], mask.shape[0]))
            return x * mask

    parallel = dpkit.DataParallel(Masked(), device_ids=lanes(4), chunk_sizes="balanced")
    assert torch.equal(parallel(x, mask=mask), x * mask)
    assert sorted(rows_seen) == [(0, 3, 3), (1, 3, 3), (2, 2, 2), (3, 2, 2)]  # not 3, 3, 3, 1


def test_scatter_kwargs_pads_keyword_chunks_only_when_fewer_than_positional_arguments():
    """torch's rule, literally: one positional argument on 4 devices (a shared string) and a
    keyword argument in 1 chunk (1 is not fewer than 1 argument) stay 4 and 1. (Tensors of
    different batch sizes, 10 rows and 1, are refused: tests/test_hardening_results.py.)"""
    args, kwargs = dpkit.scatter_kwargs(("label",), {"y": torch.randn(1)}, lanes(4))
    assert len(args) == 4 and len(kwargs) == 1


# --------------------------------------------------------------------------------------
# replicate


def test_replicating_a_function_says_to_wrap_it():
    with pytest.raises(TypeError) as error:
        dpkit.replicate(torch.relu, lanes(2))
    says(error, "module must be a torch.nn.Module, got builtin_function_or_method", "nn.Module")


def test_a_python_module_under_a_script_module_is_refused_with_torchs_message(monkeypatch):
    """torch decides (its own check, forced here): dpkit raises what torch raises."""
    torch_replicate = sys.modules["torch.nn.parallel.replicate"]
    monkeypatch.setattr(torch_replicate, "_replicatable_module", lambda module: False)
    with pytest.raises(RuntimeError) as theirs:
        torch_replicate.replicate(nn.Linear(2, 2), [0])
    with pytest.raises(RuntimeError) as ours:
        dpkit.replicate(nn.Linear(2, 2), lanes(2))
    assert str(ours.value) == str(theirs.value)
    assert str(ours.value) == (  # exact: torch's own text, so that torch's check is what fired
        "Cannot replicate network where python modules are children of ScriptModule"
    )


class OptionalParts(nn.Module):
    """A child, a parameter and a buffer that are registered but absent (None), as in
    BatchNorm without running statistics or a block without its optional shortcut."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)
        self.register_module("shortcut", None)
        self.register_parameter("extra_bias", None)
        self.register_buffer("scale", None)

    def forward(self, x):
        out = self.linear(x)
        if self.shortcut is not None:
            out = out + self.shortcut(x)
        if self.extra_bias is not None:
            out = out + self.extra_bias
        if self.scale is not None:
            out = out * self.scale
        return out


def test_replicas_keep_absent_children_parameters_and_buffers_absent():
    module = OptionalParts()
    for replica in dpkit.replicate(module, lanes(2)):
        assert replica.shortcut is None and replica.extra_bias is None and replica.scale is None
    x = torch.randn(4, 2)
    assert torch.allclose(dpkit.DataParallel(module, device_ids=lanes(2))(x), module(x))


def test_batchnorm_without_running_stats_normalises_each_chunk_on_its_lane():
    """Its running statistics are registered as None buffers: each replica normalises its
    own chunk with the chunk's statistics, as the module does chunk by chunk."""
    torch.manual_seed(0)
    norm, x = nn.BatchNorm1d(3, track_running_stats=False), torch.randn(8, 3)
    expected = torch.cat([norm(chunk) for chunk in x.chunk(2)])
    assert torch.allclose(dpkit.DataParallel(norm, device_ids=lanes(2))(x), expected, atol=1e-6)


def test_a_replica_lists_its_own_parameter_copies_where_ddp_and_lane_streams_read_them():
    """Replica parameters are plain attributes; ``_former_parameters`` names them (torch's
    DistributedDataParallel reads it, and dpkit records them on a GPU lane's stream)."""
    module = nn.Linear(2, 2)
    replicas = dpkit.replicate(module, lanes(2))
    for replica, lane in zip(replicas, lanes(2)):
        former = replica._former_parameters
        assert list(former) == ["weight", "bias"]
        assert former["weight"] is replica.weight and former["bias"] is replica.bias
        held = list(module_tensors(replica))
        assert [id(t) for t in held] == [id(replica.weight), id(replica.bias)]
        assert all(resides_on(t, lane) for t in held)  # replica 0: the module's own


# --------------------------------------------------------------------------------------
# parallel_apply


def test_parallel_apply_without_a_device_or_a_tensor_names_the_replica():
    with pytest.raises(ValueError) as error:
        dpkit.parallel_apply([Identity(), Identity()], [torch.ones(1), "text"])
    says(error, "in replica 1", "no device was given", "devices=[...]")


def test_parallel_apply_names_its_devices_argument_when_a_device_repeats():
    device = lanes(1)[0]
    with pytest.raises(ValueError) as error:
        dpkit.parallel_apply([Identity(), Identity()], [torch.ones(1)] * 2, devices=[device] * 2)
    says(error, "devices lists virtual:0 (cpu) more than once", "dpkit.devices(4)")


def test_parallel_apply_warns_about_nothing():
    """It reads the caller's autocast settings with torch's current calls, not the
    per-device-type ones torch deprecates (which warn at every step)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dpkit.parallel_apply([Identity(), Identity()], [torch.ones(1)] * 2, devices=lanes(2))


def test_without_a_trace_dpkit_adds_no_range_to_torchs_profiler():
    """Profiler ranges (``dpkit.apply``, ``dpkit.scatter``, ...) come with ``dpkit.trace()``;
    a profile of plain DataParallel shows torch's work and ``DataParallel.forward`` only."""
    parallel = dpkit.DataParallel(nn.Linear(2, 2), device_ids=lanes(2))
    with torch.profiler.profile() as prof:
        parallel(torch.randn(4, 2))
    names = {e.name for e in prof.events()}
    assert "DataParallel.forward" in names
    assert not any(name.startswith("dpkit.") for name in names)


# --------------------------------------------------------------------------------------
# data_parallel


def test_dataparallel_of_a_function_says_to_wrap_it():
    with pytest.raises(TypeError) as error:
        dpkit.DataParallel(torch.relu, device_ids=lanes(2))
    says(error, "module must be a torch.nn.Module, got builtin_function_or_method", "nn.Module")


def test_a_module_listed_without_lane_0_is_told_to_list_lane_0_first():
    with pytest.raises(RuntimeError) as error:
        dpkit.DataParallel(nn.Linear(2, 2), device_ids=lanes(3)[1:])(torch.randn(4, 2))
    says(
        error,
        "virtual:1 (cpu) (device_ids[0])",
        "device: cpu",
        "device_ids=dpkit.virtual_devices(n)",
    )


def test_under_the_placement_check_a_module_on_the_host_is_told_to_move_to_the_lanes():
    """As with lanes on one GPU: a module left on the host is first told to move to the
    lanes' device, whichever lane device_ids starts with."""
    with checking_placement():
        devices = dpkit.virtual_devices(3, on="cpu")
        with pytest.raises(
            RuntimeError, match=r"; move it there first with module\.to\('cpu:0'\)$"
        ):
            dpkit.DataParallel(nn.Linear(2, 2), device_ids=devices[1:])(torch.randn(4, 2))


class BufferedLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(2, 2)
        self.second = nn.Linear(2, 2)
        self.register_buffer("offset", torch.zeros(2))

    def forward(self, x):
        return self.second(self.first(x)) + self.offset


@pytest.mark.parametrize("misplaced", ["second.weight", "offset"])
def test_every_parameter_and_buffer_must_be_on_device_ids_0_not_only_the_first(misplaced):
    devices = lanes(2)
    module = BufferedLinear()
    owner, _, name = misplaced.rpartition(".")
    holder = module.get_submodule(owner)
    moved = comm.copy_to(getattr(holder, name).detach(), devices[1], "setup")
    if name in holder._parameters:
        holder._parameters[name] = place(nn.Parameter(moved), devices[1])  # a lane-1 copy
    else:
        holder._buffers[name] = moved
    with pytest.raises(RuntimeError, match=r"found one of them on device: virtual:1 \(cpu\)"):
        dpkit.DataParallel(module, device_ids=devices)(torch.randn(4, 2))


def test_without_device_ids_dataparallel_takes_dpkit_devices():
    parallel = dpkit.DataParallel(nn.Linear(2, 2))
    assert parallel.device_ids == dpkit.devices()  # four CPU lanes without an accelerator
    assert parallel(torch.randn(8, 2)).shape == (8, 2)


def test_dataparallel_prints_its_devices_output_device_and_dim():
    parallel = dpkit.DataParallel(nn.Linear(2, 2), device_ids=lanes(2), dim=0)
    assert parallel.extra_repr() == (
        "device_ids=[virtual:0 (cpu), virtual:1 (cpu)], output_device=virtual:0 (cpu), dim=0"
    )


def test_output_device_as_an_int_is_that_lane_even_on_a_gpu_machine(monkeypatch):
    devices = lanes(2)
    monkeypatch.setattr(devices_module, "accelerator_type", lambda: "cuda")
    monkeypatch.setattr(devices_module, "accelerator_count", lambda: 1)
    parallel = dpkit.DataParallel(nn.Linear(2, 2), device_ids=devices, output_device=1)
    assert parallel.output_device == devices[1]
    assert dpkit.device_of(parallel(torch.randn(4, 2))) == devices[1]


def test_one_lane_with_output_device_0_runs():
    parallel = dpkit.DataParallel(nn.Linear(2, 2), device_ids=lanes(1), output_device=0)
    assert parallel.output_device == lanes(1)[0]
    assert parallel(torch.randn(4, 2)).shape == (4, 2)


def test_output_device_that_is_no_device_is_named():
    with pytest.raises(ValueError, match=r"^output_device='nowhere' is not a device name"):
        dpkit.DataParallel(nn.Linear(2, 2), device_ids=lanes(2), output_device="nowhere")


def test_dataparallel_on_one_lane_moves_the_module_there_as_torch_does_on_one_gpu():
    """Under the placement check a lane is a device apart, as a GPU is: DataParallel on a
    single device moves the module onto it (torch's does ``module.to(device_ids[0])``)."""
    with checking_placement():
        (lane,) = dpkit.virtual_devices(1, on="cpu")
        module = nn.Linear(2, 2)
        parallel = dpkit.DataParallel(module, device_ids=[lane])
        assert dpkit.device_of(module.weight) == lane
        x = torch.randn(4, 2).to(lane.torch_device)
        assert parallel(x).shape == (4, 2)


class RowCount(nn.Module):
    """Returns how many rows its replica got (a parameter keeps it replicable)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1))

    def forward(self, x=None, *, rows=None):
        x = rows if x is None else x
        return torch.tensor([x.shape[0]], device=x.device) * self.weight


def test_data_parallel_splits_by_chunk_sizes_and_gathers_to_output_device():
    devices = lanes(4)
    counts = dpkit.data_parallel(
        RowCount(), torch.randn(10, 2), devices, output_device="cpu", chunk_sizes="balanced"
    )
    assert counts.tolist() == [3.0, 3.0, 2.0, 2.0]
    assert dpkit.device_of(counts).kind == "host"


def test_data_parallel_with_keyword_inputs_only_runs_each_replica_on_its_lane():
    counts = dpkit.data_parallel(
        RowCount(), (), lanes(4), module_kwargs={"rows": torch.randn(8, 2)}
    )
    assert counts.tolist() == [2.0, 2.0, 2.0, 2.0]


def test_data_parallel_without_inputs_calls_the_module_once_without_arguments():
    class Constant(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.value = nn.Parameter(torch.ones(3))

        def forward(self, *args):
            assert args == ()
            return self.value * 2

    assert torch.equal(dpkit.data_parallel(Constant(), None, lanes(2)), torch.full((3,), 2.0))


# --------------------------------------------------------------------------------------
# tracing: recorder


def test_every_event_names_its_phase_with_a_plain_string_and_the_summary_lists_each_once():
    """A phase is a plain ``str`` in every event (a ``Phase`` member hashes by its member
    name, so mixing the two splits a phase in two wherever events are grouped by phase)."""
    tr, _ = _traced_step(lanes(3))
    assert all(type(e.phase) is str for e in tr.events)
    phases = [str(row["phase"]) for row in tr.summary()]
    assert len(phases) == len(set(phases))
    assert set(phases) == {str(e.phase) for e in tr.events}


@pytest.mark.parametrize("open_span", [tracing.span, tracing.host_span], ids=["span", "host_span"])
def test_a_span_named_by_a_string_records_that_phase(open_span):
    """dpkit.ddp and the exercises name their phases with strings ("allreduce", ...)."""
    device = lanes(1)[0]
    with dpkit.trace() as tr:
        with open_span("allreduce", device, bucket=0):
            pass
        with open_span(tracing.Phase.BACKWARD, device):
            pass
    assert [(e.phase, type(e.phase), e.details) for e in tr.events] == [
        ("allreduce", str, {"bucket": 0}),
        ("backward", str, {}),
    ]


def test_a_memory_record_for_a_given_step_is_filed_under_that_step():
    device = lanes(1)[0]
    with dpkit.trace() as tr:
        tracing.begin_step()
        tracing.record_memory(device, "gradients", 64, step=7)
        tracing.record_memory(device, "gradients", 32)
    assert [(r.category, r.nbytes, r.step) for r in tr.memory] == [
        ("gradients", 64, 7),
        ("gradients", 32, 1),
    ]


def test_memory_rows_are_one_row_per_record():
    tr, _ = _traced_step(lanes(2))
    rows = tr.memory_rows()
    records = tr.memory
    assert len(rows) == len(records) > 0
    assert list(rows.columns) == ["device", "category", "nbytes", "step", "kind"]
    first = rows.iloc[0]
    assert (first["device"], first["category"], first["nbytes"], first["step"], first["kind"]) == (
        records[0].device,
        records[0].category,
        records[0].nbytes,
        records[0].step,
        records[0].kind,
    )


def test_a_single_replica_shows_one_apply_range_in_torchs_profiler():
    """One replica runs in the caller's thread, where the profiler sees every range: the
    apply phase is still one ``dpkit.apply`` range, not one more per span."""
    with torch.profiler.profile() as prof, dpkit.trace():
        dpkit.parallel_apply([Identity()], [torch.ones(2)], devices=lanes(1))
    names = [e.name for e in prof.events() if e.name.startswith("dpkit.")]
    assert names == ["dpkit.apply"]


# --------------------------------------------------------------------------------------
# _functions


def test_double_backward_through_dataparallel_matches_the_plain_model_and_is_traced():
    """A gradient penalty differentiates the parameters' gradients: the reduce of replicate's
    backward is differentiated in turn (a broadcast of the gradients' gradients, traced as
    ``grad_broadcast`` in the step it belongs to)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    plain = copy.deepcopy(model)
    x = torch.randn(8, 3)

    def penalty(module, output):
        grads = torch.autograd.grad(output.sum(), list(module.parameters()), create_graph=True)
        return sum((g**2).sum() for g in grads)

    with dpkit.trace() as tr:
        penalty(model, dpkit.DataParallel(model, device_ids=lanes(2))(x)).backward()
    penalty(plain, plain(x)).backward()
    for ours, theirs in zip(model.parameters(), plain.parameters()):
        expected = torch.zeros_like(theirs) if theirs.grad is None else theirs.grad
        assert torch.allclose(ours.grad, expected, atol=1e-6)
    grad_broadcasts = [e for e in tr.events if e.phase == "grad_broadcast"]
    assert {e.device for e in grad_broadcasts} == {d.name for d in lanes(2)}
    assert {e.step for e in tr.events} == {1}


# --------------------------------------------------------------------------------------
# devices: what dpkit picks on machines with accelerators, simulated (no tensor is made on
# them: device handles are plain values)


@pytest.fixture
def gpus(monkeypatch):
    """``gpus(n)``: make dpkit see ``n`` CUDA devices (0: none)."""

    def simulate(count: int) -> None:
        monkeypatch.setattr(devices_module, "accelerator_type", lambda: "cuda" if count else None)
        monkeypatch.setattr(devices_module, "accelerator_count", lambda: count)

    return simulate


def real(index: int) -> dpkit.Device:
    return dpkit.Device(index, devices_module.REAL, torch.device("cuda", index))


def gpu_lane(index: int) -> dpkit.Device:
    return dpkit.Device(index, devices_module.VIRTUAL_GPU, torch.device("cuda", 0))


@pytest.mark.parametrize(
    "count, n, line",
    [
        (0, 1, "devices(1) -> 1 virtual lane on the CPU, a thread each (this machine has 0 real "
         "accelerators)"),
        (0, 4, "devices(4) -> 4 virtual lanes on the CPU, a thread each (this machine has 0 real "
         "accelerators)"),
        (1, 1, "devices(1) -> 1 real accelerator: cuda:0"),
        (1, 4, "devices(4) -> 4 virtual lanes on the GPU, a CUDA stream each (this machine has 1 "
         "real accelerator)"),
        (2, 2, "devices(2) -> 2 real accelerators: cuda:0, cuda:1"),
        (2, 3, "devices(3) -> 3 virtual lanes on the GPU, a CUDA stream each (this machine has 2 "
         "real accelerators)"),
    ],
)  # fmt: skip
def test_dpkit_devices_says_what_each_machine_gets(gpus, count, n, line):
    """The lines ``dpkit devices`` prints, on a laptop, a one-GPU and a two-GPU machine."""
    gpus(count)
    assert describe_choice(n) == line


def test_devices_picks_real_accelerators_when_there_are_enough_else_lanes(gpus):
    gpus(0)
    assert dpkit.devices() == dpkit.virtual_devices(4, on="cpu")  # four CPU lanes
    gpus(1)
    assert dpkit.devices() == [real(0)]
    assert dpkit.devices(1) == [real(0)]
    assert dpkit.devices(2) == [gpu_lane(0), gpu_lane(1)]
    gpus(2)
    assert dpkit.devices() == dpkit.devices(2) == [real(0), real(1)]
    assert dpkit.devices(3) == [gpu_lane(i) for i in range(3)]


def test_real_devices_are_the_first_n_and_asking_for_more_says_what_to_use(gpus):
    gpus(2)
    assert devices_module.real_devices() == [real(0), real(1)]
    assert devices_module.real_devices(1) == [real(0)]
    assert devices_module.real_devices(2) == [real(0), real(1)]
    with pytest.raises(ValueError) as error:
        devices_module.real_devices(3)
    says(
        error,
        "n=3 real accelerators were asked for but this machine has 2",
        "dpkit.virtual_devices(3)",
        "dpkit.devices(3)",
    )
    with pytest.raises(ValueError, match="n must be at least 1, got 0"):
        devices_module.real_devices(0)


def test_device_specs_resolve_to_real_devices_that_exist_else_lanes(gpus):
    gpus(2)
    assert dpkit.as_device(0) == real(0) and dpkit.as_device(1) == real(1)
    assert dpkit.as_device(2) == gpu_lane(2)  # no third GPU: a lane of the GPU
    assert dpkit.as_device("cuda") == dpkit.as_device(torch.device("cuda")) == real(0)
    assert dpkit.as_device("cuda:1") == real(1)
    assert dpkit.as_device("cpu").kind == "host"
    for missing in ("cuda:2", "xpu:0"):
        with pytest.raises(ValueError) as error:
            dpkit.as_device(missing, argument="output_device")
        says(
            error,
            f"output_device={missing!r} does not exist on this machine (2 accelerators)",
            "dpkit.virtual_devices(n)",
        )


def test_a_list_of_ints_names_lanes_when_some_index_has_no_gpu(gpus):
    """``device_ids=[0, 1, 2]`` on a two-GPU machine: three lanes of the GPU (one kind),
    not two GPUs and a lane."""
    gpus(2)
    assert dpkit.as_devices([0, 1]) == [real(0), real(1)]
    assert dpkit.as_devices([0, 1, 2]) == [gpu_lane(i) for i in range(3)]


@pytest.mark.parametrize(
    "call, error_type, message",
    [
        (lambda: dpkit.as_device(True), TypeError, "device must be a device, got True"),
        (
            lambda: dpkit.as_device(2.5),
            TypeError,
            "device must be a dpkit.Device, an int, a string like 'cuda:0' or a torch.device, "
            "got float",
        ),
        (
            lambda: dpkit.as_devices(3, argument="device_ids"),
            TypeError,
            "device_ids must be a list of devices, got a single int; wrap it in a list: [3]",
        ),
        (
            lambda: dpkit.as_devices([lanes(1)[0], "cpu"], argument="device_ids"),
            ValueError,
            "device_ids mixes kinds of device (host, virtual-cpu); use one kind, e.g. "
            "dpkit.devices(n) or dpkit.virtual_devices(n)",
        ),
        (
            lambda: dpkit.as_devices(["cpu"], argument="device_ids"),
            ValueError,
            "device_ids contains the host CPU, which cannot run a replica; for CPU lanes use "
            "dpkit.virtual_devices(n, on='cpu')",
        ),
        (
            lambda: dpkit.as_devices(lanes(2) * 2),
            ValueError,
            "devices lists virtual:0 (cpu), virtual:1 (cpu) more than once; each replica needs "
            "its own device, e.g. dpkit.devices(4)",
        ),
        (
            lambda: dpkit.device_of(torch.ones(1, device="meta")),
            ValueError,
            "a tensor on the meta device holds no data to move between devices",
        ),
    ],
    ids=["bool", "float", "single", "mixed", "host", "duplicates", "meta"],
)
def test_device_mistakes_are_explained(call, error_type, message):
    with pytest.raises(error_type) as error:
        call()
    says(error, *key_words(message))


def test_a_device_name_that_torch_cannot_read_is_named_with_its_argument():
    with pytest.raises(ValueError, match=r"^device='nowhere' is not a device name: "):
        dpkit.as_device("nowhere")


def test_the_accelerator_is_what_torch_reports_except_mps(monkeypatch):
    """torch >= 2.6 names the accelerator (torch.accelerator); MPS is left out, as
    nn.DataParallel leaves it out; before 2.6, CUDA when torch.cuda has it."""
    accelerator = torch.accelerator
    for kind, expected in (("cuda", "cuda"), ("xpu", "xpu"), ("mps", None)):
        monkeypatch.setattr(accelerator, "is_available", lambda: True)
        monkeypatch.setattr(
            accelerator, "current_accelerator", lambda kind=kind: torch.device(kind)
        )
        assert devices_module.accelerator_type() == expected
    monkeypatch.setattr(accelerator, "is_available", lambda: False)
    assert devices_module.accelerator_type() is None
    monkeypatch.delattr(torch, "accelerator")  # torch 2.4 and 2.5
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert devices_module.accelerator_type() == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices_module.accelerator_type() is None


def test_the_accelerator_count_is_its_device_modules(monkeypatch):
    monkeypatch.setattr(devices_module, "accelerator_type", lambda: "cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert devices_module.accelerator_count() == 3
    monkeypatch.setattr(devices_module, "accelerator_type", lambda: None)
    assert devices_module.accelerator_count() == 0


class _FakeStream:
    def __init__(self, stream_id, gpu):
        self.stream_id, self.gpu = stream_id, gpu


class _FakeCudaModule:
    """torch.cuda as stream_of uses it: a pool that hands out streams, and current streams."""

    def __init__(self, pool_size):
        self.pool_size, self.made = pool_size, []

    def Stream(self, gpu, priority=0):  # noqa: N802 - torch's name (a pool per priority)
        stream = _FakeStream(len(self.made) % self.pool_size, gpu)
        self.made.append(stream)
        return stream

    def current_stream(self, device):
        return ("current", device)


def test_each_gpu_lane_has_a_stream_of_its_own_for_good_and_a_real_device_the_callers(
    monkeypatch,
):
    fake = _FakeCudaModule(pool_size=64)
    monkeypatch.setattr(torch, "get_device_module", lambda kind: fake)
    monkeypatch.setattr(lanes_module, "_lane_streams", {})
    assert lanes_module.stream_of(lanes(1)[0]) is None  # CPU lanes have none
    first = [lanes_module.stream_of(gpu_lane(i)) for i in range(3)]
    assert len({s.stream_id for s in first}) == 3
    assert all(s.gpu == torch.device("cuda", 0) for s in first)
    assert [lanes_module.stream_of(gpu_lane(i)) for i in range(3)] == first  # the same ones again
    assert len(fake.made) == devices_module.MAX_GPU_LANES  # taken once, all at a time
    assert lanes_module.stream_of(real(1)) == ("current", torch.device("cuda", 1))


def test_lane_streams_that_the_pool_cannot_keep_apart_are_refused_after_three_tries():
    fake = _FakeCudaModule(pool_size=devices_module.MAX_GPU_LANES - 1)  # one stream short
    with pytest.raises(RuntimeError) as error:
        lanes_module._new_lane_streams(fake, torch.device("cuda", 0))
    assert len(fake.made) == 3 * devices_module.MAX_GPU_LANES
    assert all(s.gpu == torch.device("cuda", 0) for s in fake.made)
    says(
        error,
        "could not get 32 distinct CUDA streams of priority -1 on cuda:0",
        "create dpkit's lanes first",
    )


def test_lanes_default_to_the_gpu_when_there_is_one_and_stay_on_the_gpu_asked_for(gpus):
    gpus(1)
    assert dpkit.virtual_devices(2) == [gpu_lane(0), gpu_lane(1)]
    assert dpkit.virtual_devices(2, on="cuda") == [gpu_lane(0), gpu_lane(1)]
    on_second = dpkit.virtual_devices(2, on="cuda:1")
    assert [d.torch_device for d in on_second] == [torch.device("cuda", 1)] * 2
    assert dpkit.virtual_devices(2, on="cpu") == lanes(2)


def test_device_names_say_where_the_device_is():
    assert dpkit.as_device("cpu").name == "cpu"
    assert [d.name for d in lanes(2)] == ["virtual:0 (cpu)", "virtual:1 (cpu)"]
    assert gpu_lane(1).name == "virtual:1 (cuda:0)"
    assert real(1).name == "cuda:1"


def test_to_device_keeps_a_namedtuples_type_and_refuses_other_lanes():
    devices = lanes(2)
    moved = dpkit.to_device(Pair(torch.ones(1), torch.zeros(1)), devices[0])
    assert type(moved) is Pair and torch.equal(moved.first, torch.ones(1))
    with pytest.raises(ValueError) as error:
        dpkit.to_device(torch.ones(1), devices[1])
    says(error, "device=virtual:1 (cpu): only lane 0 holds data you create", "devices[0]")
    with pytest.raises(ValueError, match=r"^device='nowhere' is not a device name"):
        dpkit.to_device(torch.ones(1), "nowhere")


def test_to_device_under_the_placement_check_keeps_the_host_and_refuses_a_bad_name():
    # Only the checked lanes' pretend device means lane 0; the host is the host, and a name
    # torch cannot parse gets as_device's error, not lane 0.
    from dpkit.device import HOST_DEVICE
    from dpkit.testing.placement_check import checking_placement

    with checking_placement():
        home = dpkit.to_device(torch.ones(2), dpkit.virtual_devices(2)[0].torch_device)
        assert dpkit.device_of(home) == dpkit.virtual_devices(2)[0]
        kept = dpkit.to_device(torch.ones(2), HOST_DEVICE)
        assert dpkit.device_of(kept) == HOST_DEVICE
        with pytest.raises(ValueError, match=r"^device='gpu:x' is not a device name"):
            dpkit.to_device(torch.ones(1), "gpu:x")


# --------------------------------------------------------------------------------------
# tracing: exports, on events and records written out by hand


def _events():
    lane = ["virtual:0 (cpu)", "virtual:1 (cpu)"]
    return [
        Event("scatter", lane[0], 10.000, 10.001, 0, 1, "virtual-cpu", {"rows": 2}),
        Event("scatter", lane[1], 10.000, 10.002, 48, 1, "virtual-cpu", {"rows": 2}),
        Event("apply", lane[0], 10.002, 10.010, 0, 1, "virtual-cpu", {"replica": 0}),
        Event("apply", lane[1], 10.003, 10.012, 0, 1, "virtual-cpu", {"replica": 1}),
        Event("scatter", lane[0], 11.000, 11.000, 0, 2, "virtual-cpu", {}),  # a step of no time
    ]


def test_the_summary_table_prints_time_bytes_and_share_per_step():
    """Step 1 lasts 12 ms: scatter spans 2 ms of it, apply 10 ms; step 2 has no length.
    Time and bytes are means over the two steps (a step: 6 ms), and a share is of the steps'
    12 ms together, so it is the time column over the step's: 1 of 6 ms, 5 of 6."""
    summary = export.summary(_events())
    assert [(r["phase"], r["nbytes"]) for r in summary] == [("scatter", 24), ("apply", 0)]
    assert [r["time_s"] for r in summary] == pytest.approx([0.001, 0.005])
    assert summary.step_s == pytest.approx(0.006)
    assert [r["share"] for r in summary] == pytest.approx([1 / 6, 5 / 6])
    assert str(summary) == (
        "phase            time/step    bytes/step   share\n"
        "------------------------------------------------\n"
        "scatter           1.000 ms            24   16.7%\n"
        "apply             5.000 ms             0   83.3%\n"
        "------------------------------------------------\n"
        "step              6.000 ms                100.0%\n"
        "shares are of the step (first event to last) and need not add up to 100%:\n"
        "time in no phase is in no row; phases that run at the same time each count it"
    )


def _records():
    return [
        MemoryRecord("cuda:0", "parameters", 1000, 1, "real"),
        MemoryRecord("cuda:0", "parameters", 24, 1, "real"),  # adds up with the one above
        MemoryRecord("cuda:0", "input", 2048, 1, "real"),
        MemoryRecord("cuda:0", "peak (torch)", 1234567, 1, "real"),
        MemoryRecord("cuda:1", "input", 2048, 1, "real"),
        MemoryRecord("cuda:1", "scratch", 5, 1, "real"),  # a category of the caller's own
        MemoryRecord("cuda:0", "input", 1, 0, "real"),  # another step
    ]


def test_the_memory_table_adds_up_categories_per_device_and_keeps_torchs_totals_apart():
    memory = export.memory_summary(_records())
    assert list(memory) == [
        {"device": "cuda:0", "step": 1, "parameters": 1024, "input": 2048, "scratch": 0,
         "counted": 3072, "peak (torch)": 1234567},
        {"device": "cuda:1", "step": 1, "parameters": 0, "input": 2048, "scratch": 5,
         "counted": 2053, "peak (torch)": 0},
    ]  # fmt: skip
    assert str(memory) == (
        "step 1, bytes held\n"
        "device    parameters  input  scratch  counted  peak (torch)\n"
        "-----------------------------------------------------------\n"
        "cuda:0         1,024  2,048        0    3,072     1,234,567\n"
        "cuda:1             0  2,048        5    2,053             0"
    )
    assert str(export.memory_summary(_records()[:1])) == (
        "step 1, bytes held\n"
        "device    parameters  counted\n"
        "-----------------------------\n"
        "cuda:0         1,000    1,000"
    )
    assert str(export.memory_summary([])) == "no memory records"


def test_the_chrome_trace_is_one_process_with_a_track_per_device_in_microseconds(tmp_path):
    events = _events()[:2]
    events[1].details["dtype"] = torch.float32  # not JSON: written as its str
    path = export.write_chrome_trace(events, 9.999, tmp_path / "new" / "folder" / "trace.json")
    written = json.loads(path.read_text())
    assert written["displayTimeUnit"] == "ms"
    meta, slices = written["traceEvents"][:3], written["traceEvents"][3:]
    label = "virtual devices on the CPU"
    assert meta == [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": label}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "virtual:0 (cpu)"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "virtual:1 (cpu)"}},
    ]  # fmt: skip
    assert [(s["ts"], s["dur"]) for s in slices] == [
        (pytest.approx(1000.0), pytest.approx(1000.0)),
        (pytest.approx(1000.0), pytest.approx(2000.0)),
    ]
    for s in slices:
        del s["ts"], s["dur"]
    assert slices == [
        {"name": "scatter", "cat": "forward", "ph": "X", "pid": 1, "tid": 0,
         "args": {"step": 1, "nbytes": 0, "kind": "virtual-cpu", "rows": 2}},
        {"name": "scatter", "cat": "forward", "ph": "X", "pid": 1, "tid": 1,
         "args": {"step": 1, "nbytes": 48, "kind": "virtual-cpu", "rows": 2,
                  "dtype": "torch.float32"}},
    ]  # fmt: skip


def test_rows_name_every_field_of_an_event():
    (row,) = export.rows(_events()[1:2], 9.999)
    assert row == {
        "step": 1,
        "phase": "scatter",
        "device": "virtual:1 (cpu)",
        "kind": "virtual-cpu",
        "start_s": pytest.approx(0.001),
        "end_s": pytest.approx(0.003),
        "duration_s": pytest.approx(0.002),
        "nbytes": 48,
        "detail_rows": 2,
    }


def test_the_hardware_label_joins_the_kinds_and_keeps_unknown_ones():
    kinds = ("virtual-cpu", "tpu", "predicted", "host")  # the host is named only alone
    events = [Event("apply", "somewhere", 0.0, 0.0, kind=kind) for kind in kinds]
    assert export.hardware_label(events) == (
        "predicted devices (cost model) + tpu + virtual devices on the CPU"
    )
    assert export.hardware_label(events[-1:]) == "host CPU"


def test_a_step_spans_its_earliest_start_whatever_order_its_events_come_in():
    # Events come in the order they finished: a step's first event need not start first.
    totals = export.PhaseTotals()
    totals.add_rows([(1, "gather", 0.5, 1.0, 0), (1, "scatter", 0.0, 0.25, 8)])
    share = {row["phase"]: row["share"] for row in totals.summary()}
    assert share == pytest.approx({"gather": 0.5, "scatter": 0.25})  # of the step's 1.0 s


def test_a_step_whose_events_come_in_two_batches_is_counted_once():
    # A bounded trace drops stored events in batches; a step's late events may come later.
    totals = export.PhaseTotals()
    totals.add_rows([(1, "scatter", 0.0, 0.2, 8)])
    totals.add_rows([(1, "gather", 0.5, 1.0, 4), (2, "scatter", 1.0, 1.2, 8)])
    assert totals.steps == 2
    per_step = {row["phase"]: (row["time_s"], row["nbytes"]) for row in totals.summary()}
    assert per_step == {"scatter": pytest.approx((0.2, 8)), "gather": pytest.approx((0.25, 2))}
    # step 1 runs from 0.0 to 1.0 (its late event widens it), step 2 from 1.0 to 1.2
    assert totals.step_s == pytest.approx(1.2)
    totals.add_rows([(1, "gather", 1.5, 1.6, 0)])  # a step older than the latest: not widened
    assert totals.step_s == pytest.approx(1.2)


def test_a_late_event_widens_its_step_by_what_it_adds():
    # step 1 from 0.1 to 0.2, then a late event to 1.0: 0.9 s, not 0.2 + 0.9
    totals = export.PhaseTotals()
    totals.add_rows([(1, "scatter", 0.1, 0.2, 8)])
    totals.add_rows([(1, "gather", 0.5, 1.0, 4)])
    assert (totals.steps, totals.step_s) == (1, pytest.approx(0.9))


def test_an_older_step_s_late_events_do_not_stop_a_newer_step_being_counted():
    totals = export.PhaseTotals()
    totals.add_rows([(1, "scatter", 0.0, 0.2, 8), (2, "scatter", 1.0, 1.2, 8)])
    totals.add_rows([(1, "gather", 0.5, 0.6, 4), (3, "scatter", 2.0, 2.5, 8)])
    assert (totals.steps, totals.last_step) == (3, 3)
    assert totals.step_s == pytest.approx(0.2 + 0.2 + 0.5)


# --------------------------------------------------------------------------------------
# The mutation run's list of survivors kept on purpose (benchmarks/mutation_equivalents.md)


def _load_mutation_script():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "mutation.py"
    spec = importlib.util.spec_from_file_location("_dpkit_mutation", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while it loads
    spec.loader.exec_module(module)
    return module


def _defines(module: str, mangled: str) -> bool:
    """Whether ``module``'s source still defines the function mutmut names ``mangled``
    (``x_name`` for a function, ``xǁClassǁmethod`` for a method)."""
    source = Path(__file__).resolve().parents[1] / (module.replace(".", "/") + ".py")
    tree = ast.parse(source.read_text())
    if mangled.startswith("xǁ"):
        _, owner, name = mangled.split("ǁ")
        bodies = [n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner]
    else:
        owner, name = None, mangled.removeprefix("x_")
        bodies = [tree.body]
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    return any(isinstance(n, functions) and n.name == name for body in bodies for n in body)


def test_every_listed_survivor_names_an_audited_function_its_lines_and_a_reason():
    """A malformed entry would match nothing, and its mutant would count as a survivor; an
    entry whose function was renamed or moved matches nothing either (stale)."""
    mutation = _load_mutation_script()
    entries = mutation.load_equivalents()
    text = mutation.EQUIVALENTS_MD.read_text()
    assert len(entries) == text.count("\n### ")
    audited = {mutation.module_of(path) for path in (*mutation.CORE_FILES, *mutation.BEYOND_CORE)}
    for entry in entries:
        module, _, mangled = entry.function.rpartition(".")
        assert module in audited, entry.name
        assert _defines(module, mangled), f"{entry.name}: no such function any more"
        assert any(line.startswith("-") for line in entry.change), entry.name
        assert len(entry.reason) > 20, entry.name
    gpu_section = text[text.index("\n## Only on a GPU") :]
    assert {e.name for e in entries if e.gpu_only} == {
        e.name for e in entries if f"### `{e.name}`" in gpu_section
    }


def test_the_tool_tells_a_message_s_wording_from_a_change_users_would_see():
    mutation = _load_mutation_script()
    source = (
        "def f(n, warn):\n"
        "    if n < 0:\n"
        "        raise ValueError(\n"
        "            f'n={n} is negative; '\n"
        "            'pass a count'\n"
        "        )\n"
        "    if n > 9:\n"
        "        warn('n is large')\n"
        "    if n == 5:\n"
        "        return f'{n} rows make one chunk too many'\n"
        "    return 'count'\n"
        "def options(parser):\n"
        "    parser.add_argument('--n', help='how many', default='one')\n"
    )
    messages = mutation.message_lines(source)
    assert {"'pass a count'", "warn('n is large')"} <= messages.keys()
    assert "return 'count'" not in messages  # a value the caller gets, not a message
    # an option's help is prose too; its line holds a default, but a help= change is wording
    option = "parser.add_argument('--n', help='how many', default='one')"
    assert option in messages

    def diff(before, after):
        return f"--- a\n+++ b\n@@\n-    {before}\n+    {after}\n"

    assert mutation.is_wording(diff("'pass a count'", "'XXpass a countXX'"), messages)
    assert mutation.is_wording(diff("'pass a count'", "'PASS A COUNT'"), messages)
    assert mutation.is_wording(diff("warn('n is large')", "warn('XXn is largeXX')"), messages)
    assert mutation.is_wording(diff(option, option.replace("how many", "HOW MANY")), messages)
    wrapped = option.replace("'how many'", "'XXhow manyXX'")
    assert mutation.is_wording(diff(option, wrapped), messages)
    # the option's default on the same line is a value, not its help
    assert not mutation.is_wording(diff(option, option.replace("'one'", "'XXoneXX'")), messages)
    assert not mutation.is_wording(diff(option, option.replace("'one'", "'ONE'")), messages)
    # a sentence returned for a person (a grader's hint) is wording; a returned value is not
    hint = "return f'{n} rows make one chunk too many'"
    assert mutation.is_wording(diff(hint, hint.replace("rows", "ROWS")), messages)
    assert mutation.is_wording(diff(hint, hint.replace("'{n}", "'XX{n}").replace("y'", "yXX'")),
                               messages)  # fmt: skip
    # not wording: a returned value, another message, or a changed condition
    assert not mutation.is_wording(diff("return 'count'", "return 'XXcountXX'"), messages)
    assert not mutation.is_wording(diff("'pass a count'", "'pass a number'"), messages)
    assert not mutation.is_wording(diff("warn('n is large')", "None"), messages)
    assert not mutation.is_wording(diff("if n < 0:", "if n <= 0:"), mutation.message_lines(source))


def test_a_listed_survivor_matches_its_change_whatever_mutmut_numbers_it():
    mutation = _load_mutation_script()
    entry = mutation.Equivalent(
        name="dpkit.scatter.x_scatter__mutmut_62",
        function="dpkit.scatter.x_scatter",
        change=("-scatter_map = None", '+scatter_map = ""'),
        reason="any value breaks the cycle",
        gpu_only=False,
    )
    diff = '--- a\n+++ b\n@@\n-        scatter_map = None\n+        scatter_map = ""\n'
    assert mutation.match_equivalent("dpkit.scatter.x_scatter__mutmut_70", diff, [entry])
    assert not mutation.match_equivalent("dpkit.gather.x_gather__mutmut_62", diff, [entry])
    other = diff.replace('""', "0")
    assert not mutation.match_equivalent("dpkit.scatter.x_scatter__mutmut_62", other, [entry])
    whole_line = dataclasses.replace(entry, change=("-scatter_map = None",))
    assert mutation.match_equivalent("dpkit.scatter.x_scatter__mutmut_1", other, [whole_line])


def test_recheck_timeouts_forgets_only_the_verdicts_of_mutants_stopped_at_the_time_limit(
    tmp_path,
):
    # A mutant whose tests passed but ran past mutmut's limit on a loaded machine counted as
    # caught; --recheck-timeouts runs those once more, alone. Every other verdict stays.
    mutation = _load_mutation_script()
    meta = tmp_path / "mutants" / "dpkit" / "comm.py.meta"
    meta.parent.mkdir(parents=True)
    codes = {"killed": 1, "survived": 0, "not checked": None, "crashed": -11}
    timeouts = {f"timeout {code}": code for code in (36, 24, -24, 152)}
    meta.write_text(json.dumps({"exit_code_by_key": {**codes, **timeouts}, "other": [1]}))
    assert sorted(mutation.reset_timeouts(tmp_path, "dpkit/comm.py")) == sorted(timeouts)
    kept = json.loads(meta.read_text())
    assert kept["exit_code_by_key"] == {**codes, **dict.fromkeys(timeouts)}
    assert kept["other"] == [1]  # the rest of mutmut's file as it was
    assert mutation.reset_timeouts(tmp_path, "dpkit/comm.py") == []  # nothing left to recheck
    assert mutation.reset_timeouts(tmp_path, "dpkit/gather.py") == []  # no cache: nothing


def test_a_function_s_tests_are_widened_to_every_test_of_their_files():
    """A module-scoped fixture runs inside the first test that asks for it: mutmut links the
    function to that test alone, though the file's other tests check what it made."""
    from benchmarks.mutmut_widened import widened

    by_function = {"f": {"tests/a.py::one"}, "g": {"tests/b.py::three"}, "untested": set()}
    found = ["tests/a.py::one", "tests/a.py::two", "tests/b.py::three", "tests/c.py::four"]
    widened(by_function, found)
    assert by_function == {
        "f": {"tests/a.py::one", "tests/a.py::two"},
        "g": {"tests/b.py::three"},
        "untested": set(),  # no test file: still "no tests"
    }
