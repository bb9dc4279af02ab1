"""The grading process's one-way door: an audit hook that refuses what could reach a verdict.

The surprise first: Python offers no way to remove an audit hook (:pep:`578`), so once the
harness arms this one, before any student code is imported, no submission can turn it off.
It refuses, in every thread and for the rest of the run:

- trace and profile hooks (``sys.settrace``, ``sys.setprofile``, and so
  ``threading.settrace``, ``bdb``, ``cProfile`` and ctypes' ``PyEval_SetTrace``): a trace
  function can jump over any line of the harness, the ``raise`` of a failing check included;
- walking the heap or other threads' stacks (``gc.get_objects``, ``gc.get_referrers``,
  ``gc.get_referents``, ``sys._current_frames``): the way to the harness's check wrappers;
- ctypes (native calls and raw memory: the HMAC key, ``PyEval_SetTrace``) and new audit
  hooks;
- starting other programs (``exec``, ``posix_spawn``, ``subprocess``, ``os.system``): they run
  outside this hook; ``fork`` stays allowed, and a forked child keeps the hook;
- opening another process's ``/proc/<pid>/`` files (its ``fd/1`` is the grader's terminal),
  a terminal (``/dev/tty``, ``/dev/pts/*``), or making a link to either;
- signals (``os.kill``, ``os.killpg``) to any process outside the run's own tree (the
  process that armed the hook and its descendants): without namespaces, ``os.kill(-1,
  SIGKILL)`` would end every process of the instructor's user. Signals with no audit
  event (``signal.pidfd_send_signal``) and negative pids are refused by the kernel too,
  with the seccomp filter :mod:`dpkit.grading.fence` installed by :func:`arm`.

What it cannot see: Python attribute writes on modules and objects (``torch.equal = ...``),
which the harness's :class:`~dpkit.grading.harness.Snapshot` checks around every check.
Every name the hook uses is bound as a default argument when it is made (a tuple, and
replacing ``__defaults__`` or ``__code__`` is itself an audited event, refused here for the
hook), so patching a module it reads from changes nothing.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from dpkit.grading import fence

REFUSED = frozenset(
    {
        "sys.settrace",
        "sys.setprofile",
        "sys._current_frames",
        "sys.addaudithook",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "os.startfile",
        "subprocess.Popen",
        "pty.spawn",
    }
)
REFUSED_PREFIXES = ("ctypes.",)
PATH_EVENTS = frozenset({"open", "os.symlink", "os.link", "os.chdir"})
WHY = {
    "sys.settrace": "a trace hook could change what a check records",
    "sys.setprofile": "a profile hook could change what a check records",
    "sys._current_frames": "other threads' frames belong to the grader",
    "gc.get_objects": "the grader's objects are not the submission's to look through",
    "gc.get_referrers": "the grader's objects are not the submission's to look through",
    "gc.get_referents": "the grader's objects are not the submission's to look through",
}


class Refused(PermissionError):
    """A submission did something the grading process refuses (see the module docstring)."""


def _message(event: str, why: dict[str, str]) -> str:
    reason = why.get(event, "it reaches outside the submission")
    return f"dpkit grade refuses {event} while grading: {reason}"


def _forbidden_path(path: Any, own_pid: int) -> bool:
    """Whether ``path`` names another process's /proc entry or a terminal."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, str):
        return False  # a file descriptor: already open, so already allowed
    for candidate in {path, os.path.realpath(path)}:
        parts = candidate.split("/")
        if candidate.startswith(("/dev/tty", "/dev/pts")):
            return True
        if len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit():
            if int(parts[2]) != own_pid:
                return True
    return False


# Every name these three use is a default argument, bound now: a submission that replaces
# builtins.open or int cannot make a stranger look like one of its own processes.
def _parent(
    pid: int, _open: Any = os.open, _read: Any = os.read, _close: Any = os.close, _int: Any = int
) -> int:
    """``pid``'s parent from ``/proc/<pid>/stat`` (0 when it is gone)."""
    try:
        fd = _open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return 0
    try:
        text = _read(fd, 4096)
    finally:
        _close(fd)
    return _int(text[text.rindex(b")") + 2 :].split()[1])  # after the name: state, ppid


def _in_tree(pid: int, root: int, _parent: Any = _parent, _range: Any = range) -> bool:
    """Whether ``pid`` is ``root`` or one of its descendants."""
    for _ in _range(4096):
        if pid == root:
            return True
        if pid <= 1:
            return False
        pid = _parent(pid)
    return False


def _signal_target(
    event: str, args: tuple, _getpgrp: Any = os.getpgrp, _int: Any = int
) -> int | None:
    """The process (or group leader) a signal event reaches; None for every process (-1)."""
    target = _int(args[0])
    if event == "os.kill" and target > 0:
        return target
    if target == 0:
        return _getpgrp()
    if target == -1:
        return None
    return -target if target < 0 else target  # a group: its leader must be in the tree


SIGNAL_EVENTS = frozenset({"os.kill", "os.killpg"})


def make_hook(
    protected_codes: frozenset = frozenset(),
    root: int | None = None,
) -> Any:
    """The audit hook: refuses :data:`REFUSED` events, ctypes, /proc and terminal paths, and
    signals outside ``root``'s process tree (``root``: this process when None).

    ``protected_codes``: code objects of functions whose ``__code__`` and defaults may not be
    replaced (the hook's own is always added).
    """
    root = os.getpid() if root is None else root

    def hook(
        event: str,
        args: tuple,
        _refused: frozenset = REFUSED,
        _prefixes: tuple = REFUSED_PREFIXES,
        _paths: frozenset = PATH_EVENTS,
        _why: dict = dict(WHY),  # noqa: B006 - a private copy, read only
        _message: Any = _message,
        _forbidden_path: Any = _forbidden_path,
        _getpid: Any = os.getpid,
        _protected: list = [],  # noqa: B006 - filled once below with the hook's own code
        _codes: frozenset = protected_codes,
        _refuse: type = Refused,
        _signals: frozenset = SIGNAL_EVENTS,
        _target: Any = _signal_target,
        _in_tree: Any = _in_tree,
        _root: int = root,
        _busy: set = set(),  # noqa: B006 - the threads inside this hook (its own opens)
        _ident: Any = threading.get_ident,
    ) -> None:
        if _ident() in _busy:
            return  # the hook's own reading of /proc
        if event in _signals and args:
            _busy.add(_ident())
            try:
                target = _target(event, args)
                allowed = target is not None and _in_tree(target, _root)
            finally:
                _busy.discard(_ident())
            if not allowed:
                raise _refuse(
                    f"dpkit grade refuses {event}{args!r} while grading: a submission may "
                    "signal only the processes it started"
                )
        if event in _refused or event.startswith(_prefixes):
            raise _refuse(_message(event, _why))
        if event in _paths and args and _forbidden_path(args[0], _getpid()):
            raise _refuse(
                f"dpkit grade refuses {event} of {args[0]!r} while grading: another "
                "process's files and the terminal are not the submission's"
            )
        if event == "object.__setattr__" and len(args) > 1:
            if args[1] in ("__code__", "__defaults__", "__kwdefaults__"):
                code = getattr(args[0], "__code__", None)
                if code is not None and (code in _codes or code in _protected):
                    raise _refuse(f"dpkit grade refuses replacing {args[1]} of the grader's hook")

    hook.__defaults__[7].append(hook.__code__)  # type: ignore[index]
    return hook


_armed = threading.Lock()
fence_missing: str | None = "not armed"  # why the seccomp filter is not installed, if not


def _refuse_hooks(*args: Any, **kwargs: Any) -> None:
    raise Refused(_message("sys.settrace", WHY).replace("sys.settrace", "threading.settrace"))


def arm(protected_codes: frozenset = frozenset()) -> bool:
    """Arm the hook in this process (once; later calls do nothing). Whether it was armed now.

    Also clears the ``threading`` module's trace and profile hooks (threads started from now
    would install them) and replaces ``threading.settrace`` and ``threading.setprofile``
    with functions that refuse: their hook is only installed when a thread starts, too late
    to refuse where the student called it.
    """
    if not _armed.acquire(blocking=False):
        return False
    sys.settrace(None)
    sys.setprofile(None)
    threading.settrace(None)  # type: ignore[arg-type]
    threading.setprofile(None)  # type: ignore[arg-type]
    threading.settrace = _refuse_hooks  # type: ignore[assignment]
    threading.setprofile = _refuse_hooks  # type: ignore[assignment]
    global fence_missing
    fence_missing = fence.install()  # needs ctypes, which the hook refuses from now on
    sys.addaudithook(make_hook(protected_codes))
    return True


def hooks_set() -> str | None:
    """What trace or profile hook is set in this thread or for new threads, if any."""
    if sys.gettrace() is not None:
        return "a trace hook (sys.settrace)"
    if sys.getprofile() is not None:
        return "a profile hook (sys.setprofile)"
    if getattr(threading, "_trace_hook", None) is not None:
        return "a trace hook for new threads (threading._trace_hook)"
    if getattr(threading, "_profile_hook", None) is not None:
        return "a profile hook for new threads (threading._profile_hook)"
    return None
