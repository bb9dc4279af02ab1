"""A rank that has sent what the parent waits for and then dies in its teardown (torch's gloo
process group has aborted there, destroyed from one of its own threads: "terminate called
after throwing an instance of 'std::system_error' ... Resource deadlock avoided") has done
its work: the parent keeps what it sent. A rank that dies before sending is still named."""

from __future__ import annotations

import os
import time

import pytest

from dpkit.ddp import launch


def deliver_then_abort(rank, where, messages, go):
    messages.put(("done", rank, rank * 10))
    messages.close()
    messages.join_thread()  # the message is in the pipe before the abort
    os.abort()


def abort_before_delivering(rank, where, messages, go):
    if rank == 1:
        os.abort()
    messages.put(("done", rank, rank * 10))


def ended(running: launch.Ranks) -> None:
    """Until every rank has ended: the parent then reads their messages after their deaths."""
    deadline = time.monotonic() + 30
    while any(p.exitcode is None for p in running.processes) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_rank_that_aborts_after_delivering_keeps_its_result():
    with launch.Ranks(deliver_then_abort, (), 2, timeout=30) as running:
        ended(running)
        assert running.wait_for("done") == [0, 10]


def test_a_rank_that_aborts_before_delivering_is_named():
    with launch.Ranks(abort_before_delivering, (), 2, timeout=30) as running:
        ended(running)
        with pytest.raises(launch.RankFailed, match="rank 1 of 2 was killed by SIGABRT"):
            running.wait_for("done")
