"""The server's side of :mod:`dpkit.grading.forkserver`, called in this process.

What runs in the server, its supervisors and their runs is forked for real only in the
slow tests of ``test_grading_forkserver.py``; here each function is called in the test's
process with ``fork``, ``waitpid``, the pidfd, the libc calls and the process's own state
(``chdir``, ``dup2``, the environment, ``_exit``) replaced by recorders, so a test sees
what a supervisor or a run would have done: the namespaces entered and the folders
covered, the exit status the grader is told, a run killed when the grader asks, the pipes
handed on and closed. Where a call is harmless (``/proc``, a failing libc call, a child
of the test's own), it is the real one.

Nothing here signals a process the test did not start, and nothing waits for children
other than its own (``_reap``, which waits for any child, is always replaced).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import warnings
from pathlib import Path

import pytest
from processes import alive

from dpkit.grading import forkserver

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the fork server is Linux only (/proc, pidfds)"
)

LIBC = ctypes.CDLL(None)
POLL = select.poll  # the real one, for CountedPoll
RUN_PID = 4321  # the pid the replaced fork() hands out


def c_value(argument: object) -> object:
    """What the kernel gets for ``argument``: a C unsigned long's value; None is ctypes'
    NULL pointer, a 0 as wide as the unsigned long."""
    if isinstance(argument, ctypes.c_ulong):
        return argument.value
    return 0 if argument is None else argument


class Exited(Exception):
    """os._exit(code), replaced: ends the function under test without ending pytest."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def exit_instead(code: int) -> None:
    raise Exited(code)


@pytest.fixture
def log():
    """Every libc call and _map_root, in order, as the kernel would see them."""
    return []


@pytest.fixture
def libc_call(log):
    """A stand-in for _libc()'s call: records, after checking that libc has the function
    (a misspelt name fails here as it would for real)."""
    refused: dict[str, int] = {}

    def call(name: str, *args: object) -> None:
        assert hasattr(LIBC, name), f"libc has no {name}"
        log.append((name, *map(c_value, args)))
        if name in refused:
            raise OSError(refused[name], f"{name}: {os.strerror(refused[name])}")

    call.refused = refused
    return call


# --------------------------------------------------------------------------------------
# _libc: the errors a failing call raises are what the instructor reads.


def test_a_failing_libc_call_raises_os_error_with_its_errno_and_name(tmp_path):
    call = forkserver._libc()
    with pytest.raises(OSError) as failed:
        call("rmdir", os.fsencode(tmp_path / "not-there"))
    # As the probe's refusal reads: "namespaces: [Errno 2] rmdir: No such file or directory".
    assert failed.value.errno == errno.ENOENT
    assert str(failed.value) == "[Errno 2] rmdir: No such file or directory"


def test_a_libc_call_that_succeeds_returns_quietly(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    assert forkserver._libc()("rmdir", os.fsencode(folder)) is None
    assert not folder.exists()


# --------------------------------------------------------------------------------------
# _children and _kill_children: what a run left is found and killed.


def test_children_lists_this_process_s_children_and_no_one_else(tmp_path):
    # A child named so that a parser reading the name up to its first ")" would take the
    # "1" in it for the parent's pid: the name is the submission's to choose.
    tricky = tmp_path / "x) S 1 (y"
    tricky.symlink_to(shutil.which("sleep"))  # a process's name is the path's last part
    children = [subprocess.Popen([str(tricky), "30"]), subprocess.Popen(["sleep", "30"])]
    try:
        found = forkserver._children()
        assert Path(f"/proc/{children[0].pid}/comm").read_text() == "x) S 1 (y\n"
        assert {child.pid for child in children} <= set(found)
        assert os.getpid() not in found and os.getppid() not in found
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_children_counts_an_ended_child_until_it_is_waited_for():
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 5
    while alive(child.pid) and time.monotonic() < deadline:  # until a zombie: not waited for
        time.sleep(0.01)
    try:
        assert child.pid in forkserver._children()
    finally:
        child.wait()
    assert child.pid not in forkserver._children()


def test_kill_children_kills_round_after_round_until_none_is_left(monkeypatch):
    # Round 1: the run (101) and what it left (102, ended meanwhile); as 101 dies, its own
    # child 103 becomes the subreaper's and is killed in round 2.
    rounds = iter([[101, 102], [103], []])
    killed, reaped = [], []

    def kill(pid, signum):
        killed.append((pid, signum))
        if pid == 102:
            raise ProcessLookupError

    monkeypatch.setattr(forkserver, "_children", lambda: next(rounds))
    monkeypatch.setattr(forkserver, "_reap", reaped.append)
    monkeypatch.setattr(os, "kill", kill)
    forkserver._kill_children()
    assert killed == [(101, signal.SIGKILL), (102, signal.SIGKILL), (103, signal.SIGKILL)]
    assert reaped == [os.WNOHANG, os.WNOHANG], "each round's dead waited for"


def test_a_subreaper_s_kill_children_ends_a_child_and_a_grandchild_that_left_its_session():
    # For real, in a Python of its own: it becomes a subreaper as a supervisor does, starts a
    # child that hangs and a grandchild whose parent has exited (setsid: out of the
    # session), then kills what it finds. Only processes this test started are signalled.
    script = """
import json, os, runpy, subprocess, sys
f = runpy.run_path(sys.argv[1])
u = f["_ulong"]
f["_libc"]()("prctl", f["PR_SET_CHILD_SUBREAPER"], u(1), u(0), u(0), u(0))
child = subprocess.Popen(["sleep", "60"])
left = subprocess.run(["sh", "-c", "setsid sleep 60 >/dev/null 2>&1 & echo $!"],
                      capture_output=True, text=True)
grandchild = int(left.stdout)
before = sorted(f["_children"]())
f["_kill_children"]()
gone = [not os.path.exists(f"/proc/{pid}") for pid in (child.pid, grandchild)]
print(json.dumps({"pids": [child.pid, grandchild], "before": before, "gone": gone,
                  "after": f["_children"]()}))
"""
    done = subprocess.run(
        [sys.executable, "-I", "-c", script, forkserver.__file__],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    try:
        assert sorted(seen["pids"]) == seen["before"], "the orphaned grandchild was not found"
        assert seen["gone"] == [True, True] and seen["after"] == []
    finally:
        for pid in seen["pids"]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------------------
# _run: the run itself, up to the harness.


@pytest.fixture
def in_the_run(monkeypatch, libc_call, log):
    """Call _run with what it does to this process recorded instead; returns what it did."""

    def run(request: dict, harness_code: int = 0, pid: int = 1, proc=("1", "self")) -> dict:
        done: dict = {"steps": [], "harness": None}
        steps = done["steps"]

        def main(argv):
            done["harness"] = {
                "argv": argv,
                "sys.argv": sys.argv,
                "path": sys.path[:2],
                "env": dict(os.environ),
            }
            return harness_code

        harness = types.ModuleType("dpkit.grading.harness")
        harness.main = main
        with monkeypatch.context() as m:
            m.setitem(sys.modules, "dpkit.grading.harness", harness)
            m.setattr(forkserver, "_map_root", lambda *ids: log.append(("map_root", *ids)))
            m.setattr(os, "getpid", lambda: pid)
            m.setattr(os, "listdir", lambda path: list(proc) if path == "/proc" else [])
            m.setattr(os, "chdir", lambda path: steps.append(("chdir", path)))
            m.setattr(os, "dup2", lambda fd, fd2: steps.append(("dup2", fd, fd2)))
            m.setattr(os, "close", lambda fd: steps.append(("close", fd)))
            m.setattr(os, "setsid", lambda: steps.append(("setsid",)))
            m.setattr(os, "environ", {"GRADER_SECRET": "x"})
            m.setattr(os, "_exit", exit_instead)
            m.setattr(sys, "path", ["/site"])
            m.setattr(sys, "argv", ["pytest"])
            m.setattr(sys, "dont_write_bytecode", False)
            with pytest.raises(Exited) as exited:
                forkserver._run(request, 11, 12, 13, libc_call)
        done["exit"] = exited.value.code
        return done

    return run


def run_request(namespaces: bool, probe: bool = False) -> dict:
    return {
        "arguments": ["--", "test_task1.py", "-q"],
        "env": {"HOME": "/run/home", "WHO": "ada"},
        "root": "/run",
        "hide": [],
        "probe": probe,
        "namespaces": namespaces,
    }


def test_a_run_in_namespaces_mounts_its_own_proc_and_locks_it_in(in_the_run, log):
    in_the_run(run_request(namespaces=True))
    assert log == [
        # Its own /proc (nosuid 2 | nodev 4 | noexec 8): only its own processes are seen.
        ("mount", b"proc", b"/proc", b"proc", 14, 0),
        # A second user and mount namespace (CLONE_NEWUSER | CLONE_NEWNS): its mounts
        # cannot be undone from inside, by the run or what it starts.
        ("unshare", 0x10000000 | 0x00020000),
        ("map_root", 0, 0),
        # Killed when its supervisor dies (PR_SET_PDEATHSIG 1, SIGKILL 9).
        ("prctl", 1, 9, 0, 0, 0),
    ]


def test_a_run_without_namespaces_only_asks_to_die_with_its_supervisor(in_the_run, log):
    in_the_run(run_request(namespaces=False))
    assert log == [("prctl", 1, 9, 0, 0, 0)]


def test_a_run_takes_its_folder_pipes_environment_and_private_dpkit_then_exits_as_the_harness(
    in_the_run,
):
    done = in_the_run(run_request(namespaces=False), harness_code=7, pid=555)
    assert done["steps"] == [
        ("chdir", "/run/home"),
        ("dup2", 13, 1),  # stdout and stderr on the output pipe
        ("dup2", 13, 2),
        ("close", 13),
        ("setsid",),
    ]
    harness = done["harness"]
    assert harness["argv"] == ["11", "12", "--", "test_task1.py", "-q"]  # key, results pipes
    # Imports come from the run's home, then the run's private copy of dpkit.
    assert harness["path"] == ["/run/home", "/run/lib"]
    # sys.argv as if the run's harness had been started as a script.
    assert harness["sys.argv"] == ["/run/lib/dpkit/grading/harness.py", "--", "test_task1.py", "-q"]
    assert harness["env"] == {"HOME": "/run/home", "WHO": "ada"}, "the server's env leaked"
    assert done["exit"] == 7


@pytest.mark.parametrize(
    "namespaces, pid, proc, code",
    [
        (True, 1, ["1", "self", "sys"], 0),  # the first and only process of its namespace
        (True, 1, ["1", "9876"], 3),  # another process is seen: not a PID namespace apart
        (True, 9876, ["9876"], 3),  # not the first process: not a PID namespace of its own
        (False, 9876, ["1", "9876", "12"], 0),  # without namespaces, forking is all it tries
    ],
)
def test_the_probe_run_exits_0_only_when_alone_in_its_namespace(
    in_the_run, namespaces, pid, proc, code
):
    done = in_the_run(run_request(namespaces, probe=True), pid=pid, proc=proc)
    assert done["exit"] == code
    assert done["harness"] is None and done["steps"] == []


# --------------------------------------------------------------------------------------
# _supervise: namespaces, the run forked, its exit status sent back.


class FakeRun:
    """The run _supervise forks: fork() hands out RUN_PID; its pidfd is a pipe that turns
    readable when the run ends; waitpid() answers only for a run that has ended."""

    def __init__(self) -> None:
        self.pidfd, self._ends = os.pipe()
        self.forks = 0
        self.status: int | None = None
        self.signals: list[int] = []

    def end(self, status: int) -> None:
        self.status = status
        os.write(self._ends, b"x")

    def fork(self) -> int:
        self.forks += 1
        return RUN_PID

    def pidfd_open(self, pid: int) -> int:
        assert pid == RUN_PID
        return self.pidfd

    def waitpid(self, pid: int, options: int) -> tuple[int, int]:
        assert (pid, options) == (RUN_PID, 0)
        assert self.status is not None, "waited for a run that runs: the supervisor hangs"
        return pid, self.status

    def pidfd_send_signal(self, fd: int, signum: int) -> None:
        assert fd == self.pidfd
        self.signals.append(signum)
        self.end(signum)  # a status of just the signal's number: killed by it

    def close(self) -> None:
        os.close(self.pidfd)
        os.close(self._ends)


class CountedPoll:
    """select.poll, failing past a few polls: a supervisor that loops fails, not hangs."""

    def __init__(self) -> None:
        self._poller = POLL()
        self._left = 10

    def register(self, fd, events) -> None:
        self._poller.register(fd, events)

    def unregister(self, fd) -> None:
        self._poller.unregister(fd)

    def poll(self, *timeout):
        self._left -= 1
        assert self._left > 0, "the supervisor polls on and on"
        return self._poller.poll(timeout[0] if timeout else 5000)  # 5 s, not forever


@pytest.fixture
def supervisor(monkeypatch, libc_call, log):
    """Calls _supervise with a FakeRun; yields (supervise, run, the grader's control end)."""
    run = FakeRun()
    grader, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pipes = [os.pipe() for _ in range(3)]
    killed_children = []
    monkeypatch.setattr(forkserver, "_libc", lambda: libc_call)
    monkeypatch.setattr(forkserver, "_map_root", lambda *ids: log.append(("map_root", *ids)))
    monkeypatch.setattr(forkserver, "_kill_children", lambda: killed_children.append(True))
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    monkeypatch.setattr(os, "getgid", lambda: 100)
    for name in ("fork", "pidfd_open", "waitpid"):
        monkeypatch.setattr(os, name, getattr(run, name))
    monkeypatch.setattr(signal, "pidfd_send_signal", run.pidfd_send_signal)
    monkeypatch.setattr(select, "poll", CountedPoll)

    def supervise(request: dict) -> int:
        fds = [write for _, write in pipes] + [theirs.detach()]
        with warnings.catch_warnings():
            # _supervise leaves its control socket to the process's exit, here to the gc.
            warnings.simplefilter("ignore", ResourceWarning)
            return forkserver._supervise(request, fds)

    supervise.pipes = pipes
    supervise.killed_children = killed_children
    try:
        yield supervise, run, grader
    finally:
        grader.close()
        run.close()
        for read, write in pipes:
            os.close(read)
            with contextlib.suppress(OSError):  # closed by the supervisor
                os.close(write)


def told(grader: socket.socket) -> forkserver.Run:
    """What the grader's Run makes of the supervisor's reply."""
    run = forkserver.Run(grader)
    run.wait(1)
    return run


def test_a_supervisor_reports_the_exit_code_of_its_run(supervisor, log):
    supervise, run, grader = supervisor
    run.end(3 << 8)  # exited with code 3
    assert supervise(run_request(namespaces=False)) == 0
    assert run.forks == 1
    assert told(grader).returncode == 3
    # Without namespaces: a subreaper (PR_SET_CHILD_SUBREAPER 36), so what the run leaves
    # becomes its own, and is killed once the run has ended.
    assert log == [("prctl", 36, 1, 0, 0, 0)]
    assert supervise.killed_children == [True]


def test_a_supervisor_hands_the_pipes_to_its_run_and_keeps_no_copy(supervisor):
    supervise, run, _ = supervisor
    run.end(0)
    supervise(run_request(namespaces=False))
    # Every write end the grader passed is closed here: the grader sees each pipe close
    # when the run (which holds its own copies) ends, not when the supervisor does.
    for _, write in supervise.pipes:
        with pytest.raises(OSError) as closed:
            os.fstat(write)
        assert closed.value.errno == errno.EBADF


@pytest.mark.parametrize("grader_action", ["kill", "go away"])
def test_a_supervisor_kills_its_run_when_the_grader_asks_or_goes_away(supervisor, grader_action):
    supervise, run, grader = supervisor
    if grader_action == "kill":
        forkserver.Run(grader).kill()  # what the grader does for a run past its time
    else:
        grader.shutdown(socket.SHUT_WR)
    assert supervise(run_request(namespaces=False)) == 0
    assert run.signals == [signal.SIGKILL]  # through the pidfd, never a pid reused
    assert told(grader).returncode == -signal.SIGKILL  # as Popen reports it


def test_a_supervisor_enters_namespaces_and_covers_what_the_run_must_not_see(
    supervisor, log, tmp_path
):
    supervise, run, grader = supervisor
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    scratch = tmp_path / "grading" / "dpkit-grade-1"
    request = run_request(namespaces=True)
    request.update(root=str(scratch), hide=[str(solutions), str(tmp_path / "not-there")])
    run.end(0)
    assert supervise(request) == 0
    assert told(grader).returncode == 0
    assert log == [
        # User, mount, PID and network namespaces: CLONE_NEWUSER | NEWNS | NEWPID | NEWNET.
        ("unshare", 0x10000000 | 0x00020000 | 0x20000000 | 0x40000000),
        ("map_root", 1000, 100),  # the instructor is root in there, and no one else
        # Mounts made here stay here (MS_REC 16384 | MS_PRIVATE 262144).
        ("mount", b"none", b"/", 0, 278528, 0),
        # The solutions covered by an empty read-only folder; a folder not there is skipped.
        ("mount", b"dpkit-hidden", os.fsencode(solutions), b"tmpfs", 0, b"size=64k,mode=0555"),
        # The run's folder over the folder every run is made in (MS_BIND 4096).
        ("mount", os.fsencode(scratch), os.fsencode(scratch.parent), 0, 4096, 0),
    ]


def test_a_supervisor_refused_namespaces_says_why_and_starts_no_run(supervisor, libc_call):
    supervise, run, grader = supervisor
    libc_call.refused["unshare"] = errno.EPERM
    assert supervise(run_request(namespaces=True)) == 1
    assert run.forks == 0
    reply = told(grader)
    assert reply.returncode == 1
    assert reply.failed == "namespaces: [Errno 1] unshare: Operation not permitted"


# --------------------------------------------------------------------------------------
# serve: the handshake, a supervisor forked per request, the pipes closed.


@pytest.fixture
def server(monkeypatch):
    """serve() over a socket pair, fork and _reap recorded: yields (serve, grader's end,
    what fork and _reap were called with)."""
    grader, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    calls: dict[str, list] = {"fork": [], "reap": []}
    fork_fails = []

    def fork():
        calls["fork"].append(True)
        if fork_fails:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        return RUN_PID  # the server's side only: the child's would close our descriptors

    monkeypatch.setattr(forkserver, "PRELOADED", ("json",))  # the real ones take seconds
    monkeypatch.setattr(forkserver, "_reap", calls["reap"].append)
    monkeypatch.setattr(os, "fork", fork)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)

    def serve() -> None:
        grader.shutdown(socket.SHUT_WR)  # the requests sent so far, then the class is done
        with warnings.catch_warnings():
            # serve() leaves its socket to the process's exit, here to the garbage collector.
            warnings.simplefilter("ignore", ResourceWarning)
            forkserver.serve(theirs.detach())

    serve.fork_fails = fork_fails
    try:
        yield serve, grader, calls
    finally:
        grader.close()
        theirs.close()


def as_grader(grader: socket.socket) -> forkserver.Server:
    """The grader's Server around ``grader``, its real start() encoding the requests."""
    server = object.__new__(forkserver.Server)
    server.namespaces = False
    server._socket = grader
    server._lock = threading.Lock()
    return server


def start_one(grader: socket.socket) -> tuple[forkserver.Run, list[tuple[int, int]]]:
    pipes = [os.pipe() for _ in range(3)]
    run = as_grader(grader).start([], {}, "/run", [], [write for _, write in pipes])
    for _, write in pipes:
        os.close(write)  # the grader's copies: the server's are the only ones left
    return run, pipes


def closed_everywhere(pipes) -> bool:
    """Whether every write end is closed: reading each pipe finds its end, not a wait."""
    for read, _ in pipes:
        os.set_blocking(read, False)
        try:
            if os.read(read, 1) != b"":
                return False
        except BlockingIOError:
            return False
    return True


def test_the_server_says_ready_forks_a_supervisor_per_request_and_waits_for_them(server):
    serve, grader, calls = server
    first, first_pipes = start_one(grader)
    # A request without its four descriptors is dropped (what came with it closed), and
    # the server goes on with the next.
    stray = os.pipe()
    socket.send_fds(grader, [b"{}"], [stray[1]])
    os.close(stray[1])
    second, second_pipes = start_one(grader)
    serve()
    assert grader.recv(64) == b"ready"  # the word Server waits for before any run
    assert len(calls["fork"]) == 2
    assert calls["reap"][-1] == 0, "the server ends only once its supervisors have"
    assert calls["reap"][:-1] == [os.WNOHANG] * 4, "the ended supervisors waited for"
    # The server keeps no copy of a run's pipes or control socket, nor of a dropped one's.
    assert closed_everywhere(first_pipes) and closed_everywhere(second_pipes)
    assert closed_everywhere([stray])
    for pipes in (first_pipes, second_pipes, [stray]):
        for read, _ in pipes:
            os.close(read)
    for run in (first, second):
        assert forkserver._readable(run._control, 0)  # no reply yet, but not held open
        run._control.close()


def test_a_run_the_server_cannot_fork_ends_at_once_for_the_grader(server):
    serve, grader, calls = server
    serve.fork_fails.append(True)
    run, pipes = start_one(grader)
    serve()
    assert grader.recv(64) == b"ready"
    assert calls["fork"] == [True]
    assert run.wait(1) == -signal.SIGKILL  # no supervisor: the run reads as killed
    assert closed_everywhere(pipes)
    for read, _ in pipes:
        os.close(read)
