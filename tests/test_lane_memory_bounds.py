"""The lanes' block pool (dpkit.lane_memory) keeps to its bounds and its rules.

Its documented bound: at most MAX_BYTES of blocks per lane, each counted at its storage's
size now (free ones evicted first, oldest first, only as many as needed); beyond it a copy
is a plain allocation. Its rule: only tensors whose copy is a plain clone take
blocks. Small bounds are set here so that the cases cost kilobytes, not the real 512 MiB.
"""

from __future__ import annotations

import pytest
import torch

from dpkit import lane_memory
from dpkit.device import virtual_devices

pytestmark = pytest.mark.skipif(
    lane_memory._REFS_WHEN_FREE is None, reason="this torch cannot count a storage's users"
)

KIB = 1024
LANE, OTHER = virtual_devices(3, on="cpu")[1:]


@pytest.fixture(autouse=True)
def small_pool(monkeypatch):
    """Blocks from 1 KiB, at most 3 KiB per lane, the pool empty before and after."""
    lane_memory.release()
    monkeypatch.setattr(lane_memory, "MIN_BYTES", KIB)
    monkeypatch.setattr(lane_memory, "MAX_BYTES", 3 * KIB)
    yield
    lane_memory.release()


def block(kib: int = 1, seed: int = 0) -> torch.Tensor:
    """A copy of ``kib`` KiB of float32 onto LANE, from the pool where it can be."""
    source = torch.randn(kib * KIB // 4, generator=torch.Generator().manual_seed(seed))
    copied = lane_memory.copy(source, LANE)
    assert copied is not None and torch.equal(copied, source)
    return copied


def test_a_lane_holds_up_to_its_bound_then_allocates_plainly():
    kept = [block(seed=i) for i in range(3)]  # exactly MAX_BYTES: all three pooled
    assert lane_memory.cached_bytes(LANE) == 3 * KIB
    fourth = block(seed=3)  # no room, nothing free: a plain tensor, outside the pool
    assert lane_memory.cached_bytes(LANE) == 3 * KIB
    assert fourth.data_ptr() not in {t.data_ptr() for t in kept}
    assert lane_memory.cached_bytes(OTHER) == 0  # another lane's bound is its own


def test_a_block_as_large_as_the_bound_fits_and_a_larger_one_is_plain():
    whole = block(kib=3)
    assert lane_memory.cached_bytes(LANE) == 3 * KIB
    del whole
    lane_memory.release()
    larger = block(kib=4)  # more than MAX_BYTES on an empty lane: never pooled
    assert lane_memory.cached_bytes(LANE) == 0
    assert larger.numel() == KIB


def test_free_blocks_are_evicted_only_as_far_as_the_new_one_needs():
    first, second = block(seed=1), block(seed=2)
    del first, second  # two free blocks of 1 KiB
    assert lane_memory.cached_bytes(LANE) == 2 * KIB
    large = block(kib=2)  # 2 + 2 > 3: one free block goes, the other stays
    assert lane_memory.cached_bytes(LANE) == 3 * KIB
    assert large.numel() == 2 * KIB // 4


def test_a_block_its_user_resized_counts_at_its_new_size_and_serves_that_size():
    grown = block()
    grown.resize_(2 * KIB // 4)  # the storage under the block grows to 2 KiB
    assert lane_memory.cached_bytes(LANE) == 2 * KIB  # counted as it is, not as it was
    del grown
    small = block(seed=5)  # 1 KiB: not the free block's size any more, a new block
    assert lane_memory.cached_bytes(LANE) == 3 * KIB
    twice = torch.arange(2 * KIB // 4, dtype=torch.float32)
    again = lane_memory.copy(twice, LANE)  # 2 KiB: the grown block, free, handed out again
    assert torch.equal(again, twice) and lane_memory.cached_bytes(LANE) == 3 * KIB
    assert again.untyped_storage().nbytes() == 2 * KIB
    del small, again


def test_release_empties_one_lane_or_all_and_a_lane_never_used_holds_nothing():
    never_used = virtual_devices(10, on="cpu")[9]
    lane_memory.release(never_used)  # nothing there: nothing to do
    assert lane_memory.cached_bytes(never_used) == 0
    free = block()
    del free
    other = lane_memory.copy(torch.ones(KIB // 4), OTHER)
    del other
    lane_memory.release(LANE)
    assert lane_memory.cached_bytes(LANE) == 0
    assert lane_memory.cached_bytes(OTHER) == KIB  # another lane's blocks stay
    lane_memory.release()
    assert lane_memory.cached_bytes() == 0


def test_empty_is_a_fresh_tensor_of_the_shape_and_dtype_asked_for():
    pooled = lane_memory.empty((16, 16), torch.float64, LANE)  # 2 KiB: from the pool
    assert pooled.shape == (16, 16) and pooled.dtype == torch.float64
    assert pooled.storage_offset() == 0 and pooled.is_contiguous()
    assert lane_memory.cached_bytes(LANE) == 2 * KIB
    small = lane_memory.empty((4,), torch.float64, LANE)  # under MIN_BYTES: torch.empty
    assert small.shape == (4,) and small.dtype == torch.float64 and small.device.type == "cpu"
    assert lane_memory.cached_bytes(LANE) == 2 * KIB  # not a block of the pool's


@pytest.mark.parametrize(
    "special",
    [
        lambda x: x.view(KIB // 8, 8).t(),  # not contiguous
        lambda x: torch.complex(x, x).conj(),  # a conjugate view: clone keeps the bit
        lambda x: torch._neg_view(x),  # a negative view: clone keeps the bit
        lambda x: torch.quantize_per_tensor(x, 0.1, 0, torch.qint32),
        lambda x: x.to_sparse(),  # not strided
    ],
    ids=["transposed", "conjugate", "negative", "quantized", "sparse"],
)
@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_tensors_whose_copy_is_not_a_plain_clone_keep_torchs_clone(special):
    tensor = special(torch.randn(KIB // 4 * 4))  # 4 KiB of float32 before the view
    assert lane_memory.copy(tensor, OTHER) is None
    assert lane_memory.cached_bytes(OTHER) == 0


def test_a_lane_fills_exactly_to_its_bound_without_evicting():
    free = block(seed=1)
    del free  # 1 KiB free
    block(kib=2)  # 1 + 2 = 3 KiB: room without evicting the free block
    assert lane_memory.cached_bytes(LANE) == 3 * KIB  # blocks in use or free
    fresh = virtual_devices(8, on="cpu")[7]  # a lane no test has used
    ones = torch.ones(3 * KIB // 4)
    assert torch.equal(lane_memory.copy(ones, fresh), ones)
    assert lane_memory.cached_bytes(fresh) == 3 * KIB  # its bound exactly, on a new lane


def test_a_lane_evicts_as_many_free_blocks_as_needed_and_no_more_than_exist():
    first, second = block(seed=1), block(seed=2)
    del first, second
    three = block(kib=3)  # both free blocks go: 0 + 3 KiB fits
    assert lane_memory.cached_bytes(LANE) == 3 * KIB
    del three
    lane_memory.release()
    kept, free = block(kib=2, seed=3), block(seed=4)
    del free  # 2 KiB in use, 1 KiB free
    plain = block(kib=2, seed=5)  # evicting the free block leaves 2 + 2 > 3: plain
    assert lane_memory.cached_bytes(LANE) == 2 * KIB  # the block in use, counted right
    assert kept.data_ptr() != plain.data_ptr()
    larger = lane_memory.copy(torch.ones(4 * KIB // 4), virtual_devices(9, on="cpu")[8])
    assert larger is not None and larger.numel() == KIB  # over the bound on a new lane: plain


def test_a_torch_whose_count_hides_a_tensors_use_pools_nothing(monkeypatch):
    # The pool knows a block is free from its Python reference count; a torch that does not
    # keep a storage's Python object referenced while tensors use it must switch pooling off.
    assert lane_memory._refs_of_a_free_block() == lane_memory._REFS_WHEN_FREE is not None
    monkeypatch.setattr(lane_memory, "sys", type("Sys", (), {"getrefcount": lambda obj: 3}))
    assert lane_memory._refs_of_a_free_block() is None
