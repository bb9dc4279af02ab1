"""One grading run: private copies, a scratch home, one process tree, signed results.

The surprise first: the student's file never runs where the checkout is. Each run gets a
temporary folder holding a copy of dpkit and of the graders (read once, when grading
starts, so a submission that edits the checkout's files cannot change a later student's
grade), a copy of the submission, and an empty home that is also the working directory.
The reference solutions are not copied, so they are not importable. The grading process
(:mod:`dpkit.grading.harness`) starts in a session of its own, under a memory cap, with a
marker in its environment; when it ends, times out or the caller is interrupted, every
process carrying the marker is killed, including ones that left the session with setsid.
A class's runs are forked from a server instead (:mod:`dpkit.grading.forkserver`): each
is the first process of its own PID namespace, so killing it kills every process it
started, or, without namespaces, the child of a subreaper that kills them all.
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
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dpkit.grading import apart, decided, forkserver
from dpkit.grading.cleanup import remove_tree
from dpkit.grading.layout import check_task, task_files
from dpkit.grading.results import CheckResult, clean_text, results_from_records, unlisted
from dpkit.grading.roster import Check, roster

MEMORY_BUDGET = 2 * 1024**3  # bytes of address space the graded code may add to the harness's
OUTPUT_KEPT = 16 * 1024  # bytes of the child's output kept (the rest is read and dropped)
RESULTS_LIMIT = 8 * 1024**2  # bytes of results a run may send: more is a flood, not checks
RUN_MARKER = "DPKIT_GRADE_RUN"
STARTUP_SECONDS = 20.0  # to start Python, import torch and collect, beyond the first task's
STOP = threading.Event()  # set on Ctrl-C while a class is graded: every run in flight stops
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
    roster(files, list(task_files(exercises)))  # a grader it cannot list is an error now
    watched = [str(exercises / "graders"), str(exercises / "task*.py"), str(package / "grading")]
    return Trusted(files, _modified_since_commit(exercises.parent, watched))


def check_timeout(timeout: float) -> float:
    """Each check's own limit: a share of the run's, so a hang leaves time for the rest
    (at most 10 s: a check takes well under a second on an idle laptop, a few on a busy one)."""
    return max(1.0, min(10.0, timeout / 2))


def validate_timeout(timeout: float) -> float:
    """``timeout`` as a positive, finite number of seconds, or a clear ValueError."""
    shown = None
    try:
        value = float(timeout)
    except OverflowError:  # an int past float's range (10**400): too long, not a crash
        value, shown = float("inf"), "an int too large for a float"
    except (TypeError, ValueError):
        raise ValueError(f"timeout must be a number of seconds, got {timeout!r}") from None
    if not (0 < value < float("inf")):  # also rejects nan
        raise ValueError(
            f"timeout must be a positive, finite number of seconds, got {shown or repr(timeout)}; "
            "the default is 60 (seconds per task)"
        )
    return value


# --------------------------------------------------------------------------------------
# One run.


SUBMISSION_LIMIT = 1024**2  # bytes: a task file is a few KB; more is not a task file


def refusal(source: Path) -> str | None:
    """Why ``source`` is not copied into a run (a link, a special file, too big), or None.

    Checked on the entry itself (``lstat``), never through a link: a submission made of
    links to the reference solutions would otherwise be graded as the solutions.
    """
    try:
        info = source.lstat()
    except OSError:
        return None  # missing: the graders say "file missing"
    if stat.S_ISLNK(info.st_mode):
        return (
            f"{source.name} in the submission is a symbolic link, which grading refuses: "
            "submit the file itself"
        )
    if not stat.S_ISREG(info.st_mode):
        return f"{source.name} in the submission is not a regular file (a pipe, a device...)"
    if info.st_size > SUBMISSION_LIMIT:
        return f"{source.name} is {info.st_size} bytes, more than a task file's 1 MB limit"
    return None


def read_submission(source: Path | str | bytes | None) -> bytes | str | None:
    """A submitted file's bytes; or, as a ``str``, why it is not taken; None when missing.

    Bytes and reasons (a :class:`~dpkit.grading.layout.NotTaken`) pass through, so a class
    read into memory before anyone is graded is laid out from memory.
    """
    if source is None or isinstance(source, (bytes, str)):
        return source
    why = refusal(source)
    if why is not None:
        return why
    try:  # opened without following a link: one swapped in since lstat is refused too
        fd = os.open(source, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as error:
        return f"{source.name} could not be read ({error.strerror})"
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            return f"{source.name} in the submission is not a regular file"
        data = file.read(SUBMISSION_LIMIT + 1)  # one byte more tells a file grown since
    if len(data) > SUBMISSION_LIMIT:
        return f"{source.name} is over a task file's 1 MB limit (it grew while being read)"
    return data


def _lay_out(
    root: Path, trusted: Trusted, submissions: Mapping[str, Path | str | bytes | None]
) -> tuple[Path, dict[str, str]]:
    for relative, data in trusted.files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    submitted = root / "submission"
    submitted.mkdir()
    refused = {}
    for name, source in submissions.items():
        data = read_submission(source)
        if isinstance(data, str):
            refused[name] = str(data)
        elif data is not None:
            (submitted / name).write_bytes(data)
    (root / "home").mkdir()
    return submitted, refused


def _environment(
    root: Path,
    submitted: Path,
    timeout: float,
    marker: str,
    refused: Mapping[str, str],
    chosen: Mapping[str, list],
) -> dict[str, str]:
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
        DPKIT_REFUSED_FILES=json.dumps(dict(refused)),
        **{decided.ENVIRONMENT: json.dumps(dict(chosen))},
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
        if not self.open:  # both closed (by a submission, say): wait, do not spin
            time.sleep(max(wait, 0))
            return False
        # poll, not select: select refuses descriptors past 1023, which a grading process
        # with many files open (an xdist worker, an instructor's notebook) reaches
        poller = select.poll()
        for fd in self.open:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        ready = [fd for fd, _ in poller.poll(max(wait, 0) * 1000)]
        for fd in ready:
            for _ in range(64):  # what is there now, up to 64 MiB, then the other pipe
                try:
                    data = os.read(fd, 1 << 20)
                except BlockingIOError:
                    break
                buffer = self.open[fd]
                if not data:
                    del self.open[fd]
                    break
                if buffer is self.output:
                    buffer += data
                    del buffer[:-OUTPUT_KEPT]
                elif len(buffer) + len(data) > RESULTS_LIMIT:
                    self.flooded = True
                    del self.open[fd]
                    break
                else:
                    buffer += data
        return bool(ready)


def _carries(pid: int, needle: bytes) -> bool:
    """Whether process ``pid`` has ``needle`` in its environment (False when it is gone)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:
            return needle in file.read()
    except OSError:  # gone, or not ours
        return False


def _pids_marked(needle: bytes) -> list[int]:
    found = []
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            if _carries(int(entry.name), needle):
                found.append(int(entry.name))
    return found


def _signal_if_marked(pid: int, needle: bytes, signum: int) -> None:
    """Send ``signum`` to ``pid`` if that process carries ``needle``.

    The pid was read from ``/proc`` a moment ago; since then that process may have ended
    and its number gone to a new process of the user (the grader's, another student's
    run). So the process is pinned first: a pidfd names one process for good, never a later
    holder of its number. Then it is checked, then signalled through the pidfd; if it ended
    in between, the signal reaches no one. Without pidfds (Linux before 5.3, macOS, where
    there is no ``/proc`` to find pids in anyway) it is checked and killed by number, which
    leaves the window between the two open.
    """
    try:
        pinned: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfds here
        pinned = None
    try:
        if not _carries(pid, needle):
            return
        if pinned is None:
            os.kill(pid, signum)
        else:
            signal.pidfd_send_signal(pinned, signum)
    except (ProcessLookupError, PermissionError):
        pass
    finally:
        if pinned is not None:
            os.close(pinned)


def kill_run(process: subprocess.Popen | forkserver.Run, marker: str) -> None:
    """Kill the grading process, its session and every process that carries ``marker``.

    A run from the fork server is the first process of its PID namespace: killing it ends
    every process in there, the ones that left its session included. A started run's group
    is killed by number only while the run has not been waited for: until then its pid,
    and so its group's id, cannot be given to another process; after, the marker finds
    what is left (:func:`_signal_if_marked`)."""
    if isinstance(process, forkserver.Run):
        process.kill()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not wait
            pass
        return
    if process.returncode is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (AttributeError, ProcessLookupError, PermissionError):  # no process groups
            process.kill()
    needle = f"{RUN_MARKER}={marker}".encode()
    for _ in range(100):  # a fork loop may make new ones while we kill: kill until none
        pids = _pids_marked(needle)
        if not pids:
            break
        for pid in pids:
            _signal_if_marked(pid, needle, signal.SIGKILL)
        time.sleep(0.01)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not wait
        pass


def _running(process: subprocess.Popen | forkserver.Run) -> bool:
    """Whether the run goes on. A started run that ended is not waited for here: until
    :func:`kill_run` has killed its group, its pid (the group's id) must stay its own."""
    if isinstance(process, subprocess.Popen) and process.returncode is None:
        try:  # WNOWAIT: seen as ended, left a zombie
            return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
        except (AttributeError, ChildProcessError):  # no waitid (Windows)
            pass
    return process.poll() is None


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        memory = " (out of memory?)" if name == "SIGKILL" else ""
        return f"killed by {name}{memory}"
    return f"exit code {code}"


def _in_flight(records: list[dict]) -> dict | None:
    """The first collected check without an outcome: the one running (or about to)."""
    done = {r["nodeid"] for r in records if r["event"] in ("passed", "failed")}
    return next((r for r in records if r["event"] == "collected" and r["nodeid"] not in done), None)


def _run_once(
    tasks: Sequence[int],
    submissions: Mapping[str, Path | str | bytes | None],
    timeout: float,
    trusted: Trusted,
    hide: Sequence[Path] | None = None,
    scratch_parent: Path | None = None,
    server: forkserver.Server | None = None,
) -> tuple[list[dict], str | None]:
    """One grading process over ``tasks``: its verified records and why it stopped early.

    Each task has ``timeout`` seconds from when the previous one finished (the first, from
    when the checks were collected; starting up has ``timeout`` plus
    :data:`STARTUP_SECONDS`): a task that hangs ends the run when its own time is up.
    With ``hide`` (a class's grading), the run starts in namespaces where it can
    (:mod:`dpkit.grading.apart`), ``hide``'s folders covered and its temporary folder
    mounted over ``scratch_parent``, the folder every run of the class is made in; with
    ``server`` (:mod:`dpkit.grading.forkserver`), it is forked from there, not started.
    """
    key, marker = secrets.token_bytes(32), secrets.token_hex(16)
    scratch = tempfile.mkdtemp(prefix="dpkit-grade-", dir=scratch_parent)
    try:
        isolated = hide is not None and apart.available() and apart.usable_for(Path(scratch))
        # Isolated, the run's files are one level down, in a folder of the same name: mounted
        # over the parent, they are seen at the scratch folder's own path.
        root = Path(scratch) / Path(scratch).name if isolated else Path(scratch)
        if isolated:
            root.mkdir()
        seen = Path(scratch)  # where the run sees its folder
        submitted, refused = _lay_out(root, trusted, submissions)
        graders = [str(seen / "exercises" / "graders" / f"test_task{t}.py") for t in tasks]
        key_read, key_write = os.pipe()
        os.write(key_write, key)
        os.close(key_write)
        results_read, results_write = os.pipe()
        output_read, output_write = os.pipe()
        arguments = [
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
            str(seen),
            "-c",
            str(seen / "pytest.ini"),
        ]
        chosen = decided.choose(tasks)  # fresh inputs for the checks decided here
        env = _environment(seen, seen / submitted.name, timeout, marker, refused, chosen)
        process: subprocess.Popen | forkserver.Run | None = None
        try:
            if server is not None and server.namespaces == isolated:  # torch imported
                covered = [str(Path(path).resolve()) for path in hide or ()]
                pipes = (key_read, results_write, output_write)
                try:
                    process = server.start(arguments, env, scratch, covered, pipes)
                except OSError:  # the server is gone: this run starts as before
                    process = None
            if process is None:
                harness = [sys.executable, "-m", "dpkit.grading.harness"]
                command = [*harness, str(key_read), str(results_write), *arguments]
                if isolated:
                    command = apart.wrap(command, Path(scratch), hide or ())
                process = subprocess.Popen(
                    command,
                    cwd="/" if isolated else seen / "home",
                    env=env,
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
            task_started, current, parsed = time.monotonic(), None, -1
            while _running(process):
                if len(reader.results) != parsed:  # new results: which task runs now
                    parsed = len(reader.results)
                    so_far = _verified(bytes(reader.results).split(b"\n"), key)
                    if so_far and so_far[-1]["event"] == "finished":
                        break  # every verdict is in: no need to wait for pytest to exit
                    running = _in_flight(so_far)
                    task = running["task"] if running is not None else None
                    if task != current:
                        task_started, current = time.monotonic(), task
                allowed = timeout if current is not None else timeout + STARTUP_SECONDS
                left = task_started + allowed - time.monotonic()
                if STOP.is_set():
                    stopped = "interrupted: grading was stopped (Ctrl-C)"
                    break
                if left <= 0:
                    where = f" in task {current}" if current is not None else ""
                    stopped = (
                        f"timed out: grading was stopped here{where} after {timeout:g} s; "
                        "does your code loop forever or wait for a thread that never finishes?"
                    )
                    break
                reader.read(min(0.2, left))
            drain_until = time.monotonic() + 0.5  # what is already in the pipes, no more
            while time.monotonic() < drain_until and reader.read(0.05):
                pass
        finally:
            kill_run(process, marker)
            os.close(results_read)
            os.close(output_read)
    finally:
        left_over = remove_tree(scratch)
        if left_over:
            print(f"dpkit grade: warning: could not remove {left_over}", file=sys.stderr)
    records = decided.decide(_verified(bytes(reader.results).split(b"\n"), key), chosen)
    finished = any(r["event"] == "finished" for r in records)
    if reader.flooded:
        stopped = "the results channel was flooded with data that no check sent"
    elif stopped is None and not finished:
        running = _in_flight(records)
        where = f" in task {running['task']}" if running is not None else ""
        stopped = (
            f"crashed: the grading process ended here{where} "
            f"({_describe_exit(process.returncode)}); does your code call sys.exit() or "
            "os._exit(), or crash Python?"
        )
    return records, stopped


def run_graders(
    tasks: Sequence[int],
    exercises: Path,
    submissions: Mapping[str, Path | str | bytes | None],
    timeout: float,
    trusted: Trusted | None = None,
    hide: Sequence[Path] | None = None,
    scratch_parent: Path | None = None,
    server: forkserver.Server | None = None,
    label: str = "",
) -> list[CheckResult]:
    """Grade ``submissions`` (stub file name -> the student's file) on ``tasks``' graders.

    The checks scored are the graders' own (:mod:`dpkit.grading.roster`), whatever the
    grading process reports. A crash or a timeout costs one task: that task's check that
    was running carries why, its later checks say they did not run, and the tasks after it
    are graded again in a fresh process. ``hide``, ``scratch_parent`` and ``server``: see
    :func:`_run_once`; ``label`` names the student in a note on stderr.
    """
    timeout = validate_timeout(timeout)
    if os.name == "nt":
        raise RuntimeError("dpkit grade needs Linux or macOS; on Windows, run it under WSL")
    for task in tasks:
        check_task(exercises, task)
    trusted = read_trusted(exercises) if trusted is None else trusted
    by_task: dict[int, list[CheckResult]] = {}
    pending = list(tasks)
    while pending:
        checks = roster(trusted.files, pending)
        records, stopped = _run_once(
            pending, submissions, timeout, trusted, hide, scratch_parent, server
        )
        results = results_from_records(records, stopped, pending, checks)
        _note_unlisted(unlisted(records, checks), label)
        running = _check_running(records, checks) if stopped is not None else None
        done = _outcomes(records)
        started = {check.task for check in checks if check.nodeid in done}
        if running is not None:
            started.add(running.task)
        again = [t for t in pending if t not in started] if running is not None else []
        for result in results:
            if result.task not in again:
                by_task.setdefault(result.task, []).append(result)
        pending = again
    return [result for task in tasks for result in by_task.get(task, [])]


def _outcomes(records: Sequence[dict]) -> set[str]:
    return {r["nodeid"] for r in records if r["event"] in ("passed", "failed")}


def _check_running(records: Sequence[dict], checks: Sequence[Check]) -> Check | None:
    """The graders' first check without an outcome in a run that ended early: the one that
    was running (None when the run never listed its checks: it ended before any ran)."""
    if not any(r["event"] == "collected" for r in records):
        return None
    done = _outcomes(records)
    return next((check for check in checks if check.nodeid not in done), None)


def _note_unlisted(nodeids: Sequence[str], label: str) -> None:
    if nodeids:
        who = f"{clean_text(label)}: " if label else ""
        print(
            f"dpkit grade: note: {who}the grading process reported checks the graders do not "
            f"define, ignored: {clean_text(', '.join(nodeids))[:500]}",
            file=sys.stderr,
        )
