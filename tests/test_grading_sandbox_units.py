"""What a grading run that ends early tells the instructor (:mod:`dpkit.grading.sandbox`),
and what :func:`dpkit.grading.cleanup.remove_tree` says of what it cannot remove.

A run here is a stand-in for the fork server's (``sandbox._run_once`` with ``server=``):
it reads the run's key from its pipe as the harness does, signs the records it sends with
it, and ends with the exit code asked, so each test takes milliseconds and no Python or
pytest is started.
"""

from __future__ import annotations

import errno
import hmac
import json
import os
import socket

from dpkit.grading import cleanup, forkserver, sandbox


class EndingServer:
    """A fork server whose one run sends ``records`` and then exits with ``code``."""

    namespaces = False  # as a run without ``hide``: not isolated

    def __init__(self, code: int, records: list[dict]) -> None:
        self.code = code
        self.records = records

    def start(self, arguments, env, root, hide, fds) -> forkserver.Run:
        key_read, results_write, _ = fds
        key = os.read(key_read, 64)
        for seq, record in enumerate(self.records):
            text = json.dumps({"seq": seq, **record}).encode()
            os.write(
                results_write,
                text + b"\t" + hmac.new(key, text, "sha256").hexdigest().encode() + b"\n",
            )
        grader, supervisor = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        supervisor.send(json.dumps({"exit": self.code}).encode())
        supervisor.close()
        return forkserver.Run(grader)


def run_once(tmp_path, server: EndingServer) -> tuple[list[dict], str | None]:
    trusted = sandbox.Trusted(files={})
    return sandbox._run_once([2], {}, 5.0, trusted, scratch_parent=tmp_path, server=server)


def test_a_run_that_crashes_before_collecting_is_reported_without_a_task(tmp_path):
    records, stopped = run_once(tmp_path, EndingServer(3, []))
    assert records == []
    assert stopped == (
        "crashed: the grading process ended here (exit code 3); does your code call "
        "sys.exit() or os._exit(), or crash Python?"
    )


def test_a_run_that_crashes_in_a_check_names_its_task(tmp_path):
    collected = {"event": "collected", "nodeid": "test_task2.py::test_sizes", "task": 2}
    records, stopped = run_once(tmp_path, EndingServer(-9, [collected]))
    assert records == [collected]
    assert stopped.startswith(
        "crashed: the grading process ended here in task 2 (killed by SIGKILL"
    )


def test_a_scratch_folder_left_behind_is_a_warning_on_stderr_not_in_the_report(
    tmp_path, monkeypatch, capsys
):
    # stdout carries the report (and a class's summary): a warning there would garble it.
    def removing(path):
        cleanup.remove_tree(path)
        return "stuck.txt: Permission denied"

    monkeypatch.setattr(sandbox, "remove_tree", removing)
    run_once(tmp_path, EndingServer(0, []))
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "dpkit grade: warning: could not remove stuck.txt: Permission denied\n"


def test_remove_tree_names_a_file_it_cannot_remove_and_removes_the_rest(tmp_path, monkeypatch):
    top = tmp_path / "top"
    (top / "sub").mkdir(parents=True)
    for name in ("top/gone.txt", "top/sub/stuck.txt", "top/sub/other.txt"):
        (tmp_path / name).write_text("x")
    unlink = os.unlink

    def refusing(name, *, dir_fd=None):
        if name == "stuck.txt":  # as a file made immutable, or a mount point, refuses
            raise PermissionError(errno.EPERM, "Operation not permitted")
        unlink(name, dir_fd=dir_fd)

    monkeypatch.setattr(os, "unlink", refusing)
    left = cleanup.remove_tree(top)
    assert left == (
        "stuck.txt: Operation not permitted; sub: Directory not empty; top: Directory not empty"
    )
    assert sorted(p.name for p in top.rglob("*")) == ["stuck.txt", "sub"]
