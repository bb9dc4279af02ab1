"""dpkit.ddp is safe by default: nothing a run starts listens beyond this machine's loopback
interface, nothing a rank started outlives the run, and a rank that leaves early with
status 0 is named as the one that left.

The training steps the ranks run live here, at module level: the ranks import them by name.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from processes import alive

from dpkit import ddp


def listening_addresses(pid: str = "self") -> list[str]:
    """The local addresses of the TCP sockets process ``pid`` listens on (``/proc``)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own descriptor, for one)
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table, size in (("tcp", 4), ("tcp6", 16)):
        with open(f"/proc/net/{table}") as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and inode in inodes:  # 0A: LISTEN
                    found.append(_address(local.split(":")[0], size))
    return found


def _address(hex_address: str, size: int) -> str:
    # /proc/net/tcp{,6} print each 32-bit word of the address in the host's byte order
    words = [bytes.fromhex(hex_address[i : i + 8])[::-1] for i in range(0, 2 * size, 8)]
    return str(ipaddress.ip_address(b"".join(words)))


def report_listeners_and_start_a_sleep(folder, model, inputs, targets, optimizer):
    """Each rank writes where it listens (inside the run: gloo's connections are up) and
    starts a ``sleep`` it never waits for, as a careless training script might."""
    rank = dist.get_rank()
    path = Path(folder) / f"rank{rank}.json"
    if not path.exists():
        sleeper = subprocess.Popen(["sleep", "300"])
        path.write_text(json.dumps({"listening": listening_addresses(), "sleep": sleeper.pid}))
    return ddp.training_step(model, inputs, targets, optimizer)


def exit_cleanly_on_rank_1(model, inputs, targets, optimizer):
    if dist.get_rank() == 1:
        os._exit(0)  # status 0, no Python exit handling: no error for the rank to report
    return ddp.training_step(model, inputs, targets, optimizer)


def with_step(step) -> ddp.Workload:
    return dataclasses.replace(ddp.named_workload("mlp"), step=step)


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux's /proc")
def test_ranks_listen_on_loopback_only_and_what_they_start_ends_with_the_run(tmp_path):
    step = functools.partial(report_listeners_and_start_a_sleep, str(tmp_path))
    ddp.run_ddp(with_step(step), nproc=2, batch=8, steps=2, timeout=60)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for report in reports:
        # gloo's connections to the peers listen, on loopback; no rendezvous store listens
        # anywhere (torch's TCPStore would show as 0.0.0.0 or ::, every interface)
        assert report["listening"], "a gloo rank listens for its peers"
        for address in report["listening"]:
            assert ipaddress.ip_address(address).is_loopback, report["listening"]
    deadline = time.monotonic() + 5
    while any(alive(r["sleep"]) for r in reports) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(r["sleep"]) for r in reports), "a rank's child outlived the run"


def test_a_rank_that_exits_with_status_0_mid_run_is_named():
    started = time.monotonic()
    with pytest.raises(ddp.RankFailed) as caught:
        ddp.run_ddp(with_step(exit_cleanly_on_rank_1), nproc=2, batch=8, steps=2, timeout=20)
    assert caught.value.rank == 1  # not rank 0, which only lost its peer
    message = str(caught.value)
    assert message.startswith("rank 1 of 2 exited with status 0 (in step 1, ")
    assert "before its work was done" in message
    assert time.monotonic() - started < 15  # seen when it happened, not at the timeout
