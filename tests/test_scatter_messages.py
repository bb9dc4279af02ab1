"""scatter's bad-input errors, word for word (issue 18): each names what was wrong and the fix.
Found missing by mutation testing (issue 20): a changed word of these survived every test."""

from __future__ import annotations

import warnings

import pytest
import torch
from lanes import lanes

import dpkit
from dpkit.scatter import torch_chunk_sizes

BUFFER_FIX = (
    "keep a tensor that every replica needs whole in the module (e.g. module.register_buffer)"
)


def message(call) -> str:
    with pytest.raises((TypeError, ValueError)) as error:
        call()
    return str(error.value)


def test_inputs_of_two_batch_sizes_are_refused_even_on_two_devices_and_at_a_negative_dim():
    x, y = torch.randn(8, 3), torch.randn(6, 3)
    assert message(lambda: dpkit.scatter((x, y), lanes(2), dim=-2)) == (
        "scatter splits every tensor along dim=-2 into the same chunks, so all must have the "
        "same size there (the batch), but inputs[0] has 8, inputs[1] has 6 (torch would "
        "silently drop rows, or hand a replica a short tensor that broadcasts); pass tensors "
        f"of one batch size, and {BUFFER_FIX}, which replicate copies to every device"
    )


def test_a_nested_a_sparse_and_an_empty_input_get_their_own_fix():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: nested tensors are a prototype
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    assert message(lambda: dpkit.scatter(nested, lanes(2))) == (
        "cannot scatter a nested tensor: its rows have different shapes, so it has no size "
        "along dim=0 to split; pass x.to_padded_tensor(0.0) (and a mask if the module needs one)"
    )
    assert message(lambda: dpkit.scatter(torch.eye(3).to_sparse(), lanes(2))) == (
        "cannot scatter a sparse tensor (layout torch.sparse_coo); scatter splits dense "
        "tensors: pass x.to_dense(), or, if every replica needs the whole tensor, keep it in "
        "the module (e.g. module.register_buffer) instead of passing it as an input"
    )
    assert message(lambda: dpkit.scatter(torch.empty(0, 3), lanes(2))) == (
        "the input of shape (0, 3) is empty along dim=0, so there is nothing to split; pass a "
        "batch with at least one sample"
    )


def test_a_dim_or_a_size_of_the_wrong_type_is_named_with_its_type():
    assert message(lambda: dpkit.scatter(torch.randn(3, 4), lanes(2), dim=1.5)) == (
        "dim must be an int (the dimension to split and gather along), got 1.5 (float); "
        "pass e.g. dim=0"
    )
    assert message(lambda: torch_chunk_sizes(2.5, 2)) == (
        "size must be a number of rows (an int), got 2.5"
    )
    assert message(lambda: torch_chunk_sizes(True, 2)) == (
        "size must be a number of rows (an int), got True"
    )


def test_a_tensor_without_the_dim_is_left_out_of_the_batch_mismatch_not_a_crash():
    # The mismatch is found at inputs[1]; inputs[2] has no dim 1 and is not listed (an
    # IndexError from its missing dim would hide the message).
    inputs = (torch.zeros(4, 2), torch.zeros(4, 3), torch.zeros(4))
    assert message(lambda: dpkit.scatter(inputs, lanes(2), dim=1)) == (
        "scatter splits every tensor along dim=1 into the same chunks, so all must have the "
        "same size there (the batch), but inputs[0] has 2, inputs[1] has 3 (torch would "
        "silently drop rows, or hand a replica a short tensor that broadcasts); pass tensors "
        f"of one batch size, and {BUFFER_FIX}, which replicate copies to every device"
    )


def test_chunk_sizes_that_are_not_a_list_are_named_as_a_value_or_as_a_function_result():
    assert message(lambda: dpkit.plan_chunks(8, 2, chunk_sizes=8)) == (
        "chunk_sizes is 8, not a list of sizes; chunk_sizes must give a list of positive ints "
        "that add up to the batch size 8, e.g. [4, 4]"
    )
    assert message(lambda: dpkit.plan_chunks(8, 2, chunk_sizes=lambda size, n: size)) == (
        "the chunk_sizes function returned 8, not a list of sizes; chunk_sizes must give a "
        "list of positive ints that add up to the batch size 8, e.g. [4, 4]"
    )


def test_weights_that_are_not_positive_get_an_example_of_speeds():
    assert message(lambda: dpkit.weighted_chunk_sizes(8, 2, weights=[1, 0])) == (
        "weights must all be positive and finite, got [1, 0]; pass each device's relative "
        "speed, e.g. weights=[1, 1, 2, 2]"
    )


def test_no_rows_plan_no_chunks_where_torch_chunk_gives_empty_ones():
    # The documented difference from torch.chunk (see torch_chunk_sizes): no replica runs
    # on nothing. Zero rows are a plan, not an error; a negative count is refused.
    assert len(torch.empty(0).chunk(4)) == 4
    assert torch_chunk_sizes(0, 4) == []
    assert dpkit.plan_chunks(0, 4) == []
    assert dpkit.balanced_chunk_sizes(0, 4) == []
    assert message(lambda: dpkit.plan_chunks(-1, 4)) == (
        "size must be a number of rows (an int >= 0), got -1"
    )


def test_a_batch_mismatch_beside_a_nested_tensor_is_named_not_an_internal_error():
    # A nested tensor has no one size along dim: listing it raised torch's "Internal
    # error: NestedTensorImpl doesn't support sizes" in place of the mismatch.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: nested tensors are a prototype
        nested = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)])
    found = message(lambda: dpkit.scatter((torch.ones(4, 3), torch.ones(5, 3), nested), lanes(2)))
    assert "but inputs[0] has 4, inputs[1] has 5 (torch would" in found


def test_a_dim_beyond_the_input_names_the_input_and_its_shape():
    found = message(lambda: dpkit.scatter(torch.randn(3, 4), lanes(2), dim=2))
    assert "dim=2 is out of range for an input of shape (3, 4); use a dim between -2 and 1" in found
