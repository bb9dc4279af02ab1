"""Properties of chunk planning and of the scatter/gather round trip, over shapes nobody picked."""

from __future__ import annotations

import math
from fractions import Fraction

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes import lanes

import dpkit

FAST = settings(max_examples=60, deadline=None)

shapes = st.lists(st.integers(1, 12), min_size=1, max_size=3)
device_counts = st.integers(1, 8)


@st.composite
def tensor_and_dim(draw):
    shape = draw(shapes)
    dim = draw(st.integers(-len(shape), len(shape) - 1))
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator), dim


@FAST
@given(tensor_and_dim(), device_counts)
def test_scatter_then_gather_on_lane_zero_is_the_identity(case, num_devices):
    x, dim = case
    devices = lanes(num_devices)
    chunks = dpkit.scatter(x, devices, dim=dim)
    expected_chunks = x.chunk(num_devices, dim=dim)
    assert len(chunks) == len(expected_chunks)
    for chunk, piece in zip(chunks, expected_chunks):
        assert torch.equal(chunk, piece)
    gathered = dpkit.gather(list(chunks), devices[0], dim=dim)
    assert gathered.shape == x.shape
    assert torch.equal(gathered, x)


@FAST
@given(tensor_and_dim(), device_counts)
def test_balanced_scatter_then_gather_is_the_identity(case, num_devices):
    x, dim = case
    devices = lanes(num_devices)
    chunks = dpkit.scatter(x, devices, dim=dim, chunk_sizes="balanced")
    sizes = [c.shape[dim] for c in chunks]
    assert sum(sizes) == x.shape[dim]
    assert max(sizes) - min(sizes) <= 1
    assert torch.equal(dpkit.gather(list(chunks), devices[0], dim=dim), x)


@FAST
@given(tensor_and_dim(), device_counts, st.integers(0, 2**16))
def test_gradients_flow_through_scatter_and_gather(case, num_devices, seed):
    x, dim = case
    x.requires_grad_(True)
    devices = lanes(num_devices)
    gathered = dpkit.gather(list(dpkit.scatter(x, devices, dim=dim)), devices[0], dim=dim)
    gathered.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))

    x.grad = None
    upstream = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed))
    gathered = dpkit.gather(list(dpkit.scatter(x, devices, dim=dim)), devices[0], dim=dim)
    gathered.backward(upstream)
    assert torch.equal(x.grad, upstream)


@FAST
@given(st.integers(1, 300), st.integers(1, 16))
def test_torch_chunk_sizes_equal_torch_chunk(size, num_devices):
    expected = [c.shape[0] for c in torch.arange(size).chunk(num_devices)]
    assert dpkit.torch_chunk_sizes(size, num_devices) == expected


@FAST
@given(st.integers(1, 300), st.integers(1, 16))
def test_balanced_chunk_sizes_are_a_fair_plan(size, num_devices):
    sizes = dpkit.balanced_chunk_sizes(size, num_devices)
    assert sum(sizes) == size
    assert len(sizes) == min(size, num_devices)
    assert all(isinstance(s, int) and s >= 1 for s in sizes)
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # larger chunks first


float_weights = st.floats(0.01, 100.0, allow_nan=False, allow_infinity=False)
int_weights = st.integers(1, 10)


@st.composite
def size_and_weights(draw, weight=float_weights):
    num_devices = draw(st.integers(1, 12))
    weights = draw(st.lists(weight, min_size=num_devices, max_size=num_devices))
    size = draw(st.integers(1, 300))
    return size, num_devices, weights


@FAST
@given(size_and_weights())
def test_weighted_chunk_sizes_are_a_valid_plan(case):
    size, num_devices, weights = case
    sizes = dpkit.weighted_chunk_sizes(size, num_devices, weights=weights)
    assert sum(sizes) == size
    assert 1 <= len(sizes) <= num_devices
    assert all(isinstance(s, int) and s >= 1 for s in sizes)
    if size >= num_devices:
        assert len(sizes) == num_devices  # every device gets a row while there are enough


@FAST
@given(size_and_weights(weight=int_weights))
def test_weighted_chunk_sizes_round_exact_shares_to_a_neighbour(case):
    # Largest-remainder rounding: each device gets its exact share rounded down or up.
    # Only checked where every share is at least one row, so "at least one row each"
    # does not have to bend the proportions.
    size, num_devices, weights = case
    shares = [Fraction(size * w, sum(weights)) for w in weights]
    if min(shares) < 1:
        return
    sizes = dpkit.weighted_chunk_sizes(size, num_devices, weights=weights)
    for got, share in zip(sizes, shares):
        assert math.floor(share) <= got <= math.ceil(share), (sizes, [float(s) for s in shares])


@FAST
@given(st.integers(1, 200), device_counts)
def test_plan_chunks_default_matches_scatter_of_torch_chunk(size, num_devices):
    chunks = dpkit.scatter(torch.zeros(size, 1), lanes(num_devices))
    assert [c.shape[0] for c in chunks] == [
        c.shape[0] for c in torch.zeros(size).chunk(num_devices)
    ]
    assert [dpkit.device_of(c) for c in chunks] == lanes(num_devices)[: len(chunks)]
