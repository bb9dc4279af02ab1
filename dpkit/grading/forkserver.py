"""A class's grading runs forked from one process that has imported torch and pytest once.

The surprise first: starting Python and importing torch, pytest and hypothesis is about
2 s of CPU, a third of what grading one correct student costs; a class paid it once per
student. Here a server process imports them once, and each run is a fork of it: still a
process of its own, in namespaces of its own, with its own temporary folder, pipes and key,
exactly as :mod:`dpkit.grading.apart` starts a run through ``unshare``:

- the server forks a *supervisor* per run, which enters new user, mount, PID and network
  namespaces (as the instructor's user mapped to root in them: nothing is gained outside),
  covers the class folder and the solutions with empty folders, mounts the run's folder
  over the folder every run of the class is made in, and forks the run;
- the run is the first process of its PID namespace: it mounts its own ``/proc``, enters a
  second user and mount namespace (so it cannot unmount any of that), moves to its home,
  puts its stdout and stderr on its output pipe, takes the run's environment, and calls
  :func:`dpkit.grading.harness.main` from the run's private copy of dpkit;
- when the run ends, the supervisor sends its exit status to the grader and exits; when
  the grader asks, or goes away, the supervisor kills the run, and with it (the first
  process of its PID namespace) every process the submission started.

Where namespaces are not available, runs are forked all the same, without them (as
started runs are then): the supervisor is a *subreaper* instead, so every process the run
starts that outlives its parent (one that left its session with setsid included) becomes
the supervisor's child, and is killed when the run ends. A forked run's environment as
``/proc`` shows it is the server's, so the marker :mod:`dpkit.grading.sandbox` kills
started runs' processes by would not find them.

The server holds no key and no submission: each run's pipes arrive over a Unix socket,
are passed to its supervisor and closed. Nothing of the checkout's dpkit is imported in
the server (it runs this file with ``python -I``, standard library and the preloads
only), and it never runs a submission: each run is a fresh fork. This file's top level
imports the standard library only. Where the server cannot start, runs start as before
(:mod:`dpkit.grading.sandbox`); ``DPKIT_GRADE_FORKSERVER=0`` starts every run so;
``DPKIT_GRADE_FORKSERVER=debug`` shows the server's own errors on the grader's stderr.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence

PRELOADED = ("torch", "pytest", "hypothesis", "_hypothesis_pytestplugin", "torch.testing")
READY_SECONDS = 120.0  # to start the server: Python and torch on a busy machine
MESSAGE_LIMIT = 1 << 20
DEVNULL = subprocess.DEVNULL

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


# --------------------------------------------------------------------------------------
# The grader's side.


class Run:
    """A run started by the server, answering like :class:`subprocess.Popen` does for it:
    ``poll()``, ``wait()``, ``kill()`` and ``returncode`` (negative: killed by a signal)."""

    def __init__(self, control: socket.socket) -> None:
        self._control = control
        self.returncode: int | None = None
        self.failed: str | None = None  # the supervisor could not start the run: why

    def _receive(self, wait: float) -> None:
        if self.returncode is not None:
            return
        if not _readable(self._control, wait):
            return
        try:
            data = self._control.recv(MESSAGE_LIMIT)
        except OSError:
            data = b""
        message = json.loads(data) if data else {"exit": -signal.SIGKILL}
        self.failed = message.get("error")
        self.returncode = int(message.get("exit", 1))
        self._control.close()

    def poll(self) -> int | None:
        self._receive(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:  # as Popen: a run that has ended answers even wait(0)
            left = 1.0 if deadline is None else deadline - time.monotonic()
            self._receive(min(left, 1.0))
            if self.returncode is not None:
                return self.returncode
            if left <= 0:
                raise subprocess.TimeoutExpired("grading run", timeout or 0)

    def kill(self) -> None:
        if self.returncode is None:
            try:
                self._control.send(b"kill")
            except OSError:  # the supervisor is gone: so is the run
                pass


class Server:
    """The fork server of one class's grading: :meth:`start` a run, :meth:`close` at the end."""

    def __init__(self, scratch: str, namespaces: bool = True) -> None:
        self.namespaces = namespaces
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TZ") if k in os.environ}
        env.update(HOME=scratch, TMPDIR=scratch, PYTHONDONTWRITEBYTECODE="1")
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        self._socket = ours
        self._lock = threading.Lock()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-c", BOOT, __file__, str(theirs.fileno())],
                cwd="/",  # nothing of the class in its working directory or command line
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=DEVNULL,
                stderr=None if os.environ.get("DPKIT_GRADE_FORKSERVER") == "debug" else DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        finally:
            theirs.close()
        if not _readable(ours, READY_SECONDS) or ours.recv(64) != b"ready":
            self.close()
            raise RuntimeError("the grading fork server did not start")
        # One run that only enters the namespaces (or only forks, without them): where the
        # system refuses them to this process (they were probed with util-linux's unshare),
        # runs start as before.
        probe = tempfile.mkdtemp(prefix="dpkit-probe-", dir=scratch)
        os.mkdir(os.path.join(probe, "home"))
        pipes = [os.pipe() for _ in range(3)]
        code = None
        try:
            run = self.start([], {}, probe, [], [write for _, write in pipes], probe=True)
            code = run.wait(READY_SECONDS)
            why = run.failed or f"exit code {code}"
        except (OSError, subprocess.TimeoutExpired) as error:
            why = str(error)
        finally:
            for pipe in pipes:
                for fd in pipe:
                    os.close(fd)
            shutil.rmtree(probe, ignore_errors=True)
        if code != 0:
            self.close()
            raise RuntimeError(f"the grading fork server cannot start runs here: {why}")

    def start(
        self,
        arguments: Sequence[str],
        env: Mapping[str, str],
        root: str,
        hide: Sequence[str],
        fds: Sequence[int],
        probe: bool = False,
    ) -> Run:
        """Start a run of the harness with ``arguments`` in ``env``; ``root`` is the run's
        scratch folder (its files one level down, in a folder of the same name), ``hide``
        the folders covered; ``fds`` the key, results and output pipes' ends, in that order."""
        control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        request = {"arguments": list(arguments), "env": dict(env), "root": root}
        request.update(hide=list(hide), probe=probe, namespaces=self.namespaces)
        try:
            with self._lock:
                socket.send_fds(
                    self._socket, [json.dumps(request).encode()], [*fds, theirs.fileno()]
                )
        finally:
            theirs.close()
        return Run(control)

    def close(self) -> None:
        """Stop the server: it waits for its supervisors, which kill their runs if need be
        (so the CPU time of every run is counted in the grader's children's)."""
        self._socket.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            try:  # not waited for yet: its pid, its group's id, is still its own
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.process.wait()


def _readable(sock: socket.socket, wait: float) -> bool:
    # poll, not select: select refuses descriptors past 1023 (see sandbox._Reader)
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(max(wait, 0) * 1000))


def wanted() -> bool:
    """Whether a class's runs may be forked: on Linux (prctl, pidfds, /proc), unless
    ``DPKIT_GRADE_FORKSERVER=0``."""
    linux = sys.platform.startswith("linux")
    return linux and os.environ.get("DPKIT_GRADE_FORKSERVER", "1") != "0"


def start_server(scratch: str, namespaces: bool = True) -> Server | None:
    """A fork server for a class's runs, in namespaces or not, or None where it cannot start."""
    try:
        return Server(scratch, namespaces)
    except (OSError, RuntimeError):
        return None


# --------------------------------------------------------------------------------------
# The server's side: everything below runs in the server and its forks, never in the grader.

BOOT = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__dpkit_forkserver__')"


def _libc() -> Callable[..., None]:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def call(name: str, *args: object) -> None:
        if getattr(libc, name)(*args) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"{name}: {os.strerror(error)}")

    return call


def _ulong(value: int) -> object:
    import ctypes

    return ctypes.c_ulong(value)


def _numeric(names: list[str]) -> list[str]:
    return [name for name in names if name.isdigit()]


def _map_root(uid: int, gid: int) -> None:
    """After entering a new user namespace: this user is its root, and no one else."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as file:
            file.write(text)


def _run(request: dict, key: int, results: int, output: int, call: Callable[..., None]) -> None:
    """In the run (the first process of its PID namespace, if any): the harness, then exit."""
    if request["namespaces"]:
        flags = _ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC)
        call("mount", b"proc", b"/proc", b"proc", flags, None)
        call("unshare", CLONE_NEWUSER | CLONE_NEWNS)  # the mounts above are now locked
        _map_root(0, 0)
    # Set after entering a user namespace, which clears it.
    call("prctl", PR_SET_PDEATHSIG, _ulong(signal.SIGKILL), _ulong(0), _ulong(0), _ulong(0))
    if request.get("probe"):
        alone = os.getpid() == 1 and len(_numeric(os.listdir("/proc"))) == 1
        os._exit(0 if alone or not request["namespaces"] else 3)
    root = request["root"]
    home = os.path.join(root, "home")
    os.chdir(home)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    os.setsid()
    os.environ.clear()
    os.environ.update(request["env"])
    lib = os.path.join(root, "lib")
    sys.path[:0] = [home, lib]
    sys.dont_write_bytecode = True
    harness = os.path.join(lib, "dpkit", "grading", "harness.py")
    sys.argv = [harness, *request["arguments"]]
    from dpkit.grading.harness import main

    code = main([str(key), str(results), *request["arguments"]])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _supervise(request: dict, fds: list[int]) -> int:
    """In the supervisor: namespaces, the run forked, its exit status sent back.

    Without namespaces, the supervisor is a subreaper (``PR_SET_CHILD_SUBREAPER``): every
    process the run starts that outlives its parent, one that left its session with setsid
    included, becomes the supervisor's child, and is killed when the run ends."""
    key, results, output, control_fd = fds
    control = socket.socket(fileno=control_fd)
    try:
        call = _libc()
        if not request["namespaces"]:
            call("prctl", PR_SET_CHILD_SUBREAPER, _ulong(1), _ulong(0), _ulong(0), _ulong(0))
            raise _NoNamespaces
        uid, gid = os.getuid(), os.getgid()
        call("unshare", CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET)
        _map_root(uid, gid)
        call("mount", b"none", b"/", None, _ulong(MS_REC | MS_PRIVATE), None)
        for folder in request["hide"]:
            if os.path.isdir(folder):
                options = b"size=64k,mode=0555"
                call("mount", b"dpkit-hidden", os.fsencode(folder), b"tmpfs", _ulong(0), options)
        root = request["root"]
        above = os.fsencode(os.path.dirname(root))
        call("mount", os.fsencode(root), above, None, _ulong(MS_BIND), None)
    except _NoNamespaces:
        pass
    except OSError as error:
        control.send(json.dumps({"error": f"namespaces: {error}", "exit": 1}).encode())
        return 1
    pid = os.fork()
    if pid == 0:
        try:
            control.close()
            _run(request, key, results, output, call)
        except BaseException as error:  # noqa: BLE001 - said on the run's output, then out
            os.write(2, f"dpkit grade: the run did not start: {error!r}\n".encode())
        os._exit(1)
    for fd in (key, results, output):
        os.close(fd)
    run = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(control, select.POLLIN | select.POLLHUP)
    poller.register(run, select.POLLIN)
    while True:
        ready = dict(poller.poll())
        if run in ready:
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            _kill_children()  # without namespaces: what the run left (with them, nothing)
            try:
                control.send(json.dumps({"exit": code}).encode())
            except OSError:
                pass
            return 0
        if control.fileno() in ready:  # "kill", or the grader went away
            try:  # through the pidfd held since the fork: never a later holder of the pid
                signal.pidfd_send_signal(run, signal.SIGKILL)
            except ProcessLookupError:
                pass
            poller.unregister(control)


class _NoNamespaces(Exception):
    """A run of a server without namespaces: nothing to enter."""


def _children() -> list[int]:
    """This process's children (ended ones too, until they are waited for)."""
    me, found = str(os.getpid()), []
    for name in _numeric(os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat", "rb") as file:
                fields = file.read().rpartition(b")")[2].split()
        except OSError:  # gone
            continue
        if len(fields) > 1 and fields[1].decode() == me:
            found.append(int(name))
    return found


def _kill_children() -> None:
    """Kill and wait for every child until none is left: as each dies, its own children
    become this subreaper's, and are killed in the next round. Killed by number, safely:
    a child's pid cannot go to another process until its parent waits for it, and this
    thread waits only after each round's kills."""
    for _ in range(1000):
        children = _children()
        if not children:
            return
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap(os.WNOHANG)
        time.sleep(0.005)


def _reap(flags: int) -> None:
    """Wait for ended children (all of them, with ``flags`` 0): in the server its
    supervisors, so that their CPU time and their runs' count in the grader's children's;
    in a supervisor, what its run left."""
    while True:
        try:
            pid, _ = os.waitpid(-1, flags)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(fd: int) -> None:
    """The server: preload, say ready, fork a supervisor per request until the grader leaves."""
    import importlib

    sys.dont_write_bytecode = True
    for name in PRELOADED:
        importlib.import_module(name)
    server = socket.socket(fileno=fd)
    server.send(b"ready")
    while True:
        _reap(os.WNOHANG)  # the supervisors of runs that ended
        try:
            message, fds, _, _ = socket.recv_fds(server, MESSAGE_LIMIT, 4)
        except OSError:
            message, fds = b"", []
        if not message:  # the grader closed its end: the class is done
            _reap(0)
            return
        if len(fds) != 4:
            for descriptor in fds:
                os.close(descriptor)
            continue
        try:
            child = os.fork()
        except OSError:  # no process to be had: the grader sees the run end at once
            child = -1
        if child == 0:
            code = 1
            try:
                server.close()
                keep = set(fds)
                for descriptor in map(int, os.listdir("/proc/self/fd")):
                    if descriptor > 2 and descriptor not in keep:
                        try:
                            os.close(descriptor)
                        except OSError:
                            pass
                code = _supervise(json.loads(message), fds)
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        for descriptor in fds:
            os.close(descriptor)


if __name__ == "__dpkit_forkserver__":
    serve(int(sys.argv[2]))
