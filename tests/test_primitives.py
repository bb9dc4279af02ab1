"""The four primitives on virtual CPU lanes, held to torch.nn.parallel's semantics.

Expected values come from torch itself (``torch.chunk``, ``torch.cat``, plain autograd) or
are written out literally; dpkit is never compared with itself.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
import warnings
from collections import OrderedDict, namedtuple
from pathlib import Path

import pytest
import torch
from lanes import lanes, recorded_transfers
from torch import nn

import dpkit

Batch = namedtuple("Batch", ["features", "labels"])


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


# --------------------------------------------------------------------------------------
# scatter


@pytest.mark.parametrize(
    "rows, expected",
    [
        (10, [3, 3, 3, 1]),
        (6, [2, 2, 2]),
        (4, [1, 1, 1, 1]),
        (3, [1, 1, 1]),
        (9, [3, 3, 3]),
        (1, [1]),
    ],
)
def test_scatter_chunk_sizes_are_torch_chunks(rows, expected):
    x = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2)
    chunks = dpkit.scatter(x, lanes(4))
    assert [c.shape[0] for c in chunks] == expected
    assert [c.shape[0] for c in chunks] == [c.shape[0] for c in x.chunk(4)]


def test_scatter_of_six_rows_over_four_lanes_uses_three_lanes():
    chunks = dpkit.scatter(torch.randn(6, 3), lanes(4))
    assert len(chunks) == 3
    assert [dpkit.device_of(c) for c in chunks] == lanes(4)[:3]


def test_scatter_values_equal_torch_chunk_pieces():
    x = torch.randn(10, 3)
    chunks = dpkit.scatter(x, lanes(4))
    expected = x.chunk(4)
    assert len(chunks) == len(expected)
    for chunk, piece in zip(chunks, expected):
        assert torch.equal(chunk, piece)


@pytest.mark.parametrize("dim", [1, -1])
def test_scatter_along_dim_one(dim):
    x = torch.randn(3, 10)
    chunks = dpkit.scatter(x, lanes(4), dim=dim)
    assert [tuple(c.shape) for c in chunks] == [(3, 3), (3, 3), (3, 3), (3, 1)]
    for chunk, piece in zip(chunks, x.chunk(4, dim=1)):
        assert torch.equal(chunk, piece)


@pytest.mark.parametrize("dim", [2, -1])
def test_scatter_along_last_dim_of_a_non_contiguous_tensor(dim):
    x = torch.randn(2, 10, 3).transpose(1, 2)  # shape (2, 3, 10), non-contiguous
    chunks = dpkit.scatter(x, lanes(4), dim=dim)
    assert [tuple(c.shape) for c in chunks] == [(2, 3, 3), (2, 3, 3), (2, 3, 3), (2, 3, 1)]
    for chunk, piece in zip(chunks, x.chunk(4, dim=-1)):
        assert torch.equal(chunk, piece)


def test_scatter_of_a_tensor_returns_a_tuple():
    chunks = dpkit.scatter(torch.randn(4, 2), lanes(2))
    assert isinstance(chunks, tuple)
    assert len(chunks) == 2


def test_scatter_of_a_tuple_returns_a_list_of_tuples_one_per_used_device():
    x, y = torch.randn(10, 2), torch.arange(10)
    scattered = dpkit.scatter((x, y), lanes(4))
    assert isinstance(scattered, list) and len(scattered) == 4
    for entry, x_piece, y_piece in zip(scattered, x.chunk(4), y.chunk(4)):
        assert isinstance(entry, tuple) and len(entry) == 2
        assert torch.equal(entry[0], x_piece) and torch.equal(entry[1], y_piece)


def test_scatter_of_a_list_returns_lists():
    x = torch.randn(6, 2)
    scattered = dpkit.scatter([x, x * 2], lanes(3))
    assert isinstance(scattered, list) and len(scattered) == 3
    for entry, piece in zip(scattered, x.chunk(3)):
        assert isinstance(entry, list)
        assert torch.equal(entry[0], piece) and torch.equal(entry[1], piece * 2)


def test_scatter_of_a_dict_keeps_its_type_and_shares_non_tensors():
    x = torch.randn(4, 2)
    settings = object()
    scattered = dpkit.scatter(OrderedDict(x=x, settings=settings, scale=3), lanes(2))
    assert len(scattered) == 2
    for entry, piece in zip(scattered, x.chunk(2)):
        assert type(entry) is OrderedDict
        assert list(entry) == ["x", "settings", "scale"]
        assert torch.equal(entry["x"], piece)
        assert entry["settings"] is settings
        assert entry["scale"] == 3


def test_scatter_of_a_namedtuple_keeps_its_type():
    features, labels = torch.randn(6, 3), torch.arange(6)
    scattered = dpkit.scatter(Batch(features, labels), lanes(2))
    assert len(scattered) == 2
    for entry, f_piece, l_piece in zip(scattered, features.chunk(2), labels.chunk(2)):
        assert type(entry) is Batch
        assert torch.equal(entry.features, f_piece) and torch.equal(entry.labels, l_piece)


def test_scatter_recurses_into_nested_containers():
    x = torch.randn(4, 2)
    scattered = dpkit.scatter(({"a": [x]},), lanes(2))
    assert len(scattered) == 2
    for entry, piece in zip(scattered, x.chunk(2)):
        assert torch.equal(entry[0]["a"][0], piece)


def test_scatter_shares_non_tensors_by_reference():
    config = {"not": "split"}.keys()  # any non-container object
    marker = object()
    scattered = dpkit.scatter((torch.randn(4, 1), marker, config), lanes(4))
    assert len(scattered) == 4
    assert all(entry[1] is marker and entry[2] is config for entry in scattered)


def test_scatter_of_a_lone_non_tensor_gives_one_reference_per_device():
    marker = object()
    assert dpkit.scatter(marker, lanes(3)) == [marker, marker, marker]
    assert all(entry is marker for entry in dpkit.scatter(marker, lanes(3)))


def test_scatter_rejects_tensors_of_different_batch_sizes_that_torch_zips():
    # 10 rows -> 4 chunks, 6 rows -> 3 chunks: torch zips them to 3 entries and drops rows
    # 9-10 of the first; dpkit raises (README, "Clearer errors").
    long, middle = torch.randn(10, 1), torch.randn(6, 1)
    with pytest.raises(ValueError, match=r"inputs\[0\] has 10, inputs\[1\] has 6"):
        dpkit.scatter((long, middle), lanes(4))


def test_scatter_zips_shared_objects_to_the_devices_the_tensors_use():
    # 6 rows -> 3 chunks; the string goes to those 3 devices only, as torch's zip does.
    x = torch.randn(6, 1)
    scattered = dpkit.scatter((x, "label"), lanes(4))
    assert len(scattered) == 3
    for entry, piece in zip(scattered, x.chunk(4)):
        assert torch.equal(entry[0], piece) and entry[1] == "label"


def test_scatter_chunk_zero_is_a_view_other_chunks_are_copies():
    x = torch.randn(10, 5)
    chunks = dpkit.scatter(x, lanes(4))
    assert shares_storage(chunks[0], x)
    assert chunks[0].data_ptr() == x.data_ptr()
    for chunk, piece in zip(chunks[1:], x.chunk(4)[1:]):
        assert not shares_storage(chunk, x)
        assert chunk.data_ptr() != piece.data_ptr()
    before = [c.clone() for c in chunks]
    x.add_(100.0)
    assert torch.equal(chunks[0], before[0] + 100.0)  # the view sees the change
    for chunk, old in zip(chunks[1:], before[1:]):
        assert torch.equal(chunk, old)  # real copies do not


def test_scatter_of_input_already_on_a_lane_moves_it():
    lane = lanes(4)
    chunks = dpkit.scatter(torch.randn(8, 2), lane)
    on_lane_two = chunks[2]
    rescattered = dpkit.scatter(on_lane_two, lane[:2])
    assert torch.equal(torch.cat(rescattered), on_lane_two)
    assert [dpkit.device_of(c) for c in rescattered] == lane[:2]


# --------------------------------------------------------------------------------------
# scatter_kwargs: concrete results of torch's padding rule


def test_scatter_kwargs_with_kwargs_only_pads_inputs_with_empty_tuples():
    x = torch.randn(10, 2)
    args, kwargs = dpkit.scatter_kwargs((), {"x": x, "flag": True}, lanes(4))
    assert args == ((), (), (), ())
    assert isinstance(kwargs, tuple) and len(kwargs) == 4
    for entry, piece in zip(kwargs, x.chunk(4)):
        assert set(entry) == {"x", "flag"}
        assert torch.equal(entry["x"], piece) and entry["flag"] is True


def test_scatter_kwargs_with_inputs_only_pads_kwargs_with_empty_dicts():
    x = torch.randn(10, 2)
    for no_kwargs in (None, {}):
        args, kwargs = dpkit.scatter_kwargs((x, "label"), no_kwargs, lanes(4))
        assert isinstance(args, tuple) and len(args) == 4
        for entry, piece in zip(args, x.chunk(4)):
            assert isinstance(entry, tuple) and len(entry) == 2
            assert torch.equal(entry[0], piece) and entry[1] == "label"
        assert kwargs == ({}, {}, {}, {})


def test_scatter_kwargs_with_both_of_the_same_length():
    x, y = torch.randn(10, 2), torch.randn(10)
    args, kwargs = dpkit.scatter_kwargs((x,), {"y": y}, lanes(4))
    assert len(args) == len(kwargs) == 4
    for entry, kw, x_piece, y_piece in zip(args, kwargs, x.chunk(4), y.chunk(4)):
        assert torch.equal(entry[0], x_piece)
        assert torch.equal(kw["y"], y_piece)


@pytest.mark.parametrize(
    "x_rows, y_rows, z", [(6, 10, None), (10, 6, None), (10, 1, 10)], ids=["3<4", "4>3", "1<2"]
)
def test_scatter_kwargs_rejects_keyword_tensors_of_another_batch_size(x_rows, y_rows, z):
    # torch pads or cuts by chunk counts here (a replica without its input, a kwargs_tup
    # shorter than the inputs, a keyword tensor of one row broadcast): dpkit raises, naming both.
    inputs = (torch.randn(x_rows, 2),) + (() if z is None else (torch.randn(z),))
    with pytest.raises(ValueError, match=rf"inputs\[0\] has {x_rows}.*kwargs\['y'\] has {y_rows}"):
        dpkit.scatter_kwargs(inputs, {"y": torch.randn(y_rows)}, lanes(4))


def test_scatter_kwargs_with_inputs_shorter_than_kwargs_pads_inputs():
    x = torch.randn(6, 2)  # 3 chunks; a keyword flag goes to all 4 devices
    args, kwargs = dpkit.scatter_kwargs((x,), {"flag": True}, lanes(4))
    assert len(args) == 4 and len(kwargs) == 4
    assert args[3] == ()
    for entry, piece in zip(args[:3], x.chunk(4)):
        assert torch.equal(entry[0], piece)
    assert kwargs[3] == {"flag": True}


def test_scatter_kwargs_kwargs_shorter_than_one_input_are_not_padded_as_in_torch():
    # torch compares the keyword chunks with len(inputs), the number of positional
    # arguments (1 here), not with the number of input entries (4): no padding happens.
    args, kwargs = dpkit.scatter_kwargs(("label",), {"y": torch.randn(6)}, lanes(4))
    assert len(args) == 4
    assert len(kwargs) == 3


def test_scatter_kwargs_kwargs_shorter_than_several_inputs_are_padded():
    # Two positional arguments, keyword chunks 1 < 2: torch pads to the input entries.
    y = torch.randn(1)
    args, kwargs = dpkit.scatter_kwargs(("a", "b"), {"y": y}, lanes(4))
    assert len(args) == 4 and len(kwargs) == 4
    assert torch.equal(kwargs[0]["y"], y)
    assert kwargs[1:] == ({}, {}, {})


# --------------------------------------------------------------------------------------
# chunk_sizes= (dpkit's opt-in addition)


def test_numpy_integers_are_taken_as_dims_and_chunk_sizes_as_torch_takes_them():
    # x.chunk(4, dim=np.int64(1)) and x.split([np.int64(5), ...]) work in torch
    np = pytest.importorskip("numpy")
    x = torch.randn(10, 6)
    chunks = dpkit.scatter(x, lanes(4), dim=np.int64(1))
    assert [tuple(c.shape) for c in chunks] == [(10, 2)] * 3
    sized = dpkit.scatter(x, lanes(4), chunk_sizes=list(np.array([4, 3, 2, 1])))
    assert [len(c) for c in sized] == [4, 3, 2, 1]
    assert torch.equal(dpkit.gather(list(chunks), lanes(4)[0], dim=np.int64(1)), x)


def test_torch_chunk_sizes_are_exact_past_floats_range():
    rows = 10**20 + 1  # a float's ceil of rows / 3 is off by thousands here
    assert dpkit.torch_chunk_sizes(rows, 3) == [33333333333333333334] * 2 + [33333333333333333333]


def test_balanced_chunk_sizes_ten_over_four():
    x = torch.randn(10, 2)
    chunks = dpkit.scatter(x, lanes(4), chunk_sizes="balanced")
    assert [c.shape[0] for c in chunks] == [3, 3, 2, 2]
    assert torch.equal(torch.cat([c for c in chunks]), x)


def test_explicit_chunk_sizes_list():
    x = torch.randn(10, 2)
    chunks = dpkit.scatter(x, lanes(4), chunk_sizes=[1, 2, 3, 4])
    assert [c.shape[0] for c in chunks] == [1, 2, 3, 4]
    for chunk, piece in zip(chunks, x.split([1, 2, 3, 4])):
        assert torch.equal(chunk, piece)


def test_explicit_chunk_sizes_with_fewer_chunks_uses_fewer_lanes():
    chunks = dpkit.scatter(torch.randn(10, 2), lanes(4), chunk_sizes=[5, 5])
    assert [c.shape[0] for c in chunks] == [5, 5]
    assert [dpkit.device_of(c) for c in chunks] == lanes(4)[:2]


def test_callable_chunk_sizes_weighted():
    sizer = functools.partial(dpkit.weighted_chunk_sizes, weights=[1, 1, 2, 2])
    chunks = dpkit.scatter(torch.randn(12, 2), lanes(4), chunk_sizes=sizer)
    assert [c.shape[0] for c in chunks] == [2, 2, 4, 4]


def test_callable_chunk_sizes_receives_batch_and_device_count():
    seen = []

    def sizer(batch, num_devices):
        seen.append((batch, num_devices))
        return [batch - 1, 1]

    chunks = dpkit.scatter(torch.randn(7, 3), lanes(3), chunk_sizes=sizer)
    assert seen == [(7, 3)]
    assert [c.shape[0] for c in chunks] == [6, 1]


def test_default_chunk_sizes_are_torch_even_with_scatter_kwargs():
    args, _ = dpkit.scatter_kwargs((torch.randn(10, 2),), None, lanes(4), chunk_sizes="balanced")
    assert [a[0].shape[0] for a in args] == [3, 3, 2, 2]
    args, _ = dpkit.scatter_kwargs((torch.randn(10, 2),), None, lanes(4))
    assert [a[0].shape[0] for a in args] == [3, 3, 3, 1]


@pytest.mark.parametrize(
    "rows, num_devices, weights, expected",
    [
        (12, 4, [1, 1, 2, 2], [2, 2, 4, 4]),
        (8, 2, [1, 3], [2, 6]),  # exact proportions exist: 8 * 1/4 = 2, 8 * 3/4 = 6
        (10, 2, [1, 4], [2, 8]),
        (20, 4, [1, 1, 1, 1], [5, 5, 5, 5]),
        # largest remainder: shares 2.14 and 2.86, the spare row to the larger remainder,
        # the larger device here (not the smaller share)
        (5, 2, [3, 4], [2, 3]),
    ],
)
def test_weighted_chunk_sizes_are_proportional_to_weights(rows, num_devices, weights, expected):
    assert dpkit.weighted_chunk_sizes(rows, num_devices, weights=weights) == expected


@pytest.mark.parametrize(
    "bad_sizes",
    [[3, 3, 3], [3, 3, 3, 3], [5, 0, 5], [10, 0, 0, 0], [6, -1, 5], [2, 2, 2, 2, 2], [2.5, 7.5]],
    ids=["sum-too-small", "sum-too-big", "zero", "zeros", "negative", "too-many", "floats"],
)
def test_invalid_chunk_sizes_list_is_a_value_error_naming_chunk_sizes(bad_sizes):
    with pytest.raises(ValueError, match=r"chunk_sizes"):
        dpkit.scatter(torch.randn(10, 2), lanes(4), chunk_sizes=bad_sizes)


def test_chunk_sizes_with_wrong_sum_says_what_they_must_add_up_to():
    with pytest.raises(ValueError, match=r"chunk_sizes=\[3, 3, 3\].*add up to the batch size 10"):
        dpkit.scatter(torch.randn(10, 2), lanes(4), chunk_sizes=[3, 3, 3])


def test_chunk_sizes_with_too_many_chunks_names_the_device_count():
    with pytest.raises(ValueError, match=r"chunk_sizes=.*more chunks than the 4 devices"):
        dpkit.scatter(torch.randn(10, 2), lanes(4), chunk_sizes=[2, 2, 2, 2, 2])


def test_unknown_chunk_sizes_name_lists_the_choices():
    with pytest.raises(ValueError, match=r"chunk_sizes='even'.*'balanced'"):
        dpkit.scatter(torch.randn(10, 2), lanes(4), chunk_sizes="even")


def test_callable_chunk_sizes_returning_a_bad_plan_is_caught():
    with pytest.raises(ValueError, match=r"chunk_sizes"):
        dpkit.scatter(torch.randn(10, 2), lanes(4), chunk_sizes=lambda batch, n: [1] * n)


# --------------------------------------------------------------------------------------
# replicate


class WithBuffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.norm = nn.BatchNorm1d(3)
        self.register_buffer("trainable_buffer", torch.ones(3, requires_grad=True))
        self.register_buffer("plain_buffer", torch.arange(3.0))

    def forward(self, x):
        return self.norm(self.linear(x)) * self.trainable_buffer + self.plain_buffer


class WithParameterContainers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.plist = nn.ParameterList(
            [nn.Parameter(torch.randn(2)), nn.Parameter(torch.randn(3), requires_grad=False)]
        )
        self.pdict = nn.ParameterDict(
            {
                "scale": nn.Parameter(torch.randn(2)),
                "frozen": nn.Parameter(torch.randn(2), requires_grad=False),
            }
        )

    def forward(self, x):
        return x * self.plist[0] * self.pdict["scale"]


def test_replica_zero_shares_storage_other_replicas_copy():
    model = WithBuffers()
    replicas = dpkit.replicate(model, lanes(4))
    assert len(replicas) == 4
    originals = dict(model.named_parameters()) | dict(model.named_buffers())
    for name, original in originals.items():
        module_path, _, attribute = name.rpartition(".")
        for index, replica in enumerate(replicas):
            owner = replica.get_submodule(module_path) if module_path else replica
            copy = getattr(owner, attribute)
            assert torch.equal(copy, original), name
            if index == 0:
                assert copy.data_ptr() == original.data_ptr(), name
            else:
                assert not shares_storage(copy, original), (name, index)


def test_replicas_are_new_modules_with_replicated_children():
    model = WithBuffers()
    replicas = dpkit.replicate(model, lanes(3))
    assert all(replica is not model for replica in replicas)
    assert len({id(replica.linear) for replica in replicas} | {id(model.linear)}) == 4
    assert all(type(replica) is WithBuffers for replica in replicas)


def test_replica_parameters_are_non_leaf_broadcast_outputs():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    replicas = dpkit.replicate(model, lanes(3))
    for replica in replicas:
        # As torch: _replicate_for_data_parallel empties _parameters; copies are attributes.
        assert list(replica.parameters()) == []
        for layer in (replica[0], replica[2]):
            for tensor in (layer.weight, layer.bias):
                assert not isinstance(tensor, nn.Parameter)
                assert not tensor.is_leaf
                assert tensor.requires_grad
                assert tensor.grad_fn is not None


def test_replica_buffers_have_grad_fn_only_when_they_require_grad():
    replicas = dpkit.replicate(WithBuffers(), lanes(3))
    for replica in replicas:
        assert replica.trainable_buffer.grad_fn is not None
        assert replica.trainable_buffer.requires_grad
        assert replica.plain_buffer.grad_fn is None
        assert replica.norm.running_mean.grad_fn is None
        assert not replica.norm.running_mean.requires_grad


def test_replica_parameter_list_and_dict_entries_keep_requires_grad():
    model = WithParameterContainers()
    replicas = dpkit.replicate(model, lanes(3))
    for replica in replicas:
        assert len(replica.plist) == 2
        assert replica.plist[0].requires_grad and replica.plist[0].grad_fn is not None
        assert not replica.plist[1].requires_grad
        assert replica.pdict["scale"].requires_grad and replica.pdict["scale"].grad_fn is not None
        assert not replica.pdict["frozen"].requires_grad
        assert torch.equal(replica.plist[1], model.plist[1])
        assert torch.equal(replica.pdict["frozen"], model.pdict["frozen"])
    x = torch.randn(2)
    assert torch.equal(replicas[2](x), model(x))


def test_replicate_detach_gives_no_grad_fn():
    model = WithBuffers()
    replicas = dpkit.replicate(model, lanes(3), detach=True)
    for replica in replicas:
        for tensor in (replica.linear.weight, replica.linear.bias, replica.trainable_buffer):
            assert tensor.grad_fn is None
    assert replicas[0].linear.weight.data_ptr() == model.linear.weight.data_ptr()
    assert replicas[1].linear.weight.data_ptr() != model.linear.weight.data_ptr()


def test_replicas_compute_what_the_original_computes():
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2))
    x = torch.randn(6, 4)
    expected = model(x)
    for replica in dpkit.replicate(model, lanes(3)):
        torch.testing.assert_close(replica(x), expected, rtol=0, atol=0)


def test_replica_zero_in_place_updates_land_in_the_original():
    model = nn.BatchNorm1d(3)
    replicas = dpkit.replicate(model, lanes(2))
    replicas[1](torch.randn(8, 3) + 5.0)
    assert torch.equal(model.running_mean, torch.zeros(3))  # replica 1's writes are lost
    assert int(model.num_batches_tracked) == 0
    x = torch.randn(8, 3) + 5.0
    replicas[0](x)
    torch.testing.assert_close(model.running_mean, 0.1 * x.mean(0))
    assert int(model.num_batches_tracked) == 1


def test_backward_through_replicas_reduce_adds_onto_the_original():
    model = nn.Linear(4, 3)
    replicas = dpkit.replicate(model, lanes(4))
    weights = [1.0, 2.0, 3.0, 4.0]
    loss = sum(
        ((replica.weight * c).sum() + (replica.bias * c).sum())
        for replica, c in zip(replicas, weights)
    )
    loss.backward()
    assert torch.equal(model.weight.grad, torch.full((3, 4), sum(weights)))
    assert torch.equal(model.bias.grad, torch.full((3,), sum(weights)))


def test_backward_through_replica_outputs_equals_single_device_gradient():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    x = torch.randn(8, 4)
    expected = torch.autograd.grad(model(x).pow(2).sum(), model.weight)[0]
    replicas = dpkit.replicate(model, lanes(2))
    loss = sum(replica(part).pow(2).sum() for replica, part in zip(replicas, x.chunk(2)))
    loss.backward()
    torch.testing.assert_close(model.weight.grad, expected)


# --------------------------------------------------------------------------------------
# parallel_apply


class Recorder(nn.Module):
    """Records where and how it was called; returns its input times ``factor``."""

    def __init__(self, factor: float = 1.0, delay: float = 0.0) -> None:
        super().__init__()
        self.factor = factor
        self.delay = delay
        self.calls: list[dict] = []

    def forward(self, *args, **kwargs):
        self.calls.append(
            {
                # The Thread object, not its ident: an ident is reused once a thread ends,
                # which on a busy machine can be before the next worker starts.
                "thread": threading.current_thread(),
                "device": dpkit.current_device(),
                "num_args": len(args),
                "args": args,
                "kwargs": kwargs,
                "grad_enabled": torch.is_grad_enabled(),
            }
        )
        time.sleep(self.delay)
        return args[0] * self.factor * kwargs.get("scale", 1)


def test_parallel_apply_returns_results_in_replica_order():
    # Replica 0 sleeps longest, so the workers finish in reverse order.
    modules = [Recorder(factor=i + 1, delay=0.03 * (3 - i)) for i in range(4)]
    inputs = [torch.full((2,), 10.0 * i) for i in range(4)]
    outputs = dpkit.parallel_apply(modules, inputs, devices=lanes(4))
    assert [o.tolist() for o in outputs] == [[10.0 * i * (i + 1)] * 2 for i in range(4)]


def test_parallel_apply_runs_each_replica_in_its_own_thread():
    modules = [Recorder(delay=0.01) for _ in range(3)]
    dpkit.parallel_apply(modules, [torch.ones(1)] * 3, devices=lanes(3))
    threads = [m.calls[0]["thread"] for m in modules]
    assert len(set(threads)) == 3
    assert threading.current_thread() not in threads


def test_parallel_apply_with_one_replica_runs_in_the_calling_thread():
    module = Recorder()
    dpkit.parallel_apply([module], [torch.ones(1)], devices=lanes(1))
    assert module.calls[0]["thread"] is threading.current_thread()
    assert module.calls[0]["device"] == lanes(1)[0]


def test_current_device_inside_forward_is_the_lane():
    modules = [Recorder() for _ in range(4)]
    dpkit.parallel_apply(modules, [torch.ones(1)] * 4, devices=lanes(4))
    assert [m.calls[0]["device"] for m in modules] == lanes(4)
    assert dpkit.current_device() is None


def test_parallel_apply_without_devices_runs_where_the_inputs_live():
    modules = [Recorder() for _ in range(4)]
    chunks = dpkit.scatter(torch.randn(8, 2), lanes(4))
    dpkit.parallel_apply(modules, chunks)
    assert [m.calls[0]["device"] for m in modules] == lanes(4)


def test_parallel_apply_unpacks_tuples_but_not_a_lone_tensor():
    modules = [Recorder() for _ in range(3)]
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    dpkit.parallel_apply(modules, [(a, b), a, [a, b]], devices=lanes(3))
    assert modules[0].calls[0]["num_args"] == 2
    assert modules[0].calls[0]["args"][1] is b
    assert modules[1].calls[0]["num_args"] == 1  # not unpacked into its 3 rows
    assert modules[1].calls[0]["args"][0] is a
    assert modules[2].calls[0]["num_args"] == 2  # lists are unpacked, as in torch


def test_parallel_apply_passes_kwargs_per_replica():
    modules = [Recorder(), Recorder()]
    outputs = dpkit.parallel_apply(
        modules,
        [torch.ones(2), torch.ones(2)],
        kwargs_tup=({"scale": 2}, {"scale": 5}),
        devices=lanes(2),
    )
    assert [o.tolist() for o in outputs] == [[2.0, 2.0], [5.0, 5.0]]


@pytest.mark.parametrize("grad_mode", [True, False])
def test_parallel_apply_carries_grad_mode_into_workers(grad_mode):
    modules = [Recorder(), Recorder()]
    with torch.set_grad_enabled(grad_mode):
        dpkit.parallel_apply(modules, [torch.ones(1)] * 2, devices=lanes(2))
    assert [m.calls[0]["grad_enabled"] for m in modules] == [grad_mode, grad_mode]


class Boom(RuntimeError):
    pass


class Explodes(nn.Module):
    def forward(self, x):
        raise Boom("row 7 has a NaN")


@pytest.mark.parametrize("failing", [0, 2])
def test_parallel_apply_reraises_with_type_replica_and_device(failing):
    modules = [Recorder() for _ in range(3)]
    modules[failing] = Explodes()
    with pytest.raises(Boom, match=rf"in replica {failing} on device virtual:{failing}") as error:
        dpkit.parallel_apply(modules, [torch.ones(1)] * 3, devices=lanes(3))
    assert "row 7 has a NaN" in str(error.value)


def test_parallel_apply_single_replica_error_names_the_replica():
    with pytest.raises(Boom, match=r"in replica 0 on device virtual:0"):
        dpkit.parallel_apply([Explodes()], [torch.ones(1)], devices=lanes(1))


# --------------------------------------------------------------------------------------
# gather


def _lane_outputs(pieces, devices=None):
    """Put each piece on its lane, as a replica's output would be, via parallel_apply."""
    devices = devices or lanes(len(pieces))
    identities = [Recorder() for _ in pieces]
    return dpkit.parallel_apply(identities, [(piece,) for piece in pieces], devices=devices)


@pytest.mark.parametrize("dim", [0, 1, -1, -2])
def test_gather_concatenates_along_dim(dim):
    pieces = [torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4)]
    if dim in (0, -2):
        pieces.append(torch.randn(1, 4))
    else:
        pieces.append(torch.randn(3, 2))
    outputs = _lane_outputs(pieces)
    gathered = dpkit.gather(outputs, lanes(4)[0], dim=dim)
    assert torch.equal(gathered, torch.cat(pieces, dim=dim))


@pytest.mark.parametrize("rows", [2, 512])  # 512: a gathered 6.4 MB, in a lane's reused block
def test_gather_keeps_channels_last_where_every_piece_has_it_as_torch_does(rows):
    # torch's comm.gather allocates in the first piece's suggested memory format when every
    # piece has it, else contiguous (comm.cpp); a channels_last CNN's output stays so
    def images(n, channels_last):
        image = torch.randn(n, 8, 14, 14)
        return image.to(memory_format=torch.channels_last) if channels_last else image

    last = torch.channels_last
    pieces = [images(rows, True) for _ in range(3)]
    gathered = dpkit.gather(_lane_outputs(pieces), lanes(3)[0])
    assert gathered.is_contiguous(memory_format=last) and not gathered.is_contiguous()
    assert torch.equal(gathered, torch.cat(pieces))
    mixed = [images(rows, True), images(rows, False), images(rows, True)]
    gathered = dpkit.gather(_lane_outputs(mixed), lanes(3)[0])
    assert gathered.is_contiguous() and torch.equal(gathered, torch.cat(mixed))
    # along the channels, whose sizes differ: the result's strides are its own shape's
    wide = [images(rows, True), images(rows, True)[:, :3].contiguous(memory_format=last)]
    gathered = dpkit.gather(_lane_outputs(wide), lanes(2)[0], dim=1)
    assert gathered.is_contiguous(memory_format=last) and torch.equal(gathered, torch.cat(wide, 1))


def test_gather_keeps_channels_last_3d_for_volumes():
    last = torch.channels_last_3d
    pieces = [torch.randn(2, 4, 3, 5, 6).to(memory_format=last) for _ in range(3)]
    gathered = dpkit.gather(_lane_outputs(pieces), lanes(3)[0])
    assert gathered.is_contiguous(memory_format=last) and not gathered.is_contiguous()
    assert torch.equal(gathered, torch.cat(pieces))


@pytest.mark.parametrize(
    "second, got", [(torch.full((1,), 10.0), "1"), (torch.ones(1, 3), "1x3")]
)  # fmt: skip
def test_reduce_add_refuses_tensors_of_another_size_with_torchs_words(second, got):
    # shapes that broadcast would sum silently: ones(3) + full((1,), 10) is [11, 11, 11]
    devices = lanes(2)
    with pytest.raises(ValueError, match=f"^input 1 has invalid size: got {got}, but expected 3$"):
        dpkit.comm.reduce_add([[torch.ones(3)], [second]], devices[0], devices)


@pytest.mark.parametrize("target", ["cpu", 0])
def test_gather_to_host_or_lane_zero_is_plain_cpu(target):
    pieces = [torch.randn(2, 2), torch.randn(2, 2)]
    gathered = dpkit.gather(_lane_outputs(pieces), target)
    assert gathered.device == torch.device("cpu")
    assert torch.equal(gathered, torch.cat(pieces))


def test_gather_to_minus_one_means_the_host_as_in_torch():
    # torch.cuda.comm.gather reads destination=-1 as "the CPU" (deprecated spelling); it must
    # never become a lane "virtual:-1". A clear error naming target_device is also fine.
    pieces = [torch.randn(2, 2), torch.randn(2, 2)]
    outputs = _lane_outputs(pieces)
    try:
        gathered = dpkit.gather(outputs, -1)
    except (ValueError, TypeError) as error:
        assert "target_device" in str(error)
    else:
        assert torch.equal(gathered, torch.cat(pieces))
        assert dpkit.device_of(gathered).kind == "host"


def test_gather_of_dicts_keeps_type_and_keys():
    a = [torch.randn(2, 3), torch.randn(1, 3)]
    b = [torch.randn(2), torch.randn(1)]
    outputs = [OrderedDict(logits=a[0], loss=b[0]), OrderedDict(logits=a[1], loss=b[1])]
    gathered = dpkit.gather(outputs, lanes(2)[0])
    assert type(gathered) is OrderedDict and list(gathered) == ["logits", "loss"]
    assert torch.equal(gathered["logits"], torch.cat(a))
    assert torch.equal(gathered["loss"], torch.cat(b))


def test_gather_of_namedtuples_lists_tuples_and_none():
    x = [torch.randn(2, 3), torch.randn(2, 3)]
    y = [torch.randn(2), torch.randn(2)]
    gathered = dpkit.gather([Batch(x[0], y[0]), Batch(x[1], y[1])], lanes(2)[0])
    assert type(gathered) is Batch
    assert torch.equal(gathered.features, torch.cat(x)) and torch.equal(
        gathered.labels, torch.cat(y)
    )

    gathered = dpkit.gather([[x[0], None], [x[1], None]], lanes(2)[0])
    assert type(gathered) is list and gathered[1] is None
    assert torch.equal(gathered[0], torch.cat(x))

    gathered = dpkit.gather([(x[0], (y[0],)), (x[1], (y[1],))], lanes(2)[0])
    assert type(gathered) is tuple and type(gathered[1]) is tuple
    assert torch.equal(gathered[1][0], torch.cat(y))

    assert dpkit.gather([None, None], lanes(2)[0]) is None


def test_gather_of_dicts_with_different_key_counts():
    outputs = [{"a": torch.ones(1)}, {"a": torch.ones(1), "b": torch.ones(1)}]
    with pytest.raises(ValueError, match=r"^All dicts must have the same number of keys"):
        dpkit.gather(outputs, lanes(2)[0])


@dataclasses.dataclass
class Prediction:
    logits: torch.Tensor


@pytest.mark.parametrize(
    "outputs, type_name, advice",
    [
        (
            [Prediction(torch.ones(1)), Prediction(torch.ones(1))],
            "Prediction",
            r"dict or a namedtuple",
        ),
        (["cat", "dog"], "str", r"return tensors"),
        ([3, 4], "int", r"torch\.tensor\(x\)"),
    ],
    ids=["dataclass", "str", "int"],
)
def test_gather_of_ungatherable_outputs_says_what_to_return(outputs, type_name, advice):
    with pytest.raises(TypeError, match=type_name) as error:
        dpkit.gather(outputs, lanes(2)[0])
    assert error.match(advice)


def test_gather_of_scalars_gives_a_vector_with_a_warning_and_squeezed_grads():
    x = torch.randn(10, requires_grad=True)
    chunks = dpkit.scatter(x, lanes(4))

    class Total(nn.Module):
        def forward(self, part):
            return part.sum()

    scalars = dpkit.parallel_apply([Total() for _ in chunks], chunks, devices=lanes(4))
    for scalar in scalars:
        assert scalar.dim() == 0
        scalar.retain_grad()
    with pytest.warns(UserWarning, match=r"scalars.*unsqueeze and return a vector"):
        vector = dpkit.gather(scalars, lanes(4)[0])
    assert vector.shape == (4,)
    torch.testing.assert_close(vector, torch.stack([piece.sum() for piece in x.detach().chunk(4)]))
    upstream = torch.tensor([1.0, 2.0, 3.0, 4.0])
    vector.backward(upstream)
    for scalar, expected in zip(scalars, upstream):
        assert scalar.grad.shape == ()
        assert scalar.grad.item() == expected.item()
    assert x.grad.tolist() == [1.0] * 3 + [2.0] * 3 + [3.0] * 3 + [4.0]


@pytest.mark.skipif(
    "MUTANT_UNDER_TEST" in os.environ, reason="mutmut's trampolines add frames to every call"
)
def test_the_scalar_gather_warning_names_the_frame_torchs_names():
    """torch's Gather warns with stacklevel=2: the line a user is shown is in autograd's
    Function.apply (torch/autograd/function.py), and so is dpkit's, past its class decorator."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dpkit.gather([torch.tensor(1.0), torch.tensor(2.0)], lanes(2)[0])
    assert [Path(w.filename).parts[-3:] for w in caught] == [("torch", "autograd", "function.py")]


def test_gather_backward_scatters_the_gradient_back_to_each_piece():
    pieces = [torch.randn(3, 2, requires_grad=True) for _ in range(3)] + [
        torch.randn(1, 2, requires_grad=True)
    ]
    outputs = _lane_outputs(pieces)
    gathered = dpkit.gather(outputs, lanes(4)[0])
    upstream = torch.randn(10, 2)
    gathered.backward(upstream)
    for piece, expected in zip(pieces, upstream.split([3, 3, 3, 1])):
        assert torch.equal(piece.grad, expected)


def test_gather_dim_one_backward():
    pieces = [torch.randn(2, 3, requires_grad=True), torch.randn(2, 1, requires_grad=True)]
    gathered = dpkit.gather(_lane_outputs(pieces), lanes(2)[0], dim=1)
    upstream = torch.randn(2, 4)
    gathered.backward(upstream)
    assert torch.equal(pieces[0].grad, upstream[:, :3])
    assert torch.equal(pieces[1].grad, upstream[:, 3:])


# --------------------------------------------------------------------------------------
# bytes moved


def test_replicate_broadcasts_parameter_bytes_to_lanes_one_to_three():
    model = nn.Linear(5, 3)  # (15 + 3) float32 = 72 bytes of parameters
    devices = lanes(4)
    with recorded_transfers() as log:
        dpkit.replicate(model, devices)
    assert {t.op for t in log} == {"broadcast"}
    assert sum(t.nbytes for t in log) == 3 * 72
    for lane in devices[1:]:
        assert sum(t.nbytes for t in log if t.destination == lane) == 72
    assert not any(t.destination == devices[0] for t in log)


def test_replicate_broadcasts_buffers_too():
    model = nn.BatchNorm1d(4)  # weight, bias, running_mean, running_var: 16 float32; + int64
    with recorded_transfers() as log:
        dpkit.replicate(model, lanes(3))
    assert {t.op for t in log} == {"broadcast"}
    assert sum(t.nbytes for t in log) == 2 * (16 * 4 + 8)


def test_backward_reduce_adds_gradient_bytes_from_lanes_one_to_three():
    model = nn.Linear(5, 3)
    devices = lanes(4)
    replicas = dpkit.replicate(model, devices)
    loss = sum(
        (replica.weight.sum() + replica.bias.sum()) * (i + 1) for i, replica in enumerate(replicas)
    )
    with recorded_transfers() as log:
        loss.backward()
    reduce = [t for t in log if t.op == "reduce"]
    assert sum(t.nbytes for t in reduce) == 3 * 72
    assert {t.source for t in reduce} == set(devices[1:])
    assert all(t.destination == devices[0] for t in reduce)
    assert torch.equal(model.bias.grad, torch.full((3,), 10.0))


def test_gather_copies_outputs_of_lanes_one_to_three():
    devices = lanes(4)
    pieces = [torch.randn(3, 5), torch.randn(3, 5), torch.randn(3, 5), torch.randn(1, 5)]
    outputs = _lane_outputs(pieces, devices)
    with recorded_transfers() as log:
        dpkit.gather(outputs, devices[0])
    assert {t.op for t in log} == {"gather"}
    assert [t.source for t in log] == devices[1:]
    assert sum(t.nbytes for t in log) == (3 + 3 + 1) * 5 * 4


def test_gather_backward_sends_gradient_slices_to_lanes_one_to_three():
    devices = lanes(4)
    pieces = [torch.randn(3, 5, requires_grad=True) for _ in range(3)] + [
        torch.randn(1, 5, requires_grad=True)
    ]
    gathered = dpkit.gather(_lane_outputs(pieces, devices), devices[0])
    with recorded_transfers() as log:
        gathered.sum().backward()
    moved_to_lanes = [t for t in log if t.destination in devices[1:]]
    assert sorted(t.destination.index for t in moved_to_lanes) == [1, 2, 3]
    assert sum(t.nbytes for t in moved_to_lanes) == (3 + 3 + 1) * 5 * 4
