"""Each task's rule: write the function yourself. Enforced three ways, each with a hint.

- Before the file runs, its source is scanned: importing the reference solutions
  (``exercises.solutions``) or a name the task forbids fails every check, naming the line.
- While the checks run, each forbidden function (a grader's ``FORBIDDEN``) is wrapped: a
  call made from the student's file (directly or through other library code) raises
  :class:`ForbiddenCall` naming the call and the line. The graders' own calls are allowed.
- After the import, every function and class the stub defines must be defined in the
  student's file: ``chunk_sizes = dpkit.torch_chunk_sizes`` is not writing it.
"""

from __future__ import annotations

import ast
import functools
import importlib
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any


class ForbiddenCall(RuntimeError):
    """A student's file called a function its task asks the student to write."""


def _resolve(dotted: str) -> tuple[Any, str, Any] | None:
    """``(container, attribute, object)`` for ``"dpkit.scatter.torch_chunk_sizes"`` or
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


_guards: dict[str, dict[str, tuple[str, int]]] = {}  # name -> {student file: (name, task)}
_graders: set[str] = set()


def _caller_in(students: dict[str, tuple[str, int]]) -> tuple[str, int, str, int] | None:
    """The student file, line and rule if the nearest student or grader frame is a student's."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename in students:
            name, task = students[filename]
            return filename, frame.f_lineno, name, task
        if filename in _graders:
            return None
        frame = frame.f_back
    return None


def _guarded(original: Any, rules: dict[str, tuple[str, int]]) -> Any:
    @functools.wraps(original)
    def guard(*args: Any, **kwargs: Any) -> Any:
        caller = _caller_in(rules)
        if caller is not None:
            filename, line, name, task = caller
            raise ForbiddenCall(
                f"{Path(filename).name} line {line} calls {name}, which task {task} asks you "
                "to write yourself (the file's docstring says what you may use)"
            )
        return original(*args, **kwargs)

    return guard


def forbid(names: Iterable[str], student_file: Path, task: int, graders: Path) -> None:
    """Make each of ``names`` raise :class:`ForbiddenCall` when called from ``student_file``.

    Every module-level reference to the same object in dpkit (``dpkit.torch_chunk_sizes``
    and ``dpkit.scatter.torch_chunk_sizes``) is replaced, so an alias does not escape.
    """
    _graders.update(str(path) for path in graders.glob("*.py"))
    for name in names:
        found = _resolve(name)
        if found is None:
            continue
        container, attribute, current = found
        rules = _guards.setdefault(name, {})
        rules[str(student_file)] = (name, task)
        if _is_guard(current):
            continue  # already wrapped for another task's file: the rules dict is shared
        raw = _static_attribute(container, attribute)
        function = raw.__func__ if isinstance(raw, classmethod) else current
        guard = _guarded(function, rules)
        guard.__dpkit_guard__ = True  # type: ignore[attr-defined]
        if isinstance(raw, classmethod):
            setattr(container, attribute, classmethod(guard))
            continue
        if isinstance(container, ModuleType):
            for module_name, module in list(sys.modules.items()):
                if module is not None and module_name.split(".")[0] in ("dpkit", "torch"):
                    for key, value in list(vars(module).items()):
                        if value is current:
                            setattr(module, key, guard)
        setattr(container, attribute, guard)


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
    short = {name.rsplit(".", 1)[-1]: name for name in forbidden}
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
            if name in forbidden or (name.startswith("dpkit") and name.split(".")[-1] in short):
                rule = forbidden_name(name, forbidden, short)
                return f"{path.name} line {node.lineno} imports {rule}, {WRITE_IT}"
        if isinstance(node, ast.Attribute):
            text = ast.unparse(node)
            if text in forbidden or (text.startswith("dpkit.") and node.attr in short):
                rule = forbidden_name(text, forbidden, short)
                return f"{path.name} line {node.lineno} uses {rule}, {WRITE_IT}"
    return None


WRITE_IT = "which this task asks you to write yourself: remove it"


def forbidden_name(name: str, forbidden: set[str], short: dict[str, str]) -> str:
    return name if name in forbidden else short[name.split(".")[-1]]


# --------------------------------------------------------------------------------------
# After the import: the stub's functions and classes are the student's own.


def stub_names(stub: Path) -> list[str]:
    """The functions and classes a stub defines at top level: what the student writes."""
    tree = ast.parse(stub.read_text(encoding="utf-8"))
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]


def not_written_here(module: ModuleType, path: Path, names: Iterable[str]) -> str | None:
    """Why ``module`` (imported from ``path``) does not define ``names`` itself, or None."""
    for name in names:
        value = getattr(module, name, None)
        if value is None:
            continue  # missing: the checks that use it say so
        function = getattr(value, "__func__", value)
        code = getattr(function, "__code__", None)
        if isinstance(value, type):
            mine = value.__module__ == module.__name__
        else:
            mine = code is not None and code.co_filename == str(path)
        if not mine:
            where = getattr(value, "__module__", None) or "elsewhere"
            return (
                f"{path.name}: {name} is {where}.{getattr(value, '__qualname__', name)}, not "
                f"a {'class' if isinstance(value, type) else 'function'} written in your file; "
                "the task is to write it"
            )
    return None
