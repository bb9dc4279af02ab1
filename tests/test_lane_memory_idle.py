"""The lanes' block pool gives its free blocks back on its own once the lanes are idle.

What a user relies on: memory a training loop's copies kept goes back to the system once no
copy has taken a block for IDLE_SECONDS, a block still in use is never freed, and an idle
process is left with neither blocks nor the pool's thread (also in a forked child). Small
blocks and a short IDLE_SECONDS keep each case to a fraction of a second.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

import pytest
import torch

from dpkit import lane_memory
from dpkit.device import virtual_devices

pytestmark = pytest.mark.skipif(
    lane_memory._REFS_WHEN_FREE is None, reason="this torch cannot count a storage's users"
)

KIB = 1024
IDLE = 0.2  # seconds
LANE = virtual_devices(2, on="cpu")[1]


def releasers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dpkit-lane-memory"]


def releaser_alive() -> bool:
    return bool(releasers())


def wait_until(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture(autouse=True)
def small_pool(monkeypatch):
    """Blocks from 1 KiB, idle after IDLE seconds; the pool and its thread gone before."""
    monkeypatch.setattr(lane_memory, "MIN_BYTES", KIB)
    monkeypatch.setattr(lane_memory, "IDLE_SECONDS", IDLE)
    lane_memory.release()  # wakes a releaser left by other tests: it ends on an empty pool
    assert wait_until(lambda: not releaser_alive())
    yield
    lane_memory.release()


def block(seed: int) -> torch.Tensor:
    """A copy of 1 KiB of float32 onto LANE, from the pool."""
    source = torch.randn(KIB // 4, generator=torch.Generator().manual_seed(seed))
    copied = lane_memory.copy(source, LANE)
    assert copied is not None and torch.equal(copied, source)
    return copied


def test_free_blocks_go_back_once_idle_and_a_block_in_use_stays():
    kept, dropped = block(1), block(2)
    taken = time.monotonic()
    del dropped
    time.sleep(IDLE / 6)
    cached = lane_memory.cached_bytes(LANE)
    if time.monotonic() - taken < IDLE:  # (a test thread stalled past IDLE proves nothing)
        assert cached == 2 * KIB  # not idle yet: the free block stays
    assert wait_until(lambda: lane_memory.cached_bytes(LANE) == KIB)  # the free one only
    assert torch.equal(kept, torch.randn(KIB // 4, generator=torch.Generator().manual_seed(1)))
    del kept
    assert wait_until(lambda: lane_memory.cached_bytes() == 0)
    assert wait_until(lambda: not releaser_alive())  # an idle process keeps no thread


def test_release_ends_the_thread_at_once_and_the_next_copy_starts_it_again(monkeypatch):
    monkeypatch.setattr(lane_memory, "IDLE_SECONDS", 60.0)
    freed = block(3)
    # a daemon: a process that ends while its tensors still hold blocks does not wait for it
    assert releaser_alive() and all(thread.daemon for thread in releasers())
    del freed
    time.sleep(0.05)  # the thread has run to its wait, not found an empty pool on its way
    lane_memory.release()
    assert wait_until(lambda: not releaser_alive(), seconds=2.0)  # not after 60 s
    again = block(4)
    assert releaser_alive() and lane_memory.cached_bytes(LANE) == KIB
    del again


def test_a_forked_child_copies_and_gives_back_its_own_blocks():
    kept = block(5)  # the parent's releaser is alive at the fork
    pid = os.fork()
    if pid == 0:  # the child: no parent's thread; a copy must work and be given back
        try:
            child = block(6)
            del child
            ok = wait_until(lambda: lane_memory.cached_bytes(LANE) == KIB, seconds=3.0)
            os._exit(0 if ok else 1)
        finally:
            os._exit(2)
    deadline = time.monotonic() + 10.0
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on the pool's lock")
    assert os.waitstatus_to_exitcode(done[1]) == 0  # 1: its free block was never given back
    del kept
