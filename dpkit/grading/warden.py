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
  a terminal (``/dev/tty``, ``/dev/pts/*``), or making a link to either.

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


def make_hook(
    protected_codes: frozenset = frozenset(),
) -> Any:
    """The audit hook: refuses :data:`REFUSED` events, ctypes, and /proc and terminal paths.

    ``protected_codes``: code objects of functions whose ``__code__`` and defaults may not be
    replaced (the hook's own is always added).
    """

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
    ) -> None:
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
