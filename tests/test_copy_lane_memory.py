"""Lanes reuse memory for their copies (dpkit.lane_memory) without changing what anyone sees.

A block is handed out again only when no tensor uses it: not while a tensor handed to a
user is alive, nor a view of it, nor a tensor autograd saved for backward. Expected values
come from the inputs (the chunks' own data, torch's clone) and never from the pool.
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

import dpkit
from dpkit import comm, lane_memory
from dpkit.device import virtual_devices

pytestmark = pytest.mark.skipif(
    lane_memory._REFS_WHEN_FREE is None, reason="this torch cannot count a storage's users"
)

ROWS, COLUMNS = 64, 16384  # 4 MiB of float32: chunks of 1 MiB, lane_memory.MIN_BYTES
LANES = virtual_devices(4, on="cpu")
SIZES = [ROWS // 4] * 4


@pytest.fixture(autouse=True)
def _empty_pool():
    lane_memory.release()
    yield
    lane_memory.release()


def batch(seed: int) -> torch.Tensor:
    return torch.randn(ROWS, COLUMNS, generator=torch.Generator().manual_seed(seed))


def pointers(tensors) -> set[int]:
    return {t.data_ptr() for t in tensors}


def test_a_freed_chunk_is_reused_by_the_next_scatter():
    first = comm.scatter(batch(0), LANES, SIZES, 0)
    used = pointers(first[1:])
    del first
    second = comm.scatter(batch(1), LANES, SIZES, 0)
    assert pointers(second[1:]) == used  # lanes 1-3 copied into the same blocks
    assert lane_memory.cached_bytes(LANES[1]) == second[1].nbytes  # one block, reused
    assert torch.equal(torch.cat(second), batch(1))


def test_a_chunk_alive_is_never_overwritten():
    x = batch(0)
    first = comm.scatter(x, LANES, SIZES, 0)
    second = comm.scatter(batch(1), LANES, SIZES, 0)
    assert not pointers(first[1:]) & pointers(second[1:])
    assert torch.equal(torch.cat(first), x)


def test_a_view_keeps_its_chunk_from_reuse():
    x = batch(0)
    first = comm.scatter(x, LANES, SIZES, 0)
    view = first[2][1:]
    del first
    comm.scatter(batch(1), LANES, SIZES, 0)
    assert torch.equal(view, x[SIZES[0] * 2 + 1 : SIZES[0] * 3])


def test_a_chunk_autograd_saved_is_not_reused_before_backward():
    x = batch(0)
    weight = torch.ones(COLUMNS, requires_grad=True)
    chunk = comm.scatter(x, LANES, SIZES, 0)[1]
    loss = (chunk * weight).sum()  # mul saves the chunk for weight's gradient
    del chunk
    for seed in (1, 2, 3):  # scatters that would take a free block of that size
        comm.scatter(batch(seed), LANES, SIZES, 0)
    loss.backward()
    assert torch.equal(weight.grad, x[SIZES[0] : 2 * SIZES[0]].sum(0))


def test_a_gathered_output_alive_is_never_overwritten():
    pieces = comm.scatter(batch(0), LANES, SIZES, 0)
    first = comm.gather(pieces, 0, LANES[0], LANES)
    other = comm.scatter(batch(1), LANES, SIZES, 0)
    second = comm.gather(other, 0, LANES[0], LANES)
    assert first.data_ptr() != second.data_ptr()
    assert torch.equal(first, batch(0)) and torch.equal(second, batch(1))


def test_a_copy_is_what_clone_gives():
    odd = torch.randn(1, ROWS * COLUMNS).as_strided((1, ROWS * COLUMNS), (7, 1))  # size-1 dim
    for tensor in (batch(0), batch(0).double(), odd, nn.Parameter(batch(0))):
        with torch.no_grad():
            copied, cloned = comm.copy_to(tensor, LANES[1], "test"), tensor.clone()
        assert type(copied) is type(cloned) and copied.stride() == cloned.stride()
        assert copied.dtype == cloned.dtype and torch.equal(copied, cloned)
        assert copied.untyped_storage().nbytes() == cloned.untyped_storage().nbytes()
        assert copied.requires_grad == cloned.requires_grad
    tracked = batch(0).requires_grad_()
    assert type(comm.copy_to(tracked, LANES[1], "test").grad_fn) is type(tracked.clone().grad_fn)
    columns = batch(0)[:, :100]  # not contiguous: torch's clone, contiguous like it
    assert comm.copy_to(columns, LANES[1], "test").is_contiguous()


def _traced_memory() -> list:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(COLUMNS, 16), nn.ReLU(), nn.Linear(16, 8))
    parallel = dpkit.DataParallel(model, device_ids=LANES)
    with dpkit.trace() as tr:
        for seed in range(2):
            parallel(batch(seed)).sum().backward()
    return [(r.device, r.category, r.nbytes, r.step) for r in tr.memory]


def test_the_trace_counts_the_same_bytes_with_reused_blocks():
    reused = _traced_memory()
    saved = lane_memory._REFS_WHEN_FREE
    lane_memory._REFS_WHEN_FREE = None  # every copy into a fresh allocation
    try:
        fresh = _traced_memory()
    finally:
        lane_memory._REFS_WHEN_FREE = saved
    assert lane_memory.cached_bytes() > 0
    assert reused == fresh


def test_release_gives_back_free_blocks_only():
    kept = comm.scatter(batch(0), LANES, SIZES, 0)
    dropped = comm.scatter(batch(1), LANES, SIZES, 0)
    del dropped
    chunk_bytes = kept[1].nbytes
    assert lane_memory.cached_bytes(LANES[1]) == 2 * chunk_bytes
    lane_memory.release()
    assert lane_memory.cached_bytes(LANES[1]) == chunk_bytes  # the block still in use stays
    assert torch.equal(torch.cat(kept), batch(0))


def test_threads_scattering_at_once_never_share_a_block():
    failures = []

    def scatter_and_check(seed: int) -> None:
        x = batch(seed)
        for _ in range(30):
            chunks = comm.scatter(x, LANES, SIZES, 0)
            other = comm.scatter(batch(seed + 100), LANES, SIZES, 0)  # frees and takes blocks
            if not torch.equal(torch.cat(chunks), x):
                failures.append(seed)
            del chunks, other

    threads = [threading.Thread(target=scatter_and_check, args=(seed,)) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
