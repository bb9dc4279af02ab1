"""The grader's side of the fork server (:mod:`dpkit.grading.forkserver`), in this process.

What is checked here is what the grader holds: a :class:`~forkserver.Run` (its reply
decoded, ``poll``/``wait``/``kill`` as :class:`subprocess.Popen` answers them), how
:meth:`~forkserver.Server.start` encodes a request and passes the pipes, how the server is
started (its handshake, its environment, the probe run) and stopped (:meth:`close`, with
its kill of a server that does not end), :func:`forkserver.wanted` and
:func:`forkserver.start_server`.

Most tests talk to a socket pair or to a small scripted server (``forkserver.BOOT``
replaced), so each takes well under a second; the few that use the real server give it
empty stand-ins for torch and pytest (the preloads take seconds) and a stand-in harness.
What runs inside the server is not examined beyond what its replies show.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
from processes import alive

from dpkit.grading import forkserver

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the fork server is Linux only (/proc, pidfds)"
)


# --------------------------------------------------------------------------------------
# Helpers.


@pytest.fixture(autouse=True)
def _short_start_limit(monkeypatch):
    # The servers here start Python only (no torch): 30 s is ample on a loaded machine, and
    # a test that goes wrong fails in that time rather than in two minutes.
    monkeypatch.setattr(forkserver, "READY_SECONDS", 30.0)


def seqpacket_pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


@pytest.fixture
def run_and_peer():
    """A Run over one end of a socket pair; the other end plays the run's supervisor."""
    ours, peer = seqpacket_pair()
    try:
        yield forkserver.Run(ours), ours, peer
    finally:
        ours.close()
        peer.close()


def later(seconds: float, action) -> threading.Timer:
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@contextlib.contextmanager
def stdin_from_a_pipe():
    """This process's descriptor 0 a pipe for the while: a test run's stdin may be
    /dev/null already, and the server's must be /dev/null whatever the grader's is."""
    read, write = os.pipe()
    saved = os.dup(0)
    os.dup2(read, 0)
    try:
        yield
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read, write):
            os.close(fd)


def bare_server(sock: socket.socket, namespaces: bool) -> forkserver.Server:
    """A Server without its process: for start(), which only needs the socket and lock."""
    server = object.__new__(forkserver.Server)
    server.namespaces = namespaces
    server._socket = sock
    server._lock = threading.Lock()
    return server


def boot(monkeypatch, script: str) -> None:
    """Start ``script`` as the server: it gets the server's command line, socket and env."""
    monkeypatch.setattr(forkserver, "BOOT", script)


# A scripted server: records what it was started with and the probe it got, then replies.
# sys.argv is ["-c", the module's file, the socket's descriptor], as for the real BOOT.
SCRIPTED = """
import json, os, socket, sys
s = socket.socket(fileno=int(sys.argv[2]))
seen = {{
    "file": sys.argv[1],
    "cwd": os.getcwd(),
    "own_session": os.getsid(0) == os.getpid(),
    "env": dict(os.environ),
    "stdio": [os.readlink(f"/proc/self/fd/{{n}}") for n in (0, 1, 2)],
}}
s.send({ready!r})
message, fds, _, _ = socket.recv_fds(s, 1 << 20, 8)
if message:
    request = json.loads(message)
    seen.update(request=request, fds=len(fds))
    seen["home"] = os.path.isdir(os.path.join(request["root"], "home"))
with open(os.path.join(os.environ["HOME"], "seen.json"), "w") as file:
    json.dump(seen, file)
reply = {reply!r}
if fds and reply is not None:
    socket.socket(fileno=fds[-1]).send(reply.encode())
s.recv(1)  # until the grader closes its end
"""


def scripted(ready: bytes = b"ready", reply: str | None = '{"exit": 0}') -> str:
    return SCRIPTED.format(ready=ready, reply=reply)


def seen(scratch: Path) -> dict:
    return json.loads((scratch / "seen.json").read_text())


@pytest.fixture
def closed_servers(monkeypatch):
    """Every Server closed during the test (to check a failed start stops its process)."""
    closed: list[forkserver.Server] = []
    close = forkserver.Server.close

    def recording(self):
        closed.append(self)
        close(self)

    monkeypatch.setattr(forkserver.Server, "close", recording)
    return closed


# --------------------------------------------------------------------------------------
# A run's reply, decoded.


def test_a_run_reports_the_exit_code_its_supervisor_sends(run_and_peer):
    run, ours, peer = run_and_peer
    assert run.poll() is None and run.returncode is None  # nothing sent yet
    peer.send(b'{"exit": 3}')
    assert run.poll() == 3
    assert run.returncode == 3 and run.failed is None
    assert ours.fileno() == -1, "the control socket is closed once the run has ended"
    assert run.poll() == 3 and run.wait(0.5) == 3  # asked again: the same answer, no read


def test_a_supervisor_that_could_not_start_the_run_says_why(run_and_peer):
    run, _, peer = run_and_peer
    peer.send(b'{"error": "namespaces: EPERM", "exit": 1}')
    assert run.wait(1) == 1
    assert run.failed == "namespaces: EPERM"


def test_a_reply_without_an_exit_code_counts_as_a_failed_run(run_and_peer):
    run, _, peer = run_and_peer
    peer.send(b"{}")
    assert run.wait(1) == 1  # not 0: a run is only a success when it says so


def test_a_supervisor_gone_without_a_reply_reads_as_killed(run_and_peer):
    run, _, peer = run_and_peer
    peer.close()
    # As Popen reports a run killed by SIGKILL: negative, the signal's number.
    assert run.wait(1) == -signal.SIGKILL == -9
    assert run.failed is None


def test_a_control_socket_that_fails_to_read_reads_as_killed():
    class Unreadable(socket.socket):
        def recv(self, *args):
            raise ConnectionResetError("reset")

    ours, peer = seqpacket_pair()
    broken = Unreadable(ours.family, ours.type, 0, ours.detach())
    try:
        peer.send(b'{"exit": 0}')  # readable, but the read fails
        assert forkserver.Run(broken).wait(1) == -9
    finally:
        broken.close()
        peer.close()


def test_kill_asks_the_supervisor_and_survives_one_already_gone(run_and_peer):
    run, _, peer = run_and_peer
    run.kill()
    assert peer.recv(64) == b"kill"
    peer.close()
    run.kill()  # the supervisor is gone (so is the run): no error
    assert run.poll() == -9


# --------------------------------------------------------------------------------------
# Waiting, with and without a limit.


def test_wait_with_a_limit_raises_timeout_expired_after_that_limit(run_and_peer):
    run, _, _ = run_and_peer
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        run.wait(0.3)
    elapsed = time.monotonic() - start
    assert expired.value.timeout == 0.3
    # Not before the limit, and not a whole 1 s step past it.
    assert 0.3 <= elapsed < 0.9, elapsed
    assert run.returncode is None


def test_wait_with_a_limit_of_zero_raises_at_once_naming_zero(run_and_peer):
    run, _, _ = run_and_peer
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        run.wait(0)
    assert expired.value.timeout == 0
    assert time.monotonic() - start < 0.2


def test_wait_with_a_limit_of_zero_answers_for_a_run_that_has_ended(run_and_peer):
    run, _, peer = run_and_peer
    peer.send(b'{"exit": 0}')
    assert run.wait(0) == 0  # as Popen.wait(0) answers for a process that has exited


def test_wait_returns_as_soon_as_the_reply_comes(run_and_peer):
    run, _, peer = run_and_peer
    timer = later(0.2, lambda: peer.send(b'{"exit": 4}'))
    try:
        start = time.monotonic()
        assert run.wait(5) == 4
        assert time.monotonic() - start < 1.0  # not the full limit
    finally:
        timer.join()


def test_wait_without_a_limit_waits_past_a_second_for_the_reply(run_and_peer):
    run, _, peer = run_and_peer
    # Past the 1 s step the loop waits in: waiting with no limit must go on, not raise.
    timer = later(1.2, lambda: peer.send(b'{"exit": 5}'))
    try:
        assert run.wait() == 5
    finally:
        timer.join()


# --------------------------------------------------------------------------------------
# _readable: poll with a wait in seconds.


def test_readable_sees_data_or_a_closed_peer_and_waits_no_longer_than_asked():
    ours, peer = seqpacket_pair()
    try:
        start = time.monotonic()
        assert not forkserver._readable(ours, 0.2)
        assert 0.2 <= time.monotonic() - start < 0.8  # seconds, not milliseconds
        timer = later(0.1, lambda: peer.send(b"x"))
        try:
            assert forkserver._readable(ours, 2.0)  # comes within the wait
        finally:
            timer.join()
        assert ours.recv(8) == b"x"
        peer.close()
        assert forkserver._readable(ours, 0)  # the peer's end is closed: readable (EOF)
    finally:
        ours.close()
        peer.close()


def test_readable_with_a_negative_wait_does_not_wait():
    ours, peer = seqpacket_pair()
    # A negative wait is no wait (poll's -1 would be forever): data at 0.3 s is not seen.
    timer = later(0.3, lambda: peer.send(b"x"))
    try:
        start = time.monotonic()
        assert not forkserver._readable(ours, -1)
        assert time.monotonic() - start < 0.2
    finally:
        timer.join()
        ours.close()
        peer.close()


# --------------------------------------------------------------------------------------
# Server.start: how a request is encoded and the pipes passed.


@pytest.mark.parametrize("namespaces", [False, True])
def test_start_sends_the_request_and_the_three_pipes_then_the_control_socket(namespaces):
    ours, theirs = seqpacket_pair()
    pipes = [os.pipe() for _ in range(3)]
    received: list[int] = []
    try:
        server = bare_server(ours, namespaces)
        run = server.start(
            ("--task", "1"), {"A": "b"}, "/scratch/run", ("/class",), [write for _, write in pipes]
        )
        message, received, _, _ = socket.recv_fds(theirs, 1 << 16, 8)
        assert json.loads(message) == {
            "arguments": ["--task", "1"],
            "env": {"A": "b"},
            "root": "/scratch/run",
            "hide": ["/class"],
            "probe": False,
            "namespaces": namespaces,
        }
        assert len(received) == 4
        # The first three are the key, results and output pipes, in that order.
        for (read, _), fd in zip(pipes, received[:3]):
            os.set_blocking(read, False)  # a pipe passed in the wrong place fails, not hangs
            with contextlib.suppress(OSError):  # a socket in a pipe's place
                os.write(fd, f"to {read}".encode())
            with contextlib.suppress(BlockingIOError):
                assert os.read(read, 64) == f"to {read}".encode()
                continue
            pytest.fail(f"pipe {read} did not get what its passed end was written")
        # The fourth is the supervisor's end of the run's control socket.
        control = socket.socket(fileno=received.pop())
        control.send(b'{"exit": 0}')
        control.close()
        assert run.wait(1) == 0
    finally:
        for fd in received:
            os.close(fd)
        for pipe in pipes:
            for fd in pipe:
                os.close(fd)
        ours.close()
        theirs.close()


def test_start_keeps_no_copy_of_the_supervisors_end():
    """Once the supervisor's end is passed on, the grader holds none of it: a supervisor
    that dies is then seen as the run's end (a copy left here would hold it open)."""
    ours, theirs = seqpacket_pair()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run = bare_server(ours, False).start([], {}, "/r", [], [0, 1, 2], probe=True)
        # CPython closes a socket dropped unclosed, saying so: that too is a copy kept.
        assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
        message, received, _, _ = socket.recv_fds(theirs, 1 << 16, 8)
        assert json.loads(message)["probe"] is True
        for fd in received:
            os.close(fd)
        assert run.wait(1) == -9
    finally:
        ours.close()
        theirs.close()


def test_start_on_a_server_that_died_raises_os_error():
    ours, theirs = seqpacket_pair()
    theirs.close()
    try:
        with pytest.raises(OSError):
            bare_server(ours, True).start([], {}, "/r", [], [0, 1, 2])
    finally:
        ours.close()


# --------------------------------------------------------------------------------------
# Server.close.


def test_close_lets_the_server_end_when_its_socket_closes():
    ours, theirs = seqpacket_pair()
    # A server that exits when the grader's end closes, as the real one does.
    script = "import socket, sys; socket.socket(fileno=int(sys.argv[1])).recv(1)"
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(theirs.fileno())],
        pass_fds=(theirs.fileno(),),
        start_new_session=True,  # as the real server: close() may kill its group
    )
    theirs.close()
    try:
        server = bare_server(ours, False)
        server.process = process
        start = time.monotonic()
        server.close()
        assert process.returncode == 0, "it ended by itself, not killed"
        assert time.monotonic() - start < 5
        assert ours.fileno() == -1
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


class NotEndingInTime:
    """A server process whose wait with a limit always times out (as a hung server's)."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.pid = process.pid
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> int:
        self.waits.append(timeout)
        if timeout is not None:
            raise subprocess.TimeoutExpired("server", timeout)
        return self.process.wait()


def test_close_kills_the_whole_group_of_a_server_that_does_not_end():
    ours, _ = sock_pair = seqpacket_pair()
    # A "server" with a child in its group: the kill must reach the child too.
    process = subprocess.Popen(
        ["sh", "-c", "sleep 30 & echo $!; wait"], stdout=subprocess.PIPE, start_new_session=True
    )
    child = int(process.stdout.readline())
    try:
        server = bare_server(ours, False)
        server.process = NotEndingInTime(process)
        server.close()
        assert server.process.waits[0] is not None, "the first wait has a limit"
        assert server.process.waits[-1] is None, "after the kill, waited for"
        assert process.returncode == -signal.SIGKILL
        deadline = time.monotonic() + 5
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the server's child outlived the kill of its group"
    finally:
        for pid in (process.pid, child):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        process.wait()
        process.stdout.close()
        for end in sock_pair:
            end.close()


@pytest.mark.parametrize("error", [ProcessLookupError, PermissionError])
def test_close_survives_a_group_that_cannot_be_killed(monkeypatch, error):
    ours, theirs = seqpacket_pair()
    killed: list[tuple[int, int]] = []

    def killpg(pid, sig):
        killed.append((pid, sig))
        raise error

    class Stub:
        pid = 424242
        waits: list = []

        def wait(self, timeout=None):
            self.waits.append(timeout)
            if timeout is not None:
                raise subprocess.TimeoutExpired("server", timeout)
            return 0

    monkeypatch.setattr(os, "killpg", killpg)
    try:
        server = bare_server(ours, False)
        server.process = Stub()
        server.close()  # no error
        assert killed == [(424242, signal.SIGKILL)]
        assert Stub.waits[-1] is None
    finally:
        ours.close()
        theirs.close()


# --------------------------------------------------------------------------------------
# Starting the server: the handshake, its environment, the probe run (scripted servers).


@pytest.mark.parametrize("namespaces", [False, True])
def test_a_server_that_answers_the_probe_is_started_as_asked(tmp_path, monkeypatch, namespaces):
    boot(monkeypatch, scripted())
    monkeypatch.setenv("DPKIT_SECRET_TOKEN", "not for the server")
    monkeypatch.delenv("DPKIT_GRADE_FORKSERVER", raising=False)
    before = open_fds()
    with stdin_from_a_pipe():
        server = forkserver.Server(str(tmp_path), namespaces)
    try:
        assert server.namespaces is namespaces
        assert server.process.poll() is None
    finally:
        server.close()
    assert server.process.returncode == 0
    assert open_fds() == before, "a pipe or socket of the start is left open"
    got = seen(tmp_path)
    assert got["file"] == forkserver.__file__
    assert got["cwd"] == "/" and got["own_session"]
    assert got["stdio"] == ["/dev/null"] * 3
    env = got["env"]
    assert env["HOME"] == env["TMPDIR"] == str(tmp_path)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1"
    assert "DPKIT_SECRET_TOKEN" not in env, "the grader's environment leaked to the server"
    if "PATH" in os.environ:
        assert env["PATH"] == os.environ["PATH"]
    # The probe: a run of nothing, in a folder of its own under the scratch folder.
    request = got["request"]
    assert request["probe"] is True and request["namespaces"] is namespaces
    assert request["arguments"] == [] and request["hide"] == [] and request["env"] == {}
    assert Path(request["root"]).parent == tmp_path
    assert Path(request["root"]).name.startswith("dpkit-probe-")
    assert got["home"] and got["fds"] == 4
    assert not Path(request["root"]).exists(), "the probe's folder is left behind"


def test_debug_shows_the_server_s_errors_on_the_grader_s_stderr(tmp_path, monkeypatch):
    boot(monkeypatch, scripted())
    monkeypatch.setenv("DPKIT_GRADE_FORKSERVER", "debug")
    server = forkserver.Server(str(tmp_path))
    server.close()
    assert seen(tmp_path)["stdio"][2] != "/dev/null"


@pytest.mark.parametrize("ready", [b"", b"nope"])
def test_a_server_that_does_not_say_ready_is_stopped_and_refused(
    tmp_path, monkeypatch, closed_servers, ready
):
    # b"": the server exits at once; b"nope": it says something else.
    script = "import sys; sys.exit(1)" if not ready else scripted(ready=ready)
    boot(monkeypatch, script)
    with pytest.raises(RuntimeError, match="did not start"):
        forkserver.Server(str(tmp_path))
    assert len(closed_servers) == 1 and closed_servers[0].process.returncode is not None


def test_a_server_silent_past_the_start_limit_is_refused(tmp_path, monkeypatch, closed_servers):
    boot(monkeypatch, "import socket, sys; socket.socket(fileno=int(sys.argv[2])).recv(1)")
    monkeypatch.setattr(forkserver, "READY_SECONDS", 0.3)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="did not start"):
        forkserver.Server(str(tmp_path))
    assert time.monotonic() - start < 5
    assert closed_servers and closed_servers[0].process.returncode is not None


@pytest.mark.parametrize(
    "reply, why",
    [
        ('{"exit": 3}', "exit code 3"),
        ('{"error": "namespaces: [Errno 1] unshare: EPERM", "exit": 1}', "unshare: EPERM"),
    ],
)
def test_a_probe_that_fails_refuses_the_server_saying_why(
    tmp_path, monkeypatch, closed_servers, reply, why
):
    boot(monkeypatch, scripted(reply=reply))
    with pytest.raises(RuntimeError, match="cannot start runs here") as refused:
        forkserver.Server(str(tmp_path))
    assert why in str(refused.value)
    assert closed_servers and closed_servers[0].process.returncode == 0
    assert [p.name for p in tmp_path.iterdir()] == ["seen.json"], "the probe's folder is left"


def test_a_probe_without_an_answer_refuses_the_server_after_the_limit(
    tmp_path, monkeypatch, closed_servers
):
    boot(monkeypatch, scripted(reply=None))
    monkeypatch.setattr(forkserver, "READY_SECONDS", 0.3)
    with pytest.raises(RuntimeError, match="cannot start runs here") as refused:
        forkserver.Server(str(tmp_path))
    assert "timed out" in str(refused.value)
    assert closed_servers and closed_servers[0].process.returncode == 0


def test_a_server_that_dies_after_saying_ready_is_refused(tmp_path, monkeypatch):
    script = "import socket, sys; socket.socket(fileno=int(sys.argv[2])).send(b'ready')"
    boot(monkeypatch, script)
    with pytest.raises(RuntimeError, match="cannot start runs here"):
        forkserver.Server(str(tmp_path))


# --------------------------------------------------------------------------------------
# wanted() and start_server().


@pytest.mark.parametrize(
    "value, expected", [(None, True), ("1", True), ("debug", True), ("0", False)]
)
def test_wanted_unless_turned_off_with_0(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("DPKIT_GRADE_FORKSERVER", raising=False)
    else:
        monkeypatch.setenv("DPKIT_GRADE_FORKSERVER", value)
    assert forkserver.wanted() is expected


def test_not_wanted_off_linux(monkeypatch):
    monkeypatch.delenv("DPKIT_GRADE_FORKSERVER", raising=False)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert forkserver.wanted() is False


def test_start_server_passes_its_arguments_on(monkeypatch):
    made = []
    monkeypatch.setattr(forkserver, "Server", lambda *args: made.append(args) or "server")
    assert forkserver.start_server("/scratch") == "server"
    assert forkserver.start_server("/scratch", False) == "server"
    assert made == [("/scratch", True), ("/scratch", False)]  # namespaces by default


@pytest.mark.parametrize("error", [OSError("no processes"), RuntimeError("no namespaces")])
def test_start_server_is_none_where_the_server_cannot_start(monkeypatch, error):
    def refuse(*args):
        raise error

    monkeypatch.setattr(forkserver, "Server", refuse)
    assert forkserver.start_server("/scratch") is None


def test_start_server_is_none_for_a_real_refusal(tmp_path, monkeypatch, closed_servers):
    boot(monkeypatch, scripted(reply='{"exit": 3}'))
    assert forkserver.start_server(str(tmp_path)) is None
    assert closed_servers and closed_servers[0].process.returncode == 0


# --------------------------------------------------------------------------------------
# The real server, with empty stand-ins for its preloads and a stand-in harness.

HARNESS = """
import os, sys, time

def main(argv):
    print("harness", argv[2:], os.environ.get("WHO"), os.getcwd(), flush=True)
    if argv[2] == "hang":
        time.sleep(60)
    return int(argv[2])
"""


@pytest.fixture
def real_server(tmp_path, monkeypatch):
    stand_ins = "; ".join(
        f"sys.modules[{name!r}] = types.ModuleType({name!r})" for name in forkserver.PRELOADED
    )
    boot(monkeypatch, f"import sys, types; {stand_ins}; {forkserver.BOOT}")
    monkeypatch.delenv("DPKIT_GRADE_FORKSERVER", raising=False)

    def started(namespaces: bool) -> forkserver.Server:
        server = forkserver.Server(str(tmp_path), namespaces)
        servers.append(server)
        return server

    servers: list[forkserver.Server] = []
    try:
        yield started
    finally:
        for server in servers:
            server.close()


def run_folder(tmp_path: Path) -> Path:
    root = tmp_path / "run"
    (root / "home").mkdir(parents=True)
    grading = root / "lib" / "dpkit" / "grading"
    grading.mkdir(parents=True)
    (root / "lib" / "dpkit" / "__init__.py").write_text("")
    (grading / "__init__.py").write_text("")
    (grading / "harness.py").write_text(HARNESS)
    return root


def start_run(server: forkserver.Server, root: Path, argument: str):
    """A run with ``argument``; its output pipe's read end (the grader's ends closed)."""
    pipes = [os.pipe() for _ in range(3)]
    try:
        run = server.start([argument], {"WHO": "ada"}, str(root), [], [w for _, w in pipes])
    finally:
        for _, write in pipes:
            os.close(write)
    os.close(pipes[0][0])
    os.close(pipes[1][0])
    return run, pipes[2][0]


def test_a_real_server_runs_the_harness_and_reports_its_exit_code(tmp_path, real_server):
    server = real_server(False)
    root = run_folder(tmp_path)
    run, output = start_run(server, root, "7")
    try:
        assert run.wait(10) == 7
        with os.fdopen(output) as out:
            printed = out.read()
    finally:
        if run.returncode is None:
            run.kill()
    assert printed == f"harness ['7'] ada {root / 'home'}\n"
    server.close()
    assert server.process.returncode == 0


def test_a_real_server_s_run_is_killed_when_asked(tmp_path, real_server):
    server = real_server(False)
    run, output = start_run(server, run_folder(tmp_path), "hang")
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            run.wait(0.3)
        run.kill()
        assert run.wait(10) == -signal.SIGKILL
    finally:
        run.kill()
        os.close(output)


def test_a_real_server_starts_in_namespaces_where_they_are_usable(tmp_path, real_server):
    from dpkit.grading import apart

    if not (apart.available() and apart.usable_for(tmp_path / "run")):
        pytest.skip("no user namespaces here")
    server = real_server(True)  # its probe run entered them: it would raise otherwise
    assert server.namespaces is True
