"""One grading run: private copies, a scratch home, one process tree, signed results.

The surprise first: the student's file never runs where the checkout is. Each run gets a
temporary folder holding a copy of dpkit and of the graders (read once, when grading
starts, so a submission that edits the checkout's files cannot change a later student's
grade), a copy of the submission, and an empty home that is also the working directory.
The reference solutions are not copied, so they are not importable. The grading process
(:mod:`dpkit.grading.harness`) starts in a session of its own, under a memory cap, with a
marker in its environment; when it ends, times out or the caller is interrupted, every
process carrying the marker is killed, including ones that left the session with setsid.
Nothing here waits on a pipe another process may hold: reads have a deadline, and what the
harness sends counts only when signed with the run's key (see the harness's docstring).
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dpkit.grading.layout import check_task, task_files
from dpkit.grading.results import CheckResult, results_from_records

MEMORY_BUDGET = 2 * 1024**3  # bytes of address space the graded code may add to the harness's
OUTPUT_KEPT = 16 * 1024  # bytes of the child's output kept (the rest is read and dropped)
RESULTS_LIMIT = 8 * 1024**2  # bytes of results a run may send: more is a flood, not checks
RUN_MARKER = "DPKIT_GRADE_RUN"
PASSED_ENVIRONMENT = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "SYSTEMROOT", "TMPDIR")


@dataclass(frozen=True)
class Trusted:
    """The files a grading run trusts, read once: dpkit, the graders and the stubs.

    ``modified`` lists the graders and grading files that differ from the checkout's last
    git commit (empty when there is no git), so an instructor sees an edited grader.
    """

    files: Mapping[str, bytes]
    modified: tuple[str, ...] = ()


def _read_tree(folder: Path, prefix: str) -> dict[str, bytes]:
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            files[f"{prefix}/{path.relative_to(folder).as_posix()}"] = path.read_bytes()
    return files


def _modified_since_commit(root: Path, paths: Sequence[str]) -> tuple[str, ...]:
    git = shutil.which("git")
    inside = [p for p in paths if not os.path.relpath(p, root).startswith("..")]
    if git is None or not inside:
        return ()
    try:
        status = subprocess.run(
            [git, "-C", str(root), "status", "--porcelain", "--", *inside],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return ()
    if status.returncode != 0:  # not a git checkout
        return ()
    return tuple(line[3:] for line in status.stdout.splitlines() if line[3:])


def read_trusted(exercises: Path) -> Trusted:
    """Read dpkit and ``exercises``' graders and stubs into memory, once per grading."""
    package = Path(__file__).resolve().parents[1]
    files = _read_tree(package, "lib/dpkit")
    files.update(_read_tree(exercises / "graders", "exercises/graders"))
    for name in task_files(exercises).values():
        files[f"exercises/{name}"] = (exercises / name).read_bytes()
    files["pytest.ini"] = b"[pytest]\n"
    watched = [str(exercises / "graders"), str(exercises / "task*.py"), str(package / "grading")]
    return Trusted(files, _modified_since_commit(exercises.parent, watched))


def check_timeout(timeout: float) -> float:
    """Each check's own limit: a share of the run's, so a hang leaves time for the rest
    (at most 10 s: a check takes well under a second on an idle laptop, a few on a busy one)."""
    return max(1.0, min(10.0, timeout / 2))


def validate_timeout(timeout: float) -> float:
    """``timeout`` as a positive, finite number of seconds, or a clear ValueError."""
    try:
        value = float(timeout)
    except (TypeError, ValueError):
        raise ValueError(f"timeout must be a number of seconds, got {timeout!r}") from None
    if not (0 < value < float("inf")):  # also rejects nan
        raise ValueError(
            f"timeout must be a positive, finite number of seconds, got {timeout!r}; "
            "the default is 60 (seconds per task)"
        )
    return value


# --------------------------------------------------------------------------------------
# One run.


def _lay_out(root: Path, trusted: Trusted, submissions: Mapping[str, Path]) -> Path:
    for relative, data in trusted.files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    submitted = root / "submission"
    submitted.mkdir()
    for name, source in submissions.items():
        if source.is_file():
            shutil.copyfile(source, submitted / name)
    (root / "home").mkdir()
    return submitted


def _environment(root: Path, submitted: Path, timeout: float, marker: str) -> dict[str, str]:
    env = {k: os.environ[k] for k in PASSED_ENVIRONMENT if k in os.environ}
    env.update(
        HOME=str(root / "home"),
        TMPDIR=str(root / "home"),
        PYTHONPATH=str(root / "lib"),
        PYTHONNOUSERSITE="1",
        PYTHONDONTWRITEBYTECODE="1",
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
        DPKIT_EXERCISE_DIR=str(submitted),
        DPKIT_CHECK_TIMEOUT=str(check_timeout(timeout)),
        **{RUN_MARKER: marker},
    )
    return env


def _verified(lines: list[bytes], key: bytes) -> list[dict]:
    """The records signed with ``key``, in order; anything else (forged, replayed) is dropped."""
    records = []
    for line in lines:
        text, _, signature = line.rpartition(b"\t")
        expected = hmac.new(key, text, "sha256").hexdigest().encode()
        if not hmac.compare_digest(signature, expected):
            continue
        record = json.loads(text)
        if record.pop("seq") == len(records):
            records.append(record)
    return records


class _Reader:
    """Reads the results and output pipes until a deadline, never blocking on either."""

    def __init__(self, results_fd: int, output_fd: int) -> None:
        self.results = bytearray()
        self.output = bytearray()
        self.flooded = False
        self.open = {results_fd: self.results, output_fd: self.output}
        for fd in self.open:
            os.set_blocking(fd, False)

    def read(self, wait: float) -> bool:
        """Read what is there within ``wait`` seconds; whether anything was read."""
        if not self.open:
            return False
        ready, _, _ = select.select(list(self.open), [], [], max(wait, 0))
        for fd in ready:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            buffer = self.open[fd]
            if not data:
                del self.open[fd]
            elif buffer is self.output:
                buffer += data
                del buffer[:-OUTPUT_KEPT]
            elif len(buffer) + len(data) > RESULTS_LIMIT:
                self.flooded = True
                del self.open[fd]
            else:
                buffer += data
        return bool(ready)


def _pids_marked(marker: str) -> list[int]:
    needle = f"{RUN_MARKER}={marker}".encode()
    found = []
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as file:
                    if needle in file.read():
                        found.append(int(entry.name))
            except OSError:  # gone, or not ours
                pass
    return found


def kill_run(process: subprocess.Popen, marker: str) -> None:
    """Kill the grading process, its session and every process that carries ``marker``."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (AttributeError, ProcessLookupError, PermissionError):  # no process groups
        process.kill()
    for _ in range(100):  # a fork loop may make new ones while we kill: kill until none
        pids = _pids_marked(marker)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not wait
        pass


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        memory = " (out of memory?)" if name == "SIGKILL" else ""
        return f"killed by {name}{memory}"
    return f"exit code {code}"


def run_graders(
    tasks: Sequence[int],
    exercises: Path,
    submissions: Mapping[str, Path],
    timeout: float,
    trusted: Trusted | None = None,
) -> list[CheckResult]:
    """Grade ``submissions`` (stub file name -> the student's file) on ``tasks``' graders."""
    timeout = validate_timeout(timeout)
    if os.name == "nt":
        raise RuntimeError("dpkit grade needs Linux or macOS; on Windows, run it under WSL")
    for task in tasks:
        check_task(exercises, task)
    trusted = read_trusted(exercises) if trusted is None else trusted
    limit = timeout * len(tasks)
    key, marker = secrets.token_bytes(32), secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="dpkit-grade-") as scratch:
        root = Path(scratch)
        submitted = _lay_out(root, trusted, submissions)
        graders = [str(root / "exercises" / "graders" / f"test_task{t}.py") for t in tasks]
        key_read, key_write = os.pipe()
        os.write(key_write, key)
        os.close(key_write)
        results_read, results_write = os.pipe()
        output_read, output_write = os.pipe()
        command = [
            sys.executable,
            "-m",
            "dpkit.grading.harness",
            str(key_read),
            str(results_write),
            str(MEMORY_BUDGET),
            "--",
            *graders,
            "-q",
            "-s",
            "-p",
            "no:cacheprovider",
            "-p",
            "_hypothesis_pytestplugin",
            "--rootdir",
            str(root),
            "-c",
            str(root / "pytest.ini"),
        ]
        try:
            process = subprocess.Popen(
                command,
                cwd=root / "home",
                env=_environment(root, submitted, timeout, marker),
                stdin=subprocess.DEVNULL,
                stdout=output_write,
                stderr=output_write,
                pass_fds=(key_read, results_write),
                start_new_session=True,  # Ctrl-C in the terminal reaches us, not it
            )
        finally:
            for fd in (key_read, results_write, output_write):
                os.close(fd)
        reader = _Reader(results_read, output_read)
        stopped = None
        try:
            deadline = time.monotonic() + limit
            while process.poll() is None:
                if time.monotonic() >= deadline:
                    stopped = (
                        f"timed out: grading was stopped here after {limit:g} s; does your "
                        "code loop forever or wait for a thread that never finishes?"
                    )
                    break
                reader.read(min(0.2, deadline - time.monotonic()))
            drain_until = time.monotonic() + 0.5  # what is already in the pipes, no more
            while time.monotonic() < drain_until and reader.read(0.05):
                pass
        finally:
            kill_run(process, marker)
            os.close(results_read)
            os.close(output_read)
    records = _verified(bytes(reader.results).split(b"\n"), key)
    finished = any(r["event"] == "finished" for r in records)
    if reader.flooded:
        stopped = "the results channel was flooded with data that no check sent"
    elif stopped is None and not finished:
        stopped = (
            f"crashed: the grading process ended here ({_describe_exit(process.returncode)}); "
            "does your code call sys.exit() or os._exit(), or crash Python?"
        )
    return results_from_records(records, stopped, tasks)
