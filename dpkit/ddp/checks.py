"""Checks made before any rank starts: the world size, the backend, the numbers, the port.

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


# torch turns bucket_cap_mb into int(bucket_cap_mb * 2**20) bytes, which its C++ reducer
# takes as a signed 64-bit integer: 8.8e12 MiB and more fail inside DDP's constructor with a
# pybind11 message that lists every argument (measured on torch 2.13: 8.7e12 runs, 8.8e12 fails).
BUCKET_CAP_LIMIT_MB = 2**43  # 2**63 bytes: the first cap that does not fit
# gloo counts a collective's timeout in 64-bit nanoseconds (about 9.2e9 s; 1e10 s fails with
# "Invalid timeout"), and dpkit gives torch's collectives 30 s more than the parent's own
# deadline: 1e9 s (31 years) is far beyond any run and safely inside that.
MAX_TIMEOUT_S = 1e9


def check_bucket_cap(cap: Any) -> float | None:
    """``bucket_cap_mb`` as a float: a finite number of MiB above 0 that torch can hold;
    or None, torch's default (25 MiB, and 1 MiB for the first bucket: only when the cap is
    not given, ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``)."""
    if cap is None:
        return None
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
        raise ValueError(f"bucket_cap_mb must be a positive number of MiB, got {cap!r}")
    if not cap < BUCKET_CAP_LIMIT_MB:  # inf too (int(inf) is an OverflowError inside DDP)
        raise ValueError(
            f"bucket_cap_mb={cap:g} is more than torch can hold: DDP turns it into bytes in a "
            f"64-bit integer, less than {BUCKET_CAP_LIMIT_MB:,d} MiB. For a single bucket holding "
            "every gradient, any cap above the model's size will do (e.g. 1e6)"
        )
    return float(cap)


def check_timeout(timeout: Any) -> float:
    """``timeout`` as a float: a finite number of seconds above 0 that torch can hold."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if timeout > MAX_TIMEOUT_S:  # inf, and an int past float's range (10**400): compared as is
        try:
            shown = f"={timeout:g}"
        except OverflowError:
            shown = " (an int too large for a float)"
        raise ValueError(
            f"timeout{shown} is not a number of seconds torch can wait: its collectives "
            f"count it in 64-bit nanoseconds; use at most {MAX_TIMEOUT_S:g} s. There is no "
            "'wait forever': a stuck rank would then hang the run for good"
        )
    return float(timeout)


def loopback_interface() -> str | None:
    """The name of this machine's loopback network interface (``lo`` on Linux, ``lo0`` on
    macOS), or None when it has neither (Windows)."""
    try:
        names = {name for _, name in socket.if_nameindex()}
    except (AttributeError, OSError):  # no if_nameindex on Windows before Python 3.8
        return None
    return next((name for name in ("lo", "lo0") if name in names), None)
