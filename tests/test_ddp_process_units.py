"""dpkit.ddp.process, what a rank does to its own process, run in this process.

A rank asks Linux to SIGKILL it when its parent dies (_die_with_parent), leads a process
group of its own (_lead_own_group), and forks a watcher that SIGKILLs that group once the
rank is gone (_end_group_with_rank), its descriptors closed (_highest_descriptor) so that
no pipe of the rank's waits for it. Done to pytest, any of these would change pytest for
good (or kill it), and the ranks that run them for real run where a mutation tool does not
look. So here they run in this process against stand-ins for ``os``, ``time`` and
``ctypes`` that behave as the real ones do (a table of descriptors, process groups by id,
a clock that only sleeps move) and record what was asked of them; two tests check the real
thing in a child process this test forks, and signal only what that child created.
"""

from __future__ import annotations

import ctypes
import fcntl
import operator
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import types

import pytest

from dpkit.ddp import process

on_linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's prctl, /proc")

RANK, PARENT, INIT = 4242, 4000, 1  # pids: the rank, the parent that started it, init


class Exited(BaseException):
    """Raised by the stand-in for os._exit, with the status."""

    def __init__(self, status):
        super().__init__(status)
        self.status = status


class Machine:
    """``os`` and ``time`` as a rank sees them: its descriptors (a table of what each one
    is), process groups by pid, a clock that moves only when it sleeps, and a rank that
    ends at ``rank_ends`` s (the watcher's parent is then init). ``forked``: what fork()
    returns (0: this is the watcher; a pid: this is the rank, the watcher's parent)."""

    def __init__(self, monkeypatch, forked=0, leader=True, missing=(), fds=None, rank_ends=0.35):
        self.now, self.rank_ends = 0.0, rank_ends
        self.fds = dict(fds or {0: "stdin", 1: "stdout pipe", 2: "stderr pipe", 5: "queue"})
        self.groups = {RANK: RANK if leader else PARENT, PARENT: PARENT, INIT: INIT}
        self.forked, self.forks, self.killed, self.slept = forked, 0, [], []
        self.fds_at_kill = None
        names = {"fork", "killpg", "getpgid", "getpid", "getppid", "open", "dup2",
                 "closerange", "listdir", "setpgid", "_exit"} - set(missing)  # fmt: skip
        calls = {name: getattr(self, name) for name in names}
        self.os = types.SimpleNamespace(devnull=os.devnull, O_RDWR=os.O_RDWR, **calls)
        monkeypatch.setattr(process, "os", self.os)
        monkeypatch.setattr(process, "time", types.SimpleNamespace(sleep=self.sleep))

    @staticmethod
    def _pid(pid):
        return operator.index(pid)  # None or a float is refused, as by the real calls

    def getpid(self):
        return RANK

    def getpgid(self, pid):
        return self.groups[self._pid(pid) or RANK]

    def setpgid(self, pid, pgid):
        pid = self._pid(pid) or RANK
        self.groups[pid] = self._pid(pgid) or pid  # 0: a new group led by the process

    def getppid(self):
        return RANK if self.now < self.rank_ends else INIT  # orphans go to init

    def fork(self):
        self.forks += 1
        if isinstance(self.forked, Exception):
            raise self.forked
        return self.forked

    def open(self, path, flags):
        fd = min(set(range(len(self.fds) + 1)) - set(self.fds))  # the lowest free one
        self.fds[fd] = path
        return fd

    def dup2(self, fd, fd2):
        self.fds[fd2] = self.fds[fd]

    def closerange(self, low, high):
        for fd in range(low, high):  # as the real one: ints only, ``high`` left open
            self.fds.pop(fd, None)

    def listdir(self, path):
        if path != "/proc/self/fd":
            raise FileNotFoundError(path)
        return [str(fd) for fd in self.fds]

    def killpg(self, pgid, signum):
        self.killed.append((pgid, signum, round(self.now, 6)))
        self.fds_at_kill = dict(self.fds)

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds

    def _exit(self, status):
        raise Exited(status)


# -- _end_group_with_rank: whether the rank forks a watcher


def test_a_group_leader_forks_one_watcher_and_goes_on(monkeypatch):
    machine = Machine(monkeypatch, forked=RANK + 1)  # fork() returns the watcher's pid
    assert process._end_group_with_rank() is None  # the rank goes on with its target
    assert machine.forks == 1 and machine.killed == []


@pytest.mark.parametrize(
    "setup",
    [{"leader": False}, {"missing": ["killpg"]}, {"missing": ["fork"]}],
    ids=["not-its-own-group", "no-killpg", "no-fork"],
)
def test_no_watcher_without_a_group_of_its_own_or_the_calls_to_end_it(monkeypatch, setup):
    # not its group's leader: the group is its parent's, whose other processes it must not kill
    machine = Machine(monkeypatch, forked=RANK + 1, **setup)
    assert process._end_group_with_rank() is None
    assert machine.forks == 0 and machine.killed == []


def test_a_fork_that_fails_leaves_the_rank_without_a_watcher_not_failed(monkeypatch):
    machine = Machine(monkeypatch, forked=BlockingIOError(11, "Resource temporarily unavailable"))
    assert process._end_group_with_rank() is None
    assert machine.forks == 1 and machine.killed == []


# -- _end_group_with_rank: the watcher


def test_the_watcher_sigkills_the_rank_s_group_within_0_1_s_of_the_rank_s_end(monkeypatch):
    machine = Machine(monkeypatch, forked=0, rank_ends=0.35)
    with pytest.raises(Exited) as exited:
        process._end_group_with_rank()
    # group 0: its own, the rank's; not before the rank ended at 0.35 s, and at its first
    # look after it (it looks every 0.1 s: at 0.4 s)
    assert machine.killed == [(0, signal.SIGKILL, 0.4)]
    assert exited.value.status == 0  # it ends itself at once, never back in the rank's code


def test_the_watcher_waits_as_long_as_the_rank_lives(monkeypatch):
    machine = Machine(monkeypatch, forked=0, rank_ends=1.95)
    with pytest.raises(Exited):
        process._end_group_with_rank()
    assert machine.killed == [(0, signal.SIGKILL, 2.0)]
    assert machine.slept == [0.1] * 20  # a look every 0.1 s, and none after its kill


def test_the_watcher_holds_none_of_the_rank_s_files_only_dev_null(monkeypatch):
    # the rank's standard streams (pipes its parent reads until every holder closes them),
    # its queue, and a socket above 1024 (where the limit allows one): none stays open in the
    # watcher, whose 0, 1 and 2 are /dev/null
    fds = {0: "stdin", 1: "stdout pipe", 2: "stderr pipe", 5: "queue", 1500: "socket"}
    machine = Machine(monkeypatch, forked=0, fds=fds)
    with pytest.raises(Exited):
        process._end_group_with_rank()
    assert machine.fds_at_kill == {0: os.devnull, 1: os.devnull, 2: os.devnull}


# -- _highest_descriptor


def test_the_highest_descriptor_is_the_highest_one_open_even_above_1024(monkeypatch):
    Machine(monkeypatch, fds={0: "stdin", 1: "stdout", 2: "stderr", 7: "file", 1500: "socket"})
    assert process._highest_descriptor() == 1500


def test_without_proc_the_highest_descriptor_is_taken_as_1024(monkeypatch):
    machine = Machine(monkeypatch)

    def no_proc(path):
        raise FileNotFoundError(path)  # macOS, Windows

    machine.os.listdir = no_proc
    assert process._highest_descriptor() == 1024


@on_linux
def test_the_highest_descriptor_of_this_process_is_one_it_just_opened_above_1024():
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] <= 1600:
        pytest.skip("this process may not open descriptors above 1600")
    null = os.open(os.devnull, os.O_RDONLY)
    high = fcntl.fcntl(null, fcntl.F_DUPFD, 1500)  # the lowest free one from 1500
    try:
        assert high >= 1500 and process._highest_descriptor() >= high
    finally:
        os.close(high)
        os.close(null)


# -- _lead_own_group


def test_a_rank_leads_a_new_group_whose_id_is_its_pid(monkeypatch):
    machine = Machine(monkeypatch, leader=False)
    process._lead_own_group()
    assert machine.os.getpgid(0) == RANK
    assert machine.groups[PARENT] == PARENT  # its parent stays where it was


def test_without_setpgid_a_rank_stays_in_its_parent_s_group(monkeypatch):
    machine = Machine(monkeypatch, leader=False, missing=["setpgid"])  # Windows
    process._lead_own_group()
    assert machine.os.getpgid(0) == PARENT


def test_a_rank_that_may_not_change_its_group_goes_on_in_it(monkeypatch):
    machine = Machine(monkeypatch, leader=False)

    def refused(pid, pgid):
        raise PermissionError(1, "Operation not permitted")  # a session leader, say

    machine.os.setpgid = refused
    process._lead_own_group()
    assert machine.os.getpgid(0) == PARENT


# -- _die_with_parent


class Libc:
    """ctypes as _die_with_parent uses it: CDLL(None) and its prctl, recorded."""

    def __init__(self):
        self.prctl_calls, self.opened = [], []

    def CDLL(self, name, use_errno=False):
        self.opened.append((name, use_errno))
        return types.SimpleNamespace(prctl=lambda *args: self.prctl_calls.append(args) or 0)


class Parent:
    def __init__(self, alive):
        self.alive = alive

    def is_alive(self):
        return self.alive


@pytest.fixture
def libc(monkeypatch):
    libc = Libc()
    monkeypatch.setattr(process, "ctypes", libc)
    monkeypatch.setattr(process, "sys", types.SimpleNamespace(platform="linux"))
    exits = []
    monkeypatch.setattr(process.os, "_exit", lambda status: exits.append(status))
    libc.exits = exits
    return libc


@pytest.mark.parametrize("parent", [None, Parent(alive=True)], ids=["no-parent", "alive"])
def test_a_rank_asks_linux_for_sigkill_when_its_parent_dies(libc, parent):
    process._die_with_parent(parent)
    # PR_SET_PDEATHSIG is 1 in <linux/prctl.h>, SIGKILL is 9: no handler can delay the end
    assert libc.prctl_calls == [(1, 9)]
    assert libc.exits == []  # its parent lives (or it has none to watch): it goes on


def test_a_rank_whose_parent_died_before_it_asked_ends_at_once(libc):
    # the request only covers a death after it: an earlier one is seen on the sentinel
    process._die_with_parent(Parent(alive=False))
    assert libc.prctl_calls == [(1, 9)] and libc.exits == [1]


def test_off_linux_a_rank_asks_for_nothing(libc, monkeypatch):
    monkeypatch.setattr(process, "sys", types.SimpleNamespace(platform="darwin"))
    process._die_with_parent(Parent(alive=False))
    assert libc.opened == [] and libc.prctl_calls == [] and libc.exits == []


# -- the real calls, in a child process this test forks


def in_child(body) -> bytes:
    """What ``body()`` (run in a forked child, which then ends) writes to its pipe."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        try:
            os.close(read)
            os.write(write, body())
        finally:
            os._exit(0)
    os.close(write)
    try:
        with os.fdopen(read, "rb") as pipe:
            return pipe.read()
    finally:
        os.waitpid(child, 0)


@on_linux
def test_linux_holds_sigkill_as_the_parent_death_signal_of_a_rank():
    def ask():
        process._die_with_parent(None)
        held = ctypes.c_int()
        ctypes.CDLL(None).prctl(2, ctypes.byref(held))  # PR_GET_PDEATHSIG
        return str(held.value).encode()

    assert in_child(ask) == str(int(signal.SIGKILL)).encode()


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"  # ended, not yet reaped
    except FileNotFoundError:
        return True


@on_linux
def test_what_a_rank_started_dies_soon_after_the_rank():
    def rank():
        process._lead_own_group()
        process._end_group_with_rank()
        sleep = subprocess.Popen(["sleep", "30"])  # in the rank's group, as its workers are
        return f"{os.getpgid(0) == os.getpid()} {sleep.pid}".encode()  # then the rank ends

    leads, sleep = in_child(rank).split()
    sleep = int(sleep)
    try:
        assert leads == b"True"
        deadline = time.monotonic() + 3
        while not gone(sleep) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert gone(sleep)  # the watcher looks every 0.1 s
    finally:
        if not gone(sleep):
            os.kill(sleep, signal.SIGKILL)  # the sleep this test started


# -- _helper_of_multiprocessing


def command_line(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return cmdline.read()


@on_linux
def test_a_helper_is_known_even_with_bytes_that_are_not_utf_8_on_its_command_line():
    # argv[0] is whatever the starter chose: here a byte no UTF-8 text has, then the words
    name = b"\xff from multiprocessing.forkserver import main"
    sleep = subprocess.Popen([name, "30"], executable=shutil.which("sleep"))
    try:
        deadline = time.monotonic() + 5  # its command line reads empty for a moment after exec
        while not command_line(sleep.pid) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert process._helper_of_multiprocessing(sleep.pid) == "forkserver"
    finally:
        sleep.kill()
        sleep.wait()
