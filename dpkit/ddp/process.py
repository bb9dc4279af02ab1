"""What every rank process is, from birth to death: its stage, its errors, its parent.

Each rank runs :func:`rank_main` (in a process the launcher spawns), which first asks Linux
to kill the rank when its parent dies, leads its own process group with a watcher that
ends the group when the rank ends (so what the rank started dies with it), then runs its
target and, if that raises, sends the error to the parent with its traceback and ends at
once. Where the rank is (its step and
its :data:`STAGES` index) sits in two shared integers that the parent reads to see that the
ranks move on, and to say where each one was when they stopped.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# Where a rank is, in order: a rank at a later stage of the same step is further ahead.
STAGES = (
    "starting",  # importing torch and the workload: a fresh interpreter
    "connecting",  # init_process_group: waiting for every rank at the rendezvous
    "preparing its rows of the batch",  # the workload's batch made, the rank's rows taken
    "wrapping the model in DDP",  # the constructor broadcasts rank 0's parameters
    "waiting for the parent",  # between timed blocks (dpkit.ddp.compare)
    "the step's code before forward",
    "forward",  # and the loss, up to backward
    "backward",  # DDP's all-reduces run inside backward and finish before it returns
    "optimizer step",
    "the step's code after the optimizer",
    "finished",
)
(
    STARTING,
    CONNECTING,
    PREPARING,
    WRAPPING,
    WAITING,
    BEFORE_FORWARD,
    FORWARD,
    BACKWARD,
    OPTIMIZER,
    AFTER_OPTIMIZER,
    FINISHED,
) = range(len(STAGES))


@dataclass
class Progress:
    """Where one rank is: its step and stage, in integers the parent can read at any time."""

    shared: Any  # a multiprocessing Array of 2 x nproc ints: (step, stage) per rank
    rank: int

    def at(self, stage: int, step: int | None = None) -> None:
        if step is not None:
            self.shared[2 * self.rank] = step
        self.shared[2 * self.rank + 1] = stage


def _die_with_parent(parent: Any) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (``PR_SET_PDEATHSIG``, as
    ``torch.multiprocessing`` asks for SIGINT); elsewhere nothing. A rank forked by the fork
    server has the server as its parent, and the server ends when the process that started
    it does. A parent that died before the request was made is caught by its sentinel
    (``multiprocessing.parent_process()``): this process then ends at once."""
    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1  # from <linux/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if parent is not None and not parent.is_alive():
        os._exit(1)


def _release_fork_server() -> None:
    """Close this rank's copy of the fork server's "starter alive" pipe, if it has one.

    CPython hands every process the fork server forks the write end of the pipe on which the
    server waits for its starter to end (so that they could use the server too). Held open
    by the ranks, the server never sees a killed notebook kernel end, never ends itself, and
    the ranks, who die with the server, live on. Closed here, first thing: the kernel's end
    ends the server, and the server's end ends the ranks (``_forkserver_alive_fd`` is
    private to CPython's ``multiprocessing.forkserver``, 3.8 to 3.13).
    """
    from multiprocessing import forkserver

    server = forkserver._forkserver
    alive = getattr(server, "_forkserver_alive_fd", None)
    if alive is not None:  # None in a spawned rank (never called in the server's owner,
        # which holds the pipe's other end under the same name: closing it would end its server)
        with contextlib.suppress(OSError):
            os.close(alive)
        server._forkserver_alive_fd = None


def _lead_own_group() -> None:
    """Make this rank the leader of a new process group, which every process it starts
    joins (unless it leaves on purpose): the parent then stops the rank *and* what it
    started (a data loader's workers, a ``subprocess``) with one ``killpg``; the rank's
    children would otherwise outlive the run (a ``sleep 300`` started by a rank did).
    Also keeps a terminal's Ctrl-C to the parent, which then stops every rank itself."""
    if hasattr(os, "setpgid"):  # not on Windows
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)


def _end_group_with_rank() -> None:
    """Fork a watcher that ends this rank's process group (SIGKILL) once the rank is gone.

    Why: ``PR_SET_PDEATHSIG`` ends the rank when its parent dies, but not what the rank
    started (a ``subprocess``, a data loader's workers): they live on in the rank's group,
    which the parent ends with ``killpg`` when it stops a run, but a parent killed by
    SIGKILL (a notebook kernel, ``dpkit ddp``) ends nothing: a ``sleep 300`` started by a
    rank outlived such a parent. The watcher stays in the group and checks every 0.1 s
    that the rank is still its parent; once it is not (the rank ended, however it ended),
    it kills the group, itself last. It is forked here, before the rank starts a thread
    (a fork copies only the calling thread), keeps no file of the rank's open (so that no
    pipe waits for it), and touches nothing but the ``os`` and ``time`` modules."""
    if not (hasattr(os, "fork") and hasattr(os, "killpg")) or os.getpgid(0) != os.getpid():
        return  # no fork, or not the leader of its own group: then it has no group to end
    rank = os.getpid()
    try:
        if os.fork():
            return  # the rank goes on
    except OSError:
        return  # no watcher, as before: the parent still ends the group when it can
    try:  # the watcher
        null = os.open(os.devnull, os.O_RDWR)
        for standard in (0, 1, 2):
            os.dup2(null, standard)
        os.closerange(3, _highest_descriptor() + 1)
        while os.getppid() == rank:
            time.sleep(0.1)
        os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(0)


def _highest_descriptor() -> int:
    try:
        return max(map(int, os.listdir("/proc/self/fd")))  # Linux: the ones open
    except (OSError, ValueError):
        return 1024


def _communication_error(error: BaseException) -> bool:
    """Whether a rank's error is a peer's failure seen through a collective (a symptom)."""
    import torch.distributed as dist

    backend_error = getattr(dist, "DistBackendError", ())  # torch >= 2.1
    text = str(error)
    return isinstance(error, backend_error) or any(
        sign in text
        for sign in ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
    )


def rank_main(
    rank: int, target: Callable[..., Any], progress: Any, messages: Any, args: Sequence[Any]
) -> None:
    """What each process runs: ``target(rank, Progress, messages, *args)``, its error
    reported, and ``("finished", rank, None)`` sent when it returns: a rank that ends without
    either (even with status 0) left in the middle, and the parent says so."""
    _release_fork_server()
    _die_with_parent(multiprocessing.parent_process())
    _lead_own_group()
    _end_group_with_rank()
    where = Progress(progress, rank)
    try:
        target(rank, where, messages, *args)
        messages.put(("finished", rank, None))
    except BaseException as error:  # KeyboardInterrupt and SystemExit too: the parent must hear
        messages.put(
            (
                "error",
                rank,
                {
                    "type": type(error).__name__,
                    "message": str(error),
                    "traceback": traceback.format_exc(),
                    "communication": _communication_error(error),
                },
            )
        )
        messages.close()
        messages.join_thread()  # the message is out before the process is
        # os._exit: no interpreter shutdown, which can wait on the backend's threads.
        os._exit(1)


def child_processes(pid: int | None = None) -> list[int]:
    """The ids of the children of process ``pid`` (default: this one), read from ``/proc``
    (Linux; an empty list elsewhere), zombies too (a child ended but never joined is left
    behind as well): a test's proof that no rank outlived its run.

    Left out: Python's multiprocessing helpers, one each per parent process, which serve
    every later run and end with the parent: the resource tracker (the ranks' queue and
    semaphore start it) and the fork server (:mod:`dpkit.ddp.launch`), whose own children,
    the ranks, are listed instead (https://docs.python.org/3/library/multiprocessing.html).
    """
    pid = os.getpid() if pid is None else pid
    parents: dict[int, list[int]] = {}
    with contextlib.suppress(FileNotFoundError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:  # it ended while we looked
                continue
            parents.setdefault(int(fields[1]), []).append(int(entry))  # fields[1]: parent id
    children = []
    for child in parents.get(pid, []):
        helper = _helper_of_multiprocessing(child)
        if helper == "forkserver":  # the ranks it forked count as the parent's
            children += parents.get(child, [])
        elif helper is None:
            children.append(child)
    return sorted(children)


def _helper_of_multiprocessing(pid: int) -> str | None:
    """``"forkserver"`` or ``"resource_tracker"`` if process ``pid`` is that helper of
    multiprocessing's (they run ``from multiprocessing.<name> import main``), else None."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            command = cmdline.read().decode(errors="replace")
    except OSError:
        return None
    for name in ("forkserver", "resource_tracker"):
        if f"from multiprocessing.{name} import main" in command:
            return name
    return None
