"""A throwaway JupyterLab server for the browser tests, and a check that nothing outlives it.

:class:`LabServer` copies the notebooks into a temporary folder (so nothing under test is
rewritten), keeps Jupyter, IPython and matplotlib state in that folder too, starts
``jupyter lab`` on 127.0.0.1 with a free port and a random token, and waits for
``/api/status``. :meth:`LabServer.stop` asks the server to shut down (which also stops its
kernels), then ends its process group and any kernel still alive, and returns the processes
that survived (none, normally).

The lab settings that make a headless run stable are written as *user* settings into the
temporary folder (``--LabApp.user_settings_dir``), so the virtual environment is never
touched: no news or update checks (no network here), no autosave (it would rewrite the
notebook under test), and no cell windowing (it leaves cells out of the DOM).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from dpkit.placement_check import write_kernel_config

LAB_SETTINGS = {
    "@jupyterlab/apputils-extension:notification": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    "@jupyterlab/docmanager-extension:plugin": {"autosave": False},
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _processes() -> dict[int, tuple[int, str]]:
    """Every live process (zombies left out): pid -> (parent pid, command line)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended while we looked
            continue
        if fields[0] != "Z":
            table[int(entry.name)] = (int(fields[1]), cmdline.strip())
    return table


def processes_mentioning(text: str) -> dict[int, str]:
    """Live processes whose command line contains ``text``: pid -> command line."""
    return {
        pid: cmdline
        for pid, (_, cmdline) in _processes().items()
        if text in cmdline and pid != os.getpid()
    }


def itself(pid: int) -> dict[int, str]:
    """``pid`` with its command line, or nothing once it has ended."""
    entry = _processes().get(pid)
    return {pid: entry[1]} if entry else {}


def descendants(pid: int) -> dict[int, str]:
    """The live processes below ``pid`` (children, their children, ...): pid -> command line."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = {}, list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found[child] = table[child][1]
        todo.extend(children.get(child, []))
    return found


def still_alive(processes: dict[int, str], wait: float = 0.0) -> dict[int, str]:
    """Those of ``processes`` still running (same pid, same command line) after ``wait`` s."""
    deadline = time.monotonic() + wait
    while True:
        table = _processes()
        alive = {
            pid: cmdline
            for pid, cmdline in processes.items()
            if pid in table and table[pid][1] == cmdline
        }
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.1)


class LabServer:
    """``jupyter lab`` over a temporary copy of the folder ``source``; a context manager."""

    def __init__(self, source: Path, startup_timeout: float = 60.0) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="dpkit-browser-"))
        self.notebook_dir = self.root / "notebooks"
        # The whole folder, so notebooks find what they read next to them; never the original.
        shutil.copytree(
            source,
            self.notebook_dir,
            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"),
        )
        # and the scripts notebook 09 runs, beside the notebooks as in the repository
        examples = source.parent / "examples"
        if examples.is_dir():
            shutil.copytree(examples, self.root / "examples",
                            ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        self.port = free_port()
        self.token = secrets.token_hex(24)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.root / "jupyter-lab.log"
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen | None = None
        self.startup_seconds = 0.0

    # -- start --------------------------------------------------------------------------

    def _environment(self) -> dict[str, str]:
        state = self.root / "state"
        write_kernel_config(state / "ipython")  # kernels read DPKIT_CHECK_PLACEMENT below
        env = dict(os.environ)
        env.update(
            JUPYTER_CONFIG_DIR=str(state / "jupyter-config"),
            JUPYTER_DATA_DIR=str(state / "jupyter-data"),
            JUPYTER_RUNTIME_DIR=str(state / "jupyter-runtime"),
            IPYTHONDIR=str(state / "ipython"),
            MPLCONFIGDIR=str(state / "matplotlib"),
            JUPYTER_PLATFORM_DIRS="1",
            PYTHONUNBUFFERED="1",
            # Kernels run under dpkit's placement check, as on a GPU box (tests/conftest.py).
            DPKIT_CHECK_PLACEMENT="1",
            # The token by environment, not on the command line: any local user can read a
            # process's /proc/<pid>/cmdline, only its owner its environ (jupyter_server reads
            # JUPYTER_TOKEN as ServerApp.token's default).
            JUPYTER_TOKEN=self.token,
        )
        # Kernels should draw as a learner's do (inline), not with the Agg of the test run.
        env.pop("MPLBACKEND", None)
        return env

    def _write_settings(self) -> Path:
        settings = self.root / "lab-user-settings"
        for plugin, values in LAB_SETTINGS.items():
            package, name = plugin.split(":")
            target = settings / package / f"{name}.jupyterlab-settings"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(values, indent=2))
        return settings

    def command(self) -> list[str]:
        jupyter = Path(sys.executable).with_name("jupyter")
        return [
            str(jupyter) if jupyter.exists() else "jupyter",
            "lab",
            "--no-browser",
            "--allow-root",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            "--port-retries=0",
            "--ServerApp.password=",
            f"--ServerApp.root_dir={self.notebook_dir}",
            "--ServerApp.open_browser=False",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            f"--LabApp.user_settings_dir={self._write_settings()}",
            f"--LabApp.workspaces_dir={self.root / 'lab-workspaces'}",
            # window.jupyterapp: the test opens notebook after notebook in one loaded page
            # (loading JupyterLab took 4 of a notebook's 9-20 s here).
            "--LabApp.expose_app_in_browser=True",
        ]

    def start(self) -> LabServer:
        began = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                cwd=self.notebook_dir,
                env=self._environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, ended as one
            )
        deadline = began + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"jupyter lab exited with {self.process.returncode} before it was ready:\n"
                    + self.log_tail()
                )
            if self.api("status", timeout=2) is not None:
                self.startup_seconds = time.monotonic() - began
                return self
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(
            f"jupyter lab not ready after {self.startup_timeout} s:\n{self.log_tail()}"
        )

    def __enter__(self) -> LabServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        self.cleanup()

    # -- talk to it ------------------------------------------------------------------------

    def api(self, path: str, method: str = "GET", timeout: float = 10) -> Any:
        """JSON from ``/api/<path>``, or None when the server does not answer with success."""
        return self.request(f"api/{path}", method, timeout)

    def request(self, path: str, method: str = "GET", timeout: float = 10) -> Any:
        """JSON from ``/<path>`` on the server, or None when it does not answer with success."""
        request = urllib.request.Request(
            f"{self.url}/{path}",
            method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                body = response.read()
        except (urllib.error.URLError, OSError):
            return None
        return json.loads(body) if body.strip() else {}

    def lab_settings(self, plugin: str) -> dict:
        """The settings JupyterLab resolved for ``plugin`` (defaults, overrides, user)."""
        answer = self.request(f"lab/api/settings/{plugin}") or {}
        return answer.get("settings") or {}

    def lab_url(self, notebook: str, workspace: str) -> str:
        """A notebook in its own fresh workspace, so no earlier tab (or kernel) comes back."""
        return f"{self.url}/lab/workspaces/{workspace}/tree/{notebook}?reset&token={self.token}"

    def shutdown_kernels_of(self, notebook: str) -> None:
        """Delete the sessions (and so the kernels) of a notebook once its test is done."""
        for session in self.api("sessions") or []:
            if session.get("path", "").endswith(notebook):
                self.api(f"sessions/{session['id']}", method="DELETE")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- stop ------------------------------------------------------------------------------

    def stop(self, timeout: float = 20.0) -> dict[int, str]:
        """Shut the server and its kernels down; return the processes that outlived it.

        Kernels run in sessions of their own, so ending the server's process group alone
        would leave them behind: the server's own shutdown stops them first, and any
        process whose command line still names this server's temporary folder (kernels get
        their connection file there) is ended afterwards.
        """
        if self.process is None:
            return {}
        process, self.process = self.process, None
        # Everything it started (kernels included), to check on once it is gone.
        started = {**itself(process.pid), **descendants(process.pid)}
        if process.poll() is None:
            self.api("shutdown", method="POST", timeout=5)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._signal_group(process.pid, signal.SIGKILL)
                    process.wait(timeout=5)
        # The process group may hold helpers the server started without a session of its own.
        self._signal_group(process.pid, signal.SIGKILL)
        survivors = {**still_alive(started, wait=5.0), **self.strays(wait=0.5)}
        for pid in survivors:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return survivors

    def strays(self, wait: float = 0.0) -> dict[int, str]:
        """Processes still naming this server's folder, after up to ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while True:
            found = processes_mentioning(str(self.root))
            if not found or time.monotonic() >= deadline:
                return found
            time.sleep(0.1)

    @staticmethod
    def _signal_group(pid: int, sig: int) -> None:
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


__all__ = [
    "LAB_SETTINGS",
    "LabServer",
    "descendants",
    "free_port",
    "itself",
    "processes_mentioning",
    "still_alive",
]
