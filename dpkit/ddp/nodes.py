"""Several "nodes" on this one machine: one ``torchrun`` per node, as on a real cluster.

The surprise first: nothing here is simulated. Each node is its own ``torchrun``
(``torch.distributed.run``'s ``main``, which the ``torchrun`` command runs) with
``--nnodes``, its own ``--node_rank`` and the same ``--master_addr``/``--master_port``: the
commands one types on each machine of a cluster, here all pointing at 127.0.0.1.
``torchrun`` on node 0 hosts the rendezvous; the ranks (``RANK = node_rank *
nproc_per_node + LOCAL_RANK``) then train over gloo. What is not a cluster: the "network"
between the nodes is this machine's loopback interface.

Safety: torchrun's rendezvous store is torch's TCPStore, which listens on every network
interface whatever ``--master_addr`` says: torch 2.13 has no bind address for it, and
torchrun none to pass. So each node runs torchrun's ``main`` through :func:`main`
(:data:`LAUNCHER`), which on node 0 first opens the store's port on 127.0.0.1 alone and
hosts the store's server on that socket (:func:`loopback_store`: TCPStore's
``master_listen_fd``); torchrun's static rendezvous then asks for a ``multi_tenant`` store
on the same port and gets that server (torch shares one server per port in a process).
The ranks' own gloo connections are kept on the loopback interface
(``GLOO_SOCKET_IFNAME``). Each node gets GPUs of its own, as each machine of a cluster has
(:func:`gpus_of_node`; none where there are too few for every rank). Every launch runs in
a session of its own and is stopped, with everything it started, after ``limit_s`` seconds
or when the caller is interrupted; on Linux each ``torchrun`` also gets SIGTERM when the
process that started it dies (even by SIGKILL), and stops its ranks.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpkit.ddp import checks
from dpkit.tracing import Event, Trace


@dataclass
class NodesRun:
    """What :func:`launch_nodes` ran: the command of each node, its exit status, its log,
    and the wall time of the whole launch (seconds)."""

    commands: list[list[str]]
    statuses: list[int]
    logs: list[str]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(status == 0 for status in self.statuses)


# What each node's process runs: torchrun's main through main() below. Its comment names
# torchrun's module, so that ``ps`` (and whoever looks for torchrun's processes) sees it.
LAUNCHER = "from dpkit.ddp.nodes import main; main()  # torch.distributed.run, store on loopback"


def node_command(
    script: Sequence[str], node_rank: int, nnodes: int, nproc_per_node: int, port: int
) -> list[str]:
    """The ``torchrun`` command of node ``node_rank`` (``script``: a path and its options,
    or ``["-m", "module", ...]``): torchrun's own ``main`` run by :func:`main`, which keeps
    node 0's store on 127.0.0.1; ``command[3:]`` is what follows ``torchrun``."""
    return [
        sys.executable, "-c", LAUNCHER,
        f"--nnodes={nnodes}", f"--nproc_per_node={nproc_per_node}", f"--node_rank={node_rank}",
        "--master_addr=127.0.0.1", f"--master_port={port}", *script,
    ]  # fmt: skip


def launch_nodes(
    script: Sequence[str],
    nnodes: int = 2,
    nproc_per_node: int = 2,
    limit_s: float = 180.0,
    cwd: str | Path | None = None,
) -> NodesRun:
    """Run ``script`` as ``nnodes`` nodes of ``nproc_per_node`` ranks each on 127.0.0.1, one
    ``torchrun`` per node, and wait for all; every launch is stopped after ``limit_s``."""
    for name, value in (("nnodes", nnodes), ("nproc_per_node", nproc_per_node)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
    checks.check_nproc(nnodes * nproc_per_node)
    port = checks.free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the ranks share this machine's cores
    loopback = checks.loopback_interface()
    if loopback is not None:
        env.setdefault("GLOO_SOCKET_IFNAME", loopback)
    commands = [node_command(script, n, nnodes, nproc_per_node, port) for n in range(nnodes)]
    started = time.monotonic()
    launches = [
        subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            preexec_fn=_end_with_the_launcher,
        )  # fmt: skip
        for command in commands
    ]
    logs: list[str] = []
    try:
        for launch in launches:
            remaining = max(1.0, limit_s - (time.monotonic() - started))
            try:
                logs.append(launch.communicate(timeout=remaining)[0])
            except subprocess.TimeoutExpired:
                _stop(launch)
                logs.append(launch.communicate()[0] + f"\n[stopped after {limit_s:g} s]")
    finally:
        for launch in launches:
            _stop(launch)
    return NodesRun(commands, [launch.returncode for launch in launches], logs,
                    time.monotonic() - started)  # fmt: skip


def _end_with_the_launcher() -> None:
    """Run in each ``torchrun``'s process before it starts: ask Linux for SIGTERM when the
    launcher dies (``PR_SET_PDEATHSIG``; it survives the exec). torchrun then stops its
    ranks. Without it a launcher killed by SIGKILL left its nodes training: they run in
    sessions of their own, which no terminal's signal reaches."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG, <linux/prctl.h>


def train_on_nodes(
    out: str | Path,
    nnodes: int = 2,
    nproc_per_node: int = 1,
    model: str = "mlp",
    batch: int = 64,
    steps: int = 3,
    bucket_mb: float | None = None,
    timeout: float = 120.0,
) -> NodesRun:
    """``dpkit ddp --nnodes``: :mod:`dpkit.ddp.train` on ``nnodes`` nodes of
    ``nproc_per_node`` ranks each (one ``torchrun`` per node, on 127.0.0.1), ``steps`` SGD
    steps of a global ``batch``; rank 0 writes ``trace.json`` and ``ranks.json`` into
    ``out``. Refuses a model it does not know, and a batch the ranks cannot share evenly,
    before anything starts."""
    from dpkit.ddp.workload import named_workload

    named_workload(model)  # a ValueError naming the models, not one from every rank later
    world = checks.check_nproc(nnodes * nproc_per_node)
    if batch % world:
        raise ValueError(
            f"batch={batch} does not split evenly over {nnodes} nodes x {nproc_per_node} "
            f"ranks = {world} ranks; use a multiple of {world}, e.g. "
            f"{(batch // world + 1) * world}"
        )
    script = [
        "-m", "dpkit.ddp.train", "--model", model, "--samples", str(batch * steps),
        "--batch-per-rank", str(batch // world), "--epochs", "1",
        *(["--bucket-mb", repr(bucket_mb)] if bucket_mb is not None else []),  # else torch's
        "--timeout", repr(timeout), "--out", str(out),
    ]  # fmt: skip
    # torchrun's own start and every rank's import of torch come on top of the training
    return launch_nodes(script, nnodes, nproc_per_node, limit_s=timeout + 120)


def _stop(launch: subprocess.Popen) -> None:
    """End ``launch``'s session: torchrun, its ranks, and what they started."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(launch.pid, signum)
        except (ProcessLookupError, PermissionError):
            return
        try:
            launch.wait(timeout=5)
        except subprocess.TimeoutExpired:
            continue


def read_trace(path: str | Path) -> Trace:
    """The :class:`dpkit.Trace` of a ``trace.json`` that dpkit wrote (a Chrome trace: one
    track per rank, each event's step, bytes, kind and details in its ``args``), so that the
    figures of :mod:`dpkit.viz` draw a run that other processes recorded (memory records are
    not in the file)."""
    data = json.loads(Path(path).read_text())["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in data if e.get("name") == "thread_name"}
    events = []
    for event in data:
        if event.get("ph") != "X":
            continue
        args = dict(event["args"])
        step, nbytes, kind = args.pop("step"), args.pop("nbytes"), args.pop("kind")
        start = event["ts"] / 1e6
        events.append(
            Event(event["name"], tracks[event["tid"]], start, start + event["dur"] / 1e6,
                  nbytes, step, kind, args)
        )  # fmt: skip
    trace = Trace()
    trace._events = sorted(events, key=lambda e: e.start)  # as dpkit.ddp.run.merged_trace does
    trace.origin = min((e.start for e in events), default=0.0)
    return trace


LOOPBACK_ADDRESSES = ("127.0.0.1", "localhost")


def loopback_store(port: int, address: str = "127.0.0.1") -> Any:
    """A TCPStore server listening on ``address``:``port`` alone (a socket bound there and
    handed to TCPStore as ``master_listen_fd``), shared with every later ``multi_tenant``
    TCPStore on that port in this process; keep the store for as long as it serves. torch's
    own server binds every interface (its C++ server binds the IPv6 and IPv4 wildcards);
    given a listening socket, it serves that one, and closes it with its last store."""
    import torch.distributed as dist

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore does
    try:
        listener.bind((address, port))
        listener.listen(socket.SOMAXCONN)
        store = dist.TCPStore(
            address, port, is_master=True, multi_tenant=True, wait_for_workers=False,
            master_listen_fd=listener.fileno(), timeout=datetime.timedelta(seconds=900),
        )  # fmt: skip
    except BaseException:
        listener.close()
        raise
    listener.detach()  # the server owns the descriptor now: one owner, one close
    return store


def _options(argv: Sequence[str]) -> argparse.Namespace:
    """torchrun's own reading of its options in ``argv`` (its parser: both spellings,
    abbreviations, ``PET_*`` variables, and nothing of the script's arguments)."""
    from torch.distributed.run import parse_args

    return parse_args(list(argv))


def gpus_of_node(node_rank: int, nnodes: int, nproc_per_node: int, gpus: Sequence[str]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for node ``node_rank`` of nodes that all run on this machine,
    whose GPUs are ``gpus``: ``nproc_per_node`` of its own, as each machine of a cluster has,
    or none where there are too few for every rank, and then every rank trains on the CPU.
    Numbered by ``LOCAL_RANK``, two nodes' ranks would take the same GPU, which NCCL refuses;
    nodes choosing apart would mix NCCL and gloo ranks, whose first collective hangs."""
    if len(gpus) < nnodes * nproc_per_node:
        return ""
    first = node_rank * nproc_per_node
    return ",".join(gpus[first : first + nproc_per_node])


def _this_machines_gpus() -> list[str]:
    """This machine's CUDA GPUs as ``CUDA_VISIBLE_DEVICES`` names them (else 0, 1, ...)."""
    import torch

    count = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[:count] if visible else [str(i) for i in range(count)]


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m dpkit.ddp.nodes TORCHRUN-OPTIONS SCRIPT ...`` (or :data:`LAUNCHER`): torchrun
    (``torch.distributed.run.main``) but for two things when ``--master_addr`` is a loopback
    address, so that every node runs on this machine: node 0's store listens on 127.0.0.1
    only (with torchrun's static rendezvous, the default with ``--master_port``), and each of
    several nodes gets GPUs of its own (:func:`gpus_of_node`). Otherwise torchrun exactly as
    it is."""
    from torch.distributed import run

    argv = sys.argv[1:] if argv is None else list(argv)
    options = _options(argv)
    nnodes, per_node = str(options.nnodes), str(options.nproc_per_node)
    several = nnodes.isdigit() and int(nnodes) > 1 and per_node.isdigit()
    if options.master_addr in LOOPBACK_ADDRESSES and several:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus_of_node(
            options.node_rank, int(nnodes), int(per_node), _this_machines_gpus()
        )
    held = None
    if (
        options.node_rank == 0 and options.master_addr in LOOPBACK_ADDRESSES
        and options.master_port is not None and options.rdzv_backend == "static"
        and not options.rdzv_endpoint and not options.standalone
    ):  # fmt: skip
        held = loopback_store(options.master_port, options.master_addr)
    try:
        run.main(argv)
    finally:
        del held  # the store's server closes with the last TCPStore that holds it


if __name__ == "__main__":
    main()
