"""dpkit.ddp.nodes piece by piece, in this test's own process: the torchrun command line of a
node, the trace file read back, the store on 127.0.0.1, the options that decide who hosts
it, how a launch is stopped, and the launch itself with its processes replaced by stand-ins.

Why in-process: the launching tests (test_ddp_nodes.py, test_nodes_loopback.py,
test_ddp_cli.py) run this code in torchrun's processes, where a mutation tool that records
which test calls which function sees none of it. Here torchrun's own ``main`` and the
processes a launch starts are stand-ins (small shell commands that print what they were
given); the sockets are real and bound to 127.0.0.1, and every process started here is
stopped in a ``finally``.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time
import types
import warnings
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.distributed.run as torchrun

from dpkit.ddp import checks, nodes
from dpkit.tracing import Event, export

LINUX = sys.platform.startswith("linux")
on_linux = pytest.mark.skipif(not LINUX, reason="reads /proc and asks prctl (Linux)")


def listening_on(port: int) -> set[str]:
    """The local addresses of the sockets listening on TCP ``port`` on this machine, in
    /proc/net's hex: ``0100007F`` is 127.0.0.1, ``00000000`` and the 32 zeros of tcp6 the
    wildcards."""
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            address, _, hex_port = fields[1].partition(":")
            if fields[3] == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def gone(pid: int, within_s: float = 2.0) -> bool:
    """Whether ``pid`` has ended (or is a zombie no one reaped yet) within ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def kill_group(launch: subprocess.Popen) -> None:
    """The test's own cleanup: whatever a planted bug left running in ``launch``'s session."""
    try:
        os.killpg(launch.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    launch.wait(timeout=5)


# -- NodesRun


def test_a_run_is_ok_only_when_every_node_exited_with_0():
    assert nodes.NodesRun([["a"], ["b"]], [0, 0], ["", ""], 1.0).ok
    assert not nodes.NodesRun([["a"], ["b"]], [0, 1], ["", ""], 1.0).ok
    assert not nodes.NodesRun([["a"], ["b"]], [-15, 0], ["", ""], 1.0).ok  # stopped by SIGTERM
    assert not nodes.NodesRun([["a"]], [None], [""], 1.0).ok  # still running: no status yet


# -- node_command


def test_a_node_s_command_is_the_launcher_then_torchrun_s_options_then_the_script():
    command = nodes.node_command(["train.py", "--epochs", "2"], node_rank=1, nnodes=3,
                                 nproc_per_node=2, port=29517)  # fmt: skip
    assert command == [
        sys.executable, "-c", nodes.LAUNCHER, "--nnodes=3", "--nproc_per_node=2",
        "--node_rank=1", "--master_addr=127.0.0.1", "--master_port=29517",
        "train.py", "--epochs", "2",
    ]  # fmt: skip


def test_what_follows_the_launcher_is_what_torchrun_s_own_parser_reads():
    # torchrun's documented options, read by its own parser: the numbers chosen here come
    # back in its fields, and the script's options stay the script's
    command = nodes.node_command(["train.py", "--epochs", "2"], 1, 3, 2, 29517)
    args = torchrun.parse_args(command[3:])
    assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("3", "2", 1)
    assert (args.master_addr, args.master_port, args.rdzv_backend) == ("127.0.0.1", 29517, "static")
    assert (args.training_script, args.training_script_args) == ("train.py", ["--epochs", "2"])
    assert not args.module


def test_a_module_script_reaches_torchrun_as_its_dash_m_option():
    command = nodes.node_command(["-m", "dpkit.ddp.train", "--out", "runs"], 0, 2, 1, 29600)
    args = torchrun.parse_args(command[3:])
    assert args.module
    assert (args.training_script, args.training_script_args) == (
        "dpkit.ddp.train",
        ["--out", "runs"],
    )
    assert (args.node_rank, args.master_port) == (0, 29600)


def test_the_launcher_runs_this_module_s_main_and_names_torchrun_for_ps():
    assert "from dpkit.ddp.nodes import main" in nodes.LAUNCHER and "main()" in nodes.LAUNCHER
    assert "torch.distributed.run" in nodes.LAUNCHER  # what `ps` shows of each node


# -- read_trace


def chrome_event(name: str, tid: int, ts: float, dur: float, **args) -> dict:
    return {"name": name, "cat": "forward", "ph": "X", "ts": ts, "dur": dur, "pid": 1, "tid": tid,
            "args": args}  # fmt: skip


def write_json(path: Path, trace_events: list[dict]) -> Path:
    path.write_text(json.dumps({"traceEvents": trace_events, "displayTimeUnit": "ms"}))
    return path


# A trace.json as dpkit.ddp.train's write_trace writes it (dpkit.tracing.export's Chrome
# format): metadata, one track per rank, "X" events in microseconds from the origin with
# step, bytes, kind and the details in args. The events are out of order on purpose.
TWO_RANKS = [
    {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "2 ranks on the CPU"}},
    {"name": "thread_name", "ph": "M", "pid": 1, "tid": 0,
     "args": {"name": "rank:0 (cpu, node 0)"}},
    {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1,
     "args": {"name": "rank:1 (cpu, node 1)"}},
    chrome_event("allreduce", 1, 3_000_000, 500_000, step=1, nbytes=92, kind="rank",
                 parameters=["0.weight", "0.bias"], last_bucket=True),
    chrome_event("apply", 0, 1_000_000, 250_000, step=1, nbytes=0, kind="rank", rows=4),
    chrome_event("apply", 1, 1_500_000, 2_000_000, step=2, nbytes=0, kind="rank", rows=4),
]  # fmt: skip


def test_read_trace_gives_each_event_its_rank_s_track_seconds_and_details(tmp_path):
    trace = nodes.read_trace(write_json(tmp_path / "trace.json", TWO_RANKS))
    got = [(e.phase, e.device, e.start, e.end, e.nbytes, e.step, e.kind, e.details)
           for e in trace.events]  # fmt: skip
    assert got == [  # by start time; 1 s = 1e6 us
        ("apply", "rank:0 (cpu, node 0)", 1.0, 1.25, 0, 1, "rank", {"rows": 4}),
        ("apply", "rank:1 (cpu, node 1)", 1.5, 3.5, 0, 2, "rank", {"rows": 4}),
        ("allreduce", "rank:1 (cpu, node 1)", 3.0, 3.5, 92, 1, "rank",
         {"parameters": ["0.weight", "0.bias"], "last_bucket": True}),
    ]  # fmt: skip
    assert trace.origin == 1.0  # the earliest start


def test_read_trace_of_a_file_without_events_has_none_and_origin_0(tmp_path):
    trace = nodes.read_trace(write_json(tmp_path / "trace.json", TWO_RANKS[:3]))
    assert trace.events == []
    assert trace.origin == 0.0


def test_read_trace_reads_back_what_dpkit_s_chrome_export_wrote(tmp_path):
    # the writer write_trace uses; times come back relative to the origin it was given
    events = [
        Event("apply", "rank:0 (cpu, node 0)", 10.5, 11.0, 0, 1, "rank", {"rows": 8}),
        Event("apply", "rank:1 (cpu, node 1)", 10.75, 11.25, 0, 1, "rank", {"rows": 8}),
        Event("allreduce", "rank:0 (cpu, node 0)", 10.875, 11.5, 4096, 1, "rank", {}),
    ]
    path = export.write_chrome_trace(events, 10.0, tmp_path / "trace.json")
    back = nodes.read_trace(path)
    assert [(e.phase, e.device, e.start, e.end, e.nbytes, e.step, e.details)
            for e in back.events] == [
        ("apply", "rank:0 (cpu, node 0)", 0.5, 1.0, 0, 1, {"rows": 8}),
        ("apply", "rank:1 (cpu, node 1)", 0.75, 1.25, 0, 1, {"rows": 8}),
        ("allreduce", "rank:0 (cpu, node 0)", 0.875, 1.5, 4096, 1, {}),
    ]  # fmt: skip
    assert back.origin == 0.5


def test_read_trace_takes_a_path_as_a_string_too(tmp_path):
    path = write_json(tmp_path / "trace.json", TWO_RANKS)
    assert len(nodes.read_trace(str(path)).events) == 3


# -- loopback_store


@on_linux
def test_the_store_listens_on_127_0_0_1_alone_and_serves_clients():
    port = checks.free_port()
    store = nodes.loopback_store(port)
    try:
        assert listening_on(port) == {"0100007F"}  # 127.0.0.1 alone: no wildcard, IPv4 or IPv6
        store.set("who", "node 0")
        client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
        assert client.get("who") == b"node 0"
        del client
    finally:
        del store


def test_a_second_multi_tenant_store_on_that_port_shares_its_server():
    # what torchrun's static rendezvous asks for on node 0: it must get this server, not
    # fail on a port in use or open one of its own on every interface
    port = checks.free_port()
    store = nodes.loopback_store(port)
    try:
        store.set("rendezvous", "here")
        second = dist.TCPStore("127.0.0.1", port, is_master=True, multi_tenant=True,
                               wait_for_workers=False)  # fmt: skip
        assert second.get("rendezvous") == b"here"
        del second
    finally:
        del store


@on_linux
def test_the_store_accepts_localhost_as_its_address():
    port = checks.free_port()
    store = nodes.loopback_store(port, "localhost")
    try:
        assert listening_on(port) == {"0100007F"}
    finally:
        del store


@on_linux
def test_the_listening_socket_has_one_owner_the_store_s_server():
    port = checks.free_port()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        store = nodes.loopback_store(port)
        gc.collect()  # a socket object still owning the descriptor would be closed and warn
        store.set("still", "serving")
        del store
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert listening_on(port) == set()  # closed with the store, once


@on_linux
def test_a_port_in_use_raises_and_leaves_no_socket_open():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        before = set(os.listdir("/proc/self/fd"))
        with pytest.raises(OSError) as error:
            nodes.loopback_store(port)
        assert error.value.errno == errno.EADDRINUSE
        assert set(os.listdir("/proc/self/fd")) <= before  # its socket closed again


# -- _options


def test_options_read_both_spellings_of_torchrun_s_options():
    dashes = nodes._options(
        [
            "--node-rank",
            "2",
            "--master-addr=10.0.0.7",
            "--master-port=29511",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint=host:1",
            "train.py",
        ]
    )
    underscores = nodes._options(["--node_rank=2", "--master_addr", "10.0.0.7",
                                  "--master_port", "29511", "--rdzv_backend=c10d",
                                  "--rdzv_endpoint", "host:1", "train.py"])  # fmt: skip
    for options in (dashes, underscores):
        assert options.node_rank == 2 and options.master_port == 29511  # ints
        assert (options.master_addr, options.rdzv_backend) == ("10.0.0.7", "c10d")
        assert options.rdzv_endpoint == "host:1"
        assert options.standalone is False


def test_options_default_as_torchrun_s_and_leave_its_other_options_alone():
    options = nodes._options(["--nnodes=2", "--nproc_per_node=4", "--standalone", "train.py"])
    # torchrun's defaults: node 0, the static rendezvous on 127.0.0.1 (the port it picks)
    assert (options.node_rank, options.master_addr) == (0, "127.0.0.1")
    assert (options.rdzv_backend, options.rdzv_endpoint) == ("static", "")
    assert options.standalone is True


def test_options_are_torchrun_s_alone_not_the_script_s(monkeypatch):
    # the script's own --node_rank and --standalone are its business, not torchrun's
    options = nodes._options(["--node_rank=1", "--master_port=29500", "train.py",
                              "--node_rank", "0", "--standalone"])  # fmt: skip
    assert (options.node_rank, options.standalone) == (1, False)
    # as torchrun reads them: an abbreviation, and a PET_ variable for an option not given
    monkeypatch.setenv("PET_NODE_RANK", "3")
    options = nodes._options(["--master_p=29511", "train.py"])
    assert (options.master_port, options.node_rank) == (29511, 3)


# -- main: torchrun's main is a stand-in that looks at the port while it "runs"


@pytest.fixture
def torchrun_main(monkeypatch):
    """Replaces torchrun's ``main``: records its argv and who listened on the port then."""
    seen = types.SimpleNamespace(argv=None, listening=None, port=None, fail=False)

    def stand_in(argv):
        seen.argv = argv
        seen.listening = listening_on(seen.port)
        if seen.fail:
            raise SystemExit(1)  # as torchrun ends when a rank fails

    monkeypatch.setattr(torchrun, "main", stand_in)
    seen.port = checks.free_port()
    return seen


def argv_for(port: int, *extra: str, node_rank: int = 0, address: str = "127.0.0.1") -> list:
    return ["--nnodes=2", "--nproc_per_node=1", f"--node_rank={node_rank}",
            f"--master_addr={address}", f"--master_port={port}", *extra, "train.py"]  # fmt: skip


@on_linux
@pytest.mark.parametrize("address", ["127.0.0.1", "localhost"])
def test_node_0_hosts_the_store_on_127_0_0_1_while_torchrun_runs_then_frees_it(
    torchrun_main, address
):
    argv = argv_for(torchrun_main.port, address=address)
    nodes.main(argv)
    assert torchrun_main.argv == argv  # torchrun gets every option, unchanged
    assert torchrun_main.listening == {"0100007F"}
    assert listening_on(torchrun_main.port) == set()  # closed once torchrun is done


@on_linux
@pytest.mark.parametrize(
    "argv_of",
    [
        lambda port: argv_for(port, node_rank=1),  # node 1 connects to node 0's store
        lambda port: argv_for(port, address="10.1.2.3"),  # a cluster's address: torchrun as is
        lambda port: ["--nnodes=2", "--node_rank=0", "--master_addr=127.0.0.1", "train.py"],
        # the script's own options are not torchrun's: node 1, whatever train.py is told
        lambda port: [*argv_for(port, node_rank=1), "--node_rank", "0"],
        lambda port: argv_for(port, "--rdzv_backend=c10d"),
        lambda port: argv_for(port, "--rdzv_endpoint=127.0.0.1:29400"),
        lambda port: argv_for(port, "--standalone"),
    ],
    ids=["node-1", "other-address", "no-port", "script-options", "c10d", "endpoint", "standalone"],
)
def test_no_store_is_hosted_unless_node_0_uses_static_rendezvous_on_loopback(
    torchrun_main, argv_of
):
    argv = argv_of(torchrun_main.port)
    nodes.main(argv)
    assert torchrun_main.argv == argv
    assert torchrun_main.listening == set()


@on_linux
def test_a_port_torchrun_reads_from_its_environment_is_hosted_on_loopback(
    torchrun_main, monkeypatch
):
    monkeypatch.setenv("PET_MASTER_PORT", str(torchrun_main.port))  # no --master_port given
    nodes.main(["--nnodes=2", "--nproc_per_node=1", "--node_rank=0", "train.py"])
    assert torchrun_main.listening == {"0100007F"}


@on_linux
def test_main_reads_sys_argv_after_the_program_name(torchrun_main, monkeypatch):
    argv = argv_for(torchrun_main.port)
    monkeypatch.setattr(sys, "argv", ["-c", *argv])  # as LAUNCHER runs it
    nodes.main()
    assert torchrun_main.argv == argv
    assert torchrun_main.listening == {"0100007F"}


@on_linux
def test_the_store_is_freed_when_torchrun_fails_too(torchrun_main):
    torchrun_main.fail = True
    with pytest.raises(SystemExit) as failed:
        nodes.main(argv_for(torchrun_main.port))
    # freed at once, not when the traceback (which holds main's frame) goes
    assert failed.value.code == 1 and failed.tb is not None
    assert torchrun_main.listening == {"0100007F"}
    assert listening_on(torchrun_main.port) == set()


# -- _stop: real processes, each in a session of its own as launch_nodes starts them


def start(script: str, popen: type = subprocess.Popen) -> subprocess.Popen:
    return popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)


class QuickWait(subprocess.Popen):
    """A Popen whose waits last 0.2 s at most: _stop's grace period, shortened for the test."""

    def wait(self, timeout=None):
        return super().wait(timeout=0.2 if timeout is None else min(timeout, 0.2))


@on_linux
@pytest.mark.parametrize(
    ("script", "popen", "ended_by"),
    [("echo ready; exec sleep 30", subprocess.Popen, signal.SIGTERM),
     # ignored past exec: SIGKILL once the (shortened) grace period is over
     ("trap '' TERM; echo ready; exec sleep 30", QuickWait, signal.SIGKILL)],
    ids=["obeys-sigterm", "ignores-sigterm"],
)  # fmt: skip
def test_stop_ends_a_process_with_sigterm_else_sigkill(script, popen, ended_by):
    launch = start(script, popen)
    try:
        assert launch.stdout.readline() == "ready\n"
        nodes._stop(launch)
        assert launch.returncode == -ended_by
    finally:
        kill_group(launch)
        launch.stdout.close()


@on_linux
def test_stop_ends_the_whole_session_even_a_child_that_ignores_sigterm():
    # the shell obeys SIGTERM and ends; its child ignores it and must get SIGKILL
    launch = start("sh -c 'trap \"\" TERM; echo $$; exec sleep 30' & wait")
    child = None
    try:
        child = int(launch.stdout.readline())  # written once its trap is set
        nodes._stop(launch)
        assert launch.returncode == -signal.SIGTERM
        assert gone(child)
    finally:
        kill_group(launch)
        launch.stdout.close()
        if child is not None and not gone(child, 0):
            os.kill(child, signal.SIGKILL)


@on_linux
def test_stop_of_a_launch_that_already_ended_does_nothing():
    launch = start("exit 3")
    launch.communicate()
    nodes._stop(launch)  # its session is gone: no error
    assert launch.returncode == 3


@on_linux
def test_each_node_asks_for_sigterm_when_the_launcher_dies():
    # PR_GET_PDEATHSIG (2) in the started process, after the exec
    ask = ("import ctypes; v = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(v)); "
           "print(v.value)")  # fmt: skip
    with_it = subprocess.run([sys.executable, "-S", "-c", ask], capture_output=True, text=True,
                             preexec_fn=nodes._end_with_the_launcher, timeout=30)  # fmt: skip
    without = subprocess.run([sys.executable, "-S", "-c", ask], capture_output=True, text=True,
                             timeout=30)  # fmt: skip
    assert (int(with_it.stdout), int(without.stdout)) == (signal.SIGTERM, 0)


# -- launch_nodes, with each node's process a small shell command instead of torchrun


@pytest.fixture
def stand_ins(monkeypatch, tmp_path):
    """launch_nodes's subprocess module, whose Popen starts ``scripts[node]`` (a shell
    command) with the options launch_nodes gave, instead of the node's torchrun."""
    scripts: dict[int, str] = {}
    started: list[subprocess.Popen] = []
    interrupt: set[int] = set()  # nodes whose communicate() is interrupted (Ctrl-C)

    class StandIn(subprocess.Popen):
        def __init__(self, command, **options):
            self.command, self.options = command, options
            self.node = int(next(a for a in command if a.startswith("--node_rank=")).split("=")[1])
            super().__init__(["sh", "-c", scripts[self.node]], **options)
            started.append(self)

        def communicate(self, *args, **kwargs):
            if self.node in interrupt:
                raise KeyboardInterrupt
            return super().communicate(*args, **kwargs)

    monkeypatch.setattr(nodes, "subprocess", types.SimpleNamespace(
        Popen=StandIn, PIPE=subprocess.PIPE, STDOUT=subprocess.STDOUT,
        TimeoutExpired=subprocess.TimeoutExpired))  # fmt: skip
    monkeypatch.setattr(checks, "free_port", lambda *_: 29517)  # nothing listens: no torchrun
    yield types.SimpleNamespace(scripts=scripts, started=started, interrupt=interrupt)
    for launch in started:
        kill_group(launch)
        if launch.stdout:
            launch.stdout.close()


SAYS_WHO = 'echo "node $N $OMP_NUM_THREADS ${GLOO_SOCKET_IFNAME:-unset} $(pwd -P)"'


@on_linux
def test_launch_starts_one_command_per_node_and_collects_statuses_and_logs(
    stand_ins, tmp_path, monkeypatch
):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(checks, "loopback_interface", lambda: "lo-test")
    stand_ins.scripts.update({0: f"N=0; {SAYS_WHO}", 1: f"N=1; {SAYS_WHO} >&2; exit 3"})
    run = nodes.launch_nodes(["train.py", "--x"], nnodes=2, nproc_per_node=3, cwd=tmp_path)
    assert run.commands == [nodes.node_command(["train.py", "--x"], n, 2, 3, 29517) for n in (0, 1)]
    assert [launch.command for launch in stand_ins.started] == run.commands
    assert run.statuses == [0, 3] and not run.ok
    here = tmp_path.resolve()
    # one thread per rank, gloo on the loopback interface, in cwd; stderr in the log too
    assert run.logs == [f"node 0 1 lo-test {here}\n", f"node 1 1 lo-test {here}\n"]
    assert 0 <= run.seconds < 10
    for launch in stand_ins.started:
        assert launch.options["start_new_session"] is True  # stopped as a whole by _stop
        assert launch.options["preexec_fn"] is nodes._end_with_the_launcher
        assert launch.options["env"]["OMP_NUM_THREADS"] == "1"


@on_linux
@pytest.mark.parametrize(
    "preset, loopback, expected",
    [("eth7", "lo", "eth7"), (None, "lo", "lo"), (None, None, "unset")],
    ids=["caller-s-choice-kept", "loopback", "no-loopback"],
)
def test_gloo_s_interface_is_the_caller_s_else_the_loopback(
    stand_ins, monkeypatch, preset, loopback, expected
):
    if preset is None:
        monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    else:
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", preset)
    monkeypatch.setattr(checks, "loopback_interface", lambda: loopback)
    stand_ins.scripts[0] = 'echo "${GLOO_SOCKET_IFNAME:-unset}"'
    run = nodes.launch_nodes(["train.py"], nnodes=1, nproc_per_node=1)
    assert run.logs == [f"{expected}\n"] and run.ok


@on_linux
def test_a_node_past_the_limit_is_stopped_and_its_log_says_so(stand_ins):
    stand_ins.scripts.update({0: "echo started; exec sleep 30", 1: "echo done"})
    run = nodes.launch_nodes(["train.py"], nnodes=2, nproc_per_node=1, limit_s=0.25)
    assert run.statuses == [-signal.SIGTERM, 0]
    assert run.logs[0].startswith("started\n") and run.logs[0].endswith("\n[stopped after 0.25 s]")
    assert run.logs[1] == "done\n"
    assert run.seconds < 10  # not the 30 s of the sleep


@on_linux
def test_an_interrupted_launch_stops_every_node_before_it_raises(stand_ins):
    stand_ins.scripts.update({0: "exec sleep 30", 1: "exec sleep 30"})
    stand_ins.interrupt.add(0)  # Ctrl-C while waiting for node 0
    with pytest.raises(KeyboardInterrupt):
        nodes.launch_nodes(["train.py"], nnodes=2, nproc_per_node=1)
    assert [launch.returncode for launch in stand_ins.started] == [-signal.SIGTERM] * 2
    assert all(gone(launch.pid, 0) for launch in stand_ins.started)


@pytest.mark.parametrize(
    "nnodes, nproc_per_node, name",
    [(0, 1, "nnodes"), (True, 1, "nnodes"), (1.5, 1, "nnodes"), ("2", 1, "nnodes"),
     (1, 0, "nproc_per_node"), (1, False, "nproc_per_node"), (2, -1, "nproc_per_node")],
)  # fmt: skip
def test_launch_refuses_node_counts_that_are_not_whole_numbers_of_at_least_1(
    stand_ins, nnodes, nproc_per_node, name
):
    with pytest.raises(ValueError, match=rf"{name} must be a whole number of at least 1"):
        nodes.launch_nodes(["train.py"], nnodes=nnodes, nproc_per_node=nproc_per_node)
    assert stand_ins.started == []


def test_launch_refuses_more_ranks_than_the_cores_hold_before_starting_any(stand_ins, monkeypatch):
    monkeypatch.setattr(checks, "cores", lambda: 1)  # at most 4 ranks
    with pytest.raises(ValueError, match=r"nproc=6 .*nproc<=4"):
        nodes.launch_nodes(["train.py"], nnodes=2, nproc_per_node=3)
    assert stand_ins.started == []


# -- train_on_nodes, with launch_nodes a stand-in


@pytest.fixture
def launches(monkeypatch):
    """launch_nodes replaced: records each call's arguments, returns a run that went well."""
    calls: list[dict] = []

    def stand_in(script, nnodes=2, nproc_per_node=2, limit_s=180.0, cwd=None):
        calls.append(dict(script=script, nnodes=nnodes, nproc_per_node=nproc_per_node,
                          limit_s=limit_s, cwd=cwd))  # fmt: skip
        return nodes.NodesRun([], [0] * nnodes, [], 0.0)

    monkeypatch.setattr(nodes, "launch_nodes", stand_in)
    return calls


def test_train_on_nodes_runs_dpkit_s_training_script_with_each_rank_s_share(launches, tmp_path):
    run = nodes.train_on_nodes(tmp_path / "out", nnodes=2, nproc_per_node=2, model="cnn",
                               batch=8, steps=5, bucket_mb=0.5, timeout=30.0)  # fmt: skip
    assert run.ok
    (call,) = launches
    # 8 rows over 4 ranks: 2 each; 5 steps of 8 in one epoch: 40 samples
    assert call["script"] == [
        "-m", "dpkit.ddp.train", "--model", "cnn", "--samples", "40", "--batch-per-rank", "2",
        "--epochs", "1", "--bucket-mb", "0.5", "--timeout", "30.0", "--out", str(tmp_path / "out"),
    ]  # fmt: skip
    assert (call["nnodes"], call["nproc_per_node"]) == (2, 2)
    assert call["limit_s"] == 150.0  # the training's timeout and 120 s for the starts


def test_train_on_nodes_defaults_to_two_nodes_of_one_rank(launches):
    nodes.train_on_nodes("runs/two")
    (call,) = launches
    assert (call["nnodes"], call["nproc_per_node"], call["limit_s"]) == (2, 1, 240.0)
    script = call["script"]
    assert script[script.index("--batch-per-rank") + 1] == "32"  # 64 rows over 2 ranks
    assert script[script.index("--samples") + 1] == "192"  # 3 steps of 64
    assert script[-2:] == ["--out", "runs/two"]
    assert script[script.index("--model") + 1] == "mlp"  # the course's MLP
    assert "--bucket-mb" not in script  # torch's buckets: the first 1 MiB, then 25


def test_train_on_nodes_refuses_a_model_it_does_not_know_before_any_start(launches):
    with pytest.raises(ValueError, match="model='resnet' is not one of mlp, cnn"):
        nodes.train_on_nodes("out", model="resnet")
    assert launches == []


def test_train_on_nodes_refuses_a_batch_the_ranks_cannot_share_and_names_the_fix(launches):
    with pytest.raises(ValueError) as refused:
        nodes.train_on_nodes("out", nnodes=2, nproc_per_node=2, batch=10)
    message = str(refused.value)
    assert "batch=10" in message and "4 ranks" in message
    assert "multiple of 4" in message and "e.g. 12" in message  # the next multiple
    assert launches == []


def test_train_on_nodes_refuses_more_ranks_than_the_cores_hold(launches, monkeypatch):
    monkeypatch.setattr(checks, "cores", lambda: 1)  # at most 4 ranks
    with pytest.raises(ValueError, match=r"nproc=6 .*nproc<=4"):
        nodes.train_on_nodes("out", nnodes=3, nproc_per_node=2, batch=12)
    assert launches == []


# --------------------------------------------------------------------------------------
# Several nodes on loopback: GPUs of their own (torchrun replaced)


@pytest.mark.parametrize(
    "node, nnodes, per_node, gpus, visible",
    [
        (0, 2, 1, ["0"], ""),  # 2 one-rank nodes, 1 GPU: not both on GPU 0, both on the CPU
        (1, 2, 1, ["0"], ""),
        (0, 2, 1, ["0", "1"], "0"),  # ... 2 GPUs: one each
        (1, 2, 1, ["0", "1"], "1"),
        (1, 2, 2, ["0", "1", "2", "3", "4"], "2,3"),
        (1, 2, 2, ["3", "5", "6", "7"], "6,7"),  # the GPUs CUDA_VISIBLE_DEVICES left
        (1, 2, 2, ["0", "1", "2"], ""),
        (0, 3, 1, [], ""),
    ],
)  # fmt: skip
def test_gpus_of_node_gives_each_node_its_own_or_none(node, nnodes, per_node, gpus, visible):
    assert nodes.gpus_of_node(node, nnodes, per_node, gpus) == visible


@pytest.mark.parametrize(
    "options, set_to",
    [
        (["--nnodes=2", "--nproc_per_node=1", "--node_rank=1", "--master_addr=127.0.0.1"], "1"),
        (["--nnodes=2", "--nproc_per_node=2", "--node_rank=0", "--master_addr=localhost"], "0,1"),
        (["--nnodes=3", "--nproc_per_node=2", "--node_rank=0", "--master_addr=127.0.0.1"], ""),
        (["--nnodes=2", "--nproc_per_node=1", "--node_rank=1", "--master_addr=10.0.0.1"], None),
        (["--nnodes=1", "--nproc_per_node=2", "--master_addr=127.0.0.1"], None),
        (["--nproc_per_node=2"], None),  # one node: torchrun as it is
    ],
)  # fmt: skip
def test_nodes_on_loopback_get_gpus_of_their_own_before_torchrun_starts(
    monkeypatch, options, set_to
):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpus_seen_by_torchrun(monkeypatch, options) == [set_to]


@pytest.mark.parametrize(
    "visible, count, node, set_to",
    [
        ("3,5,6,7", 4, 1, "6,7"),  # node 1 of 2 x 2 ranks: the last two GPUs left visible
        ("3,5,6,7", 4, 0, "3,5"),
        ("7,2", 2, 1, ""),  # two GPUs for 4 ranks: every rank on the CPU
        ("0,1,2,3,4,5", 4, 1, "2,3"),  # torch counts 4 of the 6 names: the first 4
    ],
)
def test_nodes_on_loopback_share_out_the_gpus_cuda_visible_devices_leaves(
    monkeypatch, visible, count, node, set_to
):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    options = ["--nnodes=2", "--nproc_per_node=2", f"--node_rank={node}"]
    assert gpus_seen_by_torchrun(monkeypatch, [*options, "--master_addr=127.0.0.1"]) == [set_to]


def gpus_seen_by_torchrun(monkeypatch, options: list[str]) -> list:
    """What CUDA_VISIBLE_DEVICES torchrun starts with under nodes.main (torchrun replaced)."""
    from torch.distributed import run

    seen = []
    monkeypatch.setattr(
        run, "main", lambda argv: seen.append(os.environ.get("CUDA_VISIBLE_DEVICES"))
    )
    monkeypatch.setattr(nodes, "loopback_store", lambda *args: None)
    nodes.main([*options, "--master_port=29999", "train.py"])
    return seen
