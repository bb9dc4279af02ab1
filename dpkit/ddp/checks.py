"""Checks made before any rank starts: the world size, the backend, the port.

Each bad value is a ``ValueError`` (or ``TypeError``, ``RuntimeError`` for a torch without
what is needed) naming the argument and the fix, raised in the caller's process before a
single rank is spawned: a mistake costs milliseconds, not a spawn and a timeout.
"""

from __future__ import annotations

import errno
import os
import socket
from typing import Any

import torch


def cores() -> int:
    """CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


MAX_RANKS_PER_CORE = 4  # more than this and ranks only fight over the cores (and memory)


def choose_backend(backend: str | None, nproc: int) -> str:
    """``backend``, checked; None picks NCCL where there is a CUDA GPU per rank, else gloo."""
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError(
            "this build of torch has no torch.distributed (dist.is_available() is False, as "
            "in some macOS and Windows builds); install torch from pytorch.org to run DDP"
        )
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend is None:
        backend = "nccl" if dist.is_nccl_available() and gpus >= nproc else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(
            f"backend={backend!r} is not supported here; use 'gloo' (CPU, any machine) or "
            "'nccl' (one CUDA GPU per rank), or None to pick"
        )
    if backend == "nccl":
        if gpus == 0 or not dist.is_nccl_available():
            raise ValueError(
                "backend='nccl' needs CUDA GPUs and a torch built with NCCL, and this machine "
                "has none; use backend='gloo', which runs the ranks on the CPU"
            )
        if nproc > gpus:
            raise ValueError(
                f"nproc={nproc} with backend='nccl' needs a GPU per rank and there are "
                f"{gpus}; use nproc<={gpus}, or backend='gloo' for CPU ranks"
            )
    elif not dist.is_gloo_available():
        raise RuntimeError(
            "backend='gloo': this torch was built without gloo; install torch from "
            "pytorch.org, or use backend='nccl' on CUDA GPUs"
        )
    return backend


def check_nproc(nproc: Any) -> int:
    """A world size this machine can hold: 1 to MAX_RANKS_PER_CORE x its cores."""
    if isinstance(nproc, bool) or not isinstance(nproc, int):
        raise TypeError(f"nproc must be an int (the number of rank processes), got {nproc!r}")
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1 (one process per rank), got {nproc}")
    limit = MAX_RANKS_PER_CORE * cores()
    if nproc > limit:
        raise ValueError(
            f"nproc={nproc} is more than {MAX_RANKS_PER_CORE} processes per CPU core here "
            f"({cores()} cores): each rank is a Python process with its own torch and model "
            f"copy, and they would only fight over the cores; use nproc<={limit}"
        )
    return nproc


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now: the kernel's pick for port 0.

    Another program could take it before rank 0 binds it; :func:`dpkit.ddp.run_ddp` then
    retries once with a new port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]


def check_port(port: Any, address: str = "127.0.0.1") -> int:
    """``port``, after checking that rank 0 can listen on it."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"port must be a TCP port number (1-65535) or None, got {port!r}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As torch's TCPStore does: connections of an earlier run lingering in TIME_WAIT do
        # not block the port, a program listening on it does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            raise ValueError(
                f"port={port} is in use on {address} (another program, or a DDP run that "
                "has not ended); pass port=None to let dpkit pick a free one"
            ) from None
    return port


def address_in_use(error: BaseException) -> bool:
    """Whether ``error`` (from a rank) says rank 0 could not listen on its port."""
    text = str(error)
    return "EADDRINUSE" in text or "ddress already in use" in text
