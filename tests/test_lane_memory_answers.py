"""The lanes' block pool (dpkit.lane_memory): its import-time probe, its releaser's timing, a fork.

What a user relies on. The probe's answer is the count of a block no tensor uses, so a
pooled block is handed out again exactly when it is free, never while a tensor, a view, a
numpy array or a tensor autograd saved uses it; on a torch whose count does not show a
tensor's use, it answers None and nothing is pooled. The releaser gives the free blocks back
exactly IDLE_SECONDS after the last take, and while blocks stay in use it looks again once
per IDLE_SECONDS. A forked child's first copy starts a releaser of its own.

The probe's tests are not skipped where the probe answers None (the pool's other test files
are): on the course's torch that answer is the failure. The releaser's timing runs on a
simulated clock that its waits advance, so nothing sleeps.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

import pytest
import torch

from dpkit import lane_memory
from dpkit.device import virtual_devices

KIB = 1024
LANE = virtual_devices(2, on="cpu")[1]
VERSION = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
course_torch = pytest.mark.skipif(
    VERSION < (2, 13), reason="checked on the course's torch (2.13); older ones may not count"
)
counting = pytest.mark.skipif(
    lane_memory._REFS_WHEN_FREE is None, reason="this torch cannot count a storage's users"
)


def releaser_alive() -> bool:
    return any(thread.name == "dpkit-lane-memory" for thread in threading.enumerate())


def wait_until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@pytest.fixture
def small_pool(monkeypatch):
    """Blocks from 1 KiB; the pool empty and its thread gone before and after."""
    monkeypatch.setattr(lane_memory, "MIN_BYTES", KIB)
    lane_memory.release()  # wakes a releaser left by other tests: it ends on an empty pool
    assert wait_until(lambda: not releaser_alive(), seconds=5.0)
    yield
    lane_memory.release()
    assert wait_until(lambda: not releaser_alive(), seconds=5.0)


def block(seed: int) -> torch.Tensor:
    """A copy of 1 KiB of float32 onto LANE, from the pool."""
    source = torch.randn(KIB // 4, generator=torch.Generator().manual_seed(seed))
    copied = lane_memory.copy(source, LANE)
    assert copied is not None and torch.equal(copied, source)
    return copied


# --- the probe -------------------------------------------------------------------------


def free_blocks(blocks: list) -> int:
    """How many of ``blocks`` the pool would hand out again."""
    return len(lane_memory._free(blocks))


@course_torch
def test_the_probe_answers_the_count_of_a_free_block_on_the_course_torch():
    assert lane_memory._REFS_WHEN_FREE is not None  # None: pooling off, every copy fresh
    assert lane_memory._refs_of_a_free_block() == lane_memory._REFS_WHEN_FREE  # any time


WEIGHT = torch.ones(KIB // 4, requires_grad=True)


@course_torch
@pytest.mark.parametrize(
    "use",
    [
        lambda t: t,
        lambda t: t[1:],  # a view: the tensor itself is gone
        lambda t: t.numpy(),
        lambda t: (t * WEIGHT).sum(),  # mul saves t for WEIGHT's gradient
    ],
    ids=["tensor", "view", "numpy", "saved-for-backward"],
)
def test_a_pooled_block_is_free_exactly_when_no_tensor_uses_it(use):
    blocks = [torch.empty(KIB, dtype=torch.uint8).untyped_storage()]  # as a lane's list
    assert free_blocks(blocks) == 1
    user = use(torch.empty(0, dtype=torch.float32).set_(blocks[0]))
    assert free_blocks(blocks) == 0  # handed out now, it would be overwritten under the user
    del user
    assert free_blocks(blocks) == 1


def test_a_torch_whose_count_ignores_tensors_pools_nothing(monkeypatch, small_pool):
    # Python's own counts, on a torch that does not keep a storage's Python object
    # referenced while tensors use it: a storage's count never moves.
    class FlatStorageCounts:
        @staticmethod
        def getrefcount(obj: object) -> int:
            return 3 if isinstance(obj, torch.UntypedStorage) else sys.getrefcount(obj)

    monkeypatch.setattr(lane_memory, "sys", FlatStorageCounts)
    answer = lane_memory._refs_of_a_free_block()
    assert answer is None  # no count says "free" there: any block could be in use
    monkeypatch.setattr(lane_memory, "_REFS_WHEN_FREE", answer)
    source = torch.ones(KIB // 4)
    assert lane_memory.copy(source, LANE) is None  # the caller clones as torch would
    fresh = lane_memory.empty((KIB // 4,), torch.float32, LANE)
    assert fresh.shape == (KIB // 4,) and lane_memory.cached_bytes(LANE) == 0


# --- the releaser, on a simulated clock -------------------------------------------------


class SimulatedTime:
    """The pool's clock (``time.monotonic``) and its releaser's ``_idle.wait``: a wait lets
    the pool go (as Condition.wait lets its lock go), notes when, for how long and what the
    lane holds, then returns at its timeout (none notifies), the clock moved on by it."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.waits: list[tuple[float, float, int]] = []
        self.meanwhile: list[Callable[[], object]] = []  # what users do during each wait

    def monotonic(self) -> float:
        return self.now

    def wait(self, timeout: float) -> None:
        lane_memory._lock.release()
        try:
            self.waits.append((self.now, timeout, lane_memory.cached_bytes(LANE)))
            assert len(self.waits) < 8, f"the releaser never settles: {self.waits}"
            self.now += max(timeout, 0.0)  # a negative timeout returns at once
            if self.meanwhile:
                self.meanwhile.pop(0)()
        finally:
            lane_memory._lock.acquire()

    def notify(self) -> None:
        pass


@counting
def test_free_blocks_go_back_exactly_idle_seconds_after_the_last_take(monkeypatch, small_pool):
    monkeypatch.setattr(lane_memory, "IDLE_SECONDS", 0.5)
    clock = SimulatedTime(now=100.0)
    monkeypatch.setattr(lane_memory, "time", clock)
    monkeypatch.setattr(lane_memory, "_idle", clock)
    # The releaser is run by hand below: the takes must not start the real one.
    monkeypatch.setattr(lane_memory, "_releaser", threading.Thread(name="not started"))
    kept = [block(1)]
    dropped = block(2)  # both taken at 100.0
    del dropped
    clock.now = 100.125  # the releaser gets the lock a little after the take
    clock.meanwhile = [lambda: None, kept.clear]  # the kept copy is dropped during wait 2
    lane_memory._release_when_idle()  # returns once the pool is empty
    assert clock.waits == [
        (100.125, 0.375, 2 * KIB),  # not idle yet: both blocks stay, it waits until 100.5
        (100.5, 0.5, KIB),  # idle 0.5 s exactly: the free block went, the one in use stays
        (101.0, 0.5, 0),  # one IDLE_SECONDS later it looks again: the block freed since goes
    ]


# --- a forked child -----------------------------------------------------------------------


@counting
def test_a_forked_childs_first_copy_starts_its_own_releaser(monkeypatch, small_pool):
    monkeypatch.setattr(lane_memory, "IDLE_SECONDS", 0.05)
    # The pool as a fork leaves it in the child: its lock taken for the fork, and the
    # releaser named the parent's thread, which the child does not have.
    parents = threading.Thread(name="the parent's releaser")  # never runs in this process
    lane_memory._lock.acquire()
    monkeypatch.setattr(lane_memory, "_releaser", parents)
    lane_memory._forked()  # what os.register_at_fork runs in the child
    usable = lane_memory._lock.acquire(blocking=False)
    lane_memory._lock.release()  # the one taken just now, or the fork's one left taken
    assert usable  # a child's copy would hang on the lock
    freed = block(3)
    assert lane_memory.cached_bytes(LANE) == KIB
    del freed
    # Only a releaser of the child's own gives the free block back.
    assert wait_until(lambda: lane_memory.cached_bytes(LANE) == 0, seconds=2.0)
    assert wait_until(lambda: not releaser_alive(), seconds=2.0)


@pytest.mark.parametrize("nbytes", [480, 4 * lane_memory.MIN_BYTES])  # fresh memory; a block
def test_empty_gives_the_dtype_and_the_strides_asked_for(nbytes):
    # gather's result for channels_last pieces: a (batch, 3, 4, 5) float64 tensor whose
    # channels vary fastest, strides (60, 1, 15, 3), fresh from torch or off the pool
    lane = virtual_devices(2, on="cpu")[1]
    batch = nbytes // (3 * 4 * 5 * 8)
    strides = (60, 1, 15, 3)
    tensor = lane_memory.empty((batch, 3, 4, 5), torch.float64, lane, strides)
    assert tensor.dtype == torch.float64
    assert tensor.shape == (batch, 3, 4, 5) and tensor.stride() == strides
    assert tensor.is_contiguous(memory_format=torch.channels_last)
    assert tensor.untyped_storage().nbytes() == batch * 480  # 60 float64s a row
