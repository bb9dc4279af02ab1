"""Starting N rank processes, watching them, and never leaving one behind.

The surprises first:

- **One rank failing does not stop the others.** A rank that raises simply exits; its peers
  sit in the next all-reduce, waiting for it, until the process group's timeout (by default
  30 minutes for gloo, 10 for NCCL: ``init_process_group``'s ``timeout``). :class:`Ranks`
  watches every rank from the parent: the first error stops all of them at once and is
  raised as :class:`RankFailed`, naming the rank, its error, where it was (step and stage)
  and its traceback (in a notebook the ranks' stderr goes to the kernel's log, not to the
  cell, so the traceback travels back).
- **A stuck rank hangs everyone.** Nothing inside torch notices a rank that never reaches
  a collective (until the process group's own timeout). The parent does: when no rank has
  moved on to another stage or step for ``timeout`` seconds, :class:`RanksTimedOut` says
  where each rank was, and which one is furthest behind: the others are waiting for it.
- **Nothing is left behind.** However the run ends (success, an error, a timeout, Ctrl-C
  in the parent), every rank is stopped (SIGTERM, then SIGKILL) and joined; and each rank
  asks Linux to kill it if the parent dies (``PR_SET_PDEATHSIG``, as ``torch.multiprocessing``
  does), so a killed notebook kernel does not leave ranks running either.

The ranks are started by a **fork server** (``torch.multiprocessing``'s ``forkserver``
context, where the platform has it; ``spawn`` elsewhere): on first use it starts one fresh
interpreter that imports torch and what every rank imports (:data:`PRELOAD`), once, and
then forks each rank from it, already imported. A fresh interpreter per rank (``spawn``)
pays those imports again for every rank of every run: seconds each, far longer than the
training steps a notebook runs. Both are start methods CUDA allows ("Multiprocessing best
practices", https://pytorch.org/docs/stable/notes/multiprocessing.html): the fork server
never touches the GPU. Both work from a Jupyter kernel, as long as the function a rank runs
is importable (it is: :func:`dpkit.ddp.process.rank_main`, which calls the target it is
given). The fork server stays for later runs and ends with the process that started it
(Python's own helper, like the resource tracker); :func:`dpkit.ddp.child_processes` looks
through it to the ranks.

Each rank reports through one queue (``("waiting", rank, block)``, ``("done", rank,
payload)``, ``("error", rank, description)``) and where it is through two shared integers
(:mod:`dpkit.ddp.process`), which the parent reads to see that the ranks move on.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch.multiprocessing as torch_mp

from dpkit.ddp.process import CONNECTING, STAGES, STARTING, rank_main

GRACE_S = 2.0  # how long a rank gets to end after SIGTERM before SIGKILL
# What the fork server imports once, before it forks any rank: torch, torch.distributed and
# dpkit's rank code (through dpkit.ddp.rank), and torch._dynamo, which DDP's constructor
# imports on first use.
PRELOAD = ["dpkit.ddp.rank", "torch._dynamo"]
# Starting a rank (a fresh Python importing torch: 2-4 s on a laptop, far more on a busy one)
# and meeting the others is out of the user's hands: it gets at least this long.
STARTUP_S = 60.0
# After the first error, how long to listen for others: a rank's error makes its peers fail
# too ("Connection closed by peer"), and the first one heard is not always the cause.
ERROR_WINDOW_S = 0.5


class RankFailed(RuntimeError):
    """A rank raised or died, and every rank was stopped: ``rank``, ``error_type`` and the
    rank's own ``remote_traceback``."""

    def __init__(self, message: str, rank: int, error_type: str, remote_traceback: str = ""):
        super().__init__(message)
        self.rank, self.error_type, self.remote_traceback = rank, error_type, remote_traceback


class RanksTimedOut(RuntimeError):
    """No rank moved on for ``timeout`` seconds; every rank was stopped. ``behind``: the
    rank furthest behind (None when all were at the same place)."""

    def __init__(self, message: str, behind: int | None):
        super().__init__(message)
        self.behind = behind


def start_context() -> Any:
    """The multiprocessing context ranks start from: the fork server, preloaded, where the
    platform has one (Linux, macOS), else ``spawn`` (Windows)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return torch_mp.get_context("spawn")
    context = torch_mp.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)  # read when the server starts, on first use
    return context


class Ranks:
    """``nproc`` processes, each running ``target(rank, progress, messages, *args)``.

    Use as a context manager: ``__exit__`` stops whatever still runs. :meth:`wait_for`
    collects one kind of message from every rank while watching for errors, deaths and
    stalls: ``timeout`` seconds in which no rank moved on to another stage or step (while
    ranks start and meet, at least :data:`STARTUP_S`).
    """

    def __init__(self, target: Callable[..., Any], args: Sequence[Any], nproc: int, timeout: float):
        self.nproc, self.timeout = nproc, timeout
        self.context = start_context()
        self.messages = self.context.Queue()
        self.progress = self.context.Array("i", 2 * nproc, lock=False)
        self.go = self.context.Semaphore(0)
        self.processes = [
            self.context.Process(
                target=rank_main,
                args=(rank, target, self.progress, self.messages, (self.go, *args)),
                name=f"dpkit-rank-{rank}",
            )
            for rank in range(nproc)
        ]
        self._seen: tuple[int, ...] = ()  # the progress last read
        self._moved = 0.0  # when a rank last moved on (or the parent did something)
        self._pending: list[tuple[str, int, Any]] = []  # messages read but not yet asked for

    def __enter__(self) -> Ranks:
        self._moved = time.monotonic()
        try:
            for process in self.processes:
                process.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()
        self._close()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    def release(self) -> None:
        """Let every rank start its next block of steps (see ``go`` in dpkit.ddp.rank)."""
        self._moved = time.monotonic()  # the parent's own work in between was progress
        for _ in range(self.nproc):
            self.go.release()

    def wait_for(self, kind: str, block: int | None = None) -> list[Any]:
        """The payload of message ``kind`` (for ``block``, if given) from every rank, by rank."""
        found: dict[int, Any] = {}

        def delivered(rank: int) -> bool:
            return rank in found or any(
                m[1] == rank and self._wanted(m, kind, block) for m in self._pending
            )

        while len(found) < self.nproc:
            for message in self._take(kind, block):
                found[message[1]] = message[2]
            if len(found) == self.nproc:
                break
            self._check(delivered)
            self._read(timeout=0.05)
        return [found[rank] for rank in range(self.nproc)]

    @staticmethod
    def _wanted(message: tuple[str, int, Any], kind: str, block: int | None) -> bool:
        return message[0] == kind and (block is None or message[2] == block)

    def _take(self, kind: str, block: int | None) -> list[tuple[str, int, Any]]:
        taken, kept = [], []
        for message in self._pending:
            (taken if self._wanted(message, kind, block) else kept).append(message)
        self._pending = kept
        return taken

    def _read(self, timeout: float) -> None:
        with contextlib.suppress(queue.Empty):
            self._pending.append(self.messages.get(timeout=timeout))
            while True:  # whatever else is there, without waiting
                self._pending.append(self.messages.get_nowait())

    def _check(self, delivered: Callable[[int], bool] = lambda rank: False) -> None:
        """Raise if a rank reported an error, ended before its work was done (whatever its
        exit status), or no rank moved on for too long. A rank for which ``delivered`` is
        true has sent what is waited for: if it ends now, that is its teardown, and what it
        sent stands (torch's teardown can abort: with a comm hook, gloo's process group was
        once destroyed from one of its own threads, "terminate called ... Resource deadlock
        avoided", after the rank's results were in)."""
        if any(m[0] == "error" for m in self._pending):
            self._fail()
        for rank, process in enumerate(self.processes):
            if process.exitcode is None or delivered(rank) or self._finished(rank):
                continue
            self._read(timeout=ERROR_WINDOW_S)  # its last message may still be in the pipe
            if delivered(rank) or self._finished(rank):
                continue
            if any(m[0] == "error" for m in self._pending):
                self._fail()
            self._died(rank, process.exitcode)
        seen, now = tuple(self.progress), time.monotonic()
        if seen != self._seen:
            self._seen, self._moved = seen, now
        starting = any(stage <= CONNECTING for stage in seen[1::2])
        allowed = max(self.timeout, STARTUP_S) if starting else self.timeout
        if now - self._moved > allowed:
            self._time_out(allowed)

    def _finished(self, rank: int) -> bool:
        """Whether ``rank`` said its target returned (see :func:`dpkit.ddp.process.rank_main`)."""
        return any(m[0] == "finished" and m[1] == rank for m in self._pending)

    def where(self, rank: int) -> str:
        """Where ``rank`` is, in words: "in step 2, backward", "while connecting"."""
        step, stage = self.progress[2 * rank], self.progress[2 * rank + 1]
        return f"in step {step}, {STAGES[stage]}" if step else f"while {STAGES[stage]}"

    def _fail(self) -> None:
        deadline = time.monotonic() + ERROR_WINDOW_S
        while time.monotonic() < deadline:
            self._read(timeout=0.05)
        errors = [(m[1], m[2]) for m in self._pending if m[0] == "error"]
        # The cause, not a symptom: a rank's own error first; then a rank that died without
        # a word (killed); only then a lost connection, which is how peers see either.
        own = [(r, e) for r, e in errors if not e["communication"]]
        reported = {r for r, _ in errors}
        silent = [
            (r, p.exitcode)
            for r, p in enumerate(self.processes)
            if p.exitcode is not None and r not in reported and not self._finished(r)
        ]
        if not own and silent:
            self._died(*silent[0])
        rank, error = (own or errors)[0]
        where = self.where(rank)
        self.stop()
        others = sorted({r for r, _ in errors} - {rank})
        also = f" (rank {', '.join(map(str, others))} then failed too)" if others else ""
        raise RankFailed(
            f"rank {rank} of {self.nproc} raised {error['type']}: {error['message']} "
            f"({where}); every rank was stopped{also}. The traceback of rank {rank}:\n"
            f"{error['traceback']}",
            rank,
            error["type"],
            error["traceback"],
        )

    def _died(self, rank: int, exitcode: int) -> None:
        where = self.where(rank)
        self.stop()
        if exitcode < 0:
            name = signal.Signals(-exitcode).name
            how = f"was killed by {name}"
            why = " (SIGKILL from the system often means it ran out of memory)"
            why = why if name == "SIGKILL" else ""
        elif exitcode == 0:
            how = "exited with status 0"
            why = (
                " before its work was done: a clean exit in the middle of the run (os._exit(0) "
                "or exit(0) in code it ran?), which left the other ranks waiting for it in "
                "their next collective"
            )
        else:
            how, why = f"exited with code {exitcode}", ""
        if self.progress[2 * rank + 1] == STARTING:
            why += (
                ". It failed while starting, before running any dpkit code: its error is on "
                "the parent's stderr (in Jupyter: the kernel's log). A script that starts "
                "ranks must do so under `if __name__ == '__main__':`, since each spawned "
                "rank imports the script again"
            )
        raise RankFailed(
            f"rank {rank} of {self.nproc} {how} ({where}) without reporting an error{why}. "
            "Every rank was stopped",
            rank,
            "exit",
        )

    def _time_out(self, allowed: float) -> None:
        places = {rank: self.where(rank) for rank in range(self.nproc)}
        alive = [r for r, p in enumerate(self.processes) if p.exitcode is None]
        keys = {r: (self.progress[2 * r], self.progress[2 * r + 1]) for r in alive}
        behind = min(keys, key=keys.get) if keys else None
        if behind is not None and list(keys.values()).count(keys[behind]) > 1:
            behind = None  # several at the same place: no single culprit
        self.stop()
        # (every rank may have returned without sending what the parent waits for)
        where = "; ".join(f"rank {r}: {places[r]}" for r in alive) or "every rank had ended"
        if behind is None:
            culprit = "No rank was behind the others."
        else:
            culprit = (
                f"Rank {behind} is furthest behind: it is the one stuck, and the others wait "
                "for it inside a collective."
            )
        raise RanksTimedOut(
            f"no rank moved on for {allowed:g} s (timeout={self.timeout:g}): {where}. "
            f"{culprit} Every rank was stopped; if a stage just needs longer, pass a larger "
            "timeout",
            behind,
        )

    def stop(self) -> None:
        """Stop every rank still running and whatever each started (SIGTERM to its process
        group, then SIGKILL after GRACE_S) and join all."""
        for process in self.processes:
            if process.pid is not None:
                _signal_group(process, signal.SIGTERM)
        ends = time.monotonic() + GRACE_S
        for process in self.processes:
            if process.pid is None:
                continue
            process.join(max(0.0, ends - time.monotonic()))
            # SIGKILL to the group also ends a rank's children that outlived it (a rank that
            # finished and returned, or that ignored SIGTERM).
            _signal_group(process, signal.SIGKILL)
            process.join()
        # The parent never puts: nothing of its own to flush, and it must not wait for it.
        self.messages.cancel_join_thread()

    def _close(self) -> None:
        """Close the pipes a run holds (a test session launches ranks hundreds of times):
        each rank's sentinel, and the queue's two ends, which ``Queue.close()`` closes only
        from a feeder thread that a parent that never puts does not have."""
        for process in self.processes:
            if process.pid is not None:
                process.close()
        for end in (self.messages._reader, self.messages._writer):
            end.close()


def _signal_group(process: Any, signum: int) -> None:
    """Send ``signum`` to the process group ``process`` leads (it and what it started: see
    :func:`dpkit.ddp.process._lead_own_group`); to the process alone if it has no group yet.

    The group's id is the rank's pid. Once the rank has ended and every member of its group
    too, ``killpg`` finds no such group (ProcessLookupError), and the pid is not handed to
    a new process while any member of the group lives, so no other program is signalled.
    """
    if hasattr(os, "killpg"):
        try:
            os.killpg(process.pid, signum)
            return
        except ProcessLookupError:  # no such group: the rank has not made it yet, or all ended
            pass
        except PermissionError:  # a process group that is not ours: never signal it
            return
    if process.exitcode is None:
        (process.kill if signum == signal.SIGKILL else process.terminate)()
