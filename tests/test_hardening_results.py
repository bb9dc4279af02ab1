"""No silent wrong results (issue 18): inputs of different batch sizes, replicas returning
different structures, and no lane tag left on a tensor dpkit did not make."""

from __future__ import annotations

import pytest
import torch
from by_lane import Returns
from lanes import lanes
from torch import nn

import dpkit


class Scale(nn.Module):
    def forward(self, x, scale=None):
        return x * scale


def test_positional_inputs_of_different_batch_sizes_raise_naming_both():
    # torch zips 4 chunks of x with 3 of y: a 6-row output, 2 rows of x dropped, no word.
    model = nn.Bilinear(3, 3, 2)
    x, y = torch.randn(8, 3), torch.randn(6, 3)
    with pytest.raises(ValueError, match=r"inputs\[0\] has 8, inputs\[1\] has 6") as error:
        dpkit.data_parallel(model, (x, y), device_ids=lanes(4))
    assert error.match(r"dim=0.*same size.*pass tensors of one batch size")


@pytest.mark.parametrize("rows", [4, 6, 1])
def test_a_keyword_tensor_of_another_batch_size_raises_naming_it(rows):
    # 4 rows: each replica gets 2 rows of x and 1 of scale, which broadcasts silently;
    # 6 rows: torch ends in parallel_apply's "AssertionError: The number of modules 4 is not
    # equal to the number of kwargs_tup 3" (test_torch_claims runs it).
    parallel = dpkit.DataParallel(Scale(), device_ids=lanes(4))
    with pytest.raises(ValueError, match=rf"inputs\[0\] has 8, kwargs\['scale'\] has {rows}"):
        parallel(torch.randn(8, 3), scale=torch.randn(rows, 1))


def test_a_tensor_every_replica_needs_whole_works_as_a_buffer_as_the_error_suggests():
    class Scaled(nn.Module):
        def __init__(self, scale):
            super().__init__()
            self.register_buffer("scale", scale)

        def forward(self, x):
            return x * self.scale

    x, scale = torch.randn(8, 3), torch.randn(3)
    with pytest.raises(ValueError, match=r"module\.register_buffer"):
        dpkit.DataParallel(Scale(), device_ids=lanes(4))(x, scale=scale)
    output = dpkit.DataParallel(Scaled(scale), device_ids=lanes(4))(x)
    assert torch.equal(output, x * scale)


@pytest.mark.parametrize(
    "make, listed",
    [
        (lambda i, x: None if i == 0 else x, r"replica 0: None; replicas 1, 2, 3: a tensor"),
        (
            lambda i, x: {"a": x} if i == 0 else {"b": x},
            r"replica 0: a dict with keys \['a'\]; replicas 1, 2, 3: a dict with keys \['b'\]",
        ),
        (
            lambda i, x: x if i == 1 else (x,),
            r"replicas 0, 2, 3: a tuple of 1; replica 1: a tensor",
        ),
        (
            lambda i, x: (x, x) if i == 3 else (x,),
            r"replicas 0, 1, 2: a tuple of 1; replica 3: a tuple of 2",
        ),
        (
            lambda i, x: {"out": (x, None if i == 2 else x)},
            r"at output\['out'\]\[1\] \(replicas 0, 1, 3: a tensor; replica 2: None\)",
        ),
    ],
    ids=["None-vs-tensor", "dict-keys", "tensor-vs-tuple", "tuple-lengths", "nested"],
)
def test_replicas_returning_different_structures_get_one_error_naming_them(make, listed):
    with pytest.raises(ValueError, match=r"different structures") as error:
        dpkit.data_parallel(Returns(make), torch.randn(8, 2), device_ids=lanes(4))
    assert error.match(listed)
    assert error.match(r"make every replica return the same structure")


FIX = (
    "make every replica return the same structure: the same containers, lengths and keys, "
    "with tensors in the same places"
)


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda i, x: None if i < 2 else x,
            "gather cannot combine replica outputs of different structures (replicas 0, 1: "
            f"None; replicas 2, 3: a tensor); {FIX}",
        ),
        (
            lambda i, x: 3 if i == 2 else x,
            "gather cannot combine replica outputs of different structures (replicas 0, 1, 3: "
            f"a tensor; replica 2: a int); {FIX}",
        ),
        (
            lambda i, x: {"a": x} if i == 0 else None,
            "gather cannot combine replica outputs of different structures (replica 0: a dict "
            f"with keys ['a']; replicas 1, 2, 3: None); {FIX}",
        ),
        (
            lambda i, x: {"a": x} if i == 0 else {"b": x},
            "gather cannot combine replica outputs of different structures (replica 0: a dict "
            f"with keys ['a']; replicas 1, 2, 3: a dict with keys ['b']); {FIX}",
        ),
        (
            lambda i, x: {"a": x} if i == 0 else {"a": x, "b": x},
            "All dicts must have the same number of keys. gather cannot combine replica outputs "
            "of different structures (replica 0: a dict with keys ['a']; replicas 1, 2, 3: a "
            f"dict with keys ['a', 'b']); {FIX}",
        ),
    ],
    ids=["two-and-two", "an-int", "dict-vs-None", "same-count-other-keys", "key-counts"],
)
def test_the_whole_structure_message(make, message):
    # The whole text: the groups with their plural, what each returned, torch's own words
    # only where torch says them (dicts of different key counts), no path at the top.
    with pytest.raises(ValueError) as error:
        dpkit.data_parallel(Returns(make), torch.randn(8, 2), device_ids=lanes(4))
    assert str(error.value) == message  # exact: the grouping and plurals are what is tested


class Leaks(nn.Module):
    """Returns one of its own tensors next to a new one."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.randn(2, 3)  # a plain tensor attribute, shared by every replica
        self.register_buffer("offset", torch.zeros(3))

    def forward(self, x):
        return x * 2, self.table, self.offset


def test_a_replica_returning_the_users_tensors_leaves_them_untagged():
    module = Leaks()
    devices = lanes(2)
    replicas = dpkit.replicate(module, devices)
    outputs = dpkit.parallel_apply(replicas, [torch.ones(2, 3)] * 2, devices=devices)
    host = dpkit.device_of(torch.zeros(1))
    assert dpkit.device_of(module.table) == host  # not left on lane 1
    assert dpkit.device_of(module.offset) == host  # replica 0's buffer is the user's
    assert dpkit.device_of(outputs[1][0]) == devices[1]  # what replica 1 made is on lane 1
    assert outputs[1][1] is module.table


def test_parallel_apply_leaves_the_callers_inputs_untagged():
    inputs = [torch.ones(2), torch.ones(2)]
    dpkit.parallel_apply([nn.Identity(), nn.Identity()], inputs, devices=lanes(2))
    assert dpkit.device_of(inputs[1]) == dpkit.device_of(torch.zeros(1))


def test_onto_one_device_tensors_of_any_sizes_go_whole_as_in_torch():
    # Nothing is split onto one device, so nothing can be dropped or broadcast.
    x, table = torch.randn(8, 3), torch.randn(100, 3)
    (chunk,) = dpkit.scatter((x, table), lanes(1))
    assert torch.equal(chunk[0], x) and torch.equal(chunk[1], table)
