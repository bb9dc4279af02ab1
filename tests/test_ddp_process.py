"""dpkit.ddp.process, the parts that run in the parent or that can run in this process
unchanged: a rank's Progress, which errors are a peer's failure, the listing of child
processes from /proc, and how rank_main reports its target's result or error.

The tests that launch gloo ranks reach all of this in rank processes, where a mutation
tool does not see it (it records which test calls which function only in the test's own
process). Here it runs in this process, on processes the test starts itself (``sleep``, and
small Pythons whose command line reads like multiprocessing's helpers), each stopped in a
``finally``.

rank_main itself first changes its process for good: it closes the fork server's "alive"
pipe (in a process that owns a fork server, that ends the server), asks Linux to SIGKILL it
when its parent dies (PR_SET_PDEATHSIG), makes it the leader of a new process group, and
forks a watcher that SIGKILLs that group once the process is gone; on an error it ends the
process with os._exit. None of that may happen to pytest, so those five calls are replaced
by recorders for the test (monkeypatch puts them back), and only what rank_main reports
runs as written.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import types

import pytest
import torch.distributed as dist

from dpkit.ddp import process

# -- Progress


def test_progress_writes_its_rank_s_step_and_stage_and_keeps_the_step_when_none():
    shared = [0] * 6  # three ranks: (step, stage) each
    where = process.Progress(shared, 1)
    where.at(process.FORWARD, step=3)
    assert shared == [0, 0, 3, process.FORWARD, 0, 0]
    where.at(process.BACKWARD)  # no step: rank 1 is still in step 3
    assert shared == [0, 0, 3, process.BACKWARD, 0, 0]
    where.at(process.STARTING, step=0)  # step 0 is a step, not "none"
    assert shared == [0, 0, 0, process.STARTING, 0, 0]


def test_stages_are_numbered_in_the_order_a_rank_passes_them():
    assert process.STAGES[process.CONNECTING] == "connecting"
    # a rank that fails building its batch (too large) is not said to be connecting
    assert process.STAGES[process.PREPARING] == "preparing its rows of the batch"
    assert process.STAGES[process.BACKWARD] == "backward"
    assert (process.STARTING, process.FINISHED) == (0, len(process.STAGES) - 1)


# -- _communication_error


@pytest.mark.parametrize(
    "error",
    [
        dist.DistBackendError("NCCL communicator was aborted on rank 1"),
        RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:29500"),
        RuntimeError("read: Connection reset by peer"),
        OSError("[Errno 32] Broken pipe"),
    ],
)
def test_a_backend_error_or_a_dropped_connection_is_a_peer_s_failure(error):
    assert process._communication_error(error) is True


@pytest.mark.parametrize(
    "error",
    [
        ValueError("shapes (4, 3) and (2, 3) cannot be multiplied"),
        RuntimeError("connection closed"),  # not gloo's words
        KeyboardInterrupt(),
    ],
)
def test_a_rank_s_own_error_is_not_a_peer_s_failure(error):
    assert process._communication_error(error) is False


def test_without_dist_backend_error_only_the_words_count(monkeypatch):
    # torch before 2.1 has no DistBackendError: then an error's text alone decides
    backend_error = dist.DistBackendError
    monkeypatch.delattr(dist, "DistBackendError")
    assert process._communication_error(backend_error("aborted")) is False
    assert process._communication_error(backend_error("Broken pipe")) is True


# -- child_processes and _helper_of_multiprocessing

# A parent whose children are: a ``sleep`` run under the name "sl) 1 2 3" (a ")" and numbers
# in its /proc stat name, which must not shift the fields after it), and two Pythons whose
# command lines read like multiprocessing's fork server and resource tracker, each with a
# ``sleep`` of its own. It prints: sleep, fork server, its sleep, tracker, its sleep.
TREE = """
import subprocess, sys, time
def helper(name):
    code = ("import subprocess, time; child = subprocess.Popen(['sleep', '60']); "
            "print(child.pid, flush=True); time.sleep(60)  # from multiprocessing.%s import main"
            % name)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
plain = subprocess.Popen([sys.argv[1], "60"])
server, tracker = helper("forkserver"), helper("resource_tracker")
pids = [plain.pid, server.pid, server.stdout.readline(), tracker.pid, tracker.stdout.readline()]
print(*[int(pid) for pid in pids], flush=True)
time.sleep(60)
"""


@pytest.fixture
def tree(tmp_path):
    """The TREE's pids: parent, sleep, fork server, its sleep, tracker, its sleep. The parent
    leads a session of its own: one killpg stops all of them."""
    sleep = tmp_path / "sl) 1 2 3"
    sleep.symlink_to("/bin/sleep")
    parent = subprocess.Popen([sys.executable, "-c", TREE, str(sleep)], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)  # fmt: skip
    try:
        yield [parent.pid, *map(int, parent.stdout.readline().split())]
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
        parent.stdout.close()


def test_children_count_a_fork_server_s_children_and_leave_out_the_helpers(tree):
    parent, sleep, server, server_child, tracker, tracker_child = tree
    assert process.child_processes(parent) == sorted([sleep, server_child])


def test_a_helper_of_multiprocessing_is_known_by_its_command_line(tree):
    parent, sleep, server, server_child, tracker, tracker_child = tree
    assert process._helper_of_multiprocessing(server) == "forkserver"
    assert process._helper_of_multiprocessing(tracker) == "resource_tracker"
    assert process._helper_of_multiprocessing(sleep) is None
    assert process._helper_of_multiprocessing(parent) is None


def test_a_process_that_is_gone_is_no_helper():
    with open("/proc/sys/kernel/pid_max") as pid_max:
        unused = int(pid_max.read())  # pids run below pid_max: none has this one
    assert process._helper_of_multiprocessing(unused) is None


def test_this_process_s_children_include_one_it_started_and_one_ended_unjoined():
    sleep = subprocess.Popen(["sleep", "60"])
    ended = subprocess.Popen(["true"])
    try:
        # wait for "true" to end without reaping it: a zombie, still this process's child
        os.waitid(os.P_PID, ended.pid, os.WEXITED | os.WNOWAIT)
        children = process.child_processes()
        assert sleep.pid in children and ended.pid in children
        assert children == sorted(children)
        ended.wait()  # joined: gone
        assert ended.pid not in process.child_processes(os.getpid())
    finally:
        sleep.kill()
        sleep.wait()
        ended.wait()


def test_a_process_gone_while_proc_is_read_is_skipped_and_children_are_sorted(tree, monkeypatch):
    parent, sleep, server, server_child, tracker, tracker_child = tree
    with open("/proc/sys/kernel/pid_max") as pid_max:
        gone = pid_max.read().strip()  # listed first, then gone when its stat is opened
    # and the rest backwards: the children still come out sorted
    listing = types.SimpleNamespace(
        getpid=os.getpid, listdir=lambda path: [gone, *reversed(os.listdir(path))]
    )
    monkeypatch.setattr(process, "os", listing)
    assert process.child_processes(parent) == sorted([sleep, server_child])


def test_without_proc_no_child_is_listed(monkeypatch):
    def no_proc(path):
        raise FileNotFoundError(path)  # macOS, Windows

    monkeypatch.setattr(process, "os", types.SimpleNamespace(getpid=os.getpid, listdir=no_proc))
    assert process.child_processes() == []


# -- rank_main, with what it does to its own process replaced


class Exited(BaseException):
    """Raised by the stand-in for os._exit, with the status."""


class Messages:
    """A rank's message queue: what was put, and when it was closed and joined."""

    def __init__(self):
        self.log = []

    def put(self, message):
        self.log.append(message)

    def close(self):
        self.log.append("close")

    def join_thread(self):
        self.log.append("join_thread")


@pytest.fixture
def calls(monkeypatch):
    """rank_main's calls that would change this process, replaced by recorders."""
    made = []
    parent = object()  # what multiprocessing.parent_process() says in a rank
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: parent)
    monkeypatch.setattr(process, "_release_fork_server", lambda: made.append("release"))
    monkeypatch.setattr(process, "_die_with_parent",
                        lambda given: made.append(("die with", given is parent)))  # fmt: skip
    monkeypatch.setattr(process, "_lead_own_group", lambda: made.append("lead"))
    monkeypatch.setattr(process, "_end_group_with_rank", lambda: made.append("watch"))

    def exit(status):
        made.append(("exit", status))
        raise Exited(status)

    monkeypatch.setattr(process.os, "_exit", exit)
    return made


def test_rank_main_runs_its_target_then_reports_finished(calls):
    shared, messages = [0] * 8, Messages()

    def target(rank, where, queue, *args):
        calls.append(("target", rank, queue is messages, args))
        where.at(process.FORWARD, step=2)  # where: this rank's Progress in ``shared``

    process.rank_main(3, target, shared, messages, ("go", 7))
    # the process is set up (fork server released, death with the parent, its own group,
    # the watcher) before the target runs
    assert calls == ["release", ("die with", True), "lead", "watch",
                     ("target", 3, True, ("go", 7))]  # fmt: skip
    assert shared == [0] * 6 + [2, process.FORWARD]
    assert messages.log == [("finished", 3, None)]


def ended_by(rank, error, shared, messages):
    """What ends rank_main when its target raises ``error``: any BaseException is caught
    here, so that a KeyboardInterrupt that got through does not stop pytest."""

    def target(rank, where, messages, *args):
        raise error

    try:
        process.rank_main(rank, target, shared, messages, ())
    except BaseException as escaped:
        return escaped
    return None


def test_rank_main_sends_its_target_s_error_then_ends_with_status_1(calls):
    messages = Messages()
    assert isinstance(ended_by(2, ValueError("bad shape"), [0] * 6, messages), Exited)
    (kind, rank, report), *rest = messages.log
    assert (kind, rank) == ("error", 2)
    assert (report["type"], report["message"], report["communication"]) == (
        "ValueError", "bad shape", False
    )  # fmt: skip
    assert report["traceback"].startswith("Traceback (most recent call last):")
    assert "in target\n" in report["traceback"]  # where it was raised
    assert report["traceback"].endswith("ValueError: bad shape\n")
    # the message is out (the queue's thread joined) before the process ends, and nothing
    # says "finished"
    assert rest == ["close", "join_thread"]
    assert calls[-1] == ("exit", 1)


@pytest.mark.parametrize(
    "error, name, communication",
    [
        (RuntimeError("Connection reset by peer"), "RuntimeError", True),
        (KeyboardInterrupt(), "KeyboardInterrupt", False),
        (SystemExit(0), "SystemExit", False),  # even status 0: the rank left its target early
    ],
)
def test_rank_main_reports_any_error_and_whether_a_peer_caused_it(
    calls, error, name, communication
):
    messages = Messages()
    assert isinstance(ended_by(0, error, [0] * 2, messages), Exited)
    (kind, rank, report), *rest = messages.log
    assert (kind, report["type"], report["communication"]) == ("error", name, communication)
    assert report["message"] == str(error)
    assert rest == ["close", "join_thread"] and calls[-1] == ("exit", 1)
