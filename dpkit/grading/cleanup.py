"""Removing a run's temporary folder, whatever the submission left in it.

The surprise first: ``shutil.rmtree`` (and so ``tempfile.TemporaryDirectory``) recurses
once per folder level, so a submission that nests 1,500 folders made it raise
``RecursionError`` and stopped a whole class. Here the walk keeps its own stack of open
folder descriptors: any depth, paths of any length (every step is relative to its parent's
descriptor, never a full path), links removed as links and never followed, folders the
submission made unreadable opened up first. What still cannot be removed is left and named
in the return value; nothing here raises.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_DIRECTORY = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)


def _open_folder(name: str, parent: int) -> int:
    try:
        return os.open(name, _DIRECTORY, dir_fd=parent)
    except PermissionError:  # made unreadable by the submission: ours to open up again
        os.chmod(name, 0o700, dir_fd=parent)
        return os.open(name, _DIRECTORY, dir_fd=parent)


def _entries(fd: int) -> list[tuple[str, bool]]:
    with os.scandir(fd) as found:
        return [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in found]


def remove_tree(path: str | os.PathLike[str]) -> str | None:
    """Remove the folder ``path`` and everything in it; None, or what could not be removed."""
    path = Path(path)
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(info.st_mode):
        path.unlink()
        return None
    problems: list[str] = []
    try:
        parent = os.open(path.parent, _DIRECTORY)
    except OSError as error:
        return f"{path}: {error.strerror}"
    # Each level: (its descriptor, its name in the parent, the parent's descriptor, the
    # subfolders still to visit). Descriptors stay open only along the current path.
    stack: list[tuple[int, str, int, list[str]]] = []
    try:
        top = _open_folder(path.name, parent)
        stack.append((top, path.name, parent, []))
        pending_scan = True
        while stack:
            fd, name, above, folders = stack[-1]
            if pending_scan:
                os.chmod(fd, 0o700)  # a folder the submission made read-only
                for entry, is_folder in _entries(fd):
                    if is_folder:
                        folders.append(entry)
                    else:
                        try:
                            os.unlink(entry, dir_fd=fd)
                        except OSError as error:
                            problems.append(f"{entry}: {error.strerror}")
                pending_scan = False
            if folders:
                child = folders.pop()
                try:
                    stack.append((_open_folder(child, fd), child, fd, []))
                    pending_scan = True
                except OSError as error:
                    problems.append(f"{child}: {error.strerror}")
                continue
            stack.pop()
            os.close(fd)
            try:
                os.rmdir(name, dir_fd=above)
            except OSError as error:
                problems.append(f"{name}: {error.strerror}")
    except OSError as error:
        problems.append(f"{path}: {error.strerror}")
    finally:
        for fd, _, _, _ in stack:
            os.close(fd)
        os.close(parent)
    return "; ".join(problems[:5]) if problems else None
