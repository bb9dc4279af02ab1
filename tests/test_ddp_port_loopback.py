"""``run_ddp(port=P)`` asks for torch's TCP store, whose server binds every interface in
torch 2.13 whatever address it is given; dpkit's rank 0 hosts it on 127.0.0.1 alone. While
the run goes, /proc/net/tcp and tcp6 are read for listening sockets on P."""

from __future__ import annotations

import threading

from dpkit import ddp
from dpkit.ddp import checks

LOOPBACK = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it


def listening_on(port: int) -> set[str]:
    """The local addresses listening on ``port`` (hex, as /proc/net writes them)."""
    found = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/net/{table}") as rows:
            for row in rows.read().splitlines()[1:]:
                local, state = row.split()[1], row.split()[3]
                address, _, hex_port = local.partition(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.add(address)
    return found


def test_the_tcp_store_of_run_ddp_listens_on_the_loopback_address_alone():
    port = checks.free_port()
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.005):
            seen.update(listening_on(port))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = ddp.run_ddp("mlp", nproc=2, batch=8, steps=1, port=port, timeout=60)
    finally:
        done.set()
        watcher.join()
    assert result.trace.events  # the ranks met through the store and trained
    assert seen == {LOOPBACK}, f"listening on port {port}: {sorted(seen)} (hex, /proc/net)"
