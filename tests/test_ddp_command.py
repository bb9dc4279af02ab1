"""``dpkit ddp``'s command line (dpkit.ddp.command) and ``run_main`` (dpkit.ddp.script), in
this process, with the launch of rank processes replaced by stand-ins.

The real command and script are checked end to end by tests that start gloo ranks
(tests/test_ddp_cli.py, tests/test_ddp_recipe.py), but a mutation tool records which test
calls which function only in the test's own process, and never sees the ranks. Here the
parser, its argument types, the folder check, the report and the command functions run in
this process: ``run_ddp`` and ``train_on_nodes`` are stand-ins that record their arguments
and return results built by hand (RankRuns, as tests/test_ddp_tables.py builds them), and
``launch.Ranks`` is a stand-in that runs each rank's body here, one rank after another.
Every expected value follows from those hand-made inputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

import dpkit
from dpkit.ddp import checks, command, nodes, process, run, script
from dpkit.ddp.record import RankRun
from dpkit.ddp.run import DDPResult

RANK_LABEL = "processes (DistributedDataParallel, a rank each)"  # the trace's hardware


def rank_run(rank, events, memory=()):
    """One rank's record (as tests/test_ddp_tables.py builds them): pid 100 + rank, a cap of
    25 MiB, 400 bytes of parameters."""
    return RankRun(rank, "cpu", 100 + rank, 25.0, 400, [*events], [*memory], [], None)


def allreduce(start, end, nbytes, step, ring_sent):
    return ("allreduce", start, end, nbytes, step, {"ring_sent_bytes": ring_sent})


def made_up_runs():
    """Rank 0 all-reduces 3,000 + 1,000 bytes in its last step (2), a ring sending 4,500 +
    1,500 of them; its step-1 all-reduce and rank 1's are not rank 0's last step."""
    rank0 = rank_run(0, [
        ("replicate", 0.0, 0.5, 0, 1, {}), allreduce(1.0, 1.2, 999, 1, 999),
        ("backward", 1.9, 2.4, 0, 2, {}), allreduce(2.0, 2.1, 3000, 2, 4500),
        allreduce(2.1, 2.3, 1000, 2, 1500),
    ], [("parameters", 400, 2)])  # fmt: skip
    rank1 = rank_run(1, [allreduce(2.0, 2.2, 7000, 2, 7000)], [("parameters", 400, 2)])
    return [rank0, rank1]


def made_up_result(backend="gloo", cap=0.5, batch=8, nproc=2):
    return DDPResult(run.merged_trace(made_up_runs()), nproc, backend, batch, cap, 1234567,
                     [1.0, 0.0125], [101, 202], None)  # fmt: skip


@pytest.fixture(autouse=True)
def two_cores(monkeypatch):
    """Two cores, whatever this machine has: the command allows 4 ranks per core, so 8."""
    monkeypatch.setattr(checks, "cores", lambda: 2)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="dpkit")
    command.add_ddp_command(top.add_subparsers())
    return top


def parse(*argv: str) -> argparse.Namespace:
    return parser().parse_args(["ddp", *argv])


def refusal(capsys, *argv: str) -> str:
    """argparse's message for ``dpkit ddp argv`` (it exits with status 2)."""
    with pytest.raises(SystemExit) as exit:
        parse(*argv)
    assert exit.value.code == 2
    return capsys.readouterr().err


# -- the parser and its argument types


def test_the_parser_s_defaults_are_two_ranks_batch_64_three_steps_of_the_mlp():
    args = parse()
    assert (args.nproc, args.nnodes, args.batch, args.steps) == (2, 1, 64, 3)
    assert (args.model, args.bucket_mb, args.timeout) == ("mlp", None, 120.0)  # torch's buckets
    assert (args.out, args.backend) == (".", None)
    assert args.run is command._ddp_command


def test_the_parser_reads_every_option_with_its_type():
    args = parse("--nproc", "4", "--nnodes", "2", "--batch", "16", "--model", "wide",
                 "--bucket-mb", "0.5", "--steps", "5", "--out", "runs/x", "--backend", "nccl",
                 "--timeout", "7")  # fmt: skip
    assert (args.nproc, args.nnodes, args.batch, args.steps) == (4, 2, 16, 5)
    # "wide" is one of DDP_MODELS, not of the demo's models
    assert (args.model, args.out, args.backend) == ("wide", "runs/x", "nccl")
    assert args.bucket_mb == 0.5 and args.timeout == 7.0 and type(args.timeout) is float


@pytest.mark.parametrize(
    "argv, words",
    [
        # (tests/test_ddp_cli.py checks --nproc 0, --bucket-mb 0, inf and 1e13, --model and
        # --timeout inf through cli.main)
        (["--nnodes", "0"], ["--nnodes", "at least 1"]),
        (["--steps", "0"], ["--steps", "at least 1"]),
        (["--batch", "many"], ["--batch", "whole number"]),
        (["--backend", "mpi"], ["--backend", "invalid choice", "'mpi'"]),
        (["--timeout", "0"], ["--timeout", "more than 0"]),
        (["--timeout", "2e9"], ["--timeout", "timeout=2e+09", "at most 1e+09"]),
    ],
)
def test_the_parser_refuses_a_bad_option_by_name(capsys, argv, words):
    message = refusal(capsys, *argv)
    for word in words:
        assert word in message


def test_a_number_argument_is_checked_by_its_own_check_as_a_float():
    seen = []

    def check(value):
        seen.append(value)
        return value * 2

    assert command._number("3", check) == 6.0
    assert seen == [3.0] and type(seen[0]) is float


def test_a_number_argument_turns_its_check_s_value_error_into_argparse_s_error():
    def refuse(value):
        raise ValueError(f"timeout={value:g} is too long; use at most 5")

    with pytest.raises(argparse.ArgumentTypeError, match=r"^timeout=9 is too long; use at most 5"):
        command._number("9", refuse)


def test_a_number_argument_refuses_text_and_zero_before_its_check_runs():
    def unreachable(value):
        raise AssertionError("the check ran")

    with pytest.raises(argparse.ArgumentTypeError, match="expected a number, got 'ten'"):
        command._number("ten", unreachable)
    with pytest.raises(argparse.ArgumentTypeError, match="more than 0"):
        command._number("0", unreachable)


def test_bucket_caps_and_timeouts_are_checked_by_their_own_rules():
    assert command._bucket_cap("0.25") == 0.25
    assert command._timeout("1e9") == 1e9  # the longest timeout torch can hold
    # a cap of 2**43 MiB is 2**63 bytes: past torch's 64-bit integer; the fix says 1e6
    with pytest.raises(argparse.ArgumentTypeError, match=r"bucket_cap_mb=8\.79609e\+12.*1e6"):
        command._bucket_cap(str(2**43))
    with pytest.raises(argparse.ArgumentTypeError, match=r"timeout=1\.5e\+09.*at most 1e\+09"):
        command._timeout("1.5e9")


# -- report and write_figures


def test_the_summary_leaves_step_1_out_and_says_what_it_held():
    # step 1: DDP's constructor (replicate, 0.0-0.5 s) and an all-reduce (1.0-1.2 s); step 2:
    # backward 1.9-2.4 s, all-reduces 2.0-2.3 s of 3,000 + 1,000 + 7,000 bytes
    text = command.steady_summary(made_up_result().trace)
    head, table = text.split("):\n", 1)
    assert head == (f"per phase, mean per step over step 2 — {RANK_LABEL}\n(step 1, 1200.0 ms, "
                    "left out: DDP's constructor broadcasts rank 0's parameters once, and the "
                    "first step warms up")  # fmt: skip
    rows = {line.split()[0]: line.split() for line in table.splitlines()}
    assert "replicate" not in rows
    assert rows["allreduce"][1:4] == ["300.000", "ms", "11,000"]
    assert rows["backward"][1:3] == ["500.000", "ms"] and rows["step"][1] == "500.000"
    one = [e for e in made_up_result().trace.events if e.step == 2]
    trace = run.merged_trace(made_up_runs())
    trace._events = one  # a run of one step: that step
    assert command.steady_summary(trace).startswith(f"per phase, mean per step — {RANK_LABEL}:")


def test_the_report_gives_the_setup_and_rank_0_s_all_reduced_bytes_of_the_last_step():
    result = made_up_result()
    paths = (Path("/o/trace.json"), Path("/o/timeline.png"), Path("/o/memory.png"))
    text = command.report(result, "cnn", paths)
    assert text.startswith("DistributedDataParallel: 2 processes (ranks), backend gloo, on the CPU")
    assert "; pids 101, 202\n" in text
    assert "model cnn, global batch 8 (4 rows per rank," in text  # 8 rows over 2 ranks
    assert "2 SGD steps, bucket_cap_mb 0.5\n" in text
    assert "parameters: 1,234,567 bytes" in text
    # rank 0's last step: 3,000 + 1,000 bytes in 2 buckets, of which the ring sends 6,000
    assert "by each rank: 4,000 bytes in 2 bucket(s)" in text
    assert "a ring sends 6,000 per rank" in text
    # the bytes column counts the buckets, where dpkit predict's counts the ring's sends
    assert "the table's allreduce bytes are the buckets' bytes, summed over the ranks" in text
    assert "step times (ms, slowest rank): 1000.0, 12.5\n" in text
    assert f"\n{command.steady_summary(result.trace)}\n" in text
    assert f"(counted: the sum of the categories):\n{result.trace.memory_summary()}\n" in text
    assert "timeline (last step): /o/timeline.png\n" in text
    assert "memory (last step):   /o/memory.png\n" in text
    assert "Chrome trace:         /o/trace.json\n" in text
    assert text.endswith("all-reduces over backward.")
    assert "skipped" not in text


def test_the_report_counts_one_step_and_one_row_in_the_singular():
    result = dataclasses.replace(made_up_result(batch=2), step_times=[1.0])
    text = command.report(result, "mlp", (Path("/o/trace.json"), None, None))
    assert "global batch 2 (1 row per rank, random 1x28x28 images), 1 SGD step, " in text


def test_the_report_of_nccl_ranks_says_a_gpu_each_and_notes_figures_skipped():
    result = made_up_result(backend="nccl", cap=25.0, batch=12, nproc=3)
    text = command.report(result, "mlp", (Path("/o/trace.json"), None, None))
    assert "3 processes (ranks), backend nccl, on one GPU each;" in text
    assert "global batch 12 (4 rows per rank," in text
    assert "bucket_cap_mb 25\n" in text
    assert "figures: skipped, matplotlib is not installed (pip install matplotlib)" in text
    assert "timeline (last step)" not in text and "memory (last step)" not in text
    assert "Chrome trace:         /o/trace.json" in text


def test_the_report_of_torch_s_default_buckets_names_them():
    text = command.report(made_up_result(cap=None), "mlp", (Path("/o/trace.json"), None, None))
    assert "bucket_cap_mb torch's default (25, the first bucket 1)\n" in text


def test_the_figures_are_a_timeline_and_a_memory_png_in_out(tmp_path):
    trace = made_up_result().trace
    assert command.write_figures(trace, tmp_path) == (
        tmp_path / "timeline.png", tmp_path / "memory.png"
    )  # fmt: skip
    for name in ("timeline.png", "memory.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")


def without_viz(monkeypatch):
    """Make ``from dpkit import viz`` fail as it does without matplotlib."""
    monkeypatch.delattr(dpkit, "viz", raising=False)
    monkeypatch.setitem(sys.modules, "dpkit.viz", None)  # None: import raises ImportError


def test_without_matplotlib_no_figure_is_written(tmp_path, monkeypatch):
    without_viz(monkeypatch)
    assert command.write_figures(made_up_result().trace, tmp_path) == (None, None)
    assert list(tmp_path.iterdir()) == []


# -- the command: one node


@pytest.fixture
def ranks_stand_in(monkeypatch):
    """run_ddp and write_figures replaced: the arguments of each call are recorded, and
    run_ddp returns the made-up result."""
    calls = {"run_ddp": [], "write_figures": []}
    result = made_up_result()

    def run_ddp(model, **options):
        calls["run_ddp"].append((model, options))
        return result

    def write_figures(trace, out):
        calls["write_figures"].append((trace, out))
        return out / "t.png", out / "m.png"

    monkeypatch.setattr(run, "run_ddp", run_ddp)
    monkeypatch.setattr(command, "write_figures", write_figures)
    calls["result"] = result
    return calls


def test_dpkit_ddp_passes_its_options_to_run_ddp_and_writes_the_trace(
    tmp_path, monkeypatch, capsys, ranks_stand_in
):
    monkeypatch.chdir(tmp_path)
    args = parse("--nproc", "4", "--batch", "16", "--steps", "2", "--bucket-mb", "0.5", "--model",
                 "cnn", "--backend", "gloo", "--timeout", "30", "--out", "o")  # fmt: skip
    assert args.run(args) == 0
    out = tmp_path.resolve() / "o"  # made, and passed on resolved
    assert ranks_stand_in["run_ddp"] == [
        ("cnn", {"nproc": 4, "batch": 16, "steps": 2, "bucket_cap_mb": 0.5, "backend": "gloo",
                 "timeout": 30.0}),
    ]  # fmt: skip
    assert ranks_stand_in["write_figures"] == [(ranks_stand_in["result"].trace, out)]
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names == {"rank:0 (cpu)", "rank:1 (cpu)"}
    printed = capsys.readouterr().out
    assert "model cnn, global batch 8" in printed  # the report of the result run_ddp gave
    assert f"timeline (last step): {out / 't.png'}\n" in printed
    assert f"Chrome trace:         {out / 'trace.json'}\n" in printed


def test_dpkit_ddp_refuses_an_unwritable_out_before_run_ddp(tmp_path, ranks_stand_in):
    (tmp_path / "a_file").write_text("")
    args = parse("--out", str(tmp_path / "a_file" / "o"))
    with pytest.raises(ValueError, match="cannot write there"):
        args.run(args)
    assert ranks_stand_in["run_ddp"] == []


# -- the command: --nnodes


class NodesStandIn:
    """train_on_nodes replaced: records its arguments, writes what rank 0 would (trace.json
    and ranks.json) when every node succeeds, and returns a NodesRun with ``statuses``."""

    def __init__(self, statuses, logs=None):
        self.statuses, self.calls = statuses, []
        self.logs = logs or ["" for _ in statuses]

    def __call__(self, out, *arguments):
        self.calls.append((out, *arguments))
        if not any(self.statuses):
            run.merged_trace(made_up_runs()).to_chrome_trace(out / "trace.json")
            ranks = [{"rank": 0, "node": 0, "local_rank": 0, "pid": 4242, "steps": 2},
                     {"rank": 1, "node": 1, "local_rank": 0, "pid": 4343, "steps": 2}]  # fmt: skip
            (out / "ranks.json").write_text(json.dumps(ranks))
        commands = [["python", "-c", "code", f"--nnodes=2 --node_rank={n}", "-m", "x"]
                    for n in range(len(self.statuses))]  # fmt: skip
        return nodes.NodesRun(commands, self.statuses, self.logs, 3.26)


def nodes_args(out, *more):
    return parse("--nnodes", "2", "--nproc", "3", "--model", "transformer", "--batch", "12",
                 "--steps", "4", "--bucket-mb", "0.5", "--timeout", "60", "--out", str(out),
                 *more)  # fmt: skip


def test_nnodes_runs_train_on_nodes_and_prints_who_ran_where(tmp_path, monkeypatch, capsys):
    stand_in = NodesStandIn([0, 0])
    monkeypatch.setattr(nodes, "train_on_nodes", stand_in)
    without_viz(monkeypatch)  # the figure is the next test's
    args = nodes_args(tmp_path)
    assert args.run(args) == 0
    assert stand_in.calls == [(tmp_path, 2, 3, "transformer", 12, 4, 0.5, 60.0)]
    printed = capsys.readouterr().out
    assert printed.startswith("2 nodes x 3 ranks on 127.0.0.1")
    # each node's command from its 4th word: what follows torchrun's module
    assert "\n  torchrun --nnodes=2 --node_rank=0 -m x\n" in printed
    assert "\n  torchrun --nnodes=2 --node_rank=1 -m x\n" in printed
    assert "exit statuses [0, 0], 3.3 s" in printed
    assert "in 2 torchruns and 6 ranks)" in printed  # 2 nodes x 3 ranks
    assert "  rank 0: node 0, LOCAL_RANK 0, pid 4242, 2 steps\n" in printed
    assert "  rank 1: node 1, LOCAL_RANK 0, pid 4343, 2 steps\n" in printed
    assert f"per phase, mean per step over step 2 — {RANK_LABEL}\n(step 1, " in printed
    assert "allreduce" in printed  # the summary of the nodes' trace
    assert "figures: skipped, matplotlib is not installed" in printed
    assert f"Chrome trace:         {tmp_path / 'trace.json'}\n" in printed
    assert "memory per rank: not recorded across nodes" in printed  # said, not left out
    assert not (tmp_path / "timeline.png").exists()


def test_nnodes_counts_one_rank_per_node_in_the_singular(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(nodes, "train_on_nodes", NodesStandIn([0, 0]))
    without_viz(monkeypatch)
    args = parse("--nnodes", "2", "--nproc", "1", "--batch", "2", "--out", str(tmp_path))
    assert args.run(args) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("2 nodes x 1 rank on 127.0.0.1")
    assert "in 2 torchruns and 2 ranks)" in printed


def test_nnodes_draws_the_timeline_of_the_nodes_trace(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(nodes, "train_on_nodes", NodesStandIn([0, 0]))
    args = nodes_args(tmp_path)
    assert args.run(args) == 0
    assert (tmp_path / "timeline.png").read_bytes().startswith(b"\x89PNG")
    assert f"timeline (last step): {tmp_path / 'timeline.png'}\n" in capsys.readouterr().out


def test_nnodes_shows_the_end_of_the_first_failed_node_s_log(tmp_path, monkeypatch, capsys):
    failed_log = "\n".join(f"line {i}" for i in range(20))
    stand_in = NodesStandIn([0, 3, 5], ["node 0 log", failed_log, "node 2 log"])
    monkeypatch.setattr(nodes, "train_on_nodes", stand_in)
    args = nodes_args(tmp_path)
    assert args.run(args) == 1
    printed = capsys.readouterr().out
    assert "a node failed: exit statuses [0, 3, 5]; the last lines of its log:" in printed
    # the last 15 of node 1's 20 lines: 5 to 19
    assert printed.endswith("\n".join(f"line {i}" for i in range(5, 20)) + "\n")
    assert "line 4\n" not in printed and "node 0 log" not in printed
    assert "node 2 log" not in printed and "per phase" not in printed


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_nnodes_refuses_a_backend_it_would_not_pass_on(tmp_path, monkeypatch, backend):
    # the nodes' training script picks its own (nccl where each rank has a GPU): a --backend
    # gloo left unsaid would be ignored on a GPU machine
    stand_in = NodesStandIn([0, 0])
    monkeypatch.setattr(nodes, "train_on_nodes", stand_in)
    args = nodes_args(tmp_path, "--backend", backend)
    with pytest.raises(ValueError, match="--backend is not passed to --nnodes.*drop --backend"):
        args.run(args)
    assert stand_in.calls == []


def test_one_node_runs_in_ddp_and_more_in_nodes(tmp_path, monkeypatch, ranks_stand_in):
    seen = []
    monkeypatch.setattr(command, "_nodes_command", lambda args, out: seen.append(out) or 7)
    assert command._ddp_command(parse("--nnodes", "2", "--out", str(tmp_path / "n"))) == 7
    assert seen == [tmp_path / "n"] and (tmp_path / "n").is_dir()
    assert ranks_stand_in["run_ddp"] == []
    assert command._ddp_command(parse("--out", str(tmp_path / "one"))) == 0
    assert len(ranks_stand_in["run_ddp"]) == 1 and seen == [tmp_path / "n"]


# -- the command's own checks, in its flags' words, before any rank starts


def test_too_many_ranks_over_nodes_names_both_flags_and_the_fix(tmp_path, monkeypatch):
    stand_in = NodesStandIn([0, 0, 0])
    monkeypatch.setattr(nodes, "train_on_nodes", stand_in)
    args = parse("--nnodes", "3", "--nproc", "4", "--out", str(tmp_path / "o"))
    with pytest.raises(ValueError) as refused:
        args.run(args)
    message = str(refused.value)
    # 12 ranks on 2 cores (8 at most): the user's flags, not dpkit.ddp's nproc=12
    assert message.startswith("--nnodes 3 x --nproc 4 = 12 ranks is more than 4 ranks per")
    assert message.endswith("use --nnodes x --nproc of 8 or fewer, e.g. --nnodes 3 --nproc 2")
    assert "nproc=" not in message
    assert stand_in.calls == [] and not (tmp_path / "o").exists()


def test_too_many_ranks_on_one_node_names_nproc(tmp_path, ranks_stand_in):
    args = parse("--nproc", "64", "--out", str(tmp_path))
    with pytest.raises(ValueError, match=r"^--nproc 64 is more than .*use --nproc 8 or fewer$"):
        args.run(args)
    assert ranks_stand_in["run_ddp"] == []


@pytest.mark.parametrize(
    "argv, start, end",
    [
        (["--nproc", "3"], "--batch 64 does not split evenly over --nproc 3: ",
         "; use a multiple of 3, e.g. --batch 66"),
        (["--nnodes", "2", "--batch", "6"],
         "--batch 6 does not split evenly over --nnodes 2 x --nproc 2 = 4 ranks: ",
         "; use a multiple of 4, e.g. --batch 8"),
    ],
)  # fmt: skip
def test_a_batch_the_ranks_cannot_share_names_batch_and_a_batch_they_can(
    tmp_path, monkeypatch, ranks_stand_in, argv, start, end
):
    stand_in = NodesStandIn([0, 0])
    monkeypatch.setattr(nodes, "train_on_nodes", stand_in)
    args = parse(*argv, "--out", str(tmp_path))
    with pytest.raises(ValueError) as refused:
        args.run(args)
    assert str(refused.value).startswith(start) and str(refused.value).endswith(end)
    assert ranks_stand_in["run_ddp"] == [] and stand_in.calls == []


def test_a_batch_beyond_memory_is_refused_by_name_before_any_rank_starts(
    tmp_path, monkeypatch, ranks_stand_in
):
    # a row: a 1x28x28 float32 image and an int64 label, 3,144 bytes; each rank holds them all
    monkeypatch.setattr(command, "memory_bytes", lambda: 2 * 1000 * 3144)
    fits = parse("--nproc", "2", "--batch", "1000", "--out", str(tmp_path))
    assert fits.run(fits) == 0  # 2 ranks x 1,000 rows: exactly this memory
    args = parse("--nproc", "2", "--batch", "1002", "--out", str(tmp_path))
    with pytest.raises(ValueError) as refused:
        args.run(args)
    message = str(refused.value)
    assert message.startswith("--batch 1002: 2 ranks, each building all 1,002 random 1x28x28")
    assert "use a smaller --batch" in message
    assert len(ranks_stand_in["run_ddp"]) == 1  # the batch that fits ran; this one did not


def test_nodes_build_batch_x_steps_rows_each(tmp_path, monkeypatch):
    stand_in = NodesStandIn([0, 0])
    monkeypatch.setattr(nodes, "train_on_nodes", stand_in)
    monkeypatch.setattr(command, "memory_bytes", lambda: 4 * 8 * 3 * 3144)
    fits = parse("--nnodes", "2", "--batch", "8", "--steps", "3", "--out", str(tmp_path))
    assert fits.run(fits) == 0  # 4 ranks, each 8 x 3 rows: exactly this memory
    args = parse("--nnodes", "2", "--batch", "8", "--steps", "4", "--out", str(tmp_path))
    with pytest.raises(ValueError, match=r"^--batch 8 x --steps 4: 4 ranks, each building all 32 "):
        args.run(args)
    assert len(stand_in.calls) == 1


def test_no_memory_figure_is_an_unknown_memory_not_a_refusal(monkeypatch):
    monkeypatch.setattr(command, "memory_bytes", lambda: None)  # Windows: no sysconf
    command.check_batch_fits(1, 2, 10**12, 3)  # nothing to compare with: torch will say


def test_dpkit_ddp_s_errors_name_its_flags_not_run_ddp_s_arguments(tmp_path, monkeypatch):
    def refuse(model, **options):
        raise ValueError(
            "nproc=4 with backend='nccl' needs a GPU per rank and there are 2; use nproc<=2, "
            "or backend='gloo' for CPU ranks"
        )

    monkeypatch.setattr(run, "run_ddp", refuse)
    args = parse("--nproc", "4", "--backend", "nccl", "--out", str(tmp_path))
    with pytest.raises(ValueError) as refused:
        args.run(args)
    # the whole text is docs/bad_input.md's row (tests/test_bad_input_table.py)
    message = str(refused.value)
    assert message.startswith("--nproc 4 with --backend nccl needs a GPU per rank")
    assert "use --nproc 2 or fewer, or --backend gloo" in message
    assert "nproc=" not in message and "backend=" not in message


def test_flag_names_replace_every_argument_and_leave_other_words():
    assert command.in_flags("bucket_cap_mb=1e+13 and timeout=2e+09, steps=3, batch=8") == (
        "--bucket-mb 1e+13 and --timeout 2e+09, --steps 3, --batch 8"
    )
    assert command.in_flags("micro_batch=4: the batch must be positive") == (
        "micro_batch=4: the batch must be positive"
    )


def test_the_help_says_what_the_default_backend_is_and_what_nodes_write(capsys):
    with pytest.raises(SystemExit):
        parse("--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text
    assert "default: nccl when torch has NCCL and there is a CUDA GPU per rank" in text
    assert "(default: 2)" in text and "(default: 120.0)" in text  # the other defaults stay
    assert "With --nnodes above 1, the nodes' ranks record no memory: no memory table and no " \
        "memory.png" in text  # fmt: skip


# -- script.py: script_rank


class Messages:
    """A rank's message queue, as a list."""

    def __init__(self):
        self.sent = []

    def put(self, message):
        self.sent.append(message)


TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")


@pytest.fixture
def torchrun_environment(monkeypatch):
    """script_rank sets torchrun's variables in os.environ: whatever it sets is undone after
    the test (monkeypatch forgets a variable it deleted that was not there: set it first)."""
    for name in (*TORCHRUN_VARIABLES, "GLOO_SOCKET_IFNAME"):
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)


def environment_and_stage(shared, rank):
    """A main that returns what torchrun's variables and the rank's stage are when it runs."""

    def main(argv):
        return {name: os.environ[name] for name in TORCHRUN_VARIABLES}, shared[2 * rank + 1], argv

    return main


def test_a_script_rank_gets_torchrun_s_numbers_then_runs_main(torchrun_environment, monkeypatch):
    monkeypatch.setattr(script.checks, "loopback_interface", lambda: "lo0")
    shared, messages = [0] * 12, Messages()
    main = environment_and_stage(shared, 5)
    # 6 ranks on 2 nodes of 3: rank 5 is the third (local rank 2) of node 1
    script.script_rank(5, process.Progress(shared, 5), messages, None, main, ["-x"], 6, 2)
    numbers = {"RANK": "5", "LOCAL_RANK": "2", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "3",
               "GROUP_RANK": "1"}  # fmt: skip
    assert messages.sent == [("done", 5, (numbers, process.CONNECTING, ["-x"]))]
    assert shared[11] == process.FINISHED and shared[10] == 0  # no step given
    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo0"  # gloo stays on the loopback interface


def test_a_script_rank_keeps_a_chosen_gloo_interface_and_needs_no_loopback(
    torchrun_environment, monkeypatch
):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")
    monkeypatch.setattr(script.checks, "loopback_interface", lambda: "lo")
    shared, messages = [0] * 2, Messages()
    script.script_rank(0, process.Progress(shared, 0), messages, None,
                       environment_and_stage(shared, 0), [], 1, 1)  # fmt: skip
    assert os.environ["GLOO_SOCKET_IFNAME"] == "eth7"
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    monkeypatch.setattr(script.checks, "loopback_interface", lambda: None)  # Windows
    script.script_rank(0, process.Progress(shared, 0), messages, None,
                       environment_and_stage(shared, 0), [], 1, 1)  # fmt: skip
    assert "GLOO_SOCKET_IFNAME" not in os.environ
    assert [kind for kind, *_ in messages.sent] == ["done", "done"]


# -- script.py: run_main


def rank_and_argv(argv):
    """A script's main the ranks could import (a function of this module)."""
    return int(os.environ["RANK"]) * 10, list(argv)


class RanksStandIn:
    """launch.Ranks replaced: records what it was given, and runs each rank's body here,
    one rank after the other; ``wait_for`` gives each rank's message of that kind."""

    made: list[RanksStandIn] = []

    def __init__(self, target, args, nproc, timeout):
        self.target, self.args, self.nproc, self.timeout = target, args, nproc, timeout
        self.exited = False
        self.waited_for = []
        RanksStandIn.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.exited = True

    def wait_for(self, kind):
        argv = self.args[1]
        store = argv[argv.index("--init-method") + 1] if "--init-method" in argv else None
        self.waited_for.append((kind, store and Path(store[len("file://") :]).parent.is_dir()))
        shared, messages = [0] * (2 * self.nproc), Messages()
        for rank in range(self.nproc):
            self.target(rank, process.Progress(shared, rank), messages, None, *self.args)
        return [payload for sent, rank, payload in messages.sent if sent == kind]


@pytest.fixture
def ranks(monkeypatch, torchrun_environment):
    RanksStandIn.made = []
    monkeypatch.setattr(script.launch, "Ranks", RanksStandIn)
    return RanksStandIn.made


def test_run_main_runs_main_on_every_rank_with_the_store_in_its_argv(ranks):
    argv = ["--init-method", "{store}", "--out", "runs/4", "{store}/x"]
    results = script.run_main(rank_and_argv, argv, nproc=4, nodes=2, timeout=5)
    (made,) = ranks
    assert (made.target, made.nproc, made.timeout) == (script.script_rank, 4, 5.0)
    assert type(made.timeout) is float and made.exited
    main, given, nproc, nodes_given = made.args
    assert (main, nproc, nodes_given) == (rank_and_argv, 4, 2)
    # only a whole "{store}" is the store: a file:// URL in a fresh folder, gone after the run
    store = given[1]
    assert store.startswith("file://") and store.endswith("/store")
    folder = Path(store[len("file://") :]).parent
    assert folder.name.startswith("dpkit-script-")
    assert given == ["--init-method", store, "--out", "runs/4", "{store}/x"]
    assert made.waited_for == [("done", True)]  # the folder was there while the ranks ran
    assert not folder.exists()
    assert argv[1] == "{store}"  # the caller's list is left as it was
    assert results == [(rank * 10, given) for rank in range(4)]


def test_run_main_removes_its_store_folder_when_the_ranks_fail(ranks, monkeypatch):
    def time_out(self, kind):
        self.folder = Path(self.args[1][0][len("file://") :]).parent
        raise script.launch.RanksTimedOut("no rank moved on for 5 s", None)

    monkeypatch.setattr(RanksStandIn, "wait_for", time_out)
    with pytest.raises(script.launch.RanksTimedOut):
        script.run_main(rank_and_argv, ["{store}"], nproc=2)
    (made,) = ranks
    assert made.folder.name.startswith("dpkit-script-") and not made.folder.exists()
    assert made.exited and made.timeout == 120.0 and made.args[3] == 1  # the defaults


@pytest.mark.parametrize("nodes_given", [0, 3, True, 2.0, -2])
def test_run_main_refuses_nodes_that_do_not_divide_the_ranks(ranks, nodes_given):
    with pytest.raises(ValueError, match=rf"nodes must divide nproc=4 evenly, got {nodes_given}"):
        script.run_main(rank_and_argv, [], nproc=4, nodes=nodes_given)
    assert ranks == []


def test_run_main_checks_nproc_and_timeout_before_starting(ranks):
    with pytest.raises(TypeError, match="nproc must be an int"):
        script.run_main(rank_and_argv, [], nproc=2.0)
    with pytest.raises(ValueError, match="nproc must be at least 1"):
        script.run_main(rank_and_argv, [], nproc=0)
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        script.run_main(rank_and_argv, [], nproc=1, timeout=0)
    assert ranks == []


def test_run_main_refuses_a_main_the_ranks_cannot_import_naming_main(ranks):
    with pytest.raises(ValueError) as refused:
        script.run_main(lambda argv: 0, [], nproc=1)
    message = str(refused.value)
    # the lambda's qualified name (inside this test), quoted
    assert message.startswith("main='test_run_main_refuses_a_main")
    assert "<locals>.<lambda>' is a lambda" in message
    assert "workload" not in message and "define it in a .py file" in message
    assert ranks == []
