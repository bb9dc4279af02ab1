"""What the ``dpkit`` commands share (dpkit.cli_types) and the ``dpkit`` command itself:
the writable-folder check, counted nouns, the help formatter, the one-line error for an
OSError, and the README's list of the commands."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dpkit import cli, cli_types

README = Path(__file__).resolve().parents[1] / "README.md"

# -- writable_folder


def test_a_missing_folder_is_made_resolved_and_left_empty(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    real, tried = cli_types.tempfile.NamedTemporaryFile, []

    def spy(**options):
        tried.append(options["dir"])
        return real(**options)

    monkeypatch.setattr(cli_types.tempfile, "NamedTemporaryFile", spy)
    folder = cli_types.writable_folder("runs/ddp/1", "--out", "--out runs/ddp")
    assert folder == tmp_path.resolve() / "runs" / "ddp" / "1"
    assert tried == [folder]  # the write was tried in that folder
    assert folder.is_dir() and list(folder.iterdir()) == []  # the write test left nothing
    assert cli_types.writable_folder(str(folder), "--out", "") == folder  # an existing one too


def test_a_folder_that_cannot_be_made_is_refused_naming_the_argument_and_the_fix(tmp_path):
    (tmp_path / "a_file").write_text("")  # no folder can be made inside a file
    out = str(tmp_path / "a_file" / "runs")
    with pytest.raises(ValueError) as refused:
        cli_types.writable_folder(out, "--out", "--out runs/ddp")
    # the whole text is docs/bad_input.md's row for dpkit ddp (tests/test_bad_input_table.py)
    message = str(refused.value)
    assert message.startswith(f"--out {out}: cannot write there (Not a directory); ")
    assert message.endswith("e.g. --out runs/ddp")


def test_a_file_is_refused_as_a_file(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ValueError, match=r"^FOLDER .*a_file: is a file, not a folder; give a fo"):
        cli_types.writable_folder(str(tmp_path / "a_file"), "FOLDER", "dpkit course c")


def test_a_folder_where_no_file_can_be_written_is_refused(tmp_path, monkeypatch):
    # As root, no permission bit stops a write: the test file's creation fails instead,
    # with an OSError that has no strerror, whose text is shown
    def refuse(**options):
        raise OSError("read-only file system, says the stand-in")

    monkeypatch.setattr(cli_types.tempfile, "NamedTemporaryFile", refuse)
    with pytest.raises(ValueError, match=r"\(read-only file system, says the stand-in\)"):
        cli_types.writable_folder(str(tmp_path / "out"), "--out", "--out runs/ddp")


@pytest.mark.parametrize("text", ["", "  "])
def test_an_empty_folder_is_refused_not_taken_as_the_current_one(tmp_path, monkeypatch, text):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"^--out is empty; give a folder, e.g. --out runs/ddp$"):
        cli_types.writable_folder(text, "--out", "--out runs/ddp")


# -- plural and the help formatter


@pytest.mark.parametrize(
    "count, text",
    [(0, "0 SGD steps"), (1, "1 SGD step"), (2, "2 SGD steps"), (1000, "1,000 SGD steps")],
)
def test_a_count_of_one_is_singular(count, text):
    assert cli_types.plural(count, "SGD step") == text


def test_the_help_shows_every_default_but_none():
    parser = argparse.ArgumentParser(prog="x", formatter_class=cli_types.DefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="training steps")
    parser.add_argument("--backend", default=None, help="default: gloo, or nccl on GPUs")
    text = " ".join(parser.format_help().split())
    assert "training steps (default: 3)" in text
    assert "default: gloo, or nccl on GPUs" in text and "None" not in text


# -- dpkit.cli.main


def test_an_os_error_is_a_one_line_message_not_a_traceback(monkeypatch, capsys):
    def unreadable(args):
        raise PermissionError(13, "Permission denied", "/srv/course")

    monkeypatch.setattr(cli, "_devices_command", unreadable)
    monkeypatch.delenv("DPKIT_DEBUG", raising=False)
    assert cli.main(["devices"]) == 2
    assert capsys.readouterr().err == (
        "dpkit: error: PermissionError: [Errno 13] Permission denied: '/srv/course'\n"
    )


def test_ctrl_c_is_one_line_and_status_130_not_a_traceback(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_devices_command", interrupted)
    monkeypatch.delenv("DPKIT_DEBUG", raising=False)
    assert cli.main(["devices"]) == 130
    assert capsys.readouterr().err == "dpkit: interrupted\n"
    monkeypatch.setenv("DPKIT_DEBUG", "1")  # the traceback, for whoever asks for it
    with pytest.raises(KeyboardInterrupt):
        cli.main(["devices"])


def test_a_reader_that_stops_reading_ends_the_command_quietly():
    """``dpkit demo | head``: the command's next print meets a closed pipe. It stops with
    the shell's status for SIGPIPE (141) and no error message, as ``cat`` does."""
    endless = (
        "import sys\n"
        "from dpkit import cli\n"
        "def endless(args):\n"
        "    while True:\n"
        "        print('a line of output', flush=True)\n"
        "cli._devices_command = endless\n"
        "sys.exit(cli.main(['devices']))\n"
    )
    command = subprocess.Popen(
        [sys.executable, "-c", endless], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "DPKIT_DEBUG": ""},
    )  # fmt: skip
    assert command.stdout.readline() == b"a line of output\n"
    command.stdout.close()  # what head does after its lines
    assert command.wait(timeout=60) == 141
    assert command.stderr.read() == b""


def test_the_readme_lists_every_command():
    parser = cli.build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    listed = re.search(r"`dpkit ([a-z |]+)`\s+\(also `python -m dpkit`", README.read_text())
    assert listed, "README's package layout lists the commands as `dpkit a | b | ...`"
    assert sorted(listed.group(1).split(" | ")) == sorted(commands.choices)
