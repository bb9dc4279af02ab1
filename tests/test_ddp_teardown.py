"""A rank that has sent what the parent waits for and then dies in its teardown (torch's gloo
process group has aborted there, destroyed from one of its own threads: "terminate called
after throwing an instance of 'std::system_error' ... Resource deadlock avoided") has done
its work: the parent keeps what it sent. A rank that dies before sending is still named."""

from __future__ import annotations

import multiprocessing
import os
import re
import time

import pytest

from dpkit.ddp import launch, process


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
        # named for what they are in tracebacks and debuggers
        assert [p.name for p in running.processes] == ["dpkit-rank-0", "dpkit-rank-1"]
        ended(running)
        assert running.wait_for("done") == [0, 10]


def test_a_rank_that_aborts_before_delivering_is_named():
    with launch.Ranks(abort_before_delivering, (), 2, timeout=30) as running:
        ended(running)
        with pytest.raises(launch.RankFailed, match="rank 1 of 2 was killed by SIGABRT") as died:
            running.wait_for("done")
    # it never reported a stage: the advice for a rank that died while starting
    for words in ("It failed while starting", "stderr (in Jupyter: the kernel's log)",
                  "under `if __name__ == '__main__':`"):  # fmt: skip
        assert words in str(died.value)


def raise_in_turn(rank, where, messages, go):
    """Rank 1 raises first; rank 0 once it sees rank 1 at its last stage (the progress
    array is shared), within the parent's window for more errors."""
    where.at(process.FORWARD, 1)
    if rank == 0:
        while where.shared[3] != process.AFTER_OPTIMIZER:
            time.sleep(0.001)
        raise ValueError("boom 0")
    where.at(process.AFTER_OPTIMIZER)
    raise ValueError("boom 1")


def raise_alone(rank, where, messages, go):
    where.at(process.BACKWARD, 3)
    if rank == 1:
        raise KeyError("boom 1")
    time.sleep(60)


def test_the_first_rank_s_error_is_raised_naming_the_others_that_failed():
    with launch.Ranks(raise_in_turn, (), 2, timeout=30) as running:
        with pytest.raises(launch.RankFailed) as failed:
            running.wait_for("done")
    # Whichever error reached the parent first is raised (rank 1's, unless rank 0's message
    # overtook it in the pipe), the other named after it.
    message = str(failed.value)
    first = re.match(
        r"rank (\d) of 2 raised ValueError: boom \1 \((in step 1, [^)]*)\); every rank was "
        r"stopped \(rank (\d) then failed too\)\. The traceback of rank \1:\n",
        message,
    )
    assert first is not None, message
    assert {first[1], first[3]} == {"0", "1"}
    assert first[2] == {"1": "in step 1, the step's code after the optimizer",
                        "0": "in step 1, forward"}[first[1]]  # fmt: skip
    assert message.rstrip().endswith(f"ValueError: boom {first[1]}")  # its traceback
    assert (failed.value.rank, failed.value.error_type) == (int(first[1]), "ValueError")
    with launch.Ranks(raise_alone, (), 2, timeout=30) as running:
        with pytest.raises(launch.RankFailed) as failed:
            running.wait_for("done")
    assert str(failed.value).startswith(
        "rank 1 of 2 raised KeyError: 'boom 1' (in step 3, backward); every rank was "
        "stopped. The traceback of rank 1:"
    )


def stall(rank, where, messages, go):
    where.at(process.FORWARD, 1)
    if rank == 0:
        where.at(process.BACKWARD)
    time.sleep(60)


def stall_together(rank, where, messages, go):
    where.at(process.OPTIMIZER, 2)
    time.sleep(60)


@pytest.mark.parametrize(
    ("target", "places", "culprit"),
    [
        (stall, "rank 0: in step 1, backward; rank 1: in step 1, forward",
         "Rank 1 is furthest behind: it is the one stuck, and the others wait for it inside a "
         "collective."),
        (stall_together, "rank 0: in step 2, optimizer step; rank 1: in step 2, optimizer step",
         "No rank was behind the others."),
    ],
)  # fmt: skip
def test_a_stall_names_where_each_rank_is_and_which_is_behind(target, places, culprit):
    with launch.Ranks(target, (), 2, timeout=0.5) as running:
        with pytest.raises(launch.RanksTimedOut) as stalled:
            running.wait_for("done")
    assert str(stalled.value).startswith(f"no rank moved on for 0.5 s (timeout=0.5): {places}. ")
    assert culprit in str(stalled.value)
    assert stalled.value.behind == (1 if target is stall else None)


def test_ranks_start_from_the_fork_server_where_there_is_one(monkeypatch):
    methods = multiprocessing.get_all_start_methods()
    expected = "forkserver" if "forkserver" in methods else "spawn"
    assert launch.start_context().get_start_method() == expected
    # Windows has no fork server: a fresh interpreter per rank
    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    assert launch.start_context().get_start_method() == "spawn"


def exit_mid_step(rank, where, messages, go, status):
    where.at(process.FORWARD, 1)
    if rank == 1:
        os._exit(status)  # no Python exit handling: no error for the rank to report
    time.sleep(60)


@pytest.mark.parametrize(
    ("status", "how", "why"),
    [(0, "exited with status 0", "before its work was done"),
     (3, "exited with code 3", "Every rank was stopped")],
)  # fmt: skip
def test_a_rank_that_exits_mid_run_is_named_with_its_status(status, how, why):
    with launch.Ranks(exit_mid_step, (status,), 2, timeout=30) as running:
        with pytest.raises(launch.RankFailed) as died:
            running.wait_for("done")
    assert str(died.value).startswith(f"rank 1 of 2 {how} (in step 1, forward)")
    assert why in str(died.value)
    assert (died.value.rank, died.value.error_type) == (1, "exit")
    assert "while starting" not in str(died.value)  # it had reported a stage


def report_block_1_then_die(rank, where, messages, go):
    where.at(process.FORWARD, 1)
    messages.put(("waiting", rank, 1))
    if rank == 1:
        messages.close()
        messages.join_thread()
        os.abort()
    time.sleep(60)


def test_a_message_for_another_block_does_not_excuse_a_death():
    """Rank 1 said it waits before block 1, then died: waiting for block 2, the parent
    names it (its block-1 message is not what is waited for)."""
    with launch.Ranks(report_block_1_then_die, (), 2, timeout=5) as running:
        ended_1 = time.monotonic() + 30
        while running.processes[1].exitcode is None and time.monotonic() < ended_1:
            time.sleep(0.05)
        with pytest.raises(launch.RankFailed, match="rank 1 of 2 was killed by SIGABRT"):
            running.wait_for("waiting", block=2)


def return_without_reporting(rank, where, messages, go):
    where.at(process.FORWARD, 1)


def test_ranks_that_all_returned_without_reporting_time_out_with_no_culprit():
    with launch.Ranks(return_without_reporting, (), 2, timeout=0.5) as running:
        with pytest.raises(launch.RanksTimedOut) as stalled:
            running.wait_for("done")
    assert "(timeout=0.5): every rank had ended. No rank was behind" in str(stalled.value)
    assert stalled.value.behind is None
