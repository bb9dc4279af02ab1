"""Behaviour the mutation run (``make mutation``, benchmarks/mutation.py) found untested.

Each test here kills mutants that survived the rest of the fast suite: a planted bug that
would reach users unnoticed. The test names say the behaviour; the docstrings say which
plausible bug it catches. Error messages are checked word for word where the message is the
advice a user acts on (what to pass, what to return).
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from collections import namedtuple

import pytest
import torch
from lanes import lanes, recorded_transfers
from torch import nn

import dpkit
from dpkit import comm
from dpkit.context import backward_of
from dpkit.devices import place, resides_on
from dpkit.nested import module_tensors
from dpkit.placement_check import checking_placement

devices_module = sys.modules["dpkit.devices"]  # dpkit.devices is also the function
Pair = namedtuple("Pair", ["first", "second"])


class Identity(nn.Module):
    def forward(self, x):
        return x


def lane_outputs(pieces, devices=None):
    """Each piece on its own lane, as a replica's output is."""
    devices = devices or lanes(len(pieces))
    return dpkit.parallel_apply([Identity() for _ in pieces], pieces, devices=devices)


# --------------------------------------------------------------------------------------
# gather


@dataclasses.dataclass
class Prediction:
    logits: torch.Tensor


@pytest.mark.parametrize(
    "outputs, message",
    [
        (
            [Prediction(torch.ones(1)), Prediction(torch.ones(1))],
            "gather cannot combine replica outputs of type Prediction; a dataclass: return "
            "its fields as a dict or a namedtuple instead",
        ),
        (
            ["cat", "dog"],
            "gather cannot combine replica outputs of type str; return tensors (a Python "
            "number can be wrapped with torch.tensor(x)), or a dict, list, tuple or namedtuple "
            "of tensors",
        ),
    ],
    ids=["dataclass", "str"],
)
def test_gather_says_word_for_word_what_a_replica_should_return(outputs, message):
    with pytest.raises(TypeError) as error:
        dpkit.gather(outputs, lanes(2)[0])
    assert str(error.value) == message


def test_gather_of_no_outputs_asks_for_one_per_replica():
    with pytest.raises(ValueError) as error:
        dpkit.gather([], lanes(2)[0])
    assert str(error.value) == "outputs is empty; pass one output per replica"


def test_gather_of_vectors_along_dim_one_is_refused_not_gathered_along_dim_zero():
    """A 1-D output has no dim 1: gather must say so, not wrap dim 1 around to dim 0."""
    outputs = lane_outputs([torch.ones(2), torch.ones(3)])
    with pytest.raises(ValueError) as error:
        dpkit.gather(outputs, lanes(2)[0], dim=1)
    assert str(error.value) == (
        "dim=1 is out of range for replica outputs of shape (2,); use a dim between -1 and 0"
    )


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
    with pytest.raises(ValueError, match="zip"):
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
    assert str(error.value) == (
        "broadcast source must be on devices[0] (virtual:0 (cpu)), found a tensor on "
        "virtual:1 (cpu); move the module to devices[0] first"
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


def test_record_use_records_dense_and_sparse_cuda_tensors_and_skips_the_rest():
    """On a GPU, a tensor another stream reads must be recorded on that stream, or the
    allocator may reuse its memory too early: a sparse COO tensor through its indices and
    values; CPU tensors and layouts record_stream does not take are left alone."""
    log = []
    tensors = [
        _FakeCudaTensor(torch.strided, log, "dense"),
        _FakeCudaTensor(torch.sparse_coo, log, "coo"),
        _FakeCudaTensor(torch.sparse_csr, log, "csr"),
        torch.ones(2),
    ]
    comm.record_use(tensors, "lane stream")
    assert log == [
        ("dense", "lane stream"),
        ("coo.indices", "lane stream"),
        ("coo.values", "lane stream"),
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
    monkeypatch.setattr(comm, "record_use", lambda ts, stream: recorded.append((list(ts), stream)))
    monkeypatch.setattr(comm, "stream_of", lambda device: f"lane {device.index}")

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
    assert asked == [torch.device("cpu")]

    recorded.clear()
    with backward_of(1):
        comm.gather(list(chunks), 0, gpu_lanes[0], gpu_lanes)
    assert ids(recorded) == [([id(c) for c in chunks], "caller")]

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


def test_scatter_says_word_for_word_which_chunk_sizes_exist():
    with pytest.raises(ValueError) as error:
        dpkit.scatter(torch.randn(10, 2), lanes(4), chunk_sizes="even")
    assert str(error.value) == (
        "chunk_sizes='even' is not known; use None (torch.chunk), 'balanced', a list of "
        "sizes, or a function (batch, num_devices) -> sizes"
    )


def test_keyword_inputs_are_split_by_the_same_chunk_sizes_as_positional_ones():
    """A model taking a keyword mask: with ``chunk_sizes="balanced"`` (3, 3, 2, 2 for 10
    rows) both must be split alike, or each replica gets rows of another's mask."""
    x, mask = torch.randn(10, 2), torch.randn(10, 2)
    args, kwargs = dpkit.scatter_kwargs((x,), {"mask": mask}, lanes(4), chunk_sizes="balanced")
    assert [a[0].shape[0] for a in args] == [k["mask"].shape[0] for k in kwargs] == [3, 3, 2, 2]

    class Masked(nn.Module):
        def forward(self, x, mask):
            return x * mask

    parallel = dpkit.DataParallel(Masked(), device_ids=lanes(4), chunk_sizes="balanced")
    assert torch.equal(parallel(x, mask=mask), x * mask)


def test_scatter_kwargs_pads_keyword_chunks_only_when_fewer_than_positional_arguments():
    """torch's rule, literally: one positional argument in 4 chunks and a keyword argument in
    1 chunk (1 is not fewer than 1 argument) stay 4 and 1."""
    x, y = torch.randn(10, 2), torch.randn(1)
    args, kwargs = dpkit.scatter_kwargs((x,), {"y": y}, lanes(4))
    assert len(args) == 4 and len(kwargs) == 1


# --------------------------------------------------------------------------------------
# replicate


def test_replicating_a_function_says_word_for_word_to_wrap_it():
    with pytest.raises(TypeError) as error:
        dpkit.replicate(torch.relu, lanes(2))
    assert str(error.value) == (
        "module must be a torch.nn.Module, got builtin_function_or_method; to run a plain "
        "function on every device, wrap it in an nn.Module"
    )


def test_a_python_module_under_a_script_module_is_refused_with_torchs_message(monkeypatch):
    """torch decides (its own check, forced here): dpkit raises what torch raises."""
    torch_replicate = sys.modules["torch.nn.parallel.replicate"]
    monkeypatch.setattr(torch_replicate, "_replicatable_module", lambda module: False)
    with pytest.raises(RuntimeError) as theirs:
        torch_replicate.replicate(nn.Linear(2, 2), [0])
    with pytest.raises(RuntimeError) as ours:
        dpkit.replicate(nn.Linear(2, 2), lanes(2))
    assert str(ours.value) == str(theirs.value)
    assert str(ours.value) == (
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
    assert str(error.value) == (
        "in replica 1, no device was given and no tensor input was found, so the device "
        "cannot be resolved; pass devices=[...] to parallel_apply"
    )


def test_parallel_apply_names_its_devices_argument_when_a_device_repeats():
    device = lanes(1)[0]
    with pytest.raises(ValueError) as error:
        dpkit.parallel_apply([Identity(), Identity()], [torch.ones(1)] * 2, devices=[device] * 2)
    assert str(error.value) == (
        "devices lists virtual:0 (cpu) more than once; each replica needs its own device, "
        "e.g. dpkit.devices(4)"
    )


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


def test_dataparallel_of_a_function_says_word_for_word_to_wrap_it():
    with pytest.raises(TypeError) as error:
        dpkit.DataParallel(torch.relu, device_ids=lanes(2))
    assert str(error.value) == (
        "module must be a torch.nn.Module, got builtin_function_or_method; wrap the "
        "computation in an nn.Module"
    )


def test_a_module_listed_without_lane_0_is_told_word_for_word_to_list_lane_0_first():
    with pytest.raises(RuntimeError) as error:
        dpkit.DataParallel(nn.Linear(2, 2), device_ids=lanes(3)[1:])(torch.randn(4, 2))
    assert str(error.value) == (
        "module must have its parameters and buffers on device virtual:1 (cpu) (device_ids[0])"
        " but found one of them on device: cpu; a module you create sits on lane 0 (the plain"
        " cpu memory), so list lane 0 first: use device_ids=dpkit.virtual_devices(n)"
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
