"""Grader for task 1: chunk planning and scatter of nested inputs.

Each check tests one function: the scatter_tensor checks run with torch.chunk's sizes in
place of the student's chunk_sizes, the scatter checks with a reference scatter_tensor, so
one wrong chunk_sizes fails only the chunk_sizes checks and every hint names the function
that is wrong. Under ``dpkit grade`` every check is decided by the grader's parent process,
from the values sent back on inputs it chose (:data:`dpkit.grading.decided.CHECKS`), the
shared objects' identity as the index of the input object in each place
(:mod:`dpkit.grading.identity`).
"""

import copy
import math
import traceback
from collections import OrderedDict, namedtuple
from pathlib import Path

import pytest
import torch

from dpkit.comm import copy_to
from dpkit.grading import decided, gradients, identity, outputs, shapes, structure
from dpkit.grading.rules import lent
from dpkit.lanes import resides_on

pytestmark = pytest.mark.task1
EXERCISE = "task1_scatter.py"
FORBIDDEN = (
    "dpkit.chunk_plans.torch_chunk_sizes",
    "dpkit.chunk_plans.plan_chunks",
    "dpkit.scatter.scatter",
    "dpkit.scatter.scatter_kwargs",
    "dpkit.comm.scatter",
    "dpkit._functions.Scatter.apply",
    # torch.chunk by every spelling this torch has (a missing one is skipped; a guard that
    # cannot be put in place stops the run: dpkit.grading.rules._guard_name)
    "torch.chunk",
    "torch.Tensor.chunk",
    "torch._C.TensorBase.chunk",
    "torch._C._VariableFunctions.chunk",
    "torch.ops.aten.chunk",
    "torch._refs.chunk",
    "torch.unsafe_chunk",
    "torch.Tensor.unsafe_chunk",
    "torch._C.TensorBase.unsafe_chunk",
    "torch._C._VariableFunctions.unsafe_chunk",
    "torch.ops.aten.unsafe_chunk",
)

Pair = namedtuple("Pair", ["image", "label"])


NOT_FOUND = -1  # a place that holds none of the objects (as identity.index_of says)


def reference_sizes(batch: int, num_devices: int) -> list[int]:
    """torch.chunk's sizes, computed (the student's code may call this; it may not chunk)."""
    rows = math.ceil(batch / num_devices)  # a tensor's rows: never below 0
    return [min(rows, batch - start) for start in range(0, batch, rows)] if rows else []


def reference_scatter_tensor(tensor, devices, dim=0):
    sizes = reference_sizes(tensor.shape[dim], len(devices))
    return tuple(copy_to(p, d, "scatter") for p, d in zip(tensor.split(sizes, dim), devices))


@pytest.fixture
def with_torch_sizes(exercise, monkeypatch):
    """The student's module, its chunk_sizes replaced by torch.chunk's sizes."""
    monkeypatch.setattr(exercise, "chunk_sizes", lent(reference_sizes))
    return exercise


@pytest.fixture
def with_reference_scatter_tensor(exercise, monkeypatch):
    """The student's module, its chunk_sizes and scatter_tensor replaced by references."""
    monkeypatch.setattr(exercise, "chunk_sizes", lent(reference_sizes))
    monkeypatch.setattr(exercise, "scatter_tensor", lent(reference_scatter_tensor))
    return exercise


def test_chunk_sizes_examples(exercise, request):
    """chunk_sizes matches torch.chunk on the classic examples"""
    nodeid = request.node.nodeid
    pairs = decided.inputs_here(nodeid)  # (10, 4), (6, 4), ... judged by the parent
    answers = [[int(size) for size in exercise.chunk_sizes(*pair)] for pair in pairs]
    decided.answer(nodeid, pairs, decided.pack_sizes(answers))


def test_chunk_sizes_property(exercise, request):
    """chunk_sizes matches torch.chunk for any batch and device count"""
    nodeid = request.node.nodeid
    pairs = decided.inputs_here(nodeid)  # a hundred, smallest first, judged by the parent
    answers = [[int(size) for size in exercise.chunk_sizes(*pair)] for pair in pairs]
    decided.answer(nodeid, pairs, decided.pack_sizes(answers))


def test_scatter_tensor_places_chunks(with_torch_sizes, lanes, request):
    """scatter_tensor puts chunk i on lane i with the right rows"""
    # The rows are judged by the grader's parent on a tensor it chose; the lanes, here.
    nodeid = request.node.nodeid
    inputs = decided.inputs_here(nodeid)
    x = outputs.scatter_input(*inputs)
    chunks = with_torch_sizes.scatter_tensor(x, lanes)
    decided.answer(nodeid, inputs, outputs.listed("chunk", chunks))
    for index, chunk in enumerate(chunks):
        assert resides_on(chunk, lanes[index]), (
            f"chunk {index} is not on lane {index}: move it with copy_to(chunk, devices[i], "
            "'scatter')"
        )
    # torch's scatter hands the chunk already on its device back as a view of the input
    assert chunks[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr(), (
        "chunk 0 is a copy of the input's rows: lane 0 holds the input already, so its chunk "
        "is a view of it (the split's piece, which copy_to hands back as it is); copy only "
        "what goes to the other lanes"
    )


def test_scatter_tensor_counts_bytes(with_torch_sizes, lanes, transfers, request):
    """scatter_tensor copies every chunk except lane 0's, once"""
    # The grader's parent chose the sizes and decides from the copies sent back; the same
    # judge gives the hint here (dpkit.grading.decided).
    nodeid = request.node.nodeid
    rows, columns, count = inputs = decided.inputs_here(nodeid)
    with_torch_sizes.scatter_tensor(torch.randn(rows, columns), lanes[:count])
    decided.answer(nodeid, inputs, decided.pack_transfers(transfers))


def test_scatter_tensor_dim_and_small_batch(with_torch_sizes, lanes, request):
    """scatter_tensor splits along dim and leaves devices idle for a small batch"""
    nodeid = request.node.nodeid
    inputs = decided.inputs_here(nodeid)
    wide, small = shapes.dim_tensors(*inputs)
    along = with_torch_sizes.scatter_tensor(wide, lanes, dim=1)
    few = with_torch_sizes.scatter_tensor(small, lanes)
    decided.answer(nodeid, inputs, {**outputs.listed("dim", along), **outputs.listed("small", few)})


def test_scatter_tensor_gradients(with_torch_sizes, lanes, request):
    """gradients flow back from the chunks to the input"""
    nodeid = request.node.nodeid
    rows, columns, seed = inputs = decided.inputs_here(nodeid)
    x = torch.randn(rows, columns, requires_grad=True)
    chunks = with_torch_sizes.scatter_tensor(x, lanes)
    assert all(chunk.requires_grad for chunk in chunks), (
        "a chunk of a tensor that requires grad does not: do not detach the chunks"
    )
    weights = gradients.chunk_weights(rows, columns, seed)
    sum((weight * chunk).sum() for weight, chunk in zip(weights, chunks)).backward()
    decided.answer(nodeid, inputs, {"grad": x.grad})


def test_scatter_containers(with_reference_scatter_tensor, lanes, request):
    """scatter splits tuples, lists and dicts element by element"""
    # The grader's parent chose the batch and compares the structures and pieces sent back
    # (dpkit.grading.structure).
    exercise = with_reference_scatter_tensor
    nodeid = request.node.nodeid
    inputs = decided.inputs_here(nodeid)
    x, y = structure.scatter_tensors(*inputs)
    per_device = exercise.scatter((x, [y, x]), lanes)
    dicts = exercise.scatter(OrderedDict(a=x, b=y), lanes)
    columns = exercise.scatter([x.t()], lanes, dim=1)  # dim, passed on to the list's element
    sent = {**structure.pack([*per_device, *dicts]), **structure.pack(columns, structure.DIM)}
    # and to a tuple's, a plain dict's and a namedtuple's elements (DataParallel(dim=1)
    # scatters its inputs as a tuple)
    for prefix, given in zip(structure.DIMS, ((x.t(),), {"c": x.t()})):
        sent.update(structure.pack(exercise.scatter(given, lanes, dim=1), prefix))
    decided.answer(nodeid, inputs, sent)


def test_scatter_namedtuple_and_shared_objects(with_reference_scatter_tensor, lanes, request):
    """scatter keeps namedtuples and shares other objects by reference"""
    # The parent chose the rows, the label and how many objects are shared; it judges, for
    # every entry, which input object is in each place (identity as an index) and the
    # image chunks (dpkit.grading.identity).
    exercise = with_reference_scatter_tensor
    nodeid = request.node.nodeid
    rows, columns, seed, label, count = inputs = decided.inputs_here(nodeid)
    shared = [{"not": "a tensor", "copy": i}.keys() for i in range(count)]  # not containers
    given = [label, *shared]
    batch = Pair(image=identity.shared_image(rows, columns, seed), label=label)
    try:
        per_device = exercise.scatter((batch, *shared), lanes)
    except TypeError as error:
        if not copied(error):
            raise
        raise AssertionError(
            f"scatter tried to copy an object that is not a tensor or a container ({error}, "
            "from the copy module): other objects are shared by reference, the same object "
            "in every entry, not copied"
        ) from error
    places, values, width = [], {}, 3 + count
    for index, entry in enumerate(per_device):
        parts = list(entry) if type(entry) is tuple else []
        pair = parts[0] if parts else None
        row = [0 if type(entry) is tuple else NOT_FOUND, 0 if type(pair) is Pair else NOT_FOUND]
        row.append(identity.index_of(getattr(pair, "label", None), given))
        row += [identity.index_of(part, given) for part in parts[1:]]
        places.append((row + [NOT_FOUND] * width)[:width])
        image = getattr(pair, "image", None)
        if isinstance(image, torch.Tensor):
            values[f"image{index}"] = image
    values["places"] = torch.tensor(places, dtype=torch.int64).reshape(-1, width)
    decided.answer(nodeid, inputs, values)
    # dim, passed on to a namedtuple's fields too
    turned = exercise.scatter(Pair(image=batch.image.t(), label=label), lanes, dim=1)
    want = [(columns, size) for size in reference_sizes(rows, len(lanes))]
    got = [tuple(getattr(getattr(entry, "image", None), "shape", ())) for entry in turned]
    # blamed on the namedtuple only where dim reaches a list's tensors (the containers check
    # names a dim lost before) and the entries stay Pairs (the parent names a lost type):
    # one mistake, one check
    listed = exercise.scatter([batch.image.t()], lanes, dim=1)
    reached = [tuple(entry[0].shape) for entry in listed if isinstance(entry, list) and entry]
    pairs = all(type(entry) is type(batch) for entry in turned)
    assert got == want or reached != want or not pairs, (
        f"scatter(Pair(image.T, label), lanes, dim=1) gave images of shapes {got}, expected "
        f"{want}: pass dim on to every scatter call made for a namedtuple's field"
    )


def copied(error: BaseException) -> bool:
    """Whether ``error`` was raised inside the copy module (copy.copy or copy.deepcopy of
    an object that cannot be copied, such as the dict_keys this check shares)."""
    here = Path(copy.__file__).resolve()
    frames = traceback.extract_tb(error.__traceback__)
    return any(Path(frame.filename).resolve() == here for frame in frames)
