"""The rendezvous store of a ``dpkit.ddp.nodes`` launch listens on 127.0.0.1 only: while the
job runs, rank 0 lists every listening TCP socket of its node's processes (torchrun and the
rank) from /proc/net/tcp and tcp6, and tries the store's port on this
machine's other addresses. torchrun alone listens on every interface (torch's TCPStore binds
the wildcard addresses). One node of one rank: node 0 hosts the store however many nodes
join (test_ddp_nodes and test_ddp_cli launch two through the same command), and the rank
imports no torch, so the launch costs one torchrun."""

from __future__ import annotations

import json
import subprocess

import pytest

from dpkit.ddp import nodes

LISTENING = r"""
import json, os, socket, sys

def session_sockets():
    # torchrun's session (dpkit's launch starts one per node) and the rank's (torchrun
    # starts each rank in a session of its own)
    sessions, inodes = {os.getsid(0), os.getsid(os.getppid())}, set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            if int(fields[3]) not in sessions:  # state, ppid, pgrp, session
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    found = []
    for table in ("tcp", "tcp6"):
        for line in open(f"/proc/net/{table}").read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append([table, fields[1]])
    return found

def reached(address, port):
    try:
        socket.create_connection((address, port), timeout=2).close()
        return True
    except OSError:
        return False

if os.environ["RANK"] == "0":
    port = int(os.environ["MASTER_PORT"])
    report = {"port": port, "listening": session_sockets(),
              "reached": {a: reached(a, port) for a in sys.argv[2:]}}
    with open(sys.argv[1], "w") as out:
        json.dump(report, out)
"""


def other_addresses() -> list[str]:
    """This machine's IPv4 addresses that are not loopback ones (``hostname -I``)."""
    try:
        found = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [a for a in found.stdout.split() if "." in a and not a.startswith("127.")]


def address_of(hex_address: str) -> tuple[str, int]:
    """``0100007F:1F90`` (/proc/net/tcp's little-endian IPv4 and port) -> ("127.0.0.1", 8080);
    an IPv6 address as 32 hex digits."""
    address, port = hex_address.split(":")
    if len(address) == 8:
        address = ".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0))
    return address, int(port, 16)


def test_the_store_listens_on_loopback_only(tmp_path):
    script, report = tmp_path / "listening.py", tmp_path / "listening.json"
    script.write_text(LISTENING)
    others = other_addresses()
    run = nodes.launch_nodes([str(script), str(report), *others], nnodes=1, nproc_per_node=1,
                             limit_s=120)  # fmt: skip
    assert run.ok, "\n".join(run.logs)
    found = json.loads(report.read_text())
    listening = [address_of(local) for _, local in found["listening"]]
    assert ("127.0.0.1", found["port"]) in listening  # the store, hosted by node 0's torchrun
    loopback_v6 = "0" * 24 + "01000000"  # ::1 in /proc/net/tcp6's words
    assert all(address in ("127.0.0.1", loopback_v6) for address, _ in listening), listening
    if not others:
        pytest.skip("no address but loopback to try the store from")
    assert found["reached"] == dict.fromkeys(others, False)
