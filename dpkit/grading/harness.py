"""The grading child: pytest over the graders, every check's outcome sent over a signed pipe.

The surprise first: the student's code runs in this process, next to the checks (they need
its modules, autograd graphs and threads), so nothing this process writes is believed
unless it is signed. The parent (:mod:`dpkit.grading.sandbox`) hands over a fresh key on a
pipe that is read and closed before any student code runs; the key lives on only inside an
HMAC object. A check passes when, and only when, this harness saw the check function return
normally while it was the running check, and the code the graders rely on (pytest, pluggy,
hypothesis, torch, dpkit, the graders, builtins) was unchanged when it finished. Results
written anywhere else, an exit code, a patched pytest report: none of them count. Before
the first student file is imported, the comparison functions the graders call are fixed for
the run (:func:`freeze_comparisons`) and the one-way audit hook is armed
(:mod:`dpkit.grading.warden`); after every check, the snapshot is compared again, and in
the check's own thread its torch function modes and hooks (:func:`thread_tampered`).

Run as ``python -m dpkit.grading.harness KEY_FD RESULTS_FD MEMORY_BYTES -- PYTEST_ARGS``.
"""

from __future__ import annotations

import functools
import hmac
import json
import operator
import os
import sys
import threading
import types
from typing import Any

from dpkit.grading import warden

HINT_LIMIT = 1000  # characters: a record stays one atomic pipe write


def check_name(item: Any) -> str:
    """A check's friendly name: the first docstring line of its test, with its parameters."""
    doc = getattr(getattr(item, "obj", None), "__doc__", None)
    name = doc.strip().splitlines()[0] if doc else item.name
    callspec = getattr(item, "callspec", None)
    return f"{name} ({callspec.id})" if callspec is not None else name


def task_of(item: Any) -> int:
    marker = next((m.name for m in item.iter_markers() if m.name.startswith("task")), "task0")
    return int(marker[len("task") :])


# --------------------------------------------------------------------------------------
# What the graders rely on, and whether it is still what it was.

WATCHED_PREFIXES = (
    "_pytest",
    "pytest",
    "pluggy",
    "hypothesis",
    "dpkit",
    "test_task",
    "conftest",
    "exercises",
)
WATCHED_MODULES = (
    "builtins",
    "torch",
    "torch.nn",
    "torch.nn.functional",
    "torch.functional",
    "torch._tensor",
    "torch.autograd",
    "torch.autograd.function",
    "torch.nn.modules.module",
    "threading",
    "time",
    "math",
    "copy",
    "functools",
    "operator",
    "traceback",
    "json",
    "hmac",
    "os",
    "importlib",
    "importlib.util",
)
EXTRA_CLASSES = ("torch.Tensor", "torch.nn.Module", "torch.autograd.Function")


def _watched(name: str) -> bool:
    return name in WATCHED_MODULES or name.startswith(WATCHED_PREFIXES)


def _torch_wrapper_of(new: Any, old: Any) -> bool:
    """Whether ``new`` is torch's own wrapper around ``old``: importing ``torch._dynamo``
    rebinds ``torch.manual_seed`` to ``torch._disable_dynamo(torch.manual_seed)``. Every
    layer must be a function written in torch's files and the chain must end at ``old``."""
    import torch

    torch_dir = os.path.dirname(torch.__file__) + os.sep
    for _ in range(4):
        code = getattr(new, "__code__", None)
        if code is None or not code.co_filename.startswith(torch_dir):
            return False
        new = getattr(new, "__wrapped__", None)
        if new is old:
            return True
    return False


class Snapshot:
    """Identity of every function and class the graders may call, and of their code.

    ``changed()`` names the first thing replaced since the snapshot (a monkeypatched
    ``torch.equal``, a grader function given new ``__code__``, a patched pytest class).
    """

    def __init__(self) -> None:
        self.entries: list[tuple[dict, str, Any, str]] = []
        self._groups: list[tuple[Any, list, list, list, Any]] | None = None
        self.code: list[tuple[types.FunctionType, Any, Any, str]] = []
        seen_classes: set[int] = set()
        for name, module in list(sys.modules.items()):
            if module is None or not _watched(name):
                continue
            self._dict(vars(module), name, seen_classes, module_name=name)
        for dotted in EXTRA_CLASSES:
            module_name, _, attribute = dotted.rpartition(".")
            cls = getattr(sys.modules.get(module_name), attribute, None)
            if isinstance(cls, type) and id(cls) not in seen_classes:
                seen_classes.add(id(cls))
                self._dict(cls.__dict__, dotted, seen_classes, module_name=None)

    def _dict(self, namespace: Any, where: str, seen: set[int], module_name: str | None) -> None:
        for key, value in list(namespace.items()):
            if key.startswith("__") and key.endswith("__") and key not in ("__init__", "__call__"):
                continue
            if not (callable(value) or isinstance(value, (classmethod, staticmethod, property))):
                continue
            label = f"{where}.{key}"
            self.entries.append((namespace, key, value, label))  # a dict or a mappingproxy
            function = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
            if isinstance(function, types.FunctionType):
                self.code.append(
                    (function, function.__code__, function.__defaults__, f"{label}.__code__")
                )
            if (
                module_name is not None
                and isinstance(value, type)
                and value.__module__ == module_name
                and id(value) not in seen
            ):
                seen.add(id(value))
                self._dict(value.__dict__, label, seen, module_name=None)

    def changed(self) -> str | None:
        # Called before and after every check: compared a namespace at a time with map(),
        # about 3 ms for the ~16,000 entries of a full run instead of 15 in a Python loop.
        if self._groups is None:
            self._group()
        missing = object()
        for namespace, keys, values, labels, fetch in self._groups:
            try:
                now = fetch(namespace)  # operator.itemgetter: one C loop over the keys
            except KeyError:
                now = [namespace.get(key, missing) for key in keys]
            if any(map(operator.is_not, now, values)):
                for index, (new, old) in enumerate(zip(now, values)):
                    if new is not old:
                        if not _torch_wrapper_of(new, old):
                            return labels[index]
                        values[index] = new
        codes = list(map(_code_and_defaults, self._functions))
        if codes != self._codes:
            for function, (code, defaults), label in zip(
                self._functions, self._codes, self._labels
            ):
                if function.__code__ is not code or function.__defaults__ is not defaults:
                    return label
        return None

    def _group(self) -> None:
        groups: dict[int, tuple[Any, list, list, list]] = {}
        for namespace, key, value, label in self.entries:
            group = groups.setdefault(id(namespace), (namespace, [], [], []))
            group[1].append(key)
            group[2].append(value)
            group[3].append(label)
        self._groups = [
            (namespace, keys, values, labels, operator.itemgetter(*keys, keys[0]))
            for namespace, keys, values, labels in groups.values()
        ]
        self._functions = [function for function, _, _, _ in self.code]
        self._codes = [(code, defaults) for _, code, defaults, _ in self.code]
        self._labels = [label for _, _, _, label in self.code]


def _code_and_defaults(function: types.FunctionType) -> tuple[Any, Any]:
    return function.__code__, function.__defaults__


# Comparisons the graders call by module attribute (``torch.equal(...)``), answered by the
# module's class: a data descriptor on a module's class wins over its ``__dict__``, so
# ``torch.equal = always_true`` fails and a write to ``vars(torch)`` is never read.
FROZEN_COMPARISONS = {
    "torch": ("equal", "allclose", "isclose", "all", "any", "eq", "ne", "is_tensor"),
    "torch.testing": ("assert_close",),
    "math": ("isclose",),
}


def _fixed(module_name: str, name: str, value: Any) -> property:
    def get(_self: Any, _value: Any = value) -> Any:
        return _value

    def refuse(_self: Any, _new: Any) -> None:
        raise AttributeError(
            f"{module_name}.{name} is the grader's while grading; it cannot be replaced"
        )

    return property(get, refuse)


def freeze_comparisons() -> None:
    """Fix the comparison functions graders call (:data:`FROZEN_COMPARISONS`) for this run."""
    for module_name, names in FROZEN_COMPARISONS.items():
        module = sys.modules.get(module_name)
        if module is None or getattr(type(module), "__dpkit_frozen__", False):
            continue
        namespace: dict[str, Any] = {"__dpkit_frozen__": True}
        for name in names:
            if name in vars(module):
                namespace[name] = _fixed(module_name, name, vars(module)[name])
        module.__class__ = type("FrozenModule", (type(module),), namespace)


def thread_tampered() -> str | None:
    """What this thread carries that a check must not leave behind: a torch function mode
    (thread-local: it answers every torch call of later code in the thread), a hook."""
    torch = sys.modules.get("torch")
    if torch is not None and torch._C._len_torch_function_stack() > 0:
        return "a torch function mode (TorchFunctionMode) was left active"
    return warden.hooks_set()


# --------------------------------------------------------------------------------------
# The pytest plugin: signed records, verdicts from this harness only.


class Harness:
    """The pytest plugin of a grading run: each check's outcome, signed, as one pipe write.

    A check passes only if its function returned normally while it was the running check
    (a timed-out one that returns later does not count), no failure hint was recorded for
    it, and the snapshot shows nothing replaced; once something was, every later check of
    the run fails with that name.
    """

    def __init__(self, mac: hmac.HMAC, results_fd: int) -> None:
        self._mac = mac
        self._fd = results_fd
        self._sequence = 0
        self._lock = threading.Lock()
        self._current: str | None = None
        self._returned: set[str] = set()
        self._snapshot: Snapshot | None = None
        self._tampered: str | None = None
        self._thread_tampered: dict[str, str] = {}

    def send(self, record: dict[str, Any]) -> None:
        with self._lock:
            text = json.dumps({"seq": self._sequence, **record}, sort_keys=True)
            self._sequence += 1
            mac = self._mac.copy()
            mac.update(text.encode())
            data = f"{text}\t{mac.hexdigest()}\n".encode()
            while data:
                data = data[os.write(self._fd, data) :]

    def _watch(self, nodeid: str, function: Any) -> Any:
        # The test, the harness and the check's id are default arguments, not closure
        # cells: a tuple of defaults cannot be changed in place, and replacing it is an
        # audited event the warden refuses.
        def check(
            _function: Any = function,
            _harness: Harness = self,
            _nodeid: str = nodeid,
            /,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            result = _function(*args, **kwargs)
            # In the check's own thread: a mode pushed or a hook set here is thread-local,
            # invisible to a snapshot taken from the main thread.
            tampered = thread_tampered()
            with _harness._lock:  # a timed-out check that returns later does not count
                if tampered is not None:
                    _harness._thread_tampered.setdefault(_nodeid, tampered)
                elif _harness._current == _nodeid:
                    _harness._returned.add(_nodeid)
            return result

        functools.update_wrapper(check, function)
        del check.__wrapped__  # the test itself is not handed out
        return check

    def pytest_collection_finish(self, session: Any) -> None:
        for item in session.items:
            self.send(
                {
                    "event": "collected",
                    "nodeid": item.nodeid,
                    "task": task_of(item),
                    "check": check_name(item),
                }
            )
            if hasattr(item, "obj"):
                item.obj = self._watch(item.nodeid, item.obj)
        freeze_comparisons()
        # Before any student file is imported (fixtures are lazy): the one-way door
        # (dpkit.grading.warden), then what the graders rely on.
        warden.arm(frozenset({Harness._watch.__code__, thread_tampered.__code__}))
        self._snapshot = Snapshot()

    def _check_tampering(self) -> None:
        """After every check (setup, call and teardown): replaced functions, and hooks set
        for new threads."""
        if self._tampered is not None or self._snapshot is None:
            return
        changed = self._snapshot.changed()
        hooks = warden.hooks_set() if changed is None else None
        what = f"{changed} was replaced" if changed is not None else hooks and f"{hooks} was set"
        if what:
            self._tampered = (
                f"the grader was tampered with: {what} while your code ran, so no check "
                "counts from here on"
            )

    def pytest_runtest_protocol(self, item: Any, nextitem: Any) -> Any:
        # No snapshot here: nothing of the submission's runs between the last check's end,
        # which was compared, and this check's setup (which imports the file), which is.
        with self._lock:
            self._current = item.nodeid
        return None

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        with self._lock:
            self._current = None
            returned = nodeid in self._returned
        item_hint = _HINTS.pop(nodeid, None)
        self._check_tampering()  # after it
        in_thread = self._thread_tampered.pop(nodeid, None)
        if in_thread is not None and self._tampered is None:
            self._tampered = (
                f"the grader was tampered with: {in_thread} in the check's thread, so no "
                "check counts from here on"
            )
        if self._tampered is not None:
            self.send({"event": "failed", "nodeid": nodeid, "hint": self._tampered})
        elif returned and item_hint is None:
            passed = {"event": "passed", "nodeid": nodeid}
            if nodeid in _VALUES:  # a check the parent decides (dpkit.grading.decided)
                passed["values"] = _VALUES.pop(nodeid)
            self.send(passed)
        else:
            hint = item_hint or "failed"
            self.send({"event": "failed", "nodeid": nodeid, "hint": hint[:HINT_LIMIT]})

    def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
        self.send({"event": "finished"})


_HINTS: dict[str, str] = {}  # nodeid -> the first failure's hint, from the graders' conftest


def record_hint(nodeid: str, hint: str) -> None:
    """Called by the graders' conftest when a check fails: what the report says."""
    _HINTS.setdefault(nodeid, hint)


_VALUES: dict[str, str] = {}  # nodeid -> the outputs a check sends to the parent, encoded


def record_values(nodeid: str, values: str) -> None:
    """Called by a check the parent decides (:mod:`dpkit.grading.decided`): its outputs,
    sent with its "passed" record."""
    _VALUES[nodeid] = values


def _read_key(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _address_space() -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _limit_memory(budget: int) -> None:
    """Cap this process's address space at what it uses now (torch loaded) plus ``budget``:
    a submission that allocates more gets a MemoryError, not the machine's memory."""
    try:
        import resource
    except ImportError:  # not on Windows
        return
    used = _address_space()
    if budget <= 0 or used is None:  # no /proc (macOS, where RLIMIT_AS is not enforced)
        return
    try:
        resource.setrlimit(resource.RLIMIT_AS, (used + budget, used + budget))  # no way back up
    except (ValueError, OSError):  # a lower hard limit is already set: keep it
        pass


def main(argv: list[str]) -> int:
    key_fd, results_fd, memory = (int(a) for a in argv[:3])
    pytest_args = argv[4:] if argv[3:4] == ["--"] else argv[3:]
    mac = hmac.new(_read_key(key_fd), digestmod="sha256")
    os.set_inheritable(results_fd, False)  # a subprocess the student starts does not get it
    import pytest

    _limit_memory(memory)

    harness = Harness(mac, results_fd)
    del mac
    return int(pytest.main(pytest_args, plugins=[harness]))


if __name__ == "__main__":  # run as a module: use the importable copy, which conftest shares
    from dpkit.grading.harness import main as harness_main

    sys.exit(harness_main(sys.argv[1:]))
