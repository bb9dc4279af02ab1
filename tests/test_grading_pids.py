"""The grader never signals a pid that may have gone to another process since it was read.

A pid names a process only until its parent waits for it; then the number can go to any
new process of the user (the grader's, another student's run). Where the grader kills by
number it must know the number is still the one it means: a process it found in ``/proc``
is pinned with a pidfd and checked before the signal, and a run it started is left
unwaited (a zombie) until its process group has been killed. The bystanders here are
``sleep`` processes this test starts; the signal that could reach one is SIGCONT to a
stopped sleep (seen by its state), and the group kill is recorded, not sent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from dpkit.grading import sandbox

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def state(pid: int) -> str:
    """The process's state letter from /proc (R, S, T for stopped, Z for a zombie)."""
    with open(f"/proc/{pid}/stat", "rb") as file:
        return file.read().rpartition(b")")[2].split()[0].decode()


def wait_for_state(pid: int, wanted: str) -> str:
    deadline = time.monotonic() + 5
    while state(pid) != wanted and time.monotonic() < deadline:
        time.sleep(0.01)
    return state(pid)


@pytest.fixture
def stopped_sleeps():
    """Two stopped sleeps: one carrying a run's marker, one a bystander; the marker."""
    marker = "0123456789abcdef"
    env = {**os.environ, sandbox.RUN_MARKER: marker}
    marked = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        for process in (marked, bystander):
            process.send_signal(signal.SIGSTOP)
            assert wait_for_state(process.pid, "T") == "T"
        yield marked, bystander, f"{sandbox.RUN_MARKER}={marker}".encode()
    finally:
        for process in (marked, bystander):
            process.kill()
            process.wait()


def test_a_pid_that_no_longer_carries_the_marker_is_not_signalled(stopped_sleeps):
    # As after a scan found a run's process, which then ended and whose number the
    # bystander now holds: the signal must not reach it.
    marked, bystander, needle = stopped_sleeps
    sandbox._signal_if_marked(bystander.pid, needle, signal.SIGCONT)
    sandbox._signal_if_marked(marked.pid, needle, signal.SIGCONT)
    assert wait_for_state(marked.pid, "S") == "S"  # the run's own process: signalled
    time.sleep(0.05)
    assert state(bystander.pid) == "T"  # still stopped: nothing reached it


def test_an_ended_run_keeps_its_pid_until_its_group_is_killed():
    process = subprocess.Popen(["true"], start_new_session=True)
    deadline = time.monotonic() + 10
    while sandbox._running(process) and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        assert process.returncode is None  # not waited for
        assert state(process.pid) == "Z"  # so its number is still its own
    finally:
        process.wait()


class Waited:
    """A started run that was already waited for: its number may belong to anyone now."""

    returncode = 0

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def kill(self) -> None:
        raise AssertionError("a waited-for run is not killed by number")


def test_a_run_already_waited_for_is_not_killed_by_number(monkeypatch):
    sent = []
    monkeypatch.setattr(os, "killpg", lambda pid, signum: sent.append((pid, signum)))
    sandbox.kill_run(Waited(os.getpid()), "0123456789abcdef")  # type: ignore[arg-type]
    assert sent == []
