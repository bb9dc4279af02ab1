"""Each task's rule: write the function yourself. Enforced three ways, each with a hint.

- Before the file runs, its source is scanned: importing the reference solutions
  (``exercises.solutions``), a name the task forbids, or a call that can only signal
  processes outside the run (``os.kill(-1, ...)``, ``os.killpg``: :data:`SIGNALLING`)
  fails every check, naming the line.
- While the checks run, each forbidden function (a grader's ``FORBIDDEN``) is wrapped: a
  call made from the student's file (directly or through other library code) raises
  :class:`ForbiddenCall` naming the call and the line. The graders' own calls are allowed.
- After the import, every function and class the stub defines, and every method the stub's
  classes define, must be code compiled from the student's file: ``chunk_sizes =
  dpkit.torch_chunk_sizes``, a subclass of dpkit's finished class, or code compiled from a
  string under another file's name is not writing it.
- While the checks run, each of the stub's functions finishes its work inside its own call
  (:func:`answer_inside`): an iterator it returns is run there, as the student's.
"""

from __future__ import annotations

import ast
import ctypes
import functools
import gc
import importlib
import itertools
import sys
import threading
import types
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any


class ForbiddenCall(RuntimeError):
    """A student's file called a function its task asks the student to write."""


def _resolve(dotted: str) -> tuple[Any, str, Any] | None:
    """``(container, attribute, object)`` for ``"dpkit.chunk_plans.torch_chunk_sizes"`` or
    ``"torch.Tensor.chunk"``; None when it does not exist in this torch or dpkit."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            container: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for part in parts[cut:-1]:
                container = getattr(container, part)
            return container, parts[-1], getattr(container, parts[-1])
        except AttributeError:
            return None
    return None


def code_of(modules: Iterable[ModuleType]) -> frozenset:
    """Every code object the functions and classes of ``modules`` run, nested ones included.

    A frame counts as the grader's only when its code is one of these: code a submission
    compiles under a grader's file name is not.
    """
    found: set = set()
    pending: list = []
    for module in modules:
        path = getattr(module, "__file__", None)
        for value in list(vars(module).values()):
            pending.append(value)
        while pending:
            value = pending.pop()
            try:
                value = _unwrapped(value)
                if isinstance(value, type) and value.__module__ == module.__name__:
                    pending.extend(vars(value).values())
                    continue
                code = getattr(value, "__code__", None)
            except Exception:  # noqa: BLE001 - an object with a strange __getattr__
                continue
            if isinstance(code, types.CodeType) and code.co_filename == path:
                stack = [code]
                while stack:
                    code = stack.pop()
                    if code not in found:
                        found.add(code)
                        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return frozenset(found)


def _unwrapped(value: Any) -> Any:
    """The function under a fixture, a staticmethod, a hypothesis test or functools.wraps."""
    for _ in range(4):
        inner = getattr(getattr(value, "hypothesis", None), "inner_test", None)
        getter = getattr(value, "_get_wrapped_function", None)
        inner = inner or (getter() if callable(getter) else None)
        inner = inner or getattr(value, "__func__", None) or getattr(value, "__wrapped__", None)
        if inner is None or inner is value:
            break
        value = inner
    return value


Decision = tuple[str, int, str, int]  # student file, line, rule's name, task


def _decide(
    frame: Any, rules: dict[str, tuple[str, int]], grader_codes: frozenset
) -> Decision | str | None:
    """Who called: a student file of ``rules`` (the decision), the grader (None), or, in a
    thread with neither on its stack, the thread's name (the call is refused too: a worker
    thread a submission starts runs only library code)."""
    while frame is not None:
        code = frame.f_code
        if code in grader_codes:
            return None
        if code.co_filename in rules:
            name, task = rules[code.co_filename]
            return code.co_filename, frame.f_lineno, name, task
        if code is _STUDENT_CALL:  # a student's function, called by a grader: still theirs
            student_file = frame.f_locals.get("student_file")
            if student_file in rules:
                name, task = rules[student_file]
                return student_file, frame.f_locals["line"], name, task
        frame = frame.f_back
    thread = threading.current_thread()
    return None if thread is threading.main_thread() else thread.name


def _guarded(original: Any, name: str, rules: dict, grader_codes: frozenset, helper: bool) -> Any:
    """``original`` behind a check of its caller. No ``__wrapped__``, and the rules are the
    guard's own (a private copy, not a table a submission can clear)."""
    task_of_rule = next(iter(rules.values()))[1]

    def guard(*args: Any, **kwargs: Any) -> Any:
        decision = _decide(sys._getframe(1), rules, grader_codes)
        if decision is None:
            return original(*args, **kwargs)
        if isinstance(decision, str):
            raise ForbiddenCall(
                f"{name} was called from the thread {decision!r}, which your code started; "
                f"task {task_of_rule} asks you to write it yourself"
            )
        filename, line, _, task = decision
        if helper:
            raise ForbiddenCall(
                f"{Path(filename).name} line {line} calls the grader's own {name}: the grade "
                "is for code you wrote"
            )
        raise ForbiddenCall(
            f"{Path(filename).name} line {line} calls {name}, which task {task} asks you "
            "to write yourself (the file's docstring says what you may use)"
        )

    for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
        try:
            setattr(guard, attribute, getattr(original, attribute))
        except (AttributeError, TypeError):
            pass
    guard.__dpkit_guard__ = True  # type: ignore[attr-defined]
    guard.__dpkit_lent__ = original  # type: ignore[attr-defined]
    return guard


def install(
    graders: Iterable[tuple[ModuleType, Path, int]], plumbing: Iterable[ModuleType] = ()
) -> None:
    """Guard every grader's ``FORBIDDEN`` names and its reference helpers, once per run.

    ``graders``: each grader module, the student file it grades and its task. A forbidden
    name raises :class:`ForbiddenCall` when the nearest caller that is a student file or
    grader code is that task's student file (or from a thread the submission started); a
    grader's own module-level helpers (``reference_sizes``) raise when a student file calls
    them (a grader lends one to a submission with :func:`lent`). Every module-level reference
    to the same object in dpkit and torch is replaced, so an alias does not escape.
    """
    graders = list(graders)
    grader_codes = code_of([g for g, _, _ in graders] + list(plumbing))
    per_name: dict[str, dict[str, tuple[str, int]]] = {}
    for grader, student_file, task in graders:
        for name in forbidden_names(grader):
            per_name.setdefault(name, {})[str(student_file)] = (name, task)
    for name, rules in per_name.items():
        _guard_name(name, dict(rules), grader_codes)
    students = {str(path): ("", task) for _, path, task in graders}
    for grader, _, _ in graders:
        for key, value in list(vars(grader).items()):
            if (
                isinstance(value, types.FunctionType)
                and not key.startswith("test_")
                and value.__code__.co_filename == grader.__file__
                and not getattr(value, "_pytestfixturefunction", None)
            ):
                guard = _guarded(value, key, students, grader_codes, helper=True)
                setattr(grader, key, guard)


def lent(helper: Any) -> Any:
    """The grader's ``helper`` itself, for a grader to hand to a submission (monkeypatch)."""
    return getattr(helper, "__dpkit_lent__", helper)


# A student's function hands its answer to the grader. What the answer does later, the
# grader's code runs: ``map(torch.chunk, ...)`` adds no Python frame, so torch.chunk, run
# as the grader iterates the map, has no student frame on its stack. The answer is made
# inside the call instead.
ITEMS_LIMIT = 100_000  # items an iterator a student's function returns may yield


def answer_inside(module: ModuleType, path: Path, names: Iterable[str]) -> None:
    """Wrap each function ``names`` of ``module`` (imported from ``path``) so that the work
    of its answer is done inside its call, where a forbidden call is the student's.

    An iterator it returns (a ``map``, a ``filter``, a generator) is run to the end in the
    wrapper and handed back as an iterator over the same items; whatever else happens until
    the call returns (a finaliser run as the function's frame ends) happens under the
    wrapper too, which the guards count as the student's file, at the function's line.
    """
    for name in names:
        function = vars(module).get(name)
        if isinstance(function, types.FunctionType):
            setattr(module, name, _answering(function, str(path)))


def _answering(function: types.FunctionType, student_file: str) -> Any:
    @functools.wraps(function)
    def answer(*args: Any, **kwargs: Any) -> Any:
        return _student_call(function, student_file, args, kwargs)

    return answer


def _student_call(function: Any, student_file: str, args: tuple, kwargs: dict) -> Any:
    line = function.__code__.co_firstlineno  # read by _decide, with student_file
    result = function(*args, **kwargs)
    if isinstance(result, Iterator):
        items = list(itertools.islice(result, ITEMS_LIMIT + 1))
        if len(items) > ITEMS_LIMIT:
            raise ValueError(
                f"{function.__name__} (line {line}) returned an iterator of more than "
                f"{ITEMS_LIMIT} items: return a list"
            )
        result = iter(items)
    return result


_STUDENT_CALL = _student_call.__code__


def _guard_name(name: str, rules: dict[str, tuple[str, int]], grader_codes: frozenset) -> None:
    found = _resolve(name)
    if found is None:
        return
    container, attribute, current = found
    if _is_guard(current):
        return
    # torch._C._VariableFunctions.chunk lives on the instance's class, not the instance.
    owner = container
    if not isinstance(container, (type, ModuleType)) and attribute not in _vars_of(container):
        owner = type(container)
    raw = _static_attribute(owner, attribute)
    kind = type(raw) if isinstance(raw, (classmethod, staticmethod)) else None
    function = raw.__func__ if kind is classmethod else current
    guard = _guarded(function, name, rules, grader_codes, helper=False)
    for module_name, module in list(sys.modules.items()):
        if module is not None and module_name.split(".")[0] in ("dpkit", "torch"):
            for key, value in list(_vars_of(module).items()):
                if value is current:
                    setattr(module, key, guard)
    if kind is not None:
        _set(owner, attribute, kind(guard))
    else:
        bases = owner.__mro__[1:] if isinstance(owner, type) else ()
        for base in bases:  # Tensor.chunk is TensorBase.chunk too
            if vars(base).get(attribute) is current:
                _set(base, attribute, guard)
        _set(owner, attribute, guard)
    if not _is_guard(getattr(container, attribute, None)):  # never a guard that is not one
        raise RuntimeError(f"cannot guard {name}: grading would not refuse it")


def _vars_of(value: Any) -> dict:
    """``vars(value)``, or an empty dict for an object without one."""
    return getattr(value, "__dict__", None) or {}


def _set(owner: Any, attribute: str, value: Any) -> None:
    """``setattr``, on a built-in type too: ``torch._C.TensorBase`` refuses ``setattr``, so the
    entry goes into the dict behind its read-only ``__dict__`` and the type's method cache is
    cleared (what ``setattr`` does on any other class). Left out, ``TensorBase.chunk(t, 4)``
    would reach the real chunk with the guard on ``torch.Tensor`` only."""
    try:
        setattr(owner, attribute, value)
    except TypeError:
        if not isinstance(owner, type):
            raise
        gc.get_referents(owner.__dict__)[0][attribute] = value
        ctypes.pythonapi.PyType_Modified(ctypes.py_object(owner))


def forbid(names: Iterable[str], student_file: Path, task: int, graders: Path) -> None:
    """Guard ``names`` for one student file, any caller but that file allowed (a run of one
    grader outside ``dpkit grade``; :func:`install` guards a whole run)."""
    del graders
    for name in names:
        _guard_name(name, {str(student_file): (name, task)}, frozenset())


def _is_guard(value: Any) -> bool:
    function = getattr(value, "__func__", value)
    return getattr(function, "__dpkit_guard__", False)


def _static_attribute(container: Any, attribute: str) -> Any:
    if isinstance(container, type):
        for klass in container.__mro__:
            if attribute in vars(klass):
                return vars(klass)[attribute]
    return getattr(container, attribute)


def forbidden_names(module: ModuleType) -> tuple[str, ...]:
    """A grader module's ``FORBIDDEN`` names (none when it has no such list)."""
    return tuple(getattr(module, "FORBIDDEN", ()))


# --------------------------------------------------------------------------------------
# Before the import: the source.


def _is_solutions(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "exercises" or "solutions" in parts


def scan_source(path: Path, forbidden: Iterable[str]) -> str | None:
    """Why ``path`` may not be graded (it imports the solutions or a forbidden name), or None.

    A syntax error is left for the import to report, with its line.
    """
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return None
    forbidden = set(forbidden)
    # dpkit's names, any case: ``from dpkit._functions import Broadcast`` is dpkit's broadcast
    short = {name.rsplit(".", 1)[-1].lower(): name for name in forbidden}
    for node in ast.walk(tree):
        modules: list[str] = []
        imported: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
            imported = [f"{node.module}.{alias.name}" for alias in node.names]
        if any(_is_solutions(m) for m in modules):
            return (
                f"{path.name} line {node.lineno} imports the reference solutions "
                f"({', '.join(modules)}): the grade is for code you wrote"
            )
        for name in imported:
            if name in forbidden or (name.startswith("dpkit") and _last(name) in short):
                rule = forbidden_name(name, forbidden, short)
                return f"{path.name} line {node.lineno} imports {rule}, {WRITE_IT}"
        for name in imported:
            if name in SIGNALLING:
                return f"{path.name} line {node.lineno} imports {name}, {NO_SIGNALS}"
        if isinstance(node, ast.Call) and _signals_outside(node):
            text = ast.unparse(node.func)
            return f"{path.name} line {node.lineno} uses {text} outside the run, {NO_SIGNALS}"
        if isinstance(node, ast.Attribute):
            text = ast.unparse(node)
            if text in SIGNALLING:
                return f"{path.name} line {node.lineno} uses {text}, {NO_SIGNALS}"
            if text in forbidden or (text.startswith("dpkit.") and _last(text) in short):
                rule = forbidden_name(text, forbidden, short)
                return f"{path.name} line {node.lineno} uses {rule}, {WRITE_IT}"
    return None


WRITE_IT = "which this task asks you to write yourself: remove it"
# Signals that can only reach outside the run: no task needs one, and without namespaces
# they reach the instructor's own processes. The kernel refuses these calls in a grading
# run (dpkit.grading.fence) and the warden refuses os.kill outside the run's processes
# whatever the route (getattr, a thread); this names the line before the file runs.
# os.kill of the run's own processes (os.kill(os.getpid(), SIGSTOP)) stays allowed.
SIGNALLING = frozenset(
    {"os.killpg", "os.pidfd_open", "signal.pidfd_send_signal", "posix.killpg", "posix.pidfd_open"}
)


def _signals_outside(node: ast.Call) -> bool:
    """``os.kill(-1, ...)``, ``os.kill(-pid, ...)`` or ``os.kill(os.getppid(), ...)``."""
    if ast.unparse(node.func) not in ("os.kill", "posix.kill") or not node.args:
        return False
    target = node.args[0]
    if isinstance(target, ast.UnaryOp) and isinstance(target.op, ast.USub):
        return True
    return isinstance(target, ast.Call) and ast.unparse(target.func).endswith("getppid")


NO_SIGNALS = "which grading refuses: no task needs to signal a process, remove it"


def _last(dotted: str) -> str:
    return dotted.rsplit(".", 1)[-1].lower()


def forbidden_name(name: str, forbidden: set[str], short: dict[str, str]) -> str:
    """The rule ``name`` breaks: itself, or the forbidden name it is another route to (when
    only the case differs, ``name`` itself: dpkit's class, not the function named)."""
    if name in forbidden:
        return name
    rule = short[_last(name)]
    return rule if rule.rsplit(".", 1)[-1] == name.rsplit(".", 1)[-1] else name


# --------------------------------------------------------------------------------------
# After the import: the stub's functions and classes are the student's own.


def stub_names(stub: Path) -> list[str]:
    """The functions and classes a stub defines at top level: what the student writes."""
    tree = ast.parse(stub.read_text(encoding="utf-8"))
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]


def stub_methods(stub: Path) -> dict[str, list[str]]:
    """The methods each of a stub's top-level classes defines (``Gather``: forward, backward)."""
    tree = ast.parse(stub.read_text(encoding="utf-8"))
    return {
        node.name: [n.name for n in node.body if isinstance(n, ast.FunctionDef)]
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }


def not_written_here(
    module: ModuleType,
    path: Path,
    names: Iterable[str],
    methods: Mapping[str, Iterable[str]] | None = None,
) -> str | None:
    """Why ``module`` (imported from ``path``) does not define ``names`` itself, or None.

    A function, and each of a class's ``methods`` (as the class resolves it, so inherited
    ones count), must run code compiled from the text of ``path``, under that name: the
    guards know the student's frames by their file name, and code compiled from a string
    under another file's name, or dpkit's own method under a subclass, is not written here.
    """
    written = _compiled(path)
    for name in names:
        value = getattr(module, name, None)
        if value is None:
            continue  # missing: the checks that use it say so
        if isinstance(value, type):
            if value.__module__ != module.__name__:
                return _borrowed(path, name, value, "class")
            for method in (methods or {}).get(name, ()):
                owner = next((k for k in value.__mro__ if method in vars(k)), value)
                found = vars(owner).get(method)
                if found is not None and not _is_written(found, path, written):
                    inherited = owner if owner is not value else None
                    return _borrowed(path, f"{name}.{method}", found, "method", inherited)
        elif not _is_written(value, path, written):
            return _borrowed(path, name, value, "function")
    return None


def _compiled(path: Path) -> set:
    """Every code object compiling ``path``'s text gives (as its import did)."""
    try:
        source = path.read_bytes()
        return set(_nested(compile(source, str(path), "exec", dont_inherit=True)))
    except (OSError, SyntaxError, ValueError):
        return set()


def _nested(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _nested(constant)


def _is_written(value: Any, path: Path, written: set) -> bool:
    code = getattr(getattr(value, "__func__", value), "__code__", None)
    # code equality leaves out the file name: a copy compiled under another name would
    # pass for the student's and hide its calls from the guards, hence both tests
    return (
        isinstance(code, types.CodeType)
        and code in written
        and all(c.co_filename == str(path) for c in _nested(code))
    )


def _borrowed(path: Path, name: str, value: Any, kind: str, inherited: type | None = None) -> str:
    function = lent(getattr(value, "__func__", value))  # a guarded method: dpkit's own
    module = getattr(function, "__module__", None) or "elsewhere"
    what = f"{module}.{getattr(function, '__qualname__', name)}"
    code = getattr(function, "__code__", None)
    if inherited is not None:
        what = f"inherited from {inherited.__module__}.{inherited.__qualname__}"
    elif isinstance(code, types.CodeType) and code.co_filename != str(path):
        what += f" (compiled from {code.co_filename})"
    return (
        f"{path.name}: {name} is {what}, not a {kind} written in your file; the task is to write it"
    )
