"""Students apart: a class's grading runs in Linux namespaces where the system allows it.

The surprise first: a grading run is a process of the instructor's own user, so without
help it can list ``/tmp`` and find the other students' runs, read ``/proc`` of every process
(the grader's command line names the class), and reach the network. Where unprivileged user
namespaces are allowed (most Linux desktops and VMs; often not inside Docker), each run of
``dpkit grade --submissions`` starts through util-linux's ``unshare`` in new user, mount, PID
and network namespaces, as the instructor's user (no privilege is gained), where:

- the run's own temporary folder is mounted over the folder all the class's runs are made
  in (``/tmp/dpkit-class-...``): the other students' runs are out of sight, and the run
  sees its files at the path they have outside (``/tmp/dpkit-class-.../dpkit-grade-...``);
- the class folder and every folder of the checkout (:func:`out_of_sight`) are covered by
  empty folders: the solutions are in ``exercises/solutions/``, but copies are in
  ``build/mutation/*/`` after ``make mutation``, in ``.git``'s history, and wherever an
  instructor keeps one; only a folder holding the Python that grades (a ``.venv``) stays;
- ``/proc`` shows only the run's own processes, and there is no network;
- the run then enters a second user and mount namespace, so it cannot unmount any of that
  (the mounts are locked to it).

When the PID namespace's first process (the harness) ends, the kernel kills every process
left in it. Where namespaces are not available, or ``DPKIT_GRADE_NAMESPACES=0``, runs start
as before, and :func:`available` says why in :data:`WHY_NOT`.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

OUTER = ("--user", "--map-root-user", "--mount", "--pid", "--fork", "--kill-child")
OUTER += ("--mount-proc", "--net")
# $1 the run's scratch folder (its files in a folder of the same name inside), $2 the
# scratch folder's parent, then folders to cover, "--", the command.
SCRIPT = """set -e
root=$1; parent=$2; shift 2
while [ "$1" != "--" ]; do
    if [ -d "$1" ]; then mount -t tmpfs -o size=64k,mode=0555 dpkit-hidden "$1"; fi
    shift
done
shift
mount --bind "$root" "$parent"
cd "$root/home"
exec unshare --user --map-root-user --mount -- "$@"
"""
WHY_NOT: list[str] = []


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether grading runs can start in namespaces here (probed once per process)."""
    if os.environ.get("DPKIT_GRADE_NAMESPACES", "1") == "0":
        WHY_NOT.append("DPKIT_GRADE_NAMESPACES=0")
        return False
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        WHY_NOT.append("no util-linux unshare (Linux only)")
        return False
    try:
        probe = subprocess.run(
            [unshare, *OUTER, "--", unshare, "--user", "--map-root-user", "--mount", "true"],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError) as error:
        WHY_NOT.append(f"unshare failed: {error}")
        return False
    if probe.returncode != 0:
        WHY_NOT.append(f"unshare refused: {probe.stderr.decode(errors='replace').strip()}")
        return False
    return True


def usable_for(root: Path) -> bool:
    """Whether ``root``'s parent can be covered: Python itself must not live under it."""
    parent = root.parent.resolve()
    for path in (sys.executable, sys.prefix, sys.base_prefix, __file__):
        try:
            Path(os.path.realpath(path)).relative_to(parent)
        except ValueError:
            continue
        return False
    return True


def out_of_sight(exercises: Path) -> list[Path]:
    """The folders a class's runs must not see: every folder of the checkout (``exercises``'
    parent) but those holding the Python that grades or the temporary folder, which the runs
    need. A run reads dpkit, the graders and the stubs from its own copies, so nothing else
    of the checkout is used. A checkout at ``/`` would cover the system itself: there,
    ``exercises/solutions`` only."""
    checkout = exercises.resolve().parent
    if checkout == Path(checkout.anchor):
        return [exercises.resolve() / "solutions"]
    needed = [sys.executable, sys.prefix, sys.base_prefix, tempfile.gettempdir()]
    needed_paths = [Path(os.path.realpath(path)) for path in needed]  # and the runs' folders
    folders = []
    for entry in sorted(checkout.iterdir()):
        folder = entry.resolve()
        if folder.is_dir() and not any(p.is_relative_to(folder) for p in needed_paths):
            folders.append(folder)
    return folders


def wrap(command: Sequence[str], root: Path, hide: Sequence[Path]) -> list[str]:
    """``command`` started in namespaces, ``root`` (a scratch folder holding the run's files
    in ``root / root.name``) mounted over its parent, ``hide`` covered: the run sees its
    files at ``root``'s own path and nothing else of the parent."""
    unshare = shutil.which("unshare") or "unshare"
    covered = [str(Path(path).resolve()) for path in hide]
    return [
        unshare,
        *OUTER,
        "--",
        "/bin/sh",
        "-c",
        SCRIPT,
        "dpkit-grade",
        str(root),
        str(root.parent),
        *covered,
        "--",
        *command,
    ]
