"""The shell entry points of dpkit.ddp, each in a subprocess: ``dpkit ddp``, the training
script on its own, and under torchrun as two nodes on this machine."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dpkit import cli
from dpkit.models import build_model

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "MPLBACKEND": "Agg",
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
}


def run(*command: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """``command``'s result, in a session of its own: :func:`left_in_session` then finds
    whatever it left running (ranks, the fork server, what a rank started)."""
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=ENV,
        start_new_session=True,
    )  # fmt: skip


def left_in_session(session: int, wait_s: float = 5.0) -> list[int]:
    """Processes still in ``session`` after up to ``wait_s`` seconds (Python's helpers end
    a moment after the process that started them), from ``/proc``."""
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[3]) == session and fields[0] != "Z":  # fields[3]: session id
                left.append(int(entry))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def processes_mentioning(text: str) -> list[str]:
    """Command lines of running processes that mention ``text`` (a test's own folder)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    line = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in line:
                found.append(line)
    return found


def tracks(trace_json: Path) -> set[str]:
    events = json.loads(trace_json.read_text())["traceEvents"]
    return {e["args"]["name"] for e in events if e["name"] == "thread_name"}


def test_dpkit_ddp_trains_and_writes_the_trace_and_figures(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-m", "dpkit", "ddp", "--nproc", "2", "--batch", "16", "--steps", "2",
         "--bucket-mb", "0.001", "--out", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV,
        start_new_session=True,
    )  # fmt: skip
    stdout, stderr = process.communicate(timeout=180)
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    assert result.returncode == 0, result.stderr
    # nothing it started outlives it: not a rank, not the fork server (its session is empty)
    assert left_in_session(process.pid) == []
    assert tracks(tmp_path / "trace.json") == {"rank:0 (cpu)", "rank:1 (cpu)"}
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    allreduces = [e for e in events if e["name"] == "allreduce" and e["args"]["step"] == 2]
    size = sum(p.numel() * p.element_size() for p in build_model("mlp").parameters())
    assert sum(e["args"]["nbytes"] for e in allreduces) == 2 * size  # both ranks, a step
    for figure in ("timeline.png", "memory.png"):
        assert (tmp_path / figure).read_bytes().startswith(b"\x89PNG")
    out = result.stdout
    assert "DistributedDataParallel: 2 processes (ranks), backend gloo" in out
    assert f"parameters: {size:,d} bytes" in out and "3 bucket(s)" in out
    assert "allreduce" in out and "rank:1 (cpu)" in out  # the summaries
    assert str(tmp_path / "trace.json") in out and str(tmp_path / "timeline.png") in out
    assert processes_mentioning(str(tmp_path)) == []


@pytest.mark.parametrize(
    "options, words",
    [
        (["--nproc", "0"], ["--nproc", "at least 1"]),
        (["--bucket-mb", "0"], ["--bucket-mb", "more than 0"]),
        (["--model", "resnet"], ["--model", "invalid choice"]),
        (["--nproc", "100000"], ["dpkit: error: ValueError: --nproc 100000 is more than"]),
        (["--nproc", "3", "--batch", "64"], ["--batch 64 does not split evenly", "--batch 66"]),
        (["--batch", str(10**12)], [f"--batch {10**12}: 2 ranks", "use a smaller --batch"]),
        (["--bucket-mb", "inf"], ["argument --bucket-mb", "bucket_cap_mb=inf"]),
        (["--bucket-mb", "1e13"], ["argument --bucket-mb", "bucket_cap_mb=1e+13", "64-bit"]),
        (["--timeout", "inf"], ["argument --timeout", "timeout=inf", "at most"]),
    ],
)
def test_dpkit_ddp_refuses_bad_options_by_name(options, words, tmp_path, capsys, monkeypatch):
    # In this process (each is refused before any rank starts): exit status 2, as the shell
    # sees it from `dpkit ddp`, and the option named on stderr.
    monkeypatch.delenv("DPKIT_DEBUG", raising=False)
    try:
        status = cli.main(["ddp", *options, "--out", str(tmp_path)])
    except SystemExit as exit:  # argparse's refusals
        status = exit.code
    assert status == 2
    stderr = capsys.readouterr().err
    for word in words:
        assert word in stderr
    assert not (tmp_path / "trace.json").exists()


def test_an_unwritable_out_is_refused_before_any_rank_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DPKIT_DEBUG", raising=False)
    (tmp_path / "a_file").write_text("")  # a folder cannot be made inside a file
    out = tmp_path / "a_file" / "runs"
    started = time.monotonic()
    assert cli.main(["ddp", "--out", str(out)]) == 2
    assert time.monotonic() - started < 2  # no rank started: that takes seconds
    stderr = capsys.readouterr().err
    assert f"--out {out}: cannot write there (Not a directory)" in stderr


def test_the_training_script_runs_alone_as_a_world_of_one(tmp_path):
    result = run(sys.executable, "-m", "dpkit.ddp.train", "--samples", "64", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    (who,) = json.loads((tmp_path / "ranks.json").read_text())
    assert (who["rank"], who["local_rank"], who["node"], who["steps"]) == (0, 0, 0, 2)
    assert tracks(tmp_path / "trace.json") == {"rank:0 (cpu)"}
    build_model("mlp").load_state_dict(torch.load(tmp_path / "model.pt"))  # no "module."


@pytest.mark.slow
def test_two_nodes_of_two_ranks_on_localhost_through_torchrun(tmp_path):
    assert (Path(sys.executable).parent / "torchrun").exists()
    result = run(
        "env", "LIMIT_S=120", "bash", "scripts/two_nodes_localhost.sh", str(tmp_path), "--",
        "--samples", "128", timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    ranks = json.loads((tmp_path / "ranks.json").read_text())
    # Four ranks, two per node, two nodes: RANK = node * 2 + LOCAL_RANK, as torchrun numbers
    assert sorted((r["node"], r["local_rank"], r["rank"]) for r in ranks) == [
        (0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 1, 3),
    ]  # fmt: skip
    assert len({r["pid"] for r in ranks}) == 4
    # DistributedSampler: 128 samples over 4 ranks, 32 per rank per step -> 1 step each
    assert {r["steps"] for r in ranks} == {1}
    assert tracks(tmp_path / "trace.json") == {f"rank:{r} (cpu)" for r in range(4)}
    build_model("mlp").load_state_dict(torch.load(tmp_path / "model.pt"))
    assert "node 0 (torchrun --node_rank=0): exit status 0" in result.stdout
    assert "node 1 (torchrun --node_rank=1): exit status 0" in result.stdout
    assert processes_mentioning(str(tmp_path)) == []


@pytest.mark.parametrize(
    ("gpus", "ranks_on_the_node", "cuda"),
    [(0, 1, False), (1, 1, True), (1, 2, False), (8, 8, True)],
)
def test_every_rank_of_a_node_picks_the_same_backend(monkeypatch, gpus, ranks_on_the_node, cuda):
    from dpkit.ddp import train

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    # one answer for the node, whichever local rank asks: 2 ranks on 1 GPU both take gloo
    assert train.every_rank_has_a_gpu(ranks_on_the_node) is cuda


def test_dpkit_ddp_nnodes_refuses_a_batch_its_ranks_cannot_share_before_starting(tmp_path, capsys):
    started = time.monotonic()
    argv = ["ddp", "--nnodes", "2", "--nproc", "2", "--batch", "6", "--out", str(tmp_path)]
    assert cli.main(argv) == 2
    assert time.monotonic() - started < 2  # no torchrun started: that takes seconds
    assert "--batch 6 does not split evenly over --nnodes 2 x --nproc 2 = 4 ranks" in (
        capsys.readouterr().err
    )


@pytest.mark.slow
def test_dpkit_ddp_nnodes_runs_a_torchrun_per_node_on_localhost(tmp_path):
    result = run(
        sys.executable, "-m", "dpkit", "ddp", "--nnodes", "2", "--nproc", "1", "--batch",
        "8", "--steps", "2", "--out", str(tmp_path), timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    for node in (0, 1):
        assert f"--nnodes=2 --nproc_per_node=1 --node_rank={node} --master_addr=127.0.0.1" in (
            result.stdout
        )
    ranks = json.loads((tmp_path / "ranks.json").read_text())
    assert sorted((r["node"], r["rank"], r["steps"]) for r in ranks) == [(0, 0, 2), (1, 1, 2)]
    assert tracks(tmp_path / "trace.json") == {"rank:0 (cpu)", "rank:1 (cpu)"}
    assert (tmp_path / "timeline.png").exists()
    assert processes_mentioning(str(tmp_path)) == []


@pytest.mark.slow
def test_dpkit_ddp_nnodes_leaves_no_node_when_killed(tmp_path):
    # The torchruns run in sessions of their own; killed by SIGKILL, dpkit ddp can stop
    # none of them: each torchrun asked Linux for SIGTERM at its launcher's death, and
    # stops its ranks (without that request, both nodes trained on after the kill).
    parent = subprocess.Popen(
        [sys.executable, "-m", "dpkit", "ddp", "--nnodes", "2", "--nproc", "1",
         "--batch", "8", "--steps", "100000", "--out", str(tmp_path)],
        cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ranks = [c for c in processes_mentioning(str(tmp_path)) if "dpkit.ddp.train" in c]
            if len([c for c in ranks if "torch.distributed.run" not in c]) == 2:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the two nodes' ranks did not start")
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 15
        while processes_mentioning(str(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_mentioning(str(tmp_path)) == []
    finally:
        parent.kill()
        for pid in filter(str.isdigit, os.listdir("/proc")):  # failed: end what it started
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                    if str(tmp_path).encode() in cmdline.read():
                        os.kill(int(pid), signal.SIGKILL)
